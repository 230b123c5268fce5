//! Convolutions and pooling (2-D, NCHW).

use super::super::*;
use super::{Converter, Family};

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    Converter {
        op: "Conv",
        family: Family::ConvolutionAndPooling,
        versions: &[1, 11],
        convert: |im, n| im.conv(n),
    },
    Converter {
        op: "MaxPool",
        family: Family::ConvolutionAndPooling,
        versions: &[1, 8, 10, 11, 12],
        convert: |im, n| im.pool(n),
    },
    Converter {
        op: "AveragePool",
        family: Family::ConvolutionAndPooling,
        versions: &[7, 10, 11, 19],
        convert: |im, n| im.pool(n),
    },
    Converter {
        op: "GlobalAveragePool",
        family: Family::ConvolutionAndPooling,
        versions: &[1],
        convert: |im, n| im.global_average_pool(n),
    },
    Converter {
        op: "GlobalMaxPool",
        family: Family::ConvolutionAndPooling,
        versions: &[1],
        convert: |im, n| im.global_max_pool(n),
    },
];

impl<'a> Importer<'a> {
    /// Explicit `[top, left, bottom, right]` pads of a 2-D window op.
    pub(in crate::onnx::import) fn pads2d(
        &self,
        node: &NodeProto,
        size: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
    ) -> R<[u32; 4]> {
        let auto = self
            .attr_s(node, "auto_pad")
            .unwrap_or_else(|| "NOTSET".into());
        match auto.as_str() {
            "NOTSET" => {
                let p = self.attr_ints(node, "pads").unwrap_or_else(|| vec![0; 4]);
                if p.len() != 4 || p.iter().any(|&x| x < 0) {
                    return Err(self.bad(format!("pads {p:?}: four non-negative values expected")));
                }
                Ok([p[0] as u32, p[1] as u32, p[2] as u32, p[3] as u32])
            }
            "VALID" => Ok([0; 4]),
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut p = [0u32; 4];
                for a in 0..2 {
                    let out = size[a].div_ceil(stride[a].max(1));
                    let span = (kernel[a].max(1) - 1) * dilation[a] + 1;
                    let total =
                        ((out.max(1) - 1) * stride[a] + span).saturating_sub(size[a]) as u32;
                    let (small, large) = (total / 2, total - total / 2);
                    if auto == "SAME_UPPER" {
                        p[a] = small;
                        p[a + 2] = large;
                    } else {
                        p[a] = large;
                        p[a + 2] = small;
                    }
                }
                Ok(p)
            }
            other => Err(self.bad(format!("auto_pad {other} is not an ONNX value"))),
        }
    }

    pub(in crate::onnx::import) fn pair2(&self, node: &NodeProto, name: &str) -> R<[usize; 2]> {
        match self.attr_ints(node, name) {
            None => Ok([1, 1]),
            Some(v) if v.len() == 2 && v.iter().all(|&x| x >= 1) => {
                Ok([v[0] as usize, v[1] as usize])
            }
            Some(v) => Err(self.unsupported(format!(
                "{name} {v:?} (2-D windows with positive values only)"
            ))),
        }
    }

    pub(in crate::onnx::import) fn conv(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let wv = self.req(node, 1)?;
        let (sx, sw) = (self.dims(&xv), self.dims(&wv));
        if sx.len() != 4 || sw.len() != 4 {
            return Err(self.unsupported(format!(
                "a {}-D convolution (only 2-D: input [N, C, H, W])",
                sx.len().saturating_sub(2)
            )));
        }
        let stride = self.pair2(node, "strides")?;
        let dilation = self.pair2(node, "dilations")?;
        let groups = self.attr_i(node, "group", 1).max(1) as u32;
        let pads = self.pads2d(node, [sx[2], sx[3]], [sw[2], sw[3]], stride, dilation)?;
        let mut p = ConvParams::new(DataLayout::Nchw);
        p.stride = [stride[0] as u32, stride[1] as u32];
        p.dilation = [dilation[0] as u32, dilation[1] as u32];
        p.groups = groups;
        let (x, w) = (self.ti(node, 0)?, self.ti(node, 1)?);
        let has_b = self.opt(node, 2)?.is_some();
        let name = if has_b {
            self.out_name(node, "conv")
        } else {
            self.out_name(node, "")
        };
        let mut y = chk!(self, self.g.conv2d(&name, x, w, p, Padding::Explicit(pads)))?;
        if has_b {
            let b = self.ti(node, 2)?;
            let vname = self.out_name(node, "bias_view");
            let bv = chk!(self, self.g.reshape(&vname, b, &[sw[0], 1, 1]))?;
            let name = self.out_name(node, "");
            y = chk!(self, self.g.add(&name, y, bv))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }

    pub(in crate::onnx::import) fn pool(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let sx = self.dims(&xv);
        if sx.len() != 4 {
            return Err(self.unsupported("only 2-D pooling (input [N, C, H, W])"));
        }
        if self.attr_i(node, "ceil_mode", 0) != 0 {
            return Err(self.unsupported("ceil_mode = 1"));
        }
        if self.pair2(node, "dilations")? != [1, 1] {
            return Err(self.unsupported("dilated pooling"));
        }
        if node.output.get(1).is_some_and(|s| !s.is_empty()) {
            return Err(self.unsupported("the Indices output"));
        }
        let kernel = match self.attr_ints(node, "kernel_shape") {
            Some(k) if k.len() == 2 && k.iter().all(|&v| v >= 1) => [k[0] as usize, k[1] as usize],
            k => return Err(self.bad(format!("kernel_shape {k:?}: two positive values expected"))),
        };
        let stride = self.pair2(node, "strides")?;
        let pads = self.pads2d(node, [sx[2], sx[3]], kernel, stride, [1, 1])?;
        let kind = if self.op == "MaxPool" {
            PoolKind::Max
        } else {
            PoolKind::Average {
                count_include_pad: self.attr_i(node, "count_include_pad", 0) != 0,
            }
        };
        let params = PoolParams::new(
            kind,
            DataLayout::Nchw,
            [kernel[0] as u32, kernel[1] as u32],
            [stride[0] as u32, stride[1] as u32],
        );
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(
            self,
            self.g.pool2d(&name, x, params, Padding::Explicit(pads))
        )?;
        Ok(vec![Val::T(id, Elem::F32)])
    }
}

impl<'a> Importer<'a> {
    fn global_average_pool(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(
            self,
            self.g.global_average_pool(&name, x, DataLayout::Nchw, true)
        )?;
        Ok(vec![Val::T(id, Elem::F32)])
    }

    fn global_max_pool(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(
            self,
            self.g.reduce(&name, x, &[2, 3], true, ReduceKind::Max)
        )?;
        Ok(vec![Val::T(id, Elem::F32)])
    }
}
