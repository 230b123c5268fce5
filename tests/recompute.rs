//! Recomputation from checkpoints (`Graph::differentiate_recomputing`): the same training as
//! without, bit for bit, with only checkpoints (and what needs no recomputing) kept for the
//! backward pass; and `auto` checkpoints at the outputs of residual blocks.

use proptest::prelude::*;
use tessera::core::{Accumulation, Activation, DType, Graph, NodeId, Optimizer, Plan};
use tessera::sim::system::{estimate_system, SystemOptions};
use tessera::sim::{Heap, IpuConfig, Preset};

/// A residual MLP: a stem, `blocks` residual blocks of two dense layers, a classifier.
fn residual_mlp(g: &mut Graph<Heap>, batch: usize, width: usize, blocks: usize) -> NodeId {
    pipelined_residual_mlp(g, batch, width, blocks, None)
}

/// [`residual_mlp`] with a second pipeline stage from block `second_stage` on, if given.
fn pipelined_residual_mlp(
    g: &mut Graph<Heap>,
    batch: usize,
    width: usize,
    blocks: usize,
    second_stage: Option<usize>,
) -> NodeId {
    let x = g.input("x", &[batch, 6], DType::F32).unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    let mut h = g
        .dense("stem", x, width, Activation::Relu, DType::F32)
        .unwrap();
    for b in 0..blocks {
        if second_stage == Some(b) {
            g.set_stage(1).unwrap();
        }
        let y = g
            .dense(
                &format!("block{b}/a"),
                h,
                width,
                Activation::Tanh,
                DType::F32,
            )
            .unwrap();
        let y = g
            .dense(
                &format!("block{b}/b"),
                y,
                width,
                Activation::Linear,
                DType::F32,
            )
            .unwrap();
        h = g.add(&format!("block{b}/residual"), h, y).unwrap();
    }
    classified(g, h, labels)
}

/// A three-class classifier on `h` and its cross-entropy loss against `labels`.
fn classified(g: &mut Graph<Heap>, h: NodeId, labels: NodeId) -> NodeId {
    let logits = g
        .dense("classifier", h, 3, Activation::Linear, DType::F32)
        .unwrap();
    g.sparse_categorical_crossentropy("loss", logits, labels, true)
        .unwrap()
}

/// The state after `steps` training steps on fixed data.
fn train(g: &Graph<Heap>, batch: usize, steps: usize, seed: u64) -> Vec<u8> {
    let plan = Plan::new(g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, seed).unwrap();
    for s in 0..steps {
        let x: Vec<f32> = (0..batch * 6)
            .map(|i| ((i * 7 + s * 3) % 13) as f32 / 6.5 - 1.0)
            .collect();
        plan.write_input("x", &mut arena, &x).unwrap();
        plan.fill_input("labels", &mut arena, batch, |i| ((i + s) % 3) as f32)
            .unwrap();
        plan.train_step(&mut arena, &mut state).unwrap();
    }
    state
}

/// Forward activations that backward nodes read, by name.
fn read_by_backward(g: &Graph<Heap>) -> Vec<String> {
    let f = g.forward_len();
    let mut out: Vec<String> = g.nodes()[f..]
        .iter()
        .flat_map(|n| n.op().operands().as_slice().to_vec())
        .filter(|o| o.index() < f)
        .map(|o| g.node(o).name().to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[test]
fn auto_checkpoints_are_the_outputs_of_residual_blocks() {
    let mut g: Graph<Heap> = Graph::new();
    let loss = residual_mlp(&mut g, 4, 8, 3);
    let cps = g.auto_checkpoints(loss).unwrap();
    let names: Vec<&str> = cps.iter().map(|&c| g.node(c).name()).collect();
    // The stem's chain (its product, bias and ReLU) gives its first node; then each block's
    // residual add; the classifier's chain after the last block is the head.
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[0].starts_with("stem"), "{names:?}");
    for b in 0..3 {
        assert_eq!(names[b + 1], format!("block{b}/residual"), "{names:?}");
    }
}

#[test]
fn only_checkpoints_and_the_head_are_kept_for_the_backward_pass() {
    let mut plain: Graph<Heap> = Graph::new();
    let loss = residual_mlp(&mut plain, 4, 8, 3);
    let mut recomputing = plain.clone();
    plain
        .differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(1))
        .unwrap();
    let cps = recomputing.auto_checkpoints(loss).unwrap();
    let cps: Vec<NodeId> = cps.to_vec();
    recomputing
        .differentiate_recomputing(loss, Optimizer::sgd(0.1), Accumulation::new(1), &cps)
        .unwrap();
    let kept = read_by_backward(&recomputing);
    // Without recomputation the backward pass reads the blocks' inner activations.
    assert!(read_by_backward(&plain)
        .iter()
        .any(|n| n.starts_with("block1/a")));
    for name in &kept {
        let checkpoint = cps.iter().any(|&c| recomputing.node(c).name() == name);
        let head = name.starts_with("classifier") || name.starts_with("loss");
        let leaf = name == "x" || name == "labels" || name.contains(":0");
        assert!(
            checkpoint || head || leaf,
            "the backward pass reads `{name}`: {kept:?}"
        );
    }
    // Each block is recomputed once, from its checkpoint.
    let copies = recomputing
        .nodes()
        .iter()
        .filter(|n| n.name().ends_with("/recompute"))
        .count();
    assert!(copies >= 3 * 4, "{copies} copies");
    assert!(recomputing.len() > plain.len());
}

