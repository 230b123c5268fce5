//! MaxPool and AveragePool over any number of spatial axes.
//!
//! A 1-D or 2-D pool without dilation is one graph pool (poplibs' pooling vertex), its `ceil_mode`
//! windows padded at the end, except an average that counts its explicit padding: the windows
//! a ceiling adds must not count the rows past that padding, which one pool cannot tell apart.
//! Anything else (3-D, dilated windows, that average) is pooled one spatial axis at a time, as
//! a box window's max and mean are separable (the mean's divisor, the count of a box, is the
//! product of each axis' count):
//!
//! - an axis without dilation by a graph pool of a `[k, 1]` window over the input viewed as
//!   `[N, C * before, L, after]`;
//! - an axis with dilation (or that average) by its taps: the `k` positions of every window
//!   gathered (a position in the padding reads one appended slab of the op's neutral value,
//!   -inf or 0), a max or a sum over them, and a sum divided by each window's count.

use super::super::*;

/// One spatial axis of a pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PoolAxis {
    /// The input's size along the axis.
    pub size: usize,
    /// The window's size.
    pub kernel: usize,
    /// The step between windows.
    pub stride: usize,
    /// The step between a window's taps.
    pub dilation: usize,
    /// Explicit padding before the input.
    pub begin: usize,
    /// Explicit padding after the input.
    pub end: usize,
    /// Output size.
    pub out: usize,
    /// Padding past `end` that the last windows of `ceil_mode` reach.
    pub extra: usize,
}

impl PoolAxis {
    /// The axis of a window of `kernel` taps `dilation` apart, `stride` apart, over `size`
    /// positions padded `begin` and `end`; `ceil` rounds the output size up (ONNX's
    /// `ceil_mode`: a last window starting in the end padding is dropped). `None` when the
    /// window is larger than the padded input.
    pub fn new(
        size: usize,
        kernel: usize,
        stride: usize,
        dilation: usize,
        (begin, end): (usize, usize),
        ceil: bool,
    ) -> Option<PoolAxis> {
        let span = (kernel - 1) * dilation + 1;
        let avail = size + begin + end;
        let room = avail.checked_sub(span)?;
        let mut out = if ceil {
            room.div_ceil(stride) + 1
        } else {
            room / stride + 1
        };
        if ceil && out > 1 && (out - 1) * stride >= size + begin {
            out -= 1;
        }
        let extra = ((out - 1) * stride + span).saturating_sub(avail);
        Some(PoolAxis {
            size,
            kernel,
            stride,
            dilation,
            begin,
            end,
            out,
            extra,
        })
    }

    /// The input position of window `o`'s tap `j`, in the input's coordinates (negative or past
    /// the input in the padding).
    pub fn position(&self, o: usize, j: usize) -> i64 {
        (o * self.stride + j * self.dilation) as i64 - self.begin as i64
    }

    /// How many of window `o`'s taps an average divides by: those inside the input, and with
    /// `include_pad` those in the explicit padding too (never the rows `ceil_mode` adds).
    pub fn count(&self, o: usize, include_pad: bool) -> usize {
        let (lo, hi) = if include_pad {
            (-(self.begin as i64), (self.size + self.end) as i64)
        } else {
            (0, self.size as i64)
        };
        (0..self.kernel)
            .filter(|&j| (lo..hi).contains(&self.position(o, j)))
            .count()
    }

    /// Whether the axis leaves its input as it is.
    fn is_identity(&self) -> bool {
        self.kernel == 1 && self.stride == 1 && self.begin == 0 && self.end == 0
    }
}

/// What a pooling node asks for.
struct Pooling {
    max: bool,
    include_pad: bool,
    axes: Vec<PoolAxis>,
}

impl<'a> Importer<'a> {
    /// A window attribute (`strides`, `dilations`) with one positive value per spatial axis;
    /// absent, ones.
    pub(in crate::onnx::import) fn window_ints(
        &self,
        node: &NodeProto,
        name: &str,
        spatial: usize,
    ) -> R<Vec<usize>> {
        match self.attr_ints(node, name) {
            None => Ok(vec![1; spatial]),
            Some(v) if v.len() == spatial && v.iter().all(|&x| x >= 1) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            Some(v) => Err(self.bad(format!("{name} {v:?}: {spatial} positive values expected"))),
        }
    }

