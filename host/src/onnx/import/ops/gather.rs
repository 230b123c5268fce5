//! Gathers: embeddings (`Gather` of a table), `GatherElements` and `GatherND`.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Gather, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("Gather", &[1, 11, 13], |im, n| im.gather(n))
        .weights(&[0])
        .folds(|im, n, a, ins| im.fold_gather(n, a, ins)),
    op("GatherElements", &[11, 13], |im, n| im.gather_flat(n, true))
        .folds(|im, n, a, ins| im.fold_gather_elements(n, a, ins)),
    op("GatherND", &[11, 12, 13], |im, n| im.gather_flat(n, false))
        .folds(|im, n, a, ins| im.fold_gather_nd(n, a, ins)),
];

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn gather(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let data = self.req(node, 0)?;
        let idx = self.req(node, 1)?;
        let d = self.dims(&data);
        let e = self.elem(&data);
        let axis = self.axis(self.attr_i(node, "axis", 0), d.len())?;
        // A constant index on a run-time tensor: a slice (the LSTM's last step, say).
        if let Val::C(c) = &idx {
            if c.len() == 1 && (!matches!(data, Val::W(_)) || axis != 0) {
                let mut i = c.data[0] as i64;
                if i < 0 {
                    i += d[axis] as i64;
                }
                if i < 0 || i >= d[axis] as i64 {
                    return Err(self.bad(format!(
                        "index {} is out of range for axis {axis} of size {}",
                        c.data[0], d[axis]
                    )));
                }
                let x = self.ti(node, 0)?;
                let name = self.out_name(node, "slice");
                let s = chk!(self, self.g.slice(&name, x, axis as isize, i as usize, 1))?;
                let mut dims: Vec<usize> = d.clone();
                if c.dims.is_empty() {
                    dims.remove(axis);
                } else {
                    dims[axis] = 1;
                    // Indices of shape [1, ...] replace the axis by their dims.
                    dims.splice(axis..=axis, c.dims.iter().copied());
                }
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.reshape(&name, s, &dims))?;
                return Ok(vec![Val::T(id, e)]);
            }
        }
        let idx = match idx {
            Val::C(c) => {
                // Negative indices count from the end.
                let n = d[axis] as f64;
                let mut c2 = (*c).clone();
                for v in &mut c2.data {
                    if *v < 0.0 {
                        *v += n;
                    }
                }
                Val::C(Rc::new(c2))
            }
            v => v,
        };
        if axis != 0 {
            let x = self.ti(node, 0)?;
            let iname = node.input[1].clone();
            let idims = self.dims(&idx);
            let indices = self.t(&idx, &iname)?;
            let id = self.gather_along(node, x, &d, axis, indices, &idims)?;
            return Ok(vec![Val::T(id, e)]);
        }
        let table = self.ti(node, 0)?;
        if let Val::W(i) = data {
            let name = self.weights[i].name.clone();
            if !self.embeddings.iter().any(|e| e.tensor == name) {
                self.embeddings.push(Embedding {
                    tensor: name,
                    node: table,
                    dims: d.clone(),
                });
            }
        }
        let iname = node.input[1].clone();
        let indices = self.t(&idx, &iname)?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.gather(&name, table, indices))?;
        Ok(vec![Val::T(id, e)])
    }

    /// `x` (of `dims`) gathered along `axis` by `indices` (of `idims`): the axis moved first,
    /// its rows gathered, and the indices' axes moved to where the axis was (ONNX `Gather`'s
    /// shape, `dims[..axis] ++ idims ++ dims[axis + 1..]`). Named after the node's output.
    pub(in crate::onnx::import) fn gather_along(
        &mut self,
        node: &NodeProto,
        x: NodeId,
        dims: &[usize],
        axis: usize,
        indices: NodeId,
        idims: &[usize],
    ) -> R<NodeId> {
        let r = dims.len();
        let mut front = vec![axis];
        front.extend((0..r).filter(|&i| i != axis));
        let mut y = x;
        if axis != 0 {
            let name = self.out_name(node, &format!("axis{axis}_first"));
            y = chk!(self, self.g.transpose(&name, y, &front))?;
        }
        let q = idims.len();
        let name = if axis == 0 {
            self.out_name(node, "")
        } else {
            self.out_name(node, &format!("axis{axis}_gathered"))
        };
        y = chk!(self, self.g.gather(&name, y, indices))?;
        if axis != 0 {
            // [idims..., dims[..axis]..., dims[axis + 1..]...] -> ONNX's order.
            let back: Vec<usize> = (0..axis)
                .map(|i| q + i)
                .chain(0..q)
                .chain(q + axis..q + r - 1)
                .collect();
            let name = self.out_name(node, "");
            y = chk!(self, self.g.transpose(&name, y, &back))?;
        }
        Ok(y)
    }

    /// GatherElements / GatherND with constant indices on a run-time tensor: the flat
    /// element (or row) indices are computed here and gathered as rows.
    /// GatherElements when `elements`, else GatherND.
    fn gather_flat(&mut self, node: &NodeProto, elements: bool) -> R<Vec<Val>> {
        let data = self.req(node, 0)?;
        let d = self.dims(&data);
        let e = self.elem(&data);
        let Some(idx) = self.konst(node, 1, "indices")? else {
            return Err(self.unsupported("indices computed at run time"));
        };
        let st = consts::strides(&d);
        let (rows, row_len, flat, out_dims) = if elements {
            let axis = self.axis(self.attr_i(node, "axis", 0), d.len())?;
            let ist = consts::strides(&idx.dims);
            let mut flat = Vec::with_capacity(idx.len());
            for (p, &v) in idx.data.iter().enumerate() {
                let mut off = 0usize;
                for a in 0..d.len() {
                    let pos = (p / ist[a]) % idx.dims[a].max(1);
                    let pos = if a == axis {
                        let n = d[a] as i64;
                        let v = v as i64;
                        usize::try_from(if v < 0 { v + n } else { v })
                            .map_err(|_| self.bad(format!("index {v} out of range")))?
                    } else {
                        pos
                    };
                    off += pos * st[a];
                }
                flat.push(off as f64);
            }
            (d.iter().product::<usize>(), 1, flat, idx.dims.clone())
        } else {
            let (picked, out, row_len) = self.gather_nd_rows(node, &d, &idx)?;
            let rows = d.iter().product::<usize>() / row_len.max(1);
            let flat = picked.into_iter().map(|r| r as f64).collect();
            (rows, row_len, flat, out)
        };
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "rows");
        let table = chk!(self, self.g.reshape(&name, x, &[rows, row_len]))?;
        let ic = Const::new(vec![flat.len()], Elem::I64, flat, false);
        let iname = format!(
            "{}/indices",
            node.output.first().cloned().unwrap_or_default()
        );
        let indices = self.t(&Val::C(Rc::new(ic)), &iname)?;
        let name = self.out_name(node, "gather");
        let rows_g = chk!(self, self.g.gather(&name, table, indices))?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.reshape(&name, rows_g, &out_dims))?;
        Ok(vec![Val::T(id, e)])
    }
}
