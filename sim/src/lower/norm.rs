//! Normalisation on tiles, as poplibs' norms decompose it: a statistics compute set (a
//! reduction per group: mean and variance, and for the gradient the means of `dy` and
//! `dy * xhat`), then an element-wise compute set laid out like `x` that reads its group's
//! statistics.

use tessera_core::ops::norm::{Moment, Norm};
use tessera_core::{DType, Node, NodeId, Storage};

use super::broadcast::Broadcast;
use super::elementwise::{binary_type, BinaryForm};
use super::{reduce, Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::program::{Codelet, Interval, Region, Vertex, VertexType, REDUCE_SQUARE_ADD};
use tessera_core::ops::elementwise::BinaryFn;

/// Where a normalisation's output goes: like its operand; a moment like a reduction's output
/// (spread by the input each group reduces).
pub(super) fn placement<S: Storage>(l: &Lowering<'_, S>, node: &Node, op: &Norm) -> Placement {
    match *op {
        Norm::Moment { x, .. } => reduce::by_input(l, node, x),
        Norm::Normalize { x, .. } | Norm::NormalizeGrad { x, .. } => Placement::Like(x),
    }
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Norm) {
    match *op {
        Norm::Normalize { x, axes, .. } => {
            let xs = [l.t(x)];
            let (stats, kept) = statistics(l, i, &xs, x, axes, 2);
            // The gradient's whitening again (a backward node) is popnn's `batchNormWhiten`
            // with the forward's statistics, summed over the group already.
            if !l.node(i).roles().contains(tessera_core::Roles::BACKWARD) {
                distribute(l, stats, axes);
            }
            normalize(l, i, &xs, stats, kept, 2);
        }
        Norm::NormalizeGrad { dy, x, axes, .. } => {
            let xs = [l.t(x), l.t(dy)];
            let (stats, kept) = statistics(l, i, &xs, x, axes, 4);
            distribute(l, stats, axes);
            normalize(l, i, &xs, stats, kept, 4);
        }
        Norm::Moment { x, axes, moment } => {
            // Poplar's running averages read the norm's own statistics (summed over the
            // group once, by the norm): reduced again here, they are not all-reduced again.
            let stats = match statistics_of(l, x, axes) {
                Some(t) => t,
                None => statistics(l, i, &[l.t(x)], x, axes, 2).0,
            };
            moment_of(l, i, stats, moment);
        }
    }
}

/// Distributed batch norm ([`crate::techniques::distributed_norm`]): statistics over the batch
/// axis are summed over each group of replicas, an all-reduce of their two f32 values a group
/// (popnn's `distributedBatchNormStatistics` and `distributedBatchNormGradients` reduce two
/// per channel) after the reduction that makes them.
fn distribute<S: Storage>(
    l: &mut Lowering<'_, S>,
    stats: crate::program::TensorId,
    axes: tessera_core::ops::Axes,
) {
    let group = l.opts.distributed_batch_norm;
    if group <= 1 || !axes.contains(0) {
        return;
    }
    let t = &l.tensors[stats.index()];
    let bytes = t.elements * t.elem_bytes();
    l.steps.push(crate::program::Step::Collective {
        tensor: stats,
        bytes,
        group,
        partition_ipus: l.opts.partition_ipus,
    });
}

/// The statistics the latest normalisation of `x` over `axes` lowered here computed, if one
/// did (a moment reads them, so its lowering is never reused: it depends on another node's
/// temporary).
fn statistics_of<S: Storage>(
    l: &Lowering<'_, S>,
    x: NodeId,
    axes: tessera_core::ops::Axes,
) -> Option<crate::program::TensorId> {
    l.tensors.iter().enumerate().rev().find_map(|(k, t)| {
        let same = t.class == crate::program::TensorClass::Temporary
            && t.name.ends_with("/statistics")
            && matches!(*l.node(t.node).op(),
                tessera_core::Op::Norm(Norm::Normalize { x: nx, axes: na, .. })
                    if nx == x && na == axes);
        same.then_some(crate::program::TensorId(k as u32))
    })
}

/// The statistics of the groups of `x` (whose tensor is `xs[0]`) over `axes` (and, for a
/// gradient, of the rest of `xs` with it), `passes` reductions of each group: a temporary of
/// two f32 values per group (mean and 1/sd), and the shape of the groups. `x` gives the shape
/// (its tensor may be the storage of a view of another shape).
pub(super) fn statistics<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    xs: &[crate::program::TensorId],
    x: NodeId,
    axes: tessera_core::ops::Axes,
    passes: u64,
) -> (crate::program::TensorId, tessera_core::Shape) {
    let cfg = l.cfg;
    let xt = xs[0];
    let xn = l.node(x);
    let (dt, shape) = (xn.dtype(), xn.shape());
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
    if reduce::two_stage_pays(groups, per_group)
        && reduce::two_stage(
            l,
            i,
            reduce::Reduced {
                tensors: xs,
                shape,
                axes,
            },
            stats,
            2,
            passes,
        )
    {
        return (stats, kept);
    }
    let ivs: Vec<Interval> = l.tensors[stats.index()].mapping.intervals().to_vec();
    let vertices = ivs
        .iter()
        .map(|iv| {
            // Interval covers groups start/2 .. end/2 (two values each).
            let (g0, g1) = (iv.start / 2, iv.end().div_ceil(2));
            let reads = xs
                .iter()
                .flat_map(|&x| reduce::reads(x, shape, axes, g0, g1 - g0))
                .collect();
            Vertex {
                tile: iv.tile,
                codelet: Codelet::Reduce(VertexType {
                    function: REDUCE_SQUARE_ADD,
                    ..VertexType::cast(dt, DType::F32)
                }),
                cycles: passes * cost::reduce_cycles(cfg, g1 - g0, per_group, dt),
                reads,
                writes: vec![Region::span(stats, iv.start, iv.len)],
            }
        })
        .collect();
    l.compute(i, "statistics", vertices);
    (stats, kept)
}

