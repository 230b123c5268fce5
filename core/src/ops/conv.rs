//! 2-D convolutions: NCHW with OIHW weights (PyTorch, ONNX) or NHWC with HWIO weights (Keras,
//! TensorFlow); stride, explicit or `same` padding, dilation, and groups (depthwise when there
//! are as many groups as channels). Training adds the input-gradient and weight-gradient
//! convolutions, as poplibs plans them.
//!
//! The kernel unfolds each image's patches into the node's workspace and multiplies them with
//! the weights (the same multiply as [`crate::kernels::matmul`]). A plan made without
//! workspaces (for a microcontroller's RAM) runs the same sums as direct loops, in the same
//! order, so both give bit-identical results with the portable kernels. A host that turned on
//! the fast matmul (`kernels::wide`: fused multiply-adds) rounds the workspace's terms once and
//! the direct loops' twice: the two then differ in the last bits.

use crate::autodiff::Backprop;
use crate::error::{GraphError, Name, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::shape_for;
use crate::run::Exec;
use crate::storage::Storage;
use crate::{DType, Roles, Shape};

/// Where the channels are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DataLayout {
    /// `[batch, channels, height, width]`; convolution weights `[out, in / groups, kh, kw]`.
    Nchw,
    /// `[batch, height, width, channels]`; convolution weights `[kh, kw, in / groups, out]`.
    Nhwc,
}

impl DataLayout {
    /// The channel axis of an activation.
    pub const fn channel_axis(self) -> usize {
        match self {
            DataLayout::Nchw => 1,
            DataLayout::Nhwc => 3,
        }
    }

    /// The (height, width) axes of an activation.
    pub const fn spatial_axes(self) -> [usize; 2] {
        match self {
            DataLayout::Nchw => [2, 3],
            DataLayout::Nhwc => [1, 2],
        }
    }
}

/// Padding of the two spatial axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Padding {
    /// No padding (Keras' `valid`).
    Valid,
    /// TensorFlow's `same`: the output is `ceil(input / stride)`; the total padding is split
    /// with the extra row or column at the end (ONNX `SAME_UPPER`).
    Same,
    /// Explicit `[top, left, bottom, right]` (ONNX `pads` order: begins, then ends).
    Explicit([u32; 4]),
}

/// A convolution's geometry, fixed at build time (padding resolved to explicit pads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ConvParams {
    /// Data layout (and so weight layout).
    pub layout: DataLayout,
    /// `[vertical, horizontal]` stride.
    pub stride: [u32; 2],
    /// `[vertical, horizontal]` dilation.
    pub dilation: [u32; 2],
    /// `[top, left, bottom, right]` zero padding.
    pub pads: [u32; 4],
    /// Channel groups (1: ordinary; channels: depthwise).
    pub groups: u32,
}

impl ConvParams {
    /// Stride 1, no padding, no dilation, one group.
    pub const fn new(layout: DataLayout) -> Self {
        ConvParams {
            layout,
            stride: [1, 1],
            dilation: [1, 1],
            pads: [0; 4],
            groups: 1,
        }
    }

    /// With this stride.
    pub const fn stride(mut self, vertical: u32, horizontal: u32) -> Self {
        self.stride = [vertical, horizontal];
        self
    }

    /// With this dilation.
    pub const fn dilation(mut self, vertical: u32, horizontal: u32) -> Self {
        self.dilation = [vertical, horizontal];
        self
    }

    /// With these explicit pads, `[top, left, bottom, right]`.
    pub const fn pads(mut self, pads: [u32; 4]) -> Self {
        self.pads = pads;
        self
    }

    /// With this many groups.
    pub const fn groups(mut self, groups: u32) -> Self {
        self.groups = groups;
        self
    }

