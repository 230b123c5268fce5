//! Element-wise ops on tiles: one vertex per tile of the output, reading the same elements of
//! full-size operands and the broadcast parts of the others; the output is laid out like its
//! full-size operand, so no exchange is needed in the common case.

use tessera_core::ops::elementwise::{BinaryFn, Elementwise, TernaryFn, UnaryFn};
use tessera_core::{Node, NodeId, Storage};

use super::{broadcast_reads, Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::program::Codelet;

/// The cost class of a unary function.
fn unary_kind(f: UnaryFn) -> UnaryKind {
    match f {
        UnaryFn::Identity => UnaryKind::Copy,
        UnaryFn::Neg => UnaryKind::Neg,
        UnaryFn::Scale(_) => UnaryKind::Scale,
        UnaryFn::Relu => UnaryKind::Relu,
        UnaryFn::Sigmoid => UnaryKind::Sigmoid,
        UnaryFn::Tanh => UnaryKind::Tanh,
        UnaryFn::Exp => UnaryKind::Exp,
        UnaryFn::Log => UnaryKind::Log,
        UnaryFn::Sqrt => UnaryKind::Sqrt,
        UnaryFn::Erf => UnaryKind::Erf,
        UnaryFn::Gelu(_) => UnaryKind::Gelu,
        UnaryFn::Clip { .. } => UnaryKind::Clip,
        _ => UnaryKind::Copy,
    }
}

/// Worker cycles per vector beyond a plain binary op (add, sub, mul, compare), for the binary
/// functions that compute more: estimates, each named by what it adds.
fn binary_extra(f: BinaryFn) -> Option<UnaryKind> {
    match f {
        // A divide.
        BinaryFn::Div | BinaryFn::SqrtGrad => Some(UnaryKind::Reciprocal),
        // An exp and a log.
        BinaryFn::Pow => Some(UnaryKind::Log),
        // The derivative of GELU or erf re-evaluates the function.
        BinaryFn::GeluGrad(_) => Some(UnaryKind::Gelu),
        BinaryFn::ErfGrad => Some(UnaryKind::Exp),
        _ => None,
    }
}

/// How the output is laid out: like its first operand of the output's shape.
pub(super) fn placement<S: Storage>(
    l: &Lowering<'_, S>,
    node: &Node,
    op: &Elementwise,
) -> Placement {
    op.operands()
        .as_slice()
        .iter()
        .copied()
        .find(|&x| l.node(x).shape() == node.shape())
        .map_or(Placement::Rows(1), Placement::Like)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Elementwise) {
    let (cfg, node) = (l.cfg, l.node(i));
    let (dt, shape) = (node.dtype(), node.shape());
    let out = l.t(i);
    let operands: Vec<(_, _)> = op
        .operands()
        .as_slice()
        .iter()
        .map(|&x| (l.t(x), l.node(x).shape()))
        .collect();
    let (codelet, cycles): (Codelet, Box<dyn Fn(u64) -> u64>) = match *op {
        Elementwise::Unary { f, x } => {
            let kind = unary_kind(f);
            if f == UnaryFn::Identity && l.node(x).dtype() != dt {
                (Codelet::Cast, Box::new(move |n| cost::cast_cycles(cfg, n)))
            } else {
                (Codelet::Unary, Box::new(move |n| kind.cycles(cfg, n, dt)))
            }
        }
        Elementwise::Binary { f, .. } => {
            let extra = binary_extra(f);
            (
                Codelet::Binary,
                Box::new(move |n| {
                    cost::elementwise_binary_cycles(cfg, n, dt)
                        + extra.map_or(0, |k| k.cycles(cfg, n, dt))
                }),
            )
        }
        Elementwise::Ternary { f, .. } => {
            // Two binary passes; the power's gradient adds an exp and a log.
            let extra = matches!(f, TernaryFn::PowGradBase | TernaryFn::PowGradExponent);
            (
                Codelet::Binary,
                Box::new(move |n| {
                    2 * cost::elementwise_binary_cycles(cfg, n, dt)
                        + if extra {
                            UnaryKind::Log.cycles(cfg, n, dt) + UnaryKind::Exp.cycles(cfg, n, dt)
                        } else {
                            0
                        }
                }),
            )
        }
    };
    if operands.iter().all(|&(_, from)| from == shape) {
        // No broadcast: every operand reads the output's own elements.
        let reads: Vec<_> = operands.iter().map(|&(t, _)| t).collect();
        l.per_tile_same(i, "op", out, codelet, cycles, &reads, &[out], &[]);
        return;
    }
    l.elementwise(i, out, &[], codelet, cycles, move |s, len| {
        operands
            .iter()
            .flat_map(|&(t, from)| broadcast_reads(t, from, shape, s, len))
            .collect()
    });
}