/// A moment from the statistics (two values a group): the mean as it is; the variance from
/// 1/sd (`1 / isd^2 - eps`), a few flops a group. Each of the output's tiles reads its
/// groups' statistics.
fn moment_of<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    stats: crate::program::TensorId,
    moment: Moment,
) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let out = l.t(i);
    let ivs: Vec<Interval> = l.tensors[out.index()].mapping.intervals().to_vec();
    let vertices = ivs
        .iter()
        .map(|iv| {
            let cycles = match moment {
                Moment::Mean => UnaryKind::Copy.cycles(cfg, iv.len, dt),
                // A multiply, a reciprocal and a subtraction.
                Moment::Variance => 3 * cost::elementwise_binary_cycles(cfg, iv.len, dt),
            };
            Vertex {
                tile: iv.tile,
                // The moment's own expression of the statistics.
                codelet: Codelet::Binary(VertexType::of(48, dt)),
                cycles,
                reads: vec![Region::span(stats, iv.start * 2, iv.len * 2)],
                writes: vec![Region::span(out, iv.start, iv.len)],
            }
        })
        .collect();
    l.compute(i, "moment", vertices);
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
    // A batch norm's input is normalised again in the backward pass and read by its
    // gradient: the same layout, made once.
    let mapping = &l.tensors[xt.index()].mapping;
    let key = StatsKey {
        mapping: mapping.digest(),
        dims: shape.dims().iter().map(|&d| u64::from(d)).collect(),
        axes: u64::from(axes.0),
        groups,
        tiles: l.tile_count(),
    };
    STATS_LAYOUTS.get_or_make(key, || {
        make_by_use(mapping, l.tile_count(), shape, axes, groups)
    })
}

/// What a layout of statistics by use depends on: the input's layout, shape and reduced
/// axes, the number of groups and of tiles.
#[derive(Clone, PartialEq, Eq, Hash)]
struct StatsKey {
    mapping: u128,
    dims: Vec<u64>,
    axes: u64,
    groups: u64,
    tiles: u32,
}

/// Statistics layouts made so far in this process ([`by_use`]), by what they are made of. At
/// most 1024 are kept (an estimate: a few models' worth of normalised tensors).
static STATS_LAYOUTS: super::kept::Kept<StatsKey, Option<crate::program::Mapping>> =
    super::kept::Kept::new(1024);

/// Drops the statistics layouts this process keeps ([`STATS_LAYOUTS`]).
pub(super) fn clear_stats_layouts() {
    STATS_LAYOUTS.clear();
}

