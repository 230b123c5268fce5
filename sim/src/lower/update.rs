//! Updates of state on tiles: each runs where its variable lives (optimizer state and
//! accumulators are laid out like it), so the only exchange brings the gradient.

use tessera_core::ops::update::Update;
use tessera_core::{NodeId, Storage};

use super::Lowering;
use crate::cost::{self, UnaryKind};
use crate::program::{Codelet, Region, TensorClass, TensorId, Vertex};

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Update) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let scaled_add = move |n| cost::scaled_add_cycles(cfg, n, dt);
    match *op {
        Update::Sgd { var, grad, .. } => {
            let (var, grad) = (l.t(var), l.t(grad));
            per_variable(l, i, var, &[grad], scaled_add);
        }
        Update::Momentum {
            var,
            velocity,
            grad,
            ..
        } => {
            let (var, velocity, grad) = (l.t(var), l.t(velocity), l.t(grad));
            per_variable(l, i, var, &[velocity, grad], move |n| 2 * scaled_add(n));
        }
        Update::Adam {
            var,
            m,
            v,
            grad,
            step,
            ..
        } => {
            // Two moment updates, a square root, a divide and the scaled add.
            let c = move |n| {
                3 * scaled_add(n)
                    + UnaryKind::Sqrt.cycles(cfg, n, dt)
                    + UnaryKind::Reciprocal.cycles(cfg, n, dt)
            };
            let (var, m, v, grad, st) = (l.t(var), l.t(m), l.t(v), l.t(grad), l.t(step));
            l.per_tile_same(
                i,
                "update",
                var,
                Codelet::Update,
                c,
                &[var, m, v, grad],
                &[var, m, v],
                &[Region::span(st, 0, 1)],
            );
        }
        Update::Accumulate {
            acc, grad, counter, ..
        } => {
            let (acc, grad, ct) = (l.t(acc), l.t(grad), l.t(counter));
            l.per_tile_same(
                i,
                "accumulate",
                acc,
                Codelet::Update,
                scaled_add,
                &[acc, grad],
                &[acc],
                &[Region::span(ct, 0, 1)],
            );
        }
        Update::MovingAverage { x, value, .. } => {
            let (x, value) = (l.t(x), l.t(value));
            per_variable(l, i, x, &[value], scaled_add);
        }
        Update::Fill { x, .. } => {
            let x = l.t(x);
            let c = move |n| UnaryKind::Copy.cycles(cfg, n, dt);
            l.per_tile_same(i, "fill", x, Codelet::Copy, c, &[], &[x], &[]);
        }
        Update::Increment { counter } => {
            let ct = l.t(counter);
            let r = Region::span(ct, 0, 1);
            let v = Vertex {
                tile: l.first_tile(ct),
                codelet: Codelet::Update,
                // Estimate: a load, an add and a store, with the vertex's setup.
                cycles: cost::compute_set_overhead_cycles() + 20,
                reads: vec![r],
                writes: vec![r],
            };
            l.compute(i, "increment", vec![v]);
        }
        _ => {}
    }
}

/// A vertex per tile of `var` updating it from `others` (state among them is written too).
fn per_variable<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    var: TensorId,
    others: &[TensorId],
    cycles: impl Fn(u64) -> u64,
) {
    let writes_state: Vec<TensorId> = others
        .iter()
        .copied()
        .filter(|&x| l.tensors[x.index()].class == TensorClass::AlwaysLive)
        .collect();
    let mut reads = vec![var];
    reads.extend_from_slice(others);
    let mut writes = vec![var];
    writes.extend(writes_state);
    l.per_tile_same(
        i,
        "update",
        var,
        Codelet::Update,
        cycles,
        &reads,
        &writes,
        &[],
    );
}
