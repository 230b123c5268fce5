//! Reductions on tiles. A reduction to few values runs in stages: a partial per tile where
//! the data is, intermediate stages while the partials are many (each reducing groups of
//! [`INTERMEDIATE_FAN_IN`] partials spread over the tiles), then one vertex per tile of the
//! output over what is left; a reduction that keeps some axes runs one
//! vertex per tile of the output, which receives the elements it reduces. Broadcasts copy the
//! operand's elements each output interval needs.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_core::ops::reduce::{Reduce, ReduceKind};
use tessera_core::{DType, Node, NodeId, Shape, Storage};

use super::kept::Kept;
use super::{BroadcastReads, Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::machine::IpuConfig;
use crate::program::{
    compress, Codelet, Interval, Mapping, Region, TensorId, TileId, Vertex, VertexType, REDUCE_ADD,
    REDUCE_MAX, REDUCE_SQUARE_ADD,
};

/// Row-major strides of a shape.
fn strides(s: Shape) -> Vec<u64> {
    let mut st = vec![0u64; s.rank()];
    let mut acc = 1u64;
    for i in (0..s.rank()).rev() {
        st[i] = acc;
        acc *= s.dim(i) as u64;
    }
    st
}

/// The regions of `x` (shape `sx`) that output elements `start .. start + len` of a reduction
/// over `axes` read.
pub(super) fn reads(
    x: TensorId,
    sx: Shape,
    axes: tessera_core::ops::Axes,
    start: u64,
    len: u64,
) -> Vec<Region> {
    let r = sx.rank();
    let st = strides(sx);
    let kept: Vec<usize> = (0..r).filter(|&a| !axes.contains(a)).collect();
    // The trailing reduced axes are one contiguous run per output element.
    let mut run = 1u64;
    let mut tail = r;
    while tail > 0 && axes.contains(tail - 1) {
        tail -= 1;
        run *= sx.dim(tail) as u64;
    }
    let inner: Vec<usize> = (0..tail).filter(|&a| axes.contains(a)).collect();
    // When the last axes are kept, consecutive outputs along them read consecutive elements:
    // one span per reduced coordinate for each such segment of the output.
    let mut seg = 1u64;
    if tail == r {
        let mut a = r;
        while a > 0 && !axes.contains(a - 1) {
            a -= 1;
            seg *= sx.dim(a) as u64;
        }
    }
    let count: u64 = inner.iter().map(|&a| sx.dim(a) as u64).product();
    let mut out = Vec::new();
    let mut o = start;
    while o < start + len {
        let piece = (seg - o % seg).min(start + len - o);
        // The output element's kept coordinates give its base offset in x.
        let (mut rem, mut base) = (o, 0u64);
        for &a in kept.iter().rev() {
            let d = sx.dim(a) as u64;
            base += (rem % d) * st[a];
            rem /= d;
        }
        for c in 0..count {
            let (mut rem, mut off) = (c, base);
            for &a in inner.iter().rev() {
                let d = sx.dim(a) as u64;
                off += (rem % d) * st[a];
                rem /= d;
            }
            out.push(Region::span(x, off, if seg > 1 { piece } else { run }));
        }
        o += if seg > 1 { piece } else { 1 };
    }
    out.sort_unstable();
    out.dedup();
    compress(out)
}

/// Reductions to at most this many outputs, each of at least [`TWO_STAGE_MIN_LENGTH`]
/// elements, may run in two stages, as poplibs' multi-stage reductions do: every tile holding
/// the input reduces its own elements into partials, then the tiles of the output reduce the
/// partials. A one-stage reduction would gather a small output's whole input onto its few
/// tiles. (Estimates of where poplibs' reduction planner switches.)
pub(super) const TWO_STAGE_MAX_OUTPUTS: u64 = 4096;

/// See [`TWO_STAGE_MAX_OUTPUTS`].
pub(super) const TWO_STAGE_MIN_LENGTH: u64 = 64;

/// The least factor by which the first stage must shrink the data (input elements per
/// partial value, over all tiles) for a two-stage reduction to pay: below it the partials are
/// as large as the input, and the first stage only adds a compute set and a copy. (Estimate.)
pub(super) const TWO_STAGE_MIN_FACTOR: u64 = 2;

/// The most partial blocks the last stage of a reduction reduces per output: while there are
/// more, an intermediate stage reduces groups of this many. poplibs adds an
/// intermediate-to-intermediate stage while the partials exceed this many values per output
/// (`reductionFactorThresholdToAddMoreStages`, 64 since 2020, used by `calculateNextStep` in
/// popops' `ReductionPlan.cpp`, "found empirically" there); reducing groups of that size is
/// our simplification of its `calculateSplit`.
pub(super) const INTERMEDIATE_FAN_IN: u64 = 64;

/// The fewest values an intermediate-stage vertex reduces per partial block (estimate: two
/// fp32 vectors of the accumulator's width, so vertices' setup stays below their work).
pub(super) const INTERMEDIATE_GRAIN: u64 = 8;

/// The most runs of the innermost block of axes [`group_hull`] walks before it settles for
/// every group.
const HULL_RUNS: u64 = 64;

/// The groups (output elements) of a reduction of shape `sx` over `axes` that the input
/// elements `start .. start + len` belong to, as their hull `g0 .. g1`. The axes are taken as
/// blocks of adjacent axes that are all kept or all reduced (axes of size 1 left out), so a
/// batch norm's `[N, C, H, W]` over `N, H, W` is `[N] [C] [H*W]`. Exact when the group index
/// grows with the element index (no reduced block outside a kept one) or when the elements
/// take at most [`HULL_RUNS`] runs of the innermost block, else every group.
#[cfg(test)]
pub(super) fn group_hull(
    sx: Shape,
    axes: tessera_core::ops::Axes,
    start: u64,
    len: u64,
) -> (u64, u64) {
    Hull::new(sx, axes).of(start, len)
}

/// [`group_hull`] for one shape and set of axes, its blocks worked out once for the many
/// intervals of a mapping.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hull {
    /// Size of each block, outermost first.
    sizes: [u64; tessera_core::MAX_RANK],
    n: usize,
    /// Strides of the kept blocks in the group index (0 for reduced blocks).
    gst: [u64; tessera_core::MAX_RANK],
    groups: u64,
    monotonic: bool,
    /// The outermost kept block (`n` when none is): the blocks outside it add nothing to a
    /// group index.
    top: usize,
}

