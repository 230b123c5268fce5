//! Convolutions on tiles, planned as poplibs plans them: per channel group, a product of
//! output positions (`batch x out height x out width`) by patch elements (`in channels / groups
//! x kernel height x kernel width`) by output channels, each block's partial sums on a tile's
//! AMP. Training's input-gradient convolution is the product of input positions by
//! (output channels x kernel) by input channels, and the weight-gradient convolution that of
//! output channels by positions by patch elements (as poplibs' transposed and weight-update
//! passes are).
//!
//! Each block reads the input rows its output rows need (the receptive field, with the
//! padding clipped) for the channels its reduction range covers, and the matching weights.

use tessera_core::ops::conv::{Conv, ConvDims, ConvParams, DataLayout};
use tessera_core::{NodeId, Storage};

use super::product::{Product, Range};
use super::Lowering;
use crate::planner::{Field, LaidOut, Operand};
use crate::program::{Region, TensorId};

/// Index helpers for an activation of `n x c x h x w` in `layout`.
#[derive(Clone, Copy)]
struct Act {
    layout: DataLayout,
    c: u64,
    h: u64,
    w: u64,
}

impl Act {
    /// The region of image `n`, rows `r0..r1` (all columns), channels `c0..c1`.
    fn rows(&self, t: TensorId, n: u64, r: Range, c: Range) -> Region {
        let (rows, cols) = (r.1 - r.0, c.1 - c.0);
        match self.layout {
            DataLayout::Nchw => Region::strided(
                t,
                ((n * self.c + c.0) * self.h + r.0) * self.w,
                rows * self.w,
                cols,
                self.h * self.w,
            ),
            DataLayout::Nhwc if cols == self.c => Region::span(
                t,
                (n * self.h + r.0) * self.w * self.c,
                rows * self.w * self.c,
            ),
            DataLayout::Nhwc => Region::strided(
                t,
                (n * self.h + r.0) * self.w * self.c + c.0,
                cols,
                rows * self.w,
                self.c,
            ),
        }
    }

    /// Element spans of positions `m0..m1` (flattened `n, row, col`) and channels `c0..c1`.
    fn spans(&self, m: Range, c: Range) -> Vec<(u64, u64)> {
        let p = self.h * self.w;
        match self.layout {
            DataLayout::Nhwc => (m.0..m.1)
                .map(|pos| (pos * self.c + c.0, c.1 - c.0))
                .collect(),
            DataLayout::Nchw => {
                let mut v = Vec::new();
                for ch in c.0..c.1 {
                    let mut pos = m.0;
                    while pos < m.1 {
                        let (img, at) = (pos / p, pos % p);
                        let len = (p - at).min(m.1 - pos);
                        v.push(((img * self.c + ch) * p + at, len));
                        pos += len;
                    }
                }
                v
            }
        }
    }

    /// For each image, the rows of the positions `m0..m1`: (image, first row, end row).
    fn images(&self, m: Range) -> Vec<(u64, u64, u64)> {
        let p = self.h * self.w;
        let mut v = Vec::new();
        let mut pos = m.0;
        while pos < m.1 {
            let img = pos / p;
            let end = ((img + 1) * p).min(m.1);
            v.push((img, (pos % p) / self.w, (end - 1 - img * p) / self.w + 1));
            pos = end;
        }
        v
    }
}

/// Input rows that output rows `oy0..oy1` read along one axis.
fn input_rows(o: Range, stride: u64, dilation: u64, pad: u64, k: u64, size: u64) -> Range {
    let lo = (o.0 * stride).saturating_sub(pad);
    let hi = ((o.1 - 1) * stride + (k - 1) * dilation + 1)
        .saturating_sub(pad)
        .min(size);
    (lo.min(hi), hi.max(lo.min(hi)))
}

