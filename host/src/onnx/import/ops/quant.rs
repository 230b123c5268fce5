//! Quantized ops: `QuantizeLinear`, `DequantizeLinear`, `DynamicQuantizeLinear`,
//! `MatMulInteger`, `ConvInteger`, `QLinearMatMul` and `QLinearConv`, with onnxruntime's
//! integer semantics: products of integers (less their zero points) accumulated exactly, then
//! requantized as onnxruntime's MLAS does (`round_half_even(acc x a_scale x b_scale / y_scale)
//! + y_zero_point`, saturated to the output type).
//!
//! They are built of the graph's float ops: integers are cast to the model's float type, the
//! products are the graph's float products (exact while every sum of integer products stays
//! within float32's 24-bit mantissa: 255 x 255 x 256 terms), and rounding to nearest even is
//! float32's own (adding and subtracting 1.5 x 2^23). So estimates price a quantized product
//! as the IPU would run one: Mk2 and Bow have no 8-bit arithmetic, and poplin would widen the
//! 8-bit data to fp16 (with `--dtype f16`) or fp32 for the AMP, around casts and element-wise
//! passes for the zero points and the requantization.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Quantization, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("QuantizeLinear", &[10, 13, 19, 21], |im, n| {
        im.quantize_linear(n)
    }),
    op("DequantizeLinear", &[10, 13, 19, 21], |im, n| {
        im.dequantize_linear(n)
    }),
    op("DynamicQuantizeLinear", &[11], |im, n| {
        im.dynamic_quantize_linear(n)
    }),
    op("MatMulInteger", &[10], |im, n| im.integer_product(n, false)),
    op("ConvInteger", &[10], |im, n| im.integer_product(n, true)),
    op("QLinearMatMul", &[10, 21], |im, n| {
        im.qlinear_product(n, false)
    }),
    op("QLinearConv", &[10], |im, n| im.qlinear_product(n, true)),
];

/// 1.5 x 2^23: added to and subtracted from a float32 of magnitude below 2^22, it leaves the
/// nearest integer, ties to even (float32's rounding of the sum).
const ROUNDING: f32 = 12_582_912.0;

/// Float32 rounds to integers through [`ROUNDING`] only below this magnitude; values are
/// clamped to it first (far outside any 8-bit range, so saturation is unchanged).
const ROUNDING_RANGE: f32 = 4_194_304.0;

/// The saturation range of an 8-bit quantized type.
fn range(e: Elem) -> Option<(f32, f32)> {
    match e {
        Elem::U8 => Some((0.0, 255.0)),
        Elem::I8 => Some((-128.0, 127.0)),
        _ => None,
    }
}

impl<'a> Importer<'a> {
    /// Input `k` of `node` as the model's float type (cast when it is not a float).
    fn float_input(&mut self, node: &NodeProto, k: usize) -> R<NodeId> {
        let v = self.req(node, k)?;
        let e = self.elem(&v);
        let x = self.t(&v, &node.input[k].clone())?;
        if e.is_float() {
            return Ok(x);
        }
        let name = self.out_name(node, &format!("input{k}_float"));
        let dtype = self.dtype(Elem::F32);
        chk!(self, self.g.cast(&name, x, dtype))
    }

    /// Input `k` less its zero point, input `zp` (absent: 0), as floats; a zero point or
    /// scale of one value per channel (`axis`) is laid along that axis to broadcast.
    fn centered(&mut self, node: &NodeProto, k: usize, zp: usize, axis: usize) -> R<NodeId> {
        let x = self.float_input(node, k)?;
        if self.opt(node, zp)?.is_none() {
            return Ok(x);
        }
        let z = self.float_input(node, zp)?;
        let z = self.along(node, z, axis, self.g.node(x).shape().rank(), zp)?;
        self.bin(node, &format!("input{k}_centered"), x, z, BinaryFn::Sub)
    }

    /// `t` (a scalar, or one value per channel of `axis`) shaped to broadcast against a
    /// tensor of rank `rank` along `axis`.
    fn along(
        &mut self,
        node: &NodeProto,
        t: NodeId,
        axis: usize,
        rank: usize,
        k: usize,
    ) -> R<NodeId> {
        let s = self.g.node(t).shape();
        if s.rank() != 1 || s.dim(0) == 1 || rank <= 1 {
            return Ok(t);
        }
        let mut dims = vec![1usize; rank];
        dims[axis.min(rank - 1)] = s.dim(0);
        let name = self.out_name(node, &format!("input{k}_along"));
        chk!(self, self.g.reshape(&name, t, &dims))
    }

    /// The quantization axis of `node` (`axis`, default 1), within `rank`.
    fn quant_axis(&self, node: &NodeProto, rank: usize) -> R<usize> {
        self.axis(self.attr_i(node, "axis", 1), rank.max(1))
    }

