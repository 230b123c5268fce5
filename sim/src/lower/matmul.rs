//! Products on tiles, as poplibs plans them: each product `[m, k] x [k, n]` is split into a
//! grid of `pm x pk x pn` blocks, each block's partial product runs on one tile's AMP, and
//! when `k` is split the fp32 partial sums are exchanged and reduced.
//!
//! A [`Product`] is any op that is such a product per group: matmuls (a batched product is a
//! set of independent groups, as poplibs treats grouped matmuls, each planned on its share of
//! the tiles; when only the left operand has batch axes the batch folds into `m`) and
//! convolutions (`lower/conv.rs`: positions x patch elements x output channels, per channel
//! group). A product says which elements each block reads and where its outputs live; the
//! planning, the grid, the partial sums and their reduction are shared.
//!
//! The blocks' vertices and partial sums are in `blocks`, the partial sums' reduction in
//! `reduction`.

use std::collections::HashMap;

use tessera_core::ops::matmul::MatMul;
use tessera_core::ops::update::Update;
use tessera_core::{DType, Graph, NodeId, Op, Roles, Shape, Storage};

use super::elementwise::{binary_type, BinaryForm};
use super::product::{BlockSpans, Product, Range};
use super::{rect, Lowering, Placement};
use crate::cost;
use crate::planner::{
    casts_partials, plan_fc_cached, plan_matmul_cached, FcPlans, LaidOut, MatMulPlan, Operand,
    ProductKey,
};
use crate::program::{Codelet, Interval, Mapping, Region, TensorId, TileId, Vertex, VertexType};
use tessera_core::ops::elementwise::BinaryFn;

mod blocks;
mod reduction;

use blocks::{spans, Blocks};
use reduction::{reduce_blocks, Reduction};

/// Plans made so far, by node.
pub(crate) type Plans = HashMap<NodeId, MatMulPlan>;

/// Plans made so far, by what the planner reads.
pub(crate) type PlansByShape = HashMap<ProductKey, MatMulPlan>;

/// What the planner reads of product `p` of node `i`.
fn shape_key<S: Storage>(l: &Lowering<'_, S>, i: NodeId, p: &Product) -> ProductKey {
    (
        p.m,
        p.k,
        p.n,
        l.node(i).dtype(),
        p.laid_out,
        p.tiles_per_group,
        p.field,
    )
}

/// Joint plans of fully-connected layers, by batch, input, output, element type and tiles.
pub(crate) type FcPlansByShape = HashMap<(u64, u64, u64, DType, u64), FcPlans>;

/// A fully-connected layer trained on this IPU, as `(batch, input, output, element type)`:
/// its forward product `[batch, input] x [input, output]`.
pub(crate) type FcLayer = (u64, u64, u64, DType);

/// The pass of a trained fully-connected layer a matmul is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FcPass {
    Forward,
    Backward,
    WeightUpdate,
}

/// `m` and `k` of a single-group matmul `op(a) . b` with `b` a matrix and `a` not transposed
/// (a batch folds into `m`), and `n`; `None` when it has several groups.
fn single_product(sa: Shape, sb: Shape, ta: bool, tb: bool) -> Option<[u64; 3]> {
    let (a_rows, a_cols) = (sa.dim(sa.rank() - 2) as u64, sa.last() as u64);
    let (b_rows, b_cols) = (sb.dim(sb.rank() - 2) as u64, sb.last() as u64);
    let n = if tb { b_rows } else { b_cols };
    let batch: u64 =
        batch_dims(sa).iter().product::<u64>() * batch_dims(sb).iter().product::<u64>();
    if sb.rank() == 2 && !ta {
        Some([a_rows * batch, a_cols, n])
    } else if batch == 1 {
        Some(if ta {
            [a_cols, a_rows, n]
        } else {
            [a_rows, a_cols, n]
        })
    } else {
        None
    }
}

/// The fully-connected layers trained by the included nodes: forward matmuls `X . W` of a
/// trainable weight that an included optimizer update (SGD, momentum, Adam) writes. poplibs
/// plans such a layer's three passes together (`fullyConnectedPass = TRAINING_FWD`, which
/// TensorFlow's IPU backend sets for a dense layer's forward matmul when it trains).
pub(crate) fn trained_fc_layers<S: Storage>(
    graph: &Graph<S>,
    include: &[bool],
) -> std::collections::HashSet<FcLayer> {
    let mut updated = vec![false; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        if let (
            true,
            Op::Update(
                Update::Sgd { var, .. }
                | Update::Momentum { var, .. }
                | Update::Adam { var, .. }
                | Update::Lamb { var, .. }
                | Update::Lars { var, .. },
            ),
        ) = (include[i], node.op())
        {
            updated[var.index()] = true;
        }
    }
    let mut out = std::collections::HashSet::new();
    for (i, node) in graph.nodes().iter().enumerate() {
        let Op::MatMul(op) = *node.op() else { continue };
        if !include[i] || op.transpose_a || op.transpose_b || !updated[op.b.index()] {
            continue;
        }
        let w = graph.node(op.b);
        if !w.op().is_state() || !w.roles().contains(Roles::TRAINABLE) {
            continue;
        }
        if let Some([m, k, n]) = single_product(graph.node(op.a).shape(), w.shape(), false, false) {
            out.insert((m, k, n, node.dtype()));
        }
    }
    out
}

