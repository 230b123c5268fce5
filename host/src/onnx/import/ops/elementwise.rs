//! Element-wise ops: arithmetic with broadcasting, comparisons and logic, activations, casts.

use super::super::fold::{b01, mapped, Variadic};
use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Elementwise, versions, convert)
}

/// The family's ops: each converter and fold given its variant.
pub(super) const CONVERTERS: &[Converter] = &[
    op("Add", &[6, 7, 13, 14], |im, n| im.arith(n, BinaryFn::Add))
        .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Add)),
    op("Sub", &[6, 7, 13, 14], |im, n| im.arith(n, BinaryFn::Sub))
        .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Sub)),
    op("Mul", &[6, 7, 13, 14], |im, n| im.arith(n, BinaryFn::Mul))
        .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Mul)),
    op("Div", &[6, 7, 13, 14], |im, n| im.arith(n, BinaryFn::Div))
        .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Div)),
    op("Pow", &[1, 7, 12, 13, 15], |im, n| {
        im.arith(n, BinaryFn::Pow)
    })
    .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Pow)),
    op("Mod", &[10, 13], |im, n| im.modulo(n)).folds(|im, n, a, ins| im.fold_mod(n, a, ins)),
    op("Max", &[6, 8, 12, 13], |im, n| {
        im.variadic(n, BinaryFn::Max)
    })
    .folds(|im, _, a, ins| im.fold_variadic(a, ins, Variadic::Max)),
    op("Min", &[6, 8, 12, 13], |im, n| {
        im.variadic(n, BinaryFn::Min)
    })
    .folds(|im, _, a, ins| im.fold_variadic(a, ins, Variadic::Min)),
    op("Sum", &[6, 8, 13], |im, n| im.variadic(n, BinaryFn::Add))
        .folds(|im, _, a, ins| im.fold_variadic(a, ins, Variadic::Sum)),
    Converter::fold_only("Mean", Family::Elementwise, |im, _, a, ins| {
        im.fold_variadic(a, ins, Variadic::Mean)
    }),
    op("Equal", &[1, 7, 11, 13, 19], |im, n| {
        im.compare(n, BinaryFn::Equal)
    })
    .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Equal)),
    op("Less", &[1, 7, 9, 13], |im, n| {
        im.compare(n, BinaryFn::Less)
    })
    .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Less)),
    op("LessOrEqual", &[12, 16], |im, n| {
        im.compare(n, BinaryFn::LessOrEqual)
    })
    .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::LessOrEqual)),
    op("Greater", &[1, 7, 9, 13], |im, n| {
        im.compare(n, BinaryFn::Greater)
    })
    .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Greater)),
    op("GreaterOrEqual", &[12, 16], |im, n| {
        im.compare(n, BinaryFn::GreaterOrEqual)
    })
    .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::GreaterOrEqual)),
    op("And", &[1, 7], |im, n| im.compare(n, BinaryFn::And))
        .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::And)),
    op("Or", &[1, 7], |im, n| im.compare(n, BinaryFn::Or))
        .folds(|im, _, a, ins| im.fold_binary(a, ins, BinaryFn::Or)),
    op("Not", &[1], |im, n| im.not(n)).folds(|_, _, a, _| Ok(mapped(a, |v| b01(v == 0.0)))),
    op("Where", &[9, 16], |im, n| im.where_(n)).folds(|im, _, a, ins| im.fold_where(a, ins)),
    op("Relu", &[6, 13, 14], |im, n| im.unary(n, UnaryFn::Relu))
        .folds(|_, _, a, _| Ok(fold_unary(a, UnaryFn::Relu))),
    op("Sigmoid", &[6, 13], |im, n| im.unary(n, UnaryFn::Sigmoid))
        .folds(|_, _, a, _| Ok(fold_unary(a, UnaryFn::Sigmoid))),
    op("Tanh", &[6, 13], |im, n| im.unary(n, UnaryFn::Tanh))
        .folds(|_, _, a, _| Ok(fold_unary(a, UnaryFn::Tanh))),
    op("Exp", &[6, 13], |im, n| im.unary(n, UnaryFn::Exp))
        .folds(|_, _, a, _| Ok(fold_unary(a, UnaryFn::Exp))),
    op("Log", &[6, 13], |im, n| im.unary(n, UnaryFn::Log))
        .folds(|_, _, a, _| Ok(fold_unary(a, UnaryFn::Log))),
    op("Sqrt", &[6, 13], |im, n| im.unary(n, UnaryFn::Sqrt))
        .folds(|_, _, a, _| Ok(fold_unary(a, UnaryFn::Sqrt))),
    op("Erf", &[9, 13], |im, n| im.unary(n, UnaryFn::Erf))
        .folds(|_, _, a, _| Ok(fold_unary(a, UnaryFn::Erf))),
    op("Neg", &[6, 13], |im, n| im.unary(n, UnaryFn::Neg))
        .folds(|_, _, a, _| Ok(mapped(a, |v| -v))),
    op("IsNaN", &[9, 13, 20], |im, n| im.is_nan(n))
        .folds(|_, _, a, _| Ok(predicate(a, f64::is_nan))),
    op("IsInf", &[10, 20], |im, n| im.is_inf(n)).folds(|im, n, a, _| {
        let (pos, neg) = im.inf_signs(n);
        Ok(predicate(a, |v| {
            (pos && v == f64::INFINITY) || (neg && v == f64::NEG_INFINITY)
        }))
    }),
    op("Gelu", &[20], |im, n| im.gelu(n)),
    op("Clip", &[6, 11, 12, 13], |im, n| im.clip(n)).folds(|im, n, a, _| im.fold_clip(n, a)),
    op("Reciprocal", &[6, 13], |im, n| im.reciprocal(n))
        .folds(|_, _, a, _| Ok(mapped(a, |v| 1.0 / v))),
    op("Cast", &[6, 9, 13, 19, 21], |im, n| im.cast(n)).folds(|im, n, a, _| im.fold_cast(n, a)),
    op("LeakyRelu", &[6, 16], |im, n| {
        im.activation(n, Activation::LeakyRelu)
    }),
    op("PRelu", &[6, 7, 9, 16], |im, n| im.prelu(n)).weights(&[1]),
    op("Elu", &[6, 22], |im, n| im.activation(n, Activation::Elu)),
    op("Selu", &[6, 22], |im, n| im.activation(n, Activation::Selu)),
    op("Softplus", &[1, 22], |im, n| {
        im.activation(n, Activation::Softplus)
    }),
    op("Softsign", &[1, 22], |im, n| {
        im.activation(n, Activation::Softsign)
    }),
    op("Abs", &[6, 13], |im, n| im.activation(n, Activation::Abs))
        .folds(|_, _, a, _| Ok(mapped(a, f64::abs))),
    op("Sign", &[9, 13], |im, n| im.activation(n, Activation::Sign)).folds(|_, _, a, _| {
        Ok(mapped(a, |v| {
            if v == 0.0 || v.is_nan() {
                v
            } else {
                v.signum()
            }
        }))
    }),
    op("Shrink", &[9], |im, n| im.activation(n, Activation::Shrink)),
    op("HardSigmoid", &[6, 22], |im, n| {
        im.activation(n, Activation::HardSigmoid)
    }),
    op("HardSwish", &[14, 22], |im, n| {
        im.activation(n, Activation::HardSwish)
    }),
    op("Mish", &[18, 22], |im, n| {
        im.activation(n, Activation::Mish)
    }),
];