    /// The pads `padding` gives for an input of `size` (height, width) and a kernel of
    /// `kernel`, with this stride and dilation.
    pub fn resolve(self, padding: Padding, size: [usize; 2], kernel: [usize; 2]) -> [u32; 4] {
        match padding {
            Padding::Valid => [0; 4],
            Padding::Explicit(p) => p,
            Padding::Same => {
                let mut p = [0u32; 4];
                for a in 0..2 {
                    let (s, d) = (self.stride[a].max(1) as usize, self.dilation[a] as usize);
                    let out = size[a].div_ceil(s);
                    let span = (kernel[a].max(1) - 1) * d + 1;
                    let total = ((out.max(1) - 1) * s + span).saturating_sub(size[a]);
                    p[a] = (total / 2) as u32;
                    p[a + 2] = (total - total / 2) as u32;
                }
                p
            }
        }
    }
}

/// Convolutions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Conv {
    /// `y = conv(x, w)`.
    Forward {
        /// Input activations.
        x: NodeId,
        /// Weights.
        w: NodeId,
        /// Geometry.
        p: ConvParams,
    },
    /// The gradient with respect to the input (a transposed convolution of `dy`).
    GradInput {
        /// Upstream gradient.
        dy: NodeId,
        /// Weights.
        w: NodeId,
        /// Geometry of the forward convolution.
        p: ConvParams,
    },
    /// The gradient with respect to the weights (a correlation of `x` with `dy`).
    GradWeight {
        /// Forward input.
        x: NodeId,
        /// Upstream gradient.
        dy: NodeId,
        /// Geometry of the forward convolution.
        p: ConvParams,
    },
}

impl Conv {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Conv::Forward { .. } => "Conv",
            Conv::GradInput { .. } => "ConvGradInput",
            Conv::GradWeight { .. } => "ConvGradWeight",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Conv::Forward { x, w, .. } => Operands::of(&[x, w]),
            Conv::GradInput { dy, w, .. } => Operands::of(&[dy, w]),
            Conv::GradWeight { x, dy, .. } => Operands::of(&[x, dy]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let c = *self;
        match c {
            Conv::Forward { x, w, p } => Conv::Forward {
                x: f(x),
                w: f(w),
                p,
            },
            Conv::GradInput { dy, w, p } => Conv::GradInput {
                dy: f(dy),
                w: f(w),
                p,
            },
            Conv::GradWeight { x, dy, p } => Conv::GradWeight {
                x: f(x),
                dy: f(dy),
                p,
            },
        }
    }

    /// The geometry.
    pub const fn params(&self) -> ConvParams {
        match *self {
            Conv::Forward { p, .. } | Conv::GradInput { p, .. } | Conv::GradWeight { p, .. } => p,
        }
    }
}

/// A convolution's sizes, read from its input and weight shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvDims {
    /// Batch.
    pub n: usize,
    /// Input channels.
    pub c: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub o: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output height.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Groups.
    pub g: usize,
}

