//! Convolutions and pooling (2-D, NCHW; 1-D as 2-D with a height of 1, as poplin plans a
//! 1-D convolution: a spatial axis of size 1 costs nothing; 3-D as a sum of 2-D convolutions
//! over the depth taps, [`Importer::conv_3d`]).

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::ConvolutionAndPooling, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("Conv", &[1, 11, 22], |im, n| im.conv(n)).weights(&[1, 2]),
    op("ConvTranspose", &[1, 11, 22], |im, n| im.conv_transpose(n)),
    op("MaxPool", &[1, 8, 10, 11, 12, 22], |im, n| im.pool(n, true)),
    op("AveragePool", &[1, 7, 10, 11, 19, 22], |im, n| {
        im.pool(n, false)
    }),
    op("GlobalAveragePool", &[1, 22], |im, n| {
        im.global_average_pool(n)
    }),
    op("GlobalMaxPool", &[1, 22], |im, n| im.global_max_pool(n)),
];

/// A convolution's input and weight dims: as given (`x`, `w`), and as 2-D (`x2`, `w2`: a 1-D
/// op's with a unit height), with its number of spatial axes.
struct Window {
    spatial: usize,
    x: Vec<usize>,
    w: Vec<usize>,
    x2: Vec<usize>,
    w2: Vec<usize>,
}