/// [`by_use`], made.
fn make_by_use(
    mapping: &crate::program::Mapping,
    tiles: u32,
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
    let hull = reduce::Hull::new(shape, axes);
    let mut users: Vec<(u32, crate::program::TileId)> = Vec::new();
    let mut hulls = Vec::new();
    for iv in mapping.intervals() {
        // The groups of each run (their hull when there are too many runs to walk).
        let runs = iv.len / inner.max(1) + 2;
        hulls.clear();
        if runs > STATS_RUNS {
            hulls.push(hull.of(iv.start, iv.len));
        } else {
            let mut e = iv.start;
            while e < iv.end() {
                let run = (inner - e % inner).min(iv.end() - e);
                hulls.push(hull.of(e, run));
                e += run;
            }
        }
        for &(g0, g1) in &hulls {
            // (Grains are numbered in 32 bits: past that, the statistics are spread linearly.)
            let (q0, q1) = (g0 / STATS_GRAIN, g1.div_ceil(STATS_GRAIN));
            let q1 = u32::try_from(q1).ok()?;
            users.extend((q0 as u32..q1).map(|q| (q, iv.tile)));
        }
    }
    if users.is_empty() {
        return None;
    }
    // The tiles using each grain, without repeats.
    let grains = users.iter().map(|u| u.0 as usize + 1).max().unwrap_or(0);
    let users = crate::exchange::group_readers(users, grains);
    let mut load = vec![0u64; tiles as usize];
    let mut out: Vec<Interval> = Vec::new();
    let values = groups * 2;
    let mut next = 0u64;
    for same in users.chunk_by(|a, b| a.0 == b.0) {
        let q = u64::from(same[0].0);
        let tile = same
            .iter()
            .map(|u| u.1 .0)
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
    let (cfg, dt, shape) = (l.cfg, l.node(i).dtype(), l.node(i).shape());
    // Each pass is an add, sub or mul with the statistics, which popops runs with its
    // broadcast codelets when they are constant along the trailing axes (popnn's whitening:
    // `sub` and `mulInPlace` of the broadcast mean and 1/sd, `lib/poplin/Norms.cpp`).
    let run = super::elementwise::broadcast_run(kept, shape);
    with_statistics(
        l,
        i,
        same,
        (stats, kept),
        // popnn's whitening: a broadcast sub and an in-place broadcast mul (and, for a
        // gradient, their like), vertex types of their own.
        Codelet::Binary(binary_type(BinaryFn::Sub, dt, BinaryForm::of_run(run))),
        move |n| passes * cost::binary_pass_cycles(cfg, n, run, dt),
    );
}

/// The element-wise pass of node `i` over `same` (laid out like its output), each element
/// reading its group's two statistics from `stats` (groups of shape `kept`): `codelet`'s
/// vertices, `price` cycles for a tile's elements.
pub(super) fn with_statistics<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    same: &[crate::program::TensorId],
    (stats, kept): (crate::program::TensorId, tessera_core::Shape),
    codelet: Codelet,
    price: impl Fn(u64) -> u64 + Sync,
) {
    let shape = l.node(i).shape();
    let out = l.t(i);
    // The statistics of the groups the elements belong to (two values per group).
    let stats = [Broadcast::with_values(stats, kept, shape, 2)];
    l.elementwise_broadcast(i, out, same, codelet, price, &stats);
}

#[cfg(test)]
mod tests {
    use tessera_core::ops::norm::{BatchNorm, Norm};
    use tessera_core::{DType, Graph, Op, Plan};

    use super::super::{lower_with, LowerOptions};
    use crate::heap::Heap;
    use crate::machine::{IpuConfig, Preset};
    use crate::program::{Program, Step};

    /// `plan` lowered onto one IPU of `cfg` with transfers and with summaries.
    fn both_ways(plan: &Plan<Heap>, cfg: &IpuConfig) -> [Program; 2] {
        [false, true].map(|summarize| {
            let opts = LowerOptions::default();
            lower_with(plan, cfg, opts, &|_| true, summarize, None).0
        })
    }

    /// A normalisation of a view (a reshape, whose tensor is its operand's storage) takes
    /// its groups from the view's shape.
    #[test]
    fn a_view_is_normalised_in_its_own_shape() {
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[4, 6], DType::F32).unwrap();
        let v = g.reshape("v", x, &[4, 2, 3]).unwrap();
        let y = g.normalize("y", v, &[2], 1e-3).unwrap();
        g.reduce_mean("loss", y, None).unwrap();
        let plan = Plan::new(&g).unwrap();
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(4);
        for p in both_ways(&plan, &cfg) {
            let stats = p.tensors.iter().find(|t| t.name == "y/statistics").unwrap();
            // Eight groups of three, two values each.
            assert_eq!(stats.elements, 16);
        }
    }

    /// A training batch normalisation's running averages read the statistics its
    /// normalisation computed: one statistics pass over `x`, whichever way it is lowered.
    #[test]
    fn moments_read_the_normalisations_statistics() {
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[8, 16, 6, 6], DType::F32).unwrap();
        let bn = BatchNorm {
            axis: 1,
            epsilon: 1e-3,
            momentum: 0.9,
            training: true,
        };
        let y = g.batch_norm("bn", x, bn).unwrap();
        let loss = g.reduce_mean("loss", y, None).unwrap();
        g.differentiate(loss, tessera_core::Optimizer::sgd(0.1))
            .unwrap();
        let plan = Plan::new(&g).unwrap();
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(16);
        let moments: Vec<usize> = g
            .nodes()
            .iter()
            .enumerate()
            .filter(|(_, n)| matches!(n.op(), Op::Norm(Norm::Moment { .. })))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(moments.len(), 2);
        for p in both_ways(&plan, &cfg) {
            let names = |i: usize| -> Vec<String> {
                let (a, b) = p.node_steps[i];
                p.steps[a..b]
                    .iter()
                    .filter_map(|s| match s {
                        Step::Compute(cs) => Some(cs.name.clone()),
                        _ => None,
                    })
                    .collect()
            };
            for &m in &moments {
                assert_eq!(names(m), vec![format!("{}/moment", g.nodes()[m].name())]);
            }
            // The statistics are computed once forward (the normalisation's) and once
            // backward (its gradient's).
            let passes = p
                .steps
                .iter()
                .filter(|s| matches!(s, Step::Compute(cs) if cs.name.contains("statistics") || cs.name.contains("intermediate")))
                .count();
            assert!(passes <= 4, "{passes} statistics passes");
        }
    }
}
