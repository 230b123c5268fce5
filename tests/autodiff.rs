//! Autodiff against central finite differences, computed in f64 by an independent evaluator
//! of the same random MLPs.

use proptest::prelude::*;
use tessera::core::{Activation, DType, Fixed, Graph, Optimizer, Plan};

#[derive(Clone, Copy, Debug)]
enum Act {
    Linear,
    Relu,
    Sigmoid,
    Tanh,
}

#[derive(Clone, Debug)]
struct Mlp {
    batch: usize,
    inputs: usize,
    layers: Vec<(usize, Act)>,
    classes: usize,
    /// Softmax then cross-entropy on probabilities (the fused form), or from logits.
    softmax_then_ce: bool,
    x: Vec<f64>,
    labels: Vec<usize>,
}

fn act64(a: Act, v: f64) -> f64 {
    match a {
        Act::Linear => v,
        Act::Relu => v.max(0.0),
        Act::Sigmoid => 1.0 / (1.0 + (-v).exp()),
        Act::Tanh => v.tanh(),
    }
}

/// The loss in f64 for the given weights (kernel, bias per layer, then the output layer), and
/// the smallest distance of a ReLU pre-activation from its kink.
fn loss64(m: &Mlp, w: &[Vec<f64>]) -> (f64, f64) {
    let mut h = m.x.clone();
    let mut width = m.inputs;
    let mut kink = f64::INFINITY;
    let mut layers = m.layers.clone();
    layers.push((m.classes, Act::Linear));
    for (l, &(units, act)) in layers.iter().enumerate() {
        let (k, b) = (&w[2 * l], &w[2 * l + 1]);
        let mut out = vec![0.0; m.batch * units];
        for r in 0..m.batch {
            for j in 0..units {
                let mut s = b[j];
                for p in 0..width {
                    s += h[r * width + p] * k[p * units + j];
                }
                if matches!(act, Act::Relu) {
                    kink = kink.min(s.abs());
                }
                out[r * units + j] = act64(act, s);
            }
        }
        h = out;
        width = units;
    }
    let mut total = 0.0;
    for r in 0..m.batch {
        let row = &h[r * width..(r + 1) * width];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        total += lse - row[m.labels[r]];
    }
    (total / m.batch as f64, kink)
}

fn mlp() -> impl Strategy<Value = Mlp> {
    let act = prop_oneof![
        Just(Act::Linear),
        Just(Act::Relu),
        Just(Act::Sigmoid),
        Just(Act::Tanh)
    ];
    (
        1usize..=4,
        1usize..=5,
        prop::collection::vec((1usize..=6, act), 0..=2),
        2usize..=5,
        any::<bool>(),
    )
        .prop_flat_map(|(batch, inputs, layers, classes, softmax_then_ce)| {
            (
                prop::collection::vec(-2.0f64..2.0, batch * inputs),
                prop::collection::vec(0..classes, batch),
            )
                .prop_map(move |(x, labels)| Mlp {
                    batch,
                    inputs,
                    layers: layers.clone(),
                    classes,
                    softmax_then_ce,
                    x,
                    labels,
                })
        })
}

