//! LAMB and LARS: the first step of each against its formula, computed here from the gradient
//! the graph made; and their cost on the device (the per-tensor norms and trust ratio).

use tessera::core::{Activation, DType, Graph, Optimizer, Plan};
use tessera::sim::system::{estimate_system, SystemOptions};
use tessera::sim::{Heap, IpuConfig, Preset};

/// A classifier of `inputs` features: dense layers `d1`, `d2`, ... of the `hidden` widths
/// (ReLU), then one of `classes` (logits), and its cross-entropy loss.
fn classifier(
    g: &mut Graph<Heap>,
    batch: usize,
    inputs: usize,
    hidden: &[usize],
    classes: usize,
    dtype: DType,
) -> tessera::core::NodeId {
    let mut h = g.input("x", &[batch, inputs], dtype).unwrap();
    let labels = g.input("labels", &[batch], DType::I32).unwrap();
    for (k, &width) in hidden.iter().chain([&classes]).enumerate() {
        let act = if k < hidden.len() {
            Activation::Relu
        } else {
            Activation::Linear
        };
        h = g
            .dense(&format!("d{}", k + 1), h, width, act, dtype)
            .unwrap();
    }
    g.sparse_categorical_crossentropy("loss", h, labels, true)
        .unwrap()
}

/// The device estimate of training a 1024 -> 1024 -> 10 fp16 classifier at `batch`.
fn on_device(
    batch: usize,
    optimizer: Optimizer,
    accumulation: u32,
    replicas: usize,
    techniques: tessera::sim::techniques::Techniques,
) -> tessera::sim::system::SystemEstimate {
    let mut g: Graph<Heap> = Graph::new();
    let loss = classifier(&mut g, batch, 1024, &[1024], 10, DType::F16);
    g.differentiate_accumulating(
        loss,
        optimizer,
        tessera::core::Accumulation::new(accumulation),
    )
    .unwrap();
    let plan = Plan::new(&g).unwrap();
    let opts = SystemOptions {
        micro_batch: batch as u64,
        replicas,
        allow_out_of_memory: true,
        techniques,
        ..SystemOptions::default()
    };
    estimate_system(&plan, &IpuConfig::preset(Preset::Mk2), &opts).unwrap()
}

/// (weights before, gradient, weights after) of a dense layer's kernel after one step.
fn one_step(optimizer: Optimizer) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut g: Graph<Heap> = Graph::new();
    let loss = classifier(&mut g, 2, 3, &[], 4, DType::F32);
    g.differentiate(loss, optimizer).unwrap();
    g.mark_output("d1/kernel:0_grad").unwrap();
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 7).unwrap();
    let read = |name: &str, arena: &[u8], state: &[u8]| -> Vec<f32> {
        plan.tensor(name, arena, state).unwrap().iter().collect()
    };
    let before = read("d1/kernel:0", &arena, &state);
    plan.write_input("x", &mut arena, &[0.5, -1.0, 2.0, 1.5, 0.25, -0.75])
        .unwrap();
    plan.fill_input("labels", &mut arena, 2, |i| (i * 3 % 4) as f32)
        .unwrap();
    plan.train_step(&mut arena, &mut state).unwrap();
    let grad = read("d1/kernel:0_grad", &arena, &state);
    let after = read("d1/kernel:0", &arena, &state);
    (before, grad, after)
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

#[test]
fn lamb_steps_by_the_trust_ratio_of_its_adam_direction() {
    let (lr, wd, eps) = (0.1f64, 0.01f64, 1e-6f64);
    let (w0, g, w1) = one_step(Optimizer::lamb(lr as f32));
    // After one step the bias-corrected moments are the gradient and its square.
    let r: Vec<f64> = w0
        .iter()
        .zip(&g)
        .map(|(&w, &g)| f64::from(g) / (f64::from(g).abs() + eps) + wd * f64::from(w))
        .collect();
    let w: Vec<f64> = w0.iter().map(|&w| f64::from(w)).collect();
    let ratio = norm(&w) / norm(&r);
    assert!(ratio > 0.0 && ratio.is_finite());
    for i in 0..w0.len() {
        let expected = w[i] - lr * ratio * r[i];
        assert!(
            (f64::from(w1[i]) - expected).abs() < 1e-5,
            "{i}: {} vs {expected}",
            w1[i]
        );
    }
}