impl ConvDims {
    /// Sizes from the input and weight shapes, or the rule they break.
    pub fn of(x: Shape, w: Shape, p: &ConvParams) -> Result<ConvDims, &'static str> {
        if x.rank() != 4 || w.rank() != 4 {
            return Err("input and weights must be rank 4");
        }
        if p.stride.contains(&0) || p.dilation.contains(&0) || p.groups == 0 {
            return Err("strides, dilations and groups must be at least 1");
        }
        let (n, c, h, wd) = match p.layout {
            DataLayout::Nchw => (x.dim(0), x.dim(1), x.dim(2), x.dim(3)),
            DataLayout::Nhwc => (x.dim(0), x.dim(3), x.dim(1), x.dim(2)),
        };
        let (o, cg, kh, kw) = match p.layout {
            DataLayout::Nchw => (w.dim(0), w.dim(1), w.dim(2), w.dim(3)),
            DataLayout::Nhwc => (w.dim(3), w.dim(2), w.dim(0), w.dim(1)),
        };
        let g = p.groups as usize;
        if c % g != 0 || o % g != 0 || cg != c / g {
            return Err("channels must match: weights take in / groups channels, and groups divide in and out");
        }
        let out = |size: usize, k: usize, a: usize| {
            let padded = size + p.pads[a] as usize + p.pads[a + 2] as usize;
            let span = (k - 1) * p.dilation[a] as usize + 1;
            (padded >= span).then(|| (padded - span) / p.stride[a] as usize + 1)
        };
        let (Some(oh), Some(ow)) = (out(h, kh, 0), out(wd, kw, 1)) else {
            return Err("the kernel (with its dilation) is larger than the padded input");
        };
        Ok(ConvDims {
            n,
            c,
            h,
            w: wd,
            o,
            kh,
            kw,
            oh,
            ow,
            g,
        })
    }

    /// The output shape.
    pub fn output(&self, layout: DataLayout) -> [usize; 4] {
        match layout {
            DataLayout::Nchw => [self.n, self.o, self.oh, self.ow],
            DataLayout::Nhwc => [self.n, self.oh, self.ow, self.o],
        }
    }

    /// Multiply-accumulates of the forward convolution.
    pub fn macs(&self) -> u64 {
        (self.n * self.o * self.oh * self.ow) as u64 * (self.c / self.g * self.kh * self.kw) as u64
    }

    /// Patch length per group: input channels per group times the kernel's area.
    fn k(&self) -> usize {
        self.c / self.g * self.kh * self.kw
    }

    /// Output positions per image.
    fn p(&self) -> usize {
        self.oh * self.ow
    }
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// A 2-D convolution of `x` with weights `w` (layouts as [`DataLayout`] says), padding
    /// resolved against `x`'s size.
    pub fn conv2d(
        &mut self,
        name: &str,
        x: impl NodeRef,
        w: impl NodeRef,
        params: ConvParams,
        padding: Padding,
    ) -> Result<NodeId, GraphError> {
        let (x, w) = (x.resolve(self)?, w.resolve(self)?);
        let n = self.check_name(name)?;
        self.float_operand(&n, "Conv", x)?;
        let dtype = self.same_dtype(&n, "Conv", x, w)?;
        let (sx, sw) = (self.node(x).shape, self.node(w).shape);
        let mut p = params;
        if sx.rank() == 4 && sw.rank() == 4 {
            let [ha, wa] = p.layout.spatial_axes();
            let (kh, kw) = match p.layout {
                DataLayout::Nchw => (sw.dim(2), sw.dim(3)),
                DataLayout::Nhwc => (sw.dim(0), sw.dim(1)),
            };
            p.pads = p.resolve(padding, [sx.dim(ha), sx.dim(wa)], [kh, kw]);
        }
        let dims = ConvDims::of(sx, sw, &p).map_err(|rule| GraphError::ShapeMismatch {
            node: n.clone(),
            op: "Conv",
            rule,
            left: sx,
            right: sw,
        })?;
        let shape = shape_for(name, &dims.output(p.layout))?;
        self.push(
            n,
            Op::Conv(Conv::Forward { x, w, p }),
            shape,
            dtype,
            Roles::ACTIVATION,
        )
    }
}

/// Builders of a convolution's gradients on their own (autodiff makes them from the forward
/// convolution; op-level estimates build each pass alone, as poplibs' benchmark tools do).
impl<S: Storage> Graph<S> {
    /// The gradient of a convolution with geometry `params` (pads explicit) with respect to its
    /// input, of shape `x_shape`, from the output gradient `dy` and the weights `w`.
    pub fn conv2d_grad_input(
        &mut self,
        name: &str,
        dy: impl NodeRef,
        w: impl NodeRef,
        params: ConvParams,
        x_shape: &[usize],
    ) -> Result<NodeId, GraphError> {
        let (dy, w) = (dy.resolve(self)?, w.resolve(self)?);
        let n = self.check_name(name)?;
        self.float_operand(&n, "ConvGradInput", dy)?;
        let dtype = self.same_dtype(&n, "ConvGradInput", dy, w)?;
        let sx = shape_for(name, x_shape)?;
        let (sdy, sw) = (self.node(dy).shape, self.node(w).shape);
        check_gradient_shapes(&n, "ConvGradInput", sx, sw, sdy, &params)?;
        self.push(
            n,
            Op::Conv(Conv::GradInput { dy, w, p: params }),
            sx,
            dtype,
            Roles::ACTIVATION,
        )
    }

