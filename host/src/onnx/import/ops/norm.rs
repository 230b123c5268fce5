//! Normalisations and softmax.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Normalization, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("BatchNormalization", &[6, 7, 9, 14, 15], |im, n| {
        im.batch_norm(n)
    })
    .weights(&[1, 2, 3, 4]),
    op("LayerNormalization", &[17], |im, n| im.layer_norm(n)).weights(&[1, 2]),
    op("InstanceNormalization", &[6, 22], |im, n| {
        im.instance_norm(n)
    })
    .weights(&[1, 2]),
    op("LRN", &[1, 13], |im, n| im.lrn(n)),
    op("Softmax", &[1, 11, 13], |im, n| im.softmax(n, false)),
    op("LogSoftmax", &[1, 11, 13], |im, n| im.softmax(n, true)),
];

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn batch_norm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if self.attr_i(node, "training_mode", 0) != 0 {
            return self.batch_norm_training_mode(node);
        }
        if node.output.iter().skip(1).any(|s| !s.is_empty()) {
            return Err(self.unsupported(
                "the running mean and variance outputs of a node not in training mode (training_mode = 0)",
            ));
        }
        // Version 7's `spatial = 0` normalises each element over the batch alone.
        if self.attr_i(node, "spatial", 1) != 1 {
            return Err(self.unsupported("spatial = 0"));
        }
        let x = self.ti(node, 0)?;
        let scale = self.ti(node, 1)?;
        let bias = self.ti(node, 2)?;
        // The running statistics are state, not trained.
        for k in [3, 4] {
            if let Val::W(i) = self.req(node, k)? {
                self.weights[i].trainable = false;
                if k == 4 {
                    self.weights[i].init = Init::Fill(1.0);
                }
            }
        }
        let mean = self.ti(node, 3)?;
        let var = self.ti(node, 4)?;
        let bn = BatchNorm {
            axis: 1,
            epsilon: self.attr_f(node, "epsilon", 1e-5),
            momentum: self.attr_f(node, "momentum", 0.9),
            training: self.opts.training,
        };
        let name = self.out_name(node, "");
        let id = chk!(
            self,
            self.g.batch_norm_with(
                &name,
                x,
                bn,
                BatchNormParams {
                    scale,
                    bias,
                    mean,
                    var,
                },
            )
        )?;
        Ok(vec![Val::T(id, Elem::F32)])
    }

    /// The statistics of `x` over `axes` (kept as axes of size 1), as graph ops named after
    /// `node` (`mean` and `variance` with `prefix`): the mean, `x` less it, the population
    /// variance and `sqrt(variance + eps)`.
    fn moments(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        axes: &[isize],
        eps: f32,
        prefix: &str,
    ) -> R<Moments> {
        let dtype = self.g.node(x).dtype();
        let n = self.out_name(node, &format!("{prefix}mean"));
        let mean = chk!(self, self.g.reduce(&n, x, axes, true, ReduceKind::Mean))?;
        let n = self.out_name(node, "centered");
        let c = chk!(self, self.g.binary(&n, x, mean, BinaryFn::Sub))?;
        let n = self.out_name(node, "squares");
        let sq = chk!(self, self.g.binary(&n, c, c, BinaryFn::Mul))?;
        let n = self.out_name(node, &format!("{prefix}variance"));
        let var = chk!(self, self.g.reduce(&n, sq, axes, true, ReduceKind::Mean))?;
        let n = self.out_name(node, "epsilon");
        let e = chk!(self, self.g.constant(&n, &[], dtype, eps))?;
        let n = self.out_name(node, "variance_eps");
        let ve = chk!(self, self.g.binary(&n, var, e, BinaryFn::Add))?;
        let n = self.out_name(node, "std");
        let sd = chk!(self, self.g.unary(&n, ve, UnaryFn::Sqrt))?;
        Ok(Moments { mean, c, var, sd })
    }

    /// `BatchNormalization` with `training_mode = 1` (opset 14 on), as ONNX defines it: `x`
    /// normalised by its own batch statistics over every axis but the channels' (the
    /// population variance), and the running statistics updated as outputs,
    /// `running = input x momentum + current x (1 - momentum)`. Built of graph ops.
    fn batch_norm_training_mode(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let r = self.dims(&self.req(node, 0)?).len();
        if r < 2 {
            return Err(self.bad("the input must have a channel axis (rank 2 or more)"));
        }
        let axes: Vec<isize> = (0..r as isize).filter(|&a| a != 1).collect();
        let eps = self.attr_f(node, "epsilon", 1e-5);
        let momentum = self.attr_f(node, "momentum", 0.9);
        // The running statistics are state, not trained.
        for k in [3, 4] {
            if let Val::W(i) = self.req(node, k)? {
                self.weights[i].trainable = false;
            }
        }
        let x = self.ti(node, 0)?;
        let Moments { mean, c, var, sd } = self.moments(node, x, &axes, eps, "batch_")?;
        let n = self.out_name(node, "normalized");
        let xhat = chk!(self, self.g.binary(&n, c, sd, BinaryFn::Div))?;
        // Per-channel tensors `[C]` laid along axis 1: `[C, 1, ...]`.
        let channels = self.dims(&self.req(node, 1)?);
        let mut along = channels.clone();
        along.resize(r - 1, 1);
        let per_channel = |im: &mut Self, k: usize, what: &str| -> R<NodeId> {
            let t = im.ti(node, k)?;
            let n = im.out_name(node, what);
            chk!(im, im.g.reshape(&n, t, &along))
        };
        let scale = per_channel(self, 1, "scale_along")?;
        let bias = per_channel(self, 2, "bias_along")?;
        let n = self.out_name(node, "scaled");
        let y = chk!(self, self.g.binary(&n, xhat, scale, BinaryFn::Mul))?;
        let n = self.out_name(node, "");
        let y = chk!(self, self.g.binary(&n, y, bias, BinaryFn::Add))?;
        let mut outs = vec![Val::T(y, Elem::F32)];
        for (k, current, what) in [(3, mean, "running_mean"), (4, var, "running_var")] {
            if node.output.get(outs.len()).is_none_or(|s| s.is_empty()) {
                break;
            }
            let n = self.out_name(node, &format!("{what}_current"));
            let cur = chk!(self, self.g.reshape(&n, current, &channels))?;
            let running = self.ti(node, k)?;
            let n = self.out_name(node, &format!("{what}_kept"));
            let kept = chk!(self, self.g.scale(&n, running, momentum))?;
            let n = self.out_name(node, &format!("{what}_new"));
            let new = chk!(self, self.g.scale(&n, cur, 1.0 - momentum))?;
            let n = self.out_name(node, what);
            let id = chk!(self, self.g.binary(&n, kept, new, BinaryFn::Add))?;
            outs.push(Val::T(id, Elem::F32));
        }
        Ok(outs)
    }

    pub(in crate::onnx::import) fn layer_norm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let r = self.dims(&xv).len();
        let axis = self.axis(self.attr_i(node, "axis", -1), r)?;
        let axes: Vec<isize> = (axis..r).map(|a| a as isize).collect();
        let eps = self.attr_f(node, "epsilon", 1e-5);
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "normalize");
        let xhat = chk!(self, self.g.normalize(&name, x, &axes, eps))?;
        let scale = self.ti(node, 1)?;
        let has_b = self.opt(node, 2)?.is_some();
        let name = if has_b {
            self.out_name(node, "scale")
        } else {
            self.out_name(node, "")
        };
        let mut y = chk!(self, self.g.mul(&name, xhat, scale))?;
        if has_b {
            let b = self.ti(node, 2)?;
            let name = self.out_name(node, "");
            y = chk!(self, self.g.add(&name, y, b))?;
        }
        let mut outs = vec![Val::T(y, Elem::F32)];
        // The Mean and InvStdDev outputs (training exports keep them for the gradient): the
        // statistics over the normalised axes, kept as axes of size 1.
        if node.output.iter().skip(1).any(|s| !s.is_empty()) {
            let Moments { mean, sd, .. } = self.moments(node, x, &axes, eps, "")?;
            let dtype = self.g.node(x).dtype();
            let n = self.out_name(node, "one");
            let one = chk!(self, self.g.constant(&n, &[], dtype, 1.0))?;
            let n = self.out_name(node, "inv_std_dev");
            let inv = chk!(self, self.g.binary(&n, one, sd, BinaryFn::Div))?;
            outs.push(Val::T(mean, Elem::F32));
            outs.push(Val::T(inv, Elem::F32));
        }
        Ok(outs)
    }

    /// Softmax, or its logarithm when `log` (LogSoftmax).
    fn softmax(&mut self, node: &NodeProto, log: bool) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let d = self.dims(&xv);
        let r = d.len();
        let x = self.ti(node, 0)?;
        let mut y = if self.model.opset >= 13 {
            let axis = self.axis(self.attr_i(node, "axis", -1), r)?;
            let name = if log {
                self.out_name(node, "softmax")
            } else {
                self.out_name(node, "")
            };
            chk!(self, self.g.softmax_axis(&name, x, axis as isize))?
        } else {
            // Before opset 13 the input is coerced to 2-D at `axis`.
            let axis = self.axis(self.attr_i(node, "axis", 1), r)?;
            let rows: usize = d[..axis].iter().product();
            let cols: usize = d[axis..].iter().product();
            let name = self.out_name(node, "rows");
            let v = chk!(self, self.g.reshape(&name, x, &[rows, cols]))?;
            let name = self.out_name(node, "softmax2d");
            let s = chk!(self, self.g.softmax_axis(&name, v, 1))?;
            let name = if log {
                self.out_name(node, "softmax")
            } else {
                self.out_name(node, "")
            };
            chk!(self, self.g.reshape(&name, s, &d))?
        };
        if log {
            let name = self.out_name(node, "");
            y = chk!(self, self.g.unary(&name, y, UnaryFn::Log))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }
}

