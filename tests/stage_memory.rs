//! The memory of pipeline stages that share an IPU (TensorFlow's `device_mapping`), each on its
//! own: its steps' code, the variables they touch and its tiles' peak over them, as PopLiner
//! attributes a profiled program to ranges of layers.
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use tessera::core::{DType, Graph, Init, Plan};
use tessera::sim::memory::PartMemory;
use tessera::sim::system::{estimate_system, SystemEstimate, SystemOptions};
use tessera::sim::techniques::Techniques;
use tessera::sim::{Heap, IpuConfig, Preset};

/// `layers` identical dense layers after `x`, the first half in stage 0 and the second in
/// stage 1: the last layer's output.
fn dense_layers(g: &mut Graph<Heap>, layers: usize) -> tessera::core::NodeId {
    let mut x = g.input("x", &[64, 256], DType::F16).unwrap();
    for l in 0..layers {
        if l == layers / 2 {
            g.set_stage(1).unwrap();
        }
        let w = g
            .variable(
                &format!("w{l}"),
                &[256, 256],
                DType::F16,
                Init::GlorotUniform,
            )
            .unwrap();
        let y = g.matmul(&format!("mm{l}"), x, w).unwrap();
        x = g.relu(&format!("relu{l}"), y).unwrap();
    }
    x
}

/// Inference through `layers` identical dense layers in two stages.
fn plan(layers: usize) -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let x = dense_layers(&mut g, layers);
    g.reduce_mean("out", x, None).unwrap();
    Plan::new(&g).unwrap()
}

fn estimate(mapping: Vec<usize>) -> SystemEstimate {
    let opts = SystemOptions {
        device_mapping: Some(mapping),
        micro_batch: 64,
        inference_micro_batches: 2,
        techniques: Techniques {
            outlining: false,
            ..Techniques::default()
        },
        ..SystemOptions::default()
    };
    estimate_system(&plan(4), &IpuConfig::preset(Preset::Mk2), &opts).unwrap()
}

#[test]
fn stages_sharing_an_ipu_are_reported_one_by_one() {
    let one = estimate(vec![0, 0]);
    let parts: Vec<&PartMemory> = one
        .stages
        .iter()
        .map(|s| {
            s.memory
                .as_ref()
                .expect("a stage sharing its IPU has its own memory")
        })
        .collect();
    let whole = &one.ipus[0].categories;
    // Each step is one stage's: the code of the two parts is the program's.
    for (name, part, all) in [
        (
            "vertex state",
            parts.iter().map(|p| p.categories.vertex_state).sum::<u64>(),
            whole.vertex_state,
        ),
        (
            "exchange code",
            parts.iter().map(|p| p.categories.exchange_code).sum(),
            whole.exchange_code,
        ),
        (
            "control code",
            parts.iter().map(|p| p.categories.control_code).sum(),
            whole.control_code,
        ),
    ] {
        assert_eq!(part, all, "{name}");
    }
    // Each part holds its own two layers' weights, not the other's.
    let weights = 2 * 256 * 256 * 2;
    for p in &parts {
        assert_eq!(p.categories.always_live, weights, "{p:?}");
    }
    // The second stage repeats the first's layers: their exchanges' code is already there.
    assert!(
        parts[1].categories.exchange_code < parts[0].categories.exchange_code,
        "{parts:?}"
    );
    // Vertex code is each part's own codelets: no more than the program's.
    for p in &parts {
        assert!(p.categories.vertex_code <= whole.vertex_code);
        assert!(p.max_tile_bytes <= one.ipus[0].max_tile_bytes);
    }
    // A stage alone on its IPU is the IPU's memory: no separate figure.
    let two = estimate(vec![0, 1]);
    assert!(two.stages.iter().all(|s| s.memory.is_none()));
    // On its own IPU, the second stage pays its exchanges' code in full.
    assert!(two.ipus[1].categories.exchange_code > parts[1].categories.exchange_code);
}

/// In training, a stage's own memory holds its stash: the first stage's (whose activations wait
/// for their backward), not the last's.
#[test]
fn a_stage_on_its_own_holds_its_stash() {
    use tessera::core::{Accumulation, Optimizer};
    let mut g: Graph<Heap> = Graph::new();
    let x = dense_layers(&mut g, 4);
    let loss = g.reduce_mean("loss", x, None).unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(4))
        .unwrap();
    let opts = SystemOptions {
        device_mapping: Some(vec![0, 0]),
        micro_batch: 64,
        ..SystemOptions::default()
    };
    let e = estimate_system(
        &Plan::new(&g).unwrap(),
        &IpuConfig::preset(Preset::Mk2),
        &opts,
    )
    .unwrap();
    let stash = |k: usize| e.stages[k].memory.as_ref().unwrap().categories.stash;
    assert!(e.stages[0].stash_depth > 0);
    assert!(stash(0) > 0, "{:?}", e.stages[0].memory);
    assert_eq!(stash(1), 0);
    assert_eq!(stash(0), e.ipus[0].categories.stash);
}
