//! Shapes, views and copies: reshapes, transposes, concatenation, splits, slices, `Expand`, and `Shape` / `Size` (constants at import).

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Shape, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("Reshape", &[5, 13, 14, 19, 21], |im, n| {
        im.reshape(n, Reshaping::Reshape)
    })
    .folds(|im, n, a, _| im.fold_reshape(n, a, Reshaping::Reshape)),
    op("Flatten", &[1, 9, 11, 13, 21], |im, n| {
        im.reshape(n, Reshaping::Flatten)
    })
    .folds(|im, n, a, _| im.fold_reshape(n, a, Reshaping::Flatten)),
    op("Squeeze", &[1, 11, 13, 21], |im, n| {
        im.reshape(n, Reshaping::Squeeze)
    })
    .folds(|im, n, a, _| im.fold_reshape(n, a, Reshaping::Squeeze)),
    op("Unsqueeze", &[1, 11, 13, 21], |im, n| {
        im.reshape(n, Reshaping::Unsqueeze)
    })
    .folds(|im, n, a, _| im.fold_reshape(n, a, Reshaping::Unsqueeze)),
    op("Transpose", &[1, 13, 21], |im, n| im.transpose(n))
        .folds(|im, n, a, _| im.fold_transpose(n, a)),
    op("Concat", &[4, 11, 13], |im, n| im.concat(n))
        .folds(|im, n, a, ins| im.fold_concat(n, a, ins)),
    op("Split", &[2, 11, 13, 18], |im, n| im.split(n)).folds(|im, n, a, _| im.fold_split(n, a)),
    op("Slice", &[1, 10, 11, 13], |im, n| im.slice(n)).folds(|im, n, a, _| im.fold_slice(n, a)),
    op("Expand", &[8, 13], |im, n| im.expand(n)).folds(|im, n, a, _| im.fold_expand(n, a)),
    op("Shape", &[1, 13, 15, 19, 21], |im, n| im.shape(n)),
    op("Size", &[1, 13, 19, 21], |im, n| im.size(n)),
    op("Pad", &[2, 11, 13, 18, 19, 21], |im, n| im.pad(n)),
    op("Tile", &[6, 13], |im, n| im.tile(n)),
];

