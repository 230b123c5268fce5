//! `Einsum`: contractions written as an equation, as batched matrix products.
//!
//! Operands are contracted pairwise, left to right. Of each pair, a label of one operand
//! alone that nothing later reads is summed first; the labels of both operands that later
//! operands or the output read are the product's batch axes, those nothing reads are summed
//! by the product, and the rest are its rows and columns: each operand is transposed to
//! `[batch, rows, summed]` / `[batch, summed, columns]`, viewed as three blocks, multiplied,
//! and viewed back. The result is summed over what the output leaves out and transposed to the
//! output's order. An ellipsis stands for the same trailing-aligned axes in every term (numpy's
//! broadcasting). Repeated labels within one term (diagonals) are refused.

use super::super::*;
use super::{Convert, Converter, Family};

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::LinearAlgebra, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[op("Einsum", &[12], |im, n| im.einsum(n))];

/// A label: a letter, or an axis an ellipsis stands for (`ELLIPSIS + k`, `k` counted from
/// the right).
type Label = u32;

/// Labels of the axes an ellipsis stands for.
const ELLIPSIS: Label = 1 << 16;

/// The terms of an equation: each input's labels, and the output's.
#[derive(Clone, Debug, PartialEq)]
struct Equation {
    inputs: Vec<Vec<Label>>,
    output: Vec<Label>,
}

/// One term's labels, an ellipsis standing for `rank - (letters)` axes.
fn term(t: &str, rank: Option<usize>, widest: usize) -> Result<Vec<Label>, String> {
    let letters = t.replace("...", "");
    if letters.chars().any(|c| !c.is_ascii_alphabetic()) {
        return Err(format!(
            "term {t:?} has a character other than letters and `...`"
        ));
    }
    let n = t.matches("...").count();
    if n > 1 {
        return Err(format!("term {t:?} has more than one ellipsis"));
    }
    let dots = match (n, rank) {
        (0, _) => 0,
        (_, Some(r)) => r
            .checked_sub(letters.len())
            .ok_or_else(|| format!("term {t:?} has more labels than its operand's {r} axes"))?,
        (_, None) => widest,
    };
    let mut out = Vec::new();
    let (before, after) = t.split_once("...").unwrap_or((t, ""));
    out.extend(before.bytes().map(Label::from));
    out.extend((0..dots).rev().map(|k| ELLIPSIS + k as Label));
    out.extend(after.bytes().map(Label::from));
    if n == 0 && rank.is_some_and(|r| r != out.len()) {
        return Err(format!(
            "term {t:?} has {} labels for an operand of {} axes",
            out.len(),
            rank.unwrap_or(0)
        ));
    }
    Ok(out)
}

/// Parses `equation` for operands of `ranks`.
fn parse(equation: &str, ranks: &[usize]) -> Result<Equation, String> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!(
            "{} terms for {} operands",
            terms.len(),
            ranks.len()
        ));
    }
    let inputs: Vec<Vec<Label>> = terms
        .iter()
        .zip(ranks)
        .map(|(t, &r)| term(t, Some(r), 0))
        .collect::<Result<_, _>>()?;
    let widest = inputs
        .iter()
        .flat_map(|t| {
            t.iter()
                .filter(|&&l| l >= ELLIPSIS)
                .map(|&l| l - ELLIPSIS + 1)
        })
        .max()
        .unwrap_or(0) as usize;
    let output = match rhs {
        Some(r) => term(r, None, widest)?,
        None => {
            // Implicit: the ellipsis's axes, then the labels used once, in order.
            let mut out: Vec<Label> = (0..widest).rev().map(|k| ELLIPSIS + k as Label).collect();
            let mut once: Vec<Label> = inputs
                .iter()
                .flatten()
                .copied()
                .filter(|&l| l < ELLIPSIS)
                .filter(|l| inputs.iter().flatten().filter(|&m| m == l).count() == 1)
                .collect();
            once.sort_unstable();
            out.extend(once);
            out
        }
    };
    for t in inputs.iter().chain(std::iter::once(&output)) {
        if (1..t.len()).any(|i| t[..i].contains(&t[i])) {
            return Err("a label repeated within a term (a diagonal)".into());
        }
    }
    if let Some(l) = output
        .iter()
        .find(|l| **l < ELLIPSIS && !inputs.iter().flatten().any(|m| m == *l))
    {
        return Err(format!(
            "output label {:?} is in no input",
            *l as u8 as char
        ));
    }
    Ok(Equation { inputs, output })
}