    /// The gradient of a convolution with geometry `params` (pads explicit) with respect to its
    /// weights, of shape `w_shape`, from the forward input `x` and the output gradient `dy`.
    pub fn conv2d_grad_weight(
        &mut self,
        name: &str,
        x: impl NodeRef,
        dy: impl NodeRef,
        params: ConvParams,
        w_shape: &[usize],
    ) -> Result<NodeId, GraphError> {
        let (x, dy) = (x.resolve(self)?, dy.resolve(self)?);
        let n = self.check_name(name)?;
        self.float_operand(&n, "ConvGradWeight", x)?;
        let dtype = self.same_dtype(&n, "ConvGradWeight", x, dy)?;
        let sw = shape_for(name, w_shape)?;
        let (sx, sdy) = (self.node(x).shape, self.node(dy).shape);
        check_gradient_shapes(&n, "ConvGradWeight", sx, sw, sdy, &params)?;
        self.push(
            n,
            Op::Conv(Conv::GradWeight { x, dy, p: params }),
            sw,
            dtype,
            Roles::ACTIVATION,
        )
    }
}

/// That a convolution of an input of shape `sx` with weights of shape `sw` gives `sdy`.
fn check_gradient_shapes(
    node: &Name,
    op: &'static str,
    sx: Shape,
    sw: Shape,
    sdy: Shape,
    p: &ConvParams,
) -> Result<(), GraphError> {
    let mismatch = |rule| GraphError::ShapeMismatch {
        node: node.clone(),
        op,
        rule,
        left: sx,
        right: sw,
    };
    let dims = ConvDims::of(sx, sw, p).map_err(mismatch)?;
    let out = dims.output(p.layout);
    if sdy
        .dims()
        .iter()
        .map(|&d| d as usize)
        .ne(out.iter().copied())
    {
        return Err(mismatch(
            "the output gradient must have the forward convolution's output shape",
        ));
    }
    Ok(())
}

/// Bytes of workspace a convolution's kernel uses: one image-group's unfolded patches, and
/// for grouped NHWC convolutions the group's weights, outputs and weight-gradient sums.
pub(crate) fn workspace_bytes<S: Storage>(graph: &Graph<S>, node: &Node, op: &Conv) -> usize {
    let (x, w) = match *op {
        Conv::Forward { x, w, .. } => (graph.node(x).shape, graph.node(w).shape),
        Conv::GradInput { w, .. } => (node.shape, graph.node(w).shape),
        Conv::GradWeight { x, .. } => (graph.node(x).shape, node.shape),
    };
    let Ok(d) = ConvDims::of(x, w, &op.params()) else {
        return 0;
    };
    let og = d.o / d.g;
    (d.p() * d.k() + 2 * d.k() * og + d.p() * og) * node.dtype.size()
}

/// Index of input element (image n, channel c, row, col).
fn x_index(d: &ConvDims, layout: DataLayout, n: usize, c: usize, r: usize, col: usize) -> usize {
    match layout {
        DataLayout::Nchw => ((n * d.c + c) * d.h + r) * d.w + col,
        DataLayout::Nhwc => ((n * d.h + r) * d.w + col) * d.c + c,
    }
}

