//! Pipelined training in schedule order gives the weights of plain gradient accumulation, and
//! N replicas of per-replica batch b give the weights of one replica with batch N*b.
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use crate::common;

use common::{close, weights};

use proptest::prelude::*;
use tessera::core::schedule::{overlap_length, Schedule};
use tessera::core::{
    Accumulation, AccumulationMethod, Activation, DType, Graph, NodeId, Optimizer, Plan,
};
use tessera::sim::runner::PipelineRunner;
use tessera::sim::Heap;

#[derive(Clone, Debug)]
struct Case {
    widths: Vec<usize>,
    stages: usize,
    schedule: Schedule,
    m: u32,
    updates: usize,
    batch: usize,
    method: AccumulationMethod,
    momentum: bool,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    let sch = prop_oneof![
        Just(Schedule::Grouped),
        Just(Schedule::Interleaved),
        Just(Schedule::Sequential)
    ];
    let method = prop_oneof![
        Just(AccumulationMethod::Sum),
        Just(AccumulationMethod::Mean),
        Just(AccumulationMethod::RunningMean)
    ];
    (
        prop::collection::vec(1usize..6, 1..=4),
        sch,
        1usize..=2,
        1usize..=3,
        1usize..=3,
        method,
        any::<bool>(),
        any::<u64>(),
        1usize..=4,
    )
        .prop_map(
            |(widths, schedule, times, updates, batch, method, momentum, seed, s)| {
                let stages = s.min(widths.len());
                let m = (overlap_length(schedule, stages, true) * times) as u32;
                Case {
                    widths,
                    stages,
                    schedule,
                    m,
                    updates,
                    batch,
                    method,
                    momentum,
                    seed,
                }
            },
        )
}

fn build(c: &Case, batch: usize) -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[batch, 3], DType::F32).unwrap();
    let mut h = x;
    let layers = c.widths.len();
    for (l, &w) in c.widths.iter().enumerate() {
        g.set_stage(l * c.stages / layers).unwrap();
        h = g
            .dense(&format!("Dense_{l}"), h, w, Activation::Tanh, DType::F32)
            .unwrap();
    }
    train_head(g, c, h, batch)
}

/// The softmax layer on `h`, its loss, and `c`'s accumulating optimizer: the planned
/// training graph.
fn train_head(mut g: Graph<Heap>, c: &Case, h: NodeId, batch: usize) -> Plan<Heap> {
    let y = g
        .dense("Dense_out", h, 3, Activation::Softmax, DType::F32)
        .unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, false)
        .unwrap();
    let opt = if c.momentum {
        Optimizer::momentum(0.2, 0.9)
    } else {
        Optimizer::sgd(0.3)
    };
    g.differentiate_accumulating(
        loss,
        opt,
        Accumulation {
            count: c.m,
            method: c.method,
            dtype: None,
        },
    )
    .unwrap();
    Plan::new(&g).unwrap()
}

/// Sample i of the whole data set.
fn sample(seed: u64, i: usize) -> ([f32; 3], f32) {
    let h = |k: u64| ((((i as u64) * 0x9e37_79b9 + k) ^ seed) % 1000) as f32 / 500.0 - 1.0;
    ([h(1), h(2), h(3)], (((i as u64 * 7) ^ seed) % 3) as f32)
}

/// Feeds micro-batch `b` of update `u` for `replica` (of `replicas`), each micro-batch holding
/// `per_replica` samples per replica.
fn feeder(
    seed: u64,
    u: usize,
    m: usize,
    per_replica: usize,
    replicas: usize,
) -> impl FnMut(usize, usize, &Plan<Heap>, &mut [u8]) -> Result<(), tessera::core::RunError> {
    move |r, b, plan, arena| {
        let first = ((u * m + b) * replicas + r) * per_replica;
        plan.fill_input("x", arena, per_replica * 3, |i| {
            sample(seed, first + i / 3).0[i % 3]
        })?;
        plan.fill_input("labels", arena, per_replica, |i| sample(seed, first + i).1)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn schedules_match_plain_accumulation(c in case()) {
        let plan = build(&c, c.batch);
        let m = c.m as usize;
        let mut runner = PipelineRunner::new(plan.clone(), c.schedule, 1).unwrap();
        runner.init_state(c.seed).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, c.seed).unwrap();
        for u in 0..c.updates {
            runner.run_update(feeder(c.seed, u, m, c.batch, 1)).unwrap();
            let mut feed = feeder(c.seed, u, m, c.batch, 1);
            for b in 0..m {
                feed(0, b, &plan, &mut arena).unwrap();
                plan.train_step(&mut arena, &mut state).unwrap();
            }
        }
        close(&weights(&plan, runner.state(0)), &weights(&plan, &state))?;
        let depths: Vec<usize> = (0..c.stages).map(|k| runner.pipeline().stash_depth(k)).collect();
        prop_assert_eq!(runner.stash_observed(), &depths[..]);
    }

    #[test]
    fn two_replicas_match_one_with_twice_the_batch(c in case()) {
        let m = c.m as usize;
        let small = build(&c, c.batch);
        let big = build(&c, 2 * c.batch);
        let mut two = PipelineRunner::new(small, c.schedule, 2).unwrap();
        let mut one = PipelineRunner::new(big.clone(), c.schedule, 1).unwrap();
        two.init_state(c.seed).unwrap();
        one.init_state(c.seed).unwrap();
        for u in 0..c.updates {
            two.run_update(feeder(c.seed, u, m, c.batch, 2)).unwrap();
            one.run_update(feeder(c.seed, u, m, 2 * c.batch, 1)).unwrap();
        }
        let w2 = weights(two.plan(), two.state(0));
        prop_assert_eq!(&w2, &weights(two.plan(), two.state(1)), "replicas diverged");
        close(&w2, &weights(&big, one.state(0)))?;
    }
}

