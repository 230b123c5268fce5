//! Constant folding: a node whose inputs are all known at import computes its outputs here,
//! so shape arithmetic (`Shape`, `Gather`, `Concat`, `Unsqueeze`, `Mod`, ...) leaves static
//! shapes.

use super::*;

/// The ops that fold when every input is a constant.
const FOLDS: &[&str] = &[
    "Identity",
    "Cast",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "Clip",
    "ReduceMax",
    "ReduceSum",
    "ReduceMean",
    "ArgMax",
    "ArgMin",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "And",
    "Or",
    "Not",
    "Neg",
    "Sqrt",
    "Where",
    "Unsqueeze",
    "Squeeze",
    "Reshape",
    "Flatten",
    "Concat",
    "Gather",
    "GatherElements",
    "GatherND",
    "Slice",
    "Expand",
    "Range",
    "Transpose",
    "Split",
];

/// A node's outputs when it folds (`None`: it does not).
type Folded = R<Option<Vec<Val>>>;

impl<'a> Importer<'a> {
    /// The node's outputs when every input is a constant and the op folds: by family
    /// (element-wise, reductions, gathers, layout, Split).
    pub(in crate::onnx::import) fn fold(&mut self, node: &NodeProto, op: &str) -> Folded {
        if !FOLDS.contains(&op) {
            return Ok(None);
        }
        let mut ins: Vec<Option<Rc<Const>>> = Vec::new();
        for k in 0..node.input.len() {
            match self.opt(node, k)? {
                None => ins.push(None),
                Some(Val::C(c)) => ins.push(Some(c)),
                Some(_) => return Ok(None),
            }
        }
        let Some(Some(a)) = ins.first().cloned() else {
            return Ok(None);
        };
        // Ops that index an axis of their first input need one.
        if a.dims.is_empty()
            && matches!(
                op,
                "Concat" | "Gather" | "GatherElements" | "GatherND" | "Split"
            )
        {
            return Err(self.bad("input 0 has rank 0: it has no axis to index"));
        }
        let out = match op {
            "Split" => return self.fold_split(node, &a).map(Some),
            "ArgMax" | "ArgMin" | "ReduceMax" | "ReduceSum" | "ReduceMean" => {
                self.fold_reduce(node, op, &a)?
            }
            "Gather" | "GatherElements" | "GatherND" => {
                let idx = self.input_const(&ins, 1)?;
                self.fold_gather(node, op, &a, &idx)?
            }
            "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten" | "Expand" | "Concat" | "Slice"
            | "Range" | "Transpose" => self.fold_layout(node, op, &a, &ins)?,
            _ => match self.fold_elementwise(node, op, &a, &ins)? {
                Some(out) => out,
                None => return Ok(None),
            },
        };
        Ok(Some(vec![Val::C(Rc::new(out))]))
    }

    /// Constant input `k`, which the op requires.
    fn input_const(&self, ins: &[Option<Rc<Const>>], k: usize) -> R<Rc<Const>> {
        ins.get(k)
            .cloned()
            .flatten()
            .ok_or_else(|| self.bad(format!("input {k} is required")))
    }

    /// `out`, unless it is larger than a folded constant may be.
    fn limited(&self, out: Const) -> R<Const> {
        if out.len() > FOLD_LIMIT {
            return Err(self.unsupported("folding a constant that large"));
        }
        Ok(out)
    }

    /// `f` of `a` and `b` element by element, broadcast, in `elem`.
    fn fold_zip(&self, a: &Const, b: &Const, elem: Elem, f: &dyn Fn(f64, f64) -> f64) -> R<Const> {
        let out = consts::zip(a, b, elem, f)
            .ok_or_else(|| self.bad(format!("{:?} and {:?} do not broadcast", a.dims, b.dims)))?;
        self.limited(out)
    }

