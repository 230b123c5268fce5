//! Losses on tiles. The cross-entropy runs where the logits are, in three stages: each tile
//! holding logits reduces its part of every row to a maximum and a sum of exponentials, each
//! row's partials are combined into its loss (rows spread over the tiles), and one vertex
//! takes the mean. Its gradient is row-wise, like softmax.

use tessera_core::ops::loss::Loss;
use tessera_core::{DType, Node, NodeId, Storage};

use super::softmax::row_op_cycles;
use super::{row_segments, Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::program::{compress, Codelet, Interval, Mapping, Region, TileId, Vertex};

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
            // Stage 1, where the logits are: each tile computes, for every row it holds part
            // of, that part's maximum and sum of exponentials (and the label's logit when it
            // holds it): two fp32 partials per (row, tile), with no exchange of logits.
            let mut parts: Vec<(u64, TileId, u64, u64)> = Vec::new();
            for iv in l.tensors[xt.index()].mapping.intervals() {
                for (row, c0, c1) in row_segments(iv.start, iv.len, cols) {
                    if row < rows {
                        parts.push((row, iv.tile, row * cols + c0, c1 - c0));
                    }
                }
            }
            parts.sort_unstable();
            // Partial slots in (row, tile) order, so each row's partials are contiguous; each
            // part carries its slot.
            let mut slots: Vec<(u64, TileId)> = Vec::new();
            let mut by_tile: Vec<(TileId, u64, u64, u64, u64)> = Vec::with_capacity(parts.len());
            for &(row, tile, start, len) in &parts {
                if slots.last() != Some(&(row, tile)) {
                    slots.push((row, tile));
                }
                by_tile.push((tile, row, start, len, slots.len() as u64 - 1));
            }
            let mapping = Mapping::from_intervals(
                slots
                    .iter()
                    .enumerate()
                    .map(|(k, &(_, tile))| Interval {
                        tile,
                        start: 2 * k as u64,
                        len: 2,
                    })
                    .collect(),
            );
            let n_slots = slots.len() as u64;
            let partials = l.temporary(i, "partials", DType::F32, 2 * n_slots, mapping);
            by_tile.sort_unstable();
            let stage1 = by_tile
                .chunk_by(|a, b| a.0 == b.0)
                .map(|g| {
                    let n: u64 = g.iter().map(|p| p.3).sum();
                    // (row, slot) of each row the tile holds part of.
                    let mut its_rows: Vec<(u64, u64)> = g.iter().map(|p| (p.1, p.4)).collect();
                    its_rows.dedup();
                    let k = its_rows.len() as u64;
                    let mut reads: Vec<Region> =
                        g.iter().map(|p| Region::span(xt, p.2, p.3)).collect();
                    reads.extend(its_rows.iter().map(|&(r, _)| Region::span(lt, r, 1)));
                    Vertex {
                        tile: g[0].0,
                        codelet: Codelet::CrossEntropy,
                        cycles: UnaryKind::Exp.cycles(cfg, n, dt)
                            + cost::reduce_cycles(cfg, k, n.div_ceil(k), dt),
                        reads: compress(reads),
                        writes: compress(
                            its_rows
                                .iter()
                                .map(|&(_, slot)| Region::span(partials, 2 * slot, 2))
                                .collect(),
                        ),
                    }
                })
                .collect();
            l.compute(i, "rows", stage1);
            // Stage 2: each row's loss from its partials (rescaled to the row's maximum,
            // summed, its logarithm taken), rows spread over the tiles.
            let mapping = l.linear(rows, 4, 1, 1);
            let per_row = l.temporary(i, "row_losses", DType::F32, rows, mapping);
            let first_slot: Vec<u64> = (0..=rows)
                .map(|r| slots.partition_point(|&s| s.0 < r) as u64)
                .collect();
            let stage2 = l.tensors[per_row.index()]
                .mapping
                .intervals()
                .iter()
                .map(|iv| {
                    let (a, b) = (first_slot[iv.start as usize], first_slot[iv.end() as usize]);
                    let pieces = (b - a).div_ceil(iv.len.max(1));
                    Vertex {
                        tile: iv.tile,
                        codelet: Codelet::Reduce,
                        cycles: UnaryKind::Exp.cycles(cfg, b - a, DType::F32)
                            + cost::reduce_cycles(cfg, iv.len, 2 * pieces, DType::F32)
                            + UnaryKind::Log.cycles(cfg, iv.len, DType::F32),
                        reads: vec![Region::span(partials, 2 * a, 2 * (b - a))],
                        writes: vec![Region::span(per_row, iv.start, iv.len)],
                    }
                })
                .collect();
            l.compute(i, "row_losses", stage2);
            let out = l.t(i);
            let stage3 = Vertex {
                tile: l.first_tile(out),
                codelet: Codelet::Reduce,
                cycles: cost::reduce_cycles(cfg, 1, rows, DType::F32),
                reads: vec![Region::span(per_row, 0, rows)],
                writes: vec![Region::span(out, 0, 1)],
            };
            l.compute(i, "mean", vec![stage3]);
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
