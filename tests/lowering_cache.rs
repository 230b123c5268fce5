//! The lowering cache sweeps turn on: estimates with it equal estimates without it, for any
//! sequence of configurations (graphs differing in M, stages, optimizer, type and size;
//! schedules, replicas, offload, recomputation, machines), and it reuses programs.
//!
//! The cache is the process's, so this file holds the one test that turns it on and off.

use proptest::prelude::*;
use tessera::core::models::{bert, Bert};
use tessera::core::schedule::Schedule;
use tessera::core::{Accumulation, DType, Graph, Optimizer, Plan};
use tessera::sim::cache::{lowering_cache_stats, set_lowering_cache};
use tessera::sim::system::{estimate_system, SystemOptions};
use tessera::sim::techniques::{Offload, Recompute, Techniques};
use tessera::sim::{Heap, IpuConfig, Preset};

#[derive(Clone, Debug)]
struct Case {
    m: u32,
    stages: usize,
    adam: bool,
    f16: bool,
    hidden: usize,
    schedule: Schedule,
    replicas: usize,
    offload: bool,
    recompute: bool,
    mk1: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(1u32), Just(2), Just(4)],
        1usize..=2,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(16usize), Just(32)],
        prop_oneof![
            Just(Schedule::Grouped),
            Just(Schedule::Interleaved),
            Just(Schedule::Sequential)
        ],
        1usize..=2,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(m, stages, adam, f16, hidden, schedule, replicas, offload, recompute, mk1)| Case {
                m,
                stages,
                adam,
                f16,
                hidden,
                schedule,
                replicas,
                offload,
                recompute,
                mk1,
            },
        )
}

/// The estimate of `c`, as JSON (errors too: a schedule M does not fill is one).
fn estimate(c: &Case) -> String {
    let cfg = Bert {
        layers: 2,
        hidden: c.hidden,
        heads: 4,
        intermediate: 2 * c.hidden,
        sequence: 8,
        batch: 2,
        vocabulary: 24,
        stages: c.stages,
    };
    let mut g: Graph<Heap> = Graph::new();
    let dtype = if c.f16 { DType::F16 } else { DType::F32 };
    let n = bert(&mut g, &cfg, dtype).unwrap();
    let opt = if c.adam {
        Optimizer::adam(1e-3)
    } else {
        Optimizer::momentum(0.1, 0.9)
    };
    g.differentiate_accumulating(n.loss, opt, Accumulation::new(c.m))
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let machine = IpuConfig::preset(if c.mk1 { Preset::Mk1 } else { Preset::Mk2 }).with_tiles(64);
    let opts = SystemOptions {
        schedule: c.schedule,
        replicas: c.replicas,
        micro_batch: cfg.batch as u64,
        techniques: Techniques {
            recompute: Recompute {
                stages: c.recompute,
                checkpoints: None,
            },
            offload: Offload {
                optimizer_state: c.offload,
                ..Offload::default()
            },
            ..Techniques::default()
        },
        min_chunk_bytes: 16,
        allow_out_of_memory: true,
        ..SystemOptions::default()
    };
    match estimate_system(&plan, &machine, &opts) {
        Ok(e) => serde_json::to_string(&e).unwrap(),
        Err(e) => format!("error: {e}"),
    }
}

/// `c` with field `f` changed: sweeps' neighbouring configurations differ in one thing.
fn changed(c: &Case, f: usize) -> Case {
    let mut c = c.clone();
    match f {
        0 => c.m = if c.m == 1 { 2 } else { c.m / 2 },
        1 => c.stages = 3 - c.stages,
        2 => c.adam = !c.adam,
        3 => c.f16 = !c.f16,
        4 => c.hidden = 48 - c.hidden,
        5 => {
            c.schedule = match c.schedule {
                Schedule::Grouped => Schedule::Interleaved,
                Schedule::Interleaved => Schedule::Sequential,
                _ => Schedule::Grouped,
            }
        }
        6 => c.replicas = 3 - c.replicas,
        7 => c.offload = !c.offload,
        8 => c.recompute = !c.recompute,
        _ => c.mk1 = !c.mk1,
    }
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn estimates_with_the_cache_equal_estimates_without(
        base in case(),
        fields in prop::collection::vec(0usize..10, 1..5),
    ) {
        let mut cases = vec![base.clone()];
        cases.extend(fields.iter().map(|&f| changed(&base, f)));
        set_lowering_cache(0);
        let fresh: Vec<String> = cases.iter().map(estimate).collect();
        set_lowering_cache(16);
        // Twice over: the second pass finds what the first lowered.
        for _ in 0..2 {
            let cached: Vec<String> = cases.iter().map(estimate).collect();
            prop_assert_eq!(&cached, &fresh);
        }
        let (hits, misses) = lowering_cache_stats();
        // (A configuration the schedule refuses is refused before lowering.)
        prop_assert!(misses > 0 || fresh.iter().all(|f| f.starts_with("error")));
        prop_assert!(hits >= misses, "hits {} misses {}", hits, misses);
        set_lowering_cache(0);
    }
}