    /// Each spatial axis' `(begin, end)` padding of a window op over `size`, from `pads` or
    /// `auto_pad`.
    pub(in crate::onnx::import) fn window_pads(
        &self,
        node: &NodeProto,
        size: &[usize],
        kernel: &[usize],
        stride: &[usize],
        dilation: &[usize],
    ) -> R<Vec<(usize, usize)>> {
        let n = size.len();
        let auto = self
            .attr_s(node, "auto_pad")
            .unwrap_or_else(|| "NOTSET".into());
        match auto.as_str() {
            "NOTSET" => {
                let p = self
                    .attr_ints(node, "pads")
                    .unwrap_or_else(|| vec![0; 2 * n]);
                if p.len() != 2 * n || p.iter().any(|&x| x < 0) {
                    return Err(self.bad(format!(
                        "pads {p:?}: {} non-negative values expected",
                        2 * n
                    )));
                }
                Ok((0..n).map(|a| (p[a] as usize, p[a + n] as usize)).collect())
            }
            "VALID" => Ok(vec![(0, 0); n]),
            "SAME_UPPER" | "SAME_LOWER" => Ok((0..n)
                .map(|a| {
                    let out = size[a].div_ceil(stride[a]);
                    let span = (kernel[a] - 1) * dilation[a] + 1;
                    let total = ((out.max(1) - 1) * stride[a] + span).saturating_sub(size[a]);
                    let (small, large) = (total / 2, total - total / 2);
                    if auto == "SAME_UPPER" {
                        (small, large)
                    } else {
                        (large, small)
                    }
                })
                .collect()),
            other => Err(self.bad(format!("auto_pad {other} is not an ONNX value"))),
        }
    }

    /// A pooling node's windows, axis by axis.
    fn pooling(&self, node: &NodeProto, max: bool, dims: &[usize]) -> R<Pooling> {
        if dims.len() < 3 {
            return Err(self.bad(format!(
                "an input of rank {} (pooling reads [N, C, spatial axes...])",
                dims.len()
            )));
        }
        let spatial = dims.len() - 2;
        if node.output.get(1).is_some_and(|s| !s.is_empty()) {
            return Err(self.unsupported("the Indices output"));
        }
        let kernel: Vec<usize> = match self.attr_ints(node, "kernel_shape") {
            Some(k) if k.len() == spatial && k.iter().all(|&v| v >= 1) => {
                k.iter().map(|&v| v as usize).collect()
            }
            k => {
                return Err(self.bad(format!(
                    "kernel_shape {k:?}: {spatial} positive values expected"
                )))
            }
        };
        let stride = self.window_ints(node, "strides", spatial)?;
        let dilation = self.window_ints(node, "dilations", spatial)?;
        let pads = self.window_pads(node, &dims[2..], &kernel, &stride, &dilation)?;
        let ceil = self.attr_i(node, "ceil_mode", 0) != 0;
        let axes = (0..spatial)
            .map(|a| {
                PoolAxis::new(dims[2 + a], kernel[a], stride[a], dilation[a], pads[a], ceil)
                    .ok_or_else(|| {
                        self.bad(format!(
                            "a window spanning {} positions of spatial axis {a}, longer than its {} padded ({pads:?})",
                            (kernel[a] - 1) * dilation[a] + 1,
                            dims[2 + a]
                        ))
                    })
            })
            .collect::<R<Vec<_>>>()?;
        Ok(Pooling {
            max,
            include_pad: !max && self.attr_i(node, "count_include_pad", 0) != 0,
            axes,
        })
    }

