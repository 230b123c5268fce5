//! Updates of state on tiles: each runs where its variable lives (optimizer state and
//! accumulators are laid out like it), so the only exchange brings the gradient.

use tessera_core::ops::update::Update;
use tessera_core::{NodeId, Storage};

use super::compute::SameElements;
use super::{Lowering, Placement};
use crate::cost::{self, UnaryKind};
use crate::program::{
    Codelet, Interval, Mapping, Region, TensorClass, TensorId, TileId, Vertex, VertexType,
    REDUCE_OTHER,
};
use tessera_core::DType;

/// An update writes its variable in place: it has no tensor of its own to lay out.
pub(super) fn placement(_op: &Update) -> Placement {
    Placement::Nothing
}

/// An update on the tiles of its variable: an optimizer's ([`optimizer`]), an accumulation,
/// a moving average, a fill or a counter's increment.
pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Update) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let scaled_add = move |n: u64| cost::scaled_add_cycles(cfg, n, dt);
    match *op {
        Update::Sgd { .. }
        | Update::Momentum { .. }
        | Update::Adam { .. }
        | Update::Lamb { .. }
        | Update::Lars { .. } => optimizer(l, i, op),
        Update::Accumulate {
            acc, grad, counter, ..
        } => {
            let (acc, grad, ct) = (l.t(acc), l.t(grad), l.t(counter));
            l.per_tile_same(
                i,
                "accumulate",
                acc,
                Codelet::Update,
                scaled_add,
                SameElements {
                    reads: &[acc, grad],
                    writes: &[acc],
                    fixed: &[Region::span(ct, 0, 1)],
                },
            );
        }
        Update::MovingAverage { x, value, .. } => {
            let (x, value) = (l.t(x), l.t(value));
            per_variable(l, i, "update", x, &[value], scaled_add, &[]);
        }
        Update::Fill { x, .. } => {
            let x = l.t(x);
            let c = move |n| UnaryKind::Copy.cycles(cfg, n, dt);
            l.per_tile_same(
                i,
                "fill",
                x,
                Codelet::Copy,
                c,
                SameElements {
                    reads: &[],
                    writes: &[x],
                    fixed: &[],
                },
            );
        }
        Update::Increment { counter } => {
            let ct = l.t(counter);
            let r = Region::span(ct, 0, 1);
            let v = Vertex {
                tile: l.first_tile(ct),
                codelet: Codelet::Update,
                // Estimate: a load, an add and a store, with the vertex's setup.
                cycles: cost::compute_set_overhead_cycles(cfg) + 20,
                reads: vec![r],
                writes: vec![r],
            };
            l.compute(i, "increment", vec![v]);
        }
    }
}

/// An optimizer's update, each tile's cost over its share of the variable's shard (with
/// replicated tensor sharding an optimizer's update runs on each replica's shard of the
/// variable).
fn optimizer<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Update) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let scaled_add = move |n: u64| cost::scaled_add_cycles(cfg, n, dt);
    let shards = match *op {
        Update::Sgd { var, .. }
        | Update::Momentum { var, .. }
        | Update::Adam { var, .. }
        | Update::Lamb { var, .. }
        | Update::Lars { var, .. } => l.opts.shards_of(l.node(var).shape().elements() as u64),
        Update::Increment { .. }
        | Update::Accumulate { .. }
        | Update::Fill { .. }
        | Update::MovingAverage { .. } => return,
    };
    match *op {
        Update::Sgd { var, grad, .. } => {
            let (var, grad) = (l.t(var), l.t(grad));
            per_variable(
                l,
                i,
                "update",
                var,
                &[grad],
                on_shard(shards, scaled_add),
                &[],
            );
        }
        Update::Momentum {
            var,
            velocity,
            grad,
            ..
        } => {
            let (var, velocity, grad) = (l.t(var), l.t(velocity), l.t(grad));
            let c = on_shard(shards, move |n| 2 * scaled_add(n));
            per_variable(l, i, "update", var, &[velocity, grad], c, &[]);
        }
        Update::Adam {
            var,
            m,
            v,
            grad,
            step,
            ..
        } => adam(l, i, [var, m, v, grad, step], shards),
        Update::Lamb {
            var,
            m,
            v,
            grad,
            step,
            ..
        } => lamb(l, i, [var, m, v, grad, step], shards),
        Update::Lars {
            var,
            velocity,
            grad,
            ..
        } => {
            // The squared norms of the variable and of the gradient on each tile, the trust
            // ratio on one tile, then the velocity's update and the variable's (two scaled
            // adds) everywhere.
            let (var, velocity, grad) = (l.t(var), l.t(velocity), l.t(grad));
            let norms = on_shard(shards, move |n| {
                2 * cost::reduce_cycles(cfg, 1, n, DType::F32)
            });
            let apply = on_shard(shards, move |n| 2 * scaled_add(n));
            trust_ratio_update(l, i, var, &[grad], norms, apply, &[velocity, grad]);
        }
        Update::Increment { .. }
        | Update::Accumulate { .. }
        | Update::Fill { .. }
        | Update::MovingAverage { .. } => {}
    }
}