/// Which pass of a trained fully-connected layer matmul `i` (as product `p`) is, and the
/// layer: the forward `X . W`, the input gradient `dY . W^T` (both reading the trainable
/// weight) or the weight gradient `X^T . dY`, matched to a trained layer by shape.
fn fc_pass<S: Storage>(l: &Lowering<'_, S>, i: NodeId, p: &Product) -> Option<(FcPass, FcLayer)> {
    let Op::MatMul(op) = *l.node(i).op() else {
        return None;
    };
    if p.groups != 1 || l.fc_layers.is_empty() {
        return None;
    }
    let dtype = l.node(i).dtype();
    let b = l.node(op.b);
    let weight = b.op().is_state() && b.roles().contains(Roles::TRAINABLE);
    let (pass, layer) = match (op.transpose_a, op.transpose_b) {
        (false, false) if weight => (FcPass::Forward, (p.m, p.k, p.n, dtype)),
        (false, true) if weight => (FcPass::Backward, (p.m, p.n, p.k, dtype)),
        (true, false) => (FcPass::WeightUpdate, (p.k, p.m, p.n, dtype)),
        _ => return None,
    };
    l.fc_layers.contains(&layer).then_some((pass, layer))
}

/// Whether matmul `i` is a pass of a fully-connected layer this IPU trains (its plan is then
/// made with the layer's other passes).
pub(crate) fn trains_fc_layer<S: Storage>(l: &Lowering<'_, S>, i: NodeId) -> bool {
    !l.fc_layers.is_empty() && product_of(l, i).is_some_and(|p| fc_pass(l, i, &p).is_some())
}

/// The batch axes of a rank >= 2 shape, as dims.
fn batch_dims(s: Shape) -> Vec<u64> {
    s.dims()[..s.rank() - 2]
        .iter()
        .map(|&d| u64::from(d))
        .collect()
}

/// Per group of a batched matmul of `a` by `b` (shapes `sa`, `sb`, their matrices
/// `a_rows x a_cols` and `b_rows x b_cols`) into the batch dims `out_batch`, `m x n` outputs
/// a group: the first element of its a matrix, of its b matrix and of its output. A batch axis
/// of size 1 an operand broadcasts reads the same matrix for every group along it.
fn batch_groups(
    [sa, sb]: [Shape; 2],
    out_batch: &[u64],
    [a_rows, a_cols]: [u64; 2],
    [b_rows, b_cols]: [u64; 2],
    [m, n]: [u64; 2],
) -> Vec<(u64, u64, u64)> {
    let groups_total: u64 = out_batch.iter().product();
    let (ab, bb) = (batch_dims(sa), batch_dims(sb));
    let r = out_batch.len();
    let strides = |dims: &[u64]| {
        let pad = r - dims.len();
        let mut st = vec![0u64; r];
        let mut s = 1;
        for i in (0..r).rev() {
            let d = if i >= pad { dims[i - pad] } else { 1 };
            st[i] = if d == 1 && out_batch[i] != 1 { 0 } else { s };
            s *= d;
        }
        st
    };
    let (sa_, sb_) = (strides(&ab), strides(&bb));
    (0..groups_total)
        .map(|g| {
            let (mut rem, mut ia, mut ib) = (g, 0, 0);
            for d in (0..r).rev() {
                let c = rem % out_batch[d];
                rem /= out_batch[d];
                ia += c * sa_[d];
                ib += c * sb_[d];
            }
            (ia * a_rows * a_cols, ib * b_rows * b_cols, g * m * n)
        })
        .collect::<Vec<_>>()
}

/// Matmul `i` as a product.
fn matmul_product<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &MatMul) -> Product {
    let (sa, sb, so) = (
        l.node(op.a).shape(),
        l.node(op.b).shape(),
        l.node(i).shape(),
    );
    let (ta, tb) = (op.transpose_a, op.transpose_b);
    let (a_rows, a_cols) = (sa.dim(sa.rank() - 2) as u64, sa.last() as u64);
    let (b_rows, b_cols) = (sb.dim(sb.rank() - 2) as u64, sb.last() as u64);
    let (m, k) = if ta {
        (a_cols, a_rows)
    } else {
        (a_rows, a_cols)
    };
    let n = if tb { b_rows } else { b_cols };
    let tiles = u64::from(l.tile_count());
    let out_batch = batch_dims(so);
    let groups_total: u64 = out_batch.iter().product();
    // Per group: the first element of its a matrix, of its b matrix and of its output.
    let (groups, m) = if sb.rank() == 2 && !ta {
        // The batch folds into m: one product of [batch * m, k] x [k, n].
        (vec![(0u64, 0u64, 0u64)], m * groups_total)
    } else {
        let groups = batch_groups(
            [sa, sb],
            &out_batch,
            [a_rows, a_cols],
            [b_rows, b_cols],
            [m, n],
        );
        (groups, m)
    };
    let single = groups.len() == 1;
    let (at, bt) = (l.t(op.a), l.t(op.b));
    let g1 = groups.clone();
    let g2 = groups.clone();
    let block = move |t: TensorId, base: u64, r: Range, c: Range, cols: u64| {
        Region::strided(t, base + r.0 * cols + c.0, c.1 - c.0, r.1 - r.0, cols)
    };
    Product {
        groups: groups.len(),
        m,
        k,
        n,
        tiles_per_group: if single {
            tiles
        } else {
            (tiles / groups_total.max(1)).max(1)
        },
        laid_out: LaidOut {
            a: single
                && op.a != op.b
                && l.node(op.a).op().is_state()
                && l.first_consumer(op.a) == Some(i),
            b: single && l.node(op.b).op().is_state() && l.first_consumer(op.b) == Some(i),
        },
        reads: Box::new(move |g, rm, rk, rn| {
            let (abase, bbase, _) = g1[g];
            let a = if ta {
                block(at, abase, rk, rm, a_cols)
            } else {
                block(at, abase, rm, rk, a_cols)
            };
            let b = if tb {
                block(bt, bbase, rn, rk, b_cols)
            } else {
                block(bt, bbase, rk, rn, b_cols)
            };
            vec![a, b]
        }),
        out: Box::new(move |g, rm, rn| {
            let base = g2[g].2;
            rect(rm.0, rm.1, rn.0, rn.1, n)
                .map(|(s, len)| (base + s, len))
                .collect()
        }),
        field: None,
        kernel_area: 1,
        b: single.then(|| {
            Box::new(move |_: usize, rk: Range, rn: Range| {
                if tb {
                    rect(rn.0, rn.1, rk.0, rk.1, b_cols).collect()
                } else {
                    rect(rk.0, rk.1, rn.0, rn.1, b_cols).collect()
                }
            }) as BlockSpans
        }),
        a: single.then(|| {
            Box::new(move |_: usize, rm: Range, rk: Range| {
                if ta {
                    rect(rk.0, rk.1, rm.0, rm.1, a_cols).collect()
                } else {
                    rect(rm.0, rm.1, rk.0, rk.1, a_cols).collect()
                }
            }) as BlockSpans
        }),
    }
}

