//! Control flow: `If` and `Loop`, whose bodies are subgraphs. Poplar programs are static, so
//! the importer resolves them to straight-line graph ops:
//!
//! - an `If` whose condition is known at import (shape arithmetic, a constant) is its taken
//!   branch, inlined;
//! - an `If` decided at run time holds both branches, as Poplar's `program::If` holds both
//!   bodies, and each output picks its branch's value element-wise (`Where(cond, then,
//!   else)`), so `tessera run` gives the taken branch's values; estimates count both
//!   branches' memory and the dearer branch's cycles (the import records the branches' graph
//!   nodes, [`tessera_sim::system::Conditional`]);
//! - a `Loop` whose trip count is known at import (and whose condition, if any, folds) is its
//!   body repeated that many times, each iteration's ops in turn (Poplar's `Repeat` of one
//!   body); its scan outputs are the iterations' values stacked on a new first axis.
//!
//! A subgraph's nodes are converted as the graph's own, its values named
//! `<node output>/<branch or iteration>/<name>` so that they do not meet the outer graph's;
//! names it does not define are the enclosing graph's (ONNX's outer scope).

use std::collections::HashMap;

use super::super::*;
use super::{Convert, Converter, Family};
use crate::onnx::proto::GraphProto;

/// An op of the family, read at `versions` by `convert`.
const fn op(op: &'static str, versions: &'static [u32], convert: Convert) -> Converter {
    Converter::new(op, Family::ControlFlow, versions, convert)
}

/// The family's ops.
pub(super) const CONVERTERS: &[Converter] = &[
    op("If", &[1, 11, 13, 16, 19, 21], |im, n| im.if_node(n)),
    op("Loop", &[1, 11, 13, 16, 19, 21], |im, n| im.loop_node(n)),
];

/// The most iterations of a `Loop` the importer repeats: each is its body's ops again. An
/// estimate: a few thousand copies of a small body are a model's worth of ops.
pub const MAX_LOOP_ITERATIONS: i64 = 4096;