/// Adam's update of `var` (moments `m` and `v`, gradient `grad`, step counter `step`), each
/// tile's cost over its share of the variable's `shards`.
fn adam<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    [var, m, v, grad, step]: [NodeId; 5],
    shards: u64,
) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let scaled_add = move |n: u64| cost::scaled_add_cycles(cfg, n, dt);
    // Two moment updates, a square root, a divide and the scaled add.
    let c = on_shard(shards, move |n| {
        3 * scaled_add(n)
            + UnaryKind::Sqrt.cycles(cfg, n, dt)
            + UnaryKind::Reciprocal.cycles(cfg, n, dt)
    });
    let (var, m, v, grad, st) = (l.t(var), l.t(m), l.t(v), l.t(grad), l.t(step));
    l.per_tile_same(
        i,
        "update",
        var,
        Codelet::Update,
        c,
        SameElements {
            reads: &[var, m, v, grad],
            writes: &[var, m, v],
            fixed: &[Region::span(st, 0, 1)],
        },
    );
}

/// LAMB's update of `var` (moments `m` and `v`, gradient `grad`, step counter `step`), each
/// tile's cost over its share of the variable's `shards`.
fn lamb<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    [var, m, v, grad, step]: [NodeId; 5],
    shards: u64,
) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let scaled_add = move |n: u64| cost::scaled_add_cycles(cfg, n, dt);
    // The moments (two scaled adds), then the step `r` (a square root, a divide and a
    // multiply-add) and the squared norms of the variable and of `r` on each tile,
    // the trust ratio on one tile, and the scaled add of `r` by it everywhere.
    let moments = on_shard(shards, move |n| 2 * scaled_add(n));
    let (var, m, v, grad, st) = (l.t(var), l.t(m), l.t(v), l.t(grad), l.t(step));
    l.per_tile_same(
        i,
        "update",
        var,
        Codelet::Update,
        moments,
        SameElements {
            reads: &[m, v, grad],
            writes: &[m, v],
            fixed: &[Region::span(st, 0, 1)],
        },
    );
    let step_and_norms = on_shard(shards, move |n| {
        UnaryKind::Sqrt.cycles(cfg, n, dt)
            + UnaryKind::Reciprocal.cycles(cfg, n, dt)
            + scaled_add(n)
            + 2 * cost::reduce_cycles(cfg, 1, n, DType::F32)
    });
    let apply = on_shard(shards, scaled_add);
    trust_ratio_update(l, i, var, &[m, v], step_and_norms, apply, &[m, v]);
}

/// The per-tensor trust ratio of LAMB and LARS, as poplibs computes norms (a reduction to one
/// value per tensor) and broadcasts a scalar: on each tile of `var`, a vertex reading its
/// elements of `var` and `norm_reads` writes two fp32 partial sums of squares (`norms`, with
/// `norm_cycles` per tile's elements); one vertex on `var`'s first tile sums every tile's
/// partials into the ratio (`trust ratio`, a reduction of two values over the tiles); each
/// tile then reads the ratio (a broadcast) and applies the update (`apply_cycles`), reading
/// `var` and `apply_reads`, writing `var` and the state among them.
fn trust_ratio_update<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    var: TensorId,
    norm_reads: &[TensorId],
    norm_cycles: impl Fn(u64) -> u64,
    apply_cycles: impl Fn(u64) -> u64,
    apply_reads: &[TensorId],
) {
    let cfg = l.cfg;
    let tiles = l.tensors[var.index()].mapping.elements_per_tile();
    // The ratio lives where the variable starts (variables start on tiles their names pick,
    // so the ratios of many tensors spread as the linear mapper spreads scalars).
    let Some(first) = l.tensors[var.index()]
        .mapping
        .intervals()
        .iter()
        .min_by_key(|iv| iv.start)
        .map(|iv| iv.tile)
    else {
        return;
    };
    let k = tiles.len() as u64;
    let partials = l.temporary(
        i,
        "norms",
        DType::F32,
        2 * k,
        Mapping::from_intervals(
            tiles
                .iter()
                .enumerate()
                .map(|(j, &(tile, _))| Interval {
                    tile,
                    start: 2 * j as u64,
                    len: 2,
                })
                .collect(),
        ),
    );
    let ratio = l.temporary(
        i,
        "trust ratio",
        DType::F32,
        1,
        Mapping::from_intervals(vec![Interval {
            tile: first,
            start: 0,
            len: 1,
        }]),
    );
    // Each tile's squared norms: its intervals of `var` and of the tensors read alike.
    let intervals = l.tensors[var.index()].mapping.intervals().to_vec();
    let mut reads_on: std::collections::BTreeMap<u32, Vec<Region>> = Default::default();
    // Shards of state on the tiles (fewer elements than the variable): each tile reads its
    // own shard.
    let total = l.tensors[var.index()].elements;
    let (shards, same): (Vec<TensorId>, Vec<TensorId>) = norm_reads
        .iter()
        .copied()
        .partition(|t| l.tensors[t.index()].elements != total);
    for iv in &intervals {
        let r = reads_on.entry(iv.tile.0).or_default();
        for &t in std::iter::once(&var).chain(&same) {
            r.push(Region::span(t, iv.start, iv.len));
        }
    }
    for (&tile, r) in &mut reads_on {
        for &t in &shards {
            let own = l.tensors[t.index()].mapping.runs_on(TileId(tile));
            r.extend(own.iter().map(|x| Region { tensor: t, ..*x }));
        }
    }
    let vertices: Vec<Vertex> = tiles
        .iter()
        .enumerate()
        .map(|(j, &(tile, n))| Vertex {
            tile,
            codelet: Codelet::Reduce(VertexType::of(REDUCE_OTHER, DType::F32)),
            cycles: norm_cycles(n),
            reads: reads_on.remove(&tile.0).unwrap_or_default(),
            writes: vec![Region::span(partials, 2 * j as u64, 2)],
        })
        .collect();
    l.compute(i, "norms", vertices);
    let (sums, count) = sum_norms(l, i, partials, &tiles);
    let v = Vertex {
        tile: first,
        codelet: Codelet::Reduce(VertexType::of(REDUCE_OTHER, DType::F32)),
        cycles: cost::reduce_cycles(cfg, 2, count, DType::F32)
            + UnaryKind::Sqrt.cycles(cfg, 2, DType::F32)
            + UnaryKind::Reciprocal.cycles(cfg, 1, DType::F32),
        reads: vec![Region::span(sums, 0, 2 * count)],
        writes: vec![Region::span(ratio, 0, 1)],
    };
    l.compute(i, "trust ratio", vec![v]);
    let ratio = [Region::span(ratio, 0, 1)];
    per_variable(l, i, "apply", var, apply_reads, apply_cycles, &ratio);
}