#[test]
fn recomputation_costs_cycles_and_saves_memory_on_the_device() {
    let build_with = |recompute: bool, outlining: bool| {
        let mut g: Graph<Heap> = Graph::new();
        let loss = residual_mlp(&mut g, 256, 512, 6);
        let cps = if recompute {
            g.auto_checkpoints(loss).unwrap().to_vec()
        } else {
            Vec::new()
        };
        g.differentiate_recomputing(loss, Optimizer::sgd(0.1), Accumulation::new(4), &cps)
            .unwrap();
        let plan = Plan::new(&g).unwrap();
        let mut opts = SystemOptions {
            micro_batch: 256,
            allow_out_of_memory: true,
            ..SystemOptions::default()
        };
        opts.techniques.outlining = outlining;
        estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap()
    };
    let build = |recompute: bool| build_with(recompute, false);
    let (plain, recomputed) = (build(false), build(true));
    // With outlining, a repeated layer's call copies out what is read after it: with
    // recomputation only the checkpoints, so the forward pass can only get cheaper.
    let (plain_outlined, recomputed_outlined) = (build_with(false, true), build_with(true, true));
    assert!(
        recomputed_outlined.stages[0].forward_cycles <= plain_outlined.stages[0].forward_cycles,
        "{} vs {}",
        recomputed_outlined.stages[0].forward_cycles,
        plain_outlined.stages[0].forward_cycles
    );
    // Without outlining: the forward pass again, in the backward: more cycles per step, the
    // forward unchanged.
    assert!(
        recomputed.stages[0].backward_cycles > plain.stages[0].backward_cycles,
        "{} vs {}",
        recomputed.stages[0].backward_cycles,
        plain.stages[0].backward_cycles
    );
    assert_eq!(
        recomputed.stages[0].forward_cycles,
        plain.stages[0].forward_cycles
    );
    // Fewer activations live at once: less not-always-live memory.
    let nal = |e: &tessera::sim::system::SystemEstimate| e.ipus[0].categories.not_always_live;
    assert!(
        nal(&recomputed) < nal(&plain),
        "{} vs {}",
        nal(&recomputed),
        nal(&plain)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Recomputed activations are the forward's, bit for bit: training with any checkpoints
    /// gives the same weights as without.
    #[test]
    fn recomputing_trains_bit_for_bit_as_stashing(
        blocks in 1usize..4,
        width in 2usize..9,
        batch in 1usize..5,
        seed in any::<u64>(),
        pick in prop::collection::vec(any::<bool>(), 12),
        auto in any::<bool>(),
    ) {
        let mut plain: Graph<Heap> = Graph::new();
        let loss = residual_mlp(&mut plain, batch, width, blocks);
        let mut recomputing = plain.clone();
        // Checkpoints: `auto`'s, or any activations the loss depends on.
        let cps: Vec<NodeId> = if auto {
            recomputing.auto_checkpoints(loss).unwrap().to_vec()
        } else {
            let names: Vec<String> = recomputing
                .nodes()
                .iter()
                .enumerate()
                .filter(|(i, n)| {
                    let name = n.name();
                    *i < loss.index()
                        && (name.starts_with("stem") || name.starts_with("block"))
                        && !name.contains(":0")
                        && pick[i % pick.len()]
                })
                .map(|(_, n)| n.name().to_string())
                .collect();
            names.iter().map(|n| recomputing.find(n.as_str()).unwrap()).collect()
        };
        plain.differentiate_accumulating(loss, Optimizer::momentum(0.05, 0.9), Accumulation::new(2)).unwrap();
        recomputing
            .differentiate_recomputing(loss, Optimizer::momentum(0.05, 0.9), Accumulation::new(2), &cps)
            .unwrap();
        prop_assert_eq!(train(&plain, batch, 4, seed), train(&recomputing, batch, 4, seed));
    }
}

#[test]
fn a_checkpoint_must_be_a_forward_activation() {
    let mut g: Graph<Heap> = Graph::new();
    let loss = residual_mlp(&mut g, 2, 4, 1);
    let x = g.find("x").unwrap();
    let e = g
        .clone()
        .differentiate_recomputing(loss, Optimizer::sgd(0.1), Accumulation::new(1), &[x])
        .unwrap_err();
    assert!(e.to_string().contains("checkpoint `x`"), "{e}");
    let e = g
        .differentiate_recomputing(loss, Optimizer::sgd(0.1), Accumulation::new(1), &[loss])
        .unwrap_err();
    assert!(e.to_string().contains("checkpoint `loss`"), "{e}");
}

#[test]
fn a_pipelined_stage_stashes_only_its_inputs_and_checkpoints() {
    // Two stages: the stem and two blocks on IPU 0, two blocks and the head on IPU 1.
    let build = |recompute: bool| {
        let mut g: Graph<Heap> = Graph::new();
        let loss = pipelined_residual_mlp(&mut g, 64, 256, 4, Some(2));
        let cps = if recompute {
            g.auto_checkpoints(loss).unwrap().to_vec()
        } else {
            Vec::new()
        };
        let checkpoint_bytes: Vec<u64> = (0..2)
            .map(|k| {
                cps.iter()
                    .map(|&c| g.node(c))
                    .filter(|n| n.stage() == k)
                    .map(|n| n.bytes() as u64)
                    .sum()
            })
            .collect();
        g.differentiate_recomputing(loss, Optimizer::sgd(0.1), Accumulation::new(8), &cps)
            .unwrap();
        let plan = Plan::new(&g).unwrap();
        let opts = SystemOptions {
            micro_batch: 64,
            allow_out_of_memory: true,
            ..SystemOptions::default()
        };
        let e = estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap();
        (e, checkpoint_bytes)
    };
    let ((plain, _), (recomputed, checkpoints)) = (build(false), build(true));
    let activation = 64 * 256 * 4;
    // The last stage stashes nothing (its backward follows its forward at once).
    assert_eq!(plain.ipus[1].stash_bytes, 0);
    for (d, &checkpoint_bytes) in checkpoints.iter().enumerate() {
        assert!(
            d == 1 || recomputed.ipus[d].stash_bytes < plain.ipus[d].stash_bytes,
            "IPU {d}: {} vs {}",
            recomputed.ipus[d].stash_bytes,
            plain.ipus[d].stash_bytes
        );
        // Per micro-batch in flight: the stage's checkpoints and its input (x, or the
        // activation arriving from IPU 0).
        let depth = recomputed.stages[d].stash_depth as u64;
        let input = if d == 0 { 64 * 6 * 4 } else { activation };
        assert!(
            recomputed.ipus[d].stash_bytes <= depth * (checkpoint_bytes + input),
            "IPU {d}: {} > {depth} x ({checkpoint_bytes} + {input})",
            recomputed.ipus[d].stash_bytes,
        );
    }
}

/// A post-norm residual MLP as a post-LN transformer's layers are: each block's residual sum
/// is layer-normalised (`block{b}/norm`), a second stage from block `second_stage` on.
fn post_norm_mlp(
    g: &mut Graph<Heap>,
    batch: usize,
    width: usize,
    blocks: usize,
    second_stage: usize,
) -> NodeId {
    let x = g.input("x", &[batch, 6], DType::F32).unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    let mut h = g
        .dense("stem", x, width, Activation::Relu, DType::F32)
        .unwrap();
    for b in 0..blocks {
        if b == second_stage {
            g.set_stage(1).unwrap();
        }
        let y = g
            .dense(
                &format!("block{b}/a"),
                h,
                width,
                Activation::Tanh,
                DType::F32,
            )
            .unwrap();
        let sum = g.add(&format!("block{b}/residual"), h, y).unwrap();
        h = g
            .layer_norm(&format!("block{b}/norm"), sum, 1, 1e-5)
            .unwrap();
    }
    classified(g, h, labels)
}

#[test]
fn checkpoints_are_block_outputs_and_a_stage_stashes_none_of_its_own_output() {
    let (batch, width) = (16, 32);
    let mut g: Graph<Heap> = Graph::new();
    let loss = post_norm_mlp(&mut g, batch, width, 4, 2);
    let cps = g.auto_checkpoints(loss).unwrap().to_vec();
    let names: Vec<&str> = cps.iter().map(|&c| g.node(c).name()).collect();
    // The stem's output, then each block's normalised output (where PopTorch's
    // `recomputationCheckpoint` goes), not its residual sum; the last block's too, before the
    // classifier changes the shape.
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names[0].starts_with("stem"), "{names:?}");
    for b in 0..4 {
        assert_eq!(names[b + 1], format!("block{b}/norm"), "{names:?}");
    }
    g.differentiate_recomputing(loss, Optimizer::sgd(0.1), Accumulation::new(8), &cps)
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let opts = SystemOptions {
        micro_batch: batch as u64,
        allow_out_of_memory: true,
        ..SystemOptions::default()
    };
    let e = estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap();
    // Stage 0 (the stem, blocks 0 and 1) stashes its input, the stem's output and block 0's;
    // block 1's output is the stage's output, which the next stage stashes as its input.
    let activation = (batch * width * 4) as u64;
    assert!(e.stages[0].stash_depth > 0);
    assert_eq!(
        e.stages[0].stash_entry_bytes,
        (batch * 6 * 4) as u64 + 2 * activation
    );
    // Stage 1 is the loss's stage, whose backward follows its forward at once: no stash.
    assert_eq!(e.stages[1].stash_depth, 0);
    assert_eq!(e.ipus[1].stash_bytes, 0);
}