/// The input position patch element `kk` of output position `pp` reads, for group `g`:
/// (channel, row, col), or `None` in the padding.
fn tap(
    d: &ConvDims,
    p: &ConvParams,
    g: usize,
    pp: usize,
    kk: usize,
) -> Option<(usize, usize, usize)> {
    let cg = d.c / d.g;
    let (ci, ky, kx) = match p.layout {
        // OIHW rows: (c, ky, kx).
        DataLayout::Nchw => (kk / (d.kh * d.kw), kk / d.kw % d.kh, kk % d.kw),
        // HWIO rows: (ky, kx, c).
        DataLayout::Nhwc => (kk % cg, kk / (cg * d.kw), kk / cg % d.kw),
    };
    let (oy, ox) = (pp / d.ow, pp % d.ow);
    let r = (oy * p.stride[0] as usize + ky * p.dilation[0] as usize)
        .checked_sub(p.pads[0] as usize)?;
    let c = (ox * p.stride[1] as usize + kx * p.dilation[1] as usize)
        .checked_sub(p.pads[1] as usize)?;
    (r < d.h && c < d.w).then_some((g * cg + ci, r, c))
}

/// Writes image `n`, group `g`'s patches as a `[P, K]` matrix.
fn unfold(d: &ConvDims, p: &ConvParams, x: &[u8], t: DType, n: usize, g: usize, col: &mut [u8]) {
    let kk = d.k();
    for pp in 0..d.p() {
        for q in 0..kk {
            let v = match tap(d, p, g, pp, q) {
                Some((c, r, cc)) => k::load(x, t, x_index(d, p.layout, n, c, r, cc)),
                None => 0.0,
            };
            k::store(col, t, pp * kk + q, v);
        }
    }
}

/// Adds a `[P, K]` matrix of patch gradients back onto image `n`, group `g` of `dx`.
fn fold(d: &ConvDims, p: &ConvParams, col: &[u8], t: DType, n: usize, g: usize, dx: &mut [u8]) {
    let kk = d.k();
    for pp in 0..d.p() {
        for q in 0..kk {
            if let Some((c, r, cc)) = tap(d, p, g, pp, q) {
                let i = x_index(d, p.layout, n, c, r, cc);
                let v = k::load(dx, t, i) + k::load(col, t, pp * kk + q);
                k::store(dx, t, i, v);
            }
        }
    }
}

/// Copies columns `c0 .. c0 + count` of a `[rows, cols]` matrix into a `[rows, count]` one.
fn take_cols(src: &[u8], cols: usize, c0: usize, count: usize, es: usize, dst: &mut [u8]) {
    for (r, row) in dst.chunks_exact_mut(count * es).enumerate() {
        let s = (r * cols + c0) * es;
        row.copy_from_slice(&src[s..s + count * es]);
    }
}

/// The weights of group `g` as the product needs them: OIHW's `[Og, K]` rows are contiguous;
/// HWIO's `[K, Og]` columns are copied out when there are several groups.
fn group_weights<'a>(
    d: &ConvDims,
    p: &ConvParams,
    w: &'a [u8],
    es: usize,
    g: usize,
    tmp: &'a mut [u8],
) -> &'a [u8] {
    let (kk, og) = (d.k(), d.o / d.g);
    match p.layout {
        DataLayout::Nchw => &w[g * og * kk * es..(g + 1) * og * kk * es],
        DataLayout::Nhwc if d.g == 1 => w,
        DataLayout::Nhwc => {
            take_cols(w, d.o, g * og, og, es, &mut tmp[..kk * og * es]);
            &tmp[..kk * og * es]
        }
    }
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Conv,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let t = node.dtype;
    let es = t.size();
    let p = op.params();
    let (sx, sw) = match *op {
        Conv::Forward { x, w, .. } => (ex.ins.shape(x), ex.ins.shape(w)),
        Conv::GradInput { w, .. } => (node.shape, ex.ins.shape(w)),
        Conv::GradWeight { x, .. } => (ex.ins.shape(x), node.shape),
    };
    let Ok(d) = ConvDims::of(sx, sw, &p) else {
        return Ok(()); // Shapes were checked at build time.
    };
    let (kk, pp, og) = (d.k(), d.p(), d.o / d.g);
    let work = &mut *ex.work;
    let need = (pp * kk + 2 * kk * og + pp * og) * es;
    if work.len() < need {
        return direct(op, &d, &p, node, ex);
    }
    let (col, rest) = work.split_at_mut(pp * kk * es);
    let (wtmp, rest) = rest.split_at_mut(kk * og * es);
    let (ytmp, acc) = rest.split_at_mut(pp * og * es);
    let mut scratch = Scratch {
        col,
        wtmp,
        ytmp,
        acc,
    };
    let (out, ins) = (&mut *ex.out, &ex.ins);
    match *op {
        Conv::Forward { x, w, .. } => {
            forward(&d, &p, t, ins.bytes(x), ins.bytes(w), &mut scratch, out);
        }
        Conv::GradInput { dy, w, .. } => {
            grad_input(&d, &p, t, ins.bytes(dy), ins.bytes(w), &mut scratch, out);
        }
        Conv::GradWeight { x, dy, .. } => {
            grad_weight(&d, &p, t, ins.bytes(x), ins.bytes(dy), &mut scratch, out);
        }
    }
    Ok(())
}

