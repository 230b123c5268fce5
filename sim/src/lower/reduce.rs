//! Reductions on tiles. A reduction to few values runs in stages: a partial per tile where
//! the data is, intermediate stages while the partials are many (each reducing groups of
//! [`INTERMEDIATE_FAN_IN`] partials spread over the tiles), then one vertex per tile of the
//! output over what is left; a reduction that keeps some axes runs one
//! vertex per tile of the output, which receives the elements it reduces. Broadcasts copy the
//! operand's elements each output interval needs.

use tessera_core::ops::reduce::Reduce;
use tessera_core::{DType, NodeId, Shape, Storage};

use super::{broadcast_reads, Lowering};
use crate::cost::{self, UnaryKind};
use crate::program::{compress, Codelet, Interval, Mapping, Region, TensorId, TileId, Vertex};

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
/// elements, run in two stages, as poplibs' multi-stage reductions do: every tile holding the
/// input reduces its own elements into partials, then the tiles of the output reduce the
/// partials. A one-stage reduction would gather a small output's whole input onto its few
/// tiles. (Estimates of where poplibs' reduction planner switches.)
pub(super) const TWO_STAGE_MAX_OUTPUTS: u64 = 4096;

/// See [`TWO_STAGE_MAX_OUTPUTS`].
pub(super) const TWO_STAGE_MIN_LENGTH: u64 = 64;

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

/// Whether a reduction to `outputs` values of `length` elements each runs in two stages.
pub(super) fn two_stage_pays(outputs: u64, length: u64) -> bool {
    outputs <= TWO_STAGE_MAX_OUTPUTS && length >= TWO_STAGE_MIN_LENGTH
}

