//! `Upsample` and `Resize`: every mode (nearest, linear, cubic, with antialiasing), every
//! coordinate transformation, `roi`, `axes` and `keep_aspect_ratio_policy`.
//!
//! Resizing is separable: each resized axis is a fixed linear map of that axis, output
//! position `o` being `sum_j coef[o][j] * x[idx[o][j]]` over a few taps (1 for nearest, 2 for
//! linear, 4 for cubic, more when antialiasing a downsample), with `tf_crop_and_resize`'s
//! points outside the input set to `extrapolation_value`. The taps and coefficients are
//! computed at import, as ONNX's reference implementation (`onnx.reference`'s
//! `_interpolate_1d_along_axis`) computes them, and the axis becomes a gather of the taps, a
//! product with the coefficients and a sum over the taps. Nearest resizing by whole factors
//! where repeating elements is exact (YOLO's and U-Net's 2x) stays a broadcast copy.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Shape, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("Upsample", &[7, 9], |im, n| im.resize(n, false)),
    op("Resize", &[10, 11, 13, 18, 19], |im, n| im.resize(n, true)),
];

/// The interpolation.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// The nearest input element, ties broken by `nearest_mode`.
    Nearest(Rounding),
    /// Linear (bilinear, trilinear) interpolation.
    Linear,
    /// Cubic convolution with coefficient `a` (`cubic_coeff_a`).
    Cubic(f64),
}

/// `nearest_mode`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rounding {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

/// `coordinate_transformation_mode`: how an output position maps to an input coordinate.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Coords {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    /// With the axis's region of interest (start, end), as fractions of the input.
    TfCropAndResize(f64, f64),
}

/// How one axis is resized.
#[derive(Clone, Debug)]
struct Axis {
    /// Input length.
    input: usize,
    /// Output length.
    output: usize,
    /// The scale (output / input, or the one given).
    scale: f64,
    mode: Mode,
    coords: Coords,
    antialias: bool,
    exclude_outside: bool,
}

/// One axis's linear map: `output` rows of `n` taps.
#[derive(Clone, Debug, PartialEq)]
struct Taps {
    n: usize,
    /// Input positions, `output * n`, each in `0..input`.
    idx: Vec<i64>,
    /// Their coefficients.
    coef: Vec<f64>,
    /// The output positions that take `extrapolation_value` (`tf_crop_and_resize` outside
    /// the input).
    outside: Vec<bool>,
}

impl Axis {
    /// The input coordinate of output position `y`, and whether it lies outside the input
    /// (`tf_crop_and_resize` only).
    fn source(&self, y: f64) -> (f64, bool) {
        let (input, scale) = (self.input as f64, self.scale);
        let width = scale * input;
        match self.coords {
            Coords::AlignCorners if width == 1.0 => (0.0, false),
            Coords::AlignCorners => (y * (input - 1.0) / (width - 1.0), false),
            Coords::Asymmetric => (y / scale, false),
            Coords::TfCropAndResize(start, end) => {
                let x = if width == 1.0 {
                    (end - start) * (input - 1.0) / 2.0
                } else {
                    y * (end - start) * (input - 1.0) / (width - 1.0)
                } + start * (input - 1.0);
                (x, x < 0.0 || x > input - 1.0)
            }
            Coords::PytorchHalfPixel if width == 1.0 => (-0.5, false),
            Coords::PytorchHalfPixel | Coords::HalfPixel => ((y + 0.5) / scale - 0.5, false),
            Coords::HalfPixelSymmetric => {
                let adjustment = self.output as f64 / width;
                let offset = input / 2.0 * (1.0 - adjustment);
                (offset + (y + 0.5) / scale - 0.5, false)
            }
        }
    }

