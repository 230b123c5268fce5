//! Reductions on tiles. A reduction to one value runs in two stages (a partial per tile where
//! the data is, then one vertex over the partials); a reduction that keeps some axes runs one
//! vertex per tile of the output, which receives the elements it reduces. Broadcasts copy the
//! operand's elements each output interval needs.

use tessera_core::ops::reduce::Reduce;
use tessera_core::{DType, NodeId, Shape, Storage};

use super::{broadcast_reads, Lowering};
use crate::cost::{self, UnaryKind};
use crate::program::{compress, Codelet, Interval, Mapping, Region, TensorId, Vertex};

/// Row-major strides of a shape.
fn strides(s: Shape) -> Vec<u64> {
    let mut st = vec![0u64; s.rank()];
    let mut acc = 1u64;
    for i in (0..s.rank()).rev() {
        st[i] = acc;
        acc *= s.dim(i) as u64;
    }
    st
}

/// The regions of `x` (shape `sx`) that output elements `start .. start + len` of a reduction
/// over `axes` read.
pub(super) fn reads(
    x: TensorId,
    sx: Shape,
    axes: tessera_core::ops::Axes,
    start: u64,
    len: u64,
) -> Vec<Region> {
    let r = sx.rank();
    let st = strides(sx);
    let kept: Vec<usize> = (0..r).filter(|&a| !axes.contains(a)).collect();
    // The trailing reduced axes are one contiguous run per output element.
    let mut run = 1u64;
    let mut tail = r;
    while tail > 0 && axes.contains(tail - 1) {
        tail -= 1;
        run *= sx.dim(tail) as u64;
    }
    let inner: Vec<usize> = (0..tail).filter(|&a| axes.contains(a)).collect();
    // When the last axes are kept, consecutive outputs along them read consecutive elements:
    // one span per reduced coordinate for each such segment of the output.
    let mut seg = 1u64;
    if tail == r {
        let mut a = r;
        while a > 0 && !axes.contains(a - 1) {
            a -= 1;
            seg *= sx.dim(a) as u64;
        }
    }
    let count: u64 = inner.iter().map(|&a| sx.dim(a) as u64).product();
    let mut out = Vec::new();
    let mut o = start;
    while o < start + len {
        let piece = (seg - o % seg).min(start + len - o);
        // The output element's kept coordinates give its base offset in x.
        let (mut rem, mut base) = (o, 0u64);
        for &a in kept.iter().rev() {
            let d = sx.dim(a) as u64;
            base += (rem % d) * st[a];
            rem /= d;
        }
        for c in 0..count {
            let (mut rem, mut off) = (c, base);
            for &a in inner.iter().rev() {
                let d = sx.dim(a) as u64;
                off += (rem % d) * st[a];
                rem /= d;
            }
            out.push(Region::span(x, off, if seg > 1 { piece } else { run }));
        }
        o += if seg > 1 { piece } else { 1 };
    }
    out.sort_unstable();
    out.dedup();
    compress(out)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Reduce) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, so) = (node.dtype(), node.shape());
    let out = l.t(i);
    match *op {
        Reduce::Broadcast { x } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            l.per_tile(
                i,
                "broadcast",
                out,
                Codelet::Broadcast,
                move |n| UnaryKind::Copy.cycles(cfg, n, dt),
                |iv| {
                    (
                        broadcast_reads(xt, sx, so, iv.start, iv.len),
                        vec![Region::span(out, iv.start, iv.len)],
                    )
                },
            );
        }
        Reduce::Reduce { x, axes, .. } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let per_output = (sx.elements() / so.elements().max(1)) as u64;
            if so.elements() == 1 {
                // Reduce everything: partials where the data is, then one final reduction.
                let ivs: Vec<Interval> = l.tensors[xt.index()].mapping.intervals().to_vec();
                let mapping = Mapping::from_intervals(
                    ivs.iter()
                        .enumerate()
                        .map(|(g, iv)| Interval {
                            tile: iv.tile,
                            start: g as u64,
                            len: 1,
                        })
                        .collect(),
                );
                let partials = l.temporary(i, "partials", DType::F32, ivs.len() as u64, mapping);
                let stage1 = ivs
                    .iter()
                    .enumerate()
                    .map(|(g, iv)| Vertex {
                        tile: iv.tile,
                        codelet: Codelet::Reduce,
                        cycles: cost::reduce_cycles(cfg, 1, iv.len, dt),
                        reads: vec![Region::span(xt, iv.start, iv.len)],
                        writes: vec![Region::span(partials, g as u64, 1)],
                    })
                    .collect();
                l.compute(i, "partials", stage1);
                let n = ivs.len() as u64;
                let v = Vertex {
                    tile: l.first_tile(out),
                    codelet: Codelet::Reduce,
                    cycles: cost::reduce_cycles(cfg, 1, n, DType::F32),
                    reads: vec![Region::span(partials, 0, n)],
                    writes: vec![Region::span(out, 0, 1)],
                };
                l.compute(i, "reduce", vec![v]);
                return;
            }
            let ivs: Vec<Interval> = l.tensors[out.index()].mapping.intervals().to_vec();
            let vertices = ivs
                .iter()
                .map(|iv| Vertex {
                    tile: iv.tile,
                    codelet: Codelet::Reduce,
                    cycles: cost::reduce_cycles(cfg, iv.len, per_output, dt),
                    reads: reads(xt, sx, axes, iv.start, iv.len),
                    writes: vec![Region::span(out, iv.start, iv.len)],
                })
                .collect();
            l.compute(i, "reduce", vertices);
        }
    }
}