impl Hull {
    pub(super) fn new(sx: Shape, axes: tessera_core::ops::Axes) -> Self {
        let mut blocks = [(0u64, false); tessera_core::MAX_RANK];
        let mut n = 0;
        for a in 0..sx.rank() {
            let (d, kept) = (sx.dim(a) as u64, !axes.contains(a));
            if d == 1 {
                continue;
            }
            if n > 0 && blocks[n - 1].1 == kept {
                blocks[n - 1].0 *= d;
            } else {
                blocks[n] = (d, kept);
                n += 1;
            }
        }
        let groups: u64 = blocks[..n].iter().filter(|b| b.1).map(|b| b.0).product();
        let mut gst = [0u64; tessera_core::MAX_RANK];
        let mut acc = 1u64;
        for k in (0..n).rev() {
            if blocks[k].1 {
                gst[k] = acc;
                acc *= blocks[k].0;
            }
        }
        let monotonic = blocks[..n].windows(2).all(|w| w[0].1 || !w[1].1);
        let top = (0..n).find(|&k| blocks[k].1).unwrap_or(n);
        Hull {
            sizes: blocks.map(|b| b.0),
            n,
            gst,
            groups,
            monotonic,
            top,
        }
    }

    /// The group of element `e`: its index in each kept block out to [`top`](Self::top)
    /// times the block's stride in the group index.
    fn group_of(&self, e: u64) -> u64 {
        let (top, n) = (self.top, self.n);
        super::weighted_digits(e, &self.sizes[top..n], &self.gst[top..n])
    }

    /// The hull of the groups elements `start .. start + len` belong to.
    pub(super) fn of(&self, start: u64, len: u64) -> (u64, u64) {
        if len == 0 || self.n == 0 {
            return (0, self.groups.min(1));
        }
        if self.monotonic {
            return (self.group_of(start), self.group_of(start + len - 1) + 1);
        }
        let (last, last_kept) = (self.sizes[self.n - 1], self.gst[self.n - 1] != 0);
        if len / last + 2 > HULL_RUNS {
            return (0, self.groups);
        }
        let (mut g0, mut g1) = (u64::MAX, 0u64);
        let mut e = start;
        while e < start + len {
            let run = (last - e % last).min(start + len - e);
            let g = self.group_of(e);
            let span = if last_kept { run } else { 1 };
            g0 = g0.min(g);
            g1 = g1.max(g + span);
            e += run;
        }
        (g0, g1)
    }
}

/// Whether a reduction to `outputs` values of `length` elements each is one that may run in
/// two stages (see [`two_stage`], which also checks that its first stage pays).
pub(super) fn two_stage_pays(outputs: u64, length: u64) -> bool {
    outputs <= TWO_STAGE_MAX_OUTPUTS && length >= TWO_STAGE_MIN_LENGTH
}

/// A tile's intervals of a reduction's input and the hulls of the groups they touch.
type TileHulls<'a> = (&'a [Interval], &'a [(u64, u64)]);

/// Each tile's hulls of a reduction's input (see [`tile_hulls`]): all tiles' hulls in a row,
/// and where each tile's begin (one more entry than tiles).
struct HullList {
    hulls: Vec<(u64, u64)>,
    first: Vec<u32>,
}

/// What a [`HullList`] is made of: the input's layout, shape and reduced axes.
#[derive(Clone, PartialEq, Eq, Hash)]
struct HullKey {
    mapping: u128,
    shape: Shape,
    axes: u8,
}

/// Hull lists made so far in this process. At most 256 are kept (an estimate: a model's
/// normalisations read their statistics' input three times, forward, again for the backward
/// pass and in the gradient, on one layout; a few models' worth).
static HULLS: Kept<HullKey, Arc<HullList>> = Kept::new(256);

