//! The seeds' classifier on one Mk2 IPU: lowers, fits, trains with the core's numerics, and
//! reports memory and cycles; an oversized batch is a typed out-of-memory error naming a tile.
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use tessera::core::models::mnist_mlp;
use tessera::core::schedule::Schedule;
use tessera::core::{DType, Graph, Optimizer, Plan};
use tessera::sim::runner::PipelineRunner;
use tessera::sim::Heap;
use tessera::sim::{estimate, IpuConfig, IpuEstimateOptions, Preset, SimError};

fn training_plan(batch: usize, dtype: DType) -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let m = mnist_mlp(&mut g, batch, dtype).unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
        .unwrap();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    Plan::new(&g).unwrap()
}

#[test]
fn classifier_trains_on_one_mk2_with_the_cores_numerics() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    for dtype in [DType::F32, DType::F16] {
        let plan = training_plan(32, dtype);
        let opts = IpuEstimateOptions {
            batch_size: 32,
            ..Default::default()
        };
        let (_, est) = estimate(&plan, &mk2, &opts).unwrap();
        // One stage on one IPU: the runner executes the plan in order, updates included.
        let mut engine = PipelineRunner::new(plan.clone(), Schedule::Sequential, 1).unwrap();
        assert!(est.fits);
        let ipu = &est.ipus[0];
        eprintln!(
            "{dtype}: {} vertices, {} compute sets; cycles {} (compute {}, exchange {}, sync {}, host {}); {:.1} us/step, {:.0} samples/s; memory {} B over {} tiles, fullest tile {} B",
            est.vertices,
            est.compute_sets,
            est.cycles_per_step,
            est.cycles.compute,
            est.cycles.exchange,
            est.cycles.sync,
            est.cycles.host_streams,
            est.seconds_per_step * 1e6,
            est.samples_per_second,
            ipu.bytes_used,
            ipu.tiles_used,
            ipu.max_tile_bytes
        );
        assert!(
            est.cycles.compute > 0
                && est.cycles.exchange > 0
                && est.cycles.sync > 0
                && est.cycles.host_streams > 0
        );
        assert!(ipu.categories.always_live >= plan.state_bytes() as u64 - 64 * 16);

        // Numerics: the engine's step equals the core's step on the same data.
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, 5).unwrap();
        engine.init_state(5).unwrap();
        let img = |i: usize| ((i * 37) % 101) as f32 / 101.0;
        let lab = |i: usize| (i % 10) as f32;
        plan.fill_input("images", &mut arena, 32 * 784, img)
            .unwrap();
        plan.fill_input("labels", &mut arena, 32, lab).unwrap();
        for _ in 0..3 {
            plan.train_step(&mut arena, &mut state).unwrap();
            engine
                .run_update(|_, _, plan, arena| {
                    plan.fill_input("images", arena, 32 * 784, img)?;
                    plan.fill_input("labels", arena, 32, lab)
                })
                .unwrap();
            let core_loss = plan.tensor("loss", &arena, &state).unwrap().get(0);
            let sim_loss = plan
                .tensor("loss", engine.arena(0, 0), engine.state(0))
                .unwrap()
                .get(0);
            assert!(
                (core_loss - sim_loss).abs() <= 1e-5 * core_loss.abs(),
                "{core_loss} vs {sim_loss}"
            );
        }
        assert_eq!(engine.state(0), &state[..]);
    }
}

#[test]
fn an_oversized_batch_is_out_of_memory_naming_the_tile() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    // The images alone (300,000 x 784 x 4 bytes) exceed the IPU's 900 MB of SRAM.
    let plan = training_plan(300_000, DType::F32);
    let opts = IpuEstimateOptions {
        batch_size: 300_000,
        ..Default::default()
    };
    match estimate(&plan, &mk2, &opts) {
        Err(SimError::OutOfMemory(oom)) => {
            let msg = oom.to_string();
            eprintln!("{msg}");
            assert!(
                msg.starts_with(&format!("out of memory: tile {} needs", oom.tile)),
                "{msg}"
            );
            assert!(oom.needed > oom.available);
            assert!(!oom.largest_tensors.is_empty());
            // The exchanges named account for the tile's receive buffers.
            let received: u64 = oom.receiving.iter().map(|r| r.1).sum();
            assert_eq!(received, oom.memory.exchange_buffers, "{msg}");
        }
        other => panic!(
            "expected out of memory, got {:?}",
            other.map(|(_, e)| e.fits)
        ),
    }
    // On request, the estimate is still produced, saying it does not fit.
    let (_, est) = estimate(
        &plan,
        &mk2,
        &IpuEstimateOptions {
            allow_out_of_memory: true,
            ..opts
        },
    )
    .unwrap();
    assert!(!est.fits);
    assert!(est.out_of_memory.is_some());
    assert!(est.ipus[0].max_tile_bytes > mk2.sram_bytes_per_tile);
}