/// The ops that change a tensor's shape and not its elements.
#[derive(Clone, Copy)]
pub(in crate::onnx::import) enum Reshaping {
    /// To the shape of input 1.
    Reshape,
    /// To 2-D at `axis`.
    Flatten,
    /// Without the axes of size 1 named (or all).
    Squeeze,
    /// With axes of size 1 inserted.
    Unsqueeze,
}

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn perm(&self, node: &NodeProto, r: usize) -> R<Vec<usize>> {
        match self.attr_ints(node, "perm") {
            None => Ok((0..r).rev().collect()),
            Some(p) => {
                let mut seen = vec![false; r];
                let mut out = Vec::with_capacity(r);
                for &a in &p {
                    let a = self.axis(a, r)?;
                    if a >= r {
                        return Err(self.bad(format!("perm {p:?} for a rank-{r} input")));
                    }
                    if seen[a] {
                        return Err(self.bad(format!("perm {p:?} repeats an axis")));
                    }
                    seen[a] = true;
                    out.push(a);
                }
                if out.len() != r {
                    return Err(self.bad(format!("perm {p:?} is not a permutation of {r} axes")));
                }
                Ok(out)
            }
        }
    }

    /// The batch axis of tensor `name` as rebinding changed it: the one axis whose size
    /// differs from the file's. `None` when the batch is not rebound or the tensor does not
    /// carry it.
    pub(in crate::onnx::import) fn rebound_axis(
        &self,
        name: &str,
        now: &[usize],
    ) -> R<Option<usize>> {
        let Some(orig) = self.original.and_then(|o| o.get(name)) else {
            return Ok(None);
        };
        if orig.len() != now.len() {
            return Err(self.bad(format!(
                "rebinding the batch changed the rank of `{name}` ({orig:?} -> {now:?})"
            )));
        }
        let changed: Vec<usize> = (0..now.len()).filter(|&i| orig[i] != now[i]).collect();
        match changed.as_slice() {
            [] => Ok(None),
            [a] => Ok(Some(*a)),
            _ => Err(self.unsupported(format!(
                "rebinding the batch: `{name}` changed on several axes ({orig:?} -> {now:?})"
            ))),
        }
    }

    /// A shape written into the file at the file's batch, for output `out` of a node whose
    /// data input `input` now has `now`: the output axis that carries the batch is scaled.
    pub(in crate::onnx::import) fn rebind_written(
        &self,
        input: &str,
        now: &[usize],
        out: &str,
    ) -> R<Option<Vec<usize>>> {
        let Some(a) = self.rebound_axis(input, now)? else {
            return Ok(None);
        };
        let (Some(orig_in), Some(orig_out)) = (
            self.original.and_then(|o| o.get(input)),
            self.original.and_then(|o| o.get(out)),
        ) else {
            return Ok(None);
        };
        let outer: usize = orig_in[..a].iter().product();
        let mut prefix = 1usize;
        for (j, &d) in orig_out.iter().enumerate() {
            if prefix == outer && (d * self.batch) % self.file_batch == 0 && d > 0 {
                let mut dims = orig_out.clone();
                dims[j] = d * self.batch / self.file_batch;
                return Ok(Some(dims));
            }
            prefix *= d;
            if prefix > outer {
                break;
            }
        }
        Err(self.unsupported(format!(
            "rebinding the batch through a shape written in the file ({orig_in:?} -> {orig_out:?}); export the model at the batch size wanted"
        )))
    }

    /// The output dims of Reshape / Flatten / Squeeze / Unsqueeze (`how`) of `v`.
    pub(in crate::onnx::import) fn reshaped_dims(
        &self,
        node: &NodeProto,
        v: &Val,
        how: Reshaping,
    ) -> R<Vec<usize>> {
        let d = self.dims(v);
        let r = d.len();
        let total: usize = d.iter().product();
        match how {
            Reshaping::Flatten => {
                let a = self.attr_i(node, "axis", 1);
                let a = if a < 0 { a + r as i64 } else { a };
                if a < 0 || a > r as i64 {
                    return Err(self.bad(format!("axis {a} is out of range for rank {r}")));
                }
                let a = a as usize;
                Ok(vec![d[..a].iter().product(), d[a..].iter().product()])
            }
            Reshaping::Squeeze => {
                let axes = if self.model.opset >= 13 {
                    self.konst(node, 1, "axes")?.map(|c| c.as_ints())
                } else {
                    self.attr_ints(node, "axes")
                };
                let axes: Vec<usize> = match axes {
                    Some(a) => a.iter().map(|&x| self.axis(x, r)).collect::<R<_>>()?,
                    None => (0..r).filter(|&i| d[i] == 1).collect(),
                };
                if let Some(&bad) = axes.iter().find(|&&a| d[a] != 1) {
                    return Err(self.bad(format!("axis {bad} has size {}, not 1", d[bad])));
                }
                Ok((0..r).filter(|i| !axes.contains(i)).map(|i| d[i]).collect())
            }
            Reshaping::Unsqueeze => {
                let axes = if self.model.opset >= 13 {
                    self.konst(node, 1, "axes")?.map(|c| c.as_ints())
                } else {
                    self.attr_ints(node, "axes")
                }
                .ok_or_else(|| self.bad("axes are required"))?;
                let out_r = r + axes.len();
                let axes: Vec<usize> = axes
                    .iter()
                    .map(|&x| self.axis(x, out_r))
                    .collect::<R<_>>()?;
                let mut it = d.iter();
                Ok((0..out_r)
                    .map(|i| {
                        if axes.contains(&i) {
                            1
                        } else {
                            *it.next().unwrap_or(&1)
                        }
                    })
                    .collect())
            }
            Reshaping::Reshape => {
                let shape = self
                    .konst(node, 1, "shape")?
                    .ok_or_else(|| self.bad("the shape input is required"))?;
                if shape.baked {
                    let input = node.input.first().cloned().unwrap_or_default();
                    let out = node.output.first().cloned().unwrap_or_default();
                    if let Some(dims) = self.rebind_written(&input, &d, &out)? {
                        return Ok(dims);
                    }
                }
                let allow_zero = self.attr_i(node, "allowzero", 0) != 0;
                let want = shape.as_ints();
                let mut out = Vec::with_capacity(want.len());
                let mut infer = None;
                for (i, &s) in want.iter().enumerate() {
                    out.push(match s {
                        -1 if infer.is_none() => {
                            infer = Some(i);
                            1
                        }
                        0 if !allow_zero => *d.get(i).ok_or_else(|| {
                            self.bad(format!(
                                "shape {want:?} copies axis {i}, which the input lacks"
                            ))
                        })?,
                        s if s >= 0 => s as usize,
                        _ => return Err(self.bad(format!("shape {want:?} is not valid"))),
                    });
                }
                let known: usize = out.iter().product();
                if let Some(i) = infer {
                    if known == 0 || total % known != 0 {
                        return Err(self.bad(format!(
                            "cannot reshape {d:?} ({total} elements) to {want:?}"
                        )));
                    }
                    out[i] = total / known;
                }
                if out.iter().product::<usize>() != total {
                    return Err(self.bad(format!(
                        "cannot reshape {d:?} ({total} elements) to {want:?}"
                    )));
                }
                Ok(out)
            }
        }
    }

    /// The output dims of Expand (numpy broadcast of the input and the shape).
    pub(in crate::onnx::import) fn expand_dims(&self, node: &NodeProto, v: &Val) -> R<Vec<usize>> {
        let shape = self
            .konst(node, 1, "shape")?
            .ok_or_else(|| self.bad("the shape input is required"))?;
        let d = self.dims(v);
        let want: Vec<usize> = shape
            .as_ints()
            .iter()
            .map(|&x| usize::try_from(x).map_err(|_| self.bad(format!("shape value {x}"))))
            .collect::<R<_>>()?;
        let mut target = consts::broadcast(&d, &want)
            .ok_or_else(|| self.bad(format!("{d:?} does not broadcast to {want:?}")))?;
        if shape.baked {
            let input = node.input.first().cloned().unwrap_or_default();
            if let Some(a) = self.rebound_axis(&input, &d)? {
                // The input's batch axis keeps its (rebound) size.
                let off = target.len() - d.len();
                target[off + a] = d[a];
            }
        }
        Ok(target)
    }

    pub(in crate::onnx::import) fn concat(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let first = self.req(node, 0)?;
        let r = self.dims(&first).len();
        let e = self.elem(&first);
        let axis = self.axis(self.attr_i(node, "axis", 0), r)?;
        let mut parts = Vec::new();
        for k in 0..node.input.len() {
            let Some(v) = self.opt(node, k)? else {
                continue;
            };
            if self.dims(&v).iter().product::<usize>() == 0 {
                continue;
            }
            let v = self.retype(&v, &first);
            let name = node.input[k].clone();
            parts.push(self.t(&v, &name)?);
        }
        let mut acc = *parts
            .first()
            .ok_or_else(|| self.bad("every input is empty"))?;
        let n = parts.len();
        for (k, &p) in parts.iter().enumerate().skip(1) {
            let suffix = if k + 1 == n {
                String::new()
            } else {
                format!("partial{k}")
            };
            let name = self.out_name(node, &suffix);
            acc = chk!(self, self.g.concat_axis(&name, acc, p, axis as isize))?;
        }
        if n == 1 {
            return Ok(vec![Val::T(acc, e)]);
        }
        Ok(vec![Val::T(acc, e)])
    }

    /// The sizes a Split cuts `len` into.
    pub(in crate::onnx::import) fn split_sizes(
        &self,
        node: &NodeProto,
        len: usize,
    ) -> R<Vec<usize>> {
        let given = if self.model.opset >= 13 {
            self.konst(node, 1, "split")?.map(|c| c.as_ints())
        } else {
            self.attr_ints(node, "split")
        };
        let outs = node.output.len();
        let sizes: Vec<usize> = match given {
            Some(s) => s.iter().map(|&x| x.max(0) as usize).collect(),
            None => {
                let n = if self.model.opset >= 18 {
                    self.attr_i(node, "num_outputs", outs as i64).max(1) as usize
                } else {
                    outs.max(1)
                };
                let chunk = len.div_ceil(n);
                (0..n)
                    .map(|i| chunk.min(len.saturating_sub(i * chunk)))
                    .collect()
            }
        };
        if sizes.iter().sum::<usize>() != len || sizes.len() != outs {
            return Err(self.bad(format!(
                "split sizes {sizes:?} do not cut an axis of {len} into {outs} outputs"
            )));
        }
        Ok(sizes)
    }

    pub(in crate::onnx::import) fn split(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let v = self.req(node, 0)?;
        let d = self.dims(&v);
        let e = self.elem(&v);
        let axis = self.axis(self.attr_i(node, "axis", 0), d.len())?;
        let sizes = self.split_sizes(node, d[axis])?;
        let x = self.ti(node, 0)?;
        let mut outs = Vec::new();
        let mut start = 0;
        for (k, &len) in sizes.iter().enumerate() {
            let base = node
                .output
                .get(k)
                .filter(|s| !s.is_empty())
                .cloned()
                .unwrap_or_else(|| format!("{}/{k}", self.node));
            let name = self.fresh(&base);
            let id = chk!(self, self.g.slice(&name, x, axis as isize, start, len))?;
            outs.push(Val::T(id, e));
            start += len;
        }
        Ok(outs)
    }

    /// Per-axis `(start, len, step)` of a Slice of `d`.
    pub(in crate::onnx::import) fn slice_ranges(
        &self,
        node: &NodeProto,
        d: &[usize],
    ) -> R<Vec<(usize, i64, i64, i64)>> {
        let r = d.len();
        let (starts, ends, axes, steps) = if self.model.opset >= 10 {
            (
                self.konst(node, 1, "starts")?.map(|c| c.as_ints()),
                self.konst(node, 2, "ends")?.map(|c| c.as_ints()),
                self.konst(node, 3, "axes")?.map(|c| c.as_ints()),
                self.konst(node, 4, "steps")?.map(|c| c.as_ints()),
            )
        } else {
            (
                self.attr_ints(node, "starts"),
                self.attr_ints(node, "ends"),
                self.attr_ints(node, "axes"),
                None,
            )
        };
        let starts = starts.ok_or_else(|| self.bad("starts are required"))?;
        let ends = ends.ok_or_else(|| self.bad("ends are required"))?;
        let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(self.bad("starts, ends, axes and steps differ in length"));
        }
        let mut out = Vec::new();
        for k in 0..starts.len() {
            let a = self.axis(axes[k], r)?;
            let n = d[a] as i64;
            let step = steps[k];
            if step == 0 {
                return Err(self.bad("a step of 0"));
            }
            let clampv = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
            let norm = |v: i64| if v < 0 { v + n } else { v };
            let (s, e) = if step > 0 {
                (clampv(norm(starts[k]), 0, n), clampv(norm(ends[k]), 0, n))
            } else {
                (
                    clampv(norm(starts[k]), -1, n - 1),
                    clampv(norm(ends[k]), -1, n - 1),
                )
            };
            out.push((a, s, e, step));
        }
        Ok(out)
    }

    pub(in crate::onnx::import) fn slice(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let v = self.req(node, 0)?;
        let d = self.dims(&v);
        let e = self.elem(&v);
        let input = node.input.first().cloned().unwrap_or_default();
        let rebound = self.rebound_axis(&input, &d)?;
        let mut x = self.ti(node, 0)?;
        let ranges = self.slice_ranges(node, &d)?;
        let n = ranges.len();
        for (k, &(a, s, e_, step)) in ranges.iter().enumerate() {
            if step != 1 {
                if rebound == Some(a) {
                    return Err(self.unsupported(
                        "rebinding the batch through a Slice with a step on the batch axis",
                    ));
                }
                // Every step-th position: a gather of them.
                let mut idx = Vec::new();
                let mut i = s;
                while (step > 0 && i < e_) || (step < 0 && i > e_) {
                    idx.push(i as f64);
                    i += step;
                }
                if idx.is_empty() {
                    return Err(self.unsupported("an empty slice"));
                }
                let len = idx.len();
                let c = Val::C(Rc::new(Const::new(vec![len], Elem::I64, idx, true)));
                let name = self.out_name(node, &format!("axis{a}_positions"));
                let indices = self.t(&c, &name)?;
                let dims = self.dims(&Val::T(x, e));
                x = self.gather_along(node, x, &dims, a, indices, &[len])?;
                continue;
            }
            let (mut start, mut len) = (s as usize, (e_ - s).max(0) as usize);
            if rebound == Some(a) {
                let orig = self.original.and_then(|o| o.get(&input)).map(|o| o[a]);
                if Some(e_ as usize) == orig && s == 0 {
                    (start, len) = (0, d[a]);
                } else {
                    return Err(self.unsupported(
                        "rebinding the batch through a Slice of part of the batch axis",
                    ));
                }
            }
            if start == 0 && len == d[a] {
                continue;
            }
            let suffix = if k + 1 == n {
                String::new()
            } else {
                format!("axis{a}")
            };
            let name = self.out_name(node, &suffix);
            x = chk!(self, self.g.slice(&name, x, a as isize, start, len))?;
        }
        Ok(vec![Val::T(x, e)])
    }
}

