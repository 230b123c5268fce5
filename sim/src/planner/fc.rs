//! Planning a fully-connected layer's three training passes together, as poplin plans
//! `TRAINING_FWD`: one partition shared by the forward, input-gradient and weight-update
//! products (horizontal MACs at batch 1 too), or the three planned apart when that is cheaper.

use serde::{Deserialize, Serialize};
use tessera_core::DType;

use super::{
    candidates, plan_matmul_with, price, BoundLevel, GridOrder, LaidOut, MatMulPlan, Method,
    Orientation, Pass, PlanOptions,
};
use crate::cost;
use crate::machine::IpuConfig;

/// The plans of the three passes of a fully-connected layer trained on the IPU, `Y = X . W`
/// with `X` batch x input and `W` input x output: forward, input gradient `dX = dY . W^T` and
/// weight gradient `dW = X^T . dY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FcPlans {
    /// `[batch, input] x [input, output]`.
    pub forward: MatMulPlan,
    /// `[batch, output] x [output, input]`.
    pub backward: MatMulPlan,
    /// `[input, batch] x [batch, output]`.
    pub weight_update: MatMulPlan,
    /// Whether the three share one partition (a joint plan).
    pub joint: bool,
}

impl FcPlans {
    /// Planned cycles of the three passes.
    pub fn planned_cycles(&self) -> u64 {
        [self.forward, self.backward, self.weight_update]
            .iter()
            .map(|p| p.planned_cycles)
            .fold(0u64, u64::saturating_add)
    }
}

/// Plans a fully-connected layer's three training passes as poplin does for
/// `fullyConnectedPass = TRAINING_FWD` (`runPlanner`, `lib/poplin/ConvPlan.cpp`): the cheapest
/// joint plan, where the forward's partition `pm x pk x pn` (batch, input, output) is reused by
/// the input gradient as `pm x pn x pk` and by the weight update as `pk x pm x pn`, each block
/// on the tile of the forward block holding the same weights, so the weights never move; and
/// the three passes planned separately. The joint plan minimises the sum of the three passes'
/// cycles (`e.totalCycles = sum(fwd, bwd, wu)` in `lib/poplin/ConvModel.cpp`), with the operands
/// swapped in every pass (poplin's joint plans assume `swapOperands`, T12885). The separate
/// plans are taken when they are cheaper in all, as poplin compares the two; their cost also
/// counts moving the weight gradient to the weights' tiles for the update, which the joint
/// plan avoids (the lowering does both).
pub fn plan_fc(
    cfg: &IpuConfig,
    batch: u64,
    input: u64,
    output: u64,
    dtype: DType,
    tiles: u64,
) -> FcPlans {
    plan_fc_with(
        cfg,
        batch,
        input,
        output,
        dtype,
        tiles,
        PlanOptions::default(),
    )
}