/// `f` of each element of the float constant `a` as the core's float32 kernel computes it
/// (so a folded value is the one the op would give at run time); of an integer constant,
/// exactly, then as the integer type keeps it.
fn fold_unary(a: &Const, f: UnaryFn) -> Vec<Val> {
    if a.elem.is_float() {
        mapped(a, |v| f64::from(f.apply(v as f32)))
    } else {
        let e = a.elem;
        mapped(a, move |v| cast_value(f64::from(f.apply(v as f32)), e))
    }
}

/// `p` of each element of `a`, a boolean constant.
fn predicate(a: &Const, p: impl Fn(f64) -> bool) -> Vec<Val> {
    let data = a.data.iter().map(|&v| b01(p(v))).collect();
    vec![Val::C(Rc::new(Const::new(
        a.dims.clone(),
        Elem::Bool,
        data,
        a.baked,
    )))]
}

/// The activations built of several graph ops.
#[derive(Clone, Copy)]
enum Activation {
    LeakyRelu,
    Elu,
    Selu,
    Softplus,
    Softsign,
    Abs,
    Sign,
    Shrink,
    HardSigmoid,
    HardSwish,
    Mish,
}

impl<'a> Importer<'a> {
    /// `Mod` folds (shape and index arithmetic, as exporters write it) when its inputs are
    /// constants; computed at run time, it is not supported.
    pub(in crate::onnx::import) fn modulo(&mut self, _node: &NodeProto) -> R<Vec<Val>> {
        Err(self.unsupported("inputs computed at run time"))
    }