/// The unfolded product's workspace: the unfolded input (`[P, K]`), a group's weights, a
/// group's output rows and the weight gradient's partial sums.
struct Scratch<'a> {
    col: &'a mut [u8],
    wtmp: &'a mut [u8],
    ytmp: &'a mut [u8],
    acc: &'a mut [u8],
}

/// The forward convolution of `xb` by `wb` into `out`: per image and group, the input
/// unfolded and multiplied by the group's weights.
fn forward(
    d: &ConvDims,
    p: &ConvParams,
    t: DType,
    xb: &[u8],
    wb: &[u8],
    s: &mut Scratch<'_>,
    out: &mut [u8],
) {
    let (kk, pp, og, es) = (d.k(), d.p(), d.o / d.g, t.size());
    let (col, wtmp, ytmp) = (&mut *s.col, &mut *s.wtmp, &mut *s.ytmp);
    let p = *p;
    for n in 0..d.n {
        for g in 0..d.g {
            unfold(d, &p, xb, t, n, g, col);
            let wg = group_weights(d, &p, wb, es, g, wtmp);
            match p.layout {
                // [Og, P] = W_g [Og, K] . col^T, contiguous in NCHW.
                DataLayout::Nchw => {
                    let o0 = (n * d.o + g * og) * pp * es;
                    let prod = k::Product {
                        m: og,
                        k: kk,
                        n: pp,
                        ta: false,
                        tb: true,
                    };
                    k::matmul(wg, col, t, &mut out[o0..o0 + og * pp * es], prod);
                }
                // [P, Og] = col . W_g [K, Og].
                DataLayout::Nhwc => {
                    let img = &mut out[n * pp * d.o * es..(n + 1) * pp * d.o * es];
                    if d.g == 1 {
                        k::matmul(col, wg, t, img, k::Product::new(pp, kk, d.o));
                    } else {
                        k::matmul(col, wg, t, ytmp, k::Product::new(pp, kk, og));
                        for r in 0..pp {
                            let s = (r * d.o + g * og) * es;
                            img[s..s + og * es]
                                .copy_from_slice(&ytmp[r * og * es..(r + 1) * og * es]);
                        }
                    }
                }
            }
        }
    }
}

