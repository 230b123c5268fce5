//! Constant folding: a node whose inputs are all known at import computes its outputs here,
//! so shape arithmetic (`Shape`, `Gather`, `Concat`, `Unsqueeze`, `Mod`, ...) leaves static
//! shapes. Which ops fold, and how, the registry says ([`ops::Converter`]'s fold); this module
//! holds the computations.

use super::ops::Reshaping;
use super::*;

/// A node's outputs when it folds (`None`: it does not).
type Folded = R<Option<Vec<Val>>>;

/// The one output `c`.
fn one(c: Const) -> Vec<Val> {
    vec![Val::C(Rc::new(c))]
}

/// 1 for true, 0 for false.
pub(in crate::onnx::import) fn b01(x: bool) -> f64 {
    f64::from(u8::from(x))
}

/// `f` of each element of `a`.
pub(in crate::onnx::import) fn mapped(a: &Const, f: impl Fn(f64) -> f64) -> Vec<Val> {
    let mut out = a.clone();
    out.data = out.data.iter().map(|&v| f(v)).collect();
    one(out)
}

/// How the variadic ops combine their inputs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::onnx::import) enum Variadic {
    /// The sum.
    Sum,
    /// The greatest.
    Max,
    /// The least.
    Min,
    /// The mean.
    Mean,
}

impl<'a> Importer<'a> {
    /// The node's outputs when every input is a constant and the registry's entry of the op
    /// folds it.
    pub(in crate::onnx::import) fn fold(&mut self, node: &NodeProto, op: &str) -> Folded {
        let Some(fold) = ops::entry(op).and_then(|e| e.fold) else {
            return Ok(None);
        };
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
        fold(self, node, &a, &ins).map(Some)
    }