    /// `f` of two operands.
    fn arith(&mut self, node: &NodeProto, f: BinaryFn) -> R<Vec<Val>> {
        self.arith_of(node, f, false)
    }

    /// `f` of any number of operands, applied left to right.
    fn variadic(&mut self, node: &NodeProto, f: BinaryFn) -> R<Vec<Val>> {
        self.arith_of(node, f, true)
    }

    /// `node` with its second operand laid out for numpy's broadcasting where the node uses
    /// the broadcasting of opsets before 7 (`broadcast = 1` with `axis`: the operand's dims
    /// align with the first's from `axis`, not from the end): the operand reshaped with
    /// trailing ones. Otherwise `None`.
    fn legacy_broadcast(&mut self, node: &NodeProto) -> R<Option<NodeProto>> {
        if self.model.opset >= 7 || self.attr_i(node, "broadcast", 0) == 0 {
            return Ok(None);
        }
        let Some(axis) = attr(node, "axis").and_then(|a| a.i) else {
            return Ok(None);
        };
        let (ra, db) = (
            self.dims(&self.req(node, 0)?).len(),
            self.dims(&self.req(node, 1)?),
        );
        let axis = self.axis(axis, ra.max(1))?;
        if axis + db.len() > ra {
            return Err(self.bad(format!(
                "broadcast axis {axis}: the second operand's {} dims do not fit the first's {ra}",
                db.len()
            )));
        }
        let mut dims = db;
        dims.resize(ra - axis, 1);
        let v = self.req(node, 1)?;
        let elem = self.elem(&v);
        let b = self.t(&v, &node.input[1].clone())?;
        let name = self.out_name(node, "broadcast_operand");
        let b = chk!(self, self.g.reshape(&name, b, &dims))?;
        self.values.insert(name.clone(), Val::T(b, elem));
        let mut legacy = node.clone();
        legacy.input[1] = name;
        legacy
            .attribute
            .retain(|a| !matches!(a.name.as_deref(), Some("broadcast" | "axis")));
        Ok(Some(legacy))
    }

    /// `f` of the operands (two, or any number when `variadic`), broadcast.
    fn arith_of(&mut self, node: &NodeProto, f: BinaryFn, variadic: bool) -> R<Vec<Val>> {
        if let Some(legacy) = self.legacy_broadcast(node)? {
            return self.arith_of(&legacy, f, variadic);
        }
        let n = node.input.len();
        if n == 1 {
            return Ok(vec![self.req(node, 0)?]);
        }
        if n > 2 && !variadic {
            return Err(self.bad(format!("{n} inputs; the op takes 2")));
        }
        let first = self.req(node, 0)?;
        let e = match (&first, self.req(node, 1)?) {
            (Val::C(_), other) => self.elem(&other),
            (v, _) => self.elem(v),
        };
        // x * c and x / c for a scalar c: a scale, as Poplar's scaled ops.
        if n == 2 && matches!(f, BinaryFn::Mul | BinaryFn::Div) && e.is_float() {
            let b = self.req(node, 1)?;
            let a = self.req(node, 0)?;
            let scalar = |v: &Val| match v {
                Val::C(c) => c.scalar(),
                _ => None,
            };
            let pick = match (scalar(&a), scalar(&b)) {
                (_, Some(c)) => Some((0, if f == BinaryFn::Mul { c } else { 1.0 / c })),
                (Some(c), None) if f == BinaryFn::Mul => Some((1, c)),
                _ => None,
            };
            if let Some((k, factor)) = pick {
                let x = self.ti(node, k)?;
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.scale(&name, x, factor as f32))?;
                return Ok(vec![Val::T(id, e)]);
            }
        }
        let (mut acc, b) = self.pair_at(node, 0, 1)?;
        for k in 1..n {
            let bk = if k == 1 {
                b
            } else {
                let v = self.req(node, k)?;
                let name = node.input[k].clone();
                self.t(&v, &name)?
            };
            let suffix = if k + 1 == n {
                String::new()
            } else {
                format!("partial{k}")
            };
            let name = self.out_name(node, &suffix);
            acc = chk!(self, self.g.binary(&name, acc, bk, f))?;
        }
        Ok(vec![Val::T(acc, e)])
    }
}

