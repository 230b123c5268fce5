//! Normalisation: `(x - mean) / sqrt(var + eps)` over chosen axes (the biased variance), and
//! its gradient. Batch, layer and group normalisation are built from it with a per-channel (or
//! per-feature) scale and shift; batch normalisation also keeps running averages of the
//! statistics as state, updated in training and used in inference, as Keras does.

use crate::autodiff::Backprop;
use crate::error::{derived, name_lossy, GraphError, RunError};
use crate::graph::{Graph, Init, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::conv::DataLayout;
use crate::ops::elementwise::{BinaryFn, UnaryFn};
use crate::ops::layout::walk_offsets;
use crate::ops::update::Update;
use crate::ops::{for_each_group, Axes};
use crate::run::Exec;
use crate::storage::Storage;
use crate::{DType, Roles, Shape, MAX_RANK};

/// Normalisation ops.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Norm {
    /// `(x - mean(x)) / sqrt(var(x) + eps)`, statistics over `axes` (same shape as `x`).
    Normalize {
        /// Operand.
        x: NodeId,
        /// The axes the statistics run over.
        axes: Axes,
        /// Added to the variance.
        eps: f32,
    },
    /// Backward of [`Norm::Normalize`]: `(dy - mean(dy) - xhat * mean(dy * xhat)) / sd`.
    NormalizeGrad {
        /// Upstream gradient.
        dy: NodeId,
        /// The forward input.
        x: NodeId,
        /// The axes.
        axes: Axes,
        /// Added to the variance.
        eps: f32,
    },
    /// One statistic of `x`'s groups over `axes` (the shape of `x` without them): the
    /// statistics a [`Norm::Normalize`] of the same `x` and `axes` computes, for a batch
    /// normalisation's running averages. Poplar computes them once (`popnn::bn`'s statistics
    /// feed both the whitening and the running averages), so a lowering that has them reads
    /// them rather than reducing `x` again.
    Moment {
        /// Operand.
        x: NodeId,
        /// The axes the statistic runs over.
        axes: Axes,
        /// Which statistic.
        moment: Moment,
    },
}

/// A statistic of a group, as [`Norm::Moment`] gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Moment {
    /// The mean.
    Mean,
    /// The biased variance (the mean of the squared deviations).
    Variance,
}

impl Norm {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Norm::Normalize { .. } => "Normalize",
            Norm::NormalizeGrad { .. } => "NormalizeGrad",
            Norm::Moment { .. } => "Moment",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Norm::Normalize { x, .. } => Operands::of(&[x]),
            Norm::NormalizeGrad { dy, x, .. } => Operands::of(&[dy, x]),
            Norm::Moment { x, .. } => Operands::of(&[x]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let n = *self;
        match n {
            Norm::Normalize { x, axes, eps } => Norm::Normalize { x: f(x), axes, eps },
            Norm::NormalizeGrad { dy, x, axes, eps } => Norm::NormalizeGrad {
                dy: f(dy),
                x: f(x),
                axes,
                eps,
            },
            Norm::Moment { x, axes, moment } => Norm::Moment {
                x: f(x),
                axes,
                moment,
            },
        }
    }
}

/// Mean and biased variance of one group.
fn moments(x: &[u8], t: DType, base: usize, dims: &[usize], st: &[usize]) -> (f32, f32) {
    let count: usize = dims.iter().product();
    let mut sum = 0f32;
    walk_offsets(dims, st, |o| sum += k::load(x, t, base + o));
    let mean = sum / count as f32;
    let mut var = 0f32;
    walk_offsets(dims, st, |o| {
        let d = k::load(x, t, base + o) - mean;
        var += d * d;
    });
    (mean, var / count as f32)
}

