//! Element-wise ops: arithmetic with broadcasting, comparisons and logic, activations, casts.

use super::super::*;
use super::{Converter, Family};

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    Converter {
        op: "Add",
        family: Family::Elementwise,
        versions: &[7, 13, 14],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Sub",
        family: Family::Elementwise,
        versions: &[7, 13, 14],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Mul",
        family: Family::Elementwise,
        versions: &[7, 13, 14],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Div",
        family: Family::Elementwise,
        versions: &[7, 13, 14],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Pow",
        family: Family::Elementwise,
        versions: &[7, 12, 13, 15],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Max",
        family: Family::Elementwise,
        versions: &[6, 8, 12, 13],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Min",
        family: Family::Elementwise,
        versions: &[6, 8, 12, 13],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Sum",
        family: Family::Elementwise,
        versions: &[6, 8, 13],
        convert: |im, n| im.arith(n),
    },
    Converter {
        op: "Equal",
        family: Family::Elementwise,
        versions: &[7, 11, 13, 19],
        convert: |im, n| im.compare(n),
    },
    Converter {
        op: "Less",
        family: Family::Elementwise,
        versions: &[7, 9, 13],
        convert: |im, n| im.compare(n),
    },
    Converter {
        op: "LessOrEqual",
        family: Family::Elementwise,
        versions: &[12, 16],
        convert: |im, n| im.compare(n),
    },
    Converter {
        op: "Greater",
        family: Family::Elementwise,
        versions: &[7, 9, 13],
        convert: |im, n| im.compare(n),
    },
    Converter {
        op: "GreaterOrEqual",
        family: Family::Elementwise,
        versions: &[12, 16],
        convert: |im, n| im.compare(n),
    },
    Converter {
        op: "And",
        family: Family::Elementwise,
        versions: &[7],
        convert: |im, n| im.compare(n),
    },
    Converter {
        op: "Or",
        family: Family::Elementwise,
        versions: &[7],
        convert: |im, n| im.compare(n),
    },
    Converter {
        op: "Not",
        family: Family::Elementwise,
        versions: &[1],
        convert: |im, n| im.not(n),
    },
    Converter {
        op: "Where",
        family: Family::Elementwise,
        versions: &[9, 16],
        convert: |im, n| im.where_(n),
    },
    Converter {
        op: "Relu",
        family: Family::Elementwise,
        versions: &[6, 13, 14],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Sigmoid",
        family: Family::Elementwise,
        versions: &[6, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Tanh",
        family: Family::Elementwise,
        versions: &[6, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Exp",
        family: Family::Elementwise,
        versions: &[6, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Log",
        family: Family::Elementwise,
        versions: &[6, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Sqrt",
        family: Family::Elementwise,
        versions: &[6, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Erf",
        family: Family::Elementwise,
        versions: &[9, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Neg",
        family: Family::Elementwise,
        versions: &[6, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Gelu",
        family: Family::Elementwise,
        versions: &[20],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Clip",
        family: Family::Elementwise,
        versions: &[6, 11, 12, 13],
        convert: |im, n| im.unary(n),
    },
    Converter {
        op: "Reciprocal",
        family: Family::Elementwise,
        versions: &[6, 13],
        convert: |im, n| im.reciprocal(n),
    },
    Converter {
        op: "Cast",
        family: Family::Elementwise,
        versions: &[6, 9, 13, 19, 21],
        convert: |im, n| im.cast(n),
    },
];

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn arith(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let op = self.op.clone();
        let f = match op.as_str() {
            "Add" | "Sum" => BinaryFn::Add,
            "Sub" => BinaryFn::Sub,
            "Mul" => BinaryFn::Mul,
            "Div" => BinaryFn::Div,
            "Pow" => BinaryFn::Pow,
            "Max" => BinaryFn::Max,
            _ => BinaryFn::Min,
        };
        let n = node.input.len();
        if n == 1 {
            return Ok(vec![self.req(node, 0)?]);
        }
        if n > 2 && !matches!(op.as_str(), "Sum" | "Max" | "Min") {
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
    fn compare(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let f = match self.op.as_str() {
            "Equal" => BinaryFn::Equal,
            "Less" => BinaryFn::Less,
            "LessOrEqual" => BinaryFn::LessOrEqual,
            "Greater" => BinaryFn::Greater,
            "GreaterOrEqual" => BinaryFn::GreaterOrEqual,
            "And" => BinaryFn::And,
            _ => BinaryFn::Or,
        };
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

    fn where_(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let c = self.ti(node, 0)?;
        let (a, b) = self.pair_at(node, 1, 2)?;
        let e = self.elem(&self.req(node, 1)?);
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.select(&name, c, a, b))?;
        Ok(vec![Val::T(id, e)])
    }

    fn unary(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let f = match self.op.as_str() {
            "Relu" => UnaryFn::Relu,
            "Sigmoid" => UnaryFn::Sigmoid,
            "Tanh" => UnaryFn::Tanh,
            "Exp" => UnaryFn::Exp,
            "Log" => UnaryFn::Log,
            "Sqrt" => UnaryFn::Sqrt,
            "Erf" => UnaryFn::Erf,
            "Neg" => UnaryFn::Neg,
            "Gelu" => match self.attr_s(node, "approximate").as_deref() {
                None | Some("none") => UnaryFn::Gelu(GeluForm::Erf),
                Some("tanh") => UnaryFn::Gelu(GeluForm::Tanh),
                Some(other) => return Err(self.unsupported(format!("approximate = {other}"))),
            },
            _ => {
                let (min, max) = if self.model.opset >= 11 {
                    let lo = self.konst(node, 1, "min")?;
                    let hi = self.konst(node, 2, "max")?;
                    (
                        lo.and_then(|c| c.scalar()).unwrap_or(f64::NEG_INFINITY),
                        hi.and_then(|c| c.scalar()).unwrap_or(f64::INFINITY),
                    )
                } else {
                    (
                        f64::from(self.attr_f(node, "min", f32::NEG_INFINITY)),
                        f64::from(self.attr_f(node, "max", f32::INFINITY)),
                    )
                };
                UnaryFn::Clip {
                    min: min as f32,
                    max: max as f32,
                }
            }
        };
        self.one_input(node, |g, name, x| g.unary(name, x, f))
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
