//! Outlining (code reuse, `LowerOptions::outlining`): identical layers share one copy of
//! their code, so code bytes stay nearly flat as layers are added while variables grow; each
//! call pays its copies in and out; without outlining every layer has its own code.

use tessera::core::{Accumulation, Activation, DType, Graph, Optimizer, Plan};
use tessera::sim::lower::LowerOptions;
use tessera::sim::memory::TileMemory;
use tessera::sim::system::{estimate_system, SystemEstimate, SystemOptions};
use tessera::sim::{Heap, IpuConfig, Preset};

/// A training estimate of `blocks` identical dense blocks of `width`, outlined or not.
fn estimate(blocks: usize, outlining: bool) -> SystemEstimate {
    let (batch, width) = (64, 512);
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[batch, width], DType::F16).unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    let mut h = x;
    for b in 0..blocks {
        let y = g
            .dense(
                &format!("block{b}/a"),
                h,
                width,
                Activation::Relu,
                DType::F16,
            )
            .unwrap();
        let y = g
            .dense(
                &format!("block{b}/b"),
                y,
                width,
                Activation::Linear,
                DType::F16,
            )
            .unwrap();
        h = g.add(&format!("block{b}/residual"), h, y).unwrap();
    }
    let logits = g
        .dense("classifier", h, 10, Activation::Linear, DType::F16)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", logits, labels, true)
        .unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(4))
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let opts = SystemOptions {
        micro_batch: batch as u64,
        allow_out_of_memory: true,
        lower: LowerOptions {
            outlining,
            ..LowerOptions::default()
        },
        ..SystemOptions::default()
    };
    estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap()
}

/// Vertex state, exchange code and control code of the IPU.
fn code(e: &SystemEstimate) -> u64 {
    let c: &TileMemory = &e.ipus[0].categories;
    c.vertex_state + c.exchange_code + c.control_code
}

#[test]
fn outlined_code_stays_flat_as_identical_layers_are_added_while_variables_grow() {
    let (o4, o8) = (estimate(4, true), estimate(8, true));
    let (p4, p8) = (estimate(4, false), estimate(8, false));
    // Four more blocks: their weights are there either way.
    let weights = |e: &SystemEstimate| e.ipus[0].categories.always_live;
    assert_eq!(weights(&o8) - weights(&o4), weights(&p8) - weights(&p4));
    assert!(weights(&o8) > weights(&o4));
    // Without outlining each block brings its own code; outlined, only its calls' copies.
    let (grown_plain, grown_outlined) =
        (code(&p8) - code(&p4), code(&o8).saturating_sub(code(&o4)));
    assert!(
        grown_outlined * 5 < grown_plain,
        "code grew by {grown_outlined} B outlined, {grown_plain} B without"
    );
    // Outlining shares, it does not drop: the first block's code is there.
    assert!(code(&o4) < code(&p4));
    assert!(
        code(&o4) * 3 > code(&p4) / 4,
        "{} vs {}",
        code(&o4),
        code(&p4)
    );
}

#[test]
fn each_call_copies_its_tensors_in_and_out() {
    let (outlined, plain) = (estimate(4, true), estimate(4, false));
    // The copies are compute: more cycles per step, the same exchange.
    let compute = |e: &SystemEstimate| e.stages[0].forward_phases.compute;
    assert!(compute(&outlined) > compute(&plain));
    assert_eq!(
        outlined.stages[0].forward_phases.exchange,
        plain.stages[0].forward_phases.exchange
    );
    // The clones of a call's inputs live through it.
    let nal = |e: &SystemEstimate| e.ipus[0].categories.not_always_live;
    assert!(nal(&outlined) > nal(&plain));
}
