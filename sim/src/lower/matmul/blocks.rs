//! The blocks of a product being lowered: the tile each block runs on, the AMP vertices of a
//! serial step, and the partial sums' layout and the tiles' shares of them.

use std::collections::HashMap;

use tessera_core::{DType, NodeId, Storage};

use super::super::product::Product;
use super::super::Lowering;
use super::{reduce_share, tile, Block, Share, ShareOrder};
use crate::cost::{self, UnaryKind};
use crate::machine::IpuConfig;
use crate::planner::MatMulPlan;
use crate::program::{compress, Codelet, Interval, Mapping, Region, TensorId, TileId, Vertex};

/// The regions of tensor `t` at the `(start, length)` spans `s`, compressed.
pub(super) fn spans(t: TensorId, s: Vec<(u64, u64)>) -> Vec<Region> {
    compress(
        s.into_iter()
            .map(|(a, len)| Region::span(t, a, len))
            .collect(),
    )
}

/// The blocks of a product being lowered ([`lower_blocks`]).
pub(super) struct Blocks<'b> {
    pub(super) i: NodeId,
    pub(super) p: &'b Product,
    pub(super) plan: &'b MatMulPlan,
    pub(super) blocks: &'b [Block],
    /// (weight, its transposed copy): the vertices read the copy.
    pub(super) remap: Option<(TensorId, TensorId)>,
    pub(super) cfg: &'b IpuConfig,
    /// The output's type.
    pub(super) dt: DType,
    pub(super) tiles: u32,
    pub(super) out: TensorId,
    /// The partial sums' type.
    pub(super) pt: DType,
}

/// Where each block's partial sums lie in the partials tensor, and its tile mapping.
pub(super) struct PartialsLayout {
    /// Each block's offset, by (g, im, ik, in).
    pub(super) offsets: HashMap<(usize, u64, u64, u64), u64>,
    /// Elements in all.
    pub(super) total: u64,
    pub(super) mapping: Mapping,
}