    /// The element-wise ops (`None` for an op that is not one).
    fn fold_elementwise(
        &self,
        node: &NodeProto,
        op: &str,
        a: &Rc<Const>,
        ins: &[Option<Rc<Const>>],
    ) -> R<Option<Const>> {
        let int = !a.elem.is_float();
        let b01 = |x: bool| f64::from(u8::from(x));
        let bin = |f: &dyn Fn(f64, f64) -> f64, elem: Elem| -> R<Option<Const>> {
            let b = self.input_const(ins, 1)?;
            self.fold_zip(a, &b, elem, f).map(Some)
        };
        let map = |f: &dyn Fn(f64) -> f64| -> R<Option<Const>> {
            let mut out = (**a).clone();
            out.data = out.data.iter().map(|&v| f(v)).collect();
            Ok(Some(out))
        };
        match op {
            "Identity" => Ok(Some((**a).clone())),
            "Cast" => {
                let to = Elem::from_code(self.attr_i(node, "to", 1) as i32)
                    .ok_or_else(|| self.unsupported("the target element type"))?;
                let mut out = (**a).clone();
                out.elem = to;
                out.data = out.data.iter().map(|&v| cast_value(v, to)).collect();
                Ok(Some(out))
            }
            "Sum" | "Max" | "Min" | "Mean" => self.fold_variadic(op, a, ins).map(Some),
            "Clip" => {
                let (lo, hi) = self.clip_bounds(node)?;
                // (Infinite bounds leave a NaN as it is.)
                map(&|v| {
                    let v = if lo > f64::NEG_INFINITY { v.max(lo) } else { v };
                    if hi < f64::INFINITY {
                        v.min(hi)
                    } else {
                        v
                    }
                })
            }
            "Add" => bin(&|x, y| x + y, a.elem),
            "Sub" => bin(&|x, y| x - y, a.elem),
            "Mul" => bin(&|x, y| x * y, a.elem),
            "Div" => bin(
                &move |x, y| if int { (x / y).trunc() } else { x / y },
                a.elem,
            ),
            "Pow" => bin(&f64::powf, a.elem),
            "Mod" => self.fold_mod(node, a, ins).map(Some),
            "Equal" => bin(&|x, y| b01(x == y), Elem::Bool),
            "Less" => bin(&|x, y| b01(x < y), Elem::Bool),
            "LessOrEqual" => bin(&|x, y| b01(x <= y), Elem::Bool),
            "Greater" => bin(&|x, y| b01(x > y), Elem::Bool),
            "GreaterOrEqual" => bin(&|x, y| b01(x >= y), Elem::Bool),
            "And" => bin(&|x, y| b01(x != 0.0 && y != 0.0), Elem::Bool),
            "Or" => bin(&|x, y| b01(x != 0.0 || y != 0.0), Elem::Bool),
            "Not" => map(&|v| b01(v == 0.0)),
            "Neg" => map(&|v| -v),
            "Sqrt" => map(&f64::sqrt),
            "Where" => self.fold_where(a, ins).map(Some),
            _ => Ok(None),
        }
    }

    /// `Mod`: with `fmod = 1`, C's `fmod` (the remainder takes the dividend's sign); with
    /// `fmod = 0` (integers only, as ONNX requires), the remainder takes the divisor's sign,
    /// as Python's `%` does. An integer division by zero is an error (ONNX leaves it
    /// undefined).
    fn fold_mod(&self, node: &NodeProto, a: &Rc<Const>, ins: &[Option<Rc<Const>>]) -> R<Const> {
        let fmod = self.attr_i(node, "fmod", 0) != 0;
        let int = !a.elem.is_float();
        if !int && !fmod {
            return Err(self
                .bad("fmod = 0 with floating-point inputs (ONNX's Mod takes fmod = 1 for them)"));
        }
        let b = self.input_const(ins, 1)?;
        if int && b.data.contains(&0.0) {
            return Err(self.bad("an integer Mod by zero (ONNX leaves it undefined)"));
        }
        self.fold_zip(a, &b, a.elem, &move |x, y| {
            let r = x % y;
            if fmod || r == 0.0 || (r < 0.0) == (y < 0.0) {
                r
            } else {
                r + y
            }
        })
    }

