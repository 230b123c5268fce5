//! Distributed batch norm: each batch norm sums its statistics, and their gradients, over
//! groups of replicas, an all-reduce whose steps each sync every replica's IPU.

use tessera::core::ops::norm::BatchNorm;
use tessera::core::schedule::Schedule;
use tessera::core::{Activation, DType, Graph, Optimizer, Plan};
use tessera::sim::collective::{group_all_reduce_cycles, step_sync_cycles};
use tessera::sim::program::Step;
use tessera::sim::system::{estimate_system, SystemEstimate, SystemOptions};
use tessera::sim::techniques::Techniques;
use tessera::sim::{Heap, IpuConfig, Preset};

const WIDTH: usize = 64;
const NORMS: usize = 3;

/// `NORMS` dense layers of `WIDTH`, each batch-normalised, trained with momentum.
fn normalised(g: &mut Graph<Heap>) {
    let bn = BatchNorm {
        axis: 1,
        epsilon: 1e-3,
        momentum: 0.9,
        training: true,
    };
    let mut h = g.input("x", &[16, WIDTH], DType::F32).unwrap();
    let labels = g.input("labels", &[16], DType::I32).unwrap();
    for k in 0..NORMS {
        let y = g
            .dense(&format!("d{k}"), h, WIDTH, Activation::Linear, DType::F32)
            .unwrap();
        let y = g.batch_norm(&format!("bn{k}"), y, bn).unwrap();
        h = g.relu(&format!("relu{k}"), y).unwrap();
    }
    let logits = g
        .dense("head", h, 10, Activation::Linear, DType::F32)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", logits, labels, true)
        .unwrap();
    g.differentiate(loss, Optimizer::momentum(0.01, 0.9))
        .unwrap();
}

fn estimate(replicas: usize, group: usize) -> SystemEstimate {
    let mut g: Graph<Heap> = Graph::new();
    normalised(&mut g);
    let plan = Plan::new(&g).unwrap();
    let opts = SystemOptions {
        micro_batch: 16,
        replicas,
        schedule: Schedule::Sequential,
        techniques: Techniques {
            distributed_batch_norm: group,
            ..Techniques::default()
        },
        ..SystemOptions::default()
    };
    estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap()
}

#[test]
fn each_batch_norm_all_reduces_its_statistics_and_their_gradients_within_its_group() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let (alone, paired) = (estimate(4, 1), estimate(4, 2));
    // Forward and backward, each norm: its statistics (two f32 a channel) over a pair.
    let per_norm = group_all_reduce_cycles(&mk2, (2 * WIDTH * 4) as u64, 2, 4);
    let extra = paired.pipeline_cycles - alone.pipeline_cycles;
    assert_eq!(
        extra,
        2 * NORMS as u64 * per_norm,
        "{extra} vs {per_norm} a norm"
    );
    // Two steps of a pair's ring, each a sync of all 4 replicas' IPUs.
    assert!(per_norm > 2 * step_sync_cycles(&mk2, 4));
    // Nothing else changes: the gradients' all-reduce and the update.
    assert_eq!(paired.all_reduce_cycles, alone.all_reduce_cycles);
    assert_eq!(paired.weight_update_cycles, alone.weight_update_cycles);
}

#[test]
fn a_wider_partition_makes_every_step_sync_more_ipus() {
    // The same pairs, in a partition of 128 replicas: each step's sync crosses the gateways.
    let (near, far) = (estimate(64, 2), estimate(128, 2));
    let (near_alone, far_alone) = (estimate(64, 1), estimate(128, 1));
    let near_extra = near.pipeline_cycles - near_alone.pipeline_cycles;
    let far_extra = far.pipeline_cycles - far_alone.pipeline_cycles;
    assert!(far_extra > near_extra, "{far_extra} vs {near_extra}");
}

#[test]
fn a_lowering_adds_one_collective_per_batch_statistics() {
    let mut g: Graph<Heap> = Graph::new();
    normalised(&mut g);
    let plan = Plan::new(&g).unwrap();
    let cfg = IpuConfig::preset(Preset::Mk2);
    let count = |group: u32| {
        let opts = tessera::sim::lower::LowerOptions {
            distributed_batch_norm: group,
            partition_ipus: 8,
            ..Default::default()
        };
        tessera::sim::lower::lower(&plan, &cfg, opts)
            .steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    Step::Collective {
                        group: 2,
                        partition_ipus: 8,
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(count(1), 0);
    assert_eq!(count(2), 2 * NORMS);
}