#[test]
fn lars_steps_by_the_trust_ratio_of_weights_and_gradient() {
    let (lr, wd, eta) = (0.1f64, 1e-4f64, 0.001f64);
    let (w0, g, w1) = one_step(Optimizer::lars(lr as f32));
    let w: Vec<f64> = w0.iter().map(|&w| f64::from(w)).collect();
    let gd: Vec<f64> = g.iter().map(|&g| f64::from(g)).collect();
    let ratio = eta * norm(&w) / (norm(&gd) + wd * norm(&w));
    for i in 0..w0.len() {
        let expected = w[i] - lr * ratio * (gd[i] + wd * w[i]);
        assert!(
            (f64::from(w1[i]) - expected).abs() < 1e-6,
            "{i}: {} vs {expected}",
            w1[i]
        );
    }
}

#[test]
fn bad_hyper_parameters_are_refused() {
    let mut g: Graph<Heap> = Graph::new();
    let loss = classifier(&mut g, 2, 3, &[], 4, DType::F32);
    let bad = Optimizer::Lamb {
        learning_rate: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-6,
        weight_decay: -1.0,
    };
    let e = g.differentiate(loss, bad).unwrap_err();
    assert!(e.to_string().contains("weight_decay"), "{e}");
}

#[test]
fn the_trust_ratio_costs_norms_and_a_broadcast_on_the_device() {
    let estimate = |optimizer| on_device(64, optimizer, 2, 1, Default::default());
    let adam = estimate(Optimizer::adam(1e-3));
    let lamb = estimate(Optimizer::lamb(1e-3));
    let (momentum, lars) = (
        estimate(Optimizer::momentum(0.1, 0.9)),
        estimate(Optimizer::lars(0.1)),
    );
    // The same state, plus the norms' reductions, the ratio and its broadcast.
    assert!(lamb.weight_update_cycles > adam.weight_update_cycles);
    assert!(lars.weight_update_cycles > momentum.weight_update_cycles);
    // The step itself is the same.
    assert_eq!(lamb.stages[0].forward_cycles, adam.stages[0].forward_cycles);
}

#[test]
fn replicated_tensor_sharding_divides_the_state_and_its_update_over_the_replicas() {
    // The biases of 1024 and 10 elements stay whole: under PopART's 8192-element threshold.
    let estimate = |sharded| {
        let techniques = tessera::sim::techniques::Techniques {
            offload: tessera::sim::techniques::Offload {
                optimizer_state: true,
                ..Default::default()
            },
            replicated_tensor_sharding: sharded,
            ..Default::default()
        };
        on_device(32, Optimizer::adam(1e-3), 4, 4, techniques)
    };
    let (whole, sharded) = (estimate(false), estimate(true));
    // Adam's two moments of every variable, in streaming memory: the kernels' (1024 x 1024
    // and 1024 x 10, over 8192 elements) a quarter each; the biases whole.
    let bytes = |elements: u64| 2 * elements * 2;
    assert_eq!(
        whole.ipus[0].streaming_memory_bytes,
        bytes(1024 * 1024 + 1024 + 1024 * 10 + 10)
    );
    assert_eq!(
        sharded.ipus[0].streaming_memory_bytes,
        bytes(1024 * 1024 / 4 + 1024 + 1024 * 10 / 4 + 10)
    );
    // Loading, updating and storing a quarter: a shorter weight update.
    assert!(
        sharded.weight_update_cycles * 2 < whole.weight_update_cycles,
        "{} vs {}",
        sharded.weight_update_cycles,
        whole.weight_update_cycles
    );
    // The gradients' reduce-scatter and the weights' all-gather move what the all-reduce did.
    assert_eq!(sharded.all_reduce_cycles, whole.all_reduce_cycles);
}