/// An operand during the contraction: its node, labels and dims.
#[derive(Clone, Debug)]
struct Operand {
    id: NodeId,
    labels: Vec<Label>,
    dims: Vec<usize>,
}

impl<'a> Importer<'a> {
    fn einsum(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let equation = self
            .attr_s(node, "equation")
            .ok_or_else(|| self.bad("the equation attribute is required"))?;
        let mut ops = Vec::with_capacity(node.input.len());
        for k in 0..node.input.len() {
            let v = self.req(node, k)?;
            if !self.elem(&v).is_float() {
                return Err(self.unsupported(format!("a {:?} operand", self.elem(&v))));
            }
            let dims = self.dims(&v);
            let id = self.ti(node, k)?;
            ops.push((id, dims));
        }
        if ops.is_empty() {
            return Err(self.bad("no operands"));
        }
        let ranks: Vec<usize> = ops.iter().map(|o| o.1.len()).collect();
        let eq = parse(&equation, &ranks)
            .map_err(|e| self.bad(format!("equation {equation:?}: {e}")))?;
        let mut operands: Vec<Operand> = ops
            .into_iter()
            .zip(&eq.inputs)
            .map(|((id, dims), labels)| Operand {
                id,
                labels: labels.clone(),
                dims,
            })
            .collect();
        let mut acc = operands.remove(0);
        for (k, b) in operands.iter().enumerate() {
            // Labels read after this pair: by later operands or the output.
            let later: Vec<Label> = operands[k + 1..]
                .iter()
                .flat_map(|o| o.labels.iter().copied())
                .chain(eq.output.iter().copied())
                .collect();
            acc = self.contract(node, k, acc, b.clone(), &later)?;
        }
        let out = self.sum_out(node, "result", acc, &eq.output)?;
        let perm: Vec<usize> = eq
            .output
            .iter()
            .map(|l| out.labels.iter().position(|m| m == l))
            .collect::<Option<_>>()
            .ok_or_else(|| self.bad(format!("equation {equation:?}: an output label is lost")))?;
        let name = self.out_name(node, "");
        let id = if perm.iter().enumerate().all(|(i, &p)| i == p) {
            chk!(self, self.g.unary(&name, out.id, UnaryFn::Identity))?
        } else {
            chk!(self, self.g.transpose(&name, out.id, &perm))?
        };
        Ok(vec![Val::T(id, Elem::F32)])
    }

    /// `x` summed over its labels that `keep` does not hold.
    fn sum_out(&mut self, node: &NodeProto, what: &str, x: Operand, keep: &[Label]) -> R<Operand> {
        let axes: Vec<isize> = (0..x.labels.len())
            .filter(|&i| !keep.contains(&x.labels[i]))
            .map(|i| i as isize)
            .collect();
        if axes.is_empty() {
            return Ok(x);
        }
        let name = self.out_name(node, &format!("{what}_summed"));
        let id = chk!(
            self,
            self.g.reduce(&name, x.id, &axes, false, ReduceKind::Sum)
        )?;
        let kept: Vec<usize> = (0..x.labels.len())
            .filter(|i| !axes.contains(&(*i as isize)))
            .collect();
        Ok(Operand {
            id,
            labels: kept.iter().map(|&i| x.labels[i]).collect(),
            dims: kept.iter().map(|&i| x.dims[i]).collect(),
        })
    }

    /// `x` with its axes in the order of `labels`, viewed as `dims`.
    fn arrange(
        &mut self,
        node: &NodeProto,
        what: &str,
        x: &Operand,
        labels: &[Label],
        dims: &[usize],
    ) -> R<NodeId> {
        let perm: Vec<usize> = labels
            .iter()
            .map(|l| x.labels.iter().position(|m| m == l).unwrap_or(0))
            .collect();
        let mut id = x.id;
        if perm.iter().enumerate().any(|(i, &p)| i != p) {
            let name = self.out_name(node, &format!("{what}_transposed"));
            id = chk!(self, self.g.transpose(&name, id, &perm))?;
        }
        let name = self.out_name(node, &format!("{what}_blocks"));
        chk!(self, self.g.reshape(&name, id, dims))
    }