impl<'a> Importer<'a> {
    fn reshape(&mut self, node: &NodeProto, how: Reshaping) -> R<Vec<Val>> {
        let dims = self.reshaped_dims(node, &self.req(node, 0)?, how)?;
        self.one_input(node, |g, name, x| g.reshape(name, x, &dims))
    }

    fn transpose(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let perm = self.perm(node, self.dims(&self.req(node, 0)?).len())?;
        self.one_input(node, |g, name, x| g.transpose(name, x, &perm))
    }

    fn expand(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let target = self.expand_dims(node, &self.req(node, 0)?)?;
        self.one_input(node, |g, name, x| g.broadcast_to(name, x, &target))
    }

    fn shape(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let v = self.req(node, 0)?;
        let d: Vec<i64> = self.dims(&v).iter().map(|&x| x as i64).collect();
        let r = d.len() as i64;
        let clampi = |a: i64| (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
        let start = clampi(self.attr_i(node, "start", 0));
        let end = clampi(self.attr_i(node, "end", r));
        let part = if start < end { &d[start..end] } else { &[][..] };
        Ok(vec![Val::C(Rc::new(Const::ints(part, false)))])
    }

    fn size(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let v = self.req(node, 0)?;
        let n: usize = self.dims(&v).iter().product();
        Ok(vec![Val::C(Rc::new(Const::new(
            vec![],
            Elem::I64,
            vec![n as f64],
            false,
        )))])
    }
}

/// Padding, tiling and nearest-neighbour resizing, built of the graph's concatenations,
/// broadcasts and reshapes (copies, as Poplar makes them).
impl<'a> Importer<'a> {
    /// `Pad` in `constant` mode: a block of the value before and after each padded axis;
    /// negative pads crop.
    fn pad(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let e = self.elem(&xv);
        let d = self.dims(&xv);
        let r = d.len();
        let mode = self
            .attr_s(node, "mode")
            .unwrap_or_else(|| "constant".into());
        let mode = match mode.as_str() {
            "constant" => None,
            "reflect" => Some(PadMode::Reflect),
            "edge" => Some(PadMode::Edge),
            "wrap" if self.model.opset >= 19 => Some(PadMode::Wrap),
            other => {
                return Err(self.bad(format!(
                    "mode = {other}: constant, reflect, edge (and wrap from opset 19) expected"
                )))
            }
        };
        let (pads, value, axes) = if self.model.opset >= 11 {
            let pads = self
                .konst(node, 1, "pads")?
                .ok_or_else(|| self.bad("pads are required"))?
                .as_ints();
            let value = self
                .konst(node, 2, "constant_value")?
                .and_then(|c| c.scalar())
                .unwrap_or(0.0);
            let axes = self.konst(node, 3, "axes")?.map(|c| c.as_ints());
            (pads, value, axes)
        } else {
            let pads = self
                .attr_ints(node, "pads")
                .ok_or_else(|| self.bad("pads are required"))?;
            (pads, f64::from(self.attr_f(node, "value", 0.0)), None)
        };
        let axes: Vec<usize> = match axes {
            Some(a) => a.iter().map(|&a| self.axis(a, r)).collect::<R<Vec<_>>>()?,
            None => (0..r).collect(),
        };
        if pads.len() != 2 * axes.len() {
            return Err(self.bad(format!(
                "{} pads for {} axes: a begin and an end per axis expected",
                pads.len(),
                axes.len()
            )));
        }
        let x0 = self.ti(node, 0)?;
        let mut x = x0;
        let dtype = self.g.node(x).dtype();
        let mut cur = d.clone();
        for (k, &axis) in axes.iter().enumerate() {
            let (begin, end) = (pads[k], pads[k + axes.len()]);
            if let Some(mode) = mode {
                if begin != 0 || end != 0 {
                    let idx = self.pad_positions(mode, cur[axis], begin, end, axis)?;
                    (x, cur) = self.take_along(node, x, &cur, axis, &idx)?;
                }
                continue;
            }
            for (at_end, p) in [(false, begin), (true, end)] {
                if p == 0 {
                    continue;
                }
                let side = if at_end { "end" } else { "begin" };
                if p < 0 {
                    let cut = p.unsigned_abs() as usize;
                    if cut > cur[axis] {
                        return Err(
                            self.bad(format!("pads crop {cut} of {} on axis {axis}", cur[axis]))
                        );
                    }
                    let start = if at_end { 0 } else { cut };
                    let n = self.out_name(node, &format!("crop{axis}_{side}"));
                    x = chk!(
                        self,
                        self.g.slice(&n, x, axis as isize, start, cur[axis] - cut)
                    )?;
                    cur[axis] -= cut;
                    continue;
                }
                let mut block = cur.clone();
                block[axis] = p as usize;
                let n = self.out_name(node, &format!("pad{axis}_{side}"));
                let c = chk!(self, self.g.constant(&n, &block, dtype, value as f32))?;
                let n = self.out_name(node, &format!("padded{axis}_{side}"));
                let (a, b) = if at_end { (x, c) } else { (c, x) };
                x = chk!(self, self.g.concat_axis(&n, a, b, axis as isize))?;
                cur[axis] += p as usize;
            }
        }
        if x == x0 {
            let n = self.out_name(node, "");
            x = chk!(self, self.g.unary(&n, x, UnaryFn::Identity))?;
        }
        Ok(vec![Val::T(x, e)])
    }