/// The norms' partials (two per tile of `tiles`, in `partials`) summed in two stages when
/// there are many, as popops reduces to a scalar: groups of `INTERMEDIATE_FAN_IN` tiles on
/// each group's first tile (`norms summed`), whose sums the ratio's tile then reads (one
/// stage of thousands of messages onto one tile would cost it kilobytes of exchange code per
/// tensor). The tensor to sum last and its pairs.
fn sum_norms<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    partials: TensorId,
    tiles: &[(TileId, u64)],
) -> (TensorId, u64) {
    let cfg = l.cfg;
    let k = tiles.len() as u64;
    let fan_in = super::reduce::INTERMEDIATE_FAN_IN;
    if k <= fan_in {
        return (partials, k);
    }
    let groups = k.div_ceil(fan_in);
    let sums = l.temporary(
        i,
        "norms summed",
        DType::F32,
        2 * groups,
        Mapping::from_intervals(
            (0..groups)
                .map(|g| Interval {
                    tile: tiles[(g * fan_in) as usize].0,
                    start: 2 * g,
                    len: 2,
                })
                .collect(),
        ),
    );
    let vertices = (0..groups)
        .map(|g| {
            let (a, b) = (g * fan_in, ((g + 1) * fan_in).min(k));
            Vertex {
                tile: tiles[a as usize].0,
                codelet: Codelet::Reduce(VertexType::of(REDUCE_OTHER, DType::F32)),
                cycles: cost::reduce_cycles(cfg, 2, b - a, DType::F32),
                reads: vec![
                    Region::strided(partials, 2 * a, 1, b - a, 2),
                    Region::strided(partials, 2 * a + 1, 1, b - a, 2),
                ],
                writes: vec![Region::span(sums, 2 * g, 2)],
            }
        })
        .collect();
    l.compute(i, "norms summed", vertices);
    (sums, groups)
}

/// `cost` over each tile's share of a shard: with replicated tensor sharding an optimizer's
/// update runs on `1 / shards` of the variable's elements.
fn on_shard(shards: u64, cost: impl Fn(u64) -> u64) -> impl Fn(u64) -> u64 {
    move |n| cost(n.div_ceil(shards))
}

/// A compute set `phase` of a vertex per tile of `var` updating it from `others` (state among
/// them is written too), each vertex also reading `fixed`.
fn per_variable<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    phase: &str,
    var: TensorId,
    others: &[TensorId],
    cycles: impl Fn(u64) -> u64,
    fixed: &[Region],
) {
    let writes_state: Vec<TensorId> = others
        .iter()
        .copied()
        .filter(|&x| l.tensors[x.index()].class == TensorClass::AlwaysLive)
        .collect();
    let mut reads = vec![var];
    reads.extend_from_slice(others);
    let mut writes = vec![var];
    writes.extend(writes_state);
    l.per_tile_same(
        i,
        phase,
        var,
        Codelet::Update,
        cycles,
        SameElements {
            reads: &reads,
            writes: &writes,
            fixed,
        },
    );
}
