//! Softmax on tiles: each softmax group (the elements along its axis) stays on one tile, so a
//! vertex per tile computes its groups with no exchange.

use tessera_core::ops::softmax::Softmax;
use tessera_core::{DType, Node, NodeId, Storage};

use super::{Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::machine::IpuConfig;
use crate::program::Codelet;

/// Elements of one softmax group as the layout must keep them together: the axis' length
/// times everything inside it.
fn group(node: &Node, axis: u8) -> u64 {
    let (_, len, inner) = node.shape().split_at_axis(axis as usize);
    (len * inner) as u64
}

pub(super) fn placement(node: &Node, op: &Softmax) -> Placement {
    match *op {
        Softmax::Forward { axis, .. } | Softmax::Backward { axis, .. } => {
            Placement::Rows(group(node, axis))
        }
    }
}

/// Cycles of a row-wise op (softmax, cross-entropy and their gradients) over `n` elements in
/// groups of `len`: an exp per element, a reduction per group and a divide per element.
pub(super) fn row_op_cycles(cfg: &IpuConfig, n: u64, len: u64, dt: DType) -> u64 {
    let rows = n.div_ceil(len.max(1));
    UnaryKind::Exp.cycles(cfg, n, dt)
        + cost::reduce_cycles(cfg, rows, len, dt)
        + UnaryKind::Reciprocal.cycles(cfg, n, dt)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Softmax) {
    let (cfg, node) = (l.cfg, l.node(i));
    let dt = node.dtype();
    let (same, axis) = match *op {
        Softmax::Forward { x, axis } => (vec![l.t(x)], axis),
        Softmax::Backward { dy, y, axis } => (vec![l.t(y), l.t(dy)], axis),
    };
    let len = node.shape().dim(axis as usize) as u64;
    let out = l.t(i);
    l.elementwise(
        i,
        out,
        &same,
        Codelet::Softmax,
        move |n| row_op_cycles(cfg, n, len, dt),
        |_, _, _| {},
    );
}