    /// MaxPool (`max`) or AveragePool. An integer max pool (ONNX allows 8-bit ones) is pooled
    /// in float and cast back: a maximum is exact.
    pub(in crate::onnx::import) fn pool(&mut self, node: &NodeProto, max: bool) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let dims = self.dims(&xv);
        let p = self.pooling(node, max, &dims)?;
        let elem = self.elem(&xv);
        let mut x = self.ti(node, 0)?;
        let integer = !elem.is_float();
        if integer {
            let name = self.out_name(node, "float");
            x = chk!(self, self.g.cast(&name, x, DType::F32))?;
        }
        let one_pool = p.axes.len() <= 2
            && p.axes
                .iter()
                .all(|a| a.dilation == 1 && (a.extra == 0 || !p.include_pad));
        let mut y = if one_pool {
            self.pool_2d(node, x, &dims, &p, integer)?
        } else {
            self.pool_by_axes(node, x, &dims, &p)?
        };
        if integer {
            let name = self.out_name(node, "");
            y = chk!(self, self.g.cast(&name, y, self.dtype(elem)))?;
        }
        Ok(vec![Val::T(y, elem)])
    }

    /// A 1-D or 2-D pool without dilation as one graph pool (1-D as 2-D with a height of 1);
    /// `renamed` when a cast follows it, which takes the node's name.
    fn pool_2d(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        dims: &[usize],
        p: &Pooling,
        renamed: bool,
    ) -> R<NodeId> {
        let lifted = p.axes.len() == 1;
        let unit = PoolAxis::new(1, 1, 1, 1, (0, 0), false).expect("a unit window fits");
        let [h, w] = if lifted {
            [unit, p.axes[0]]
        } else {
            [p.axes[0], p.axes[1]]
        };
        let kind = if p.max {
            PoolKind::Max
        } else {
            PoolKind::Average {
                count_include_pad: p.include_pad,
            }
        };
        let params = PoolParams::new(
            kind,
            DataLayout::Nchw,
            [h.kernel as u32, w.kernel as u32],
            [h.stride as u32, w.stride as u32],
        );
        let pads = [
            h.begin as u32,
            w.begin as u32,
            (h.end + h.extra) as u32,
            (w.end + w.extra) as u32,
        ];
        let mut x = x;
        if lifted {
            x = self.lift_1d(node, x, dims, "input")?;
        }
        let name = if lifted || renamed {
            self.out_name(node, "pool")
        } else {
            self.out_name(node, "")
        };
        let mut id = chk!(
            self,
            self.g.pool2d(&name, x, params, Padding::Explicit(pads))
        )?;
        if lifted {
            id = self.lower_1d(node, id)?;
        }
        Ok(id)
    }

    /// A pool one spatial axis at a time (see the module's docs).
    fn pool_by_axes(
        &mut self,
        node: &NodeProto,
        mut x: NodeId,
        dims: &[usize],
        p: &Pooling,
    ) -> R<NodeId> {
        let mut dims = dims.to_vec();
        for (a, axis) in p.axes.iter().enumerate() {
            if axis.is_identity() {
                continue;
            }
            let native = axis.dilation == 1 && (axis.extra == 0 || !p.include_pad);
            x = if native {
                self.pool_axis(node, x, &dims, 2 + a, axis, p)?
            } else {
                self.pool_axis_taps(node, x, &dims, 2 + a, axis, p)?
            };
            dims[2 + a] = axis.out;
        }
        Ok(x)
    }

    /// Axis `ax` pooled by a graph pool of a `[k, 1]` window over `x` viewed as
    /// `[N, C * before, L, after]`.
    fn pool_axis(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        dims: &[usize],
        ax: usize,
        axis: &PoolAxis,
        p: &Pooling,
    ) -> R<NodeId> {
        let before: usize = dims[1..ax].iter().product();
        let after: usize = dims[ax + 1..].iter().product();
        let name = self.out_name(node, &format!("axis{ax}_view"));
        let v = chk!(
            self,
            self.g
                .reshape(&name, x, &[dims[0], before, dims[ax], after])
        )?;
        let kind = if p.max {
            PoolKind::Max
        } else {
            PoolKind::Average {
                count_include_pad: p.include_pad,
            }
        };
        let params = PoolParams::new(
            kind,
            DataLayout::Nchw,
            [axis.kernel as u32, 1],
            [axis.stride as u32, 1],
        );
        let pads = [axis.begin as u32, 0, (axis.end + axis.extra) as u32, 0];
        let name = self.out_name(node, &format!("axis{ax}_pool"));
        let y = chk!(
            self,
            self.g.pool2d(&name, v, params, Padding::Explicit(pads))
        )?;
        let mut out = dims.to_vec();
        out[ax] = axis.out;
        let name = self.out_name(node, &format!("axis{ax}"));
        chk!(self, self.g.reshape(&name, y, &out))
    }

    /// Axis `ax` pooled by its taps: every window's positions gathered, then a max or a sum
    /// over them (a sum divided by each window's count).
    fn pool_axis_taps(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        dims: &[usize],
        ax: usize,
        axis: &PoolAxis,
        p: &Pooling,
    ) -> R<NodeId> {
        let len = axis.size as i64;
        let mut idx = Vec::with_capacity(axis.out * axis.kernel);
        for o in 0..axis.out {
            for j in 0..axis.kernel {
                let at = axis.position(o, j);
                idx.push(if (0..len).contains(&at) {
                    at as usize
                } else {
                    axis.size
                });
            }
        }
        let mut src = x;
        let mut src_dims = dims.to_vec();
        if idx.contains(&axis.size) {
            // The padding: one slab of the neutral value after the input.
            let mut slab = dims.to_vec();
            slab[ax] = 1;
            let neutral = if p.max { f64::NEG_INFINITY } else { 0.0 };
            let n: usize = slab.iter().product();
            let c = Val::C(Rc::new(Const::new(slab, Elem::F32, vec![neutral; n], true)));
            let name = self.out_name(node, &format!("axis{ax}_padding"));
            let c = self.t(&c, &name)?;
            let name = self.out_name(node, &format!("axis{ax}_padded"));
            src = chk!(self, self.g.concat_axis(&name, x, c, ax as isize))?;
            src_dims[ax] += 1;
        }
        let (taps, _) = self.take_along(node, src, &src_dims, ax, &idx)?;
        let mut split = dims.to_vec();
        split[ax] = axis.out;
        split.insert(ax + 1, axis.kernel);
        let name = self.out_name(node, &format!("axis{ax}_windows"));
        let w = chk!(self, self.g.reshape(&name, taps, &split))?;
        let kind = if p.max {
            ReduceKind::Max
        } else {
            ReduceKind::Sum
        };
        let name = self.out_name(node, &format!("axis{ax}_reduced"));
        let y = chk!(
            self,
            self.g.reduce(&name, w, &[ax as isize + 1], false, kind)
        )?;
        if p.max {
            return Ok(y);
        }
        let mut shape = vec![1; dims.len()];
        shape[ax] = axis.out;
        let counts = (0..axis.out)
            .map(|o| axis.count(o, p.include_pad) as f64)
            .collect();
        let c = Val::C(Rc::new(Const::new(shape, Elem::F32, counts, true)));
        let name = self.out_name(node, &format!("axis{ax}_counts"));
        let c = self.t(&c, &name)?;
        let name = self.out_name(node, &format!("axis{ax}_mean"));
        chk!(self, self.g.div(&name, y, c))
    }
}

