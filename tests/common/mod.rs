//! Shared test helpers: random graphs.
#![allow(dead_code, clippy::result_large_err)]

use proptest::prelude::*;
use tessera::core::{DType, Graph, Init, NodeId, Optimizer, Plan, Roles, Storage};

/// One step of a random graph: an op kind and operand picks (taken modulo the pool).
#[derive(Clone, Debug)]
pub struct Step {
    kind: u8,
    a: usize,
    b: usize,
    width: usize,
    output: bool,
}

pub fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0u8..24,
            any::<usize>(),
            any::<usize>(),
            1usize..=6,
            prop::bool::weighted(0.15),
        )
            .prop_map(|(kind, a, b, width, output)| Step {
                kind,
                a,
                b,
                width,
                output,
            }),
        1..40,
    )
}

/// The graphs random tests build, on the simulator's heap storage: the one storage type the
/// simulator's tests use, so that its lowering is compiled into the test binary once.
pub type RandomGraph = Graph<tessera::sim::Heap>;

/// Builds a random graph; builder errors (shape mismatches) just skip the step, as a user
/// correcting a model would. Steps cover every op family: element-wise (broadcasting, GELU,
/// where), matmul, softmax on any axis, reductions that keep axes, transpose, concat, slice,
/// reshape (a view), layer normalisation, convolution, pooling.
pub fn build(rows: usize, cols: usize, steps: &[Step], train: bool) -> Option<RandomGraph> {
    use tessera::core::ops::conv::{DataLayout, Padding};
    use tessera::core::ops::elementwise::{BinaryFn, GeluForm, UnaryFn};
    use tessera::core::ops::pool::{PoolKind, PoolParams};
    use tessera::core::ops::reduce::ReduceKind;
    use tessera::core::Conv2dLayer;
    let mut g: RandomGraph = Graph::new();
    let x = g.input("x", &[rows, cols], DType::F32).ok()?;
    let mut pool: Vec<NodeId> = vec![x];
    for (i, s) in steps.iter().enumerate() {
        let a = pool[s.a % pool.len()];
        let b = pool[s.b % pool.len()];
        let name = format!("n{i}");
        let shape = g.node(a).shape();
        let made = match s.kind {
            0 => g.add(&name, a, b),
            1 => g.sub(&name, a, b),
            2 => g.mul(&name, a, b),
            3 => g.relu(&name, a),
            4 => g.sigmoid(&name, a),
            5 => g.tanh(&name, a),
            6 => g.softmax(&name, a),
            7 => g.scale(&name, a, 0.5),
            8 if shape.rank() == 2 => {
                let w = g.variable(
                    &format!("w{i}"),
                    &[shape.dim(1), s.width],
                    DType::F32,
                    Init::GlorotUniform,
                );
                w.and_then(|w| g.matmul(&name, a, w))
            }
            9 if shape.rank() == 2 => {
                let bias = g.variable(
                    &format!("b{i}"),
                    &[shape.dim(1)],
                    DType::F32,
                    Init::Uniform {
                        low: -1.0,
                        high: 1.0,
                    },
                );
                bias.and_then(|bias| g.bias_add(&name, a, bias))
            }
            10 => g.reduce_sum(&name, a, Some(0)),
            11 => g.tap(&name, a),
            12 => g.reshape(&name, a, &[shape.elements()]),
            13 => g.reduce_mean(&name, a, None),
            14 => g.unary(&name, a, UnaryFn::Gelu(GeluForm::Tanh)),
            15 => {
                let perm: Vec<usize> = (0..shape.rank()).rev().collect();
                g.transpose(&name, a, &perm)
            }
            16 => g.softmax_axis(&name, a, 0),
            17 => g
                .reduce(&format!("r{i}"), a, &[-1], true, ReduceKind::Max)
                .and_then(|r| g.binary(&name, a, r, BinaryFn::Sub)),
            18 => g.layer_norm(&name, a, 1, 1e-3),
            19 | 20 if shape.rank() == 2 => {
                let (r, c) = (shape.dim(0), shape.dim(1));
                g.reshape(&format!("img{i}"), a, &[1, r, c, 1])
                    .and_then(|img| {
                        if s.kind == 19 {
                            let mut conv = Conv2dLayer::new(2, [2, 2]);
                            conv.padding = Padding::Same;
                            let y = g.conv2d_layer(&format!("c{i}"), img, conv, DType::F32)?;
                            g.reshape(&name, y, &[r, 2 * c])
                        } else {
                            let p =
                                PoolParams::new(PoolKind::Max, DataLayout::Nhwc, [2, 2], [1, 1]);
                            let y = g.pool2d(&format!("p{i}"), img, p, Padding::Same)?;
                            g.reshape(&name, y, &[r, c])
                        }
                    })
            }
            21 => g.concat_axis(&name, a, b, 0),
            22 if shape.rank() > 0 && shape.last() > 1 => {
                let len = shape.last() / 2;
                g.slice(&name, a, -1, shape.last() - len, len)
            }
            23 => g
                .constant(&format!("zero{i}"), &[], DType::F32, 0.0)
                .and_then(|z| g.binary(&format!("m{i}"), a, z, BinaryFn::Greater))
                .and_then(|m| g.select(&name, m, a, b)),
            _ => g.reduce_mean(&name, a, None),
        };
        if let Ok(id) = made {
            if s.output {
                g.mark_output(id).ok()?;
            }
            pool.push(id);
        }
    }
    if train {
        // A scalar loss over the last float tensor that depends on a variable.
        let last = *pool.last()?;
        let loss = g.reduce_mean("loss", last, None).ok()?;
        g.differentiate(loss, Optimizer::sgd(0.01)).ok()?;
    }
    Some(g)
}

/// Every trainable variable's values, in graph order.
pub fn weights<S: Storage>(plan: &Plan<S>, state: &[u8]) -> Vec<f32> {
    let arena = vec![0u8; plan.arena_bytes()];
    let g = plan.graph();
    g.ids()
        .filter(|&id| g.node(id).roles().contains(Roles::TRAINABLE))
        .flat_map(|id| {
            plan.tensor(id, &arena, state)
                .unwrap()
                .iter()
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `a` equals `b` to 1e-5 relative (Euclidean norms).
pub fn close(a: &[f32], b: &[f32]) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.len(), b.len());
    let diff: f32 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f32>()
        .sqrt();
    let norm: f32 = b.iter().map(|y| y * y).sum::<f32>().sqrt();
    prop_assert!(
        diff <= 1e-5 * norm.max(1e-12),
        "relative difference {}",
        diff / norm
    );
    Ok(())
}