impl<'a> Importer<'a> {
    /// The subgraph attribute `name` of `node`.
    fn subgraph<'n>(&self, node: &'n NodeProto, name: &str) -> R<&'n GraphProto> {
        attr(node, name)
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| self.bad(format!("the `{name}` subgraph is missing")))
    }

    /// Converts the nodes of `body` with its inputs bound to `bound` (by position), its
    /// values named under `scope`: the body's outputs, by position.
    fn run_subgraph(&mut self, body: &GraphProto, scope: &str, bound: &[Val]) -> R<Vec<Val>> {
        let (outer_node, outer_op) = (self.node.clone(), self.op.clone());
        // The body's own names, renamed under the scope; others are the outer scope's.
        let mut renamed: HashMap<String, String> = HashMap::new();
        let rename = |name: &str, renamed: &mut HashMap<String, String>| {
            let new = format!("{scope}/{name}");
            renamed.insert(name.to_string(), new.clone());
            new
        };
        if body.input.len() != bound.len() {
            return Err(self.bad(format!(
                "the subgraph `{scope}` has {} inputs; {} are given",
                body.input.len(),
                bound.len()
            )));
        }
        for (i, v) in body.input.iter().zip(bound) {
            let name = rename(i.name.as_deref().unwrap_or(""), &mut renamed);
            self.values.insert(name, v.clone());
        }
        for t in &body.initializer {
            let name = rename(t.name.as_deref().unwrap_or(""), &mut renamed);
            self.node = name.clone();
            self.op = "initializer".into();
            let v = self.tensor_value(t, &name, false)?;
            self.values.insert(name, v);
        }
        for (i, node) in body.node.iter().enumerate() {
            let mut n = node.clone();
            for input in n.input.iter_mut().filter(|s| !s.is_empty()) {
                if let Some(r) = renamed.get(input.as_str()) {
                    *input = r.clone();
                }
            }
            for output in n.output.iter_mut().filter(|s| !s.is_empty()) {
                *output = rename(output, &mut renamed);
            }
            self.node = format!("{scope}/{}", node_name(node, i));
            self.op = n.op_type.clone().unwrap_or_default();
            let outs = self.convert(&n)?;
            for (name, v) in n.output.iter().zip(outs) {
                if !name.is_empty() {
                    self.values.insert(name.clone(), v);
                }
            }
        }
        (self.node, self.op) = (outer_node, outer_op);
        body.output
            .iter()
            .map(|o| {
                let name = o.name.as_deref().unwrap_or("");
                let key = renamed.get(name).map_or(name, String::as_str);
                self.values
                    .get(key)
                    .cloned()
                    .ok_or_else(|| OnnxError::MissingTensor {
                        node: format!("{scope} (subgraph outputs)"),
                        tensor: name.to_string(),
                    })
            })
            .collect()
    }

    /// The scope of a subgraph of `node`: its first output's name and `what`.
    fn scope(&self, node: &NodeProto, what: &str) -> String {
        format!("{}/{what}", self.output_base(node))
    }

    /// `If`: the taken branch when the condition is known at import, else both branches and
    /// a choice of each output by the condition (see the module's text).
    fn if_node(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let then_branch = self.subgraph(node, "then_branch")?;
        let else_branch = self.subgraph(node, "else_branch")?;
        if let Some(Val::C(c)) = self.opt(node, 0)? {
            let Some(cond) = c.scalar() else {
                return Err(self.bad(format!(
                    "the condition holds {} values; one expected",
                    c.len()
                )));
            };
            let (branch, what) = match cond != 0.0 {
                true => (then_branch, "then"),
                false => (else_branch, "else"),
            };
            let scope = self.scope(node, what);
            return self.run_subgraph(branch, &scope, &[]);
        }
        let cond = self.ti(node, 0)?;
        let scope = self.scope(node, "then");
        let start = self.g.len();
        let then_out = self.run_subgraph(then_branch, &scope, &[])?;
        let middle = self.g.len();
        let scope = self.scope(node, "else");
        let else_out = self.run_subgraph(else_branch, &scope, &[])?;
        self.conditionals.push(tessera_sim::system::Conditional {
            name: self.node.clone(),
            branches: [start..middle, middle..self.g.len()],
        });
        if then_out.len() != else_out.len() || then_out.len() != node.output.len() {
            return Err(self.bad(format!(
                "the branches give {} and {} outputs for the node's {}",
                then_out.len(),
                else_out.len(),
                node.output.len()
            )));
        }
        let mut out = Vec::with_capacity(then_out.len());
        for (k, (t, e)) in then_out.iter().zip(&else_out).enumerate() {
            let (dt, de) = (self.dims(t), self.dims(e));
            if dt != de {
                return Err(self.unsupported(format!(
                    "a condition computed at run time whose branches give output {k} different shapes ({dt:?} and {de:?}): Poplar's graphs are static"
                )));
            }
            let elem = self.elem(t);
            let tn = self.t(t, &format!("{scope}/then{k}"))?;
            let en = self.t(e, &format!("{scope}/else{k}"))?;
            let name = match node.output.get(k) {
                Some(o) if !o.is_empty() => self.fresh(o),
                _ => self.fresh(&format!("{}/output{k}", self.node)),
            };
            let id = chk!(self, self.g.select(&name, cond, tn, en))?;
            out.push(Val::T(id, elem));
        }
        Ok(out)
    }

    /// `Loop` with a trip count known at import: the body repeated (see the module's text).
    fn loop_node(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let body = self.subgraph(node, "body")?;
        let trips = match self.opt(node, 0)? {
            None => None,
            Some(Val::C(c)) => c.scalar().map(|v| v as i64),
            Some(_) => {
                return Err(self.unsupported(
                    "a trip count computed at run time: Poplar's repeats have a count fixed at compile time; export the model with the count fixed",
                ))
            }
        };
        let carried: Vec<Val> = (2..node.input.len())
            .map(|k| self.req(node, k))
            .collect::<R<_>>()?;
        let scans = body
            .output
            .len()
            .checked_sub(1 + carried.len())
            .ok_or_else(|| self.bad("the body has fewer outputs than the loop carries"))?;
        // A loop given a condition runs while it holds, the body computing the next one;
        // without one, the body's condition output is not read.
        let mut cond = self.opt(node, 1)?;
        let has_cond = cond.is_some();
        let mut values = carried;
        let mut stacks: Vec<Vec<Val>> = vec![Vec::new(); scans];
        let limit = trips.unwrap_or(MAX_LOOP_ITERATIONS + 1);
        let mut k = 0i64;
        while k < limit {
            match &cond {
                None => {}
                Some(Val::C(c)) if c.scalar() == Some(0.0) => break,
                Some(Val::C(_)) => {}
                Some(_) => {
                    return Err(self.unsupported(
                        "a condition computed at run time: Poplar's repeats have a count fixed at compile time",
                    ))
                }
            }
            if k >= MAX_LOOP_ITERATIONS {
                return Err(self.unsupported(format!(
                    "more than {MAX_LOOP_ITERATIONS} iterations (each is its body's ops again)"
                )));
            }
            let iteration = Val::C(Rc::new(Const::new(vec![], Elem::I64, vec![k as f64], true)));
            let cond_in = cond.clone().unwrap_or_else(|| {
                Val::C(Rc::new(Const::new(vec![], Elem::Bool, vec![1.0], true)))
            });
            let mut bound = vec![iteration, cond_in];
            bound.extend(values.iter().cloned());
            let scope = self.scope(node, &format!("iteration{k}"));
            let out = self.run_subgraph(body, &scope, &bound)?;
            cond = Some(out[0].clone()).filter(|_| has_cond);
            values = out[1..1 + values.len()].to_vec();
            for (s, v) in stacks.iter_mut().zip(&out[1 + values.len()..]) {
                s.push(v.clone());
            }
            k += 1;
        }
        let mut outs = values;
        for (j, s) in stacks.into_iter().enumerate() {
            outs.push(self.stack(node, j, s)?);
        }
        Ok(outs)
    }

    /// The values of scan output `j` of every iteration stacked on a new first axis.
    fn stack(&mut self, node: &NodeProto, j: usize, values: Vec<Val>) -> R<Val> {
        let Some(first) = values.first() else {
            return Err(self.unsupported(format!(
                "scan output {j} of a loop that runs no iteration (an empty tensor)"
            )));
        };
        let (dims, elem) = (self.dims(first), self.elem(first));
        if let Some(consts) = values
            .iter()
            .map(|v| match v {
                Val::C(c) => Some(c.clone()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
        {
            let mut stacked = vec![values.len()];
            stacked.extend(&dims);
            let data = consts.iter().flat_map(|c| c.data.iter().copied()).collect();
            return Ok(Val::C(Rc::new(Const::new(stacked, elem, data, true))));
        }
        let mut one = vec![1];
        one.extend(&dims);
        let mut parts = Vec::with_capacity(values.len());
        for (k, v) in values.iter().enumerate() {
            let x = self.t(v, &format!("{}/scan{j}_{k}", self.node))?;
            let name = self.out_name(node, &format!("scan{j}_{k}"));
            parts.push(chk!(self, self.g.reshape(&name, x, &one))?);
        }
        // Joined pairwise, level by level: each element is copied about log2(n) times.
        while parts.len() > 1 {
            let mut next = Vec::with_capacity(parts.len().div_ceil(2));
            for pair in parts.chunks(2) {
                next.push(match *pair {
                    [a, b] => {
                        let name = self.out_name(node, &format!("scan{j}"));
                        chk!(self, self.g.concat_axis(&name, a, b, 0))?
                    }
                    [a] => a,
                    _ => unreachable!("chunks of two"),
                });
            }
            parts = next;
        }
        Ok(Val::T(parts[0], elem))
    }
}
