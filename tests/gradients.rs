//! Every differentiable op's gradient against central finite differences, on random shapes:
//! strides, padding, dilation, groups, broadcasting, axes and permutations.
//!
//! Each case builds `loss = sum(op(v...) * r)` over variables `v` and a fixed random `r`,
//! takes the analytic gradients from a training step, and compares them with
//! `(L(v + h) - L(v - h)) / 2h`, where `L` is evaluated in f64 on the host from the op's f32
//! output. Variables hold distinct values spaced `gap` apart (so no max, ReLU, clip or pooling
//! kink lies within `h` of any of them), and `h = min(gap / 4, 5e-3)`.

use proptest::prelude::*;
use tessera::core::ops::conv::{ConvParams, DataLayout, Padding};
use tessera::core::ops::elementwise::{BinaryFn, GeluForm, UnaryFn};
use tessera::core::ops::norm::BatchNorm;
use tessera::core::ops::pool::{PoolKind, PoolParams};
use tessera::core::ops::reduce::ReduceKind;
use tessera::core::rng::SplitMix64;
use tessera::core::{DType, Graph, Init, LstmStates, NodeId, Optimizer, Plan};
use tessera::sim::Heap;

/// Values of one variable: `Signed` in (-1, 1) away from 0, `Positive` in [0.5, 2].
#[derive(Clone, Copy, Debug, PartialEq)]
enum Range {
    Signed,
    Positive,
}

/// Checks the gradients of `build` (over variables of `shapes`) against finite differences.
fn check(
    shapes: &[(&[usize], Range)],
    seed: u64,
    build: impl Fn(&mut Graph<Heap>, &[NodeId]) -> NodeId,
) -> Result<(), TestCaseError> {
    let mut g: Graph<Heap> = Graph::new();
    let vars: Vec<NodeId> = shapes
        .iter()
        .enumerate()
        .map(|(k, (s, _))| {
            g.variable(&format!("v{k}"), s, DType::F32, Init::Zeros)
                .unwrap()
        })
        .collect();
    let out = build(&mut g, &vars);
    let out_shape: Vec<usize> = g
        .node(out)
        .shape()
        .dims()
        .iter()
        .map(|&d| d as usize)
        .collect();
    let r = g.input("r", &out_shape, DType::F32).unwrap();
    let prod = g.mul("weighted", out, r).unwrap();
    let loss = g.reduce_sum("loss", prod, None).unwrap();
    g.mark_output(out).unwrap();
    g.differentiate(loss, Optimizer::sgd(1e-3)).unwrap();
    for k in 0..vars.len() {
        if let Ok(id) = g.find(&format!("v{k}_grad")) {
            g.mark_output(id).unwrap();
        }
    }
    let plan = Plan::new(&g).unwrap();
    let mut rng = SplitMix64::new(seed);
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, seed).unwrap();
    // Distinct values: grid point m of `total` is (m + 0.5) / total, signed variables take
    // +-(0.05 + 0.9 t) with the sign alternating by m (same-sign neighbours 1.8 / total apart,
    // never within 0.05 of 0), positive ones 0.5 + 1.5 t.
    let total: usize = shapes
        .iter()
        .map(|(s, _)| s.iter().product::<usize>())
        .sum();
    let gap = 1.5 / total as f32;
    let mut order: Vec<usize> = (0..total).collect();
    rng.shuffle(&mut order);
    let mut next = order.into_iter();
    let mut values = Vec::new();
    for (k, (s, range)) in shapes.iter().enumerate() {
        let n: usize = s.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| grid_value(next.next().unwrap(), total, *range))
            .collect();
        plan.write_state(vars[k], &mut state, &v).unwrap();
        values.push(v);
    }
    let rv: Vec<f32> = (0..out_shape.iter().product::<usize>())
        .map(|_| rng.next_f32() * 2.0 - 1.0)
        .collect();
    plan.write_input(r, &mut arena, &rv).unwrap();
    let base_state = state.clone();
    plan.train_step(&mut arena, &mut state).unwrap();
    let grads: Vec<Option<Vec<f32>>> = (0..vars.len())
        .map(|k| {
            g.find(&format!("v{k}_grad"))
                .ok()
                .map(|id| plan.tensor(id, &arena, &state).unwrap().iter().collect())
        })
        .collect();
    let h = (gap / 4.0).min(5e-3);
    let loss_at = |st: &[u8], arena: &mut Vec<u8>| -> f64 {
        plan.infer(arena, st).unwrap();
        plan.tensor(out, arena, st)
            .unwrap()
            .iter()
            .zip(&rv)
            .map(|(a, b)| f64::from(a) * f64::from(*b))
            .sum()
    };
    for (k, v) in values.iter().enumerate() {
        // Every variable here reaches the output, so autodiff must have given it a gradient.
        let Some(grad) = &grads[k] else {
            return Err(TestCaseError::fail(format!("v{k} has no gradient")));
        };
        // A few elements of each variable.
        for j in (0..v.len()).step_by(v.len().div_ceil(6).max(1)) {
            let mut st = base_state.clone();
            let mut plus = v.clone();
            plus[j] += h;
            plan.write_state(vars[k], &mut st, &plus).unwrap();
            let lp = loss_at(&st, &mut arena);
            let mut minus = v.clone();
            minus[j] -= h;
            plan.write_state(vars[k], &mut st, &minus).unwrap();
            let lm = loss_at(&st, &mut arena);
            let fd = (lp - lm) / (2.0 * f64::from(h));
            let an = f64::from(grad[j]);
            prop_assert!(
                (fd - an).abs() <= 2e-3 + 2e-2 * an.abs().max(fd.abs()),
                "v{k}[{j}]: finite difference {fd} vs gradient {an}"
            );
        }
    }
    Ok(())
}