/// Drops the hull lists this process keeps.
pub(super) fn clear_hulls() {
    HULLS.clear();
}

/// For each tile of `mapping` (in the order of
/// [`intervals_by_tile`](crate::program::Mapping::intervals_by_tile)), the hulls of the
/// groups of `hull` its intervals touch, sorted and merged where they touch: they depend
/// only on the layout, the shape and the axes, so they are made once for every reduction
/// over them.
fn tile_hulls(mapping: &Mapping, sx: Shape, axes: tessera_core::ops::Axes) -> Arc<HullList> {
    let key = HullKey {
        mapping: mapping.digest(),
        shape: sx,
        axes: axes.0,
    };
    HULLS.get_or_make(key, || {
        let hull = Hull::new(sx, axes);
        let ivs = mapping.intervals_by_tile();
        let mut out = HullList {
            hulls: Vec::new(),
            first: Vec::new(),
        };
        let mut hulls: Vec<(u64, u64)> = Vec::new();
        for g in ivs.chunk_by(|a, b| a.tile == b.tile) {
            out.first.push(out.hulls.len() as u32);
            hulls.clear();
            hulls.extend(g.iter().map(|iv| hull.of(iv.start, iv.len)));
            hulls.sort_unstable();
            let from = out.hulls.len();
            for &(a, b) in &hulls {
                match out.hulls[from..].last_mut() {
                    Some(last) if a <= last.1 => last.1 = last.1.max(b),
                    _ => out.hulls.push((a, b)),
                }
            }
        }
        out.first.push(out.hulls.len() as u32);
        out.hulls.shrink_to_fit();
        Arc::new(out)
    })
}

/// A block of partial values: values `v0 .. v1` of the output, at `offset` in its tensor.
#[derive(Clone, Copy)]
struct Piece {
    tensor: TensorId,
    v0: u64,
    v1: u64,
    offset: u64,
}

impl Piece {
    /// The part of this piece covering output values `a .. b`, if any.
    fn overlap(&self, a: u64, b: u64) -> Option<Region> {
        let (s, e) = (self.v0.max(a), self.v1.min(b));
        (s < e).then(|| Region::span(self.tensor, self.offset + s - self.v0, e - s))
    }
}

/// The most pieces covering any one output value.
fn max_depth(pieces: &[Piece]) -> u64 {
    let mut ends: Vec<(u64, i64)> = pieces
        .iter()
        .flat_map(|p| [(p.v0, 1), (p.v1, -1)])
        .collect();
    ends.sort_unstable();
    let (mut depth, mut most) = (0i64, 0i64);
    for (_, d) in ends {
        depth += d;
        most = most.max(depth);
    }
    most as u64
}

/// For each of the disjoint ranges `ranges` (sorted by start), the pieces overlapping it,
/// by a sweep over the pieces sorted by their first value.
fn overlaps(pieces: &mut [Piece], ranges: &[(u64, u64)]) -> Vec<Vec<Region>> {
    pieces.sort_by_key(|p| (p.v0, p.v1));
    let mut next = 0;
    let mut active: Vec<Piece> = Vec::new();
    ranges
        .iter()
        .map(|&(a, b)| {
            while next < pieces.len() && pieces[next].v0 < b {
                active.push(pieces[next]);
                next += 1;
            }
            active.retain(|p| p.v1 > a);
            active.iter().filter_map(|p| p.overlap(a, b)).collect()
        })
        .collect()
}

/// A vertex on `tile` summing the fp32 partial spans `reads` into `write` (of as many values
/// as each span covers at most): its values times the partials read per value, plus the
/// region overhead per extra span.
fn reduce_vertex(
    cfg: &IpuConfig,
    tile: TileId,
    reads: Vec<Region>,
    write: Region,
    joined: &mut Joined,
) -> Vertex {
    let read: u64 = reads.iter().map(|r| r.len).sum();
    let w = write.len;
    Vertex {
        tile,
        codelet: Codelet::Reduce(VertexType::of(REDUCE_ADD, DType::F32)),
        cycles: cost::reduce_cycles(cfg, w, read.div_ceil(w.max(1)), DType::F32)
            + super::REGION_OVERHEAD_CYCLES * (reads.len() as u64).saturating_sub(1),
        reads: joined.compress(reads),
        writes: vec![write],
    }
}

/// A region less a start: its start after it, length, rows and stride.
type Form = (u64, u64, u64, u64);

/// [`compress`] of one tensor's regions, remembered by their form: the regions less the
/// first one's start. Joining only compares starts with each other, so regions moved along
/// the tensor join as they did, moved alike. The vertices of a reduction's later stages read
/// their blocks' partials in a few forms over and over (DenseNet-121's training at batch 8:
/// 213,000 such vertices, 11,000 forms in all).
#[derive(Default)]
struct Joined {
    /// The joined regions of each form, less the first region's start.
    made: HashMap<Vec<Form>, Vec<Region>, crate::exchange::FastHash>,
    /// The form being looked up.
    form: Vec<Form>,
}

impl Joined {
    /// At most this many forms are kept, then they start again (estimate: more than a
    /// reduction of the models here has, a few MB).
    const FORMS: usize = 1 << 12;