    /// Sum, Max, Min and Mean of every input, broadcast.
    fn fold_variadic(&self, op: &str, a: &Rc<Const>, ins: &[Option<Rc<Const>>]) -> R<Const> {
        let f: fn(f64, f64) -> f64 = match op {
            "Max" => f64::max,
            "Min" => f64::min,
            _ => |x, y| x + y,
        };
        let mut out = (**a).clone();
        for k in 1..ins.len() {
            let b = self.input_const(ins, k)?;
            out = self.fold_zip(&out, &b, a.elem, &f)?;
        }
        if op == "Mean" {
            let n = ins.len() as f64;
            out.data
                .iter_mut()
                .for_each(|v| *v = cast_value(*v / n, a.elem));
        }
        Ok(out)
    }

    /// Where: `x` where the condition `c` holds, else `y`, broadcast.
    fn fold_where(&self, c: &Rc<Const>, ins: &[Option<Rc<Const>>]) -> R<Const> {
        let (x, y) = (self.input_const(ins, 1)?, self.input_const(ins, 2)?);
        let xy = consts::broadcast(&x.dims, &y.dims)
            .and_then(|d| consts::broadcast(&c.dims, &d))
            .ok_or_else(|| self.bad("inputs do not broadcast"))?;
        let (ce, xe, ye) = (
            consts::expand(c, &xy),
            consts::expand(&x, &xy),
            consts::expand(&y, &xy),
        );
        let (Some(ce), Some(xe), Some(ye)) = (ce, xe, ye) else {
            return Err(self.bad("inputs do not broadcast"));
        };
        let data = (0..ce.len())
            .map(|i| {
                if ce.data[i] != 0.0 {
                    xe.data[i]
                } else {
                    ye.data[i]
                }
            })
            .collect();
        Ok(Const::new(xy, x.elem, data, c.baked || x.baked || y.baked))
    }

    /// ArgMax, ArgMin and the Reduce ops that fold.
    fn fold_reduce(&self, node: &NodeProto, op: &str, a: &Rc<Const>) -> R<Const> {
        let r = a.dims.len();
        let keep = self.attr_i(node, "keepdims", 1) != 0;
        if let "ArgMax" | "ArgMin" = op {
            if r == 0 {
                return Err(self.bad("an input of rank 0"));
            }
            let axis = self.axis(self.attr_i(node, "axis", 0), r)?;
            let last = self.attr_i(node, "select_last_index", 0) != 0;
            return Ok(consts::arg_extreme(a, axis, keep, op == "ArgMax", last));
        }
        let since = if op == "ReduceSum" { 13 } else { 18 };
        let axes = self.reduce_axes(node, since)?.unwrap_or_default();
        if axes.is_empty() && self.attr_i(node, "noop_with_empty_axes", 0) != 0 {
            return Ok((**a).clone());
        }
        let mut reduced = vec![axes.is_empty(); r];
        for &ax in &axes {
            reduced[self.axis(ax, r)?] = true;
        }
        Ok(consts::reduce(a, &reduced, keep, op))
    }

    /// Gather, GatherElements and GatherND of `a` at the indices `idx`.
    fn fold_gather(&self, node: &NodeProto, op: &str, a: &Rc<Const>, idx: &Const) -> R<Const> {
        match op {
            "Gather" => {
                let axis = self.axis(self.attr_i(node, "axis", 0), a.dims.len())?;
                let n = a.dims[axis] as i64;
                let outer: usize = a.dims[..axis].iter().product();
                let inner: usize = a.dims[axis + 1..].iter().product();
                let mut data = Vec::new();
                for o in 0..outer {
                    for &i in &idx.data {
                        let mut i = i as i64;
                        if i < 0 {
                            i += n;
                        }
                        if i < 0 || i >= n {
                            return Err(
                                self.bad(format!("index {i} is out of range (axis of {n})"))
                            );
                        }
                        let base = (o * n as usize + i as usize) * inner;
                        data.extend_from_slice(&a.data[base..base + inner]);
                    }
                }
                let mut dims = a.dims[..axis].to_vec();
                dims.extend_from_slice(&idx.dims);
                dims.extend_from_slice(&a.dims[axis + 1..]);
                Ok(Const::new(dims, a.elem, data, a.baked))
            }
            "GatherElements" => {
                let axis = self.axis(self.attr_i(node, "axis", 0), a.dims.len())?;
                let (st, ist) = (consts::strides(&a.dims), consts::strides(&idx.dims));
                let mut data = Vec::with_capacity(idx.len());
                for (p, &v) in idx.data.iter().enumerate() {
                    let mut off = 0;
                    for k in 0..a.dims.len() {
                        let pos = (p / ist[k]) % idx.dims[k].max(1);
                        let pos = if k == axis {
                            let v = v as i64;
                            (if v < 0 { v + a.dims[k] as i64 } else { v }) as usize
                        } else {
                            pos
                        };
                        off += pos * st[k];
                    }
                    data.push(
                        *a.data
                            .get(off)
                            .ok_or_else(|| self.bad("index out of range"))?,
                    );
                }
                Ok(Const::new(idx.dims.clone(), a.elem, data, a.baked))
            }
            _ => self.fold_gather_nd(node, a, idx),
        }
    }