/// Grid point `m` of `total` as a value of `range` (see [`check`]).
fn grid_value(m: usize, total: usize, range: Range) -> f32 {
    let t = (m as f32 + 0.5) / total as f32;
    match range {
        Range::Signed if m % 2 == 0 => 0.05 + 0.9 * t,
        Range::Signed => -(0.05 + 0.9 * t),
        Range::Positive => 0.5 + 1.5 * t,
    }
}

/// A clip bound half-way between two same-sign grid values near `fraction` of the range.
fn clip_bound(total: usize, fraction: f32, negative: bool) -> f32 {
    let mut m = (total as f32 * fraction) as usize;
    if (m % 2 == 1) != negative {
        m += 1;
    }
    let t = (m as f32 + 1.5) / total as f32;
    if negative {
        -(0.05 + 0.9 * t)
    } else {
        0.05 + 0.9 * t
    }
}

fn shape(max_rank: usize, max_dim: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1..=max_dim, 1..=max_rank)
}

/// A shape and a shape that broadcasts against it (dims dropped on the left or set to 1).
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (shape(4, 4), any::<u8>(), 0usize..3).prop_map(|(a, mask, drop)| {
        let drop = drop.min(a.len() - 1);
        let b: Vec<usize> = a[drop..]
            .iter()
            .enumerate()
            .map(|(i, &d)| if mask & (1 << i) != 0 { 1 } else { d })
            .collect();
        if mask & 0x80 != 0 {
            (b, a)
        } else {
            (a, b)
        }
    })
}

const UNARY: [(UnaryFn, Range); 11] = [
    (UnaryFn::Neg, Range::Signed),
    (UnaryFn::Scale(-1.5), Range::Signed),
    (UnaryFn::Relu, Range::Signed),
    (UnaryFn::Sigmoid, Range::Signed),
    (UnaryFn::Tanh, Range::Signed),
    (UnaryFn::Exp, Range::Signed),
    (UnaryFn::Log, Range::Positive),
    (UnaryFn::Sqrt, Range::Positive),
    (UnaryFn::Erf, Range::Signed),
    (UnaryFn::Gelu(GeluForm::Erf), Range::Signed),
    (UnaryFn::Gelu(GeluForm::Tanh), Range::Signed),
];