#[cfg(test)]
mod tests {
    use super::PoolAxis;
    use proptest::prelude::*;

    #[test]
    fn ceil_mode_adds_a_window_unless_it_would_start_in_the_end_padding() {
        // 4 positions, window 3, stride 2: floor gives 1 window, ceil 2 (one padded row).
        let floor = PoolAxis::new(4, 3, 2, 1, (0, 0), false).unwrap();
        let ceil = PoolAxis::new(4, 3, 2, 1, (0, 0), true).unwrap();
        assert_eq!((floor.out, floor.extra), (1, 0));
        assert_eq!((ceil.out, ceil.extra), (2, 1));
        // 5 positions padded 1 at each end, window 2, stride 3: ceil's third window would start
        // at padded position 6, in the end padding (which starts at 6), so it is dropped.
        let last = PoolAxis::new(5, 2, 3, 1, (1, 1), true).unwrap();
        assert_eq!(last.out, 2);
    }

    #[test]
    fn a_window_wider_than_the_padded_input_is_none() {
        assert!(PoolAxis::new(3, 2, 1, 3, (0, 0), false).is_none());
        assert!(PoolAxis::new(3, 2, 1, 2, (0, 0), false).is_some());
    }

    proptest! {
        /// Every window's first tap lies inside the padded input, its last tap inside the
        /// padding `ceil_mode` adds at most, and an average divides by at least one tap.
        #[test]
        fn windows_stay_within_the_padding(
            size in 1usize..40, kernel in 1usize..6, stride in 1usize..5,
            dilation in 1usize..4, begin in 0usize..4, end in 0usize..4, ceil: bool,
        ) {
            let (begin, end) = (begin.min(kernel - 1), end.min(kernel - 1));
            if let Some(a) = PoolAxis::new(size, kernel, stride, dilation, (begin, end), ceil) {
                let last = a.out - 1;
                prop_assert!(a.position(last, 0) < (size + end) as i64);
                prop_assert!(a.position(last, kernel - 1) < (size + end + a.extra) as i64);
                prop_assert!(a.position(0, 0) >= -(begin as i64));
                for o in 0..a.out {
                    prop_assert!(a.count(o, true) >= a.count(o, false));
                    prop_assert!(a.count(o, true) >= 1);
                }
                if !ceil {
                    prop_assert_eq!(a.extra, 0);
                }
            }
        }
    }
}
