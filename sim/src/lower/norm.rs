//! Normalisation on tiles, as poplibs' norms decompose it: a statistics compute set (a
//! reduction per group: mean and variance, and for the gradient the means of `dy` and
//! `dy * xhat`), then an element-wise compute set laid out like `x` that reads its group's
//! statistics.

use tessera_core::ops::norm::Norm;
use tessera_core::{DType, NodeId, Storage};

use super::{broadcast_reads, reduce, Lowering};
use crate::cost;
use crate::program::{Codelet, Interval, Region, Vertex};

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Norm) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, shape) = (node.dtype(), node.shape());
    let (x, dy, axes, passes) = match *op {
        Norm::Normalize { x, axes, .. } => (x, None, axes, 2),
        Norm::NormalizeGrad { dy, x, axes, .. } => (x, Some(dy), axes, 4),
    };
    let xt = l.t(x);
    let dyt = dy.map(|d| l.t(d));
    let kept = tessera_core::ops::reduce::reduced(shape, axes, true);
    let groups = kept.elements() as u64;
    let per_group = (shape.elements() as u64 / groups.max(1)).max(1);
    // Statistics, two f32 values per group (mean and 1/sd), mapped by use (below); spread
    // over the tiles by the input each group reduces when nothing holds `x` here.
    let mapping = match by_use(l, xt, shape, axes, groups) {
        Some(m) => m,
        None => {
            let per_value = (per_group * dt.size() as u64 / 2).max(4);
            l.linear(groups * 2, per_value, 2, 1)
        }
    };
    let stats = l.temporary(i, "statistics", DType::F32, groups * 2, mapping);
    let mut xs = vec![xt];
    xs.extend(dyt);
    if reduce::two_stage_pays(groups, per_group)
        && reduce::two_stage(l, i, &xs, shape, axes, stats, 2, passes)
    {
        normalize(l, i, &xs, stats, kept, passes);
        return;
    }
    let ivs: Vec<Interval> = l.tensors[stats.index()].mapping.intervals().to_vec();
    let vertices = ivs
        .iter()
        .map(|iv| {
            // Interval covers groups start/2 .. end/2 (two values each).
            let (g0, g1) = (iv.start / 2, iv.end().div_ceil(2));
            let mut reads = reduce::reads(xt, shape, axes, g0, g1 - g0);
            if let Some(d) = dyt {
                reads.extend(reduce::reads(d, shape, axes, g0, g1 - g0));
            }
            Vertex {
                tile: iv.tile,
                codelet: Codelet::Reduce,
                cycles: passes * cost::reduce_cycles(cfg, g1 - g0, per_group, dt),
                reads,
                writes: vec![Region::span(stats, iv.start, iv.len)],
            }
        })
        .collect();
    l.compute(i, "statistics", vertices);
    normalize(l, i, &xs, stats, kept, passes);
}

/// Groups of statistics mapped together (poplibs' grain for a broadcast operand: one 64-bit
/// data path of f32 values, `target.getDataPathWidth() / (8 x 4)` on Mk2).
const STATS_GRAIN: u64 = 2;

/// Most runs of an interval whose groups are found one by one (past it, their hull).
const STATS_RUNS: u64 = 4096;

/// The statistics of `groups` groups of `x` (two values each) mapped by use, as poplin's
/// `normStatistics` creates them (`createBroadcastOperand`, lib/poplin/Norms.cpp and
/// lib/poputil/TileMapping.cpp): each grain of [`STATS_GRAIN`] groups on one of the tiles
/// holding elements of those groups (the least loaded so far, as `mapTensorsByUse` with
/// `ConstrainMappingToUsedTiles` balances them), so the element-wise pass finds most of its
/// statistics on its own tile. `None` when no tile holds `x`.
fn by_use<S: Storage>(
    l: &Lowering<'_, S>,
    xt: crate::program::TensorId,
    shape: tessera_core::Shape,
    axes: tessera_core::ops::Axes,
    groups: u64,
) -> Option<crate::program::Mapping> {
    // The innermost block of axes all kept or all reduced: a run of it is in one group, or
    // in consecutive ones.
    let mut inner = 1u64;
    let mut kept = None;
    for a in (0..shape.rank()).rev() {
        let d = shape.dim(a) as u64;
        if d == 1 {
            continue;
        }
        let k = !axes.contains(a);
        if kept.is_some_and(|kk| kk != k) {
            break;
        }
        kept = Some(k);
        inner *= d;
    }
    let mut users: Vec<(u64, u32)> = Vec::new();
    for iv in l.tensors[xt.index()].mapping.intervals() {
        // The groups of each run (their hull when there are too many runs to walk).
        let runs = iv.len / inner.max(1) + 2;
        let mut hulls = Vec::new();
        if runs > STATS_RUNS {
            hulls.push(reduce::group_hull(shape, axes, iv.start, iv.len));
        } else {
            let mut e = iv.start;
            while e < iv.end() {
                let run = (inner - e % inner).min(iv.end() - e);
                hulls.push(reduce::group_hull(shape, axes, e, run));
                e += run;
            }
        }
        for (g0, g1) in hulls {
            users.extend((g0 / STATS_GRAIN..g1.div_ceil(STATS_GRAIN)).map(|q| (q, iv.tile.0)));
        }
    }
    if users.is_empty() {
        return None;
    }
    users.sort_unstable();
    users.dedup();
    let mut load = vec![0u64; l.tile_count() as usize];
    let mut out: Vec<Interval> = Vec::new();
    let values = groups * 2;
    let mut next = 0u64;
    for same in users.chunk_by(|a, b| a.0 == b.0) {
        let q = same[0].0;
        let tile = same
            .iter()
            .map(|u| u.1)
            .min_by_key(|&t| (load[t as usize], t))
            .expect("a chunk is never empty");
        load[tile as usize] += 1;
        let (start, end) = (q * STATS_GRAIN * 2, ((q + 1) * STATS_GRAIN * 2).min(values));
        // Grains no tile uses (none, when `x` covers every group) go with the next one.
        let start = start.min(next);
        match out.last_mut() {
            Some(last) if last.tile.0 == tile && last.end() == start => last.len += end - start,
            _ => out.push(Interval {
                tile: crate::program::TileId(tile),
                start,
                len: end - start,
            }),
        }
        next = end;
    }
    if next < values {
        let last = out.last_mut().expect("users is not empty");
        last.len += values - next;
    }
    Some(crate::program::Mapping::from_disjoint_intervals(out))
}

/// The element-wise pass: each element with its group's statistics.
fn normalize<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    same: &[crate::program::TensorId],
    stats: crate::program::TensorId,
    kept: tessera_core::Shape,
    passes: u64,
) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, shape) = (node.dtype(), node.shape());
    let out = l.t(i);
    l.elementwise(
        i,
        out,
        same,
        Codelet::Binary,
        move |n| passes * cost::elementwise_binary_cycles(cfg, n, dt),
        move |s, len| {
            // The statistics of the groups these elements belong to (two values per group).
            broadcast_reads(stats, kept, shape, s, len)
                .into_iter()
                .map(|r| Region::span(r.tensor, r.start * 2, r.len * 2))
                .collect()
        },
    );
}