#[test]
fn stages_out_of_order_are_a_typed_error() {
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    g.set_stage(1).unwrap();
    let h = g.dense("D1", x, 4, Activation::Relu, DType::F32).unwrap();
    g.set_stage(0).unwrap();
    let y = g.dense("D2", h, 3, Activation::Linear, DType::F32).unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, true)
        .unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(4))
        .unwrap();
    let e = PipelineRunner::new(Plan::new(&g).unwrap(), Schedule::Grouped, 1)
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("stages must follow the order of the layers"),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn interleaved_activation_memory_is_at_most_grouped(c in case()) {
        use tessera::sim::system::{estimate_system, SystemOptions};
        use tessera::sim::{IpuConfig, Preset};
        // A count valid for both: a multiple of 2S.
        let c = Case { m: (2 * c.stages) as u32, ..c };
        let plan = build(&c, c.batch);
        let mut cfg = IpuConfig::preset(Preset::Mk2).with_tiles(16);
        cfg.sram_bytes_per_tile = 1 << 22;
        let est = |schedule| estimate_system(&plan, &cfg, &SystemOptions { schedule, micro_batch: c.batch as u64, ..Default::default() }).unwrap();
        let (g, i) = (est(Schedule::Grouped), est(Schedule::Interleaved));
        for (a, b) in i.ipus.iter().zip(&g.ipus) {
            prop_assert!(a.stash_bytes <= b.stash_bytes, "IPU {}: stash {} > {}", a.ipu, a.stash_bytes, b.stash_bytes);
            prop_assert!(a.max_tile_bytes <= b.max_tile_bytes);
        }
    }
}

/// A model whose first and last stages read one weight (as a tied embedding and decoder):
/// `x . W`, a dense layer per middle stage, `. W^T`, a softmax layer.
fn build_tied(c: &Case, stages: usize) -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[c.batch, 3], DType::F32).unwrap();
    let w = g
        .variable("W", &[3, 4], DType::F32, tessera::core::Init::GlorotUniform)
        .unwrap();
    let h = g.matmul("embed", x, w).unwrap();
    let mut h = g.tanh("embed_act", h).unwrap();
    for k in 1..c.stages.max(2) {
        g.set_stage(if stages == 1 { 0 } else { k - 1 }).unwrap();
        h = g
            .dense(&format!("Dense_{k}"), h, 4, Activation::Tanh, DType::F32)
            .unwrap();
    }
    g.set_stage(stages - 1).unwrap();
    let t = g.matmul_t("decode", h, w, false, true).unwrap();
    train_head(g, c, t, c.batch)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A weight read by two stages gets one accumulator, each stage adding its own partial
    /// gradient as its backward pass ends; in any schedule the weights are those of the same
    /// model in one stage.
    #[test]
    fn tied_weights_across_stages_match_one_stage(c in case()) {
        let stages = c.stages.max(2);
        // Interleaved training keeps one stage per IPU, so a stage pair sharing a weight is
        // for the other schedules.
        let schedule = if c.schedule == Schedule::Interleaved { Schedule::Grouped } else { c.schedule };
        let m = overlap_length(schedule, stages, true) as u32;
        let c = Case { stages, schedule, m, ..c };
        let piped = build_tied(&c, stages);
        let g = piped.graph();
        let accs: Vec<_> = g.ids().filter(|&id| g.node(id).name().starts_with("W/accumulate")).collect();
        prop_assert_eq!(accs.len(), 2, "one accumulate op per reading stage");
        let stages_of: Vec<usize> = accs.iter().map(|&a| g.node(a).stage()).collect();
        prop_assert_eq!(stages_of, vec![stages - 1, 0]);
        let n_acc = g.ids().filter(|&id| g.node(id).name() == "W/accumulator").count();
        prop_assert_eq!(n_acc, 1);

        let one = build_tied(&c, 1);
        let mut runner = PipelineRunner::new(piped.clone(), c.schedule, 1).unwrap();
        runner.init_state(c.seed).unwrap();
        let mut arena = vec![0u8; one.arena_bytes()];
        let mut state = vec![0u8; one.state_bytes()];
        one.init_state(&mut state, c.seed).unwrap();
        let mm = c.m as usize;
        for u in 0..c.updates {
            runner.run_update(feeder(c.seed, u, mm, c.batch, 1)).unwrap();
            let mut feed = feeder(c.seed, u, mm, c.batch, 1);
            for b in 0..mm {
                feed(0, b, &one, &mut arena).unwrap();
                one.train_step(&mut arena, &mut state).unwrap();
            }
        }
        close(&weights(&piped, runner.state(0)), &weights(&one, &state))?;
    }
}