    /// GatherND of `a` at the index tuples `idx`.
    fn fold_gather_nd(&self, node: &NodeProto, a: &Const, idx: &Const) -> R<Const> {
        if self.attr_i(node, "batch_dims", 0) != 0 {
            return Err(self.unsupported("batch_dims != 0"));
        }
        let k = *idx
            .dims
            .last()
            .ok_or_else(|| self.bad("indices of rank 0"))?;
        if k > a.dims.len() {
            return Err(self.bad(format!(
                "index tuples of {k} for a rank-{} input",
                a.dims.len()
            )));
        }
        let st = consts::strides(&a.dims);
        let inner: usize = a.dims[k..].iter().product();
        let mut data = Vec::new();
        for t in idx.data.chunks(k.max(1)) {
            let off: usize = t.iter().enumerate().map(|(j, &v)| v as usize * st[j]).sum();
            data.extend_from_slice(
                a.data
                    .get(off..off + inner)
                    .ok_or_else(|| self.bad("index out of range"))?,
            );
        }
        let mut dims = idx.dims[..idx.dims.len() - 1].to_vec();
        dims.extend_from_slice(&a.dims[k..]);
        Ok(Const::new(dims, a.elem, data, a.baked))
    }

    /// The layout ops: reshapes, Expand, Concat, Slice, Range and Transpose.
    fn fold_layout(
        &self,
        node: &NodeProto,
        op: &str,
        a: &Rc<Const>,
        ins: &[Option<Rc<Const>>],
    ) -> R<Const> {
        match op {
            "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten" => {
                let dims = self.reshaped_dims(node, &Val::C(a.clone()))?;
                let mut out = (**a).clone();
                out.dims = dims;
                Ok(out)
            }
            "Expand" => {
                let dims = self.expand_dims(node, &Val::C(a.clone()))?;
                let out = consts::expand(a, &dims).ok_or_else(|| self.bad("does not broadcast"))?;
                self.limited(out)
            }
            "Concat" => {
                let r = a.dims.len();
                let axis = self.axis(self.attr_i(node, "axis", 0), r)?;
                let parts: Vec<Rc<Const>> = ins.iter().flatten().cloned().collect();
                let mut dims = a.dims.clone();
                dims[axis] = parts
                    .iter()
                    .map(|p| p.dims.get(axis).copied().unwrap_or(0))
                    .sum();
                let outer: usize = a.dims[..axis].iter().product();
                let mut data = Vec::new();
                for o in 0..outer {
                    for p in &parts {
                        if p.dims.len() != r {
                            return Err(self.bad("inputs differ in rank"));
                        }
                        let inner: usize = p.dims[axis..].iter().product();
                        data.extend_from_slice(&p.data[o * inner..(o + 1) * inner]);
                    }
                }
                let baked = parts.iter().any(|p| p.baked);
                Ok(Const::new(dims, a.elem, data, baked))
            }
            "Slice" => self.fold_slice(node, a),
            "Range" => {
                let (s, l, d) = (
                    a.scalar(),
                    ins.get(1).cloned().flatten().and_then(|c| c.scalar()),
                    ins.get(2).cloned().flatten().and_then(|c| c.scalar()),
                );
                let (Some(s), Some(l), Some(d)) = (s, l, d) else {
                    return Err(self.bad("start, limit and delta must be scalars"));
                };
                if d == 0.0 {
                    return Err(self.bad("delta is 0"));
                }
                let n = ((l - s) / d).ceil().max(0.0) as usize;
                if n > FOLD_LIMIT {
                    return Err(self.unsupported("folding a constant that large"));
                }
                let data = (0..n).map(|i| s + i as f64 * d).collect();
                Ok(Const::new(vec![n], a.elem, data, a.baked))
            }
            _ => {
                let perm = self.perm(node, a.dims.len())?;
                let st = consts::strides(&a.dims);
                let dims: Vec<usize> = perm.iter().map(|&p| a.dims[p]).collect();
                let ost = consts::strides(&dims);
                let mut data = vec![0.0; a.len()];
                for (o, slot) in data.iter_mut().enumerate() {
                    let mut off = 0;
                    for (k, &p) in perm.iter().enumerate() {
                        off += ((o / ost[k]) % dims[k].max(1)) * st[p];
                    }
                    *slot = a.data[off];
                }
                Ok(Const::new(dims, a.elem, data, a.baked))
            }
        }
    }