/// Output rows that input rows `r0..r1` feed along one axis.
fn output_rows(r: Range, stride: u64, dilation: u64, pad: u64, k: u64, size: u64) -> Range {
    let lo = (r.0 + pad)
        .saturating_sub((k - 1) * dilation)
        .div_ceil(stride);
    let hi = ((r.1 - 1 + pad) / stride + 1).min(size);
    (lo.min(hi), hi)
}

/// Weight spans: rows of output channels `o` (within group `g`) by patch elements `q`, in the
/// weight tensor's layout.
fn weight_spans(d: &ConvDims, layout: DataLayout, g: u64, o: Range, q: Range) -> Vec<(u64, u64)> {
    let kk = (d.c / d.g * d.kh * d.kw) as u64;
    let (og, oc) = ((d.o / d.g) as u64, d.o as u64);
    match layout {
        // OIHW: [O, K] rows.
        DataLayout::Nchw => (o.0..o.1)
            .map(|r| ((g * og + r) * kk + q.0, q.1 - q.0))
            .collect(),
        // HWIO: [K, O] rows.
        DataLayout::Nhwc => (q.0..q.1)
            .map(|r| (r * oc + g * og + o.0, o.1 - o.0))
            .collect(),
    }
}

/// The input channels (absolute) patch elements `q` of group `g` cover.
fn patch_channels(d: &ConvDims, layout: DataLayout, g: u64, q: Range) -> Range {
    let cg = (d.c / d.g) as u64;
    let area = (d.kh * d.kw) as u64;
    let (c0, c1) = match layout {
        DataLayout::Nchw => (q.0 / area, (q.1 - 1) / area + 1),
        // (ky, kx, c): a range shorter than the channels may wrap; take them all then.
        DataLayout::Nhwc if q.1 - q.0 < cg && q.0 % cg <= (q.1 - 1) % cg => {
            (q.0 % cg, (q.1 - 1) % cg + 1)
        }
        DataLayout::Nhwc => (0, cg),
    };
    (g * cg + c0, g * cg + c1)
}

/// The output channels (within the group) the reduction range of an input-gradient block
/// covers: its `k` runs over (output channel, ky, kx).
fn grad_channels(d: &ConvDims, q: Range) -> Range {
    let area = (d.kh * d.kw) as u64;
    (q.0 / area, (q.1 - 1) / area + 1)
}

/// Convolution `i` (any of its three passes) as a product.
pub(super) fn product<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &Conv) -> Product {
    let node = l.node(i);
    let p: ConvParams = op.params();
    let (sx, sw) = match *op {
        Conv::Forward { x, w, .. } => (l.node(x).shape(), l.node(w).shape()),
        Conv::GradInput { w, .. } => (node.shape(), l.node(w).shape()),
        Conv::GradWeight { x, .. } => (l.node(x).shape(), node.shape()),
    };
    let tiles = u64::from(l.tile_count());
    let Ok(d) = ConvDims::of(sx, sw, &p) else {
        return Product {
            groups: 0,
            m: 0,
            k: 0,
            n: 0,
            tiles_per_group: tiles,
            laid_out: LaidOut::NONE,
            a: None,
            reads: Box::new(|_, _, _, _| Vec::new()),
            out: Box::new(|_, _, _| Vec::new()),
            b: None,
            field: None,
            kernel_area: 1,
        };
    };
    let groups = d.g as u64;
    let (cg, og) = ((d.c / d.g) as u64, (d.o / d.g) as u64);
    let area = (d.kh * d.kw) as u64;
    let input = Act {
        layout: p.layout,
        c: d.c as u64,
        h: d.h as u64,
        w: d.w as u64,
    };
    let output = Act {
        layout: p.layout,
        c: d.o as u64,
        h: d.oh as u64,
        w: d.ow as u64,
    };
    let (s0, d0, p0) = (
        u64::from(p.stride[0]),
        u64::from(p.dilation[0]),
        u64::from(p.pads[0]),
    );
    let (kh, h, oh) = (d.kh as u64, d.h as u64, d.oh as u64);
    let c = ConvCtx {
        d,
        p,
        input,
        output,
        s0,
        d0,
        p0,
        kh,
        h,
        oh,
        cg,
        og,
        area,
        per_group: (tiles / groups).max(1),
    };
    match *op {
        Conv::Forward { x, w, .. } => forward_product(l, i, c, x, w),
        Conv::GradInput { dy, w, .. } => grad_input_product(l, c, dy, w),
        Conv::GradWeight { x, dy, .. } => grad_weight_product(l, c, x, dy),
    }
}