/// Node `i` as a product (a matmul or a convolution).
pub(crate) fn product_of<S: Storage>(l: &Lowering<'_, S>, i: NodeId) -> Option<Product> {
    match *l.node(i).op() {
        Op::MatMul(m) => Some(matmul_product(l, i, &m)),
        Op::Conv(c) => Some(super::conv::product(l, i, &c)),
        _ => None,
    }
}

/// The plan of product `i`.
pub(crate) fn plan_of<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, p: &Product) -> MatMulPlan {
    if let Some(plan) = l.mm.get(&i) {
        return *plan;
    }
    let cfg = l.cfg;
    if let Some((pass, (b, input, output, dt))) = fc_pass(l, i, p) {
        let tiles = p.tiles_per_group;
        let plans = match l.fc_plans.get(&(b, input, output, dt, tiles)) {
            Some(plans) => *plans,
            None => {
                let plans =
                    plan_fc_cached(cfg, l.machine, [b, input, output], dt, tiles, l.opts.plan);
                l.fc_plans.insert((b, input, output, dt, tiles), plans);
                if !plans.joint {
                    // The separate plans are plan_matmul's for these shapes (the forward's
                    // weight laid out by it, the other passes' operands not): keep them.
                    for (key, plan) in [
                        (
                            (b, input, output, dt, LaidOut::B, tiles, None),
                            plans.forward,
                        ),
                        (
                            (b, output, input, dt, LaidOut::NONE, tiles, None),
                            plans.backward,
                        ),
                        (
                            (input, b, output, dt, LaidOut::NONE, tiles, None),
                            plans.weight_update,
                        ),
                    ] {
                        l.plans_by_shape.entry(key).or_insert(plan);
                    }
                }
                plans
            }
        };
        if plans.joint {
            let plan = match pass {
                FcPass::Forward => plans.forward,
                FcPass::Backward => plans.backward,
                FcPass::WeightUpdate => plans.weight_update,
            };
            l.mm.insert(i, plan);
            return plan;
        }
    }
    let key = shape_key(l, i, p);
    let (machine, opts) = (l.machine, l.opts.plan);
    let plan = *l
        .plans_by_shape
        .entry(key)
        .or_insert_with(|| plan_matmul_cached(cfg, machine, opts, key));
    l.mm.insert(i, plan);
    plan
}

/// What the planner is asked for a product: a trained fully-connected layer's passes
/// together (its layer and tiles), or one product's plan (its shape, type, operands laid out,
/// tiles and field).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum PlanAsk {
    Fc(FcLayer, u64),
    One(ProductKey),
}

