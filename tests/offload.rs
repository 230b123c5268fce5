//! Optimizer-state offload: momentum lives in streaming memory between updates, so tiles hold
//! less and the update costs remote-buffer copies.

use tessera::core::models::mnist_mlp;
use tessera::core::{DType, Fixed, Graph, Optimizer, Plan};
use tessera::sim::lower::LowerOptions;
use tessera::sim::{estimate, EstimateOptions, IpuConfig, Preset};

#[test]
fn offloading_momentum_saves_sram_and_costs_remote_buffer_cycles() {
    for opt in [Optimizer::momentum(0.1, 0.9), Optimizer::adam(1e-3)] {
        let mut g: Graph<Fixed<128>> = Graph::new();
        let m = mnist_mlp(&mut g, 32, DType::F32).unwrap();
        let labels = g.input("labels", &[32], DType::I32).unwrap();
        let loss = g
            .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
            .unwrap();
        g.differentiate(loss, opt).unwrap();
        let plan = Plan::new(&g).unwrap();
        let mk2 = IpuConfig::preset(Preset::Mk2);
        let on = EstimateOptions {
            lower: LowerOptions {
                offload_optimizer_state: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let (_, off_est) = estimate(&plan, &mk2, &EstimateOptions::default()).unwrap();
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