    /// Where each position of an axis of `n` padded by `begin` and `end` (negative: cropped)
    /// reads in the axis, as `mode` pads: reflected about the edges (without repeating them,
    /// as numpy's `reflect`, again and again when a pad is longer than the axis), the edge
    /// repeated, or the axis wrapped around.
    fn pad_positions(
        &self,
        mode: PadMode,
        n: usize,
        begin: i64,
        end: i64,
        axis: usize,
    ) -> R<Vec<usize>> {
        let n = n as i64;
        let len = n + begin + end;
        if n == 0 || len <= 0 {
            return Err(self.bad(format!(
                "pads {begin} and {end} on axis {axis} of {n}: nothing left to pad from"
            )));
        }
        if len > i64::from(u32::MAX) {
            return Err(self.bad(format!("pads {begin} and {end} on axis {axis}: too long")));
        }
        Ok((-begin..n + end)
            .map(|j| {
                let i = match mode {
                    PadMode::Edge => j.clamp(0, n - 1),
                    PadMode::Wrap => j.rem_euclid(n),
                    PadMode::Reflect if n == 1 => 0,
                    PadMode::Reflect => {
                        let period = 2 * (n - 1);
                        let m = j.rem_euclid(period);
                        if m < n {
                            m
                        } else {
                            period - m
                        }
                    }
                };
                i as usize
            })
            .collect())
    }

