//! 2-D max and average pooling (NCHW or NHWC, stride, explicit or `same` padding, average with
//! or without the padding counted) and their gradients. Global average pooling is a mean over
//! the spatial axes ([`Graph::global_average_pool`]).

use crate::autodiff::Backprop;
use crate::error::{name_lossy, GraphError, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::conv::{ConvParams, DataLayout, Padding};
use crate::ops::reduce::ReduceKind;
use crate::ops::shape_for;
use crate::run::Exec;
use crate::storage::Storage;
use crate::{Roles, Shape};

/// What a window computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PoolKind {
    /// The window's maximum (padding never wins).
    Max,
    /// The window's mean.
    Average {
        /// Divide by the whole window, padding included (else by the elements inside).
        count_include_pad: bool,
    },
}

/// A pooling's geometry, fixed at build time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PoolParams {
    /// Max or average.
    pub kind: PoolKind,
    /// Data layout.
    pub layout: DataLayout,
    /// `[height, width]` of the window.
    pub kernel: [u32; 2],
    /// `[vertical, horizontal]` stride.
    pub stride: [u32; 2],
    /// `[top, left, bottom, right]` padding.
    pub pads: [u32; 4],
}

impl PoolParams {
    /// A `kernel` window moved by `stride`, no padding.
    pub const fn new(
        kind: PoolKind,
        layout: DataLayout,
        kernel: [u32; 2],
        stride: [u32; 2],
    ) -> Self {
        PoolParams {
            kind,
            layout,
            kernel,
            stride,
            pads: [0; 4],
        }
    }
}

/// Pooling ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Pool {
    /// `y = pool(x)`.
    Forward {
        /// Input.
        x: NodeId,
        /// Geometry.
        p: PoolParams,
    },
    /// The gradient with respect to `x` (shape of `x`): max routes each `dy` to its window's
    /// first maximum, average spreads it over the window.
    Backward {
        /// Upstream gradient.
        dy: NodeId,
        /// The forward input.
        x: NodeId,
        /// Geometry.
        p: PoolParams,
    },
}

impl Pool {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Pool::Forward {
                p:
                    PoolParams {
                        kind: PoolKind::Max,
                        ..
                    },
                ..
            } => "MaxPool",
            Pool::Forward { .. } => "AveragePool",
            Pool::Backward {
                p:
                    PoolParams {
                        kind: PoolKind::Max,
                        ..
                    },
                ..
            } => "MaxPoolGrad",
            Pool::Backward { .. } => "AveragePoolGrad",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Pool::Forward { x, .. } => Operands::of(&[x]),
            Pool::Backward { dy, x, .. } => Operands::of(&[dy, x]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let pl = *self;
        match pl {
            Pool::Forward { x, p } => Pool::Forward { x: f(x), p },
            Pool::Backward { dy, x, p } => Pool::Backward {
                dy: f(dy),
                x: f(x),
                p,
            },
        }
    }
}

/// (n, c, h, w, oh, ow) of a pooling of `x`, or the rule it breaks.
fn dims(x: Shape, p: &PoolParams) -> Result<[usize; 6], &'static str> {
    if x.rank() != 4 {
        return Err("input must be rank 4");
    }
    if p.kernel.contains(&0) || p.stride.contains(&0) {
        return Err("window and strides must be at least 1");
    }
    if p.pads[0] >= p.kernel[0]
        || p.pads[1] >= p.kernel[1]
        || p.pads[2] >= p.kernel[0]
        || p.pads[3] >= p.kernel[1]
    {
        return Err("padding must be smaller than the window");
    }
    let [ha, wa] = p.layout.spatial_axes();
    let (h, w) = (x.dim(ha), x.dim(wa));
    let out = |size: usize, a: usize| {
        let padded = size + p.pads[a] as usize + p.pads[a + 2] as usize;
        let k = p.kernel[a] as usize;
        (padded >= k).then(|| (padded - k) / p.stride[a] as usize + 1)
    };
    let (Some(oh), Some(ow)) = (out(h, 0), out(w, 1)) else {
        return Err("the window is larger than the padded input");
    };
    Ok([x.dim(0), x.dim(p.layout.channel_axis()), h, w, oh, ow])
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Max or average pooling of `x` with the window, stride and layout of `params` (its
    /// pads replaced by what `padding` resolves to).
    pub fn pool2d(
        &mut self,
        name: &str,
        x: impl NodeRef,
        params: PoolParams,
        padding: Padding,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        self.float_operand(&n, "Pool", x)?;
        let node = self.node(x);
        let (sx, dtype) = (node.shape, node.dtype);
        let mut p = params;
        let (layout, kernel, stride) = (p.layout, p.kernel, p.stride);
        if sx.rank() == 4 {
            let [ha, wa] = layout.spatial_axes();
            let geometry = ConvParams::new(layout).stride(stride[0], stride[1]);
            p.pads = geometry.resolve(
                padding,
                [sx.dim(ha), sx.dim(wa)],
                [kernel[0] as usize, kernel[1] as usize],
            );
        }
        let op = Op::Pool(Pool::Forward { x, p });
        let [bn, c, _, _, oh, ow] = dims(sx, &p).map_err(|rule| GraphError::BadAttribute {
            node: n.clone(),
            op: op.name(),
            rule,
        })?;
        let out = match layout {
            DataLayout::Nchw => [bn, c, oh, ow],
            DataLayout::Nhwc => [bn, oh, ow, c],
        };
        let shape = shape_for(name, &out)?;
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }

    /// The mean over the spatial axes, as Keras' `GlobalAveragePooling2D` (the axes removed)
    /// or ONNX `GlobalAveragePool` (`keep_dims`: kept as size 1).
    pub fn global_average_pool(
        &mut self,
        name: &str,
        x: impl NodeRef,
        layout: DataLayout,
        keep_dims: bool,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        if self.node(x).shape.rank() != 4 {
            return Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "GlobalAveragePool",
                rule: "input must be rank 4",
            });
        }
        let [h, w] = layout.spatial_axes();
        self.reduce(
            name,
            x,
            &[h as isize, w as isize],
            keep_dims,
            ReduceKind::Mean,
        )
    }
}

