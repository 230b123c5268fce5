//! Pooling on tiles: the output is spread over the tiles, and each tile's vertex receives the
//! input rows its windows cover and reduces each window (a small reduction per output). The
//! gradient is the same work in reverse: each input element gathers the windows that cover
//! it, the forward's (window, output) pairs in all, each costing more (a compare with the
//! forward's values and a conditional add).

use tessera_core::ops::conv::DataLayout;
use tessera_core::ops::pool::Pool;
use tessera_core::{NodeId, Shape, Storage};

use super::{row_segments, Lowering, Placement};
use crate::cost;
use crate::program::{Codelet, Region, TensorId, VertexType, REDUCE_OTHER};

/// The region of `x` (shape `sx`) that rows `rows` and columns `cols` of plane `plane` make:
/// one output row of NCHW is a (image, channel) plane's row; of NHWC, an image's row of every
/// channel. Rows and columns are clamped to the plane; the columns of each row are read, a
/// row's width apart (popnn's pooling vertices receive the part of each input row their
/// windows cover, not the whole row).
fn window_reads(
    t: TensorId,
    sx: Shape,
    layout: DataLayout,
    plane: u64,
    rows: (u64, u64),
    cols: (u64, u64),
) -> Region {
    let [ha, wa] = layout.spatial_axes();
    let (h, w) = (sx.dim(ha) as u64, sx.dim(wa) as u64);
    let c = match layout {
        DataLayout::Nchw => 1,
        DataLayout::Nhwc => sx.dim(layout.channel_axis()) as u64,
    };
    let (r0, r1) = (rows.0.min(h), rows.1.min(h).max(rows.0.min(h)));
    let (c0, c1) = (cols.0.min(w), cols.1.min(w).max(cols.0.min(w)));
    if c1 == c0 || r1 == r0 {
        return Region::span(t, 0, 0);
    }
    Region::strided(
        t,
        ((plane * h + r0) * w + c0) * c,
        (c1 - c0) * c,
        r1 - r0,
        w * c,
    )
}

/// The input columns the windows of output columns `c0 .. c1` cover (before clamping to the
/// input): `stride` apart, `kernel` wide, `pad` before.
fn covered_columns(c0: u64, c1: u64, stride: u64, kernel: u64, pad: u64) -> (u64, u64) {
    if c1 <= c0 {
        return (0, 0);
    }
    let lo = (c0 * stride).saturating_sub(pad);
    let hi = ((c1 - 1) * stride + kernel).saturating_sub(pad);
    (lo, hi)
}

/// The output columns whose windows cover input columns `c0 .. c1`: those `o` with
/// `o * stride - pad <= c < o * stride - pad + kernel` for some `c` there.
fn covering_columns(c0: u64, c1: u64, stride: u64, kernel: u64, pad: u64) -> (u64, u64) {
    if c1 <= c0 {
        return (0, 0);
    }
    let lo = (c0 + pad).saturating_sub(kernel - 1).div_ceil(stride);
    let hi = (c1 - 1 + pad) / stride + 1;
    (lo, hi)
}