impl Blocks<'_> {
    /// The tile of block `b`'s column of the grid at `ik` along k.
    pub(super) fn tile_at(&self, b: &Block, ik: u64) -> TileId {
        tile(b.g, self.plan.grid(b.im, ik, b.i_n), self.p, self.tiles)
    }

    /// Block `b`'s tile.
    pub(super) fn tile_of(&self, b: &Block) -> TileId {
        self.tile_at(b, b.ik)
    }

    /// A block's AMP cycles. Straight, positions no product reaches are skipped
    /// (`Field::contributing`).
    pub(super) fn amp(&self, b: &Block) -> u64 {
        let bm = b.m.1 - b.m.0;
        let bm = match self.p.field {
            Some(f) if !self.plan.swapped => f.contributing_positions(bm),
            _ => bm,
        };
        (self.plan).amp_cycles(self.cfg, bm, b.k.1 - b.k.0, b.n.1 - b.n.0, self.dt)
    }

    /// Serial step `s` of every block: its share of k, writing where `writes` says.
    pub(super) fn step(&self, s: u64, writes: &dyn Fn(&Block) -> Vec<Region>) -> Vec<Vertex> {
        let (p, plan, remap) = (self.p, self.plan, self.remap);
        self.blocks
            .iter()
            .filter_map(|b| {
                let k = plan.serial_range(b.k, s);
                (k.0 < k.1).then(|| Vertex {
                    tile: self.tile_of(b),
                    codelet: Codelet::MatMulPartial,
                    cycles: self.amp(&Block { k, ..*b }),
                    reads: compress(
                        (p.reads)(b.g, b.m, k, b.n)
                            .into_iter()
                            .map(|r| match remap {
                                Some((from, to)) if r.tensor == from => Region { tensor: to, ..r },
                                _ => r,
                            })
                            .collect(),
                    ),
                    writes: writes(b),
                })
            })
            .collect()
    }

    /// The partial sums (of the partials' type) block by block, each on its block's tile.
    pub(super) fn partials_layout(&self) -> PartialsLayout {
        let mut offsets = HashMap::new();
        let mut total = 0u64;
        let mut iv = Vec::new();
        for b in self.blocks {
            offsets.insert((b.g, b.im, b.ik, b.i_n), total);
            let size = (b.m.1 - b.m.0) * (b.n.1 - b.n.0);
            iv.push(Interval {
                tile: self.tile_of(b),
                start: total,
                len: size,
            });
            total += size;
        }
        PartialsLayout {
            offsets,
            total,
            mapping: Mapping::from_intervals(iv),
        }
    }

    /// Where each output element is finished: per output block of `outs`, its tiles' shares
    /// (the block's own tile when k is not split, else each of its `pk_here` tiles an even
    /// share in the grouped order, `ShareOrder`), with the output spans of each share and,
    /// when k is not split, the block's span in the partials.
    pub(super) fn shares(
        &self,
        outs: &[Block],
        layout: &PartialsLayout,
        pk_here: u64,
    ) -> Vec<Share> {
        let (p, plan) = (self.p, self.plan);
        let order = ShareOrder::of(self.cfg, plan, self.dt);
        let mut shares: Vec<Share> = Vec::new();
        for b in outs {
            if plan.pk == 1 {
                let elements = (b.m.1 - b.m.0) * (b.n.1 - b.n.0);
                let off = layout.offsets[&(b.g, b.im, b.ik, b.i_n)];
                shares.push((
                    self.tile_of(b),
                    (p.out)(b.g, b.m, b.n),
                    Some((off, elements)),
                ));
                continue;
            }
            let (rows, cols) = (b.m.1 - b.m.0, b.n.1 - b.n.0);
            for q in 0..pk_here {
                let pieces = reduce_share(rows, cols, q, pk_here, order);
                if pieces.is_empty() {
                    continue;
                }
                let mut out_spans = Vec::new();
                for &(r0, r1, c0, c1) in &pieces {
                    out_spans.extend((p.out)(
                        b.g,
                        (b.m.0 + r0, b.m.0 + r1),
                        (b.n.0 + c0, b.n.0 + c1),
                    ));
                }
                shares.push((self.tile_at(b, q), out_spans, None));
            }
        }
        shares
    }

    /// A compute set over the shares: each reads `from` (the share's block of partial sums
    /// when `from` is partials and k is not split, else `from`'s output spans) and writes
    /// `to`'s output spans, also reading them when it accumulates into them.
    pub(super) fn over_shares(
        &self,
        shares: &[Share],
        from: TensorId,
        from_partials: bool,
        to: TensorId,
        codelet: Codelet,
        accumulate: bool,
    ) -> Vec<Vertex> {
        let (cfg, pt) = (self.cfg, self.pt);
        shares
            .iter()
            .map(|(tile, out_spans, block)| {
                let elements: u64 = out_spans.iter().map(|&(_, len)| len).sum();
                let mut reads = match (*block, from_partials) {
                    (Some((off, len)), true) => vec![Region::span(from, off, len)],
                    _ => spans(from, out_spans.clone()),
                };
                let writes = spans(to, out_spans.clone());
                if accumulate {
                    reads.extend(writes.iter().copied());
                }
                let cycles = match codelet {
                    Codelet::Binary(_) => cost::binary_in_place_cycles(cfg, elements, pt),
                    Codelet::Copy => UnaryKind::Copy.cycles(cfg, elements, pt),
                    _ => cost::cast_cycles(cfg, elements),
                };
                Vertex {
                    tile: *tile,
                    codelet,
                    cycles,
                    reads: compress(reads),
                    writes,
                }
            })
            .collect()
    }

    /// Serial step `s`'s partial sums, afresh: a temporary of the partials' type
    /// (interleaved when the AMP writes it) and the compute set making it, named with
    /// `suffix`. A block shorter than the steps (the last along k) has nothing to multiply in
    /// some: its partial sums there are zeros (a fill, priced as a copy), as the step's sum
    /// and accumulation read every block.
    pub(super) fn make_partials<S: Storage>(
        &self,
        l: &mut Lowering<'_, S>,
        layout: &PartialsLayout,
        s: u64,
        suffix: &str,
    ) -> TensorId {
        let (i, plan, pt) = (self.i, self.plan, self.pt);
        let name = format!("partials{suffix}");
        let partials = l.temporary(i, &name, pt, layout.total, layout.mapping.clone());
        l.tensors[partials.index()].interleaved = plan.on_amp();
        let span = |b: &Block| {
            vec![Region::span(
                partials,
                layout.offsets[&(b.g, b.im, b.ik, b.i_n)],
                (b.m.1 - b.m.0) * (b.n.1 - b.n.0),
            )]
        };
        let mut vertices = self.step(s, &span);
        vertices.extend(
            (self.blocks.iter())
                .filter(|b| {
                    let k = plan.serial_range(b.k, s);
                    k.0 >= k.1
                })
                .map(|b| {
                    let writes = span(b);
                    Vertex {
                        tile: self.tile_of(b),
                        codelet: Codelet::Copy,
                        cycles: UnaryKind::Copy.cycles(self.cfg, writes[0].elements(), pt),
                        reads: Vec::new(),
                        writes,
                    }
                }),
        );
        l.compute(i, &name, vertices);
        partials
    }
}