/// [`plan_fc`] with the planner's options (`availableMemoryProportion`, `partialsType`).
pub fn plan_fc_with(
    cfg: &IpuConfig,
    batch: u64,
    input: u64,
    output: u64,
    dtype: DType,
    tiles: u64,
    opts: PlanOptions,
) -> FcPlans {
    let plan = |m, k, n, laid_out| plan_matmul_with(cfg, [m, k, n], dtype, laid_out, tiles, opts);
    let separate = FcPlans {
        forward: plan(batch, input, output, LaidOut::B),
        backward: plan(batch, output, input, LaidOut::NONE),
        weight_update: plan(input, batch, output, LaidOut::NONE),
        joint: false,
    };
    // Separately planned, the weight gradient is not where the weights are: the update first
    // brings each tile its weights' share of it (the forward's weight block over its pm tiles).
    // A joint plan's weight update writes each gradient block on the tiles holding its weights.
    let f = separate.forward;
    let gradient_move = cost::exchange_cycles(
        cfg,
        (f.bk * f.bn).div_ceil(f.pm) * dtype.size() as u64,
        false,
    );
    let separate_cycles = separate.planned_cycles().saturating_add(gradient_move);
    let mut best: BestFc = None;
    for [pm, pk, pn] in candidates(cfg, opts, [batch, input, output], dtype, tiles) {
        let (big_f, forward) = price(
            cfg,
            opts,
            [batch, input, output],
            [pm, pk, pn],
            dtype,
            Pass {
                laid_out: LaidOut::B,
                orientation: Orientation::Swapped,
                order: GridOrder::Standard,
                method: Method::Amp,
                field: None,
            },
        );
        // A candidate whose passes so far already cost as much as the best joint plan that
        // keeps the memory rule cannot beat it (every pass costs something): skip the rest.
        let beaten = |so_far: u64| {
            best.as_ref()
                .is_some_and(|((level, cycles, _), _)| *level == 0 && so_far >= *cycles)
        };
        if beaten(forward.planned_cycles) {
            continue;
        }
        // The weights stay where the forward laid them: each tile of the input gradient
        // receives the rest of its block, as the forward's tiles do.
        let (big_b, backward) = price(
            cfg,
            opts,
            [batch, output, input],
            [pm, pn, pk],
            dtype,
            Pass {
                laid_out: LaidOut::B,
                orientation: Orientation::Swapped,
                order: GridOrder::FcBackward,
                method: Method::Amp,
                field: None,
            },
        );
        if beaten(
            forward
                .planned_cycles
                .saturating_add(backward.planned_cycles),
        ) {
            continue;
        }
        let (big_w, weight_update) = price(
            cfg,
            opts,
            [input, batch, output],
            [pk, pm, pn],
            dtype,
            Pass {
                laid_out: LaidOut::NONE,
                orientation: Orientation::Swapped,
                order: GridOrder::FcWeightUpdate,
                method: Method::Amp,
                field: None,
            },
        );
        let plans = FcPlans {
            forward,
            backward,
            weight_update,
            joint: true,
        };
        let key = (
            big_f.max(big_b).max(big_w),
            plans.planned_cycles(),
            forward.tiles(),
        );
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, plans));
        }
    }
    // A batch-1 layer can also be planned on horizontal MACs, as poplin's joint planner may
    // (its candidates in `lib/poplin/ConvVertexType.cpp`): the forward and input gradient on
    // HMAC vertices over input-channel groups of `g`, the weight update on outer products.
    // Joint plans do not split the batch (`outChanSplit.parallel` is 1, `ConvModel.cpp`) and
    // split the other two dimensions in whole groups (the field grain is `g`).
    if batch == 1 {
        hmac_joints(cfg, opts, [input, output], dtype, tiles, &mut best);
    }
    match best {
        Some(((0, cycles, _), joint)) if cycles <= separate_cycles => joint,
        _ => separate,
    }
}

/// The best joint plan so far, a key (bound level, cycles, tiles) with its plans.
type BestFc = Option<((BoundLevel, u64, u64), FcPlans)>;

/// Batch-1 joint plans on horizontal MACs ([`hmac_joint`]) of a layer of `input` x `output`
/// on up to `tiles` tiles, over every group size and whole-group split: `best` becomes the
/// best of them when it beats it.
fn hmac_joints(
    cfg: &IpuConfig,
    opts: PlanOptions,
    [input, output]: [u64; 2],
    dtype: DType,
    tiles: u64,
    best: &mut BestFc,
) {
    for (g, cs, fs) in hmac_grids(cfg, opts, [input, output], dtype, tiles) {
        let plans = hmac_joint(cfg, opts, [input, output], g, cs, fs, dtype);
        let key = (plans.0, plans.1.planned_cycles(), cs * fs);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            *best = Some((key, plans.1));
        }
    }
}