/// The gradient of the input from `gb` (the output's) and the weights `wb` into `out`: per
/// image and group, the product unfolded back (folded) onto the input.
fn grad_input(
    d: &ConvDims,
    p: &ConvParams,
    t: DType,
    gb: &[u8],
    wb: &[u8],
    s: &mut Scratch<'_>,
    out: &mut [u8],
) {
    let (kk, pp, og, es) = (d.k(), d.p(), d.o / d.g, t.size());
    let (col, wtmp, ytmp) = (&mut *s.col, &mut *s.wtmp, &mut *s.ytmp);
    let p = *p;
    out.fill(0);
    for n in 0..d.n {
        for g in 0..d.g {
            let wg = group_weights(d, &p, wb, es, g, wtmp);
            match p.layout {
                // col [P, K] = dy_g^T [P, Og] . W_g [Og, K].
                DataLayout::Nchw => {
                    let o0 = (n * d.o + g * og) * pp * es;
                    let prod = k::Product {
                        m: pp,
                        k: og,
                        n: kk,
                        ta: true,
                        tb: false,
                    };
                    k::matmul(&gb[o0..o0 + og * pp * es], wg, t, col, prod);
                }
                // col [P, K] = dy_g [P, Og] . W_g^T.
                DataLayout::Nhwc => {
                    let img = &gb[n * pp * d.o * es..(n + 1) * pp * d.o * es];
                    let prod = |cols| k::Product {
                        m: pp,
                        k: cols,
                        n: kk,
                        ta: false,
                        tb: true,
                    };
                    if d.g == 1 {
                        k::matmul(img, wg, t, col, prod(d.o));
                    } else {
                        take_cols(img, d.o, g * og, og, es, ytmp);
                        k::matmul(ytmp, wg, t, col, prod(og));
                    }
                }
            }
            fold(d, &p, col, t, n, g, out);
        }
    }
}

/// The gradient of the weights from the input `xb` and `gb` (the output's) into `out`: per
/// image and group, the output's gradient times the unfolded input, summed.
fn grad_weight(
    d: &ConvDims,
    p: &ConvParams,
    t: DType,
    xb: &[u8],
    gb: &[u8],
    s: &mut Scratch<'_>,
    out: &mut [u8],
) {
    let (kk, pp, og, es) = (d.k(), d.p(), d.o / d.g, t.size());
    let (col, ytmp, acc) = (&mut *s.col, &mut *s.ytmp, &mut *s.acc);
    let p = *p;
    out.fill(0);
    let acc = &mut acc[..kk * og * es];
    for n in 0..d.n {
        for g in 0..d.g {
            unfold(d, &p, xb, t, n, g, col);
            match p.layout {
                // dW_g [Og, K] += dy_g [Og, P] . col [P, K].
                DataLayout::Nchw => {
                    let o0 = (n * d.o + g * og) * pp * es;
                    k::matmul(
                        &gb[o0..o0 + og * pp * es],
                        col,
                        t,
                        acc,
                        k::Product::new(og, pp, kk),
                    );
                    let dst = &mut out[g * og * kk * es..(g + 1) * og * kk * es];
                    k::zip_in_place(dst, acc, t, og * kk, |a, b| a + b);
                }
                // dW_g [K, Og] += col^T . dy_g [P, Og].
                DataLayout::Nhwc => {
                    let img = &gb[n * pp * d.o * es..(n + 1) * pp * d.o * es];
                    let dyg: &[u8] = if d.g == 1 {
                        img
                    } else {
                        take_cols(img, d.o, g * og, og, es, ytmp);
                        ytmp
                    };
                    let prod = k::Product {
                        m: kk,
                        k: pp,
                        n: og,
                        ta: true,
                        tb: false,
                    };
                    k::matmul(col, dyg, t, acc, prod);
                    for r in 0..kk {
                        for c in 0..og {
                            let i = r * d.o + g * og + c;
                            let v = k::load(out, t, i) + k::load(acc, t, r * og + c);
                            k::store(out, t, i, v);
                        }
                    }
                }
            }
        }
    }
}