/// Calls `f(out index, input index or None in the padding, window size)` for every window
/// element of every output, in order.
fn windows(x: Shape, p: &PoolParams, mut f: impl FnMut(usize, Option<usize>, usize)) {
    let Ok([n, c, h, w, oh, ow]) = dims(x, p) else {
        return;
    };
    let index = |b: usize, ch: usize, r: usize, col: usize| match p.layout {
        DataLayout::Nchw => ((b * c + ch) * h + r) * w + col,
        DataLayout::Nhwc => ((b * h + r) * w + col) * c + ch,
    };
    for b in 0..n {
        for ch in 0..c {
            for y in 0..oh {
                for xx in 0..ow {
                    let o = match p.layout {
                        DataLayout::Nchw => ((b * c + ch) * oh + y) * ow + xx,
                        DataLayout::Nhwc => ((b * oh + y) * ow + xx) * c + ch,
                    };
                    // The window's cells inside the input: its rows inside times its columns.
                    let within = |at: usize, k: u32, pad: u32, size: usize| {
                        (0..k as usize)
                            .filter(|&d| {
                                (at + d).checked_sub(pad as usize).is_some_and(|v| v < size)
                            })
                            .count()
                    };
                    let inside = within(y * p.stride[0] as usize, p.kernel[0], p.pads[0], h)
                        * within(xx * p.stride[1] as usize, p.kernel[1], p.pads[1], w);
                    for ky in 0..p.kernel[0] as usize {
                        for kx in 0..p.kernel[1] as usize {
                            let r = (y * p.stride[0] as usize + ky).checked_sub(p.pads[0] as usize);
                            let col =
                                (xx * p.stride[1] as usize + kx).checked_sub(p.pads[1] as usize);
                            let i = match (r, col) {
                                (Some(r), Some(col)) if r < h && col < w => {
                                    Some(index(b, ch, r, col))
                                }
                                _ => None,
                            };
                            f(o, i, inside);
                        }
                    }
                }
            }
        }
    }
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Pool,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let t = node.dtype;
    let out = &mut *ex.out;
    match *op {
        Pool::Forward { x, p } => {
            let (xb, sx) = (ex.ins.bytes(x), ex.ins.shape(x));
            let window = p.kernel[0] as usize * p.kernel[1] as usize;
            // Fold each output's window, then store it when its last element has been seen.
            let (mut cur, mut acc, mut seen, mut inside) = (usize::MAX, 0f32, 0usize, 0usize);
            windows(sx, &p, |o, i, _| {
                if o != cur {
                    (cur, seen, inside) = (o, 0, 0);
                    acc = if p.kind == PoolKind::Max {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    };
                }
                if let Some(i) = i {
                    let v = k::load(xb, t, i);
                    acc = if p.kind == PoolKind::Max {
                        acc.max(v)
                    } else {
                        acc + v
                    };
                    inside += 1;
                }
                seen += 1;
                if seen == window {
                    let v = match p.kind {
                        PoolKind::Max => acc,
                        PoolKind::Average {
                            count_include_pad: true,
                        } => acc / window as f32,
                        PoolKind::Average { .. } => acc / inside.max(1) as f32,
                    };
                    k::store(out, t, o, v);
                }
            });
        }
        Pool::Backward { dy, x, p } => {
            let (gb, xb, sx) = (ex.ins.bytes(dy), ex.ins.bytes(x), ex.ins.shape(x));
            out.fill(0);
            let window = p.kernel[0] as usize * p.kernel[1] as usize;
            // Each window streamed cell by cell, so a window of any size needs no room: a max
            // keeps its first maximum so far and routes the gradient there at the window's
            // last cell; an average adds its share to each inside cell as it comes (the same
            // additions, in the same order, as after the window).
            let (mut cur, mut seen) = (usize::MAX, 0usize);
            let mut best: Option<(usize, f32)> = None;
            windows(sx, &p, |o, i, inside| {
                if o != cur {
                    (cur, seen, best) = (o, 0, None);
                }
                seen += 1;
                match p.kind {
                    PoolKind::Max => {
                        if let Some(i) = i {
                            let v = k::load(xb, t, i);
                            if best.is_none_or(|(_, b)| v > b) {
                                best = Some((i, v));
                            }
                        }
                        if let (true, Some((i, _))) = (seen == window, best) {
                            let v = k::load(out, t, i) + k::load(gb, t, o);
                            k::store(out, t, i, v);
                        }
                    }
                    PoolKind::Average { count_include_pad } => {
                        if let Some(i) = i {
                            let count = if count_include_pad {
                                window
                            } else {
                                inside.max(1)
                            };
                            let v = k::load(out, t, i) + k::load(gb, t, o) / count as f32;
                            k::store(out, t, i, v);
                        }
                    }
                }
            });
        }
    }
    Ok(())
}

/// The gradient.
pub(crate) fn backward<S: Storage>(
    op: &Pool,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    let Pool::Forward { x, p } = *op else {
        return Err(bp.not_differentiable(id));
    };
    bp.pass(x, Op::Pool(Pool::Backward { dy, x, p }))?;
    Ok(())
}