    /// The coefficients of the taps around a coordinate whose distance past the input
    /// position on its left is `ratio` (in (0, 1]).
    fn coefficients(&self, ratio: f64) -> Vec<f64> {
        let s = self.scale.min(1.0);
        match self.mode {
            Mode::Nearest(r) => {
                let right = ratio == 1.0
                    || match r {
                        Rounding::RoundPreferFloor => ratio > 0.5,
                        Rounding::RoundPreferCeil => ratio >= 0.5,
                        Rounding::Floor => false,
                        Rounding::Ceil => true,
                    };
                vec![f64::from(u8::from(!right)), f64::from(u8::from(right))]
            }
            Mode::Linear if self.antialias => {
                let start = (-1.0 / s).floor() as i64 + 1;
                let taps = 2 - 2 * start;
                let c: Vec<f64> = (start..start + taps)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect();
                normalised(c)
            }
            Mode::Linear => vec![1.0 - ratio, ratio],
            Mode::Cubic(a) if self.antialias => {
                let cubic = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                let start = (-2.0 / s).floor() as i64 + 1;
                let c: Vec<f64> = (start..2 - start)
                    .map(|i| cubic(s * (i as f64 - ratio)))
                    .collect();
                normalised(c)
            }
            Mode::Cubic(a) => {
                let (r, q) = (ratio, 1.0 - ratio);
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
        }
    }

    /// The axis's taps: for each output position, the `n` input positions nearest its source
    /// coordinate (ties to the smaller), clamped into the input (edge padding), with their
    /// coefficients.
    fn taps(&self) -> Taps {
        let n = self.coefficients(0.5).len();
        let pad = n.div_ceil(2) as i64;
        let mut t = Taps {
            n,
            idx: Vec::with_capacity(self.output * n),
            coef: Vec::with_capacity(self.output * n),
            outside: Vec::with_capacity(self.output),
        };
        for y in 0..self.output {
            let (x, outside) = self.source(y as f64);
            let left = x.floor();
            let ratio = if x == left { 1.0 } else { x - left };
            let mut coef = self.coefficients(ratio);
            let padded = x + pad as f64;
            let p = padded.floor();
            let frac = padded - p;
            let half = (n / 2) as i64;
            let offset = if n % 2 == 0 {
                if frac == 0.0 {
                    -half
                } else {
                    1 - half
                }
            } else {
                let base = -((n as i64 - 1) / 2);
                if frac <= 0.5 {
                    base
                } else {
                    base + 1
                }
            };
            let first = p as i64 + offset - pad;
            let last = self.input as i64 - 1;
            if self.exclude_outside {
                for (j, c) in coef.iter_mut().enumerate() {
                    let i = first + j as i64;
                    if i < 0 || i > last {
                        *c = 0.0;
                    }
                }
                let sum: f64 = coef.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                coef.iter_mut().for_each(|c| *c /= sum);
            }
            if outside {
                coef.iter_mut().for_each(|c| *c = 0.0);
            }
            t.idx
                .extend((0..n as i64).map(|j| (first + j).clamp(0, last)));
            t.coef.extend(coef);
            t.outside.push(outside);
        }
        t
    }
}

/// `c` divided by its sum.
fn normalised(c: Vec<f64>) -> Vec<f64> {
    let sum: f64 = c.iter().sum();
    c.into_iter().map(|v| v / sum).collect()
}

impl Taps {
    /// Nearest's taps as one per output position: the tap of coefficient 1.
    fn single(&self) -> Option<Vec<i64>> {
        if self.outside.iter().any(|&o| o) {
            return None;
        }
        self.idx
            .chunks(self.n)
            .zip(self.coef.chunks(self.n))
            .map(|(i, c)| match c.iter().position(|&v| v == 1.0) {
                Some(j) if c.iter().filter(|&&v| v != 0.0).count() == 1 => Some(i[j]),
                _ => None,
            })
            .collect()
    }
}

/// A resized axis: (axis, scale, output length).
type AxisPlan = (usize, f64, usize);

/// What Resize's (or Upsample's) attributes ask for.
struct Resizing {
    /// Resize rather than Upsample.
    is_resize: bool,
    /// Upsample or Resize 10: `asymmetric` coordinates rounded down.
    legacy: bool,
    mode: Mode,
    rounding: Rounding,
    /// The coordinate transformation mode.
    ct: String,
    antialias: bool,
    exclude_outside: bool,
    extrapolation: f32,
    /// The keep-aspect-ratio policy of sizes.
    policy: String,
}

impl<'a> Importer<'a> {
    /// `Upsample` and `Resize` (see the module's text): what the attributes ask for, each
    /// listed axis's scale and output length, then a repeat of whole factors or the axes
    /// resized one by one.
    fn resize(&mut self, node: &NodeProto, is_resize: bool) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let e = self.elem(&xv);
        let d = self.dims(&xv);
        let r = d.len();
        let rz = self.resizing(node, e, is_resize)?;
        let (plan, roi) = self.resize_plan(node, &rz, &d)?;
        let n = plan.len();
        let (mode, rounding, legacy) = (rz.mode, rz.rounding, rz.legacy);
        let ct = rz.ct.as_str();
        let (antialias, exclude_outside, extrapolation) =
            (rz.antialias, rz.exclude_outside, rz.extrapolation);

