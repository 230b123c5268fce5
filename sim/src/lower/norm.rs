//! Normalisation on tiles, as poplibs' norms decompose it: a statistics compute set (a
//! reduction per group: mean and variance, and for the gradient the means of `dy` and
//! `dy * xhat`), then an element-wise compute set laid out like `x` that reads its group's
//! statistics.

use tessera_core::ops::norm::Norm;
use tessera_core::{DType, NodeId, Storage};

use super::{broadcast_reads, reduce, Lowering};
use crate::cost;
use crate::program::{Codelet, Interval, Region, Vertex};

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Norm) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, shape) = (node.dtype(), node.shape());
    let (x, dy, axes, passes) = match *op {
        Norm::Normalize { x, axes, .. } => (x, None, axes, 2),
        Norm::NormalizeGrad { dy, x, axes, .. } => (x, Some(dy), axes, 4),
    };
    let xt = l.t(x);
    let dyt = dy.map(|d| l.t(d));
    let kept = tessera_core::ops::reduce::reduced(shape, axes, true);
    let groups = kept.elements() as u64;
    let per_group = (shape.elements() as u64 / groups.max(1)).max(1);
    // Statistics, two f32 values per group (mean and 1/sd), spread over the tiles by the
    // input each group reduces (as a reduction's output, see `Placement::Weighted`).
    let per_value = (per_group * dt.size() as u64 / 2).max(4);
    let mapping = l.linear(groups * 2, per_value, 2, 1);
    let stats = l.temporary(i, "statistics", DType::F32, groups * 2, mapping);
    let mut xs = vec![xt];
    xs.extend(dyt);
    if reduce::two_stage_pays(groups, per_group)
        && reduce::two_stage(l, i, &xs, shape, axes, stats, 2, passes)
    {
        normalize(l, i, &xs, stats, kept, passes);
        return;
    }
    let ivs: Vec<Interval> = l.tensors[stats.index()].mapping.intervals().to_vec();
    let vertices = ivs
        .iter()
        .map(|iv| {
            // Interval covers groups start/2 .. end/2 (two values each).
            let (g0, g1) = (iv.start / 2, iv.end().div_ceil(2));
            let mut reads = reduce::reads(xt, shape, axes, g0, g1 - g0);
            if let Some(d) = dyt {
                reads.extend(reduce::reads(d, shape, axes, g0, g1 - g0));
            }
            Vertex {
                tile: iv.tile,
                codelet: Codelet::Reduce,
                cycles: passes * cost::reduce_cycles(cfg, g1 - g0, per_group, dt),
                reads,
                writes: vec![Region::span(stats, iv.start, iv.len)],
            }
        })
        .collect();
    l.compute(i, "statistics", vertices);
    normalize(l, i, &xs, stats, kept, passes);
}

/// The element-wise pass: each element with its group's statistics.
fn normalize<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    same: &[crate::program::TensorId],
    stats: crate::program::TensorId,
    kept: tessera_core::Shape,
    passes: u64,
) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, shape) = (node.dtype(), node.shape());
    let out = l.t(i);
    l.elementwise(
        i,
        out,
        same,
        Codelet::Binary,
        move |n| passes * cost::elementwise_binary_cycles(cfg, n, dt),
        move |s, len| {
            // The statistics of the groups these elements belong to (two values per group).
            broadcast_reads(stats, kept, shape, s, len)
                .into_iter()
                .map(|r| Region::span(r.tensor, r.start * 2, r.len * 2))
                .collect()
        },
    );
}