/// Plans the products of the nodes `wanted` on the rayon pool's threads, into the process's
/// plan caches, before the tensors are mapped. Mapping walks the graph in order and asks for
/// each product's plan as it comes to it (a product's output is laid out by its plan), and
/// planning is most of that walk's work; a plan is a function of the product's shape, type
/// and options alone, so [`plan_of`] then finds the same plan in the cache that it would have
/// made. The products' output layouts are made here too, on the same threads, into the
/// process's layouts, where [`output_mapping`] then finds them.
pub(super) fn plan_products<S: Storage>(l: &Lowering<'_, S>, wanted: impl Fn(NodeId) -> bool)
where
    tessera_core::Plan<S>: Sync,
    tessera_core::Graph<S>: Sync,
{
    use rayon::prelude::*;
    let mut asks: Vec<PlanAsk> = l
        .graph
        .ids()
        .filter(|&i| wanted(i))
        .filter_map(|i| {
            let p = product_of(l, i)?;
            Some(match fc_pass(l, i, &p) {
                Some((_, layer)) => PlanAsk::Fc(layer, p.tiles_per_group),
                None => PlanAsk::One(shape_key(l, i, &p)),
            })
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    asks.retain(|a| seen.insert(*a));
    if asks.len() < 2 {
        return;
    }
    let (cfg, machine, opts) = (l.cfg, l.machine, l.opts.plan);
    asks.par_iter().for_each(|a| match *a {
        PlanAsk::Fc((b, input, output, dt), tiles) => {
            plan_fc_cached(cfg, machine, [b, input, output], dt, tiles, opts);
        }
        PlanAsk::One(key) => {
            plan_matmul_cached(cfg, machine, opts, key);
        }
    });
    // The products' output layouts too, into the process's layouts, with their digests:
    // making them (ordering a large convolution's intervals) was a third of the mapping
    // walk's own work, which runs on one core. A layout is found by its key, which holds the
    // plan, so one made here for a plan the walk does not pick is never used, never wrong.
    let products: Vec<NodeId> = l.graph.ids().filter(|&i| wanted(i)).collect();
    products.par_iter().for_each(|&i| {
        if let Some(p) = product_of(l, i) {
            let plan = cached_plan(l, i, &p);
            let _ = output_layout(l, i, &p, &plan).digest();
        }
    });
}

/// The plan [`plan_of`] gives product `i`, from the process's plan caches (which
/// [`plan_products`] has filled), without keeping it in the lowering.
fn cached_plan<S: Storage>(l: &Lowering<'_, S>, i: NodeId, p: &Product) -> MatMulPlan {
    let (cfg, machine, opts) = (l.cfg, l.machine, l.opts.plan);
    if let Some((pass, (b, input, output, dt))) = fc_pass(l, i, p) {
        let plans = plan_fc_cached(
            cfg,
            machine,
            [b, input, output],
            dt,
            p.tiles_per_group,
            opts,
        );
        if plans.joint {
            return match pass {
                FcPass::Forward => plans.forward,
                FcPass::Backward => plans.backward,
                FcPass::WeightUpdate => plans.weight_update,
            };
        }
    }
    plan_matmul_cached(cfg, machine, opts, shape_key(l, i, p))
}

/// The tile of block `grid` of group `g`.
fn tile(g: usize, grid: u64, p: &Product, tiles: u32) -> TileId {
    TileId::wrapping(g as u64 * p.tiles_per_group + grid, tiles)
}

fn range(i: u64, block: u64, len: u64) -> Range {
    (i * block, ((i + 1) * block).min(len))
}

/// The fewest bytes of an activation operand a tile is given when it is spread over the tiles
/// that read it (poplin's `mapActivationsOrWeights`, `lib/poplin/Convolution.cpp`: a limit
/// on exchange code "chosen experimentally" by Graphcore).
pub const MIN_ACTIVATION_BYTES_PER_TILE: u64 = 128;

/// The fewest bytes of a weight operand a tile is given when it is spread over the tiles that
/// read it (poplin's `mapActivationsOrWeights`, as [`MIN_ACTIVATION_BYTES_PER_TILE`]).
pub const MIN_WEIGHT_BYTES_PER_TILE: u64 = 256;

/// Spreads the elements of `runs` (in order) over up to `readers` readers, as poplibs' tensor
/// use tracker maps a tensor by use: even shares, each a whole number of `grain` elements and
/// at least `min` elements, so a small block goes to fewer readers. Calls `place(reader,
/// start, len)` for each piece.
fn spread(
    runs: &[(u64, u64)],
    readers: u64,
    min: u64,
    grain: u64,
    mut place: impl FnMut(u64, u64, u64),
) {
    let total: u64 = runs.iter().map(|r| r.1).sum();
    let share = total
        .div_ceil(readers.max(1))
        .next_multiple_of(grain.max(1))
        .max(min)
        .max(1);
    let mut done = 0u64;
    for &(start, len) in runs {
        let mut off = 0;
        while off < len {
            let reader = done / share;
            let take = (len - off).min((reader + 1) * share - done);
            place(reader, start + off, take);
            off += take;
            done += take;
        }
    }
}

/// Whether product `i` can lay out its operand `op`.
pub(super) fn lays_out<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: Operand) -> bool {
    product_of(l, i).is_some_and(|p| match op {
        Operand::A => p.a.is_some(),
        Operand::B => p.b.is_some(),
    })
}

/// The mapping of operand `op` of product `i` by its plan, in shares spread over the tiles
/// that read each block, in order (poplin's `mapActivationsOrWeights`,
/// `lib/poplin/Convolution.cpp`):
///
/// - the right-hand operand (a weight, as poplin's `mapWeights` maps it by use): block
///   (ik, in) over the grid's (im, ik, in) for every im, in grains of the AMP's input group
///   times its conv units and at least [`MIN_WEIGHT_BYTES_PER_TILE`];
/// - the left-hand operand (as poplibs' `createMatMulInputLHS` lays it out): block (im, ik)
///   over the grid's (im, ik, in) for every in, in grains of the AMP's input group and at least
///   [`MIN_ACTIVATION_BYTES_PER_TILE`].
pub(super) fn operand_mapping<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    op: Operand,
) -> Mapping {
    let Some(p) = product_of(l, i) else {
        return Mapping::default();
    };
    let plan = plan_of(l, i, &p);
    let dtype = l.node(i).dtype();
    let group = cost::amp_in_group(l.cfg, dtype);
    // The block's two dimensions (splits, block size, length), its readers and their shares.
    let (spans, x, y, readers, min_bytes, grain) = match op {
        Operand::A => (
            &p.a,
            (plan.pm, plan.bm, p.m),
            (plan.pk, plan.bk, p.k),
            plan.pn,
            MIN_ACTIVATION_BYTES_PER_TILE,
            group,
        ),
        Operand::B => (
            &p.b,
            (plan.pk, plan.bk, p.k),
            (plan.pn, plan.bn, p.n),
            plan.pm,
            MIN_WEIGHT_BYTES_PER_TILE,
            group * cost::amp_conv_units(l.cfg, dtype),
        ),
    };
    let Some(spans) = spans else {
        return Mapping::default();
    };
    let min = min_bytes.div_ceil(dtype.size() as u64);
    let tiles = l.tile_count();
    let which = match op {
        Operand::A => 1,
        Operand::B => 2,
    };
    let key = layout_key(l, i, &p, &plan);
    product_layout(&key, which, || {
        let mut iv = Vec::new();
        for g in 0..p.groups {
            for ix in 0..x.0 {
                for iy in 0..y.0 {
                    let (rx, ry) = (range(ix, x.1, x.2), range(iy, y.1, y.2));
                    if rx.0 >= rx.1 || ry.0 >= ry.1 {
                        continue;
                    }
                    spread(&spans(g, rx, ry), readers, min, grain, |r, start, len| {
                        let (im, ik, i_n) = match op {
                            Operand::A => (ix, iy, r),
                            Operand::B => (r, ix, iy),
                        };
                        let tile = tile(g, plan.grid(im, ik, i_n), &p, tiles);
                        iv.push(Interval { tile, start, len });
                    });
                }
            }
        }
        // Blocks and shares are disjoint and non-empty (`spread` places no empty piece).
        Mapping::from_disjoint_intervals(iv)
    })
}

/// The q-th of `pk` even shares of `n` elements, as `[start, end)` (empty past the end).
fn share_span(n: u64, q: u64, pk: u64) -> Range {
    let c = n.div_ceil(pk.max(1));
    ((q * c).min(n), ((q + 1) * c).min(n))
}

/// The order the tiles reducing an output block share it in: poplin's grouped layout of a
/// convolution's output, `[channels / group][field][group]` (`splitActivationIntoGroups` in
/// `lib/poplin/ConvReduce.cpp`), whose partial sums `partialGroupedReduce` splits among the
/// block's tiles in even shares of whole grains (`splitRegions` with `roundedGrainSize`, the
/// AMP's output channels per group at least, rounded to the vector width). A share is then a
/// few runs of whole channel groups over a range of positions, not a few rows of the block
/// cut at arbitrary columns: a reader of another shape receives it as few regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShareOrder {
    /// Whether the block's rows (`m`) are the channels (a product run transposed on the AMP,
    /// [`MatMulPlan::swapped`]), rather than its columns (`n`).
    pub channels_are_rows: bool,
    /// Channels per group, and the grain of a share (its rows of one group).
    pub group: u64,
}