fn activation(a: Act) -> Activation {
    match a {
        Act::Linear => Activation::Linear,
        Act::Relu => Activation::Relu,
        Act::Sigmoid => Activation::Sigmoid,
        Act::Tanh => Activation::Tanh,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn gradients_match_central_differences(m in mlp(), seed in any::<u64>()) {
        let mut g: Graph<Fixed<128>> = Graph::new();
        let x = g.input("x", &[m.batch, m.inputs], DType::F32).unwrap();
        let labels = g.input("labels", &[m.batch], DType::I32).unwrap();
        let mut h = x;
        let mut names = Vec::new();
        for (l, &(units, act)) in m.layers.iter().enumerate() {
            let name = format!("Dense_{l}");
            h = g.dense(&name, h, units, activation(act), DType::F32).unwrap();
            names.push(name);
        }
        let out_name = "Dense_out".to_string();
        let logits = g.dense(&out_name, h, m.classes, Activation::Linear, DType::F32).unwrap();
        names.push(out_name);
        let loss = if m.softmax_then_ce {
            let p = g.softmax("probs", logits).unwrap();
            g.sparse_categorical_crossentropy("loss", p, labels, false).unwrap()
        } else {
            g.sparse_categorical_crossentropy("loss", logits, labels, true).unwrap()
        };
        g.differentiate(loss, Optimizer::sgd(1e-3)).unwrap();
        let mut vars = Vec::new();
        for n in &names {
            for v in ["kernel:0", "bias:0"] {
                let var = format!("{n}/{v}");
                g.mark_output(format!("{var}_grad").as_str()).unwrap();
                vars.push(var);
            }
        }
        let plan = Plan::new(&g).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, seed).unwrap();
        // Biases start at zero; give them values so the test also covers non-zero biases.
        for (i, var) in vars.iter().enumerate().filter(|(_, v)| v.ends_with("bias:0")) {
            let n = plan.tensor(var.as_str(), &arena, &state).unwrap().len();
            let vals: Vec<f32> = (0..n).map(|j| ((i * 7 + j * 3) % 11) as f32 / 11.0 - 0.5).collect();
            plan.write_state(var.as_str(), &mut state, &vals).unwrap();
        }
        let w: Vec<Vec<f64>> = vars
            .iter()
            .map(|v| plan.tensor(v.as_str(), &arena, &state).unwrap().iter().map(f64::from).collect())
            .collect();
        let xf: Vec<f32> = m.x.iter().map(|&v| v as f32).collect();
        let x64: Vec<f64> = xf.iter().map(|&v| f64::from(v)).collect();
        let m = Mlp { x: x64, ..m };
        plan.write_input("x", &mut arena, &xf).unwrap();
        plan.fill_input("labels", &mut arena, m.batch, |i| m.labels[i] as f32).unwrap();
        let (_, kink) = loss64(&m, &w);
        prop_assume!(kink > 1e-3);
        plan.train_step(&mut arena, &mut state).unwrap();

        let h = 1e-6;
        for (vi, var) in vars.iter().enumerate() {
            let grad: Vec<f64> = plan
                .tensor(format!("{var}_grad").as_str(), &arena, &state)
                .unwrap()
                .iter()
                .map(f64::from)
                .collect();
            let mut fd = vec![0.0; grad.len()];
            for (i, f) in fd.iter_mut().enumerate() {
                let mut wp = w.clone();
                wp[vi][i] += h;
                let mut wm = w.clone();
                wm[vi][i] -= h;
                *f = (loss64(&m, &wp).0 - loss64(&m, &wm).0) / (2.0 * h);
            }
            let diff: f64 = grad.iter().zip(&fd).map(|(a, b)| (a - b).powi(2)).sum::<f64>().sqrt();
            let norm: f64 = fd.iter().map(|v| v * v).sum::<f64>().sqrt();
            prop_assert!(
                diff <= 1e-2 * norm + 1e-5,
                "{var}: autodiff {grad:?} vs finite differences {fd:?} (relative error {})",
                diff / norm.max(1e-12)
            );
        }
    }
}

#[test]
fn fused_softmax_cross_entropy_skips_the_softmax_backward() {
    let mut g: Graph<Fixed<64>> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let labels = g.input("labels", &[2], DType::U8).unwrap();
    let p = g
        .dense("Dense_4", x, 4, Activation::Softmax, DType::F32)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", p, labels, false)
        .unwrap();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    let ops: Vec<&str> = g.nodes().iter().map(|n| n.op().name()).collect();
    assert!(!ops.contains(&"SoftmaxGrad"), "{ops:?}");
    let fused = g
        .nodes()
        .iter()
        .find(|n| n.op().name() == "SparseCategoricalCrossentropyGrad")
        .unwrap();
    assert!(matches!(
        fused.op(),
        tessera::core::Op::Loss(tessera::core::ops::loss::Loss::SparseCrossEntropyGrad {
            from_logits: true,
            ..
        })
    ));
}

