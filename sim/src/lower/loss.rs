//! Losses on tiles. The cross-entropy reduces in two stages: each tile sums the rows it holds
//! into a partial, then one vertex sums the partials. Its gradient is row-wise, like softmax.

use tessera_core::ops::loss::Loss;
use tessera_core::{DType, Node, NodeId, Storage};

use super::softmax::row_op_cycles;
use super::{Lowering, Placement};
use crate::cost;
use crate::program::{Codelet, Interval, Mapping, Region, TileId, Vertex};

pub(super) fn placement(node: &Node, op: &Loss) -> Placement {
    match op {
        Loss::SparseCrossEntropyGrad { .. } => Placement::Rows(node.shape().last() as u64),
        _ => Placement::Rows(1),
    }
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Loss) {
    let cfg = l.cfg;
    match *op {
        Loss::SparseCrossEntropy { x, labels, .. } => {
            let xs = l.node(x).shape();
            let (rows, cols) = (xs.rows() as u64, xs.last() as u64);
            let dt = l.node(x).dtype();
            let (xt, lt) = (l.t(x), l.t(labels));
            // Stage 1: the rows starting on each tile of x, one partial sum per tile.
            let mut groups: Vec<(TileId, u64, u64)> = Vec::new();
            for iv in l.tensors[xt.index()].mapping.intervals() {
                let r0 = iv.start.div_ceil(cols);
                let r1 = iv.end().div_ceil(cols).min(rows);
                if r1 > r0 {
                    groups.push((iv.tile, r0, r1));
                }
            }
            let mapping = Mapping::from_intervals(
                groups
                    .iter()
                    .enumerate()
                    .map(|(g, &(tile, _, _))| Interval {
                        tile,
                        start: g as u64,
                        len: 1,
                    })
                    .collect(),
            );
            let partials = l.temporary(i, "partials", DType::F32, groups.len() as u64, mapping);
            let stage1 = groups
                .iter()
                .enumerate()
                .map(|(g, &(tile, r0, r1))| Vertex {
                    tile,
                    codelet: Codelet::CrossEntropy,
                    cycles: row_op_cycles(cfg, (r1 - r0) * cols, cols, dt),
                    reads: vec![
                        Region::span(xt, r0 * cols, (r1 - r0) * cols),
                        Region::span(lt, r0, r1 - r0),
                    ],
                    writes: vec![Region::span(partials, g as u64, 1)],
                })
                .collect();
            l.compute(i, "rows", stage1);
            let out = l.t(i);
            let n = groups.len() as u64;
            let stage2 = Vertex {
                tile: l.first_tile(out),
                codelet: Codelet::Reduce,
                cycles: cost::reduce_cycles(cfg, 1, n, DType::F32),
                reads: vec![Region::span(partials, 0, n)],
                writes: vec![Region::span(out, 0, 1)],
            };
            l.compute(i, "mean", vec![stage2]);
        }
        Loss::SparseCrossEntropyGrad {
            x, labels, dloss, ..
        } => {
            let node = l.node(i);
            let (dt, cols) = (node.dtype(), node.shape().last() as u64);
            let (xt, lt, dl, out) = (l.t(x), l.t(labels), l.t(dloss), l.t(i));
            l.elementwise(
                i,
                out,
                &[xt],
                Codelet::CrossEntropy,
                move |n| row_op_cycles(cfg, n, cols, dt),
                move |s, len| {
                    vec![
                        Region::span(lt, s / cols, (s + len).div_ceil(cols) - s / cols),
                        Region::span(dl, 0, 1),
                    ]
                },
            );
        }
        _ => {}
    }
}