impl ShareOrder {
    /// The order product `p`'s output blocks are reduced in under `plan`.
    fn of(cfg: &crate::IpuConfig, plan: &MatMulPlan, dtype: DType) -> Self {
        let pt = plan.partials_dtype();
        // poplin's `roundedGrainSize`: the partials' channels per group, at least one vector
        // (64 bits) of the result type.
        let vector = (8 / dtype.size() as u64).max(1);
        let group = if plan.on_amp() {
            cost::amp_conv_units_with(cfg, dtype, pt)
        } else {
            1
        }
        .next_multiple_of(vector);
        ShareOrder {
            channels_are_rows: plan.swapped,
            group,
        }
    }

    /// The q-th of `pk` tiles' share of a `rows x cols` block, as `[start, end)` positions in
    /// this order: even shares of whole grains (empty past the end).
    fn span(self, rows: u64, cols: u64, q: u64, pk: u64) -> Range {
        let n = rows * cols;
        let c = n.div_ceil(pk.max(1)).next_multiple_of(self.group.max(1));
        ((q * c).min(n), ((q + 1) * c).min(n))
    }
}

/// The part of a `rows x cols` output block that the q-th of `pk` tiles reduces, as
/// rectangles (rows r0..r1, cols c0..c1): its share ([`ShareOrder::span`]) of the block's
/// elements in the grouped order, each channel group's part of it a partial first line, whole
/// lines and a partial last line.
fn reduce_share(
    rows: u64,
    cols: u64,
    q: u64,
    pk: u64,
    order: ShareOrder,
) -> Vec<(u64, u64, u64, u64)> {
    let (s, e) = order.span(rows, cols, q, pk);
    if order.channels_are_rows {
        return grouped_rectangles(cols, rows, order.group, s, e)
            .into_iter()
            .map(|(c0, c1, r0, r1)| (r0, r1, c0, c1))
            .collect();
    }
    grouped_rectangles(rows, cols, order.group, s, e)
}

/// The positions `s..e` of a `rows x cols` block kept as `[cols / group][rows][group]` (the
/// last group narrower when `group` does not divide `cols`), as rectangles (rows r0..r1,
/// cols c0..c1).
fn grouped_rectangles(
    rows: u64,
    cols: u64,
    group: u64,
    s: u64,
    e: u64,
) -> Vec<(u64, u64, u64, u64)> {
    let mut out = Vec::new();
    let group = group.clamp(1, cols.max(1));
    let full = rows * group;
    // The first group the share reaches (every group but the last is `full` positions).
    let first = (s / full.max(1)).min(cols.div_ceil(group).saturating_sub(1));
    let (mut base, mut c_start) = (first * full, first * group);
    while c_start < cols && base < e {
        let w = group.min(cols - c_start);
        let (a, b) = (s.max(base), e.min(base + rows * w));
        let (mut i, end) = (a.saturating_sub(base), b.saturating_sub(base));
        while i < end {
            let (r, c0) = (i / w, i % w);
            if c0 == 0 && end - i >= w {
                // Whole lines of the group.
                let lines = (end - i) / w;
                out.push((r, r + lines, c_start, c_start + w));
                i += lines * w;
            } else {
                let c1 = w.min(c0 + (end - i));
                out.push((r, r + 1, c_start + c0, c_start + c1));
                i += c1 - c0;
            }
        }
        base += rows * w;
        c_start += w;
    }
    out
}