    /// [`compress`] of `regions`.
    fn compress(&mut self, mut regions: Vec<Region>) -> Vec<Region> {
        regions.sort_unstable();
        regions.dedup();
        let Some(&first) = regions.first() else {
            return regions;
        };
        let (tensor, base) = (first.tensor, first.start);
        if regions.iter().any(|r| r.tensor != tensor) {
            return compress(regions);
        }
        self.form.clear();
        self.form.extend(
            regions
                .iter()
                .map(|r| (r.start - base, r.len, r.rows, r.stride)),
        );
        if let Some(made) = self.made.get(&self.form) {
            return made
                .iter()
                .map(|r| Region {
                    tensor,
                    start: r.start + base,
                    ..*r
                })
                .collect();
        }
        let joined = compress(regions);
        if self.made.len() >= Self::FORMS {
            self.made.clear();
        }
        let form = joined
            .iter()
            .map(|r| Region {
                start: r.start - base,
                ..*r
            })
            .collect();
        self.made.insert(self.form.clone(), form);
        joined
    }
}

/// What a reduction reduces: tensors of one shape, reduced over the same axes.
#[derive(Clone, Copy)]
pub(super) struct Reduced<'x> {
    /// The tensors.
    pub(super) tensors: &'x [TensorId],
    /// Their shape.
    pub(super) shape: Shape,
    /// The axes reduced.
    pub(super) axes: tessera_core::ops::Axes,
}

/// A two-stage reduction of `input`'s tensors `xs` (all of shape `sx`, reduced over `axes`)
/// into `out`, which holds `values` values per group; `passes` reductions per element. When its
/// first stage would not pay (see [`TWO_STAGE_MIN_FACTOR`]) and the input is one tensor
/// reduced over its leading axes with more rows than [`INTERMEDIATE_FAN_IN`] (a bias or
/// layer-norm gradient over a sequence laid out a row per tile), the input's rows are the
/// partial blocks and the intermediate stages start from them; otherwise it returns `false`,
/// lowering nothing.
///
/// Each tile holding the input reduces its elements into a partial block covering the hull
/// of the groups it touches (not every group: a tile holding one row of a layer norm's input
/// writes that row's partials only). While some output value has more than
/// [`INTERMEDIATE_FAN_IN`] partials, an intermediate stage reduces the blocks, taken in
/// order of their first value in groups of that many, into one block per group (its hull),
/// cut into column chunks spread over the tiles. The last stage reduces, on each tile of the
/// output, the parts of the blocks covering its values.
pub(super) fn two_stage<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    input: Reduced<'_>,
    out: TensorId,
    values: u64,
    passes: u64,
) -> bool {
    let Reduced {
        tensors: xs,
        shape: sx,
        axes,
    } = input;
    // Stage 1: per tile holding the input, partial blocks over the groups it touches (the
    // hulls of its intervals' groups, merged where they touch).
    let mapping = l.tensors[xs[0].index()].mapping.clone();
    let ivs = mapping.intervals_by_tile();
    let list = tile_hulls(&mapping, sx, axes);
    let tiles: Vec<TileHulls<'_>> = ivs
        .chunk_by(|a, b| a.tile == b.tile)
        .zip(list.first.windows(2))
        .map(|(g, w)| (g, &list.hulls[w[0] as usize..w[1] as usize]))
        .collect();
    let inputs: u64 = tiles.iter().flat_map(|t| t.0).map(|iv| iv.len).sum();
    let widths: u64 = list.hulls.iter().map(|&(g0, g1)| g1 - g0).sum();
    let mut pieces: Vec<Piece> = if inputs < TWO_STAGE_MIN_FACTOR * widths {
        // A first stage would only copy. When the reduced axes lead (`[rows, outputs]` in
        // memory), each input row already is a partial block over the outputs: with more rows
        // than the fan-in, the intermediate stages reduce the input's rows themselves.
        match input_rows(l, xs, sx, axes, values, passes) {
            Some(rows) if max_depth(&rows) > INTERMEDIATE_FAN_IN => rows,
            _ => return false,
        }
    } else {
        first_stage(l, i, xs, &tiles, values, passes)
    };
    intermediate_and_last(l, i, out, &mut pieces);
    true
}

/// The input's rows as partial blocks, when `xs` is one tensor reduced over its leading axes
/// into one value per output: each interval of the input cut at row ends.
fn input_rows<S: Storage>(
    l: &Lowering<'_, S>,
    xs: &[TensorId],
    sx: Shape,
    axes: tessera_core::ops::Axes,
    values: u64,
    passes: u64,
) -> Option<Vec<Piece>> {
    let k = axes.end();
    let leading = u16::from(axes.0) == (1u16 << k) - 1;
    if xs.len() != 1 || values != 1 || passes != 1 || !leading || k == 0 || k >= sx.rank() {
        return None;
    }
    let cols: u64 = sx.dims()[k..].iter().map(|&d| u64::from(d)).product();
    let x = xs[0];
    let mut rows = Vec::new();
    for iv in l.tensors[x.index()].mapping.intervals() {
        let mut at = iv.start;
        while at < iv.end() {
            let v0 = at % cols;
            let len = (cols - v0).min(iv.end() - at);
            rows.push(Piece {
                tensor: x,
                v0,
                v1: v0 + len,
                offset: at,
            });
            at += len;
        }
    }
    Some(rows)
}