/// Mean and `1 / sqrt(var + eps)` of one group.
fn stats(x: &[u8], t: DType, base: usize, dims: &[usize], st: &[usize], eps: f32) -> (f32, f32) {
    let (mean, var) = moments(x, t, base, dims, st);
    (mean, 1.0 / libm::sqrtf(var + eps))
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Norm,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let t = node.dtype;
    let out = &mut *ex.out;
    match *op {
        Norm::Normalize { x, axes, eps } => {
            let xb = ex.ins.bytes(x);
            for_each_group(node.shape, axes, |base, dims, st| {
                let (mean, inv) = stats(xb, t, base, dims, st, eps);
                walk_offsets(dims, st, |o| {
                    let v = (k::load(xb, t, base + o) - mean) * inv;
                    k::store(out, t, base + o, v);
                });
            });
        }
        Norm::NormalizeGrad { dy, x, axes, eps } => {
            let (gb, xb) = (ex.ins.bytes(dy), ex.ins.bytes(x));
            for_each_group(node.shape, axes, |base, dims, st| {
                let count: usize = dims.iter().product();
                let (mean, inv) = stats(xb, t, base, dims, st, eps);
                let (mut mg, mut mgx) = (0f32, 0f32);
                walk_offsets(dims, st, |o| {
                    let g = k::load(gb, t, base + o);
                    mg += g;
                    mgx += g * (k::load(xb, t, base + o) - mean) * inv;
                });
                let (mg, mgx) = (mg / count as f32, mgx / count as f32);
                walk_offsets(dims, st, |o| {
                    let xhat = (k::load(xb, t, base + o) - mean) * inv;
                    let v = (k::load(gb, t, base + o) - mg - xhat * mgx) * inv;
                    k::store(out, t, base + o, v);
                });
            });
        }
        Norm::Moment { x, axes, moment } => {
            let (xb, sx) = (ex.ins.bytes(x), ex.ins.shape(x));
            let mut g = 0;
            for_each_group(sx, axes, |base, dims, st| {
                let (mean, var) = moments(xb, t, base, dims, st);
                let v = match moment {
                    Moment::Mean => mean,
                    Moment::Variance => var,
                };
                k::store(out, t, g, v);
                g += 1;
            });
        }
    }
    Ok(())
}

/// The gradient.
pub(crate) fn backward<S: Storage>(
    op: &Norm,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    let Norm::Normalize { x, axes, eps } = *op else {
        return Err(bp.not_differentiable(id));
    };
    bp.pass(x, Op::Norm(Norm::NormalizeGrad { dy, x, axes, eps }))?;
    Ok(())
}

/// How a batch normalisation runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNorm {
    /// The channel axis (kept; every other axis is normalised over).
    pub axis: usize,
    /// Added to the variance.
    pub epsilon: f32,
    /// Weight of the old running average (Keras' `momentum`, 0.99 by default).
    pub momentum: f32,
    /// Training (batch statistics, running averages updated) or inference (running
    /// averages used).
    pub training: bool,
}