/// Output blocks (group, im, in, rows, cols) and, for each, the pk tiles that own a share.
fn output_shares(p: &Product, plan: &MatMulPlan) -> Vec<(usize, u64, u64, Range, Range, u64)> {
    let mut v = Vec::new();
    for g in 0..p.groups {
        for im in 0..plan.pm {
            for i_n in 0..plan.pn {
                let (rm, rn) = (range(im, plan.bm, p.m), range(i_n, plan.bn, p.n));
                if rm.0 >= rm.1 || rn.0 >= rn.1 {
                    continue;
                }
                let pk_here = (0..plan.pk).filter(|&q| q * plan.bk < p.k).count() as u64;
                v.push((g, im, i_n, rm, rn, pk_here));
            }
        }
    }
    v
}

/// Everything a product's layouts of its output and operands are made from: its op, shapes,
/// type, plan and shape of product, with the machine (the tiles).
fn layout_key<S: Storage>(
    l: &Lowering<'_, S>,
    i: NodeId,
    p: &Product,
    plan: &MatMulPlan,
) -> String {
    let node = l.node(i);
    let op = super::op_by_place(node.op(), node.op().operands().as_slice());
    let mut key = format!(
        "{:x}|{:?}|{:?}|{op}|{plan:?}|{}|{}|{}|{}|{}",
        l.machine,
        node.shape(),
        node.dtype(),
        p.groups,
        p.m,
        p.k,
        p.n,
        p.tiles_per_group,
    );
    for &o in node.op().operands().as_slice() {
        key.push_str(&format!("|{:?}", l.node(o).shape()));
    }
    key
}

/// Product layouts made so far in this process, by [`layout_key`] and which tensor: identical
/// products (a model's repeated layers, and the same layers in every stage, split and sweep
/// configuration) have one layout, made once. At most 4096 are kept (an estimate: a few
/// models' worth of distinct products).
static LAYOUTS: super::kept::Kept<(String, u8), Mapping> = super::kept::Kept::new(4096);

/// Drops the product layouts this process keeps ([`LAYOUTS`]).
pub(super) fn clear_product_layouts() {
    LAYOUTS.clear();
}

/// The layout of `which` (0 the output, 1 and 2 the operands) of the product with `key`,
/// made by `make` (outside the lock) when this process has not made it yet.
fn product_layout(key: &str, which: u8, make: impl FnOnce() -> Mapping) -> Mapping {
    LAYOUTS.get_or_make((key.to_string(), which), make)
}

/// The mapping of product `i`'s output (where its final values are written), and whether the
/// AMP vertices write it themselves (its `k` is not split, over tiles or in serial steps, so
/// there is no reduction or accumulation, and its partials need no cast, `fp32_partials`): the
/// output is then AMP partials, which must be interleaved.
pub(super) fn output_mapping<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId) -> (Mapping, bool) {
    let Some(p) = product_of(l, i) else {
        return (Mapping::default(), false);
    };
    let plan = plan_of(l, i, &p);
    let node = l.node(i);
    let amp_written = plan.on_amp()
        && plan.pk == 1
        && plan.serial <= 1
        && !casts_partials(
            l.cfg,
            p.k,
            p.kernel_area,
            node.dtype(),
            plan.partials_dtype(),
        );
    (output_layout(l, i, &p, &plan), amp_written)
}

/// The layout of product `i`'s output under `plan`, made once per process for each layout
/// key.
fn output_layout<S: Storage>(
    l: &Lowering<'_, S>,
    i: NodeId,
    p: &Product,
    plan: &MatMulPlan,
) -> Mapping {
    let key = layout_key(l, i, p, plan);
    let tiles = l.tile_count();
    let order = ShareOrder::of(l.cfg, plan, l.node(i).dtype());
    product_layout(&key, 0, || {
        let mut iv = Vec::new();
        for (g, im, i_n, rm, rn, pk_here) in output_shares(p, plan) {
            for ik in 0..pk_here {
                let tile = tile(g, plan.grid(im, ik, i_n), p, tiles);
                for (r0, r1, c0, c1) in reduce_share(rm.1 - rm.0, rn.1 - rn.0, ik, pk_here, order) {
                    for (start, len) in (p.out)(g, (rm.0 + r0, rm.0 + r1), (rn.0 + c0, rn.0 + c1)) {
                        if len > 0 {
                            iv.push(Interval { tile, start, len });
                        }
                    }
                }
            }
        }
        // Each output element is written by one share.
        Mapping::from_disjoint_intervals(iv)
    })
}

/// A tile's share of finishing an output block: the tile, the output element spans it
/// writes and, when `k` is not split, the block's span in the partial sums.
type Share = (TileId, Vec<(u64, u64)>, Option<(u64, u64)>);