#[test]
fn momentum_and_adam_state_is_flagged_and_updates_weights() {
    use tessera::core::Roles;
    for opt in [Optimizer::momentum(0.1, 0.9), Optimizer::adam(0.01)] {
        let mut g: Graph<Fixed<64>> = Graph::new();
        let x = g.input("x", &[4, 3], DType::F32).unwrap();
        let labels = g.input("labels", &[4], DType::I32).unwrap();
        let y = g
            .dense("Dense_2", x, 2, Activation::Linear, DType::F32)
            .unwrap();
        let loss = g
            .sparse_categorical_crossentropy("loss", y, labels, true)
            .unwrap();
        g.differentiate(loss, opt).unwrap();
        let state_nodes = g
            .nodes()
            .iter()
            .filter(|n| n.roles().contains(Roles::OPTIMIZER_STATE))
            .count();
        assert_eq!(
            state_nodes,
            2 * opt.slots_per_variable() + usize::from(matches!(opt, Optimizer::Adam { .. }))
        );
        let plan = Plan::new(&g).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, 3).unwrap();
        plan.fill_input("x", &mut arena, 12, |i| i as f32 / 12.0)
            .unwrap();
        plan.fill_input("labels", &mut arena, 4, |i| (i % 2) as f32)
            .unwrap();
        plan.train_step(&mut arena, &mut state).unwrap();
        let first = plan.tensor(loss, &arena, &state).unwrap().get(0);
        for _ in 0..100 {
            plan.train_step(&mut arena, &mut state).unwrap();
        }
        let last = plan.tensor(loss, &arena, &state).unwrap().get(0);
        assert!(last < first, "{opt:?}: loss {first} -> {last}");
        if matches!(opt, Optimizer::Adam { .. }) {
            let it = plan
                .tensor("optimizer/iterations", &arena, &state)
                .unwrap()
                .get(0);
            assert_eq!(it, 101.0);
        }
    }
}

#[test]
fn concat_gradients_match_finite_differences() {
    let mut g: Graph<Fixed<96>> = Graph::new();
    let x = g.input("x", &[3, 2], DType::F32).unwrap();
    let a = g.dense("A", x, 3, Activation::Tanh, DType::F32).unwrap();
    let b = g.dense("B", x, 2, Activation::Sigmoid, DType::F32).unwrap();
    let c = g.concat("C", a, b).unwrap();
    let sq = g.mul("sq", c, c).unwrap();
    let loss = g.reduce_mean("loss", sq, None).unwrap();
    g.mark_output(loss).unwrap();
    g.differentiate(loss, Optimizer::sgd(1e-9)).unwrap();
    for v in ["A/kernel:0", "B/kernel:0"] {
        g.mark_output(format!("{v}_grad").as_str()).unwrap();
    }
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 11).unwrap();
    plan.write_input("x", &mut arena, &[0.3, -0.7, 1.1, 0.4, -0.2, 0.9])
        .unwrap();
    let mut st = state.clone();
    plan.train_step(&mut arena, &mut st).unwrap();
    // Read every gradient before the forward runs below reuse the arena.
    let grads: Vec<Vec<f32>> = ["A/kernel:0", "B/kernel:0"]
        .iter()
        .map(|v| {
            plan.tensor(format!("{v}_grad").as_str(), &arena, &st)
                .unwrap()
                .iter()
                .collect()
        })
        .collect();
    for (v, grad) in ["A/kernel:0", "B/kernel:0"].into_iter().zip(grads) {
        let w: Vec<f32> = plan.tensor(v, &arena, &state).unwrap().iter().collect();
        for i in 0..w.len() {
            let h = 1e-2f32;
            let mut eval = |d: f32| {
                let mut s = state.clone();
                let mut wv = w.clone();
                wv[i] += d;
                plan.write_state(v, &mut s, &wv).unwrap();
                plan.infer(&mut arena, &s).unwrap();
                plan.tensor("loss", &arena, &s).unwrap().get(0)
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h);
            assert!(
                (fd - grad[i]).abs() <= 1e-2 * fd.abs().max(1e-2),
                "{v}[{i}]: autodiff {} vs finite differences {fd}",
                grad[i]
            );
        }
    }
}