impl<'a> Importer<'a> {
    /// Local response normalisation across channels (AlexNet's, GoogLeNet's), as ONNX defines
    /// it: `x / (bias + alpha / size * sum of x^2 over the `size` channels around)^beta`. It
    /// is built of graph ops, so it has their kernels, gradients and costs: the squares
    /// viewed as `[N, 1, C, H * W]`, an average pool over `size` channels (zero padding
    /// counted, `floor((size - 1) / 2)` before and `ceil((size - 1) / 2)` after: the window
    /// sum over `size`), then `alpha`, `bias`, `beta` and the division.
    fn lrn(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let d = self.dims(&xv);
        if d.len() != 4 {
            return Err(self.unsupported("only [N, C, H, W] inputs"));
        }
        let size = self.attr_i(node, "size", 0);
        if size < 1 || size as usize > d[1] + size as usize - 1 {
            return Err(self.bad(format!(
                "size {size}: a positive window of channels expected"
            )));
        }
        let size = size as u32;
        let alpha = self.attr_f(node, "alpha", 1e-4);
        let beta = self.attr_f(node, "beta", 0.75);
        let bias = self.attr_f(node, "bias", 1.0);
        let x = self.ti(node, 0)?;
        let dtype = self.g.node(x).dtype();
        let n = self.out_name(node, "square");
        let sq = chk!(self, self.g.binary(&n, x, x, BinaryFn::Mul))?;
        let n = self.out_name(node, "channels");
        let view = chk!(self, self.g.reshape(&n, sq, &[d[0], 1, d[1], d[2] * d[3]]))?;
        let params = PoolParams::new(
            PoolKind::Average {
                count_include_pad: true,
            },
            DataLayout::Nchw,
            [size, 1],
            [1, 1],
        );
        let pads = [(size - 1) / 2, 0, size / 2, 0];
        let n = self.out_name(node, "window_mean");
        let mean = chk!(
            self,
            self.g.pool2d(&n, view, params, Padding::Explicit(pads))
        )?;
        let n = self.out_name(node, "window_mean_nchw");
        let mean = chk!(self, self.g.reshape(&n, mean, &d))?;
        let n = self.out_name(node, "alpha");
        let a = chk!(self, self.g.constant(&n, &[], dtype, alpha))?;
        let n = self.out_name(node, "scaled");
        let scaled = chk!(self, self.g.binary(&n, mean, a, BinaryFn::Mul))?;
        let n = self.out_name(node, "bias");
        let b = chk!(self, self.g.constant(&n, &[], dtype, bias))?;
        let n = self.out_name(node, "base");
        let base = chk!(self, self.g.binary(&n, scaled, b, BinaryFn::Add))?;
        let n = self.out_name(node, "beta");
        let e = chk!(self, self.g.constant(&n, &[], dtype, beta))?;
        let n = self.out_name(node, "denominator");
        let den = chk!(self, self.g.binary(&n, base, e, BinaryFn::Pow))?;
        let n = self.out_name(node, "");
        let id = chk!(self, self.g.binary(&n, x, den, BinaryFn::Div))?;
        Ok(vec![Val::T(id, Elem::F32)])
    }
}