impl<'a> Importer<'a> {
    /// The comparison or logical op `f`, its output boolean.
    fn compare(&mut self, node: &NodeProto, f: BinaryFn) -> R<Vec<Val>> {
        if let Some(legacy) = self.legacy_broadcast(node)? {
            return self.compare(&legacy, f);
        }
        let (a, b) = self.pair(node)?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.binary(&name, a, b, f))?;
        Ok(vec![Val::T(id, Elem::Bool)])
    }

    fn not(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.ti(node, 0)?;
        let zero = self.out_name(node, "zero");
        let z = chk!(self, self.g.constant(&zero, &[], DType::U8, 0.0))?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.binary(&name, x, z, BinaryFn::Equal))?;
        Ok(vec![Val::T(id, Elem::Bool)])
    }

    /// `IsNaN(x)`: `not (x == x)`, which IEEE comparison makes true for NaN only (popops has
    /// an `IS_NAN` unary op of its own: one pass where this takes two).
    fn is_nan(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.ti(node, 0)?;
        let same = self.bin(node, "equal_self", x, x, BinaryFn::Equal)?;
        let zero = self.out_name(node, "zero");
        let z = chk!(self, self.g.constant(&zero, &[], DType::U8, 0.0))?;
        let id = self.bin(node, "", same, z, BinaryFn::Equal)?;
        Ok(vec![Val::T(id, Elem::Bool)])
    }

    /// Which infinities `IsInf` detects: (positive, negative), both by default.
    fn inf_signs(&self, node: &NodeProto) -> (bool, bool) {
        (
            self.attr_i(node, "detect_positive", 1) != 0,
            self.attr_i(node, "detect_negative", 1) != 0,
        )
    }

    /// `IsInf(x)`: `x == +inf`, `x == -inf` or either, as its attributes ask.
    fn is_inf(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.ti(node, 0)?;
        let (pos, neg) = self.inf_signs(node);
        let mut found = Vec::new();
        for (on, v, suffix) in [
            (pos, f32::INFINITY, "positive"),
            (neg, f32::NEG_INFINITY, "negative"),
        ] {
            if on {
                let c = self.scalar_like(node, &format!("{suffix}_infinity"), x, v)?;
                found.push(self.bin(node, &format!("is_{suffix}"), x, c, BinaryFn::Equal)?);
            }
        }
        let id = match found[..] {
            [a, b] => self.bin(node, "", a, b, BinaryFn::Or)?,
            [a] => a,
            _ => {
                // Neither: false everywhere.
                let c = self.scalar_like(node, "nan", x, f32::NAN)?;
                self.bin(node, "", x, c, BinaryFn::Equal)?
            }
        };
        Ok(vec![Val::T(id, Elem::Bool)])
    }

    fn where_(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let c = self.ti(node, 0)?;
        let (a, b) = self.pair_at(node, 1, 2)?;
        let e = self.elem(&self.req(node, 1)?);
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.select(&name, c, a, b))?;
        Ok(vec![Val::T(id, e)])
    }

    fn unary(&mut self, node: &NodeProto, f: UnaryFn) -> R<Vec<Val>> {
        self.one_input(node, |g, name, x| g.unary(name, x, f))
    }

    /// Gelu, exact or in its tanh approximation.
    fn gelu(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let form = match self.attr_s(node, "approximate").as_deref() {
            None | Some("none") => GeluForm::Erf,
            Some("tanh") => GeluForm::Tanh,
            Some(other) => return Err(self.unsupported(format!("approximate = {other}"))),
        };
        self.unary(node, UnaryFn::Gelu(form))
    }

    fn clip(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        // Bounds computed at run time (opset 11 on): `min(max(x, lo), hi)`, broadcast.
        let computed = |k| matches!(self.opt(node, k), Ok(Some(Val::T(..) | Val::W(_))));
        if self.model.opset >= 11 && (computed(1) || computed(2)) {
            return self.clip_computed(node);
        }
        let (min, max) = self.clip_bounds(node)?;
        let f = UnaryFn::Clip {
            min: min as f32,
            max: max as f32,
        };
        self.unary(node, f)
    }

    /// Clip with a bound computed at run time: `max` with the lower bound, then `min` with
    /// the upper (either left out when absent), as popops' `clamp` takes tensor bounds.
    fn clip_computed(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let e = self.elem(&self.req(node, 0)?);
        let mut y = self.ti(node, 0)?;
        for (k, f, suffix) in [(1, BinaryFn::Max, "at_least_min"), (2, BinaryFn::Min, "")] {
            let Some(bound) = self.opt(node, k)? else {
                continue;
            };
            let b = self.t(&bound, &node.input[k].clone())?;
            let last = k == 2 || self.opt(node, 2)?.is_none();
            y = self.bin(node, if last { "" } else { suffix }, y, b, f)?;
        }
        Ok(vec![Val::T(y, e)])
    }

    /// Clip's bounds: attributes before opset 11, optional inputs since (infinite when
    /// absent).
    pub(in crate::onnx::import) fn clip_bounds(&self, node: &NodeProto) -> R<(f64, f64)> {
        if self.model.opset >= 11 {
            let lo = self.konst(node, 1, "min")?;
            let hi = self.konst(node, 2, "max")?;
            Ok((
                lo.and_then(|c| c.scalar()).unwrap_or(f64::NEG_INFINITY),
                hi.and_then(|c| c.scalar()).unwrap_or(f64::INFINITY),
            ))
        } else {
            Ok((
                f64::from(self.attr_f(node, "min", f32::NEG_INFINITY)),
                f64::from(self.attr_f(node, "max", f32::INFINITY)),
            ))
        }
    }

    fn reciprocal(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let x = self.ti(node, 0)?;
        let e = self.elem(&self.req(node, 0)?);
        let dtype = self.g.node(x).dtype();
        let oname = self.out_name(node, "one");
        let o = chk!(self, self.g.constant(&oname, &[], dtype, 1.0))?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.binary(&name, o, x, BinaryFn::Div))?;
        Ok(vec![Val::T(id, e)])
    }

    fn cast(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let to = Elem::from_code(self.attr_i(node, "to", 1) as i32)
            .ok_or_else(|| self.unsupported("the target element type"))?;
        let v = self.req(node, 0)?;
        let from = self.elem(&v);
        let x = self.ti(node, 0)?;
        if self.dtype(from) == self.dtype(to) {
            return Ok(vec![Val::T(x, to)]);
        }
        let name = self.out_name(node, "");
        let dtype = self.dtype(to);
        let id = chk!(self, self.g.cast(&name, x, dtype))?;
        Ok(vec![Val::T(id, to)])
    }
}

