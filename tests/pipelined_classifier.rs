//! The pipelined classifier (stages [0, 0, 1, 1] over two Mk2 IPUs, M = 4 and 16) under all
//! three schedules; momentum with optimizer-state offload uses less SRAM and more weight-update
//! cycles than without.
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use tessera::core::models::mnist_mlp_pipelined;
use tessera::core::schedule::Schedule;
use tessera::core::{Accumulation, DType, Graph, Optimizer, Plan};
use tessera::sim::system::{estimate_system, SystemError, SystemOptions};
use tessera::sim::techniques::{Offload, Recompute, Techniques};
use tessera::sim::Heap;
use tessera::sim::{IpuConfig, Preset};

fn plan(m: u32, opt: Optimizer) -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let model = mnist_mlp_pipelined(&mut g, 32, DType::F32, [0, 0, 1, 1]).unwrap();
    let labels = g.input("labels", &[32], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", model.probabilities, labels, false)
        .unwrap();
    g.differentiate_accumulating(loss, opt, Accumulation::new(m))
        .unwrap();
    Plan::new(&g).unwrap()
}

#[test]
fn pipelined_classifier_under_every_schedule() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    eprintln!("| M | schedule | cycles / update | cycles / micro-batch | IPU0 bytes | IPU1 bytes | idle IPU0 | idle IPU1 | stash depth s0 |");
    for m in [4u32, 16] {
        let p = plan(m, Optimizer::sgd(0.1));
        let mut grouped_stash = None;
        for schedule in [
            Schedule::Grouped,
            Schedule::Interleaved,
            Schedule::Sequential,
        ] {
            let opts = SystemOptions {
                schedule,
                micro_batch: 32,
                ..Default::default()
            };
            let e = estimate_system(&p, &mk2, &opts).unwrap();
            assert!(e.fits);
            assert_eq!(e.stages.len(), 2);
            eprintln!(
                "| {m} | {schedule} | {} | {} | {} | {} | {:.3} | {:.3} | {} |",
                e.cycles_per_weight_update,
                e.cycles_per_weight_update / u64::from(m),
                e.ipus[0].bytes_used,
                e.ipus[1].bytes_used,
                e.ipus[0].idle_fraction,
                e.ipus[1].idle_fraction,
                e.stages[0].stash_depth
            );
            match schedule {
                Schedule::Grouped => grouped_stash = Some(e.ipus[0].stash_bytes),
                Schedule::Interleaved => assert!(e.ipus[0].stash_bytes <= grouped_stash.unwrap()),
                Schedule::Sequential => assert_eq!(e.ipus[0].stash_bytes, 0),
            }
        }
    }
}

#[test]
fn offloading_momentum_on_the_pipeline() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let p = plan(4, Optimizer::momentum(0.1, 0.9));
    let off = estimate_system(
        &p,
        &mk2,
        &SystemOptions {
            micro_batch: 32,
            ..Default::default()
        },
    )
    .unwrap();
    let on_opts = SystemOptions {
        micro_batch: 32,
        techniques: Techniques {
            offload: Offload {
                optimizer_state: true,
                ..Offload::default()
            },
            ..Techniques::default()
        },
        ..Default::default()
    };
    let on = estimate_system(&p, &mk2, &on_opts).unwrap();
    let sram =
        |e: &tessera::sim::system::SystemEstimate| e.ipus.iter().map(|i| i.bytes_used).sum::<u64>();
    eprintln!(
        "offload: SRAM {} -> {} B, weight update {} -> {} cycles, streaming memory {} B",
        sram(&off),
        sram(&on),
        off.weight_update_cycles,
        on.weight_update_cycles,
        on.ipus
            .iter()
            .map(|i| i.streaming_memory_bytes)
            .sum::<u64>()
    );
    assert!(sram(&on) < sram(&off));
    assert!(on.weight_update_cycles > off.weight_update_cycles);
}

#[test]
fn invalid_configurations_are_typed_errors() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    // M = 2 is not a multiple of 2S = 4 for Grouped.
    let p = plan(2, Optimizer::sgd(0.1));
    let e = estimate_system(&p, &mk2, &SystemOptions::default()).unwrap_err();
    assert!(matches!(e, SystemError::Schedule(_)), "{e}");
    assert!(e.to_string().contains("multiple of 4"), "{e}");
    // Interleaved training with both stages on one IPU.
    let p = plan(4, Optimizer::sgd(0.1));
    let opts = SystemOptions {
        schedule: Schedule::Interleaved,
        device_mapping: Some(vec![0, 0]),
        ..Default::default()
    };
    assert!(matches!(
        estimate_system(&p, &mk2, &opts),
        Err(SystemError::Schedule(_))
    ));
    let opts = SystemOptions {
        replicas: 0,
        ..Default::default()
    };
    assert!(matches!(
        estimate_system(&p, &mk2, &opts),
        Err(SystemError::NoReplicas)
    ));
}