    /// `y` rounded to the nearest integer, ties to even (see [`ROUNDING`]).
    fn round_even(&mut self, node: &NodeProto, y: NodeId) -> R<NodeId> {
        let f = UnaryFn::Clip {
            min: -ROUNDING_RANGE,
            max: ROUNDING_RANGE,
        };
        let y = self.un(node, "bounded", y, f)?;
        let m = self.scalar_like(node, "rounding", y, ROUNDING)?;
        let up = self.bin(node, "rounding_up", y, m, BinaryFn::Add)?;
        self.bin(node, "rounded", up, m, BinaryFn::Sub)
    }

    /// `y` (floats) rounded, plus zero point input `zp` of `node` (absent: 0), saturated to
    /// `elem`'s range and cast to it: a quantized output.
    fn requantize(
        &mut self,
        node: &NodeProto,
        y: NodeId,
        zp: Option<usize>,
        axis: usize,
    ) -> R<Val> {
        let zv = match zp {
            Some(k) => self.opt(node, k)?,
            None => None,
        };
        let elem = zv.as_ref().map_or(Elem::U8, |v| self.elem(v));
        let Some((lo, hi)) = range(elem) else {
            return Err(self.unsupported(format!("{} output (uint8 and int8 only)", elem.name())));
        };
        let mut q = self.round_even(node, y)?;
        if let (Some(k), Some(_)) = (zp, zv) {
            let z = self.float_input(node, k)?;
            let rank = self.g.node(q).shape().rank();
            let z = self.along(node, z, axis, rank, k)?;
            q = self.bin(node, "shifted", q, z, BinaryFn::Add)?;
        }
        let q = self.un(node, "saturated", q, UnaryFn::Clip { min: lo, max: hi })?;
        let name = self.out_name(node, "");
        let dtype = self.dtype(elem);
        let id = chk!(self, self.g.cast(&name, q, dtype))?;
        Ok(Val::T(id, elem))
    }

    /// `QuantizeLinear`: `saturate(round_half_even(x / y_scale) + y_zero_point)`.
    fn quantize_linear(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.float_input(node, 0)?;
        let rank = self.g.node(x).shape().rank();
        let axis = self.quant_axis(node, rank)?;
        let s = self.float_input(node, 1)?;
        let s = self.along(node, s, axis, rank, 1)?;
        let y = self.bin(node, "scaled", x, s, BinaryFn::Div)?;
        Ok(vec![self.requantize(node, y, Some(2), axis)?])
    }

    /// `DequantizeLinear`: `(x - x_zero_point) x x_scale`.
    fn dequantize_linear(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let rank = self.dims(&self.req(node, 0)?).len();
        let axis = self.quant_axis(node, rank)?;
        let x = self.centered(node, 0, 2, axis)?;
        let s = self.float_input(node, 1)?;
        let s = self.along(node, s, axis, rank, 1)?;
        let id = self.bin(node, "", x, s, BinaryFn::Mul)?;
        Ok(vec![Val::T(id, Elem::F32)])
    }

    /// `DynamicQuantizeLinear`: uint8 over the range of `x` widened to hold 0 (`y_scale =
    /// (max(x, 0) - min(x, 0)) / 255`, `y_zero_point = saturate(round(-min(x, 0) /
    /// y_scale))`), then `x` quantized with them.
    fn dynamic_quantize_linear(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.float_input(node, 0)?;
        let name = self.out_name(node, "max");
        let hi = chk!(self, self.g.reduce_max(&name, x, None))?;
        let neg = self.un(node, "negated", x, UnaryFn::Neg)?;
        let name = self.out_name(node, "negated_min");
        let neg_lo = chk!(self, self.g.reduce_max(&name, neg, None))?;
        let hi = self.un(node, "max_with_zero", hi, UnaryFn::Relu)?;
        let neg_lo = self.un(node, "negated_min_with_zero", neg_lo, UnaryFn::Relu)?;
        let span = self.bin(node, "span", hi, neg_lo, BinaryFn::Add)?;
        let levels = self.scalar_like(node, "levels", span, 255.0)?;
        let scale = self.bin(node, "y_scale", span, levels, BinaryFn::Div)?;
        let zp = self.bin(node, "zero_point_float", neg_lo, scale, BinaryFn::Div)?;
        let zp = self.round_even(node, zp)?;
        let zp = self.un(
            node,
            "zero_point_saturated",
            zp,
            UnaryFn::Clip {
                min: 0.0,
                max: 255.0,
            },
        )?;
        let y = self.bin(node, "scaled", x, scale, BinaryFn::Div)?;
        let y = self.round_even(node, y)?;
        let y = self.bin(node, "shifted", y, zp, BinaryFn::Add)?;
        let y = self.un(
            node,
            "saturated",
            y,
            UnaryFn::Clip {
                min: 0.0,
                max: 255.0,
            },
        )?;
        let u8 = self.dtype(Elem::U8);
        let name = self.out_name(node, "");
        let y = chk!(self, self.g.cast(&name, y, u8))?;
        let name = self.out_name(node, "y_zero_point");
        let zp = chk!(self, self.g.cast(&name, zp, u8))?;
        Ok(vec![
            Val::T(y, Elem::U8),
            Val::T(scale, Elem::F32),
            Val::T(zp, Elem::U8),
        ])
    }

