//! Reductions over axes, and ArgMax / ArgMin.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::Reduction, versions, convert)
}

/// The family's ops: each reduction's kind and the opset from which its axes are an input.
pub(super) const CONVERTERS: &[Converter] = &[
    op("ReduceMean", &[1, 11, 13, 18], |im, n| {
        im.reduce(n, ReduceKind::Mean, 18)
    })
    .folds(|im, n, a, _| im.fold_reduce(n, a, ReduceKind::Mean, 18)),
    op("ReduceSum", &[1, 11, 13], |im, n| {
        im.reduce(n, ReduceKind::Sum, 13)
    })
    .folds(|im, n, a, _| im.fold_reduce(n, a, ReduceKind::Sum, 13)),
    op("ReduceMax", &[1, 11, 12, 13, 18, 20], |im, n| {
        im.reduce(n, ReduceKind::Max, 18)
    })
    .folds(|im, n, a, _| im.fold_reduce(n, a, ReduceKind::Max, 18)),
    op("ArgMax", &[1, 11, 12, 13], |im, n| im.arg_extreme(n, true))
        .folds(|im, n, a, _| im.fold_arg_extreme(n, a, true)),
    op("ArgMin", &[1, 11, 12, 13], |im, n| im.arg_extreme(n, false))
        .folds(|im, n, a, _| im.fold_arg_extreme(n, a, false)),
    // Exporters count positions with it from a sequence length (GPT-2's position ids).
    Converter::fold_only("CumSum", Family::Reduction, |im, n, a, ins| {
        im.fold_cumsum(n, a, ins)
    }),
];

impl<'a> Importer<'a> {
    /// Reduction axes: the attribute (older opsets) or the second input.
    pub(in crate::onnx::import) fn reduce_axes(
        &self,
        node: &NodeProto,
        input_since: i64,
    ) -> R<Option<Vec<i64>>> {
        if self.model.opset >= input_since {
            Ok(self.konst(node, 1, "axes")?.map(|c| c.as_ints()))
        } else {
            Ok(self.attr_ints(node, "axes"))
        }
    }

    /// The reduction `kind`, its axes an input from opset `since` (an attribute before).
    fn reduce(&mut self, node: &NodeProto, kind: ReduceKind, since: i64) -> R<Vec<Val>> {
        let axes = self.reduce_axes(node, since)?.unwrap_or_default();
        let keep = self.attr_i(node, "keepdims", 1) != 0;
        let v = self.req(node, 0)?;
        if axes.is_empty() && self.attr_i(node, "noop_with_empty_axes", 0) != 0 {
            return Ok(vec![v]);
        }
        let e = self.elem(&v);
        let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.reduce(&name, x, &axes, keep, kind))?;
        Ok(vec![Val::T(id, e)])
    }

    /// `ArgMax` / `ArgMin` along `axis`, built of graph ops (the maximum, a comparison with
    /// it, a selection of each position's index where it equals it, and a maximum of those):
    /// the first index of the extreme (the last with `select_last_index`), as int64: the
    /// greatest's (`max`, ArgMax) or the least's (ArgMin).
    fn arg_extreme(&mut self, node: &NodeProto, max: bool) -> R<Vec<Val>> {
        let v = self.req(node, 0)?;
        let d = self.dims(&v);
        if d.is_empty() {
            return Err(self.bad("an input of rank 0"));
        }
        if !self.elem(&v).is_float() {
            return Err(self.unsupported(format!("{:?} input", self.elem(&v))));
        }
        let r = d.len();
        let a = self.axis(self.attr_i(node, "axis", 0), r)?;
        let keep = self.attr_i(node, "keepdims", 1) != 0;
        let last = self.attr_i(node, "select_last_index", 0) != 0;
        let n = d[a];
        let dtype = self.dtype(Elem::F32);
        let mut x = self.ti(node, 0)?;
        if !max {
            // The least of x is the greatest of -x.
            let name = self.out_name(node, "negated");
            x = chk!(self, self.g.unary(&name, x, UnaryFn::Neg))?;
        }
        let name = self.out_name(node, "extreme");
        let m = chk!(
            self,
            self.g
                .reduce(&name, x, &[a as isize], true, ReduceKind::Max)
        )?;
        let name = self.out_name(node, "at_extreme");
        let at = chk!(self, self.g.binary(&name, x, m, BinaryFn::Equal))?;
        // Each position's index along the axis (negated for the first: the greatest of -i),
        // and what a position not at the extreme takes (below every index).
        let mut idims = vec![1usize; r];
        idims[a] = n;
        let (index, none): (Vec<f64>, f64) = if last {
            ((0..n).map(|i| i as f64).collect(), -1.0)
        } else {
            ((0..n).map(|i| -(i as f64)).collect(), -(n as f64))
        };
        let name = self.out_name(node, "indices");
        let ic = Val::C(Rc::new(Const::new(idims, Elem::F32, index, true)));
        let index = self.t(&ic, &name)?;
        let name = self.out_name(node, "elsewhere");
        let none = chk!(self, self.g.constant(&name, &[], dtype, none as f32))?;
        let name = self.out_name(node, "candidates");
        let cand = chk!(self, self.g.select(&name, at, index, none))?;
        let name = self.out_name(node, "chosen");
        let mut idx = chk!(
            self,
            self.g
                .reduce(&name, cand, &[a as isize], keep, ReduceKind::Max)
        )?;
        if !last {
            let name = self.out_name(node, "index");
            idx = chk!(self, self.g.unary(&name, idx, UnaryFn::Neg))?;
        }
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.cast(&name, idx, DType::I32))?;
        Ok(vec![Val::T(id, Elem::I64)])
    }
}
