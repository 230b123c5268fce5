//! Properties of the lowering on random small graphs: the checker accepts every program the
//! lowering makes; removing any exchange makes it reject the program; an accepted program's
//! tiles never exceed their SRAM; the estimate-only path equals the full one; the engine's
//! numerics equal the core's.
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use crate::common;

use common::{build, steps};
use proptest::prelude::*;
use tessera::core::schedule::Schedule;
use tessera::core::Plan;
use tessera::sim::check::{check, CheckError};
use tessera::sim::lower::{lower, LowerOptions};
use tessera::sim::program::{Step, TileId};
use tessera::sim::runner::PipelineRunner;
use tessera::sim::{estimate, estimate_only, IpuConfig, IpuEstimateOptions, Preset, SimError};

/// A small machine so random graphs spread over several tiles and sometimes overflow them.
fn small_ipu(tiles: u32, sram: u64) -> IpuConfig {
    IpuConfig::preset(Preset::Mk2)
        .with_tiles(tiles)
        .with_sram_bytes_per_tile(sram)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn lowered_programs_check_and_every_exchange_is_needed(
        rows in 1usize..6, cols in 1usize..40, s in steps(), train in any::<bool>(),
        tiles in 1u32..24, chunk in prop_oneof![Just(4u64), Just(16), Just(128)], offload in any::<bool>(),
    ) {
        let Some(g) = build(rows, cols, &s, train) else { return Ok(()) };
        let plan = Plan::new(&g).unwrap();
        let cfg = small_ipu(tiles, 1 << 20);
        let program = lower(&plan, &cfg, LowerOptions { min_chunk_bytes: chunk, offload_optimizer_state: offload, ..LowerOptions::default() });
        prop_assert_eq!(check(&program), Ok(()));
        for (i, step) in program.steps.iter().enumerate() {
            if matches!(step, Step::Exchange { .. }) {
                let mut broken = program.clone();
                broken.steps.remove(i);
                let err = check(&broken);
                prop_assert!(matches!(err, Err(CheckError::NotResident { .. })), "removing exchange {} was accepted: {:?}", i, err);
            }
        }
    }

    #[test]
    fn accepted_programs_fit_and_rejected_ones_do_not(
        rows in 1usize..6, cols in 1usize..40, s in steps(), train in any::<bool>(),
        tiles in 1u32..16, sram in 2_000u64..20_000,
    ) {
        let Some(g) = build(rows, cols, &s, train) else { return Ok(()) };
        let plan = Plan::new(&g).unwrap();
        let cfg = small_ipu(tiles, sram);
        let opts = IpuEstimateOptions { allow_out_of_memory: true, ..Default::default() };
        let (_, e) = estimate(&plan, &cfg, &opts).unwrap();
        let worst = e.ipus[0].tiles.iter().map(|t| t.total()).max().unwrap();
        prop_assert_eq!(worst, e.ipus[0].max_tile_bytes);
        prop_assert_eq!(e.fits, worst <= sram);
        match estimate(&plan, &cfg, &IpuEstimateOptions::default()) {
            Ok((_, e)) => prop_assert!(e.ipus[0].tiles.iter().all(|t| t.total() <= sram)),
            Err(SimError::OutOfMemory(oom)) => {
                prop_assert!(!e.fits);
                prop_assert!(oom.needed > sram && oom.available == sram);
                prop_assert_eq!(oom.needed, worst);
            }
            Err(other) => prop_assert!(false, "unexpected error {}", other),
        }
    }

    /// The estimate-only path (exchanges kept as summaries, no transfers) gives exactly the
    /// estimate of the full lowering, fitting or not; also after an estimate of another graph
    /// on the same machine, whose recorded lowerings it may replay.
    #[test]
    fn estimate_only_equals_the_full_estimate(
        rows in 1usize..6, cols in 1usize..40, s in steps(), train in any::<bool>(),
        tiles in 1u32..24, sram in 2_000u64..200_000, inference in any::<bool>(),
        chunk in prop_oneof![Just(4u64), Just(16), Just(128)], offload in any::<bool>(),
        before in steps(), before_rows in 1usize..6,
    ) {
        let Some(g) = build(rows, cols, &s, train) else { return Ok(()) };
        let plan = Plan::new(&g).unwrap();
        let cfg = small_ipu(tiles, sram);
        let opts = IpuEstimateOptions {
            allow_out_of_memory: true,
            inference,
            lower: LowerOptions { min_chunk_bytes: chunk, offload_optimizer_state: offload, ..LowerOptions::default() },
            ..Default::default()
        };
        if let Some(other) = build(before_rows, cols, &before, train) {
            estimate_only(&Plan::new(&other).unwrap(), &cfg, &opts).unwrap();
        }
        let (_, full) = estimate(&plan, &cfg, &opts).unwrap();
        let fast = estimate_only(&plan, &cfg, &opts).unwrap();
        prop_assert_eq!(full, fast);
    }

    #[test]
    fn one_stage_runner_numerics_equal_the_core(rows in 1usize..5, cols in 1usize..20, s in steps(), tiles in 1u32..12) {
        let Some(g) = build(rows, cols, &s, true) else { return Ok(()) };
        let plan = Plan::new(&g).unwrap();
        let cfg = small_ipu(tiles, 1 << 20);
        estimate(&plan, &cfg, &IpuEstimateOptions::default()).unwrap();
        let mut engine = PipelineRunner::new(plan.clone(), Schedule::Sequential, 1).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, 3).unwrap();
        engine.init_state(3).unwrap();
        let n = rows * cols;
        let f = |i: usize| (i as f32 * 0.61).cos();
        plan.fill_input("x", &mut arena, n, f).unwrap();
        for _ in 0..2 {
            plan.train_step(&mut arena, &mut state).unwrap();
            engine.run_update(|_, _, plan, arena| plan.fill_input("x", arena, n, f)).unwrap();
        }
        prop_assert_eq!(engine.state(0), &state[..]);
    }
}

