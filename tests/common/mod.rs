//! Shared test helpers: random graphs.
#![allow(dead_code, clippy::result_large_err)]

use proptest::prelude::*;
use tessera::core::{DType, Fixed, Graph, Init, NodeId, Optimizer, Plan, Roles, Storage};

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
            0u8..14,
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

/// Builds a random graph; builder errors (shape mismatches) just skip the step, as a user
/// correcting a model would.
pub fn build(rows: usize, cols: usize, steps: &[Step], train: bool) -> Option<Graph<Fixed<160>>> {
    let mut g: Graph<Fixed<160>> = Graph::new();
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
