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

/// The regions of `x` (shape `sx`) that output rows `oy0..oy1` of plane `plane` read: one
/// output row of NCHW is a (image, channel) plane's row; of NHWC, an image's row of every
/// channel.
fn window_reads(
    t: TensorId,
    sx: Shape,
    layout: DataLayout,
    plane: u64,
    rows: (u64, u64),
) -> Region {
    let [ha, wa] = layout.spatial_axes();
    let (h, w) = (sx.dim(ha) as u64, sx.dim(wa) as u64);
    let c = sx.dim(layout.channel_axis()) as u64;
    let (r0, r1) = (rows.0.min(h), rows.1.min(h).max(rows.0.min(h)));
    match layout {
        DataLayout::Nchw => Region::span(t, (plane * h + r0) * w, (r1 - r0) * w),
        DataLayout::Nhwc => Region::span(t, (plane * h + r0) * w * c, (r1 - r0) * w * c),
    }
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
    let window = u64::from(p.kernel[0] * p.kernel[1]);
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
            for (row, _, _) in row_segments(iv.start, iv.len, row_len) {
                let (plane, r) = (row / rows_per_plane, row % rows_per_plane);
                if forward {
                    let lo = (r * s).saturating_sub(pad);
                    reads.push(window_reads(
                        xt,
                        sx,
                        p.layout,
                        plane,
                        (lo, r * s + k - pad.min(r * s + k)),
                    ));
                } else {
                    // This input row is covered by output rows lo..=hi.
                    let lo = (r + pad).saturating_sub(k - 1).div_ceil(s);
                    let hi = (r + pad) / s + 1;
                    reads.push(window_reads(xt, sx, p.layout, plane, (r, r + 1)));
                    if let Some((gt, sg)) = dyt {
                        reads.push(window_reads(gt, sg, p.layout, plane, (lo, hi)));
                    }
                }
            }
            out_reads.extend(reads.into_iter().filter(|r| r.elements() > 0));
        },
    );
}
