//! Normalisations and softmax.

use super::super::*;
use super::{Converter, Family};

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    Converter {
        op: "BatchNormalization",
        family: Family::Normalization,
        versions: &[7, 9, 14, 15],
        convert: |im, n| im.batch_norm(n),
    },
    Converter {
        op: "LayerNormalization",
        family: Family::Normalization,
        versions: &[17],
        convert: |im, n| im.layer_norm(n),
    },
    Converter {
        op: "Softmax",
        family: Family::Normalization,
        versions: &[1, 11, 13],
        convert: |im, n| im.softmax(n),
    },
    Converter {
        op: "LogSoftmax",
        family: Family::Normalization,
        versions: &[1, 11, 13],
        convert: |im, n| im.softmax(n),
    },
];

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn batch_norm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if node.output.iter().skip(1).any(|s| !s.is_empty()) {
            return Err(self.unsupported("the running mean and variance outputs"));
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

    pub(in crate::onnx::import) fn layer_norm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if node.output.iter().skip(1).any(|s| !s.is_empty()) {
            return Err(self.unsupported("the Mean and InvStdDev outputs"));
        }
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
        Ok(vec![Val::T(y, Elem::F32)])
    }

    pub(in crate::onnx::import) fn softmax(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let d = self.dims(&xv);
        let r = d.len();
        let log = self.op == "LogSoftmax";
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