        // Whole-factor nearest resizing that repeats each element exactly.
        let repeats = matches!(mode, Mode::Nearest(_))
            && match ct {
                "half_pixel" | "pytorch_half_pixel" | "half_pixel_symmetric" => matches!(
                    rounding,
                    Rounding::RoundPreferFloor | Rounding::RoundPreferCeil
                ),
                "asymmetric" => rounding == Rounding::Floor,
                _ => false,
            }
            && plan.iter().all(|&(a, f, o)| {
                f >= 1.0 && f.fract() == 0.0 && f <= 1024.0 && o == d[a] * f as usize
            });
        if repeats {
            let mut whole = vec![1usize; r];
            for &(a, f, _) in &plan {
                whole[a] = f as usize;
            }
            let y = self.repeat_axes(node, &whole, true)?;
            return Ok(vec![Val::T(y, e)]);
        }
        if legacy && matches!(mode, Mode::Nearest(_)) {
            // onnxruntime rounds Upsample's and Resize 10's fractional positions its own way.
            return Err(self.unsupported(format!(
                "{} nearest by scales other than whole factors",
                self.op
            )));
        }

        let mut x = self.ti(node, 0)?;
        let x0 = x;
        let mut dims = d.clone();
        for (k, &(a, scale, output)) in plan.iter().enumerate() {
            let coords = match ct {
                "half_pixel" => Coords::HalfPixel,
                "half_pixel_symmetric" => Coords::HalfPixelSymmetric,
                "pytorch_half_pixel" => Coords::PytorchHalfPixel,
                "align_corners" => Coords::AlignCorners,
                "asymmetric" => Coords::Asymmetric,
                "tf_crop_and_resize" => Coords::TfCropAndResize(roi[k], roi[n + k]),
                other => return Err(self.bad(format!("coordinate_transformation_mode {other:?}"))),
            };
            let identity = (scale - 1.0).abs() <= 1e-9
                && output == dims[a]
                && match coords {
                    Coords::TfCropAndResize(s, t) => s.abs() <= 1e-9 && (t - 1.0).abs() <= 1e-9,
                    _ => true,
                };
            if identity {
                continue;
            }
            let axis = Axis {
                input: dims[a],
                output,
                scale,
                mode,
                coords,
                antialias,
                exclude_outside,
            };
            (x, dims) = self.resize_axis(node, x, &dims, a, &axis.taps(), extrapolation)?;
        }
        if x == x0 {
            let name = self.out_name(node, "");
            x = chk!(self, self.g.unary(&name, x, UnaryFn::Identity))?;
        }
        Ok(vec![Val::T(x, e)])
    }

    /// What Resize's (or Upsample's) attributes ask for, for an input of element type `e`.
    fn resizing(&self, node: &NodeProto, e: Elem, is_resize: bool) -> R<Resizing> {
        // Upsample and Resize 10 map coordinates as `asymmetric` and round down; Resize 11
        // added the attributes.
        let legacy = !is_resize || self.model.opset < 11;
        let mode_name = self
            .attr_s(node, "mode")
            .unwrap_or_else(|| "nearest".into());
        let (ct_name, nm_name) = if legacy {
            ("asymmetric".to_string(), "floor".to_string())
        } else {
            (
                self.attr_s(node, "coordinate_transformation_mode")
                    .unwrap_or_else(|| "half_pixel".into()),
                self.attr_s(node, "nearest_mode")
                    .unwrap_or_else(|| "round_prefer_floor".into()),
            )
        };
        let rounding = match nm_name.as_str() {
            "round_prefer_floor" => Rounding::RoundPreferFloor,
            "round_prefer_ceil" => Rounding::RoundPreferCeil,
            "floor" => Rounding::Floor,
            "ceil" => Rounding::Ceil,
            other => return Err(self.bad(format!("nearest_mode {other:?}"))),
        };
        let mode = match mode_name.as_str() {
            "nearest" => Mode::Nearest(rounding),
            "linear" | "bilinear" | "trilinear" => Mode::Linear,
            "cubic" | "bicubic" => {
                Mode::Cubic(f64::from(self.attr_f(node, "cubic_coeff_a", -0.75)))
            }
            other => return Err(self.bad(format!("mode {other:?}"))),
        };
        let antialias = self.attr_i(node, "antialias", 0) != 0;
        if antialias && matches!(mode, Mode::Nearest(_)) {
            return Err(self.bad("antialias with mode nearest"));
        }
        if !matches!(mode, Mode::Nearest(_)) && !e.is_float() {
            return Err(self.unsupported(format!("mode {mode_name} on a {e:?} tensor")));
        }
        let exclude_outside = self.attr_i(node, "exclude_outside", 0) != 0;
        let extrapolation = self.attr_f(node, "extrapolation_value", 0.0);
        let policy = self
            .attr_s(node, "keep_aspect_ratio_policy")
            .unwrap_or_else(|| "stretch".into());
        Ok(Resizing {
            is_resize,
            legacy,
            mode,
            rounding,
            ct: ct_name,
            antialias,
            exclude_outside,
            extrapolation,
            policy,
        })
    }