    /// Operands `a` and `b` contracted (pair `k`), keeping the labels `later` reads.
    fn contract(
        &mut self,
        node: &NodeProto,
        k: usize,
        a: Operand,
        b: Operand,
        later: &[Label],
    ) -> R<Operand> {
        let keep_a: Vec<Label> = later.iter().chain(&b.labels).copied().collect();
        let keep_b: Vec<Label> = later.iter().chain(&a.labels).copied().collect();
        let a = self.sum_out(node, &format!("pair{k}_a"), a, &keep_a)?;
        let b = self.sum_out(node, &format!("pair{k}_b"), b, &keep_b)?;
        let size = |o: &Operand, l: Label| o.labels.iter().position(|&m| m == l).map(|i| o.dims[i]);
        let (mut batch, mut summed, mut rows, mut cols) = (vec![], vec![], vec![], vec![]);
        for &l in &a.labels {
            match (size(&b, l), later.contains(&l)) {
                (Some(_), true) => batch.push(l),
                (Some(_), false) => summed.push(l),
                (None, _) => rows.push(l),
            }
        }
        cols.extend(b.labels.iter().copied().filter(|l| !a.labels.contains(l)));
        for &l in &summed {
            if size(&a, l) != size(&b, l) {
                return Err(self.bad(format!(
                    "label {:?} is summed over {:?} and {:?} elements",
                    l as u8 as char,
                    size(&a, l),
                    size(&b, l)
                )));
            }
        }
        let prod = |o: &Operand, ls: &[Label]| {
            ls.iter()
                .map(|&l| size(o, l).unwrap_or(1))
                .product::<usize>()
        };
        let bdims_a: Vec<usize> = batch.iter().map(|&l| size(&a, l).unwrap_or(1)).collect();
        let bdims_b: Vec<usize> = batch.iter().map(|&l| size(&b, l).unwrap_or(1)).collect();
        let (m, s, n) = (prod(&a, &rows), prod(&a, &summed), prod(&b, &cols));
        let la: Vec<Label> = batch.iter().chain(&rows).chain(&summed).copied().collect();
        let lb: Vec<Label> = batch.iter().chain(&summed).chain(&cols).copied().collect();
        let da: Vec<usize> = bdims_a.iter().copied().chain([m, s]).collect();
        let db: Vec<usize> = bdims_b.iter().copied().chain([s, n]).collect();
        let xa = self.arrange(node, &format!("pair{k}_a"), &a, &la, &da)?;
        let xb = self.arrange(node, &format!("pair{k}_b"), &b, &lb, &db)?;
        let name = self.out_name(node, &format!("pair{k}_product"));
        let p = chk!(self, self.g.matmul(&name, xa, xb))?;
        let bdims: Vec<usize> = bdims_a
            .iter()
            .zip(&bdims_b)
            .map(|(&x, &y)| x.max(y))
            .collect();
        let dims: Vec<usize> = bdims
            .iter()
            .copied()
            .chain(rows.iter().map(|&l| size(&a, l).unwrap_or(1)))
            .chain(cols.iter().map(|&l| size(&b, l).unwrap_or(1)))
            .collect();
        let name = self.out_name(node, &format!("pair{k}"));
        let id = chk!(self, self.g.reshape(&name, p, &dims))?;
        Ok(Operand {
            id,
            labels: batch.iter().chain(&rows).chain(&cols).copied().collect(),
            dims,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> Vec<Label> {
        s.bytes().map(Label::from).collect()
    }

    #[test]
    fn equations_parse_with_ellipses_and_implicit_outputs() {
        let e = parse("ij,jk->ik", &[2, 2]).unwrap();
        assert_eq!(e.inputs, vec![l("ij"), l("jk")]);
        assert_eq!(e.output, l("ik"));
        // Implicit: the labels used once, in alphabetical order.
        assert_eq!(parse("ba,ac", &[2, 2]).unwrap().output, l("bc"));
        // An ellipsis stands for the leading axes, aligned from the right.
        let e = parse("...qd,...kd->...qk", &[4, 3]).unwrap();
        assert_eq!(e.inputs[0][..2], [ELLIPSIS + 1, ELLIPSIS]);
        assert_eq!(e.inputs[1][0], ELLIPSIS);
        assert_eq!(e.output[..2], [ELLIPSIS + 1, ELLIPSIS]);
        assert!(parse("ii->i", &[2]).is_err());
        assert!(parse("ij,jk->il", &[2, 2]).is_err());
        assert!(parse("ijk->i", &[2]).is_err());
    }
}
