//! Softmax on tiles. Over the last axis, each softmax group (a row) stays on one tile, so a
//! vertex per tile computes its groups with no exchange. Over another axis the output is laid
//! out like its operand, and the groups' statistics are reductions where the data lie, as
//! PopART runs it: `SoftmaxOpx` moves the axis last with a `dimShuffle` (a view: nothing
//! moves) and popnn's `nonLinearity(SOFTMAX_STABLE)` reduces the view (popops' `reduce`
//! maps a reduction over any layout, partials where the data are) and applies the
//! statistics element-wise in place. Keeping such a group on one tile would put whole
//! tensors there: a detector's `[1, 64, 8400]` softmax over axis 1 is one group.

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

/// Whether a softmax over `axis` of `node`'s shape runs over the last axis (nothing inside
/// it): one row a group.
fn over_rows(node: &Node, axis: u8) -> bool {
    node.shape().split_at_axis(axis as usize).2 == 1
}

pub(super) fn placement(node: &Node, op: &Softmax) -> Placement {
    match *op {
        Softmax::Forward { axis, .. } | Softmax::Backward { axis, .. } if over_rows(node, axis) => {
            Placement::Rows(group(node, axis))
        }
        Softmax::Forward { x, .. } => Placement::Like(x),
        Softmax::Backward { y, .. } => Placement::Like(y),
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
    if !over_rows(node, axis) {
        across_tiles(l, i, op);
        return;
    }
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

/// A softmax over an axis other than the last, as popnn's `nonLinearity` runs one on a
/// shuffled view: the groups' statistics (forward: the max, then the sum of the exponentials;
/// gradient: the sum of `dy * y`) reduced where the data lie into two f32 values a group, as
/// the norms' statistics are, then one element-wise pass laid out like the output that reads
/// its groups' values (forward: a subtraction, an exponential and a multiply by the
/// reciprocal; gradient: a subtraction and a multiply).
fn across_tiles<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Softmax) {
    let (cfg, dt) = (l.cfg, l.node(i).dtype());
    let (x, same, axis, forward) = match *op {
        Softmax::Forward { x, axis } => (x, vec![l.t(x)], axis, true),
        Softmax::Backward { dy, y, axis } => (y, vec![l.t(y), l.t(dy)], axis, false),
    };
    let axes = tessera_core::ops::Axes::one(axis as usize);
    // Forward: two reductions of each group (max, then sum); gradient: one over `dy` and `y`.
    let passes = if forward { 2 } else { 1 };
    let (stats, kept) = super::norm::statistics(l, i, &same, x, axes, passes);
    let run = super::elementwise::broadcast_run(kept, l.node(i).shape());
    let price = move |n: u64| {
        let exp = if forward {
            UnaryKind::Exp.cycles(cfg, n, dt)
        } else {
            0
        };
        exp + 2 * cost::binary_pass_cycles(cfg, n, run, dt)
    };
    super::norm::with_statistics(l, i, &same, (stats, kept), Codelet::Softmax, price);
}

#[cfg(test)]
mod tests {
    use tessera_core::{DType, Graph, Plan};

    use super::super::{lower_with, LowerOptions};
    use crate::heap::Heap;
    use crate::machine::{IpuConfig, Preset};

    /// A softmax over an axis other than the last (a detector's `[1, 64, 8400]` over its 64
    /// classes) keeps its output where its operand lies, spread over the tiles, and reduces
    /// its groups' statistics there; over the last axis, each row stays on one tile.
    #[test]
    fn a_softmax_over_a_middle_axis_follows_its_operands_layout() {
        let cfg = IpuConfig::preset(Preset::Mk2);
        for (axis, spread) in [(1, true), (2, false)] {
            let mut g: Graph<Heap> = Graph::new();
            let x = g.input("x", &[1, 64, 8400], DType::F32).unwrap();
            let y = g.softmax_axis("y", x, axis).unwrap();
            g.reduce_mean("loss", y, None).unwrap();
            let plan = Plan::new(&g).unwrap();
            let p = lower_with(&plan, &cfg, LowerOptions::default(), &|_| true, false, None).0;
            let of = |name: &str| &p.tensors.iter().find(|t| t.name == name).unwrap().mapping;
            let (xm, ym) = (of("x"), of("y"));
            let most = ym.elements_per_tile().iter().map(|e| e.1).max().unwrap();
            if spread {
                assert_eq!(
                    ym.intervals(),
                    xm.intervals(),
                    "axis {axis}: laid out like x"
                );
                assert!(
                    ym.tile_count() > 1000,
                    "axis {axis}: {} tiles",
                    ym.tile_count()
                );
                assert!(most < 1000, "axis {axis}: {most} elements on a tile");
                assert!(p.tensors.iter().any(|t| t.name == "y/statistics"));
            } else {
                // 64 rows of 8,400: a row a tile.
                assert_eq!(ym.tile_count(), 64, "axis {axis}");
                assert_eq!(most, 8400, "axis {axis}");
            }
        }
    }
}