    /// Each listed axis's (axis, scale, output length) from the scales or sizes, and the
    /// roi of `tf_crop_and_resize`, for an input of `d`.
    fn resize_plan(
        &self,
        node: &NodeProto,
        rz: &Resizing,
        d: &[usize],
    ) -> R<(Vec<AxisPlan>, Vec<f64>)> {
        let r = d.len();
        let (is_resize, legacy) = (rz.is_resize, rz.legacy);
        let policy = &rz.policy;
        // The axes the scales, sizes and roi list (Resize 18).
        let axes: Vec<usize> = match self.attr_ints(node, "axes").filter(|_| is_resize) {
            Some(a) => {
                let axes = a.iter().map(|&a| self.axis(a, r)).collect::<R<Vec<_>>>()?;
                if (1..axes.len()).any(|i| axes[..i].contains(&axes[i])) {
                    return Err(self.bad(format!("axes {a:?} repeat an axis")));
                }
                axes
            }
            None => (0..r).collect(),
        };
        let n = axes.len();
        // Upsample 7's scales attribute; else the scales input (Resize's 3rd from version 11,
        // after roi), or Resize's sizes (4th).
        let scales: Option<Vec<f64>> = if !is_resize && self.model.opset < 9 {
            attr(node, "scales").map(|a| a.floats.iter().map(|&f| f64::from(f)).collect())
        } else {
            let k = if is_resize && !legacy { 2 } else { 1 };
            self.konst(node, k, "scales")?
                .filter(|c| c.len() > 0)
                .map(|c| c.data.clone())
        };
        let sizes: Option<Vec<i64>> = match (&scales, is_resize && !legacy) {
            (None, true) => Some(
                self.konst(node, 3, "sizes")?
                    .ok_or_else(|| self.bad("scales or sizes are required"))?
                    .as_ints(),
            ),
            (None, false) => return Err(self.bad("scales are required")),
            (Some(_), _) => None,
        };
        let given = scales
            .as_ref()
            .map_or(sizes.as_ref().map_or(0, Vec::len), Vec::len);
        if given != n {
            return Err(self.bad(format!("{given} scales or sizes for {n} axes")));
        }
        let ct = rz.ct.as_str();
        let roi: Vec<f64> = if ct == "tf_crop_and_resize" {
            let roi = self
                .konst(node, 1, "roi")?
                .ok_or_else(|| self.bad("tf_crop_and_resize needs roi"))?;
            if roi.len() != 2 * n {
                return Err(self.bad(format!("roi of {} values for {n} axes", roi.len())));
            }
            roi.data.clone()
        } else {
            Vec::new()
        };

        // Scale and output length per listed axis.
        let mut plan: Vec<AxisPlan> = Vec::with_capacity(n);
        match (&scales, &sizes) {
            (Some(s), _) => {
                for (&a, &f) in axes.iter().zip(s) {
                    if !(f > 0.0 && f.is_finite() && f * d[a] as f64 <= (1u64 << 31) as f64) {
                        return Err(self.bad(format!("scale {f} for axis {a}")));
                    }
                    plan.push((a, f, (f * d[a] as f64) as usize));
                }
            }
            (None, Some(s)) => {
                if s.iter().any(|&o| o < 1 || o > i64::from(i32::MAX)) {
                    return Err(self.bad(format!("sizes {s:?}")));
                }
                let ratio: Vec<f64> = axes
                    .iter()
                    .zip(s)
                    .map(|(&a, &o)| o as f64 / d[a] as f64)
                    .collect();
                let keep = match policy.as_str() {
                    "stretch" => None,
                    "not_larger" => ratio.iter().copied().reduce(f64::min),
                    "not_smaller" => ratio.iter().copied().reduce(f64::max),
                    other => return Err(self.bad(format!("keep_aspect_ratio_policy {other:?}"))),
                };
                for ((&a, &o), &f) in axes.iter().zip(s).zip(&ratio) {
                    plan.push(match keep {
                        None => (a, f, o as usize),
                        Some(k) => (a, k, (k * d[a] as f64 + 0.5) as usize),
                    });
                }
            }
            (None, None) => unreachable!("scales or sizes were found above"),
        }
        if let Some(&(a, _, _)) = plan.iter().find(|&&(_, _, o)| o == 0) {
            return Err(self.unsupported(format!("an output of size 0 on axis {a}")));
        }
        Ok((plan, roi))
    }

