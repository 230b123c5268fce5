//! Optimizer-state offload: momentum lives in streaming memory between updates, so tiles hold
//! less and the update costs remote-buffer copies.

use tessera::core::models::mnist_mlp;
use tessera::core::{DType, Graph, Optimizer, Plan};
use tessera::sim::lower::LowerOptions;
use tessera::sim::techniques::{Offload, Techniques};
use tessera::sim::Heap;
use tessera::sim::{estimate, IpuConfig, IpuEstimateOptions, Preset};

#[test]
fn offloading_momentum_saves_sram_and_costs_remote_buffer_cycles() {
    for opt in [Optimizer::momentum(0.1, 0.9), Optimizer::adam(1e-3)] {
        let mut g: Graph<Heap> = Graph::new();
        let m = mnist_mlp(&mut g, 32, DType::F32).unwrap();
        let labels = g.input("labels", &[32], DType::I32).unwrap();
        let loss = g
            .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
            .unwrap();
        g.differentiate(loss, opt).unwrap();
        let plan = Plan::new(&g).unwrap();
        let mk2 = IpuConfig::preset(Preset::Mk2);
        let on = IpuEstimateOptions {
            lower: LowerOptions {
                offload_optimizer_state: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let (_, off_est) = estimate(&plan, &mk2, &IpuEstimateOptions::default()).unwrap();
        let (_, on_est) = estimate(&plan, &mk2, &on).unwrap();
        let (a, b) = (&off_est.ipus[0], &on_est.ipus[0]);
        eprintln!(
            "{opt:?}: always-live {} -> {} B, total {} -> {} B, remote-buffer cycles {} -> {}, step {} -> {}",
            a.categories.always_live, b.categories.always_live, a.bytes_used, b.bytes_used,
            off_est.cycles.remote_buffers, on_est.cycles.remote_buffers, off_est.cycles_per_step, on_est.cycles_per_step
        );
        assert!(b.categories.always_live < a.categories.always_live);
        assert!(b.bytes_used < a.bytes_used);
        assert_eq!(off_est.cycles.remote_buffers, 0);
        assert!(on_est.cycles.remote_buffers > 0);
        assert!(on_est.cycles_per_step > off_est.cycles_per_step);
    }
}

/// A two-stage pipelined MLP trained with gradient accumulation, estimated with `opts`.
fn pipelined(opts: tessera::sim::system::SystemOptions) -> tessera::sim::system::SystemEstimate {
    use tessera::core::{Accumulation, Activation};
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[64, 256], DType::F16).unwrap();
    let labels = g.input("labels", &[64], DType::I32).unwrap();
    let mut h = x;
    for b in 0..4 {
        if b == 2 {
            g.set_stage(1).unwrap();
        }
        h = g
            .dense(&format!("dense{b}"), h, 256, Activation::Relu, DType::F16)
            .unwrap();
    }
    let logits = g
        .dense("classifier", h, 10, Activation::Linear, DType::F16)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", logits, labels, true)
        .unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(8))
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let opts = tessera::sim::system::SystemOptions {
        micro_batch: 64,
        allow_out_of_memory: true,
        ..opts
    };
    tessera::sim::system::estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap()
}

#[test]
fn offloaded_activations_leave_the_stash_off_the_tiles_and_cost_its_copies() {
    use tessera::sim::system::SystemOptions;
    let kept = pipelined(SystemOptions::default());
    let offloaded = pipelined(SystemOptions {
        techniques: Techniques {
            offload: Offload {
                activations: true,
                ..Offload::default()
            },
            ..Techniques::default()
        },
        ..SystemOptions::default()
    });
    // Stage 0 stashes (its backward comes micro-batches later); the last stage does not.
    assert!(kept.ipus[0].stash_bytes > 0);
    assert_eq!(offloaded.ipus[0].stash_bytes, 0);
    assert_eq!(offloaded.ipus[0].categories.stash, 0);
    // The stash is in streaming memory instead: each stashed micro-batch's entry.
    let depth = kept.stages[0].stash_depth as u64;
    assert_eq!(
        offloaded.ipus[0].streaming_memory_bytes - kept.ipus[0].streaming_memory_bytes,
        depth * kept.stages[0].stash_entry_bytes
    );
    // Stored after the forward pass, loaded before the backward pass.
    assert!(offloaded.stages[0].forward_phases.remote_buffers > 0);
    assert!(offloaded.stages[0].backward_phases.remote_buffers > 0);
    assert_eq!(offloaded.stages[1].forward_phases.remote_buffers, 0);
    assert!(offloaded.stages[0].forward_cycles > kept.stages[0].forward_cycles);
}

#[test]
fn offloaded_accumulators_leave_the_tiles_between_accumulations() {
    use tessera::sim::system::SystemOptions;
    let kept = pipelined(SystemOptions::default());
    let offloaded = pipelined(SystemOptions {
        techniques: Techniques {
            offload: Offload {
                gradient_accumulators: true,
                ..Offload::default()
            },
            ..Techniques::default()
        },
        ..SystemOptions::default()
    });
    for d in 0..2 {
        let (a, b) = (&kept.ipus[d], &offloaded.ipus[d]);
        // The accumulators (as large as the weights) are no longer always live.
        assert!(b.categories.always_live < a.categories.always_live);
        assert!(b.streaming_memory_bytes > a.streaming_memory_bytes);
    }
    // Every micro-batch's accumulation loads and stores them.
    assert!(offloaded.stages[0].backward_phases.remote_buffers > 0);
    assert!(offloaded.stages[0].backward_cycles > kept.stages[0].backward_cycles);
}