#[test]
fn on_device_loops_take_k_or_r() {
    use tessera::sim::system::loop_repeat;
    assert_eq!(loop_repeat(None, None, 4).unwrap(), 1);
    assert_eq!(loop_repeat(Some(16), None, 4).unwrap(), 4);
    assert_eq!(loop_repeat(None, Some(3), 4).unwrap(), 3);
    assert_eq!(loop_repeat(Some(12), Some(3), 4).unwrap(), 3);
    let e = loop_repeat(Some(10), None, 4).unwrap_err();
    assert_eq!(
        e.to_string(),
        "steps_per_execution 10 must be a positive multiple of the gradient accumulation count 4"
    );
    assert!(loop_repeat(Some(12), Some(2), 4).is_err());
    assert!(loop_repeat(Some(0), None, 4).is_err());
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let p = plan(4, Optimizer::sgd(0.1));
    let e = estimate_system(
        &p,
        &mk2,
        &SystemOptions {
            repeat_count: Some(3),
            micro_batch: 32,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((e.repeat_count, e.steps_per_execution), (3, 12));
    assert_eq!(e.cycles_per_execution, 3 * e.cycles_per_weight_update);
}

#[test]
fn pipelined_classifier_trains_under_every_schedule() {
    use tessera::sim::runner::PipelineRunner;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist-binarized-10k");
    let data = tessera::idx::load_mnist(&dir).unwrap();
    let (imgs, labels) = (&data.train_images, &data.train_labels.labels);
    for (m, updates) in [(4usize, 30usize), (16, 15)] {
        for schedule in [
            Schedule::Grouped,
            Schedule::Interleaved,
            Schedule::Sequential,
        ] {
            // SUM accumulation: keep the effective step (M x lr) at 0.4.
            let p = plan(m as u32, Optimizer::sgd(0.4 / m as f32));
            let mut runner = PipelineRunner::new(p, schedule, 1).unwrap();
            runner.init_state(0).unwrap();
            let mut losses = Vec::new();
            for u in 0..updates {
                runner
                    .run_update(|_, b, plan, arena| {
                        let first = (u * m + b) * 32;
                        plan.fill_input("images", arena, 32 * 784, |i| {
                            f32::from(imgs.image(first + i / 784)[i % 784]) / 255.0
                        })?;
                        plan.fill_input("labels", arena, 32, |i| f32::from(labels[first + i]))
                    })
                    .unwrap();
                let loss: f32 = (0..m)
                    .map(|b| {
                        runner
                            .plan()
                            .tensor("loss", runner.arena(0, b), runner.state(0))
                            .unwrap()
                            .get(0)
                    })
                    .sum::<f32>()
                    / m as f32;
                losses.push(loss);
            }
            let first = losses[..3].iter().sum::<f32>() / 3.0;
            let last = losses[updates - 3..].iter().sum::<f32>() / 3.0;
            eprintln!("M = {m}, {schedule}: mean loss of the first three updates {first:.3}, last three {last:.3}");
            assert!(
                last < 0.85 * first,
                "M = {m}, {schedule}: {first} -> {last}"
            );
        }
    }
}

#[test]
fn recomputation_replicas_and_shared_variables() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let p = plan(4, Optimizer::sgd(0.1));
    let base = estimate_system(
        &p,
        &mk2,
        &SystemOptions {
            micro_batch: 32,
            ..Default::default()
        },
    )
    .unwrap();
    let re = estimate_system(
        &p,
        &mk2,
        &SystemOptions {
            micro_batch: 32,
            techniques: Techniques {
                recompute: Recompute {
                    stages: true,
                    checkpoints: None,
                },
                ..Techniques::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        re.ipus[0].stash_bytes < base.ipus[0].stash_bytes,
        "{} vs {}",
        re.ipus[0].stash_bytes,
        base.ipus[0].stash_bytes
    );
    assert!(re.stages[0].backward_cycles > base.stages[0].backward_cycles);
    let two = estimate_system(
        &p,
        &mk2,
        &SystemOptions {
            micro_batch: 32,
            replicas: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(base.all_reduce_cycles, 0);
    assert!(two.all_reduce_cycles > 0);
    assert_eq!(
        two.samples_per_weight_update,
        2 * base.samples_per_weight_update
    );
    assert_eq!(two.ipus_total, 4);

    // A variable used by two stages on different IPUs.
    use tessera::core::{Activation, Init};
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[2, 4], DType::F32).unwrap();
    let w = g
        .variable("shared", &[4, 4], DType::F32, Init::GlorotUniform)
        .unwrap();
    let h = g.matmul("h", x, w).unwrap();
    g.set_stage(1).unwrap();
    let h2 = g.matmul("h2", h, w).unwrap();
    let y = g
        .dense("out", h2, 2, Activation::Linear, DType::F32)
        .unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, true)
        .unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(4))
        .unwrap();
    let e = estimate_system(&Plan::new(&g).unwrap(), &mk2, &SystemOptions::default()).unwrap_err();
    assert!(matches!(e, SystemError::SharedVariable { .. }), "{e}");
    assert!(e
        .to_string()
        .contains("stages sharing a variable must share an IPU"));
    // On one IPU it is fine (a Grouped pipeline with both stages there).
    let ok = estimate_system(
        &Plan::new(&g).unwrap(),
        &mk2,
        &SystemOptions {
            device_mapping: Some(vec![0, 0]),
            ..Default::default()
        },
    );
    assert!(ok.is_ok(), "{:?}", ok.err());
}