/// One block of the grid: group, (im, ik, in) and its element ranges.
#[derive(Clone, Copy)]
struct Block {
    g: usize,
    im: u64,
    ik: u64,
    i_n: u64,
    m: Range,
    k: Range,
    n: Range,
}

/// Where a product's output goes (a matmul's or a convolution's): laid out by its plan
/// ([`output_mapping`]), as poplin creates it.
pub(super) fn placement() -> Placement {
    Placement::Own
}

/// Lowers product `i`: partial products on the AMP, then (when `k` is split) the reduction,
/// or (when it is not, but the AMP cannot write the output's type) a cast.
pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId) {
    let Some(p) = product_of(l, i) else {
        return;
    };
    let plan = plan_of(l, i, &p);
    let mut blocks = Vec::new();
    for g in 0..p.groups {
        for im in 0..plan.pm {
            for ik in 0..plan.pk {
                for i_n in 0..plan.pn {
                    let (m, k, n) = (
                        range(im, plan.bm, p.m),
                        range(ik, plan.bk, p.k),
                        range(i_n, plan.bn, p.n),
                    );
                    if m.0 < m.1 && k.0 < k.1 && n.0 < n.1 {
                        blocks.push(Block {
                            g,
                            im,
                            ik,
                            i_n,
                            m,
                            k,
                            n,
                        });
                    }
                }
            }
        }
    }
    // A trained layer's input-gradient pass reads its weights transposed (poplin's
    // `fullyConnectedWeightTranspose` for `fullyConnectedPass = TRAINING_BWD`,
    // `lib/poplin/MatMul.cpp`): a compute set of transpositions makes them first.
    let remap = match (fc_pass(l, i, &p), *l.node(i).op()) {
        (Some((FcPass::Backward, _)), Op::MatMul(op)) => {
            let block = plan.transpose_block(l.cfg, l.node(op.b).dtype());
            Some(transpose_weights(l, i, op.b, block))
        }
        _ => None,
    };
    if plan.serial_n > 1 {
        // poplin's serial output-channel split: each step computes every block's share of its
        // columns in full (its own compute sets), writing that share of the output.
        for s in 0..plan.serial_n {
            let sub: Vec<Block> = blocks
                .iter()
                .filter_map(|b| {
                    let n = plan.serial_n_range(b.n, s);
                    (n.0 < n.1).then_some(Block { n, ..*b })
                })
                .collect();
            let suffix = format!(" {}/{}", s + 1, plan.serial_n);
            lower_blocks(l, i, &p, &plan, &sub, remap, &suffix);
        }
    } else {
        lower_blocks(l, i, &p, &plan, &blocks, remap, "");
    }
}

/// Makes the transposed copy of weight `w` that input-gradient pass `i` reads: a temporary
/// laid out like the weight (the transpositions run on the tiles holding the forward's
/// weight blocks, `addTransposeVertices` on their tile mapping), made by one compute set of
/// transpositions in `block`s (rows x columns). Returns (the weight, its transposed copy).
fn transpose_weights<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    w: NodeId,
    (rows, cols): (u64, u64),
) -> (TensorId, TensorId) {
    let (cfg, dt) = (l.cfg, l.node(w).dtype());
    let weight = l.t(w);
    let (elements, mapping) = {
        let t = &l.tensors[weight.index()];
        (t.elements, t.mapping.clone())
    };
    let transposed = l.temporary(i, "weights transposed", dt, elements, mapping.clone());
    let mut on_tile: std::collections::BTreeMap<TileId, Vec<Region>> = Default::default();
    for iv in mapping.intervals() {
        on_tile
            .entry(iv.tile)
            .or_default()
            .push(Region::span(weight, iv.start, iv.len));
    }
    let vertices = on_tile
        .into_iter()
        .map(|(tile, reads)| {
            let n: u64 = reads.iter().map(|r| r.elements()).sum();
            let writes = reads
                .iter()
                .map(|r| Region {
                    tensor: transposed,
                    ..*r
                })
                .collect();
            Vertex {
                tile,
                codelet: Codelet::Copy,
                cycles: cost::weight_transpose_cycles(cfg, n, dt, rows, cols),
                reads,
                writes,
            }
        })
        .collect();
    l.compute(i, "weight transpose", vertices);
    (weight, transposed)
}