#[test]
fn deliberately_broken_programs_are_rejected() {
    use tessera::core::{DType, Graph};
    use tessera::sim::Heap;
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[64, 64], DType::F32).unwrap();
    let w = g
        .variable(
            "w",
            &[64, 64],
            DType::F32,
            tessera::core::Init::GlorotUniform,
        )
        .unwrap();
    let y = g.matmul("y", x, w).unwrap();
    g.mark_output(y).unwrap();
    let plan = Plan::new(&g).unwrap();
    let cfg = small_ipu(32, 1 << 20);
    let program = lower(&plan, &cfg, LowerOptions::default());
    assert_eq!(check(&program), Ok(()));

    // A missing exchange: the vertex names its tile and the tensor it cannot see.
    let i = program
        .steps
        .iter()
        .position(|s| matches!(s, Step::Exchange { .. }))
        .expect("the matmul needs an exchange");
    let mut missing = program.clone();
    missing.steps.remove(i);
    let err = check(&missing).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("missing exchange") && msg.contains("tile"),
        "{msg}"
    );

    // A vertex writing another tile's data.
    let mut stray = program.clone();
    let cs = stray.steps.iter_mut().find_map(|s| match s {
        Step::Compute(cs) => Some(cs),
        _ => None,
    });
    let v = &mut cs.unwrap().vertices[0];
    v.tile = TileId((v.tile.0 + 1) % 32);
    assert!(matches!(
        check(&stray),
        Err(CheckError::WriteNotLocal { .. }) | Err(CheckError::NotResident { .. })
    ));

    // An over-full tile: the same graph on a machine with tiny tiles.
    let tiny = small_ipu(4, 8 * 1024);
    match estimate(&plan, &tiny, &IpuEstimateOptions::default()) {
        Err(SimError::OutOfMemory(oom)) => {
            assert!(oom.needed > 8 * 1024);
            assert!(oom.to_string().contains(&format!("tile {}", oom.tile)));
        }
        other => panic!(
            "expected out of memory, got {:?}",
            other.map(|(_, e)| e.fits)
        ),
    }

    // A mapping that leaves elements unmapped.
    let mut hole = program.clone();
    hole.tensors[0].elements += 1;
    assert!(matches!(check(&hole), Err(CheckError::BadMapping { .. })));
}
