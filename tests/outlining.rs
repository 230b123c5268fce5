//! Outlining (code reuse, `Techniques::outlining`): identical layers share one copy of
//! their code, so code bytes stay nearly flat as layers are added while variables grow; each
//! call pays its copies in and out; without outlining every layer has its own vertex state
//! and control code, and its own exchange code only where it sends its own weights.

use tessera::core::{Accumulation, Activation, DType, Graph, Optimizer, Plan};
use tessera::sim::memory::TileMemory;
use tessera::sim::system::{estimate_system, SystemEstimate, SystemOptions};
use tessera::sim::techniques::Techniques;
use tessera::sim::{Heap, IpuConfig, Preset};

/// A training estimate of `blocks` identical dense blocks of `width`, outlined or not.
fn estimate(blocks: usize, outlining: bool) -> SystemEstimate {
    estimate_with_graph(blocks, outlining).0
}

/// [`estimate`] with its graph.
fn estimate_with_graph(blocks: usize, outlining: bool) -> (SystemEstimate, Graph<Heap>) {
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
        techniques: Techniques {
            outlining,
            ..Techniques::default()
        },
        ..SystemOptions::default()
    };
    let e = estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap();
    (e, g)
}

/// Vertex state, exchange code and control code of the IPU.
fn code(e: &SystemEstimate) -> u64 {
    let c: &TileMemory = &e.ipus[0].categories;
    c.vertex_state + c.exchange_code + c.control_code
}

/// Vertex state and control code of the IPU: what each layer has of its own unless outlined.
fn own_code(e: &SystemEstimate) -> u64 {
    let c: &TileMemory = &e.ipus[0].categories;
    c.vertex_state + c.control_code
}

#[test]
fn outlined_code_stays_flat_as_identical_layers_are_added_while_variables_grow() {
    let (o4, o8) = (estimate(4, true), estimate(8, true));
    let (p4, p8) = (estimate(4, false), estimate(8, false));
    // Four more blocks: their weights are there either way.
    let weights = |e: &SystemEstimate| e.ipus[0].categories.always_live;
    assert_eq!(weights(&o8) - weights(&o4), weights(&p8) - weights(&p4));
    assert!(weights(&o8) > weights(&o4));
    // Without outlining each block brings its own vertex state and control code; outlined,
    // only its calls' copies.
    let (grown_plain, grown_outlined) = (
        own_code(&p8) - own_code(&p4),
        code(&o8).saturating_sub(code(&o4)),
    );
    assert!(
        grown_outlined * 3 < grown_plain,
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

#[test]
fn identical_blocks_share_exchange_code_except_where_they_send_their_own_weights() {
    let n = 8;
    let (e, g) = estimate_with_graph(n, false);
    let codes = &e.ipus[0].node_code;
    // A block's nodes: its own (`block<b>/...`) and their gradients and updates.
    let block = |b: usize| {
        let prefix = format!("block{b}/");
        let mut c = tessera::sim::memory::NodeCode::default();
        for (i, n) in g.nodes().iter().enumerate() {
            if n.name().starts_with(&prefix) {
                c.add(&codes[i]);
            }
        }
        c
    };
    let blocks: Vec<_> = (0..n).map(block).collect();
    // The middle blocks lower alike (the first reads the input, the last two meet the
    // classifier's layouts forward and backward); the first of them pays for the exchange
    // code they share.
    for b in 3..n - 2 {
        assert_eq!(
            blocks[b].exchange_code, blocks[2].exchange_code,
            "block {b}"
        );
        assert_eq!(blocks[b].vertex_state, blocks[1].vertex_state, "block {b}");
    }
    // Each has all its vertex state and control code, and the same exchanges (as many sends
    // and receives), but the code of only the tiles that send its weights: less than the
    // first block of its kind (block 1), which pays for every tile.
    let first = blocks[1];
    assert!(first.exchange_code > 0);
    assert!(
        blocks[2].exchange_code < first.exchange_code,
        "{} vs {}",
        blocks[2].exchange_code,
        first.exchange_code
    );
    assert_eq!(blocks[2].sends, first.sends);
    assert_eq!(blocks[2].receives, first.receives);
}