/// A residual MLP whose stem and blocks normalise their batches (training batch norms, with
/// running averages) after products with a bias.
fn normalised_mlp(g: &mut Graph<Heap>, batch: usize, width: usize, blocks: usize) -> NodeId {
    use tessera::core::ops::norm::BatchNorm;
    let bn = BatchNorm {
        axis: 1,
        epsilon: 1e-3,
        momentum: 0.9,
        training: true,
    };
    let x = g.input("x", &[batch, 6], DType::F32).unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    let h = g
        .dense("stem", x, width, Activation::Linear, DType::F32)
        .unwrap();
    // The stem normalises [batch, channels, 2] (its scale and shift broadcast as reshaped
    // [channels, 1] views).
    let h = g.reshape("stem_3d", h, &[batch, width / 2, 2]).unwrap();
    let h = g.batch_norm("stem_bn", h, bn).unwrap();
    let h = g.relu("stem_relu", h).unwrap();
    let mut h = g.reshape("stem_2d", h, &[batch, width]).unwrap();
    for b in 0..blocks {
        let y = g
            .dense(
                &format!("block{b}/a"),
                h,
                width,
                Activation::Linear,
                DType::F32,
            )
            .unwrap();
        let y = g.batch_norm(&format!("block{b}/bn"), y, bn).unwrap();
        let y = g.relu(&format!("block{b}/relu"), y).unwrap();
        h = g.add(&format!("block{b}/residual"), h, y).unwrap();
    }
    classified(g, h, labels)
}