    /// An error unless `a`, which an op indexes along an axis, has one.
    fn has_axis(&self, a: &Const) -> R<()> {
        if a.dims.is_empty() {
            return Err(self.bad("input 0 has rank 0: it has no axis to index"));
        }
        Ok(())
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

    /// The element-wise binary op `f` of inputs 0 and 1, broadcast; comparisons and logic
    /// give booleans, an integer division rounds toward zero.
    pub(in crate::onnx::import) fn fold_binary(
        &self,
        a: &Rc<Const>,
        ins: &[Option<Rc<Const>>],
        f: BinaryFn,
    ) -> R<Vec<Val>> {
        let int = !a.elem.is_float();
        let (g, elem): (&dyn Fn(f64, f64) -> f64, Elem) = match f {
            BinaryFn::Add => (&|x, y| x + y, a.elem),
            BinaryFn::Sub => (&|x, y| x - y, a.elem),
            BinaryFn::Mul => (&|x, y| x * y, a.elem),
            BinaryFn::Div => (
                &move |x, y| if int { (x / y).trunc() } else { x / y },
                a.elem,
            ),
            BinaryFn::Pow => (&f64::powf, a.elem),
            BinaryFn::Equal => (&|x, y| b01(x == y), Elem::Bool),
            BinaryFn::Less => (&|x, y| b01(x < y), Elem::Bool),
            BinaryFn::LessOrEqual => (&|x, y| b01(x <= y), Elem::Bool),
            BinaryFn::Greater => (&|x, y| b01(x > y), Elem::Bool),
            BinaryFn::GreaterOrEqual => (&|x, y| b01(x >= y), Elem::Bool),
            BinaryFn::And => (&|x, y| b01(x != 0.0 && y != 0.0), Elem::Bool),
            BinaryFn::Or => (&|x, y| b01(x != 0.0 || y != 0.0), Elem::Bool),
            other => return Err(self.unsupported(format!("folding {other:?}"))),
        };
        let b = self.input_const(ins, 1)?;
        self.fold_zip(a, &b, elem, g).map(one)
    }

    /// Cast to the `to` attribute's element type.
    pub(in crate::onnx::import) fn fold_cast(&self, node: &NodeProto, a: &Const) -> R<Vec<Val>> {
        let to = Elem::from_code(self.attr_i(node, "to", 1) as i32)
            .ok_or_else(|| self.unsupported("the target element type"))?;
        let mut out = a.clone();
        out.elem = to;
        out.data = out.data.iter().map(|&v| cast_value(v, to)).collect();
        Ok(one(out))
    }

    /// Clip to its bounds (infinite bounds leave a NaN as it is).
    pub(in crate::onnx::import) fn fold_clip(&self, node: &NodeProto, a: &Const) -> R<Vec<Val>> {
        let (lo, hi) = self.clip_bounds(node)?;
        Ok(mapped(a, |v| {
            let v = if lo > f64::NEG_INFINITY { v.max(lo) } else { v };
            if hi < f64::INFINITY {
                v.min(hi)
            } else {
                v
            }
        }))
    }

    /// `Mod`: with `fmod = 1`, C's `fmod` (the remainder takes the dividend's sign); with
    /// `fmod = 0` (integers only, as ONNX requires), the remainder takes the divisor's sign,
    /// as Python's `%` does. An integer division by zero is an error (ONNX leaves it
    /// undefined).
    pub(in crate::onnx::import) fn fold_mod(
        &self,
        node: &NodeProto,
        a: &Rc<Const>,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
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
        .map(one)
    }

    /// Sum, Max, Min and Mean of every input, broadcast.
    pub(in crate::onnx::import) fn fold_variadic(
        &self,
        a: &Rc<Const>,
        ins: &[Option<Rc<Const>>],
        v: Variadic,
    ) -> R<Vec<Val>> {
        let f: fn(f64, f64) -> f64 = match v {
            Variadic::Max => f64::max,
            Variadic::Min => f64::min,
            Variadic::Sum | Variadic::Mean => |x, y| x + y,
        };
        let mut out = (**a).clone();
        for k in 1..ins.len() {
            let b = self.input_const(ins, k)?;
            out = self.fold_zip(&out, &b, a.elem, &f)?;
        }
        if v == Variadic::Mean {
            let n = ins.len() as f64;
            out.data
                .iter_mut()
                .for_each(|v| *v = cast_value(*v / n, a.elem));
        }
        Ok(one(out))
    }

    /// Where: `x` where the condition `c` holds, else `y`, broadcast.
    pub(in crate::onnx::import) fn fold_where(
        &self,
        c: &Rc<Const>,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
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
        Ok(one(Const::new(
            xy,
            x.elem,
            data,
            c.baked || x.baked || y.baked,
        )))
    }

    /// ArgMax (`max`) or ArgMin.
    pub(in crate::onnx::import) fn fold_arg_extreme(
        &self,
        node: &NodeProto,
        a: &Const,
        max: bool,
    ) -> R<Vec<Val>> {
        let r = a.dims.len();
        let keep = self.attr_i(node, "keepdims", 1) != 0;
        if r == 0 {
            return Err(self.bad("an input of rank 0"));
        }
        let axis = self.axis(self.attr_i(node, "axis", 0), r)?;
        let last = self.attr_i(node, "select_last_index", 0) != 0;
        Ok(one(consts::arg_extreme(a, axis, keep, max, last)))
    }

    /// CumSum of `a` along the axis of input 1: running sums, `exclusive` leaving each
    /// element out of its own, `reverse` from the axis' end.
    pub(in crate::onnx::import) fn fold_cumsum(
        &self,
        node: &NodeProto,
        a: &Const,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
        let r = a.dims.len();
        let axis = match self.input_const(ins, 1)?.as_ints()[..] {
            [ax] => self.axis(ax, r.max(1))?,
            ref v => return Err(self.bad(format!("axis {v:?}: one value expected"))),
        };
        if r == 0 {
            return Err(self.bad("an input of rank 0"));
        }
        let exclusive = self.attr_i(node, "exclusive", 0) != 0;
        let reverse = self.attr_i(node, "reverse", 0) != 0;
        let n = a.dims[axis];
        let inner: usize = a.dims[axis + 1..].iter().product();
        let outer: usize = a.dims[..axis].iter().product();
        let mut data = a.data.clone();
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| o * n * inner + k * inner + i;
                let mut sum = 0.0;
                for step in 0..n {
                    let k = if reverse { n - 1 - step } else { step };
                    let v = a.data[at(k)];
                    if !exclusive {
                        sum += v;
                    }
                    data[at(k)] = sum;
                    if exclusive {
                        sum += v;
                    }
                }
            }
        }
        Ok(one(Const::new(a.dims.clone(), a.elem, data, a.baked)))
    }

    /// The reduction `kind`, its axes an input from opset `since`.
    pub(in crate::onnx::import) fn fold_reduce(
        &self,
        node: &NodeProto,
        a: &Const,
        kind: ReduceKind,
        since: i64,
    ) -> R<Vec<Val>> {
        let r = a.dims.len();
        let keep = self.attr_i(node, "keepdims", 1) != 0;
        let axes = self.reduce_axes(node, since)?.unwrap_or_default();
        if axes.is_empty() && self.attr_i(node, "noop_with_empty_axes", 0) != 0 {
            return Ok(one(a.clone()));
        }
        let mut reduced = vec![axes.is_empty(); r];
        for &ax in &axes {
            reduced[self.axis(ax, r)?] = true;
        }
        Ok(one(consts::reduce(a, &reduced, keep, kind)))
    }

    /// Gather of `a` at the indices of input 1.
    pub(in crate::onnx::import) fn fold_gather(
        &self,
        node: &NodeProto,
        a: &Const,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
        self.has_axis(a)?;
        let idx = self.input_const(ins, 1)?;
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
                    return Err(self.bad(format!("index {i} is out of range (axis of {n})")));
                }
                let base = (o * n as usize + i as usize) * inner;
                data.extend_from_slice(&a.data[base..base + inner]);
            }
        }
        let mut dims = a.dims[..axis].to_vec();
        dims.extend_from_slice(&idx.dims);
        dims.extend_from_slice(&a.dims[axis + 1..]);
        Ok(one(Const::new(dims, a.elem, data, a.baked)))
    }

    /// GatherElements of `a` at the indices of input 1.
    pub(in crate::onnx::import) fn fold_gather_elements(
        &self,
        node: &NodeProto,
        a: &Const,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
        self.has_axis(a)?;
        let idx = self.input_const(ins, 1)?;
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
        Ok(one(Const::new(idx.dims.clone(), a.elem, data, a.baked)))
    }

    /// GatherND of `a` at the index tuples of input 1.
    pub(in crate::onnx::import) fn fold_gather_nd(
        &self,
        node: &NodeProto,
        a: &Const,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
        self.has_axis(a)?;
        let idx = self.input_const(ins, 1)?;
        self.gather_nd_of(node, a, &idx).map(one)
    }

    /// GatherND of `a` at the index tuples `idx`.
    fn gather_nd_of(&self, node: &NodeProto, a: &Const, idx: &Const) -> R<Const> {
        let (rows, dims, row_len) = self.gather_nd_rows(node, &a.dims, idx)?;
        let mut data = Vec::with_capacity(rows.len() * row_len);
        for r in rows {
            data.extend_from_slice(
                a.data
                    .get(r * row_len..(r + 1) * row_len)
                    .ok_or_else(|| self.bad("index out of range"))?,
            );
        }
        Ok(Const::new(dims, a.elem, data, a.baked))
    }

    /// The rows GatherND picks from data of `dims` at the index tuples `idx` (data seen as
    /// rows of the axes after the tuple's): each tuple's row, the output dims and the row
    /// length. With `batch_dims` b, the first b axes of the data and of the indices are
    /// shared: a tuple at batch position p indexes the data's batch p.
    pub(in crate::onnx::import) fn gather_nd_rows(
        &self,
        node: &NodeProto,
        dims: &[usize],
        idx: &Const,
    ) -> R<(Vec<usize>, Vec<usize>, usize)> {
        let b = usize::try_from(self.attr_i(node, "batch_dims", 0))
            .map_err(|_| self.bad("batch_dims is negative"))?;
        let k = *idx
            .dims
            .last()
            .ok_or_else(|| self.bad("indices of rank 0"))?;
        if b + k > dims.len() || b >= idx.dims.len() || idx.dims[..b] != dims[..b] {
            return Err(self.bad(format!(
                "index tuples of {k} after {b} batch axes for a {dims:?} input and {:?} indices",
                idx.dims
            )));
        }
        let row_len: usize = dims[b + k..].iter().product();
        let st = consts::strides(dims);
        // The position of each tuple among the indices' leading axes, for its batch.
        let lead = &idx.dims[..idx.dims.len() - 1];
        let lst = consts::strides(lead);
        let mut rows = Vec::with_capacity(idx.len() / k.max(1));
        for (p, t) in idx.data.chunks(k.max(1)).enumerate() {
            let mut off = 0usize;
            for a in 0..b {
                off += (p / lst[a]) % lead[a].max(1) * st[a];
            }
            for (j, &v) in t.iter().enumerate().take(k) {
                let n = dims[b + j] as i64;
                let v = v as i64;
                let v = usize::try_from(if v < 0 { v + n } else { v })
                    .ok()
                    .filter(|&v| v < dims[b + j])
                    .ok_or_else(|| self.bad(format!("index {v} out of range")))?;
                off += v * st[b + j];
            }
            rows.push(off / row_len.max(1));
        }
        let mut out = lead.to_vec();
        out.extend_from_slice(&dims[b + k..]);
        Ok((rows, out, row_len))
    }

    /// Reshape, Flatten, Squeeze or Unsqueeze (`how`).
    pub(in crate::onnx::import) fn fold_reshape(
        &self,
        node: &NodeProto,
        a: &Rc<Const>,
        how: Reshaping,
    ) -> R<Vec<Val>> {
        let dims = self.reshaped_dims(node, &Val::C(a.clone()), how)?;
        let mut out = (**a).clone();
        out.dims = dims;
        Ok(one(out))
    }

    /// Expand to the shape of input 1.
    pub(in crate::onnx::import) fn fold_expand(
        &self,
        node: &NodeProto,
        a: &Rc<Const>,
    ) -> R<Vec<Val>> {
        let dims = self.expand_dims(node, &Val::C(a.clone()))?;
        let out = consts::expand(a, &dims).ok_or_else(|| self.bad("does not broadcast"))?;
        self.limited(out).map(one)
    }

    /// Concat of every input along `axis`.
    pub(in crate::onnx::import) fn fold_concat(
        &self,
        node: &NodeProto,
        a: &Const,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
        self.has_axis(a)?;
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
        Ok(one(Const::new(dims, a.elem, data, baked)))
    }

    /// Range from start `a` to limit (input 1) by delta (input 2).
    pub(in crate::onnx::import) fn fold_range(
        &self,
        a: &Const,
        ins: &[Option<Rc<Const>>],
    ) -> R<Vec<Val>> {
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
        Ok(one(Const::new(vec![n], a.elem, data, a.baked)))
    }

    /// Transpose by `perm`.
    pub(in crate::onnx::import) fn fold_transpose(
        &self,
        node: &NodeProto,
        a: &Const,
    ) -> R<Vec<Val>> {
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
        Ok(one(Const::new(dims, a.elem, data, a.baked)))
    }

    /// Slice: each sliced axis's positions picked in turn.
    pub(in crate::onnx::import) fn fold_slice(&self, node: &NodeProto, a: &Const) -> R<Vec<Val>> {
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
        Ok(one(cur))
    }

    /// Split's outputs.
    pub(in crate::onnx::import) fn fold_split(&self, node: &NodeProto, a: &Const) -> R<Vec<Val>> {
        self.has_axis(a)?;
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
    use crate::compile::onnx::{run_onnx, NamedTensor};
    use crate::onnx::import::testing::{float_info, model};
    use crate::onnx::proto::{AttributeProto, GraphProto, NodeProto, TensorProto, ValueInfoProto};
    use crate::onnx::OnnxModel;

    /// A one-dimensional float tensor's value info.
    fn float(name: &str, n: i64) -> ValueInfoProto {
        float_info(name, &[n])
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
        model(
            "mod",
            GraphProto {
                node: vec![
                    node("Mod", &["a", "b"], "m", vec![int_attr("fmod", fmod)]),
                    node("Cast", &["m"], "mf", vec![int_attr("to", 1)]),
                    node("Add", &["x", "mf"], "y", Vec::new()),
                ],
                input,
                output: vec![float("y", n)],
                initializer,
                ..Default::default()
            },
        )
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

    /// `y = x + float(IsNaN(a)) + 2 float(IsInf(a)) + 4 float(IsInf(a) positive only) +
    /// float(Abs(b))`, with `a` a graph input (run time) or a constant, `b` an int64 constant.
    fn predicates_model(a: &[f64], constant: bool) -> OnnxModel {
        let n = a.len() as i64;
        let floats = |name: &str, v: &[f64]| TensorProto {
            name: Some(name.into()),
            dims: vec![v.len() as i64],
            data_type: Some(1),
            float_data: v.iter().map(|&x| x as f32).collect(),
            ..Default::default()
        };
        let b = TensorProto {
            name: Some("b".into()),
            dims: vec![n],
            data_type: Some(7),
            int64_data: (0..n).map(|k| -k).collect(),
            ..Default::default()
        };
        let (mut input, mut initializer) = (vec![float("x", n)], vec![b]);
        if constant {
            initializer.push(floats("a", a));
        } else {
            input.push(float("a", n));
        }
        initializer.push(floats("two", &[2.0]));
        initializer.push(floats("four", &[4.0]));
        let cast = |i: &str, o: &str| node("Cast", &[i], o, vec![int_attr("to", 1)]);
        let nodes = vec![
            node("IsNaN", &["a"], "nan", Vec::new()),
            node("IsInf", &["a"], "inf", Vec::new()),
            node(
                "IsInf",
                &["a"],
                "pinf",
                vec![int_attr("detect_negative", 0)],
            ),
            node("Abs", &["b"], "abs", Vec::new()),
            cast("nan", "nanf"),
            cast("inf", "inff"),
            cast("pinf", "pinff"),
            cast("abs", "absf"),
            node("Mul", &["inff", "two"], "inf2", Vec::new()),
            node("Mul", &["pinff", "four"], "pinf4", Vec::new()),
            node(
                "Sum",
                &["x", "nanf", "inf2", "pinf4", "absf"],
                "y",
                Vec::new(),
            ),
        ];
        model(
            "predicates",
            GraphProto {
                node: nodes,
                input,
                output: vec![float("y", n)],
                initializer,
                ..Default::default()
            },
        )
    }

    /// `IsNaN` and `IsInf` give the same flags folded and at run time (an input of more than
    /// 16 floats is not read as a constant), and `Abs` folds an int64 constant.
    #[test]
    fn nan_and_infinity_predicates_fold_and_run_alike() {
        let four = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.5];
        let a: Vec<f64> = four.iter().copied().cycle().take(20).collect();
        // NaN: 1; +inf: 2 + 4; -inf: 2; 1.5: 0; plus |-k|.
        let want: Vec<f32> = (0..20)
            .map(|k| [1.0, 6.0, 2.0, 0.0][k % 4] + k as f32)
            .collect();
        // Folded: one-element constants (a float initializer of more is a weight).
        for (k, &v) in four.iter().enumerate() {
            let folded = run(&predicates_model(&[v], true), 1).unwrap();
            assert_eq!(folded, [want[k] - k as f32], "{v}");
        }
        let model = predicates_model(&a, false);
        let inputs = [
            NamedTensor {
                name: "x".into(),
                dims: vec![20],
                data: vec![0.0; 20],
            },
            NamedTensor {
                name: "a".into(),
                dims: vec![20],
                data: a.iter().map(|&v| v as f32).collect(),
            },
        ];
        let got = run_onnx(&model, &inputs).unwrap();
        assert_eq!(got[0].data, want);
    }
}