/// Activations ONNX has as ops of their own, built of the graph's element-wise ops (so they
/// have those ops' kernels, gradients and costs; Poplar runs several as one codelet, which
/// costs less than the composition).
impl<'a> Importer<'a> {
    /// `f(x)` as a graph node named after the node's output and `suffix`.
    pub(in crate::onnx::import) fn un(
        &mut self,
        node: &NodeProto,
        suffix: &str,
        x: NodeId,
        f: UnaryFn,
    ) -> R<NodeId> {
        let name = self.out_name(node, suffix);
        chk!(self, self.g.unary(&name, x, f))
    }

    /// `f(a, b)` as a graph node named after the node's output and `suffix`.
    pub(in crate::onnx::import) fn bin(
        &mut self,
        node: &NodeProto,
        suffix: &str,
        a: NodeId,
        b: NodeId,
        f: BinaryFn,
    ) -> R<NodeId> {
        let name = self.out_name(node, suffix);
        chk!(self, self.g.binary(&name, a, b, f))
    }

    /// A scalar constant of `x`'s type.
    pub(in crate::onnx::import) fn scalar_like(
        &mut self,
        node: &NodeProto,
        suffix: &str,
        x: NodeId,
        v: f32,
    ) -> R<NodeId> {
        let dtype = self.g.node(x).dtype();
        let name = self.out_name(node, suffix);
        chk!(self, self.g.constant(&name, &[], dtype, v))
    }

