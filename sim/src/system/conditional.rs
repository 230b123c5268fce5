//! Conditionals decided at run time. Poplar's `program::If` holds both of its bodies, so
//! memory holds both branches, but a step runs one: the estimate assumes the dearer branch of
//! each (the worst case, the time a step can take) and leaves the other's compute sets out of
//! the cycles. A branch's cost is its forward nodes' and the backward nodes their gradient
//! rules made ([`tessera_core::Node::origin`]), summed over every stage, per micro-batch.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use tessera_core::{Graph, Storage};

/// A conditional whose condition is computed at run time: the forward graph nodes (index
/// ranges) of its two branches, `[then, else]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conditional {
    /// The node that holds it (an ONNX `If`).
    pub name: String,
    /// The forward graph nodes of the then branch and of the else branch.
    pub branches: [Range<usize>; 2],
}

/// Which branch of a [`Conditional`] the cycles assume, and what each costs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionalCost {
    /// The node that holds it.
    pub name: String,
    /// The branch the cycles assume: `then` or `else`, the dearer.
    pub assumed: String,
    /// Cycles per micro-batch of the then branch (forward and backward, every stage).
    pub then_cycles: u64,
    /// Cycles per micro-batch of the else branch.
    pub else_cycles: u64,
}

/// The branch names, in [`Conditional::branches`] order.
const BRANCHES: [&str; 2] = ["then", "else"];

/// The nodes whose cycles a step does not spend (those of each conditional's cheaper branch),
/// and each conditional's choice, in `conditionals` order. `cycles(i)` is node `i`'s cycles
/// per micro-batch. A conditional nested in another's branch is chosen first, so the outer
/// one's branches count only what the inner one assumed.
pub(super) fn untaken<S: Storage>(
    g: &Graph<S>,
    conditionals: &[Conditional],
    cycles: impl Fn(usize) -> u64,
) -> (Vec<bool>, Vec<ConditionalCost>) {
    let mut skip = vec![false; g.len()];
    if conditionals.is_empty() {
        return (skip, Vec::new());
    }
    let forward_len = g.forward_len();
    // The forward node each node is charged to: itself, or its gradient rule's node.
    let forward_of: Vec<Option<usize>> = g
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| match n.origin() {
            _ if i < forward_len => Some(i),
            Some(o) => Some(o.index()),
            None => None,
        })
        .collect();
    let mut order: Vec<usize> = (0..conditionals.len()).collect();
    order.sort_by_key(|&c| {
        conditionals[c]
            .branches
            .iter()
            .map(Range::len)
            .sum::<usize>()
    });
    let mut costs: Vec<Option<ConditionalCost>> = vec![None; conditionals.len()];
    for c in order {
        let cond = &conditionals[c];
        let side = |i: usize| {
            let f = forward_of[i]?;
            cond.branches.iter().position(|b| b.contains(&f))
        };
        let mut totals = [0u64; 2];
        for i in (0..g.len()).filter(|&i| !skip[i]) {
            if let Some(b) = side(i) {
                totals[b] = totals[b].saturating_add(cycles(i));
            }
        }
        let assumed = usize::from(totals[1] > totals[0]);
        for (i, s) in skip.iter_mut().enumerate() {
            if side(i).is_some_and(|b| b != assumed) {
                *s = true;
            }
        }
        costs[c] = Some(ConditionalCost {
            name: cond.name.clone(),
            assumed: BRANCHES[assumed].to_string(),
            then_cycles: totals[0],
            else_cycles: totals[1],
        });
    }
    (skip, costs.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Heap;
    use tessera_core::{DType, Graph};

    /// `x -> then: a, b; else: c -> select`, as an importer builds a run-time If.
    fn graph() -> Graph<Heap> {
        let mut g = Graph::<Heap>::new();
        let x = g.input("x", &[4], DType::F32).unwrap();
        let a = g.relu("a", x).unwrap();
        let b = g.relu("b", a).unwrap();
        let c = g.relu("c", x).unwrap();
        let s = g.add("s", b, c).unwrap();
        g.mark_output(s).unwrap();
        g
    }

    fn cond() -> Conditional {
        Conditional {
            name: "if".into(),
            branches: [1..3, 3..4],
        }
    }

    #[test]
    fn the_dearer_branch_is_assumed_and_the_other_skipped() {
        let g = graph();
        let (skip, costs) = untaken(&g, &[cond()], |_| 10);
        assert_eq!(skip, [false, false, false, true, false]);
        assert_eq!(costs[0].assumed, "then");
        assert_eq!((costs[0].then_cycles, costs[0].else_cycles), (20, 10));
        let (skip, costs) = untaken(&g, &[cond()], |i| if i == 3 { 50 } else { 10 });
        assert_eq!(skip, [false, true, true, false, false]);
        assert_eq!(costs[0].assumed, "else");
    }

    #[test]
    fn an_inner_conditional_is_chosen_first() {
        let g = graph();
        let inner = Conditional {
            name: "inner".into(),
            branches: [1..2, 2..3],
        };
        // Inner: a (5) against b (30) keeps b; outer: then is b (30) against c (20).
        let cost = |i: usize| [0, 5, 30, 20, 0][i];
        let (skip, costs) = untaken(&g, &[cond(), inner], cost);
        assert_eq!(skip, [false, true, false, true, false]);
        assert_eq!(costs[0].name, "if");
        assert_eq!((costs[0].then_cycles, costs[0].else_cycles), (30, 20));
        assert_eq!(costs[1].assumed, "else");
    }

    #[test]
    fn without_conditionals_nothing_is_skipped() {
        let g = graph();
        let (skip, costs) = untaken(&g, &[], |_| 1);
        assert!(skip.iter().all(|s| !s) && costs.is_empty());
    }
}