/// Stage 1 of [`two_stage`]: per tile holding the input, its partial blocks.
fn first_stage<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    xs: &[TensorId],
    tiles: &[TileHulls<'_>],
    values: u64,
    passes: u64,
) -> Vec<Piece> {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let mut offset = 0;
    let mut pieces = Vec::new();
    let mut layout = Vec::new();
    let mut first_piece = Vec::with_capacity(tiles.len() + 1);
    for (g, hulls) in tiles {
        first_piece.push(pieces.len());
        for &(g0, g1) in hulls.iter() {
            let w = (g1 - g0) * values;
            layout.push(Interval {
                tile: g[0].tile,
                start: offset,
                len: w,
            });
            pieces.push((g0 * values, g1 * values, offset));
            offset += w;
        }
    }
    first_piece.push(pieces.len());
    let partials = l.temporary(
        i,
        "partials",
        DType::F32,
        offset,
        Mapping::from_intervals(layout),
    );
    // Each tile reads its intervals of every input: the runs they join into (the same for
    // every input, laid out alike), made once per mapping.
    let mapping = l.tensors[xs[0].index()].mapping.clone();
    let runs = mapping.runs_per_tile();
    let mut inputs = xs.to_vec();
    inputs.sort_unstable();
    inputs.dedup();
    let stage1 = tiles
        .iter()
        .enumerate()
        .map(|(t, (g, hulls))| {
            let (tile, joined) = &runs[t];
            debug_assert_eq!(*tile, g[0].tile);
            let mut reads: Vec<Region> = inputs
                .iter()
                .flat_map(|&x| joined.iter().map(move |r| Region { tensor: x, ..*r }))
                .collect();
            reads.sort_unstable();
            let n: u64 = g.iter().map(|iv| iv.len).sum();
            let touched = hulls.iter().map(|&(a, b)| b - a).sum::<u64>().max(1);
            let mine = &pieces[first_piece[t]..first_piece[t + 1]];
            Vertex {
                tile: g[0].tile,
                codelet: Codelet::Reduce(VertexType {
                    function: if passes > 1 {
                        REDUCE_SQUARE_ADD
                    } else {
                        REDUCE_ADD
                    },
                    ..VertexType::cast(dt, DType::F32)
                }),
                cycles: passes * cost::reduce_cycles(cfg, touched, n.div_ceil(touched), dt)
                    + super::REGION_OVERHEAD_CYCLES * (mine.len() as u64).saturating_sub(1),
                reads,
                writes: compress(
                    mine.iter()
                        .map(|&(v0, v1, off)| Region::span(partials, off, v1 - v0))
                        .collect(),
                ),
            }
        })
        .collect();
    // Each tile reads its own runs of the inputs laid out like the first.
    let local = l.laid_out_like(xs[0], &inputs, &[]);
    let runs = super::Runs::of(xs[0], inputs);
    l.compute_reading_runs(i, "partials", stage1, &local, runs);
    pieces
        .into_iter()
        .map(|(v0, v1, offset)| Piece {
            tensor: partials,
            v0,
            v1,
            offset,
        })
        .collect()
}