/// Lowers `blocks` of product `i` (all of them, or one serial output step's share of each),
/// naming its compute sets with `suffix`; with `remap` = (weight, copy) its vertices read the
/// weight's transposed copy instead of the weight. In one compute set when there is one
/// serial step, k is not split over tiles and the partial sums need no cast; else the
/// partial sums block by block, then (one serial step) their cast or reduction to the
/// output, or (several) poplin's serial loop.
fn lower_blocks<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    p: &Product,
    plan: &MatMulPlan,
    blocks: &[Block],
    remap: Option<(TensorId, TensorId)>,
    suffix: &str,
) {
    let dt = l.node(i).dtype();
    let bl = Blocks {
        i,
        p,
        plan,
        blocks,
        remap,
        cfg: l.cfg,
        dt,
        tiles: l.tile_count(),
        out: l.t(i),
        // The partial sums' type: fp32, or fp16 with half partials (`PlanOptions::partials`).
        pt: plan.partials_dtype(),
    };
    // Serial steps over each block's k range: each step a compute set (and the exchange
    // bringing its share of the operands).
    let steps = plan.serial.max(1);
    let casts = casts_partials(l.cfg, p.k, p.kernel_area, dt, bl.pt);
    if steps == 1 && plan.pk == 1 && !casts {
        let vertices = bl.step(0, &|b| spans(bl.out, (p.out)(b.g, b.m, b.n)));
        l.compute(i, &format!("matmul{suffix}"), vertices);
        return;
    }
    let layout = bl.partials_layout();
    let pk_here = (0..plan.pk).filter(|&q| q * plan.bk < p.k).count() as u64;
    // Output blocks: (g, im, in) with their element counts, from the ik = 0 blocks.
    let outs: Vec<Block> = blocks.iter().filter(|b| b.ik == 0).copied().collect();
    let shares = bl.shares(&outs, &layout, pk_here);
    let reduce =
        |l: &mut Lowering<'_, S>, partials: TensorId, to: TensorId, to_dt, suffix: &str| {
            let r = Reduction {
                bl: &bl,
                outs: &outs,
                pk_here,
                suffix,
            };
            reduce_blocks(l, &r, &layout.offsets, partials, to, to_dt);
        };
    let (out, pt) = (bl.out, bl.pt);
    if steps == 1 {
        let partials = bl.make_partials(l, &layout, 0, suffix);
        if plan.pk == 1 {
            // poplin's `Cast` compute set: each tile casts its block's partials to the output,
            // which is mapped like them (`output_mapping`).
            let cast = Codelet::Cast(VertexType::cast(pt, dt));
            let vertices = bl.over_shares(&shares, partials, true, out, cast, false);
            l.compute(i, &format!("cast{suffix}"), vertices);
        } else {
            reduce(l, partials, out, dt, suffix);
        }
        return;
    }
    // poplin's serial loop (`convolutionImpl`, `lib/poplin/Convolution.cpp`): every step makes
    // its partial sums afresh, reduces them (in the partials' type) when k is split across
    // tiles, and adds them into an accumulator of the partials' type (the first step copies
    // them in). After the loop the accumulator is cast to the output, unless the output is of
    // the partials' type and is the accumulator itself.
    let like = |l: &mut Lowering<'_, S>, t: TensorId, name: &str| {
        let (elements, mapping) = {
            let t = &l.tensors[t.index()];
            (t.elements, t.mapping.clone())
        };
        l.temporary(i, name, pt, elements, mapping)
    };
    let acc = if dt == pt {
        out
    } else {
        like(l, out, "accumulator")
    };
    for s in 0..steps {
        let suffix = format!(" {}/{steps}", s + 1);
        let partials = bl.make_partials(l, &layout, s, &suffix);
        let result = if plan.pk == 1 {
            partials
        } else {
            let sum = like(l, acc, &format!("sum{suffix}"));
            reduce(l, partials, sum, pt, &suffix);
            sum
        };
        let vertices = if s == 0 {
            bl.over_shares(&shares, result, plan.pk == 1, acc, Codelet::Copy, false)
        } else {
            let add = binary_type(BinaryFn::Add, pt, BinaryForm::InPlace);
            bl.over_shares(
                &shares,
                result,
                plan.pk == 1,
                acc,
                Codelet::Binary(add),
                true,
            )
        };
        l.compute(i, &format!("accumulate{suffix}"), vertices);
    }
    if acc != out {
        let cast = Codelet::Cast(VertexType::cast(pt, dt));
        let vertices = bl.over_shares(&shares, acc, false, out, cast, false);
        l.compute(i, "cast", vertices);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{reduce_share, ShareOrder};

    proptest! {
        /// The pk shares of a block cover each of its elements once; each share is one
        /// contiguous run of the block in the grouped order (`[channels / group][positions]
        /// [group]`, channels the columns or, transposed, the rows), starts at a whole grain,
        /// and is the span `ShareOrder::span` gives (the partials' share the reduction reads).
        #[test]
        fn reduce_shares_tile_the_block_in_the_grouped_order(
            rows in 1u64..40,
            cols in 1u64..40,
            pk in 1u64..12,
            group in 1u64..20,
            channels_are_rows in any::<bool>(),
        ) {
            let order = ShareOrder { channels_are_rows, group };
            // Position of (r, c) in the grouped order.
            let (chans, positions) = if channels_are_rows { (rows, cols) } else { (cols, rows) };
            let at_of = |r: u64, c: u64| {
                let (ch, pos) = if channels_are_rows { (r, c) } else { (c, r) };
                let g0 = ch / group * group;
                let w = group.min(chans - g0);
                g0 * positions + pos * w + (ch - g0)
            };
            let mut seen = vec![0u32; (rows * cols) as usize];
            for q in 0..pk {
                let mut at = Vec::new();
                for (r0, r1, c0, c1) in reduce_share(rows, cols, q, pk, order) {
                    prop_assert!(r0 < r1 && r1 <= rows && c0 < c1 && c1 <= cols);
                    for r in r0..r1 {
                        for c in c0..c1 {
                            seen[(r * cols + c) as usize] += 1;
                            at.push(at_of(r, c));
                        }
                    }
                }
                at.sort_unstable();
                prop_assert!(at.windows(2).all(|w| w[1] == w[0] + 1), "share {q} not contiguous");
                let (s, e) = order.span(rows, cols, q, pk);
                if let (Some(&first), Some(&last)) = (at.first(), at.last()) {
                    prop_assert_eq!((first, last + 1), (s, e));
                    prop_assert!(s % group == 0, "share {q} starts inside a grain");
                } else {
                    prop_assert_eq!(s, e);
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
        }
    }
}