/// The model's own tensors of a batch normalisation ([`Graph::batch_norm_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchNormParams {
    /// Per-channel scale (trained).
    pub scale: NodeId,
    /// Per-channel shift (trained).
    pub bias: NodeId,
    /// Running mean (state).
    pub mean: NodeId,
    /// Running variance (state).
    pub var: NodeId,
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Normalises `x` over `axes` (negative counts from the end).
    pub fn normalize(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axes: &[isize],
        eps: f32,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        self.float_operand(&n, "Normalize", x)?;
        let node = self.node(x);
        let (s, dtype) = (node.shape, node.dtype);
        let set = self.axis_set(&n, axes, s.rank())?;
        if set.is_empty() || !(eps > 0.0 && eps.is_finite()) {
            return Err(GraphError::BadAttribute {
                node: n,
                op: "Normalize",
                rule: "needs at least one axis and a positive epsilon",
            });
        }
        self.push(
            n,
            Op::Norm(Norm::Normalize { x, axes: set, eps }),
            s,
            dtype,
            Roles::ACTIVATION,
        )
    }

    /// The `moment` of `x`'s groups over `axes`: a tensor of `x`'s shape without `axes`.
    pub fn moment(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axes: &[isize],
        moment: Moment,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        self.float_operand(&n, "Moment", x)?;
        let node = self.node(x);
        let (s, dtype) = (node.shape, node.dtype);
        let set = self.axis_set(&n, axes, s.rank())?;
        if set.is_empty() {
            return Err(GraphError::BadAttribute {
                node: n,
                op: "Moment",
                rule: "needs at least one axis",
            });
        }
        let kept = crate::ops::reduce::reduced(s, set, false);
        self.push(
            n,
            Op::Norm(Norm::Moment {
                x,
                axes: set,
                moment,
            }),
            kept,
            dtype,
            Roles::empty(),
        )
    }

    /// `x * scale + shift` with `scale` and `shift` of `param_dims`, reshaped (a view) to
    /// `view_dims` to broadcast against `x`: the affine part of every normalisation.
    fn affine(
        &mut self,
        name: &str,
        x: NodeId,
        param_dims: &[usize],
        view_dims: &[usize],
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let gamma = self.variable(
            &derived(name, format_args!("/gamma:0"))?,
            param_dims,
            dtype,
            Init::Fill(1.0),
        )?;
        let beta = self.variable(
            &derived(name, format_args!("/beta:0"))?,
            param_dims,
            dtype,
            Init::Zeros,
        )?;
        let (g, b) = if view_dims == param_dims {
            (gamma, beta)
        } else {
            (
                self.reshape(
                    &derived(name, format_args!("/gamma_view"))?,
                    gamma,
                    view_dims,
                )?,
                self.reshape(&derived(name, format_args!("/beta_view"))?, beta, view_dims)?,
            )
        };
        let scaled = self.binary(&derived(name, format_args!("/mul"))?, x, g, BinaryFn::Mul)?;
        self.binary(name, scaled, b, BinaryFn::Add)
    }

    /// Keras' `LayerNormalization` over the last `axes` axes of `x`, with a learned scale
    /// (`name/gamma:0`) and shift (`name/beta:0`) of those axes' shape.
    pub fn layer_norm(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axes: usize,
        epsilon: f32,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let (s, dtype) = (self.node(x).shape, self.node(x).dtype);
        if axes == 0 || axes > s.rank() {
            return Err(GraphError::BadAxis {
                node: name_lossy(name),
                axis: -(axes as isize),
                rank: s.rank(),
            });
        }
        let list: [isize; MAX_RANK] = core::array::from_fn(|i| i as isize - axes as isize);
        let xhat = self.normalize(
            &derived(name, format_args!("/normalize"))?,
            x,
            &list[..axes],
            epsilon,
        )?;
        let dims: [usize; MAX_RANK] = core::array::from_fn(|i| {
            if i < axes {
                s.dim(s.rank() - axes + i)
            } else {
                1
            }
        });
        self.affine(name, xhat, &dims[..axes], &dims[..axes], dtype)
    }

    /// Group normalisation of an NCHW (or NHWC) `x` in `groups` groups of channels, with a
    /// per-channel scale and shift.
    pub fn group_norm(
        &mut self,
        name: &str,
        x: impl NodeRef,
        groups: usize,
        layout: DataLayout,
        epsilon: f32,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let (s, dtype) = (self.node(x).shape, self.node(x).dtype);
        let c_axis = layout.channel_axis();
        if s.rank() != 4 || groups == 0 || s.dim(c_axis) % groups != 0 {
            return Err(GraphError::BadAttribute {
                node: name_lossy(name),
                op: "GroupNormalization",
                rule: "input must be rank 4 with channels a multiple of the groups",
            });
        }
        let c = s.dim(c_axis);
        let (grouped, axes): ([usize; 5], [isize; 3]) = match layout {
            DataLayout::Nchw => (
                [s.dim(0), groups, c / groups, s.dim(2), s.dim(3)],
                [2, 3, 4],
            ),
            DataLayout::Nhwc => (
                [s.dim(0), s.dim(1), s.dim(2), groups, c / groups],
                [1, 2, 4],
            ),
        };
        let view = self.reshape(&derived(name, format_args!("/groups"))?, x, &grouped)?;
        let xhat = self.normalize(
            &derived(name, format_args!("/normalize"))?,
            view,
            &axes,
            epsilon,
        )?;
        let dims: [usize; 4] = [s.dim(0), s.dim(1), s.dim(2), s.dim(3)];
        let back = self.reshape(&derived(name, format_args!("/ungroup"))?, xhat, &dims)?;
        let view_dims: &[usize] = match layout {
            DataLayout::Nchw => &[c, 1, 1],
            DataLayout::Nhwc => &[c],
        };
        self.affine(name, back, &[c], view_dims, dtype)
    }

    /// Keras' `BatchNormalization`: statistics over every axis but `bn.axis`, a learned scale
    /// and shift per channel, and running averages (`name/moving_mean:0`,
    /// `name/moving_variance:0`, state that is not trained). Training normalises with the
    /// batch's statistics and updates the running averages (the variance with Bessel's
    /// correction); inference normalises with the running averages.
    pub fn batch_norm(
        &mut self,
        name: &str,
        x: impl NodeRef,
        bn: BatchNorm,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let (s, dtype) = (self.node(x).shape, self.node(x).dtype);
        let n = name_lossy(name);
        let axis = self.axis(&n, bn.axis as isize, s.rank())?;
        let c = s.dim(axis);
        let mut view = [1usize; MAX_RANK];
        view[0] = c;
        let view = &view[..s.rank() - axis];
        let mean_name = derived(name, format_args!("/moving_mean:0"))?;
        let var_name = derived(name, format_args!("/moving_variance:0"))?;
        let moving_mean = self.state(&mean_name, &[c], dtype, Init::Zeros)?;
        let moving_var = self.state(&var_name, &[c], dtype, Init::Fill(1.0))?;
        let normalized = self.batch_normalized(name, x, bn, moving_mean, moving_var)?;
        self.affine(name, normalized, &[c], view, dtype)
    }

    /// ONNX's `BatchNormalization` with the model's own tensors: `scale`, `bias`, `mean` and
    /// `var` (`[c]` each, `var` and `mean` being state that is not trained). Training
    /// normalises with the batch's statistics and updates `mean` and `var` as running
    /// averages (ONNX's `momentum` is the weight of the old value, as Keras'); inference
    /// normalises with them.
    pub fn batch_norm_with(
        &mut self,
        name: &str,
        x: impl NodeRef,
        bn: BatchNorm,
        params: BatchNormParams,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let s = self.node(x).shape;
        let n = name_lossy(name);
        let axis = self.axis(&n, bn.axis as isize, s.rank())?;
        let c = s.dim(axis);
        for p in [params.scale, params.bias, params.mean, params.var] {
            let sp = self.node(p).shape;
            if sp.dims() != [c as u32] {
                return Err(GraphError::ShapeMismatch {
                    node: n,
                    op: "BatchNormalization",
                    rule: "scale, bias, mean and variance must be [channels]",
                    left: s,
                    right: sp,
                });
            }
        }
        let normalized = self.batch_normalized(name, x, bn, params.mean, params.var)?;
        let mut view = [1usize; MAX_RANK];
        view[0] = c;
        let view = &view[..s.rank() - axis];
        let g = self.reshape(
            &derived(name, format_args!("/scale_view"))?,
            params.scale,
            view,
        )?;
        let b = self.reshape(
            &derived(name, format_args!("/bias_view"))?,
            params.bias,
            view,
        )?;
        let scaled = self.binary(
            &derived(name, format_args!("/mul"))?,
            normalized,
            g,
            BinaryFn::Mul,
        )?;
        self.binary(name, scaled, b, BinaryFn::Add)
    }

    /// The normalised `x` of a batch normalisation with running averages `moving_mean` and
    /// `moving_var` (`[c]`): batch statistics and running-average updates in training, the
    /// running averages in inference.
    fn batch_normalized(
        &mut self,
        name: &str,
        x: NodeId,
        bn: BatchNorm,
        moving_mean: NodeId,
        moving_var: NodeId,
    ) -> Result<NodeId, GraphError> {
        let (s, dtype) = (self.node(x).shape, self.node(x).dtype);
        let n = name_lossy(name);
        let axis = self.axis(&n, bn.axis as isize, s.rank())?;
        if !(0.0..1.0).contains(&bn.momentum) || bn.epsilon.is_nan() || bn.epsilon <= 0.0 {
            return Err(GraphError::BadAttribute {
                node: n,
                op: "BatchNormalization",
                rule: "momentum must be in [0, 1) and epsilon positive",
            });
        }
        let c = s.dim(axis);
        // The per-channel running averages broadcast as [c, 1, ...] from the channel axis on.
        let mut view = [1usize; MAX_RANK];
        view[0] = c;
        let view = &view[..s.rank() - axis];
        let others: [isize; MAX_RANK] =
            core::array::from_fn(|i| if i < axis { i as isize } else { i as isize + 1 });
        let others = &others[..s.rank() - 1];
        Ok(if bn.training {
            let xhat = self.normalize(
                &derived(name, format_args!("/normalize"))?,
                x,
                others,
                bn.epsilon,
            )?;
            // Running averages from this batch's statistics: the ones the normalisation
            // computed (Poplar computes them once).
            let count = s.elements() / c;
            let mean_flat = self.moment(
                &derived(name, format_args!("/mean"))?,
                x,
                others,
                Moment::Mean,
            )?;
            let var = self.moment(
                &derived(name, format_args!("/variance"))?,
                x,
                others,
                Moment::Variance,
            )?;
            let unbiased = self.unary(
                &derived(name, format_args!("/unbiased"))?,
                var,
                UnaryFn::Scale(count as f32 / (count.max(2) - 1) as f32),
            )?;
            for (state, value, what) in [
                (moving_mean, mean_flat, "/update_mean"),
                (moving_var, unbiased, "/update_variance"),
            ] {
                let op = Op::Update(Update::MovingAverage {
                    x: state,
                    value,
                    momentum: bn.momentum,
                });
                let un = self.check_name(&derived(name, format_args!("{what}"))?)?;
                self.push(un, op, Shape::scalar(), dtype, Roles::empty())?;
            }
            xhat
        } else {
            let mv = self.reshape(
                &derived(name, format_args!("/moving_mean_view"))?,
                moving_mean,
                view,
            )?;
            let vv = self.reshape(
                &derived(name, format_args!("/moving_variance_view"))?,
                moving_var,
                view,
            )?;
            let eps = self.constant(
                &derived(name, format_args!("/epsilon"))?,
                &[],
                dtype,
                bn.epsilon,
            )?;
            let centred = self.binary(
                &derived(name, format_args!("/centred"))?,
                x,
                mv,
                BinaryFn::Sub,
            )?;
            let var = self.binary(
                &derived(name, format_args!("/variance_eps"))?,
                vv,
                eps,
                BinaryFn::Add,
            )?;
            let sd = self.unary(&derived(name, format_args!("/sd"))?, var, UnaryFn::Sqrt)?;
            self.binary(
                &derived(name, format_args!("/normalize"))?,
                centred,
                sd,
                BinaryFn::Div,
            )?
        })
    }
}