/// Every HMAC group `g` [`hmac_groups`] allows a `k -> n` product, with the splits of `k`
/// (`cs` ways) and `n` (`fs` ways) in whole groups on up to `tiles` tiles.
fn hmac_grids(
    cfg: &IpuConfig,
    opts: PlanOptions,
    [k, n]: [u64; 2],
    dtype: DType,
    tiles: u64,
) -> impl Iterator<Item = (u64, u64, u64)> {
    let units = cost::amp_conv_units_with(cfg, dtype, opts.partials.of(dtype));
    let divisors = |x: u64| (1..=x).filter(move |d| x % d == 0);
    hmac_groups(k, n, dtype, units).flat_map(move |g| {
        divisors(k / g).flat_map(move |cs| {
            divisors(n / g)
                .take_while(move |&fs| cs * fs <= tiles)
                .map(move |fs| (g, cs, fs))
        })
    })
}

/// The plans of a one-row product `[1, k] x [k, n]` on horizontal MACs: every group
/// [`hmac_groups`] allows, `k` split `cs` ways and `n` `fs` ways in whole groups on up to
/// `tiles` tiles, each with its bound level.
pub(super) fn hmac_products(
    cfg: &IpuConfig,
    opts: PlanOptions,
    [k, n]: [u64; 2],
    dtype: DType,
    laid_out: LaidOut,
    tiles: u64,
) -> Vec<(BoundLevel, MatMulPlan)> {
    hmac_grids(cfg, opts, [k, n], dtype, tiles)
        .map(|(g, cs, fs)| {
            price(
                cfg,
                opts,
                [1, k, n],
                [1, cs, fs],
                dtype,
                hmac_pass(laid_out, GridOrder::Standard, g),
            )
        })
        .collect()
}

/// A pass on horizontal MACs in groups of `g`, swapped (the row is the output channel).
fn hmac_pass(laid_out: LaidOut, order: GridOrder, g: u64) -> Pass {
    Pass {
        laid_out,
        orientation: Orientation::Swapped,
        order,
        method: Method::Hmac { group: g },
        field: None,
    }
}

/// The HMAC groups poplin's planner may give a batch-1 layer of `input -> output`
/// (`getConvVertexHMACCandidates`, `lib/poplin/ConvVertexType.cpp`): fp32 takes groups of 1
/// and multiples of 4; fp16 groups are even (activations go over the exchange in pairs) and,
/// as the forward pass's input channels are the weight update's output channels, multiples of
/// the AMP's conv `units` for the types. Here only groups dividing both sizes (poplin pads the
/// others, at a cost Tessera does not model).
fn hmac_groups(input: u64, output: u64, dtype: DType, units: u64) -> impl Iterator<Item = u64> {
    let allowed = move |g: u64| {
        if dtype == DType::F16 {
            g % units.max(2) == 0 && g % 2 == 0
        } else {
            g == 1 || g % 4 == 0
        }
    };
    (1..=input.min(output)).filter(move |&g| allowed(g) && input % g == 0 && output % g == 0)
}

/// The joint HMAC plan of a batch-1 layer `input -> output` in groups of `g`, the input split
/// `cs` ways and the output `fs` ways: its bound level and plans.
fn hmac_joint(
    cfg: &IpuConfig,
    opts: PlanOptions,
    [input, output]: [u64; 2],
    g: u64,
    cs: u64,
    fs: u64,
    dtype: DType,
) -> (BoundLevel, FcPlans) {
    let (lf, forward) = price(
        cfg,
        opts,
        [1, input, output],
        [1, cs, fs],
        dtype,
        hmac_pass(LaidOut::B, GridOrder::Standard, g),
    );
    let (lb, backward) = price(
        cfg,
        opts,
        [1, output, input],
        [1, fs, cs],
        dtype,
        hmac_pass(LaidOut::B, GridOrder::FcBackward, g),
    );
    let (lw, weight_update) = price(
        cfg,
        opts,
        [input, 1, output],
        [cs, 1, fs],
        dtype,
        Pass {
            laid_out: LaidOut::NONE,
            orientation: Orientation::Swapped,
            order: GridOrder::FcWeightUpdate,
            method: Method::OuterProduct { group: g },
            field: None,
        },
    );
    (
        lf.max(lb).max(lw),
        FcPlans {
            forward,
            backward,
            weight_update,
            joint: true,
        },
    )
}