/// The convolution-gradient builders make the ops autodiff makes: same op, operands'
/// shapes, geometry, output shape and type (the kernels are shared, so their numbers are too).
#[test]
fn conv_gradient_builders_match_autodiff() {
    use tessera::core::ops::conv::{Conv, ConvParams, DataLayout, Padding};
    use tessera::core::{Init, Op};
    let p = ConvParams::new(DataLayout::Nchw)
        .stride(2, 1)
        .pads([1, 0, 1, 2])
        .groups(2);
    let (xs, ws) = ([2usize, 4, 7, 6], [6usize, 2, 3, 3]);
    let mut g: Graph<Fixed<32>> = Graph::new();
    let x = g.variable("x", &xs, DType::F32, Init::Zeros).unwrap();
    let w = g.variable("w", &ws, DType::F32, Init::Zeros).unwrap();
    let y = g.conv2d("y", x, w, p, Padding::Explicit(p.pads)).unwrap();
    let loss = g.reduce_sum("loss", y, None).unwrap();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    let found = |want: &str| {
        let n = g.nodes().iter().find(|n| n.op().name() == want).unwrap();
        (n.shape(), n.dtype(), *n.op())
    };
    let (dx_shape, dx_type, dx_op) = found("ConvGradInput");
    let (dw_shape, dw_type, dw_op) = found("ConvGradWeight");
    let dy_shape = g.node(y).shape();

    let mut h: Graph<Fixed<8>> = Graph::new();
    let x2 = h.input("x", &xs, DType::F32).unwrap();
    let w2 = h.input("w", &ws, DType::F32).unwrap();
    let dims: Vec<usize> = dy_shape.dims().iter().map(|&d| d as usize).collect();
    let dy = h.input("dy", &dims, DType::F32).unwrap();
    let dx = h.conv2d_grad_input("dx", dy, w2, p, &xs).unwrap();
    let dw = h.conv2d_grad_weight("dw", x2, dy, p, &ws).unwrap();
    assert_eq!(
        (h.node(dx).shape(), h.node(dx).dtype()),
        (dx_shape, dx_type)
    );
    assert_eq!(
        (h.node(dw).shape(), h.node(dw).dtype()),
        (dw_shape, dw_type)
    );
    assert!(matches!((dx_op, *h.node(dx).op()),
        (Op::Conv(Conv::GradInput { p: a, .. }), Op::Conv(Conv::GradInput { p: b, .. })) if a == b));
    assert!(matches!((dw_op, *h.node(dw).op()),
        (Op::Conv(Conv::GradWeight { p: a, .. }), Op::Conv(Conv::GradWeight { p: b, .. })) if a == b));
    // An output gradient of the wrong shape is a typed error naming the node.
    let bad = h.input("bad", &[2, 6, 3, 3], DType::F32).unwrap();
    let e = h.conv2d_grad_input("dx2", bad, w2, p, &xs).unwrap_err();
    assert!(e.to_string().contains("dx2"), "{e}");
    assert!(h.conv2d_grad_weight("dw2", x2, bad, p, &ws).is_err());
}

#[test]
fn a_hand_written_sgd_update_checks_its_operands() {
    use tessera::core::{GraphError, Init};
    let mut g: Graph<Fixed<8>> = Graph::new();
    let w = g.variable("w", &[3, 2], DType::F32, Init::Zeros).unwrap();
    let dw = g.variable("dw", &[3, 2], DType::F32, Init::Zeros).unwrap();
    let wrong = g
        .variable("wrong", &[2, 3], DType::F32, Init::Zeros)
        .unwrap();
    let sum = g.add("sum", dw, dw).unwrap();
    let u = g.apply_sgd("w/update", w, sum, 0.1).unwrap();
    assert_eq!(g.node(u).op().name(), "ApplySgd");
    assert!(matches!(
        g.apply_sgd("u2", w, wrong, 0.1),
        Err(GraphError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        g.apply_sgd("u3", sum, dw, 0.1),
        Err(GraphError::BadAttribute { .. })
    ));
    assert!(Plan::new(&g).is_ok());
}

#[test]
fn each_backward_node_knows_the_rule_that_made_it() {
    let mut g: Graph<Fixed<256>> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let h = g.dense("d1", x, 4, Activation::Relu, DType::F32).unwrap();
    let logits = g.dense("d2", h, 2, Activation::Linear, DType::F32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", logits, labels, true)
        .unwrap();
    let forward = g.len();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    // Forward nodes have no origin; every gradient node has one, a forward node.
    assert!(g.nodes()[..forward].iter().all(|n| n.origin().is_none()));
    let mut made = 0;
    for n in &g.nodes()[forward..] {
        if let Some(o) = n.origin() {
            assert!(o.index() < forward, "{}", n.name());
            made += 1;
        }
    }
    assert!(made > 0);
    // The gradient of d1's output (named after it) is made by d2's product rule.
    let out = g.node(h).name().to_string();
    let grad = g.nodes()[forward..]
        .iter()
        .find(|n| n.name().starts_with(&format!("{out}_grad/")))
        .unwrap();
    let rule = g.node(grad.origin().unwrap()).name();
    assert!(rule.starts_with("d2"), "{} made by {rule}", grad.name());
}