/// What the three passes' products share: the sizes, the activations' layouts, the input
/// rows' stride, dilation and padding and the tiles of a group.
#[derive(Clone, Copy)]
struct ConvCtx {
    d: ConvDims,
    p: ConvParams,
    input: Act,
    output: Act,
    s0: u64,
    d0: u64,
    p0: u64,
    kh: u64,
    h: u64,
    oh: u64,
    /// Input and output channels of a group.
    cg: u64,
    og: u64,
    /// The kernel's area.
    area: u64,
    per_group: u64,
}

impl ConvCtx {
    /// The input read by blocks of output positions: the forward's left-hand operand, the
    /// weight update's right-hand one.
    fn input_field(&self, operand: Operand) -> Field {
        let d = &self.d;
        Field {
            operand,
            image: self.oh * d.ow as u64,
            width: d.ow as u64,
            source: (self.h, d.w as u64),
            rows: (self.s0, (self.kh - 1) * self.d0, 1),
            kernel_area: self.area,
            contributing: (1, 1),
        }
    }
}

/// The forward convolution `i` of `x` by `w` as a product: output positions by the patch
/// (input channels x kernel) by output channels.
fn forward_product<S: Storage>(
    l: &Lowering<'_, S>,
    i: NodeId,
    c: ConvCtx,
    x: NodeId,
    w: NodeId,
) -> Product {
    let ConvCtx {
        d,
        p,
        input,
        output,
        s0,
        d0,
        p0,
        kh,
        h,
        cg,
        og,
        area,
        per_group,
        ..
    } = c;
    let positions = |a: &Act| d.n as u64 * a.h * a.w;
    let (xt, wt) = (l.t(x), l.t(w));
    Product {
        groups: d.g,
        m: positions(&output),
        k: cg * area,
        n: og,
        tiles_per_group: per_group,
        laid_out: LaidOut {
            a: false,
            b: l.node(w).op().is_state() && l.first_consumer(w) == Some(i),
        },
        a: None,
        reads: Box::new(move |g, rm, rk, rn| {
            let g = g as u64;
            let ch = patch_channels(&d, p.layout, g, rk);
            let mut v: Vec<Region> = output
                .images(rm)
                .into_iter()
                .map(|(img, r0, r1)| {
                    let rows = input_rows((r0, r1), s0, d0, p0, kh, h);
                    input.rows(xt, img, rows, ch)
                })
                .filter(|r| r.elements() > 0)
                .collect();
            v.extend(
                weight_spans(&d, p.layout, g, rn, rk)
                    .into_iter()
                    .map(|(s, len)| Region::span(wt, s, len)),
            );
            v
        }),
        out: Box::new(move |g, rm, rn| {
            output.spans(rm, (g as u64 * og + rn.0, g as u64 * og + rn.1))
        }),
        b: Some(Box::new(move |g, rk, rn| {
            weight_spans(&d, p.layout, g as u64, rn, rk)
        })),
        field: Some(c.input_field(Operand::A)),
        kernel_area: area,
    }
}