const BINARY: [(BinaryFn, Range, Range); 7] = [
    (BinaryFn::Add, Range::Signed, Range::Signed),
    (BinaryFn::Sub, Range::Signed, Range::Signed),
    (BinaryFn::Mul, Range::Signed, Range::Signed),
    (BinaryFn::Div, Range::Signed, Range::Positive),
    (BinaryFn::Pow, Range::Positive, Range::Signed),
    (BinaryFn::Max, Range::Signed, Range::Signed),
    (BinaryFn::Min, Range::Signed, Range::Signed),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn unary_functions(s in shape(3, 5), f in 0..UNARY.len(), seed in any::<u64>()) {
        let (f, range) = UNARY[f];
        check(&[(&s, range)], seed, |g, v| g.unary("op", v[0], f).unwrap())?;
    }

    #[test]
    fn clip(s in shape(3, 5), seed in any::<u64>()) {
        let n: usize = s.iter().product();
        let (min, max) = (clip_bound(n, 0.3, true), clip_bound(n, 0.6, false));
        check(&[(&s, Range::Signed)], seed, |g, v| g.unary("op", v[0], UnaryFn::Clip { min, max }).unwrap())?;
    }

    #[test]
    fn binary_functions_broadcast((a, b) in broadcast_pair(), f in 0..BINARY.len(), seed in any::<u64>()) {
        let (f, ra, rb) = BINARY[f];
        check(&[(&a, ra), (&b, rb)], seed, |g, v| g.binary("op", v[0], v[1], f).unwrap())?;
    }

    #[test]
    fn select_broadcasts((a, b) in broadcast_pair(), seed in any::<u64>()) {
        check(&[(&a, Range::Signed), (&b, Range::Signed)], seed, |g, v| {
            let zero = g.constant("zero", &[], DType::F32, 0.0).unwrap();
            let cond = g.binary("cond", v[0], zero, BinaryFn::Greater).unwrap();
            g.select("op", cond, v[0], v[1]).unwrap()
        })?;
    }

    #[test]
    fn batched_matmul(batch in shape(2, 3), m in 1usize..4, k in 1usize..4, n in 1usize..4,
                      ta in any::<bool>(), tb in any::<bool>(), b_batched in any::<bool>(), seed in any::<u64>()) {
        let mut a = batch.clone();
        a.extend(if ta { [k, m] } else { [m, k] });
        let mut b = if b_batched { batch.clone() } else { Vec::new() };
        b.extend(if tb { [n, k] } else { [k, n] });
        check(&[(&a, Range::Signed), (&b, Range::Signed)], seed, |g, v| {
            g.matmul_t("op", v[0], v[1], ta, tb).unwrap()
        })?;
    }

    #[test]
    fn softmax_any_axis(s in shape(3, 4), axis in 0usize..3, seed in any::<u64>()) {
        let axis = (axis % s.len()) as isize;
        check(&[(&s, Range::Signed)], seed, |g, v| g.softmax_axis("op", v[0], axis).unwrap())?;
    }

    #[test]
    fn reductions(s in shape(4, 4), mask in 1u8..16, keep in any::<bool>(), kind in 0usize..3, seed in any::<u64>()) {
        let axes: Vec<isize> = (0..s.len()).filter(|a| mask & (1 << a) != 0).map(|a| a as isize).collect();
        let axes = if axes.is_empty() { vec![0] } else { axes };
        let kind = [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max][kind];
        check(&[(&s, Range::Signed)], seed, |g, v| g.reduce("op", v[0], &axes, keep, kind).unwrap())?;
    }

    #[test]
    fn layout_ops(s in shape(4, 4), perm_seed in any::<u64>(), which in 0usize..5, seed in any::<u64>()) {
        let r = s.len();
        let mut perm: Vec<usize> = (0..r).collect();
        SplitMix64::new(perm_seed).shuffle(&mut perm);
        let axis = perm[0];
        let two = [(&s[..], Range::Signed), (&s[..], Range::Signed)];
        let vars = if which == 1 || which == 4 { &two[..] } else { &two[..1] };
        check(vars, seed, |g, v| match which {
            0 => g.transpose("op", v[0], &perm).unwrap(),
            1 => g.concat_axis("op", v[0], v[1], axis as isize).unwrap(),
            2 => {
                let len = s[axis].div_ceil(2);
                g.slice("op", v[0], axis as isize, s[axis] - len, len).unwrap()
            }
            3 => {
                let u = g.unsqueeze("u", v[0], &[0]).unwrap();
                let t = g.transpose("t", u, &{ let mut p: Vec<usize> = (0..=r).collect(); p.rotate_left(1); p }).unwrap();
                g.squeeze("op", t, &[r as isize]).unwrap()
            }
            _ => {
                let n: usize = s.iter().product();
                let flat = g.reshape("flat", v[0], &[n]).unwrap();
                let b = g.reshape("b", v[1], &[n]).unwrap();
                g.mul("op", flat, b).unwrap()
            }
        })?;
    }

    #[test]
    fn convolutions(n in 1usize..3, cg in 1usize..3, og in 1usize..3, groups in 1u32..3,
                    h in 3usize..7, w in 3usize..7, kh in 1usize..4, kw in 1usize..4,
                    sh in 1u32..3, sw in 1u32..3, dh in 1u32..3, dw in 1u32..3,
                    pads in prop::array::uniform4(0u32..2), nhwc in any::<bool>(), seed in any::<u64>()) {
        let g_ = groups as usize;
        let (c, o) = (cg * g_, og * g_);
        let layout = if nhwc { DataLayout::Nhwc } else { DataLayout::Nchw };
        let x = if nhwc { vec![n, h, w, c] } else { vec![n, c, h, w] };
        let wt = if nhwc { vec![kh, kw, cg, o] } else { vec![o, cg, kh, kw] };
        let p = ConvParams::new(layout).stride(sh, sw).dilation(dh, dw).groups(groups);
        let fits = (h + (pads[0] + pads[2]) as usize) > (kh - 1) * dh as usize
            && (w + (pads[1] + pads[3]) as usize) > (kw - 1) * dw as usize;
        prop_assume!(fits);
        check(&[(&x, Range::Signed), (&wt, Range::Signed)], seed, |g, v| {
            g.conv2d("op", v[0], v[1], p, Padding::Explicit(pads)).unwrap()
        })?;
    }

    /// Transposed convolutions (ONNX `ConvTranspose`: a convolution's input gradient as an
    /// op of its own), through both operands.
    #[test]
    fn transposed_convolutions(n in 1usize..3, cg in 1usize..3, og in 1usize..3, groups in 1u32..3,
                    h in 3usize..7, w in 3usize..7, kh in 1usize..4, kw in 1usize..4,
                    sh in 1u32..3, sw in 1u32..3, pads in prop::array::uniform4(0u32..2),
                    seed in any::<u64>()) {
        let g_ = groups as usize;
        let (c, o) = (cg * g_, og * g_);
        let p = ConvParams::new(DataLayout::Nchw).stride(sh, sw).groups(groups).pads(pads);
        let fits = (h + (pads[0] + pads[2]) as usize) >= kh && (w + (pads[1] + pads[3]) as usize) >= kw;
        prop_assume!(fits);
        // The forward convolution's output: the transposed one's input.
        let oh = (h + (pads[0] + pads[2]) as usize - kh) / sh as usize + 1;
        let ow = (w + (pads[1] + pads[3]) as usize - kw) / sw as usize + 1;
        check(&[(&[n, o, oh, ow], Range::Signed), (&[o, cg, kh, kw], Range::Signed)], seed, |g, v| {
            g.conv2d_grad_input("op", v[0], v[1], p, &[n, c, h, w]).unwrap()
        })?;
    }

    #[test]
    fn pooling(n in 1usize..3, c in 1usize..3, h in 2usize..12, w in 2usize..12, k in 1u32..10, s in 1u32..3,
               pad in any::<bool>(), kind in 0usize..3, nhwc in any::<bool>(), seed in any::<u64>()) {
        let layout = if nhwc { DataLayout::Nhwc } else { DataLayout::Nchw };
        let x = if nhwc { vec![n, h, w, c] } else { vec![n, c, h, w] };
        let kind = [PoolKind::Max, PoolKind::Average { count_include_pad: true }, PoolKind::Average { count_include_pad: false }][kind];
        // Windows up to 9 x 9, padded by half the window (as YOLO's SPPF pads its 5, 9 and
        // 13 windows).
        let pads = if pad && k > 1 { [k / 2; 4] } else { [0; 4] };
        prop_assume!(h as u32 + pads[0] + pads[2] >= k && w as u32 + pads[1] + pads[3] >= k);
        check(&[(&x, Range::Signed)], seed, |g, v| {
            g.pool2d("op", v[0], PoolParams::new(kind, layout, [k, k], [s, s]), Padding::Explicit(pads)).unwrap()
        })?;
    }

    #[test]
    fn normalisation(s in shape(4, 4), mask in 1u8..16, which in 0usize..3, seed in any::<u64>()) {
        let axes: Vec<isize> = (0..s.len()).filter(|a| mask & (1 << a) != 0).map(|a| a as isize).collect();
        let axes = if axes.is_empty() { vec![s.len() as isize - 1] } else { axes };
        // Statistics need at least two elements per group.
        let group = match which {
            0 => axes.iter().map(|&a| s[a as usize]).product::<usize>(),
            1 => s[s.len() - 1],
            _ => s[1..].iter().product::<usize>(),
        };
        prop_assume!(group >= 2);
        check(&[(&s, Range::Signed)], seed, |g, v| match which {
            0 => g.normalize("op", v[0], &axes, 1e-3).unwrap(),
            1 => g.layer_norm("op", v[0], 1.min(s.len()), 1e-3).unwrap(),
            _ => {
                let bn = BatchNorm { axis: 0, epsilon: 1e-3, momentum: 0.9, training: true };
                g.batch_norm("op", v[0], bn).unwrap()
            }
        })?;
    }

    #[test]
    fn gather_rows(rows in 1usize..6, dim in 1usize..4, idx in prop::collection::vec(0usize..6, 1..6), seed in any::<u64>()) {
        let idx: Vec<f32> = idx.iter().map(|&i| (i % rows) as f32).collect();
        let table = [rows, dim];
        // The indices are a constant-like input: feed them through a cast of a variable-free
        // constant is not possible, so they come from an input written below.
        let mut g: Graph<Heap> = Graph::new();
        let t = g.variable("v0", &table, DType::F32, Init::Uniform { low: -1.0, high: 1.0 }).unwrap();
        let i = g.input("i", &[idx.len()], DType::I32).unwrap();
        let y = g.gather("op", t, i).unwrap();
        let loss = g.reduce_sum("loss", y, None).unwrap();
        g.differentiate(loss, Optimizer::sgd(1.0)).unwrap();
        g.mark_output("v0_grad").unwrap();
        let plan = Plan::new(&g).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, seed).unwrap();
        plan.write_input("i", &mut arena, &idx).unwrap();
        plan.train_step(&mut arena, &mut state).unwrap();
        let grad: Vec<f32> = plan.tensor("v0_grad", &arena, &state).unwrap().iter().collect();
        // d(sum of gathered rows)/d(table row r) = how many times r was gathered.
        for r in 0..rows {
            let count = idx.iter().filter(|&&i| i as usize == r).count() as f32;
            for c in 0..dim {
                prop_assert_eq!(grad[r * dim + c], count);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn lstm_and_attention(steps in 2usize..4, batch in 1usize..3, input in 1usize..3, hidden in 1usize..3, seed in any::<u64>()) {
        let x = [steps, batch, input];
        let w = [1, 4 * hidden, input];
        let r = [1, 4 * hidden, hidden];
        let b = [1, 8 * hidden];
        check(&[(&x, Range::Signed), (&w, Range::Signed), (&r, Range::Signed), (&b, Range::Signed)], seed, |g, v| {
            g.lstm_onnx("op", v[0], v[1], v[2], Some(v[3]), LstmStates::default()).unwrap().sequence
        })?;
        let q = [batch, steps, 2];
        check(&[(&q, Range::Signed)], seed, |g, v| {
            let layer = tessera::core::AttentionLayer { num_heads: 2, key_dim: 2, value_dim: None, dropout: 0.0, use_bias: true };
            g.multi_head_attention("op", v[0], v[0], layer, true, DType::F32).unwrap()
        })?;
    }
}

/// With the portable kernels (this binary never turns on the fast matmul, whose fused
/// multiply-adds round the unfolded product's terms once).
#[test]
fn direct_and_unfolded_convolutions_agree_bit_for_bit() {
    let mut rng = SplitMix64::new(3);
    for (layout, groups) in [
        (DataLayout::Nchw, 1),
        (DataLayout::Nchw, 2),
        (DataLayout::Nhwc, 1),
        (DataLayout::Nhwc, 3),
    ] {
        let (c, o) = (3 * groups, 2 * groups);
        let x = if layout == DataLayout::Nhwc {
            [2, 5, 6, c]
        } else {
            [2, c, 5, 6]
        };
        let w = if layout == DataLayout::Nhwc {
            [3, 2, 3, o]
        } else {
            [o, 3, 3, 2]
        };
        let mut g: Graph<Heap> = Graph::new();
        let xi = g.input("x", &x, DType::F32).unwrap();
        let wv = g
            .variable("w", &w, DType::F32, Init::GlorotUniform)
            .unwrap();
        let p = ConvParams::new(layout)
            .stride(2, 1)
            .dilation(1, 2)
            .groups(groups as u32);
        let y = g
            .conv2d("y", xi, wv, p, Padding::Explicit([1, 0, 1, 2]))
            .unwrap();
        let l = g.reduce_sum("l", y, None).unwrap();
        g.mark_output(y).unwrap();
        g.differentiate(l, Optimizer::sgd(0.1)).unwrap();
        g.mark_output("w_grad").unwrap();
        let values: Vec<f32> = (0..x.iter().product::<usize>())
            .map(|_| rng.next_f32() - 0.5)
            .collect();
        let run = |workspaces: bool| {
            let plan = Plan::with_workspaces(&g, workspaces).unwrap();
            let mut arena = vec![0u8; plan.arena_bytes()];
            let mut state = vec![0u8; plan.state_bytes()];
            plan.init_state(&mut state, 1).unwrap();
            plan.write_input("x", &mut arena, &values).unwrap();
            plan.train_step(&mut arena, &mut state).unwrap();
            let y: Vec<u32> = plan
                .tensor(y, &arena, &state)
                .unwrap()
                .iter()
                .map(f32::to_bits)
                .collect();
            let gw: Vec<u32> = plan
                .tensor("w_grad", &arena, &state)
                .unwrap()
                .iter()
                .map(f32::to_bits)
                .collect();
            (y, gw, plan.arena_bytes())
        };
        let (fast, slow) = (run(true), run(false));
        assert_eq!(fast.0, slow.0, "{layout:?} groups {groups}: outputs");
        assert_eq!(
            fast.1, slow.1,
            "{layout:?} groups {groups}: weight gradients"
        );
        assert!(slow.2 < fast.2, "no workspace, smaller arena");
    }
}
