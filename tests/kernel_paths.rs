//! The kernels' `f32` fast paths give the element-by-element results bit for bit: element-wise
//! functions of one operand, two operands where one repeats along the leading axes (a bias,
//! either side), and reductions over leading axes (sum, mean, max; NaN and infinities too).
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use tessera::core::ops::elementwise::BinaryFn;
use tessera::core::ops::reduce::ReduceKind;
use tessera::core::{DType, Graph, NodeId, Plan};
use tessera::sim::Heap;

/// Values with NaN, infinities, zeros of both signs and fractions that round.
fn value(i: usize, salt: usize) -> f32 {
    match (i * 31 + salt * 17) % 61 {
        0 => f32::NAN,
        1 => f32::INFINITY,
        2 => f32::NEG_INFINITY,
        3 => -0.0,
        4 => 0.0,
        r => (r as f32 - 30.3) / 3.7 * (1.0 + (i % 7) as f32 * 1e-3),
    }
}

fn elements(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Runs the graph made by `build` on inputs `x` (dims `a`) and `y` (dims `b`) and returns the
/// output's values.
fn run(
    a: &[usize],
    b: &[usize],
    build: impl FnOnce(&mut Graph<Heap>, NodeId, NodeId) -> NodeId,
) -> Vec<f32> {
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", a, DType::F32).unwrap();
    let y = g.input("y", b, DType::F32).unwrap();
    let out = build(&mut g, x, y);
    g.mark_output(out).unwrap();
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let state = vec![0u8; plan.state_bytes()];
    plan.fill_input("x", &mut arena, elements(a), |i| value(i, 1))
        .unwrap();
    plan.fill_input("y", &mut arena, elements(b), |i| value(i, 2))
        .unwrap();
    plan.infer(&mut arena, &state).unwrap();
    plan.tensor(out, &arena, &state).unwrap().iter().collect()
}

/// numpy's broadcast index of output element `o` (dims `out`) into an operand of dims `dims`.
fn source(o: usize, out: &[usize], dims: &[usize]) -> usize {
    let pad = out.len() - dims.len();
    let (mut rest, mut index, mut stride) = (o, 0, 1);
    for axis in (0..out.len()).rev() {
        let coord = rest % out[axis];
        rest /= out[axis];
        if axis >= pad {
            let d = dims[axis - pad];
            if d != 1 {
                index += coord * stride;
            }
            stride *= d;
        }
    }
    index
}

/// Equal bits, except that NaNs only need to be NaN (Rust leaves their payload and sign open,
/// and the compiler may swap the operands of an addition).
fn same_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}: element {i}: {g} is not NaN");
        } else {
            assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} != {w}");
        }
    }
}

#[test]
fn binary_functions_with_a_repeated_operand_match_the_walk() {
    let fns = [
        BinaryFn::Add,
        BinaryFn::Sub,
        BinaryFn::Mul,
        BinaryFn::Div,
        BinaryFn::ReluGrad,
        BinaryFn::Max,
    ];
    // (a, b): b or a repeats (a bias); the last two broadcast otherwise (the walk).
    let shapes: [(&[usize], &[usize]); 7] = [
        (&[32, 10], &[10]),
        (&[10], &[32, 10]),
        (&[2, 3, 4], &[1, 4]),
        (&[2, 3, 4], &[3, 4]),
        (&[5, 7], &[5, 7]),
        (&[3, 1], &[3, 5]),
        (&[2, 1, 4], &[3, 1]),
    ];
    for f in fns {
        for (a, b) in shapes {
            let got = run(a, b, |g, x, y| g.binary("f", x, y, f).unwrap());
            let out: Vec<usize> = {
                let rank = a.len().max(b.len());
                let at =
                    |d: &[usize], i: usize| (i + d.len()).checked_sub(rank).map_or(1, |j| d[j]);
                (0..rank).map(|i| at(a, i).max(at(b, i))).collect()
            };
            let want: Vec<f32> = (0..elements(&out))
                .map(|o| {
                    let (i, j) = (source(o, &out, a), source(o, &out, b));
                    f.apply(value(i, 1), value(j, 2))
                })
                .collect();
            same_bits(&got, &want, &format!("{f:?} {a:?} {b:?}"));
        }
    }
}