impl<'a> Importer<'a> {
    /// Instance normalisation: each sample's channel normalised over its spatial axes, then
    /// the per-channel `scale` and `B`.
    fn instance_norm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let d = self.dims(&self.req(node, 0)?);
        if d.len() < 3 {
            return Err(self.bad(format!("input {d:?}: [N, C, D1, ...] expected")));
        }
        let eps = self.attr_f(node, "epsilon", 1e-5);
        let x = self.ti(node, 0)?;
        let scale = self.ti(node, 1)?;
        let bias = self.ti(node, 2)?;
        let axes: Vec<isize> = (2..d.len() as isize).collect();
        let n = self.out_name(node, "normalize");
        let xhat = chk!(self, self.g.normalize(&n, x, &axes, eps))?;
        let mut view = vec![1usize; d.len() - 1];
        view[0] = d[1];
        let n = self.out_name(node, "scale_view");
        let scale = chk!(self, self.g.reshape(&n, scale, &view))?;
        let n = self.out_name(node, "bias_view");
        let bias = chk!(self, self.g.reshape(&n, bias, &view))?;
        let n = self.out_name(node, "scaled");
        let y = chk!(self, self.g.binary(&n, xhat, scale, BinaryFn::Mul))?;
        let n = self.out_name(node, "");
        let y = chk!(self, self.g.binary(&n, y, bias, BinaryFn::Add))?;
        Ok(vec![Val::T(y, Elem::F32)])
    }
}

/// A tensor's statistics over some axes ([`Importer::moments`]).
struct Moments {
    /// The mean.
    mean: NodeId,
    /// The tensor less its mean.
    c: NodeId,
    /// The population variance.
    var: NodeId,
    /// `sqrt(variance + eps)`.
    sd: NodeId,
}