    /// Axis `a` of `x` (of `dims`) resized by its taps: the axis moved first, its taps
    /// gathered, weighted and summed (a single gather for nearest), `extrapolation` added
    /// where the taps lie outside, and the axis moved back.
    fn resize_axis(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        dims: &[usize],
        a: usize,
        taps: &Taps,
        extrapolation: f32,
    ) -> R<(NodeId, Vec<usize>)> {
        let r = dims.len();
        let output = taps.outside.len();
        let mut y = self.axis_first(node, x, r, a)?;
        let konst = |dims: Vec<usize>, elem: Elem, data: Vec<f64>| {
            Val::C(Rc::new(Const::new(dims, elem, data, true)))
        };
        if let Some(idx) = taps.single() {
            let name = self.out_name(node, &format!("axis{a}_index"));
            let i = konst(
                vec![output],
                Elem::I64,
                idx.iter().map(|&i| i as f64).collect(),
            );
            let i = self.t(&i, &name)?;
            let name = self.out_name(node, &format!("axis{a}_nearest"));
            y = chk!(self, self.g.gather(&name, y, i))?;
        } else {
            let name = self.out_name(node, &format!("axis{a}_taps"));
            let idx = taps.idx.iter().map(|&i| i as f64).collect();
            let i = konst(vec![output, taps.n], Elem::I64, idx);
            let i = self.t(&i, &name)?;
            let name = self.out_name(node, &format!("axis{a}_gathered"));
            y = chk!(self, self.g.gather(&name, y, i))?;
            let mut cdims = vec![output, taps.n];
            cdims.extend(std::iter::repeat_n(1, r - 1));
            let name = self.out_name(node, &format!("axis{a}_coefficients"));
            let c = konst(cdims, Elem::F32, taps.coef.clone());
            let c = self.t(&c, &name)?;
            let name = self.out_name(node, &format!("axis{a}_weighted"));
            y = chk!(self, self.g.mul(&name, y, c))?;
            let name = self.out_name(node, &format!("axis{a}_interpolated"));
            y = chk!(self, self.g.reduce_sum(&name, y, Some(1)))?;
            if taps.outside.iter().any(|&o| o) && extrapolation != 0.0 {
                let mut bdims = vec![output];
                bdims.extend(std::iter::repeat_n(1, r - 1));
                let fill = taps
                    .outside
                    .iter()
                    .map(|&o| if o { f64::from(extrapolation) } else { 0.0 })
                    .collect();
                let name = self.out_name(node, &format!("axis{a}_extrapolation"));
                let b = konst(bdims, Elem::F32, fill);
                let b = self.t(&b, &name)?;
                let name = self.out_name(node, &format!("axis{a}_extrapolated"));
                y = chk!(self, self.g.add(&name, y, b))?;
            }
        }
        let mut out = dims.to_vec();
        out[a] = output;
        Ok((self.axis_back(node, y, r, a)?, out))
    }

    /// `x` (of rank `r`) with axis `a` moved first (itself when `a` is 0).
    fn axis_first(&mut self, node: &NodeProto, x: NodeId, r: usize, a: usize) -> R<NodeId> {
        if a == 0 {
            return Ok(x);
        }
        let mut front: Vec<usize> = vec![a];
        front.extend((0..r).filter(|&i| i != a));
        let name = self.out_name(node, &format!("axis{a}_first"));
        chk!(self, self.g.transpose(&name, x, &front))
    }