/// A two-stage reduction of the tensors `xs` (all of shape `sx`, reduced over `axes`) into
/// `out`, which holds `values` values per group; `passes` reductions per element.
#[allow(clippy::too_many_arguments)]
pub(super) fn two_stage<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    xs: &[TensorId],
    sx: Shape,
    axes: tessera_core::ops::Axes,
    out: TensorId,
    values: u64,
    passes: u64,
) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let groups = tessera_core::ops::reduce::reduced(sx, axes, true).elements() as u64;
    let block = groups * values;
    // Stage 1: per tile holding the input, a partial block of every group's values.
    let mut ivs: Vec<Interval> = l.tensors[xs[0].index()].mapping.intervals().to_vec();
    ivs.sort_by_key(|iv| (iv.tile, iv.start));
    let tiles: Vec<Vec<Interval>> = ivs
        .chunk_by(|a, b| a.tile == b.tile)
        .map(<[Interval]>::to_vec)
        .collect();
    let mapping = Mapping::from_intervals(
        tiles
            .iter()
            .enumerate()
            .map(|(t, g)| Interval {
                tile: g[0].tile,
                start: t as u64 * block,
                len: block,
            })
            .collect(),
    );
    let count = tiles.len() as u64;
    let partials = l.temporary(i, "partials", DType::F32, count * block, mapping);
    let stage1 = tiles
        .iter()
        .enumerate()
        .map(|(t, g)| {
            let n: u64 = g.iter().map(|iv| iv.len).sum();
            let touched = groups.min(n).max(1);
            Vertex {
                tile: g[0].tile,
                codelet: Codelet::Reduce,
                cycles: passes * cost::reduce_cycles(cfg, touched, n.div_ceil(touched), dt),
                reads: xs
                    .iter()
                    .flat_map(|&x| g.iter().map(move |iv| Region::span(x, iv.start, iv.len)))
                    .collect(),
                writes: vec![Region::span(partials, t as u64 * block, block)],
            }
        })
        .collect();
    l.compute(i, "partials", stage1);
    // Intermediate stages while the partials are many (more than INTERMEDIATE_FAN_IN per
    // output): each reduces groups of up to that many partial blocks, its columns spread over
    // the tiles, into one block per group.
    let (mut partials, mut count) = (partials, count);
    let mut stage = 0;
    while count > INTERMEDIATE_FAN_IN {
        stage += 1;
        let next = count.div_ceil(INTERMEDIATE_FAN_IN);
        // Column chunks per group: enough pieces to use the tiles, each at least a grain.
        let grain = INTERMEDIATE_GRAIN.min(block);
        let chunks = (u64::from(l.tile_count()) / next).clamp(1, block.div_ceil(grain));
        let width = block.div_ceil(chunks).div_ceil(grain) * grain;
        let mut pieces = Vec::new();
        for g in 0..next {
            let rows = INTERMEDIATE_FAN_IN.min(count - g * INTERMEDIATE_FAN_IN);
            let mut c0 = 0;
            while c0 < block {
                let c1 = (c0 + width).min(block);
                let tile = TileId::wrapping(pieces.len() as u64, l.tile_count());
                pieces.push((tile, g, rows, c0, c1));
                c0 = c1;
            }
        }
        let mapping = Mapping::from_intervals(
            pieces
                .iter()
                .map(|&(tile, g, _, c0, c1)| Interval {
                    tile,
                    start: g * block + c0,
                    len: c1 - c0,
                })
                .collect(),
        );
        let reduced = l.temporary(
            i,
            &format!("intermediate{stage}"),
            DType::F32,
            next * block,
            mapping,
        );
        let vertices = pieces
            .iter()
            .map(|&(tile, g, rows, c0, c1)| Vertex {
                tile,
                codelet: Codelet::Reduce,
                cycles: cost::reduce_cycles(cfg, c1 - c0, rows, DType::F32),
                reads: vec![Region::strided(
                    partials,
                    g * INTERMEDIATE_FAN_IN * block + c0,
                    c1 - c0,
                    rows,
                    block,
                )],
                writes: vec![Region::span(reduced, g * block + c0, c1 - c0)],
            })
            .collect();
        l.compute(i, &format!("intermediate{stage}"), vertices);
        (partials, count) = (reduced, next);
    }
    // Last stage: each tile of the output reduces its values over the partial blocks.
    let outs: Vec<Interval> = l.tensors[out.index()].mapping.intervals().to_vec();
    let stage2 = outs
        .iter()
        .map(|iv| Vertex {
            tile: iv.tile,
            codelet: Codelet::Reduce,
            cycles: cost::reduce_cycles(cfg, iv.len, count, DType::F32),
            reads: vec![Region::strided(partials, iv.start, iv.len, count, block)],
            writes: vec![Region::span(out, iv.start, iv.len)],
        })
        .collect();
    l.compute(i, "reduce", stage2);
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
                |iv| {
                    (
                        broadcast_reads(xt, sx, so, iv.start, iv.len),
                        vec![Region::span(out, iv.start, iv.len)],
                    )
                },
            );
        }
        Reduce::Reduce { x, axes, .. } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let per_output = (sx.elements() / so.elements().max(1)) as u64;
            if two_stage_pays(so.elements() as u64, per_output) {
                two_stage(l, i, &[xt], sx, axes, out, 1, 1);
                return;
            }
            let ivs: Vec<Interval> = l.tensors[out.index()].mapping.intervals().to_vec();
            let vertices = ivs
                .iter()
                .map(|iv| Vertex {
                    tile: iv.tile,
                    codelet: Codelet::Reduce,
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

    use super::INTERMEDIATE_FAN_IN;
    use crate::heap::Heap;
    use crate::lower::{lower, LowerOptions};
    use crate::machine::{IpuConfig, Preset};
    use crate::program::Step;

    /// A reduction whose input is spread over every tile reduces its per-tile partials in
    /// intermediate stages, so no vertex of a stage reduces more than the fan-in of partial
    /// blocks, and the program still checks.
    #[test]
    fn many_partials_reduce_in_intermediate_stages() {
        let cfg = IpuConfig::preset(Preset::Mk2);
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[64, 8192], DType::F32).unwrap();
        g.reduce("mean", x, &[1], false, ReduceKind::Mean).unwrap();
        let plan = Plan::new(&g).unwrap();
        let p = lower(&plan, &cfg, LowerOptions::default());
        crate::check::check(&p).unwrap();
        let names: Vec<&str> = p
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Compute(cs) => Some(cs.name.as_str()),
                _ => None,
            })
            .collect();
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
        for s in &p.steps {
            if let Step::Compute(cs) = s {
                if cs.name != "mean/partials" {
                    for v in &cs.vertices {
                        assert!(v.reads.iter().all(|r| r.rows <= INTERMEDIATE_FAN_IN));
                    }
                }
            }
        }
    }
}