    /// Slice: each sliced axis's positions picked in turn.
    fn fold_slice(&self, node: &NodeProto, a: &Const) -> R<Const> {
        let ranges = self.slice_ranges(node, &a.dims)?;
        let mut cur = a.clone();
        for (axis, s, e, step) in ranges {
            let picks: Vec<usize> = if step > 0 {
                (s..e).step_by(step as usize).map(|v| v as usize).collect()
            } else {
                let mut v = Vec::new();
                let mut i = s;
                while i > e {
                    v.push(i as usize);
                    i += step;
                }
                v
            };
            let outer: usize = cur.dims[..axis].iter().product();
            let n = cur.dims[axis];
            let inner: usize = cur.dims[axis + 1..].iter().product();
            let mut data = Vec::new();
            for o in 0..outer {
                for &p in &picks {
                    let base = (o * n + p) * inner;
                    data.extend_from_slice(&cur.data[base..base + inner]);
                }
            }
            cur.dims[axis] = picks.len();
            cur.data = data;
        }
        Ok(cur)
    }

    /// Split's outputs.
    fn fold_split(&self, node: &NodeProto, a: &Const) -> R<Vec<Val>> {
        let axis = self.axis(self.attr_i(node, "axis", 0), a.dims.len())?;
        let sizes = self.split_sizes(node, a.dims[axis])?;
        let outer: usize = a.dims[..axis].iter().product();
        let inner: usize = a.dims[axis + 1..].iter().product();
        let n = a.dims[axis];
        let mut outs = Vec::new();
        let mut start = 0;
        for len in sizes {
            let mut data = Vec::new();
            for o in 0..outer {
                let base = (o * n + start) * inner;
                data.extend_from_slice(&a.data[base..base + len * inner]);
            }
            let mut dims = a.dims.clone();
            dims[axis] = len;
            outs.push(Val::C(Rc::new(Const::new(dims, a.elem, data, a.baked))));
            start += len;
        }
        Ok(outs)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use prost::Message;

    use crate::onnx::proto::{
        tensor_shape_proto::{dimension::Value as Dim, Dimension},
        type_proto, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
        TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    use crate::onnx::OnnxModel;
    use crate::session::onnx::{run_onnx, NamedTensor};

    fn float(name: &str, n: i64) -> ValueInfoProto {
        ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(1),
                    shape: Some(TensorShapeProto {
                        dim: vec![Dimension {
                            value: Some(Dim::DimValue(n)),
                            ..Default::default()
                        }],
                    }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(op: &str, inputs: &[&str], output: &str, attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            name: Some(output.into()),
            op_type: Some(op.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            attribute: attrs,
            ..Default::default()
        }
    }

    fn int_attr(name: &str, v: i64) -> AttributeProto {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(2),
            i: Some(v),
            ..Default::default()
        }
    }

    /// `y = x + float(a mod b)`, with `a` and `b` constants of ONNX type `elem` (7: int64, 1:
    /// float) unless `computed` makes `a` the graph's second input.
    fn mod_model(elem: i32, a: &[f64], b: &[f64], fmod: i64, computed: bool) -> OnnxModel {
        let n = a.len() as i64;
        let constant = |name: &str, v: &[f64]| TensorProto {
            name: Some(name.into()),
            dims: vec![n],
            data_type: Some(elem),
            int64_data: if elem == 7 {
                v.iter().map(|&x| x as i64).collect()
            } else {
                Vec::new()
            },
            float_data: if elem == 1 {
                v.iter().map(|&x| x as f32).collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        };
        let mut input = vec![float("x", n)];
        let mut initializer = vec![constant("b", b)];
        if computed {
            input.push(float("a", n));
        } else {
            initializer.push(constant("a", a));
        }
        let m = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(13),
            }],
            graph: Some(GraphProto {
                name: Some("mod".into()),
                node: vec![
                    node("Mod", &["a", "b"], "m", vec![int_attr("fmod", fmod)]),
                    node("Cast", &["m"], "mf", vec![int_attr("to", 1)]),
                    node("Add", &["x", "mf"], "y", Vec::new()),
                ],
                input,
                output: vec![float("y", n)],
                initializer,
                ..Default::default()
            }),
            ..Default::default()
        };
        OnnxModel::from_bytes(&m.encode_to_vec(), Path::new("mod.onnx")).expect("a model")
    }

    /// The model's output for `x` = zeros (and `a`, when it is an input, zeros).
    fn run(model: &OnnxModel, n: usize) -> Result<Vec<f32>, String> {
        let zeros = |name: &str| NamedTensor {
            name: name.into(),
            dims: vec![n],
            data: vec![0.0; n],
        };
        let inputs: Vec<NamedTensor> = model
            .graph()
            .input
            .iter()
            .filter_map(|i| i.name.as_deref().map(zeros))
            .collect();
        run_onnx(model, &inputs)
            .map(|out| out[0].data.clone())
            .map_err(|e| {
                let mut s = e.to_string();
                let mut cause = std::error::Error::source(&e);
                while let Some(c) = cause {
                    s.push_str(&format!(": {c}"));
                    cause = c.source();
                }
                s
            })
    }

    const A: [f64; 6] = [-4.0, 7.0, 5.0, 4.0, -7.0, 8.0];
    const B: [f64; 6] = [2.0, -3.0, 8.0, -2.0, 3.0, 5.0];

    /// numpy's `np.mod` (the divisor's sign) and `np.fmod` (the dividend's) of `A` and `B`,
    /// and `np.fmod` of floats (one-element constants: a float initializer of more is a
    /// weight).
    #[test]
    fn mod_folds_with_the_sign_onnx_gives() {
        let python = run(&mod_model(7, &A, &B, 0, false), 6).unwrap();
        assert_eq!(python, [0.0, -2.0, 5.0, 0.0, 2.0, 3.0]);
        let c = run(&mod_model(7, &A, &B, 1, false), 6).unwrap();
        assert_eq!(c, [0.0, 1.0, 5.0, 0.0, -1.0, 3.0]);
        for (a, b, want) in [(-7.25, 3.0, -1.25), (7.25, -3.0, 1.25), (4.5, 2.0, 0.5)] {
            let f = run(&mod_model(1, &[a], &[b], 1, false), 1).unwrap();
            assert_eq!(f, [want], "fmod({a}, {b})");
        }
    }

    #[test]
    fn mod_names_what_it_cannot_do() {
        let e = run(&mod_model(1, &[-7.25], &[3.0], 0, false), 1).unwrap_err();
        assert!(e.contains("fmod = 0 with floating-point inputs"), "{e}");
        let zero = [2.0, 0.0, 8.0, -2.0, 3.0, 5.0];
        let e = run(&mod_model(7, &A, &zero, 0, false), 6).unwrap_err();
        assert!(e.contains("integer Mod by zero"), "{e}");
        // A float input of more than 16 elements is computed at run time, not read as a
        // constant.
        let e = run(&mod_model(7, &[1.0; 20], &[3.0; 20], 0, true), 20).unwrap_err();
        assert!(
            e.contains("Mod (opset 13) is not supported (inputs computed at run time)"),
            "{e}"
        );
    }
}
