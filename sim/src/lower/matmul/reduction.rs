//! The reduction of a product's partial sums: up to three stages, each but the last writing
//! intermediate fp32 blocks, the last writing the output.

use std::collections::HashMap;

use tessera_core::{DType, Storage};

use super::super::Lowering;
use super::{reduce_share, share_span, spans, Block, Blocks, ShareOrder};
use crate::cost;
use crate::program::{
    compress, Codelet, Interval, Mapping, Region, TensorId, Vertex, VertexType, REDUCE_ADD,
};

/// Reduces product `i`'s partial blocks (`partials`, block `(g, im, ik, in)` at `offsets`) into
/// `to` (indexed like the product's output) as `to_dt`. The partial blocks of one output block
/// are `pk_here`, on tiles ik = 0.. of the block's column of the grid. poplin reduces them in up
/// to three stages (`cost::reduce_stage_factors`); every stage but the last writes intermediate
/// fp32 blocks, each spread over the tiles of the partials it sums, in even shares of the
/// block's elements in output memory order. The last stage writes `to`, each of the pk tiles
/// an even share. Compute sets are named with `suffix` (a serial step's).
pub(super) fn reduce_blocks<S: Storage>(
    l: &mut Lowering<'_, S>,
    r: &Reduction<'_, '_>,
    offsets: &HashMap<(usize, u64, u64, u64), u64>,
    partials: TensorId,
    to: TensorId,
    to_dt: DType,
) {
    let (bl, pk_here, suffix) = (r.bl, r.pk_here, r.suffix);
    let factors = cost::stage_factors(bl.cfg, pk_here);
    // The current stage's source: per output block, the offsets of its blocks in `source`.
    let mut source = partials;
    let mut sources: Vec<Vec<u64>> = r
        .outs
        .iter()
        .map(|b| {
            (0..pk_here)
                .map(|q| offsets[&(b.g, b.im, q, b.i_n)])
                .collect()
        })
        .collect();
    // Tiles per source block so far.
    let mut spread = 1u64;
    let stages = factors.len();
    for (stage, &f) in factors.iter().enumerate().take(stages.saturating_sub(1)) {
        (source, sources) = r.intermediate(l, stage, f, spread, source, &sources);
        spread *= f;
    }
    let order = ShareOrder::of(bl.cfg, bl.plan, bl.dt);
    let vertices = r.last(order, source, &sources, to, to_dt);
    let phase = if stages == 1 {
        format!("reduce{suffix}")
    } else {
        format!("reduce{stages}{suffix}")
    };
    l.compute(bl.i, &phase, vertices);
}

/// A reduction of a product's partial blocks ([`reduce_blocks`]): the blocks' output
/// blocks, each with `pk_here` partial blocks, its compute sets named with `suffix`.
pub(super) struct Reduction<'r, 'b> {
    pub(super) bl: &'r Blocks<'b>,
    pub(super) outs: &'r [Block],
    /// Partial blocks per output block.
    pub(super) pk_here: u64,
    pub(super) suffix: &'r str,
}

