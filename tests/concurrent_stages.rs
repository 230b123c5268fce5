//! Concurrent pipeline stages: two stages at one position on different IPUs receive the same
//! input, run in the same slots, and the next stage receives their outputs concatenated.
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use crate::common;

use common::weights;

use tessera::core::schedule::{overlap_length, Schedule};
use tessera::core::{Accumulation, Activation, DType, Graph, Optimizer, Plan};
use tessera::sim::runner::PipelineRunner;
use tessera::sim::system::{estimate_system, SystemError, SystemOptions};
use tessera::sim::Heap;
use tessera::sim::{IpuConfig, Preset};

fn plan(m: u32) -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let h = g
        .dense("Dense_a", x, 4, Activation::Tanh, DType::F32)
        .unwrap();
    g.set_stage(1).unwrap();
    let b1 = g
        .dense("Dense_b1", h, 3, Activation::Tanh, DType::F32)
        .unwrap();
    g.set_stage(2).unwrap();
    let b2 = g
        .dense("Dense_b2", h, 2, Activation::Tanh, DType::F32)
        .unwrap();
    g.set_stage(3).unwrap();
    let both = g.concat("Concat", b1, b2).unwrap();
    let y = g
        .dense("Dense_out", both, 3, Activation::Softmax, DType::F32)
        .unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, false)
        .unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.2), Accumulation::new(m))
        .unwrap();
    Plan::new(&g).unwrap()
}

const POSITIONS: [usize; 4] = [0, 1, 1, 2];

fn feed(
    u: usize,
) -> impl FnMut(usize, usize, &Plan<Heap>, &mut [u8]) -> Result<(), tessera::core::RunError> {
    move |_, b, plan, arena| {
        let k = (u * 16 + b) as f32;
        plan.write_input(
            "x",
            arena,
            &[k.sin(), k.cos(), 0.5, (2.0 * k).sin(), 0.1, -0.3],
        )?;
        plan.write_input(
            "labels",
            arena,
            &[(u + b) as f32 % 3.0, (u + 2 * b) as f32 % 3.0],
        )
    }
}

#[test]
fn concurrent_stages_train_like_plain_accumulation() {
    for schedule in [
        Schedule::Grouped,
        Schedule::Interleaved,
        Schedule::Sequential,
    ] {
        let m = overlap_length(schedule, 3, true) as u32;
        let p = plan(m);
        let mut runner =
            PipelineRunner::with_positions(p.clone(), schedule, 1, Some(&POSITIONS)).unwrap();
        runner.init_state(4).unwrap();
        let mut arena = vec![0u8; p.arena_bytes()];
        let mut state = vec![0u8; p.state_bytes()];
        p.init_state(&mut state, 4).unwrap();
        for u in 0..3 {
            runner.run_update(feed(u)).unwrap();
            let mut f = feed(u);
            for b in 0..m as usize {
                f(0, b, &p, &mut arena).unwrap();
                p.train_step(&mut arena, &mut state).unwrap();
            }
        }
        let (a, b) = (weights(&p, runner.state(0)), weights(&p, &state));
        assert_eq!(a, b, "{schedule}");
        assert_ne!(
            a,
            weights(&p, &{
                let mut s = vec![0u8; p.state_bytes()];
                p.init_state(&mut s, 4).unwrap();
                s
            })
        );
    }
}

#[test]
fn concurrent_stages_share_slots_on_their_own_ipus() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let p = plan(6);
    let opts = SystemOptions {
        stage_positions: Some(POSITIONS.to_vec()),
        device_mapping: Some(vec![0, 1, 2, 3]),
        ..Default::default()
    };
    let e = estimate_system(&p, &mk2, &opts).unwrap();
    assert_eq!(e.ipus.len(), 4);
    assert_eq!(e.ipus_total, 4);
    assert_eq!((e.stages[1].position, e.stages[2].position), (1, 1));
    assert_eq!(e.stages[1].stash_depth, e.stages[2].stash_depth);
    // Stages 1 and 2 run the same micro-batch in the same step, on IPUs 1 and 2.
    for r in e.runs.iter().filter(|r| r.stage == 1) {
        assert!(e.runs.iter().any(|o| o.stage == 2
            && o.step == r.step
            && o.micro_batch == r.micro_batch
            && o.backward == r.backward
            && o.ipu == 2));
    }

    let clash = SystemOptions {
        stage_positions: Some(POSITIONS.to_vec()),
        device_mapping: Some(vec![0, 1, 1, 2]),
        ..Default::default()
    };
    let err = estimate_system(&p, &mk2, &clash).unwrap_err();
    assert!(matches!(err, SystemError::Positions { .. }), "{err}");
    assert!(
        err.to_string().contains("concurrent stages 1 and 2"),
        "{err}"
    );
    let hole = SystemOptions {
        stage_positions: Some(vec![0, 2, 2, 3]),
        ..Default::default()
    };
    assert!(estimate_system(&p, &mk2, &hole)
        .unwrap_err()
        .to_string()
        .contains("position 1 has no stage"));
}
