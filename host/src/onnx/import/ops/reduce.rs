//! Reductions over axes.

use super::super::*;
use super::{Converter, Family};

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    Converter {
        op: "ReduceMean",
        family: Family::Reduction,
        versions: &[1, 11, 13, 18],
        convert: |im, n| im.reduce(n),
    },
    Converter {
        op: "ReduceSum",
        family: Family::Reduction,
        versions: &[1, 11, 13],
        convert: |im, n| im.reduce(n),
    },
    Converter {
        op: "ReduceMax",
        family: Family::Reduction,
        versions: &[1, 11, 12, 13, 18, 20],
        convert: |im, n| im.reduce(n),
    },
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

    pub(in crate::onnx::import) fn reduce(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let (kind, since) = match self.op.as_str() {
            "ReduceMean" => (ReduceKind::Mean, 18),
            "ReduceSum" => (ReduceKind::Sum, 13),
            _ => (ReduceKind::Max, 18),
        };
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
}