impl Reduction<'_, '_> {
    /// An intermediate stage (index `stage`, summing `f` blocks, each source block spread
    /// over `spread` tiles): block j of the next depth sums source blocks j*f .. (j+1)*f and
    /// lives on their tiles. The stage's result and, per output block, its blocks' offsets.
    fn intermediate<S: Storage>(
        &self,
        l: &mut Lowering<'_, S>,
        stage: usize,
        f: u64,
        spread: u64,
        source: TensorId,
        sources: &[Vec<u64>],
    ) -> (TensorId, Vec<Vec<u64>>) {
        let (i, pt, pk_here) = (self.bl.i, self.bl.pt, self.pk_here);
        let depth = sources.first().map_or(0, Vec::len) as u64;
        let next_depth = depth.div_ceil(f.max(1));
        let group_tiles = spread * f;
        let mut iv = Vec::new();
        let mut next_sources = Vec::with_capacity(self.outs.len());
        let mut total = 0u64;
        let mut pending = Vec::new();
        for (b, offs) in self.outs.iter().zip(sources) {
            let elements = (b.m.1 - b.m.0) * (b.n.1 - b.n.0);
            let mut next = Vec::with_capacity(next_depth as usize);
            for j in 0..next_depth {
                let first_tile = j * group_tiles;
                let holders = (pk_here - first_tile).min(group_tiles);
                let summed: Vec<u64> =
                    offs[(j * f) as usize..((j + 1) * f).min(depth) as usize].to_vec();
                for r in 0..holders {
                    let (first, end) = share_span(elements, r, holders);
                    if first >= end {
                        continue;
                    }
                    let tile = self.bl.tile_at(b, first_tile + r);
                    iv.push(Interval {
                        tile,
                        start: total + first,
                        len: end - first,
                    });
                    pending.push((tile, total, first, end, summed.clone()));
                }
                next.push(total);
                total += elements;
            }
            next_sources.push(next);
        }
        let suffix = self.suffix;
        let name = format!("partials{}{suffix}", stage + 1);
        let inter = l.temporary(i, &name, pt, total, Mapping::from_intervals(iv));
        let vertices = pending
            .into_iter()
            .map(|(tile, base, first, end, summed)| {
                let reads: Vec<Region> = summed
                    .iter()
                    .map(|&off| Region::span(source, off + first, end - first))
                    .collect();
                let n = summed.len() as u64;
                Vertex {
                    tile,
                    codelet: Codelet::Reduce(VertexType {
                        function: REDUCE_ADD,
                        ..VertexType::cast(pt, pt)
                    }),
                    cycles: cost::partials_reduce_cycles(self.bl.cfg, end - first, n, pt, pt),
                    reads: compress(reads),
                    writes: vec![Region::span(inter, base + first, end - first)],
                }
            })
            .collect();
        l.compute(i, &format!("reduce{}{suffix}", stage + 1), vertices);
        (inter, next_sources)
    }

    /// The last stage: each of the pk tiles sums its share of every partial block of
    /// `source` (at `sources`) into `to` as `to_dt`.
    fn last(
        &self,
        order: ShareOrder,
        source: TensorId,
        sources: &[Vec<u64>],
        to: TensorId,
        to_dt: DType,
    ) -> Vec<Vertex> {
        let (bl, pt, pk_here) = (self.bl, self.bl.pt, self.pk_here);
        let depth = sources.first().map_or(0, Vec::len) as u64;
        let mut vertices = Vec::new();
        for (b, offs) in self.outs.iter().zip(sources) {
            let (rows, cols) = (b.m.1 - b.m.0, b.n.1 - b.n.0);
            for q in 0..pk_here {
                let pieces = reduce_share(rows, cols, q, pk_here, order);
                if pieces.is_empty() {
                    continue;
                }
                // Partial blocks are kept in the grouped order, so this tile's share of each
                // is one span: the same one in every partial block.
                let (first, end) = order.span(rows, cols, q, pk_here);
                let reads: Vec<Region> = offs
                    .iter()
                    .map(|&off| Region::span(source, off + first, end - first))
                    .collect();
                let mut writes = Vec::new();
                for &(r0, r1, c0, c1) in &pieces {
                    writes.extend((bl.p.out)(
                        b.g,
                        (b.m.0 + r0, b.m.0 + r1),
                        (b.n.0 + c0, b.n.0 + c1),
                    ));
                }
                vertices.push(Vertex {
                    tile: bl.tile_at(b, q),
                    codelet: Codelet::Reduce(VertexType {
                        function: REDUCE_ADD,
                        ..VertexType::cast(pt, to_dt)
                    }),
                    cycles: cost::partials_reduce_cycles(bl.cfg, end - first, depth, to_dt, pt),
                    reads: compress(reads),
                    writes: spans(to, writes),
                });
            }
        }
        vertices
    }
}