/// The intermediate stages of [`two_stage`] while some value has more than
/// [`INTERMEDIATE_FAN_IN`] partial blocks, then the last stage into `out`.
fn intermediate_and_last<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    out: TensorId,
    pieces: &mut Vec<Piece>,
) {
    let cfg = l.cfg;
    // The stages' vertices read their blocks in a few forms (see `Joined`).
    let mut joined = Joined::default();
    // Intermediate stages while some value has more than INTERMEDIATE_FAN_IN partials.
    let mut stage = 0;
    while max_depth(pieces) > INTERMEDIATE_FAN_IN {
        stage += 1;
        pieces.sort_by_key(|p| (p.v0, p.v1));
        let groups: Vec<&[Piece]> = pieces.chunks(INTERMEDIATE_FAN_IN as usize).collect();
        // Column chunks per group: enough pieces to use the tiles, each at least a grain.
        let chunks_per = (u64::from(l.tile_count()) / groups.len() as u64).max(1);
        let mut chunks: Vec<(usize, u64, u64)> = Vec::new();
        let mut hulls = Vec::with_capacity(groups.len());
        let mut offset = 0;
        for (k, grp) in groups.iter().enumerate() {
            let h0 = grp.iter().map(|p| p.v0).min().unwrap_or(0);
            let h1 = grp.iter().map(|p| p.v1).max().unwrap_or(0);
            let width = h1 - h0;
            let grain = INTERMEDIATE_GRAIN.min(width.max(1));
            let n = chunks_per.clamp(1, width.div_ceil(grain).max(1));
            let w = width.div_ceil(n).div_ceil(grain) * grain;
            let mut c = h0;
            while c < h1 {
                let e = (c + w).min(h1);
                chunks.push((k, c, e));
                c = e;
            }
            hulls.push((h0, h1, offset));
            offset += width;
        }
        let first = l.cursor;
        let tile_of = |n: usize| TileId::wrapping(u64::from(first) + n as u64, cfg.tiles);
        let mapping = Mapping::from_intervals(
            chunks
                .iter()
                .enumerate()
                .map(|(n, &(k, c0, c1))| Interval {
                    tile: tile_of(n),
                    start: hulls[k].2 + c0 - hulls[k].0,
                    len: c1 - c0,
                })
                .collect(),
        );
        l.cursor = tile_of(chunks.len()).0;
        let reduced = l.temporary(
            i,
            &format!("intermediate{stage}"),
            DType::F32,
            offset,
            mapping,
        );
        let vertices = chunks
            .iter()
            .enumerate()
            .map(|(n, &(k, c0, c1))| {
                let reads = groups[k].iter().filter_map(|p| p.overlap(c0, c1)).collect();
                let write = Region::span(reduced, hulls[k].2 + c0 - hulls[k].0, c1 - c0);
                reduce_vertex(cfg, tile_of(n), reads, write, &mut joined)
            })
            .collect();
        // Each chunk reads its columns of its group's blocks: no two reads share an element.
        l.compute_disjoint(i, &format!("intermediate{stage}"), vertices);
        *pieces = hulls
            .iter()
            .map(|&(v0, v1, offset)| Piece {
                tensor: reduced,
                v0,
                v1,
                offset,
            })
            .collect();
    }
    // Last stage: each tile of the output reduces its values over the pieces covering them.
    let mut outs: Vec<Interval> = l.tensors[out.index()].mapping.intervals().to_vec();
    outs.sort_by_key(|iv| iv.start);
    let ranges: Vec<(u64, u64)> = outs.iter().map(|iv| (iv.start, iv.end())).collect();
    let reads = overlaps(pieces, &ranges);
    let stage2 = outs
        .iter()
        .zip(reads)
        .map(|(iv, reads)| {
            let write = Region::span(out, iv.start, iv.len);
            reduce_vertex(cfg, iv.tile, reads, write, &mut joined)
        })
        .collect();
    l.compute(i, "reduce", stage2);
}

/// A reduction's output is spread by the input each element reduces (see
/// [`Placement::Weighted`]); a broadcast's like any new tensor.
pub(super) fn placement<S: Storage>(l: &Lowering<'_, S>, node: &Node, op: &Reduce) -> Placement {
    match *op {
        Reduce::Reduce { x, .. } => by_input(l, node, x),
        Reduce::Broadcast { .. } => Placement::Rows(1),
    }
}

/// A reduction's output of `node` from `x`, spread by the input each output reduces (each
/// output weighs its share of `x`'s bytes).
pub(super) fn by_input<S: Storage>(l: &Lowering<'_, S>, node: &Node, x: NodeId) -> Placement {
    let xn = l.node(x);
    let per_output = (xn.shape().elements() / node.shape().elements().max(1)) as u64;
    Placement::Weighted(per_output * xn.dtype().size() as u64)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Reduce) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, so) = (node.dtype(), node.shape());
    let out = l.t(i);
    match *op {
        Reduce::Broadcast { x } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            l.per_tile(
                i,
                "broadcast",
                out,
                Codelet::Broadcast,
                move |n| UnaryKind::Copy.cycles(cfg, n, dt),
                {
                    let of = BroadcastReads::new(xt, sx, so);
                    move |iv: &Interval, reads: &mut Vec<Region>| of.push(iv.start, iv.len, reads)
                },
            );
        }
        Reduce::Reduce { x, axes, kind, .. } => {
            let vt = VertexType::of(
                match kind {
                    ReduceKind::Max => REDUCE_MAX,
                    ReduceKind::Sum | ReduceKind::Mean => REDUCE_ADD,
                },
                dt,
            );
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let per_output = (sx.elements() / so.elements().max(1)) as u64;
            if two_stage_pays(so.elements() as u64, per_output)
                && two_stage(
                    l,
                    i,
                    Reduced {
                        tensors: &[xt],
                        shape: sx,
                        axes,
                    },
                    out,
                    1,
                    1,
                )
            {
                return;
            }
            let ivs: Vec<Interval> = l.tensors[out.index()].mapping.intervals().to_vec();
            let vertices = ivs
                .iter()
                .map(|iv| Vertex {
                    tile: iv.tile,
                    codelet: Codelet::Reduce(vt),
                    cycles: cost::reduce_cycles(cfg, iv.len, per_output, dt),
                    reads: reads(xt, sx, axes, iv.start, iv.len),
                    writes: vec![Region::span(out, iv.start, iv.len)],
                })
                .collect();
            l.compute(i, "reduce", vertices);
        }
    }
}

#[cfg(test)]
mod tests {
    use tessera_core::ops::reduce::ReduceKind;
    use tessera_core::{DType, Graph, Plan};

    use proptest::prelude::*;
    use tessera_core::ops::Axes;
    use tessera_core::Shape;

    use super::{compress, group_hull, Joined, Region, TensorId, INTERMEDIATE_FAN_IN};
    use crate::heap::Heap;
    use crate::lower::{lower, LowerOptions};
    use crate::machine::{IpuConfig, Preset};
    use crate::program::Step;

