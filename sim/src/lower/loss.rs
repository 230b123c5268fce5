//! Losses on tiles. The cross-entropy runs where the logits are, in three stages: each tile
//! holding logits reduces its part of every row to a maximum and a sum of exponentials, each
//! row's partials are combined into its loss (rows spread over the tiles), and one vertex
//! takes the mean. Its gradient is element-wise where the logits are, reading each row's
//! combined partials (its loss stage, which holds the row's log-sum-exp) from the forward
//! pass.

use tessera_core::ops::loss::Loss;
use tessera_core::{DType, NodeId, Storage};

use super::{row_segments, Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::program::{
    compress, Codelet, Interval, Mapping, Region, TensorId, TileId, Vertex, VertexType, REDUCE_ADD,
    REDUCE_OTHER,
};

pub(super) fn placement(op: &Loss) -> Placement {
    match op {
        // Laid out like the logits, so the gradient needs no exchange of them.
        Loss::SparseCrossEntropyGrad { x, .. } => Placement::Like(*x),
        Loss::SparseCrossEntropy { .. } => Placement::Rows(1),
    }
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Loss) {
    let cfg = l.cfg;
    match *op {
        Loss::SparseCrossEntropy { x, labels, .. } => {
            let rows = l.node(x).shape().rows() as u64;
            let per_row = row_stats(l, i, x, labels, "row_losses");
            l.row_stats.push((x, per_row));
            let out = l.t(i);
            let stage3 = Vertex {
                tile: l.first_tile(out),
                codelet: Codelet::Reduce(VertexType::of(REDUCE_ADD, DType::F32)),
                cycles: cost::reduce_cycles(cfg, 1, rows, DType::F32),
                reads: vec![Region::span(per_row, 0, rows)],
                writes: vec![Region::span(out, 0, 1)],
            };
            l.compute(i, "mean", vec![stage3]);
        }
        Loss::SparseCrossEntropyGrad {
            x,
            labels,
            dloss,
            from_logits,
            ..
        } => {
            // Element-wise where the logits are: from logits, exp(x - lse) scaled by the
            // upstream gradient, less it at the label, with each row's log-sum-exp from the
            // forward pass (or its two stages again when the forward ran elsewhere); from
            // probabilities, -dloss / p at the label and zero elsewhere.
            let node = l.node(i);
            let (dt, cols) = (node.dtype(), node.shape().last() as u64);
            let (xt, lt, dl, out) = (l.t(x), l.t(labels), l.t(dloss), l.t(i));
            let stats = if from_logits {
                let found = l.row_stats.iter().find(|&&(n, _)| n == x).map(|&(_, t)| t);
                Some(match found {
                    Some(t) => t,
                    None => row_stats(l, i, x, labels, "row_stats"),
                })
            } else {
                None
            };
            let cycles = move |n: u64| {
                if from_logits {
                    cost::elementwise_binary_cycles(cfg, n, dt)
                        + UnaryKind::Exp.cycles(cfg, n, dt)
                        + UnaryKind::Scale.cycles(cfg, n, dt)
                } else {
                    UnaryKind::Copy.cycles(cfg, n, dt)
                        + UnaryKind::Reciprocal.cycles(cfg, n.div_ceil(cols.max(1)), dt)
                }
            };
            l.elementwise(
                i,
                out,
                &[xt],
                Codelet::CrossEntropy,
                cycles,
                move |s, len, reads| {
                    let (r0, r1) = (s / cols, (s + len).div_ceil(cols));
                    reads.extend([Region::span(lt, r0, r1 - r0), Region::span(dl, 0, 1)]);
                    if let Some(st) = stats {
                        reads.push(Region::span(st, r0, r1 - r0));
                    }
                },
            );
        }
    }
}

/// The first two stages of a cross-entropy over logits `x`: each tile holding logits reduces
/// its part of every row to a maximum and a sum of exponentials (no logits exchanged), then
/// each row's partials are combined (rows spread over the tiles) into `what`, one fp32 value
/// per row: its log-sum-exp (and its loss, with the label's logit).
fn row_stats<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    x: NodeId,
    labels: NodeId,
    what: &str,
) -> TensorId {
    let cfg = l.cfg;
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
            let mut reads: Vec<Region> = g.iter().map(|p| Region::span(xt, p.2, p.3)).collect();
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
    // summed, its logarithm taken), rows spread over the tiles. A row's work is its
    // partials, so the rows are spread by their partials' bytes: a row with thousands
    // of partials (logits laid out by a matmul's many grid columns) gets a tile.
    let row_bytes = (8 * slots.len() as u64).div_ceil(rows.max(1)).max(4);
    let mapping = l.linear(rows, row_bytes, 1, 1);
    let per_row = l.temporary(i, what, DType::F32, rows, mapping);
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
                codelet: Codelet::Reduce(VertexType::of(REDUCE_OTHER, DType::F32)),
                cycles: UnaryKind::Exp.cycles(cfg, b - a, DType::F32)
                    + cost::reduce_cycles(cfg, iv.len, 2 * pieces, DType::F32)
                    + UnaryKind::Log.cycles(cfg, iv.len, DType::F32),
                reads: vec![Region::span(partials, 2 * a, 2 * (b - a))],
                writes: vec![Region::span(per_row, iv.start, iv.len)],
            }
        })
        .collect();
    l.compute(i, what, stage2);
    per_row
}
