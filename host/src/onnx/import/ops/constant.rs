//! Constants and pass-throughs: `Constant`, `ConstantOfShape`, `Identity`, `Dropout` at inference, `Range` (folded).

use super::super::*;
use super::{Converter, Family};

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    Converter {
        op: "Identity",
        family: Family::Constant,
        versions: &[1, 13, 14, 16, 19, 21],
        convert: |im, n| im.identity(n),
    },
    Converter {
        op: "Dropout",
        family: Family::Constant,
        versions: &[7, 10, 12, 13],
        convert: |im, n| im.identity(n),
    },
    Converter {
        op: "Constant",
        family: Family::Constant,
        versions: &[1, 9, 11, 12, 13, 19, 21],
        convert: |im, n| im.constant_node(n),
    },
    Converter {
        op: "ConstantOfShape",
        family: Family::Constant,
        versions: &[9, 20, 21],
        convert: |im, n| im.constant_of_shape_node(n),
    },
    Converter {
        op: "Range",
        family: Family::Constant,
        versions: &[11],
        convert: |im, n| im.range(n),
    },
];

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn constant(&mut self, node: &NodeProto) -> R<Val> {
        let a = node
            .attribute
            .first()
            .ok_or_else(|| self.bad("no value attribute"))?;
        let name = node.output.first().cloned().unwrap_or_default();
        let kind = a.r#type.and_then(|t| AttributeType::try_from(t).ok());
        match (a.name.as_deref().unwrap_or(""), kind) {
            ("value", _) => {
                let t =
                    a.t.as_ref()
                        .ok_or_else(|| self.bad("value holds no tensor"))?;
                self.tensor_value(t, &name, false)
            }
            ("value_float", _) => Ok(Val::C(Rc::new(Const::new(
                vec![],
                Elem::F32,
                vec![f64::from(a.f.unwrap_or(0.0))],
                true,
            )))),
            ("value_floats", _) => Ok(Val::C(Rc::new(Const::new(
                vec![a.floats.len()],
                Elem::F32,
                a.floats.iter().map(|&v| f64::from(v)).collect(),
                true,
            )))),
            ("value_int", _) => Ok(Val::C(Rc::new(Const::new(
                vec![],
                Elem::I64,
                vec![a.i.unwrap_or(0) as f64],
                true,
            )))),
            ("value_ints", _) => Ok(Val::C(Rc::new(Const::ints(&a.ints, true)))),
            (other, _) => Err(self.unsupported(format!("a `{other}` value"))),
        }
    }

    pub(in crate::onnx::import) fn constant_of_shape(&mut self, node: &NodeProto) -> R<Val> {
        let shape = self
            .konst(node, 0, "shape")?
            .ok_or_else(|| self.bad("the shape input is required"))?;
        let dims: Vec<usize> = shape
            .as_ints()
            .iter()
            .map(|&x| usize::try_from(x).map_err(|_| self.bad(format!("shape value {x}"))))
            .collect::<R<_>>()?;
        let (elem, value) = match attr(node, "value").and_then(|a| a.t.as_ref()) {
            Some(t) => {
                let code = t.data_type.unwrap_or(1);
                let elem = Elem::from_code(code)
                    .ok_or_else(|| self.unsupported(consts::code_name(code)))?;
                let v = decode(t, elem, 1)
                    .ok()
                    .and_then(|v| v.first().copied())
                    .ok_or_else(|| self.bad("value must hold one element"))?;
                (elem, v)
            }
            None => (Elem::F32, 0.0),
        };
        let n: usize = dims.iter().product();
        if n > FOLD_LIMIT {
            return Err(self.unsupported(format!("a constant of {n} elements")));
        }
        let mut c = Const::new(dims, elem, vec![value; n], shape.baked);
        // A float fill of a written shape read as a weight: a "light" model's placeholder.
        c.light = shape.baked
            && elem.is_float()
            && node
                .output
                .first()
                .is_some_and(|o| self.weight_slots.contains(o));
        Ok(Val::C(Rc::new(c)))
    }
}

impl<'a> Importer<'a> {
    /// Identity, and Dropout at inference (its output is its input).
    fn identity(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if self.op == "Dropout" {
            if let Some(Val::C(c)) = self.opt(node, 2)? {
                if c.scalar().unwrap_or(0.0) != 0.0 {
                    return Err(self.unsupported("training_mode = true"));
                }
            } else if self.opt(node, 2)?.is_some() {
                return Err(self.unsupported("a run-time training_mode"));
            }
            if node.output.get(1).is_some_and(|s| !s.is_empty()) {
                return Err(self.unsupported("the mask output"));
            }
        }
        Ok(vec![self.req(node, 0)?])
    }

    fn constant_node(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        self.constant(node).map(|v| vec![v])
    }

    fn constant_of_shape_node(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        self.constant_of_shape(node).map(|v| vec![v])
    }

    /// A `Range` whose inputs are not all constants (constants fold).
    fn range(&mut self, _node: &NodeProto) -> R<Vec<Val>> {
        Err(self.unsupported("inputs computed at run time"))
    }
}