    /// `log(1 + exp(x))` without overflow: `relu(x) + log(1 + exp(-|x|))`.
    fn softplus_of(&mut self, node: &NodeProto, x: NodeId, suffix: &str) -> R<NodeId> {
        let neg = self.un(node, "neg", x, UnaryFn::Neg)?;
        let abs = self.bin(node, "abs", x, neg, BinaryFn::Max)?;
        let nabs = self.un(node, "neg_abs", abs, UnaryFn::Neg)?;
        let e = self.un(node, "exp", nabs, UnaryFn::Exp)?;
        let one = self.scalar_like(node, "one", x, 1.0)?;
        let e1 = self.bin(node, "one_plus", e, one, BinaryFn::Add)?;
        let l = self.un(node, "log", e1, UnaryFn::Log)?;
        let r = self.un(node, "relu", x, UnaryFn::Relu)?;
        self.bin(node, suffix, r, l, BinaryFn::Add)
    }

    /// `alpha * (exp(min(x, 0)) - 1)` for negative `x`, `x` otherwise.
    fn elu_of(&mut self, node: &NodeProto, x: NodeId, alpha: f32, suffix: &str) -> R<NodeId> {
        let r = self.un(node, "relu", x, UnaryFn::Relu)?;
        let m = self.bin(node, "min0", x, r, BinaryFn::Sub)?;
        let e = self.un(node, "exp", m, UnaryFn::Exp)?;
        let one = self.scalar_like(node, "one", x, 1.0)?;
        let em1 = self.bin(node, "expm1", e, one, BinaryFn::Sub)?;
        let neg = self.un(node, "negative", em1, UnaryFn::Scale(alpha))?;
        self.bin(node, suffix, r, neg, BinaryFn::Add)
    }

    /// `clip(alpha * x + beta, 0, 1)`.
    fn hard_sigmoid_of(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        alpha: f32,
        beta: f32,
        suffix: &str,
    ) -> R<NodeId> {
        let ax = self.un(node, "scaled", x, UnaryFn::Scale(alpha))?;
        let b = self.scalar_like(node, "beta", x, beta)?;
        let z = self.bin(node, "shifted", ax, b, BinaryFn::Add)?;
        self.un(node, suffix, z, UnaryFn::Clip { min: 0.0, max: 1.0 })
    }