    /// [`Self::axis_first`] undone: `y`'s first axis moved back to `a`.
    fn axis_back(&mut self, node: &NodeProto, y: NodeId, r: usize, a: usize) -> R<NodeId> {
        if a == 0 {
            return Ok(y);
        }
        // Axis i of the output is axis `back[i]` of [a, others...].
        let mut back: Vec<usize> = (1..r).collect();
        back.insert(a, 0);
        let name = self.out_name(node, &format!("axis{a}"));
        chk!(self, self.g.transpose(&name, y, &back))
    }

    /// `x` (of `dims`) along axis `a` at the positions `idx` (a gather of the axis moved
    /// first): the new node and dims.
    pub(in crate::onnx::import) fn take_along(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        dims: &[usize],
        a: usize,
        idx: &[usize],
    ) -> R<(NodeId, Vec<usize>)> {
        let r = dims.len();
        let y = self.axis_first(node, x, r, a)?;
        let name = self.out_name(node, &format!("axis{a}_index"));
        let data = idx.iter().map(|&i| i as f64).collect();
        let i = Val::C(Rc::new(Const::new(vec![idx.len()], Elem::I64, data, true)));
        let i = self.t(&i, &name)?;
        let name = self.out_name(node, &format!("axis{a}_taken"));
        let y = chk!(self, self.g.gather(&name, y, i))?;
        let mut out = dims.to_vec();
        out[a] = idx.len();
        Ok((self.axis_back(node, y, r, a)?, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(input: usize, output: usize, mode: Mode, coords: Coords) -> Axis {
        Axis {
            input,
            output,
            scale: output as f64 / input as f64,
            mode,
            coords,
            antialias: false,
            exclude_outside: false,
        }
    }

    #[test]
    fn linear_half_pixel_upsampling_weights_the_two_neighbours() {
        // 2 -> 4, half_pixel: sources -0.25, 0.25, 0.75, 1.25.
        let t = axis(2, 4, Mode::Linear, Coords::HalfPixel).taps();
        assert_eq!(t.n, 2);
        assert_eq!(t.idx, vec![0, 0, 0, 1, 0, 1, 1, 1]);
        assert_eq!(t.coef, vec![0.25, 0.75, 0.75, 0.25, 0.25, 0.75, 0.75, 0.25]);
    }

    #[test]
    fn nearest_taps_are_single_and_follow_the_rounding() {
        // 4 -> 2 asymmetric: sources 0 and 2.
        let t = axis(4, 2, Mode::Nearest(Rounding::Floor), Coords::Asymmetric).taps();
        assert_eq!(t.single(), Some(vec![0, 2]));
        // 2 -> 3 asymmetric, ceil: sources 0, 2/3, 4/3 -> 0, 1, 2 clamped to 1.
        let t = axis(2, 3, Mode::Nearest(Rounding::Ceil), Coords::Asymmetric).taps();
        assert_eq!(t.single(), Some(vec![0, 1, 1]));
    }

    #[test]
    fn coefficients_sum_to_one_in_every_mode() {
        for mode in [Mode::Linear, Mode::Cubic(-0.75), Mode::Cubic(-0.5)] {
            for antialias in [false, true] {
                for (i, o) in [(4, 3), (3, 8), (10, 3)] {
                    let mut ax = axis(i, o, mode, Coords::HalfPixel);
                    ax.antialias = antialias;
                    let t = ax.taps();
                    for row in t.coef.chunks(t.n) {
                        let s: f64 = row.iter().sum();
                        assert!((s - 1.0).abs() < 1e-12, "{mode:?} {antialias} {row:?}");
                    }
                    assert!(t.idx.iter().all(|&k| (0..i as i64).contains(&k)));
                }
            }
        }
    }

    #[test]
    fn tf_crop_and_resize_marks_the_points_outside() {
        let t = axis(4, 3, Mode::Linear, Coords::TfCropAndResize(0.5, 1.5)).taps();
        // Sources 1.5, 3, 4.5: the last lies outside.
        assert_eq!(t.outside, vec![false, false, true]);
        assert_eq!(&t.coef[4..], &[0.0, 0.0]);
    }
}