    /// The float product of `a` and `b` as `MatMul` or `Conv` (`conv`: with `node`'s
    /// attributes) reads them: the importer's own converter on a node of that op.
    fn float_product(&mut self, node: &NodeProto, a: NodeId, b: NodeId, conv: bool) -> R<NodeId> {
        let base = self.output_base(node);
        let (an, bn, out) = (
            format!("{base}/a_centered"),
            format!("{base}/b_centered"),
            format!("{base}/product"),
        );
        self.values.insert(an.clone(), Val::T(a, Elem::F32));
        self.values.insert(bn.clone(), Val::T(b, Elem::F32));
        let attribute = if conv {
            node.attribute
                .iter()
                .filter(|a| {
                    let n = a.name.as_deref().unwrap_or("");
                    [
                        "auto_pad",
                        "dilations",
                        "group",
                        "kernel_shape",
                        "pads",
                        "strides",
                    ]
                    .contains(&n)
                })
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let synthetic = NodeProto {
            name: node.name.clone(),
            op_type: Some(if conv { "Conv" } else { "MatMul" }.into()),
            input: vec![an, bn],
            output: vec![out],
            attribute,
            ..Default::default()
        };
        let y = if conv {
            self.conv(&synthetic)?
        } else {
            self.matmul(&synthetic)?
        };
        let y = y
            .into_iter()
            .next()
            .ok_or_else(|| self.bad("the product gave no output"))?;
        self.t(&y, &base)
    }

    /// `MatMulInteger` / `ConvInteger`: `(a - a_zero_point)` times `(b - b_zero_point)`,
    /// accumulated exactly, as int32.
    fn integer_product(&mut self, node: &NodeProto, conv: bool) -> R<Vec<Val>> {
        let a = self.centered(node, 0, 2, 1)?;
        // A weight's zero point is per output channel: axis 0 of a convolution's weight, the
        // last axis of a product's right operand.
        let rb = self.dims(&self.req(node, 1)?).len();
        let b = self.centered(node, 1, 3, if conv { 0 } else { rb.saturating_sub(1) })?;
        let y = self.float_product(node, a, b, conv)?;
        let name = self.out_name(node, "");
        let dtype = self.dtype(Elem::I32);
        let id = chk!(self, self.g.cast(&name, y, dtype))?;
        Ok(vec![Val::T(id, Elem::I32)])
    }

    /// `QLinearMatMul` (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) and `QLinearConv`
    /// (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B): the integer product (plus the
    /// int32 bias), requantized by `a_scale x b_scale / y_scale` (per output channel when
    /// `b_scale` is).
    fn qlinear_product(&mut self, node: &NodeProto, conv: bool) -> R<Vec<Val>> {
        let a = self.centered(node, 0, 2, 1)?;
        let rb = self.dims(&self.req(node, 3)?).len();
        let channel = if conv { 0 } else { rb.saturating_sub(1) };
        let b = self.centered(node, 3, 5, channel)?;
        let mut acc = self.float_product(node, a, b, conv)?;
        let rank = self.g.node(acc).shape().rank();
        // The output channel's axis: 1 of a convolution's NCHW output, the last of a product.
        let out_axis = if conv { 1 } else { rank.saturating_sub(1) };
        if conv && self.opt(node, 8)?.is_some() {
            let bias = self.float_input(node, 8)?;
            let bias = self.along(node, bias, out_axis, rank, 8)?;
            acc = self.bin(node, "biased", acc, bias, BinaryFn::Add)?;
        }
        let sa = self.float_input(node, 1)?;
        let sb = self.float_input(node, 4)?;
        let sy = self.float_input(node, 6)?;
        let sab = self.bin(node, "input_scale", sa, sb, BinaryFn::Mul)?;
        let m = self.bin(node, "multiplier", sab, sy, BinaryFn::Div)?;
        let m = self.along(node, m, out_axis, rank, 4)?;
        let y = self.bin(node, "scaled", acc, m, BinaryFn::Mul)?;
        Ok(vec![self.requantize(node, y, Some(7), out_axis)?])
    }
}