    fn activation(&mut self, node: &NodeProto, act: Activation) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let e = self.elem(&xv);
        if !e.is_float() {
            return Err(self.unsupported(format!("{e:?} input (float types only)")));
        }
        let x = self.ti(node, 0)?;
        let y = match act {
            Activation::LeakyRelu => {
                let alpha = self.attr_f(node, "alpha", 0.01);
                let ax = self.un(node, "scaled", x, UnaryFn::Scale(alpha))?;
                // x for x >= 0, alpha * x below: the larger of the two when alpha <= 1.
                let f = if alpha <= 1.0 {
                    BinaryFn::Max
                } else {
                    BinaryFn::Min
                };
                self.bin(node, "", x, ax, f)?
            }
            Activation::Elu => {
                let alpha = self.attr_f(node, "alpha", 1.0);
                self.elu_of(node, x, alpha, "")?
            }
            Activation::Selu => {
                let alpha = self.attr_f(node, "alpha", 1.673_263_2);
                let gamma = self.attr_f(node, "gamma", 1.050_701);
                let elu = self.elu_of(node, x, alpha, "elu")?;
                self.un(node, "", elu, UnaryFn::Scale(gamma))?
            }
            Activation::Softplus => self.softplus_of(node, x, "")?,
            Activation::Softsign => {
                let neg = self.un(node, "neg", x, UnaryFn::Neg)?;
                let abs = self.bin(node, "abs", x, neg, BinaryFn::Max)?;
                let one = self.scalar_like(node, "one", x, 1.0)?;
                let d = self.bin(node, "one_plus", abs, one, BinaryFn::Add)?;
                self.bin(node, "", x, d, BinaryFn::Div)?
            }
            Activation::Abs => {
                let neg = self.un(node, "neg", x, UnaryFn::Neg)?;
                self.bin(node, "", x, neg, BinaryFn::Max)?
            }
            Activation::Sign => {
                let zero = self.scalar_like(node, "zero", x, 0.0)?;
                let dtype = self.g.node(x).dtype();
                let gt = self.bin(node, "positive", x, zero, BinaryFn::Greater)?;
                let lt = self.bin(node, "negative", x, zero, BinaryFn::Less)?;
                let n = self.out_name(node, "positive_f");
                let gt = chk!(self, self.g.cast(&n, gt, dtype))?;
                let n = self.out_name(node, "negative_f");
                let lt = chk!(self, self.g.cast(&n, lt, dtype))?;
                self.bin(node, "", gt, lt, BinaryFn::Sub)?
            }
            Activation::Shrink => {
                let bias = self.attr_f(node, "bias", 0.0);
                let lambd = self.attr_f(node, "lambd", 0.5);
                let lo = self.scalar_like(node, "minus_lambd", x, -lambd)?;
                let hi = self.scalar_like(node, "lambd", x, lambd)?;
                let b = self.scalar_like(node, "bias", x, bias)?;
                let zero = self.scalar_like(node, "zero", x, 0.0)?;
                let below = self.bin(node, "below", x, lo, BinaryFn::Less)?;
                let above = self.bin(node, "above", x, hi, BinaryFn::Greater)?;
                let up = self.bin(node, "plus_bias", x, b, BinaryFn::Add)?;
                let down = self.bin(node, "minus_bias", x, b, BinaryFn::Sub)?;
                let n = self.out_name(node, "upper");
                let upper = chk!(self, self.g.select(&n, above, down, zero))?;
                let n = self.out_name(node, "");
                chk!(self, self.g.select(&n, below, up, upper))?
            }
            Activation::HardSigmoid => {
                let alpha = self.attr_f(node, "alpha", 0.2);
                let beta = self.attr_f(node, "beta", 0.5);
                self.hard_sigmoid_of(node, x, alpha, beta, "")?
            }
            Activation::HardSwish => {
                let h = self.hard_sigmoid_of(node, x, 1.0 / 6.0, 0.5, "gate")?;
                self.bin(node, "", x, h, BinaryFn::Mul)?
            }
            Activation::Mish => {
                // x * tanh(softplus(x)).
                let sp = self.softplus_of(node, x, "softplus")?;
                let t = self.un(node, "tanh", sp, UnaryFn::Tanh)?;
                self.bin(node, "", x, t, BinaryFn::Mul)?
            }
        };
        Ok(vec![Val::T(y, e)])
    }

    /// `relu(x) + slope * min(x, 0)`, the slope broadcast (one per channel, say).
    fn prelu(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let e = self.elem(&self.req(node, 0)?);
        let x = self.ti(node, 0)?;
        let slope = self.ti(node, 1)?;
        let r = self.un(node, "relu", x, UnaryFn::Relu)?;
        let m = self.bin(node, "min0", x, r, BinaryFn::Sub)?;
        let sm = self.bin(node, "sloped", slope, m, BinaryFn::Mul)?;
        let y = self.bin(node, "", r, sm, BinaryFn::Add)?;
        Ok(vec![Val::T(y, e)])
    }
}