/// The same sums as [`run`] without a workspace: each output element is summed in the order
/// the unfolded product sums it.
fn direct<S: Storage>(
    op: &Conv,
    d: &ConvDims,
    p: &ConvParams,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let t = node.dtype;
    let (kk, pp, og) = (d.k(), d.p(), d.o / d.g);
    // Weight element (o within group g, patch element q).
    let w_index = |g: usize, o: usize, q: usize| match p.layout {
        DataLayout::Nchw => (g * og + o) * kk + q,
        DataLayout::Nhwc => q * d.o + g * og + o,
    };
    let y_index = |n: usize, g: usize, o: usize, pos: usize| match p.layout {
        DataLayout::Nchw => (n * d.o + g * og + o) * pp + pos,
        DataLayout::Nhwc => (n * pp + pos) * d.o + g * og + o,
    };
    let out = &mut *ex.out;
    match *op {
        Conv::Forward { x, w, .. } => {
            let (xb, wb) = (ex.ins.bytes(x), ex.ins.bytes(w));
            for n in 0..d.n {
                for g in 0..d.g {
                    for o in 0..og {
                        for pos in 0..pp {
                            let mut s = 0f32;
                            for q in 0..kk {
                                let v = tap(d, p, g, pos, q).map_or(0.0, |(c, r, cc)| {
                                    k::load(xb, t, x_index(d, p.layout, n, c, r, cc))
                                });
                                s += k::load(wb, t, w_index(g, o, q)) * v;
                            }
                            k::store(out, t, y_index(n, g, o, pos), s);
                        }
                    }
                }
            }
        }
        Conv::GradInput { dy, w, .. } => {
            let (gb, wb) = (ex.ins.bytes(dy), ex.ins.bytes(w));
            out.fill(0);
            for n in 0..d.n {
                for g in 0..d.g {
                    for pos in 0..pp {
                        for q in 0..kk {
                            let mut s = 0f32;
                            for o in 0..og {
                                s += k::load(gb, t, y_index(n, g, o, pos))
                                    * k::load(wb, t, w_index(g, o, q));
                            }
                            if let Some((c, r, cc)) = tap(d, p, g, pos, q) {
                                let i = x_index(d, p.layout, n, c, r, cc);
                                let v = k::load(out, t, i) + s;
                                k::store(out, t, i, v);
                            }
                        }
                    }
                }
            }
        }
        Conv::GradWeight { x, dy, .. } => {
            let (xb, gb) = (ex.ins.bytes(x), ex.ins.bytes(dy));
            out.fill(0);
            for n in 0..d.n {
                for g in 0..d.g {
                    for o in 0..og {
                        for q in 0..kk {
                            let mut s = 0f32;
                            for pos in 0..pp {
                                let v = tap(d, p, g, pos, q).map_or(0.0, |(c, r, cc)| {
                                    k::load(xb, t, x_index(d, p.layout, n, c, r, cc))
                                });
                                s += k::load(gb, t, y_index(n, g, o, pos)) * v;
                            }
                            let i = w_index(g, o, q);
                            let v = k::load(out, t, i) + s;
                            k::store(out, t, i, v);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The gradient: of a convolution, the input-gradient and weight-gradient convolutions; of
/// an input gradient (a transposed convolution, ONNX `ConvTranspose`), the convolution of its
/// gradient (it is the convolution's adjoint, whose adjoint is the convolution) and the weight
/// gradient with the roles of input and output gradient swapped.
pub(crate) fn backward<S: Storage>(
    op: &Conv,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    match *op {
        Conv::Forward { x, w, p } => {
            bp.pass(x, Op::Conv(Conv::GradInput { dy, w, p }))?;
            bp.pass(w, Op::Conv(Conv::GradWeight { x, dy, p }))?;
        }
        Conv::GradInput { dy: a, w, p } => {
            bp.pass(a, Op::Conv(Conv::Forward { x: dy, w, p }))?;
            bp.pass(w, Op::Conv(Conv::GradWeight { x: dy, dy: a, p }))?;
        }
        Conv::GradWeight { .. } => return Err(bp.not_differentiable(id)),
    }
    Ok(())
}