#[test]
fn parameters_in_another_shape_and_running_statistics_are_no_activations() {
    let mut g: Graph<Heap> = Graph::new();
    let loss = normalised_mlp(&mut g, 4, 8, 3);
    let cps = g.auto_checkpoints(loss).unwrap().to_vec();
    let names: Vec<&str> = cps.iter().map(|&c| g.node(c).name()).collect();
    // A bias or scale reshaped to broadcast, or the batch statistics the running averages
    // read, do not break the stem's chain (product, bias, norm, ReLU): one checkpoint for
    // it, then each block's residual add.
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[0].starts_with("stem"), "{names:?}");
    for b in 0..3 {
        assert_eq!(names[b + 1], format!("block{b}/residual"), "{names:?}");
    }
    let mut recomputing = g.clone();
    recomputing
        .differentiate_recomputing(loss, Optimizer::sgd(0.1), Accumulation::new(1), &cps)
        .unwrap();
    // Nothing the backward pass does not read is recomputed: not the statistics for the
    // running averages, not a reshaped parameter.
    let copies: Vec<&str> = recomputing
        .nodes()
        .iter()
        .map(|n| n.name())
        .filter(|n| n.ends_with("/recompute"))
        .collect();
    assert!(!copies.is_empty());
    for c in &copies {
        assert!(
            !c.contains("/mean/") && !c.contains("/variance/") && !c.contains("_view/"),
            "{c} is recomputed: {copies:?}"
        );
    }
    // The same training as without recomputation, running averages and all.
    let mut plain = g.clone();
    plain
        .differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(1))
        .unwrap();
    assert_eq!(train(&plain, 4, 3, 7), train(&recomputing, 4, 3, 7));
}

#[test]
fn a_norms_gradients_read_its_input_not_its_normalised_output() {
    // popnn's norm gradients whiten the input again: the backward pass keeps the input.
    let mut g: Graph<Heap> = Graph::new();
    let loss = normalised_mlp(&mut g, 4, 8, 2);
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(1))
        .unwrap();
    let read = read_by_backward(&g);
    assert!(
        read.iter().all(|n| !n.ends_with("/normalize")),
        "the backward pass reads a normalised output: {read:?}"
    );
    // It reads what each norm normalises (the products' outputs).
    assert!(read.iter().any(|n| n.starts_with("block0/a")), "{read:?}");
}
