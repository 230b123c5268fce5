//! Matrix products: `MatMul` and `Gemm`.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::LinearAlgebra, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("MatMul", &[1, 9, 13], |im, n| im.matmul(n)).weights(&[1]),
    op("Gemm", &[6, 7, 9, 11, 13], |im, n| im.gemm(n)).weights(&[1, 2]),
];

impl<'a> Importer<'a> {
    pub(in crate::onnx::import) fn gemm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let (ta, tb) = (
            self.attr_i(node, "transA", 0) != 0,
            self.attr_i(node, "transB", 0) != 0,
        );
        let (alpha, beta) = (
            self.attr_f(node, "alpha", 1.0),
            self.attr_f(node, "beta", 1.0),
        );
        let (a, b) = (self.ti(node, 0)?, self.ti(node, 1)?);
        let has_c = self.opt(node, 2)?.is_some();
        let product = if alpha != 1.0 || has_c {
            self.out_name(node, "product")
        } else {
            self.out_name(node, "")
        };
        let mut y = chk!(self, self.g.matmul_t(&product, a, b, ta, tb))?;
        if alpha != 1.0 {
            let name = if has_c {
                self.out_name(node, "alpha")
            } else {
                self.out_name(node, "")
            };
            y = chk!(self, self.g.scale(&name, y, alpha))?;
        }
        if has_c {
            let mut c = self.ti(node, 2)?;
            if beta != 1.0 {
                let name = self.out_name(node, "beta");
                c = chk!(self, self.g.scale(&name, c, beta))?;
            }
            let name = self.out_name(node, "");
            y = chk!(self, self.g.add(&name, y, c))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }
}

impl<'a> Importer<'a> {
    /// `MatMul` with numpy's rules: a 1-D first operand is a row (`[1, K]`), a 1-D second
    /// one a column (`[K, 1]`), and the axis each added is removed from the product.
    pub(in crate::onnx::import) fn matmul(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let (ra, rb) = (
            self.dims(&self.req(node, 0)?).len(),
            self.dims(&self.req(node, 1)?).len(),
        );
        let (mut a, mut b) = (self.ti(node, 0)?, self.ti(node, 1)?);
        if ra == 0 || rb == 0 {
            return Err(self.bad("MatMul of a rank-0 operand"));
        }
        if ra == 1 {
            let name = self.out_name(node, "a_row");
            a = chk!(self, self.g.unsqueeze(&name, a, &[0]))?;
        }
        if rb == 1 {
            let name = self.out_name(node, "b_column");
            b = chk!(self, self.g.unsqueeze(&name, b, &[1]))?;
        }
        let plain = ra > 1 && rb > 1;
        let name = if plain {
            self.out_name(node, "")
        } else {
            self.out_name(node, "product")
        };
        let mut id = chk!(self, self.g.matmul(&name, a, b))?;
        if !plain {
            let mut dims: Vec<usize> = self
                .g
                .node(id)
                .shape()
                .dims()
                .iter()
                .map(|&d| d as usize)
                .collect();
            let r = dims.len();
            if rb == 1 {
                dims.remove(r - 1);
            }
            if ra == 1 {
                dims.remove(r - 2);
            }
            let name = self.out_name(node, "");
            id = chk!(self, self.g.reshape(&name, id, &dims))?;
        }
        Ok(vec![Val::T(id, Elem::F32)])
    }
}