#[test]
fn unary_functions_match_their_formula() {
    use tessera::core::ops::elementwise::UnaryFn;
    for f in [
        UnaryFn::Relu,
        UnaryFn::Neg,
        UnaryFn::Scale(0.3),
        UnaryFn::Identity,
        UnaryFn::Tanh,
    ] {
        let got = run(&[4, 33], &[1], |g, x, _| g.unary("f", x, f).unwrap());
        let want: Vec<f32> = (0..4 * 33).map(|i| f.apply(value(i, 1))).collect();
        same_bits(&got, &want, &format!("{f:?}"));
    }
}

#[test]
fn reductions_over_leading_axes_match_the_walk() {
    for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max] {
        // Leading axes (the fast path), then others (the walk), checked the same way.
        let cases: [(&[usize], &[isize]); 5] = [
            (&[32, 10], &[0]),
            (&[2, 3, 4], &[0, 1]),
            (&[2, 3, 4], &[0]),
            (&[6], &[0]),
            (&[2, 3, 4], &[1]),
        ];
        for (dims, axes) in cases {
            let got = run(dims, &[1], |g, x, _| {
                g.reduce("r", x, axes, true, kind).unwrap()
            });
            let reduced = |axis: usize| axes.contains(&(axis as isize));
            let kept: Vec<usize> = (0..dims.len())
                .map(|a| if reduced(a) { 1 } else { dims[a] })
                .collect();
            let count: usize = (0..dims.len())
                .filter(|&a| reduced(a))
                .map(|a| dims[a])
                .product();
            let want: Vec<f32> = (0..elements(&kept))
                .map(|o| {
                    let mut acc = if kind == ReduceKind::Max {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    };
                    // Terms in row-major order of the input, those landing on output `o`.
                    for i in 0..elements(dims) {
                        let mut rest = i;
                        let mut target = 0;
                        let mut stride = 1;
                        for axis in (0..dims.len()).rev() {
                            let c = rest % dims[axis];
                            rest /= dims[axis];
                            if !reduced(axis) {
                                target += c * stride;
                                stride *= dims[axis];
                            }
                        }
                        if target == o {
                            let v = value(i, 1);
                            acc = if kind == ReduceKind::Max {
                                acc.max(v)
                            } else {
                                acc + v
                            };
                        }
                    }
                    if kind == ReduceKind::Mean {
                        acc /= count as f32;
                    }
                    acc
                })
                .collect();
            same_bits(&got, &want, &format!("{kind:?} {dims:?} over {axes:?}"));
        }
    }
}

#[test]
fn bulk_copies_give_the_values_iter_gives() {
    for dtype in [DType::F32, DType::F16, DType::I32, DType::U8] {
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[3, 7], dtype).unwrap();
        g.mark_output(x).unwrap();
        let plan = Plan::new(&g).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let state = vec![0u8; plan.state_bytes()];
        plan.fill_input("x", &mut arena, 21, |i| value(i, 3).abs().min(200.0))
            .unwrap();
        let view = plan.tensor(x, &arena, &state).unwrap();
        let want: Vec<f32> = view.iter().collect();
        let mut all = vec![f32::NAN; 21];
        assert_eq!(view.copy_to(&mut all), 21);
        same_bits(&all, &want, &format!("{dtype:?}"));
        // A shorter buffer takes the first elements; a longer one keeps its tail.
        let mut some = [f32::NAN; 5];
        assert_eq!(view.copy_to(&mut some), 5);
        same_bits(&some, &want[..5], &format!("{dtype:?} first 5"));
        let mut more = vec![-1.0; 30];
        assert_eq!(view.copy_to(&mut more), 21);
        assert!(more[21..].iter().all(|&v| v == -1.0));
    }
}