    /// The checked program of a reduction `name` of an fp32 input `x` of shape `dims` over
    /// `axis`, on an Mk2.
    fn lowered_reduction(
        name: &str,
        dims: &[usize],
        axis: isize,
        kind: ReduceKind,
    ) -> crate::program::Program {
        let cfg = IpuConfig::preset(Preset::Mk2);
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", dims, DType::F32).unwrap();
        g.reduce(name, x, &[axis], false, kind).unwrap();
        let plan = Plan::new(&g).unwrap();
        let p = lower(&plan, &cfg, LowerOptions::default());
        crate::check::check(&p).unwrap();
        p
    }

    /// The names of `p`'s compute sets, in order.
    fn compute_set_names(p: &crate::program::Program) -> Vec<&str> {
        p.steps
            .iter()
            .filter_map(|s| match s {
                Step::Compute(cs) => Some(cs.name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// That no vertex of `p` outside compute set `except` reads more than the fan-in of runs.
    fn assert_fan_in(p: &crate::program::Program, except: &str) {
        for s in &p.steps {
            if let Step::Compute(cs) = s {
                if cs.name != except {
                    for v in &cs.vertices {
                        let runs: u64 = v.reads.iter().map(|r| r.rows).sum();
                        assert!(runs <= INTERMEDIATE_FAN_IN, "{}: {runs} runs", cs.name);
                    }
                }
            }
        }
    }

    /// A reduction whose input is spread over every tile, each tile touching every output (a
    /// column sum), reduces its per-tile partials in intermediate stages, so no vertex after
    /// the first stage reads more than the fan-in of partial blocks, and the program still
    /// checks.
    #[test]
    fn many_partials_reduce_in_intermediate_stages() {
        let p = lowered_reduction("mean", &[8192, 64], 0, ReduceKind::Mean);
        let names = compute_set_names(&p);
        // One partial block per tile holding x, then stages dividing them by the fan-in.
        let mut count = p.tensors[0].mapping.tile_count() as u64;
        let mut want = vec!["mean/partials".to_string()];
        while count > INTERMEDIATE_FAN_IN {
            count = count.div_ceil(INTERMEDIATE_FAN_IN);
            want.push(format!("mean/intermediate{}", want.len()));
        }
        want.push("mean/reduce".to_string());
        assert!(
            want.len() > 2,
            "x should be on more than {INTERMEDIATE_FAN_IN} tiles"
        );
        assert_eq!(names, want);
        assert_fan_in(&p, "mean/partials");
    }

    /// A column sum whose input holds less than a row per tile (a bias gradient over a
    /// sequence) has no first stage to pay for: the input's rows are the partial blocks, and
    /// intermediate stages reduce them, so no vertex reads more than the fan-in of rows.
    #[test]
    fn input_rows_are_the_partials_when_a_tile_holds_less_than_a_row() {
        let p = lowered_reduction("sum", &[1024, 768], 0, ReduceKind::Sum);
        let names = compute_set_names(&p);
        assert_eq!(names, ["sum/intermediate1", "sum/reduce"]);
        assert_fan_in(&p, "");
    }

    /// A row reduction (each tile holding part of one or two rows) writes partials for the
    /// rows each tile touches only: a couple of values per tile, not one per output.
    #[test]
    fn partials_cover_only_the_groups_a_tile_touches() {
        let p = lowered_reduction("sum", &[64, 8192], 1, ReduceKind::Sum);
        let partials = p.tensors.iter().find(|t| t.name == "sum/partials").unwrap();
        let tiles = p.tensors[0].mapping.tile_count() as u64;
        assert!(
            partials.elements <= 2 * tiles,
            "{} partials",
            partials.elements
        );
        assert!(partials.elements >= tiles);
    }

    /// The groups of every element of a span, by brute force.
    fn groups_of(sx: Shape, axes: Axes, start: u64, len: u64) -> Vec<u64> {
        let r = sx.rank();
        (start..start + len)
            .map(|e| {
                let (mut rem, mut g, mut mul) = (e, 0u64, 1u64);
                for a in (0..r).rev() {
                    let d = sx.dim(a) as u64;
                    if !axes.contains(a) {
                        g += (rem % d) * mul;
                        mul *= d;
                    }
                    rem /= d;
                }
                g
            })
            .collect()
    }

    proptest! {
        /// The hull holds every group the span's elements belong to, and is tight (its ends
        /// are groups of the span) unless it is every group.
        #[test]
        fn group_hull_covers_the_span(
            dims in proptest::collection::vec(1u32..6, 1..5),
            mask in 0u8..16,
            a in 0u64..10_000,
            b in 0u64..10_000,
        ) {
            let sx = Shape::new(&dims.iter().map(|&d| d as usize).collect::<Vec<_>>()).unwrap();
            let n = sx.elements() as u64;
            let axes = Axes(mask & ((1 << dims.len()) - 1));
            let (start, end) = (a % n, b % n);
            let (start, len) = (start.min(end), start.max(end) - start.min(end) + 1);
            let gs = groups_of(sx, axes, start, len);
            let (g0, g1) = group_hull(sx, axes, start, len);
            let (lo, hi) = (*gs.iter().min().unwrap(), *gs.iter().max().unwrap());
            prop_assert!(g0 <= lo && hi < g1, "hull {g0}..{g1}, groups {lo}..={hi}");
            let groups = tessera_core::ops::reduce::reduced(sx, axes, false).elements() as u64;
            prop_assert!((g0 == lo && g1 == hi + 1) || (g0 == 0 && g1 == groups));
        }

        /// A layout's kept hull list gives, tile by tile, the hulls of the tile's intervals
        /// sorted and merged where they touch, for a layout, shape and axes.
        #[test]
        fn kept_tile_hulls_are_each_tiles_merged_hulls(
            dims in proptest::collection::vec(1u32..6, 1..5),
            mask in 0u8..16,
            cuts in proptest::collection::vec((1u64..40, 0u32..6), 1..60),
        ) {
            use crate::program::{Interval, Mapping, TileId};
            let sx = Shape::new(&dims.iter().map(|&d| d as usize).collect::<Vec<_>>()).unwrap();
            let n = sx.elements() as u64;
            let axes = Axes(mask & ((1 << dims.len()) - 1));
            let (mut start, mut ivs) = (0u64, Vec::new());
            for &(len, tile) in cuts.iter().cycle() {
                if start >= n {
                    break;
                }
                let len = len.min(n - start);
                ivs.push(Interval { tile: TileId(tile), start, len });
                start += len;
            }
            let m = Mapping::from_intervals(ivs);
            let list = super::tile_hulls(&m, sx, axes);
            let by_tile = m.intervals_by_tile();
            let groups: Vec<&[Interval]> = by_tile.chunk_by(|a, b| a.tile == b.tile).collect();
            prop_assert_eq!(list.first.len(), groups.len() + 1);
            for (k, g) in groups.iter().enumerate() {
                let mut want: Vec<(u64, u64)> =
                    g.iter().map(|iv| group_hull(sx, axes, iv.start, iv.len)).collect();
                want.sort_unstable();
                let mut merged: Vec<(u64, u64)> = Vec::new();
                for (a, b) in want {
                    match merged.last_mut() {
                        Some(last) if a <= last.1 => last.1 = last.1.max(b),
                        _ => merged.push((a, b)),
                    }
                }
                let got = &list.hulls[list.first[k] as usize..list.first[k + 1] as usize];
                prop_assert_eq!(got, &merged[..]);
            }
            // Taken again (kept, or made again if other tests filled the store meanwhile).
            let again = super::tile_hulls(&m, sx, axes);
            prop_assert_eq!((&again.hulls, &again.first), (&list.hulls, &list.first));
        }
    }

    proptest! {
        /// Joining through the forms joined before gives what joining afresh gives, for
        /// regions of one tensor, the same regions moved along it, and regions of several.
        #[test]
        fn joining_a_known_form_equals_joining_afresh(
            spans in proptest::collection::vec((0u64..400, 1u64..9, 1u64..3, 0u64..40), 1..40),
            shift in 0u64..100_000,
            other in proptest::option::of(0usize..40),
        ) {
            let t = TensorId(3);
            let regions: Vec<Region> = spans
                .iter()
                .map(|&(start, len, rows, stride)| {
                    if rows > 1 {
                        Region::strided(t, start, len, rows, len + stride)
                    } else {
                        Region::span(t, start, len)
                    }
                })
                .collect();
            let moved: Vec<Region> = regions
                .iter()
                .map(|r| Region { start: r.start + shift, ..*r })
                .collect();
            let mut joined = Joined::default();
            prop_assert_eq!(joined.compress(regions.clone()), compress(regions.clone()));
            prop_assert_eq!(joined.compress(moved.clone()), compress(moved));
            prop_assert_eq!(joined.compress(regions.clone()), compress(regions.clone()));
            if let Some(k) = other {
                let mut mixed = regions;
                let k = k % mixed.len();
                mixed[k].tensor = TensorId(4);
                prop_assert_eq!(joined.compress(mixed.clone()), compress(mixed));
            }
        }
    }

    /// A batch norm's statistics over `N, H, W` of NCHW: a tile holding a few rows of a
    /// channel's plane (many runs of the last axis) touches that channel only.
    #[test]
    fn group_hull_sees_channels_through_the_spatial_block() {
        let sx = Shape::new(&[32, 64, 112, 112]).unwrap();
        let axes = Axes(0b1101);
        let plane = 112 * 112;
        // 17,400 elements from the middle of channel 5 of image 3: channel 5, maybe 6.
        let start = (3 * 64 + 5) * plane + 100;
        assert_eq!(group_hull(sx, axes, start, 12_000), (5, 6));
        assert_eq!(group_hull(sx, axes, start, 17_400), (5, 7));
        // Axes of size 1 do not break the order: [G, R, 1] over R.
        let sx = Shape::new(&[6, 50, 1]).unwrap();
        assert_eq!(group_hull(sx, Axes(0b010), 120, 40), (2, 4));
    }
}