impl<'a> Importer<'a> {
    /// Explicit `[top, left, bottom, right]` pads of a 2-D window op (of a 1-D one, of
    /// `spatial` 1, as 2-D with a height of 1: `[0, begin, 0, end]`).
    pub(in crate::onnx::import) fn pads2d(
        &self,
        node: &NodeProto,
        size: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        spatial: usize,
    ) -> R<[u32; 4]> {
        let auto = self
            .attr_s(node, "auto_pad")
            .unwrap_or_else(|| "NOTSET".into());
        match auto.as_str() {
            "NOTSET" => {
                let p = self
                    .attr_ints(node, "pads")
                    .unwrap_or_else(|| vec![0; 2 * spatial]);
                if p.len() != 2 * spatial || p.iter().any(|&x| x < 0) {
                    return Err(self.bad(format!(
                        "pads {p:?}: {} non-negative values expected",
                        2 * spatial
                    )));
                }
                if spatial == 1 {
                    return Ok([0, p[0] as u32, 0, p[1] as u32]);
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

    /// A window attribute (strides, dilations) of a 2-D op, or of a 1-D one (`spatial` 1) as
    /// 2-D with a height of 1; absent, ones.
    pub(in crate::onnx::import) fn pair2(
        &self,
        node: &NodeProto,
        name: &str,
        spatial: usize,
    ) -> R<[usize; 2]> {
        match self.attr_ints(node, name) {
            None => Ok([1, 1]),
            Some(v) if v.len() == spatial && v.iter().all(|&x| x >= 1) => Ok(if spatial == 1 {
                [1, v[0] as usize]
            } else {
                [v[0] as usize, v[1] as usize]
            }),
            Some(v) => Err(self.bad(format!("{name} {v:?}: {spatial} positive values expected"))),
        }
    }

    /// The number of spatial axes of a window op's input of rank `r`: 1 or 2 are read (a 1-D
    /// op as 2-D with a height of 1), others refused.
    fn spatial_axes(&self, r: usize, what: &str) -> R<usize> {
        match r {
            3 | 4 => Ok(r - 2),
            _ => Err(self.unsupported(format!(
                "a {}-D {what} (1-D and 2-D: input [N, C, L] or [N, C, H, W])",
                r.saturating_sub(2)
            ))),
        }
    }

    /// `v` (of `dims`) with a unit axis inserted before its last, as a view (a 1-D window op's
    /// operand as 2-D).
    pub(in crate::onnx::import) fn lift_1d(
        &mut self,
        node: &NodeProto,
        v: NodeId,
        dims: &[usize],
        what: &str,
    ) -> R<NodeId> {
        let mut d = dims.to_vec();
        d.insert(d.len() - 1, 1);
        let name = self.out_name(node, &format!("{what}_2d"));
        chk!(self, self.g.reshape(&name, v, &d))
    }

    /// A convolution's input and weights (inputs 0 and 1), as given and as 2-D.
    fn window(&self, node: &NodeProto, what: &str) -> R<Window> {
        let x = self.dims(&self.req(node, 0)?);
        let w = self.dims(&self.req(node, 1)?);
        let spatial = self.spatial_axes(x.len(), what)?;
        if w.len() != x.len() {
            return Err(self.bad(format!(
                "weights of rank {} for an input of rank {}",
                w.len(),
                x.len()
            )));
        }
        let lift = |d: &[usize]| {
            let mut d = d.to_vec();
            if spatial == 1 {
                d.insert(2, 1);
            }
            d
        };
        Ok(Window {
            spatial,
            x2: lift(&x),
            w2: lift(&w),
            x,
            w,
        })
    }

    /// Inputs 0 and 1 (of dims `x` and `w`) as graph nodes, lifted to 2-D for a 1-D op.
    fn window_nodes(
        &mut self,
        node: &NodeProto,
        spatial: usize,
        x: &[usize],
        w: &[usize],
    ) -> R<(NodeId, NodeId)> {
        let (mut xi, mut wi) = (self.ti(node, 0)?, self.ti(node, 1)?);
        if spatial == 1 {
            xi = self.lift_1d(node, xi, x, "input")?;
            wi = self.lift_1d(node, wi, w, "weights")?;
        }
        Ok((xi, wi))
    }

    /// The name of a convolution's own node: the node's output when nothing follows it (no
    /// bias, 2-D), else `<output>/<what>`.
    fn window_name(&mut self, node: &NodeProto, what: &str, spatial: usize) -> R<String> {
        let last = self.opt(node, 2)?.is_none() && spatial == 2;
        Ok(if last {
            self.out_name(node, "")
        } else {
            self.out_name(node, what)
        })
    }

    /// A convolution's result `y` with the bias (input 2, one per of its `channels`) added
    /// when there is one, and back to 1-D for a 1-D op.
    fn window_output(
        &mut self,
        node: &NodeProto,
        mut y: NodeId,
        channels: usize,
        spatial: usize,
    ) -> R<NodeId> {
        if self.opt(node, 2)?.is_some() {
            let b = self.ti(node, 2)?;
            let vname = self.out_name(node, "bias_view");
            let bv = chk!(self, self.g.reshape(&vname, b, &[channels, 1, 1]))?;
            let name = if spatial == 1 {
                self.out_name(node, "biased")
            } else {
                self.out_name(node, "")
            };
            y = chk!(self, self.g.add(&name, y, bv))?;
        }
        if spatial == 1 {
            y = self.lower_1d(node, y)?;
        }
        Ok(y)
    }

    pub(in crate::onnx::import) fn conv(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if self.dims(&self.req(node, 0)?).len() == 5 {
            return self.conv_3d(node);
        }
        let Window {
            spatial,
            x: sx0,
            w: sw0,
            x2: sx,
            w2: sw,
        } = self.window(node, "convolution")?;
        let stride = self.pair2(node, "strides", spatial)?;
        let dilation = self.pair2(node, "dilations", spatial)?;
        let groups = self.attr_i(node, "group", 1).max(1) as u32;
        let pads = self.pads2d(
            node,
            [sx[2], sx[3]],
            [sw[2], sw[3]],
            stride,
            dilation,
            spatial,
        )?;
        let mut p = ConvParams::new(DataLayout::Nchw);
        p.stride = [stride[0] as u32, stride[1] as u32];
        p.dilation = [dilation[0] as u32, dilation[1] as u32];
        p.groups = groups;
        let (x, w) = self.window_nodes(node, spatial, &sx0, &sw0)?;
        let name = self.window_name(node, "conv", spatial)?;
        let y = chk!(self, self.g.conv2d(&name, x, w, p, Padding::Explicit(pads)))?;
        let y = self.window_output(node, y, sw[0], spatial)?;
        Ok(vec![Val::T(y, Elem::F32)])
    }

    /// A 2-D result of a lifted 1-D op back to 1-D (the unit height dropped), named after the
    /// node's output.
    pub(in crate::onnx::import) fn lower_1d(&mut self, node: &NodeProto, y: NodeId) -> R<NodeId> {
        let mut d: Vec<usize> = self
            .g
            .node(y)
            .shape()
            .dims()
            .iter()
            .map(|&v| v as usize)
            .collect();
        d.remove(2);
        let name = self.out_name(node, "");
        chk!(self, self.g.reshape(&name, y, &d))
    }
}

impl<'a> Importer<'a> {
    fn global_average_pool(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let r = self.dims(&self.req(node, 0)?).len();
        if r != 4 {
            // Over every spatial axis, kept.
            let axes: Vec<isize> = (2..r as isize).collect();
            let x = self.ti(node, 0)?;
            let name = self.out_name(node, "");
            let id = chk!(self, self.g.reduce(&name, x, &axes, true, ReduceKind::Mean))?;
            return Ok(vec![Val::T(id, Elem::F32)]);
        }
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(
            self,
            self.g.global_average_pool(&name, x, DataLayout::Nchw, true)
        )?;
        Ok(vec![Val::T(id, Elem::F32)])
    }

    fn global_max_pool(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let r = self.dims(&self.req(node, 0)?).len();
        let axes: Vec<isize> = (2..r.max(2) as isize).collect();
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.reduce(&name, x, &axes, true, ReduceKind::Max))?;
        Ok(vec![Val::T(id, Elem::F32)])
    }

    /// `ConvTranspose`: the input gradient of the convolution it transposes (whose input has
    /// the transposed convolution's output shape, and whose weights `[C_in, C_out / group,
    /// kH, kW]` are ONNX's as they stand), as PopART lowers it; 1-D as 2-D with a height of 1.
    /// The output's size along each axis is `stride * (in - 1) + output_padding + (kernel - 1)
    /// * dilation + 1 - pad_begin - pad_end`, or `output_shape` (pads worked out from it, as
    /// `auto_pad` works them out from `in * stride`, when they split evenly).
    fn conv_transpose(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let Window {
            spatial,
            x: sx0,
            w: sw0,
            x2: sx,
            w2: sw,
        } = self.window(node, "transposed convolution")?;
        let groups = self.attr_i(node, "group", 1).max(1) as usize;
        if sx[1] != sw[0] || sw[0] % groups != 0 {
            return Err(self.bad(format!(
                "input of {} channels for weights {:?} in {groups} groups",
                sx[1], sw0
            )));
        }
        let stride = self.pair2(node, "strides", spatial)?;
        let dilation = self.pair2(node, "dilations", spatial)?;
        let ints = |name: &str| -> R<[i64; 2]> {
            match self.attr_ints(node, name) {
                None => Ok([0, 0]),
                Some(v) if v.len() == spatial => Ok(if spatial == 1 {
                    [0, v[0]]
                } else {
                    [v[0], v[1]]
                }),
                Some(v) => Err(self.bad(format!("{name} {v:?}: {spatial} values expected"))),
            }
        };
        let out_pad = ints("output_padding")?;
        for a in 0..2 {
            if out_pad[a] < 0 || out_pad[a] >= stride[a].max(dilation[a]) as i64 {
                return Err(self.bad(format!(
                    "output_padding {out_pad:?} (each must be below its stride or dilation)"
                )));
            }
        }
        let span = |a: usize| (sw[2 + a] as i64 - 1) * dilation[a] as i64 + 1;
        let full = |a: usize| stride[a] as i64 * (sx[2 + a] as i64 - 1) + out_pad[a] + span(a);
        let pads = self.transposed_pads(node, spatial, &sx, stride, &full)?;
        let out = [full(0) - pads[0] - pads[2], full(1) - pads[1] - pads[3]];
        if out.iter().any(|&o| o < 1) {
            return Err(self.bad(format!("an output of {out:?}")));
        }
        let c_out = sw[1] * groups;
        let x_shape = [sx[0], c_out, out[0] as usize, out[1] as usize];
        let mut p = ConvParams::new(DataLayout::Nchw);
        p.stride = [stride[0] as u32, stride[1] as u32];
        p.dilation = [dilation[0] as u32, dilation[1] as u32];
        p.groups = groups as u32;
        p.pads = [
            pads[0] as u32,
            pads[1] as u32,
            pads[2] as u32,
            pads[3] as u32,
        ];
        let (x, w) = self.window_nodes(node, spatial, &sx0, &sw0)?;
        let name = self.window_name(node, "conv_transpose", spatial)?;
        let y = chk!(self, self.g.conv2d_grad_input(&name, x, w, p, &x_shape))?;
        let y = self.window_output(node, y, c_out, spatial)?;
        Ok(vec![Val::T(y, Elem::F32)])
    }

    /// A transposed convolution's `[top, left, bottom, right]` pads, for an output of
    /// `full(axis)` rows or columns before padding (input `sx`, strides `stride`): the pads
    /// given, or those `output_shape` or `auto_pad` SAME ask for.
    fn transposed_pads(
        &self,
        node: &NodeProto,
        spatial: usize,
        sx: &[usize],
        stride: [usize; 2],
        full: &dyn Fn(usize) -> i64,
    ) -> R<[i64; 4]> {
        let auto = self
            .attr_s(node, "auto_pad")
            .unwrap_or_else(|| "NOTSET".into());
        let wanted = match self.attr_ints(node, "output_shape") {
            Some(v) => {
                let v: Vec<i64> = v.iter().rev().take(spatial).rev().copied().collect();
                if v.len() != spatial {
                    return Err(self.bad(format!("output_shape {v:?}")));
                }
                Some(if spatial == 1 {
                    [1, v[0]]
                } else {
                    [v[0], v[1]]
                })
            }
            None if auto == "SAME_UPPER" || auto == "SAME_LOWER" => Some([
                sx[2] as i64 * stride[0] as i64,
                sx[3] as i64 * stride[1] as i64,
            ]),
            None => None,
        };
        // [top, left, bottom, right].
        let mut pads = [0i64; 4];
        match wanted {
            Some(out) => {
                for a in 0..2 {
                    let total = full(a) - out[a];
                    if total < 0 {
                        return Err(self.unsupported(format!(
                            "output_shape {out:?} larger than the transposed convolution gives"
                        )));
                    }
                    // An odd total: onnxruntime and ONNX's reference put the extra row at
                    // opposite ends (for SAME_UPPER, and for output_shape without auto_pad).
                    if total % 2 == 1 {
                        return Err(self.unsupported(format!(
                            "an odd total padding ({total}) from output_shape or auto_pad \
                             (onnxruntime and ONNX's reference place the extra row at opposite \
                             ends); give pads instead"
                        )));
                    }
                    pads[a] = total / 2;
                    pads[a + 2] = total / 2;
                }
            }
            None if auto == "NOTSET" || auto == "VALID" => {
                if auto == "NOTSET" {
                    let p = self
                        .attr_ints(node, "pads")
                        .unwrap_or_else(|| vec![0; 2 * spatial]);
                    if p.len() != 2 * spatial || p.iter().any(|&v| v < 0) {
                        return Err(self.bad(format!(
                            "pads {p:?}: {} non-negative values expected",
                            2 * spatial
                        )));
                    }
                    pads = if spatial == 1 {
                        [0, p[0], 0, p[1]]
                    } else {
                        [p[0], p[1], p[2], p[3]]
                    };
                }
            }
            None => return Err(self.bad(format!("auto_pad {auto} is not an ONNX value"))),
        }
        Ok(pads)
    }
}

impl<'a> Importer<'a> {
    /// A 3-D convolution (`[N, C, D, H, W]` by `[O, C / group, kD, kH, kW]`) as the sum over
    /// its `kD` depth taps of 2-D convolutions: tap `j` convolves, over height and width, the
    /// input's depth slices `j * dilation + o * stride` (`o` each output depth, the slices
    /// folded into the batch: `[N * D_out, C, H, W]`) with the weights' depth slice `j`. The
    /// multiply-accumulates are the 3-D convolution's; the depth padding is zero slabs, and
    /// the input is moved depth-major (`[N, D, C, H, W]`) once and the output back once.
    /// Poplin plans a 3-D convolution as one; the sum adds `kD - 1` additions of the output.
    fn conv_3d(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.dims(&self.req(node, 0)?);
        let w = self.dims(&self.req(node, 1)?);
        if w.len() != 5 {
            return Err(self.bad(format!(
                "weights of rank {} for an input of rank 5",
                w.len()
            )));
        }
        let stride = self.window_ints(node, "strides", 3)?;
        let dilation = self.window_ints(node, "dilations", 3)?;
        let pads = self.window_pads(node, &x[2..], &w[2..], &stride, &dilation)?;
        let groups = self.attr_i(node, "group", 1).max(1) as u32;
        let (n, c, (o, kd)) = (x[0], x[1], (w[0], w[2]));
        let depth = x[2] + pads[0].0 + pads[0].1;
        let span = (kd - 1) * dilation[0] + 1;
        if depth < span {
            return Err(self.bad(format!(
                "a depth window of {span} over a padded depth of {depth}"
            )));
        }
        let d_out = (depth - span) / stride[0] + 1;
        // [N, D, C, H, W], padded along the depth.
        let xi = self.ti(node, 0)?;
        let name = self.out_name(node, "depth_major");
        let mut xt = chk!(self, self.g.transpose(&name, xi, &[0, 2, 1, 3, 4]))?;
        let mut xt_dims = vec![n, x[2], c, x[3], x[4]];
        for (end, size) in [(false, pads[0].0), (true, pads[0].1)] {
            if size == 0 {
                continue;
            }
            let slab = vec![n, size, c, x[3], x[4]];
            let zeros = Val::C(Rc::new(Const::new(
                slab.clone(),
                Elem::F32,
                vec![0.0; slab.iter().product()],
                true,
            )));
            let what = if end {
                "depth_pad_end"
            } else {
                "depth_pad_begin"
            };
            let name = self.out_name(node, what);
            let z = self.t(&zeros, &name)?;
            let name = self.out_name(node, &format!("{what}ded"));
            xt = if end {
                chk!(self, self.g.concat_axis(&name, xt, z, 1))?
            } else {
                chk!(self, self.g.concat_axis(&name, z, xt, 1))?
            };
            xt_dims[1] += size;
        }
        let mut p = ConvParams::new(DataLayout::Nchw);
        p.stride = [stride[1] as u32, stride[2] as u32];
        p.dilation = [dilation[1] as u32, dilation[2] as u32];
        p.groups = groups;
        let hw_pads = [
            pads[1].0 as u32,
            pads[2].0 as u32,
            pads[1].1 as u32,
            pads[2].1 as u32,
        ];
        let wi = self.ti(node, 1)?;
        let mut sum: Option<NodeId> = None;
        for j in 0..kd {
            let idx: Vec<usize> = (0..d_out)
                .map(|k| j * dilation[0] + k * stride[0])
                .collect();
            let (taps, _) = self.take_along(node, xt, &xt_dims, 1, &idx)?;
            let name = self.out_name(node, &format!("depth{j}_input"));
            let taps = chk!(
                self,
                self.g.reshape(&name, taps, &[n * d_out, c, x[3], x[4]])
            )?;
            let name = self.out_name(node, &format!("depth{j}_weights_slice"));
            let wj = chk!(self, self.g.slice(&name, wi, 2, j, 1))?;
            let name = self.out_name(node, &format!("depth{j}_weights"));
            let wj = chk!(self, self.g.reshape(&name, wj, &[o, w[1], w[3], w[4]]))?;
            let name = self.out_name(node, &format!("depth{j}"));
            let y = chk!(
                self,
                self.g
                    .conv2d(&name, taps, wj, p, Padding::Explicit(hw_pads))
            )?;
            sum = Some(match sum {
                None => y,
                Some(acc) => {
                    let name = self.out_name(node, &format!("depth{j}_sum"));
                    chk!(self, self.g.add(&name, acc, y))?
                }
            });
        }
        let y = sum.expect("a depth window has at least one tap");
        let yd: Vec<usize> = self
            .g
            .node(y)
            .shape()
            .dims()
            .iter()
            .map(|&v| v as usize)
            .collect();
        let name = self.out_name(node, "depth_split");
        let y = chk!(self, self.g.reshape(&name, y, &[n, d_out, o, yd[2], yd[3]]))?;
        let last = self.opt(node, 2)?.is_none();
        let name = self.out_name(node, if last { "" } else { "conv" });
        let mut y = chk!(self, self.g.transpose(&name, y, &[0, 2, 1, 3, 4]))?;
        if !last {
            let b = self.ti(node, 2)?;
            let name = self.out_name(node, "bias_view");
            let bv = chk!(self, self.g.reshape(&name, b, &[o, 1, 1, 1]))?;
            let name = self.out_name(node, "");
            y = chk!(self, self.g.add(&name, y, bv))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }
}