/// Where a pooling's output goes: spread by rows, as a new tensor.
pub(super) fn placement(_op: &Pool) -> Placement {
    Placement::Rows(1)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Pool) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, so) = (node.dtype(), node.shape());
    let out = l.t(i);
    let (p, x, dy) = match *op {
        Pool::Forward { x, p } => (p, x, None),
        Pool::Backward { dy, x, p } => (p, x, Some(dy)),
    };
    let (xt, sx) = (l.t(x), l.node(x).shape());
    let dyt = dy.map(|d| (l.t(d), l.node(d).shape()));
    let window = u64::from(p.kernel[0]) * u64::from(p.kernel[1]);
    let [ha, wa] = p.layout.spatial_axes();
    // Rows of the output tensor of this op: an NCHW row is one plane's row, an NHWC row one
    // image's row over every channel.
    let row_len = match p.layout {
        DataLayout::Nchw => so.dim(wa) as u64,
        DataLayout::Nhwc => (so.dim(wa) * so.dim(3)) as u64,
    };
    let rows_per_plane = so.dim(ha) as u64;
    let (s, pad, k) = (
        u64::from(p.stride[0]),
        u64::from(p.pads[0]),
        u64::from(p.kernel[0]),
    );
    let (sw, kw, pad_w) = (
        u64::from(p.stride[1]),
        u64::from(p.kernel[1]),
        u64::from(p.pads[1]),
    );
    // Elements of an output row per column: 1 in NCHW, the channels in NHWC.
    let channels = match p.layout {
        DataLayout::Nchw => 1,
        DataLayout::Nhwc => so.dim(3) as u64,
    };
    let forward = dy.is_none();
    // The gradient visits the forward's (window, output) pairs, not a window per input
    // element: popnn's `MaxPoolingGrad` walks the forward's work lists, each kernel position
    // over the outputs it feeds. So a tile's share of the input gradient costs the forward
    // outputs of the same share, at popnn's backward price per vector against the forward's
    // (`poolVertexCyclesPerVector`, `lib/popnn/PerformanceEstimation.hpp`: 5 and 3).
    let (fwd_outputs, bwd_outputs) = match dyt {
        Some((_, sg)) => (sg.elements() as u64, so.elements() as u64),
        None => (1, 1),
    };
    let price = move |n: u64| {
        if forward {
            cost::reduce_cycles(cfg, n, window, dt)
        } else {
            let n_fwd = (u128::from(n) * u128::from(fwd_outputs))
                .div_ceil(u128::from(bwd_outputs.max(1))) as u64;
            cost::reduce_cycles(cfg, n_fwd, window, dt) * cfg.codelets.pool_grad_cycles_per_vector
                / cfg.codelets.pool_cycles_per_vector.max(1)
        }
    };
    l.per_tile(
        i,
        "pool",
        out,
        Codelet::Reduce(VertexType::of(REDUCE_OTHER, dt)),
        price,
        |iv, out_reads| {
            let mut reads = Vec::new();
            for (row, c0, c1) in row_segments(iv.start, iv.len, row_len) {
                let (plane, r) = (row / rows_per_plane, row % rows_per_plane);
                // The segment's columns of the output (forward) or of the input (backward).
                let (c0, c1) = (c0 / channels, (c1 - 1) / channels + 1);
                if forward {
                    let lo = (r * s).saturating_sub(pad);
                    let cols = covered_columns(c0, c1, sw, kw, pad_w);
                    reads.push(window_reads(
                        xt,
                        sx,
                        p.layout,
                        plane,
                        (lo, r * s + k - pad.min(r * s + k)),
                        cols,
                    ));
                } else {
                    // This input row is covered by output rows lo..=hi.
                    let lo = (r + pad).saturating_sub(k - 1).div_ceil(s);
                    let hi = (r + pad) / s + 1;
                    reads.push(window_reads(xt, sx, p.layout, plane, (r, r + 1), (c0, c1)));
                    if let Some((gt, sg)) = dyt {
                        let cols = covering_columns(c0, c1, sw, kw, pad_w);
                        reads.push(window_reads(gt, sg, p.layout, plane, (lo, hi), cols));
                    }
                }
            }
            out_reads.extend(reads.into_iter().filter(|r| r.elements() > 0));
        },
    );
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{covered_columns, covering_columns};

    /// Every value from the first of `v` to its last.
    fn hull(v: &[u64]) -> Vec<u64> {
        match (v.first(), v.last()) {
            (Some(&a), Some(&b)) => (a..=b).collect(),
            _ => Vec::new(),
        }
    }

    proptest! {
        /// The columns a run of windows covers, and the windows covering a run of columns,
        /// span exactly those a walk over every window finds (clamped to the input's width):
        /// from its first to its last, the gaps a stride wider than the window leaves
        /// included.
        #[test]
        fn windows_and_columns_agree_with_a_walk(
            w in 1u64..40,
            kernel in 1u64..8,
            stride in 1u64..4,
            pad in 0u64..4,
            a in 0u64..40,
            b in 0u64..40,
        ) {
            prop_assume!(pad < kernel);
            let outputs = (w + 2 * pad).saturating_sub(kernel) / stride + 1;
            let window = |o: u64| (o * stride).saturating_sub(pad)..(o * stride + kernel - pad).min(w);
            // Forward: outputs a..b (within the output) read these input columns.
            let (o0, o1) = (a.min(b).min(outputs), a.max(b).min(outputs));
            let (lo, hi) = covered_columns(o0, o1, stride, kernel, pad);
            let read: Vec<u64> = (0..w).filter(|&c| (lo..hi.min(w)).contains(&c)).collect();
            let walked: Vec<u64> = (0..w).filter(|&c| (o0..o1).any(|o| window(o).contains(&c))).collect();
            prop_assert_eq!(hull(&read), hull(&walked));
            // Backward: input columns a..b gather from these outputs.
            let (c0, c1) = (a.min(b).min(w), a.max(b).min(w));
            let (lo, hi) = covering_columns(c0, c1, stride, kernel, pad);
            let got: Vec<u64> = (0..outputs).filter(|&o| (lo..hi).contains(&o)).collect();
            let walked: Vec<u64> = (0..outputs).filter(|&o| window(o).any(|c| (c0..c1).contains(&c))).collect();
            prop_assert_eq!(hull(&got), hull(&walked));
        }
    }
}