    /// `x` (of `dims`) with axis `k` repeated `r` times, as a rank-3 view broadcast and
    /// reshaped: the whole block from axis `k` on repeated (`Tile`), or each element of axis
    /// `k` (`nearest` resizing). Returns the new node and dims.
    fn repeat_axis(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        dims: &[usize],
        k: usize,
        r: usize,
        each: bool,
    ) -> R<(NodeId, Vec<usize>)> {
        let split = if each { k + 1 } else { k };
        let outer: usize = dims[..split].iter().product();
        let inner: usize = dims[split..].iter().product();
        let n = self.out_name(node, &format!("axis{k}_view"));
        let v = chk!(self, self.g.reshape(&n, x, &[outer, 1, inner]))?;
        let n = self.out_name(node, &format!("axis{k}_repeated"));
        let v = chk!(self, self.g.broadcast_to(&n, v, &[outer, r, inner]))?;
        let mut out = dims.to_vec();
        out[k] *= r;
        let n = self.out_name(node, &format!("axis{k}"));
        let v = chk!(self, self.g.reshape(&n, v, &out))?;
        Ok((v, out))
    }

    /// `x` with each axis `k` repeated `reps[k]` times (see [`Self::repeat_axis`]), named after
    /// the node's output at the end.
    pub(in crate::onnx::import) fn repeat_axes(
        &mut self,
        node: &NodeProto,
        reps: &[usize],
        each: bool,
    ) -> R<NodeId> {
        let mut dims = self.dims(&self.req(node, 0)?);
        let mut x = self.ti(node, 0)?;
        for (k, &r) in reps.iter().enumerate() {
            if r > 1 {
                (x, dims) = self.repeat_axis(node, x, &dims, k, r, each)?;
            }
        }
        let n = self.out_name(node, "");
        chk!(self, self.g.unary(&n, x, UnaryFn::Identity))
    }

    /// `Tile`: each axis repeated `repeats[k]` times.
    fn tile(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let e = self.elem(&xv);
        let d = self.dims(&xv);
        let reps = self
            .konst(node, 1, "repeats")?
            .ok_or_else(|| self.bad("repeats are required"))?
            .as_ints();
        if reps.len() != d.len() || reps.iter().any(|&r| r < 1) {
            return Err(self.bad(format!("repeats {reps:?} for a rank-{} input", d.len())));
        }
        let reps: Vec<usize> = reps.iter().map(|&r| r as usize).collect();
        let y = self.repeat_axes(node, &reps, false)?;
        Ok(vec![Val::T(y, e)])
    }
}

/// How `Pad` fills, other than with a constant.
#[derive(Clone, Copy, Debug)]
enum PadMode {
    /// Mirrored about the edge, the edge itself not repeated (`[1 2 3]` by 2: `3 2 1 2 3 2 1`).
    Reflect,
    /// The edge repeated (`1 1 1 2 3 3 3`).
    Edge,
    /// The axis wrapped around (`2 3 1 2 3 1 2`).
    Wrap,
}