/// The input gradient of a convolution as a product: input positions by (output channels x
/// kernel) by input channels, reading `dy` and the weights `w`.
fn grad_input_product<S: Storage>(
    l: &Lowering<'_, S>,
    c: ConvCtx,
    dy: NodeId,
    w: NodeId,
) -> Product {
    let ConvCtx {
        d,
        p,
        input,
        output,
        s0,
        d0,
        p0,
        kh,
        h,
        oh,
        cg,
        og,
        area,
        per_group,
        ..
    } = c;
    let positions = |a: &Act| d.n as u64 * a.h * a.w;
    let (gt, wt) = (l.t(dy), l.t(w));
    Product {
        groups: d.g,
        m: positions(&input),
        k: og * area,
        n: cg,
        tiles_per_group: per_group,
        laid_out: LaidOut::NONE,
        a: None,
        reads: Box::new(move |g, rm, rk, rn| {
            let g = g as u64;
            let oc = grad_channels(&d, rk);
            let abs = (g * og + oc.0, g * og + oc.1);
            let mut v: Vec<Region> = input
                .images(rm)
                .into_iter()
                .map(|(img, r0, r1)| {
                    let rows = output_rows((r0, r1), s0, d0, p0, kh, oh);
                    output.rows(gt, img, rows, abs)
                })
                .filter(|r| r.elements() > 0)
                .collect();
            let q = ((rn.0) * area, rn.1 * area);
            let q = match p.layout {
                DataLayout::Nchw => q,
                DataLayout::Nhwc => (0, cg * area),
            };
            v.extend(
                weight_spans(&d, p.layout, g, oc, q)
                    .into_iter()
                    .map(|(s, len)| Region::span(wt, s, len)),
            );
            v
        }),
        out: Box::new(move |g, rm, rn| {
            input.spans(rm, (g as u64 * cg + rn.0, g as u64 * cg + rn.1))
        }),
        b: None,
        field: Some(Field {
            operand: Operand::A,
            image: h * d.w as u64,
            width: d.w as u64,
            source: (oh, d.ow as u64),
            rows: (1, (kh - 1) * d0, s0),
            kernel_area: area,
            contributing: (
                h.div_ceil(s0.max(1)) * (d.w as u64).div_ceil(u64::from(p.stride[1]).max(1)),
                h * d.w as u64,
            ),
        }),
        kernel_area: area,
    }
}

/// The weight gradient of a convolution as a product: output channels by output positions by
/// the patch, reading `dy` and the input `x`.
fn grad_weight_product<S: Storage>(
    l: &Lowering<'_, S>,
    c: ConvCtx,
    x: NodeId,
    dy: NodeId,
) -> Product {
    let ConvCtx {
        d,
        p,
        input,
        output,
        s0,
        d0,
        p0,
        kh,
        h,
        oh,
        cg,
        og,
        area,
        per_group,
        ..
    } = c;
    let positions = |a: &Act| d.n as u64 * a.h * a.w;
    let (xt, gt) = (l.t(x), l.t(dy));
    Product {
        groups: d.g,
        m: og,
        k: positions(&output),
        n: cg * area,
        tiles_per_group: per_group,
        laid_out: LaidOut::NONE,
        a: None,
        reads: Box::new(move |g, rm, rk, rn| {
            let g = g as u64;
            let ch = patch_channels(&d, p.layout, g, rn);
            let abs = (g * og + rm.0, g * og + rm.1);
            let mut v = Vec::new();
            for (img, r0, r1) in output.images(rk) {
                v.push(output.rows(gt, img, (r0, r1), abs));
                let rows = input_rows((r0, r1), s0, d0, p0, kh, h);
                let r = input.rows(xt, img, rows, ch);
                if r.elements() > 0 {
                    v.push(r);
                }
            }
            v
        }),
        out: Box::new(move |g, rm, rn| weight_spans(&d, p.layout, g as u64, rm, rn)),
        b: None,
        // HWIO weights hold each patch element's output channels together.
        // poplin's weight-update convolution takes the output field as its kernel.
        // The input rows of a block of positions (`k`) for its patch elements (`n`).
        field: Some(c.input_field(Operand::B)),
        kernel_area: oh * d.ow as u64,
    }
}
