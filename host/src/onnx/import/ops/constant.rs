//! Constants and pass-throughs: `Constant`, `ConstantOfShape`, `Identity`, `Dropout` at inference, `Range` (folded).

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Constant, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("Identity", &[1, 13, 14, 16, 19, 21], |im, n| im.identity(n))
        .folds(|_, _, a, _| Ok(vec![Val::C(Rc::new((**a).clone()))])),
    op("Dropout", &[6, 7, 10, 12, 13, 22], |im, n| im.dropout(n)),
    op("Constant", &[1, 9, 11, 12, 13, 19, 21], |im, n| {
        im.constant_node(n)
    }),
    op("ConstantOfShape", &[9, 20, 21], |im, n| {
        im.constant_of_shape_node(n)
    }),
    op("Range", &[11], |im, n| im.range(n)).folds(|im, _, a, ins| im.fold_range(a, ins)),
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
                // A float tensor of several elements is a weight, trained as an
                // initializer is (PopART's rule; PaddlePaddle's exporter writes weights
                // as `Constant` nodes).
                self.tensor_value(t, &name, true)
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
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| self.bad(format!("shape {dims:?} has too many elements")))?;
        // A float fill of a written shape read as a weight: a "light" model's placeholder.
        let output = node.output.first().filter(|o| !o.is_empty());
        let light =
            shape.baked && elem.is_float() && output.is_some_and(|o| self.weight_slots.contains(o));
        if n > FOLD_LIMIT {
            // Too large to hold as values (VGG-19's first fully connected weight is 102.8 M
            // elements): a weight placeholder of its shape, never materialised.
            if !light {
                return Err(self.unsupported(format!("a constant of {n} elements")));
            }
            self.weights.push(Weight {
                name: output.cloned().unwrap_or_default(),
                dims: dims.clone(),
                values: Err(Missing::Light),
                trainable: true,
                init: if dims.len() >= 2 {
                    Init::GlorotUniform
                } else {
                    Init::Zeros
                },
            });
            return Ok(Val::W(self.weights.len() - 1));
        }
        let mut c = Const::new(dims, elem, vec![value; n], shape.baked);
        c.light = light;
        Ok(Val::C(Rc::new(c)))
    }
}

impl<'a> Importer<'a> {
    /// Identity: its output is its input.
    fn identity(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        Ok(vec![self.req(node, 0)?])
    }

    /// Dropout at inference, or in training mode at a ratio of 0: its output is its input.
    fn dropout(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if let Some(Val::C(c)) = self.opt(node, 2)? {
            let keeps_all = match self.opt(node, 1)? {
                Some(Val::C(r)) => r.scalar() == Some(0.0),
                _ => false,
            };
            if c.scalar().unwrap_or(0.0) != 0.0 && !keeps_all {
                return Err(self.unsupported(
                    "training_mode = true with a ratio other than a constant 0 (random masks); export the model for inference",
                ));
            }
        } else if self.opt(node, 2)?.is_some() {
            return Err(self.unsupported("a run-time training_mode"));
        }
        // At inference the mask keeps every element: ones of the input's shape (bool
        // from version 10, the input's type before), made only when a node reads it.
        if let Some(mask) = node.output.get(1).filter(|s| !s.is_empty()) {
            if self.is_read(mask) {
                let x = self.req(node, 0)?;
                let dims = self.dims(&x);
                let bool_mask =
                    versions::version_at("Dropout", self.model.opset).is_none_or(|v| v >= 10);
                let elem = if bool_mask { Elem::Bool } else { self.elem(&x) };
                let name = self.out_name(node, "mask");
                let dtype = self.dtype(elem);
                let id = chk!(self, self.g.constant(&name, &dims, dtype, 1.0))?;
                return Ok(vec![x, Val::T(id, elem)]);
            }
        }
        self.identity(node)
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
