//! Outlining (code reuse): identical nodes share one copy of their code, as Poplar's
//! functions do.
//!
//! PopART outlines repeated subgraphs into `poplar::Function`s (`enableOutlining`, on by
//! default; `willow/src/popx/op/callx.cpp`), TensorFlow caches identical computations and
//! pipeline stages as functions (`DeferredVisitor::GetFunctionCall`, `graph_caching`), and
//! poputil's `graphfn` does the same for poplibs users (`lib/poputil/GraphFunction.cpp`). A
//! function's body - its compute sets with their vertex state, its exchanges with their
//! exchange code, its control code - is in memory once; each call copies the caller's
//! tensors into the body's parameters and the results back out, and runs a call
//! instruction.
//!
//! Here a node is outlined when another node on its IPU lowers identically (the same memo
//! key: op, shapes, types and operand layouts; identical nodes already share their
//! layouts, see `memo`). The first such node holds the body's code; the code of the others'
//! steps is shared (`Program::shared_steps`). Consecutive outlined nodes form one call, as
//! PopART outlines a whole repeated layer rather than each op; a call ends where its next
//! node's body is already in it (the next repeat of the layer begins). Each call copies in
//! the tensors its nodes read from before it (weights and other state aside: read-only,
//! they are passed by reference, as TensorFlow's reusable stage functions pass read-only
//! inputs) and copies out the tensors read after it: on-tile copies into clones laid out as
//! the originals, which live through the call.

use tessera_core::{NodeId, Op, Storage};

use super::Lowering;
use crate::cost::UnaryKind;
use crate::program::{
    compress, Codelet, ComputeSet, Region, TensorId, TileId, Vertex, VertexCost,
    VERTEX_STATE_PER_WRITE_BYTES,
};

/// PopART's `outlineThreshold` default (`SessionOptions`): the least value, copies taken
/// off, of an outlined section.
pub const OUTLINE_THRESHOLD: f64 = 1.0;
/// PopART's `Op::getHighSubgraphValue` (matmuls, convolutions, normalisations): the value
/// of outlining such an op, per square root of its input bytes.
pub const HIGH_SUBGRAPH_VALUE: f64 = 1000.0;
/// PopART's `Op::getLowSubgraphValue` (element-wise ops, softmax and the rest).
pub const LOW_SUBGRAPH_VALUE: f64 = 0.1;

/// The value PopART's outliner gives an op (`getSubgraphValue`): high for the ops whose code
/// is large (matmuls, convolutions, normalisations), low for the rest.
fn subgraph_value(op: &Op) -> f64 {
    if matches!(op, Op::MatMul(_) | Op::Conv(_) | Op::Norm(_)) {
        HIGH_SUBGRAPH_VALUE
    } else {
        LOW_SUBGRAPH_VALUE
    }
}

/// One call of an outlined body: graph nodes `first ..= last` (on this IPU), the tensors it
/// copies in and those it copies out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Call {
    pub(super) first: usize,
    pub(super) last: usize,
    pub(super) inputs: Vec<NodeId>,
    pub(super) outputs: Vec<NodeId>,
}

/// What outlining does to a lowering: which nodes' code is an earlier node's, and the calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Outline {
    /// Per graph node: its code is held by an earlier identical node's body.
    pub(super) shared: Vec<bool>,
    /// The calls, by first node.
    pub(super) calls: Vec<Call>,
}

/// The outlining of the nodes `l` includes, from each node's memo key (`None`: never
/// identical to another node).
pub(super) fn outline<S: Storage>(l: &Lowering<'_, S>, keys: &[Option<u128>]) -> Outline {
    let (graph, plan) = (l.graph, l.plan);
    let n = graph.len();
    let mut count: std::collections::HashMap<u128, u32> = std::collections::HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        if let (true, Some(k)) = (l.include[i], k) {
            *count.entry(*k).or_default() += 1;
        }
    }
    let outlined =
        |i: usize| l.include[i] && keys[i].is_some_and(|k| count.get(&k).is_some_and(|&c| c > 1));
    let view = |i: usize| plan.slots()[i].view_of.is_some();
    let last_reader = last_readers(l);
    let mut out = Outline {
        shared: vec![false; n],
        calls: Vec::new(),
    };
    let mut seen: std::collections::HashSet<u128> = std::collections::HashSet::new();
    // Repeated layers first: each instance of a run of identical consecutive sequences (the
    // layers of a stage, their backward passes, their updates) is one call, as PopART's
    // outliner picks the most valuable repeated sequences (a whole layer) before smaller ones.
    // Variables, inputs and views lower to no code: they neither break nor make a repeat.
    // A normalisation's moments (never memoised: they read the normalisation's statistics)
    // are the same in every repeat of a layer; they do not break one either.
    let codeless = |i: usize| {
        let op = graph.nodes()[i].op();
        view(i)
            || op.is_state()
            || matches!(
                op,
                Op::Input | Op::Norm(tessera_core::ops::norm::Norm::Moment { .. })
            )
    };
    let sequence: Vec<(usize, u128)> = (0..n)
        .filter(|&i| l.include[i] && !codeless(i))
        .map(|i| {
            let k = match keys[i] {
                Some(k) if outlined(i) => k,
                // Never equal to another node's.
                _ => u128::MAX - i as u128,
            };
            (i, k)
        })
        .collect();
    // (first, last, whole layer): a whole layer's call holds every node in its range.
    let (mut runs, in_layer, repeats) = layer_runs(&sequence, n);
    // The open call: its first node, last outlined node and the keys in it.
    let mut open: Option<(usize, usize, std::collections::HashSet<u128>)> = None;
    for (i, key) in keys.iter().enumerate().take(n) {
        if !l.include[i] {
            continue;
        }
        if in_layer[i] {
            if let Some(k) = key.filter(|_| outlined(i)) {
                out.shared[i] = !seen.insert(k);
            }
            if let Some((a, b, _)) = open.take() {
                runs.push((a, b, false));
            }
            continue;
        }
        if !outlined(i) {
            if view(i) {
                continue;
            }
            if let Some((a, b, _)) = open.take() {
                runs.push((a, b, false));
            }
            continue;
        }
        let k = key.unwrap_or_default();
        out.shared[i] = !seen.insert(k);
        match &mut open {
            Some((_, b, ks)) if !ks.contains(&k) => {
                *b = i;
                ks.insert(k);
            }
            _ => {
                if let Some((a, b, _)) = open.take() {
                    runs.push((a, b, false));
                }
                open = Some((i, i, std::collections::HashSet::from([k])));
            }
        }
    }
    if let Some((a, b, _)) = open.take() {
        runs.push((a, b, false));
    }
    for &(first, last) in &repeats {
        for i in first..=last {
            let op = graph.nodes()[i].op();
            if l.include[i] && !op.is_state() && !matches!(op, Op::Input) {
                out.shared[i] = true;
            }
        }
    }
    runs.sort_unstable();
    for (first, last, whole) in runs {
        let member = |i: usize| {
            (first..=last).contains(&i) && l.include[i] && (whole || outlined(i) || view(i))
        };
        match call(l, (first, last), &member, &view, &last_reader) {
            Some(c) => out.calls.push(c),
            None => (first..=last).for_each(|i| out.shared[i] = false),
        }
    }
    out
}

/// The call of the nodes `first..=last` that are `member`s: its inputs (what its members read
/// from outside, state aside) and outputs (what is read after it), if it is worth a call.
fn call<S: Storage>(
    l: &Lowering<'_, S>,
    (first, last): (usize, usize),
    member: &dyn Fn(usize) -> bool,
    view: &dyn Fn(usize) -> bool,
    last_reader: &[usize],
) -> Option<Call> {
    let (graph, plan) = (l.graph, l.plan);
    let mut inputs: Vec<NodeId> = Vec::new();
    let mut outputs: Vec<NodeId> = Vec::new();
    for i in (first..=last).filter(|&i| member(i)) {
        for &o in graph.nodes()[i].op().operands().as_slice() {
            let r = plan.storage_of(o);
            if !member(r.index()) && !graph.nodes()[r.index()].op().is_state() {
                inputs.push(r);
            }
        }
        if !view(i) && last_reader[i] > last && !graph.nodes()[i].op().is_state() {
            outputs.push(NodeId::from_index(i as u32));
        }
    }
    inputs.sort_unstable();
    inputs.dedup();
    // PopART's outliner keeps a section whose value passes `outlineThreshold` (1.0):
    // each op is worth its subgraph value times the square root of its input bytes,
    // each copy in or out costs the square root of its bytes
    // (`willow/src/subgraph/iosubgraphcostmodel.cpp`).
    let bytes = |x: NodeId| graph.nodes()[x.index()].bytes() as f64;
    let value: f64 = (first..=last)
        .filter(|&i| member(i) && !view(i))
        .map(|i| {
            let node = &graph.nodes()[i];
            let in_bytes: f64 = node
                .op()
                .operands()
                .as_slice()
                .iter()
                .map(|&o| bytes(o))
                .sum();
            subgraph_value(node.op()) * in_bytes.sqrt()
        })
        .sum();
    let copies: f64 = inputs
        .iter()
        .chain(&outputs)
        .map(|&x| bytes(x).sqrt())
        .sum();
    if value - copies < OUTLINE_THRESHOLD {
        return None;
    }
    Some(Call {
        first,
        last,
        inputs,
        outputs,
    })
}

/// The last node reading each tensor (by its storage root).
fn last_readers<S: Storage>(l: &Lowering<'_, S>) -> Vec<usize> {
    let mut last_reader = vec![0usize; l.graph.len()];
    for (c, node) in l.graph.nodes().iter().enumerate() {
        for &o in node.op().operands().as_slice() {
            let r = l.plan.storage_of(o).index();
            last_reader[r] = last_reader[r].max(c);
        }
    }
    last_reader
}

/// The repeated layers of `sequence` ((node, key) of the `n` nodes' code): each instance a
/// whole-layer run (first, last, true); which nodes are in one; and the second and later
/// repeats of each layer, all of whose code is the first's.
#[allow(clippy::type_complexity)]
fn layer_runs(
    sequence: &[(usize, u128)],
    n: usize,
) -> (Vec<(usize, usize, bool)>, Vec<bool>, Vec<(usize, usize)>) {
    let mut runs: Vec<(usize, usize, bool)> = Vec::new();
    let mut in_layer = vec![false; n];
    let mut repeats: Vec<(usize, usize)> = Vec::new();
    for (start, len, reps) in repeated_layers(&sequence.iter().map(|&(_, k)| k).collect::<Vec<_>>())
    {
        for r in 0..reps {
            let (a, b) = (start + r * len, start + (r + 1) * len - 1);
            let (first, last) = (sequence[a].0, sequence[b].0);
            runs.push((first, last, true));
            in_layer[first..=last].iter_mut().for_each(|x| *x = true);
            if r > 0 {
                repeats.push((first, last));
            }
        }
    }
    (runs, in_layer, repeats)
}

/// The least nodes in a repeated layer: shorter repeats (an op and its twin) are left to the
/// node-by-node calls.
const MIN_LAYER_NODES: usize = 2;

/// Runs of identical consecutive sequences in `keys`: `(start, length, repeats)`, repeats at
/// least 2, not overlapping. Each position's longest-covering run is found (a sequence and
/// its repeats that follow it); runs are then taken by the nodes they cover, most first, as
/// PopART's outliner takes the most valuable repeated sequences first
/// (`willow/src/subgraph/outliner.cpp`).
fn repeated_layers(keys: &[u128]) -> Vec<(usize, usize, usize)> {
    let m = keys.len();
    // Where each key occurs, in order.
    let mut at: std::collections::HashMap<u128, Vec<usize>> = std::collections::HashMap::new();
    for (p, &k) in keys.iter().enumerate() {
        at.entry(k).or_default().push(p);
    }
    // Polynomial prefix hashes for O(1) comparison of two windows (verified when equal).
    const BASE: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut prefix = vec![0u64; m + 1];
    let mut power = vec![1u64; m + 1];
    for p in 0..m {
        let k = keys[p];
        let h = (k as u64) ^ ((k >> 64) as u64).rotate_left(17);
        prefix[p + 1] = prefix[p].wrapping_mul(BASE).wrapping_add(h);
        power[p + 1] = power[p].wrapping_mul(BASE);
    }
    let hash =
        |a: usize, len: usize| prefix[a + len].wrapping_sub(prefix[a].wrapping_mul(power[len]));
    let same = |a: usize, b: usize, len: usize| {
        hash(a, len) == hash(b, len) && keys[a..a + len] == keys[b..b + len]
    };
    let mut candidates: Vec<(usize, usize, usize)> = Vec::new();
    for i in 0..m {
        let mut best: Option<(usize, usize)> = None;
        for &j in at[&keys[i]].iter().filter(|&&j| j > i) {
            let len = j - i;
            if i + 2 * len > m {
                break;
            }
            if len < MIN_LAYER_NODES || !same(i, j, len) {
                continue;
            }
            let mut reps = 2;
            while i + (reps + 1) * len <= m && same(i, i + reps * len, len) {
                reps += 1;
            }
            if best.is_none_or(|(bl, br)| len * reps > bl * br) {
                best = Some((len, reps));
            }
        }
        if let Some((len, reps)) = best {
            candidates.push((i, len, reps));
        }
    }
    // Most nodes covered first; on a tie, the earlier start, then the longer sequence.
    candidates
        .sort_by_key(|&(i, len, reps)| (std::cmp::Reverse(len * reps), i, std::cmp::Reverse(len)));
    let mut taken = vec![false; m];
    let mut out = Vec::new();
    for (i, len, reps) in candidates {
        if taken[i..i + len * reps].iter().any(|&t| t) {
            continue;
        }
        taken[i..i + len * reps].iter_mut().for_each(|t| *t = true);
        out.push((i, len, reps));
    }
    out.sort_unstable();
    out
}

impl<S: Storage> Lowering<'_, S> {
    /// The on-tile copies of `tensors` into the body's parameters (clones laid out as they
    /// are), as node `at`'s `phase`: one compute set for all of them (a call's copies run as
    /// one program), with one copy vertex on each tile over every tensor's intervals there
    /// (joined into strided regions), its cycles those of copying each tensor's share in
    /// turn. Nothing moves between tiles, so no exchange precedes it. The clones are not
    /// program tensors: their bytes are each tensor's on its tiles, counted while they live
    /// (`Program::call_clones`). Returns the tensors copied.
    pub(super) fn call_copies(
        &mut self,
        at: NodeId,
        phase: &str,
        tensors: &[NodeId],
    ) -> Vec<TensorId> {
        let cfg = self.cfg;
        let mut copied: Vec<TensorId> = tensors.iter().map(|&x| self.t(x)).collect();
        copied.sort_unstable();
        copied.dedup();
        copied.retain(|t| self.tensors[t.index()].elements > 0);
        if copied.is_empty() {
            return copied;
        }
        let estimate_only = self.summaries.is_some();
        let tiles = cfg.tiles as usize;
        // Per tile: cycles, regions (joined runs) and, for a full lowering, the regions.
        let mut cycles = vec![0u64; tiles];
        let mut regions = vec![0u64; tiles];
        let mut spans: Vec<Vec<Region>> = if estimate_only {
            Vec::new()
        } else {
            vec![Vec::new(); tiles]
        };
        for &xt in &copied {
            let t = &self.tensors[xt.index()];
            // Each tile's spans of this tensor join into the runs `compress` makes of them.
            for &(tile, n, joined) in t.mapping.regions_per_tile() {
                let k = tile.index();
                regions[k] += joined;
                cycles[k] += UnaryKind::Copy.cycles(cfg, n, t.dtype);
            }
            if !estimate_only {
                for iv in t.mapping.intervals() {
                    spans[iv.tile.index()].push(Region::span(xt, iv.start, iv.len));
                }
            }
        }
        let name = format!("{}/{phase}", self.node(at).name());
        if estimate_only {
            // What `Vertex::state_bytes` counts of each tile's vertex (its regions read and
            // written, once each), without making it.
            let costs: std::sync::Arc<[VertexCost]> = (0..tiles)
                .filter(|&k| cycles[k] > 0)
                .map(|k| VertexCost {
                    tile: TileId(k as u32),
                    codelet: Codelet::Copy,
                    cycles: cycles[k],
                    state_bytes: VERTEX_STATE_PER_WRITE_BYTES * regions[k],
                })
                .collect();
            self.push_compute(ComputeSet {
                name,
                node: at,
                vertices: Vec::new(),
                costs,
                touched: copied.clone(),
            });
        } else {
            // The copy reads the tensors and writes their clones, laid out alike: its cost
            // and fields are those of writing the same regions.
            let vertices: Vec<Vertex> = spans
                .into_iter()
                .enumerate()
                .filter(|(k, _)| cycles[*k] > 0)
                .map(|(k, on_tile)| {
                    let joined = compress(on_tile);
                    debug_assert_eq!(joined.len() as u64, regions[k]);
                    Vertex {
                        tile: TileId(k as u32),
                        codelet: Codelet::Copy,
                        cycles: cycles[k],
                        reads: joined.clone(),
                        writes: joined,
                    }
                })
                .collect();
            self.local_compute(at, phase, vertices);
        }
        copied
    }
}

#[cfg(test)]
mod tests {
    use super::repeated_layers;

    #[test]
    fn a_whole_repeated_layer_is_taken_before_the_repeats_inside_it() {
        // A stem, then three layers `A B A C` (an op repeated inside each layer, as a ReLU
        // after each of a block's normalisations), then a head.
        let (s, a, b, c, h) = (10, 1, 2, 3, 11);
        let mut keys = vec![s];
        for _ in 0..3 {
            keys.extend([a, b, a, c]);
        }
        keys.push(h);
        assert_eq!(repeated_layers(&keys), vec![(1, 4, 3)]);
        // Two runs of different layers, and an op twice in a row (too short to be a layer).
        let keys = [a, a, b, c, b, c, b, c, s, a, h, a, h];
        assert_eq!(repeated_layers(&keys), vec![(2, 2, 3), (9, 2, 2)]);
        // Nothing repeats back to back: no layers.
        assert!(repeated_layers(&[a, b, c, a, s, b]).is_empty());
    }

    proptest::proptest! {
        /// Every run found is a sequence of at least two nodes followed by identical copies
        /// of itself, the runs do not overlap, and a sequence made of `r` copies of a layer
        /// with no repeat inside it is found whole.
        #[test]
        fn runs_are_disjoint_back_to_back_copies(
            keys in proptest::collection::vec(0u128..4, 0..60),
            layer in proptest::collection::vec(10u128..40, 2..8),
            r in 2usize..6,
        ) {
            let runs = repeated_layers(&keys);
            let mut end = 0;
            for &(start, len, reps) in &runs {
                proptest::prop_assert!(start >= end && len >= super::MIN_LAYER_NODES && reps >= 2);
                for k in 1..reps {
                    proptest::prop_assert_eq!(
                        &keys[start..start + len],
                        &keys[start + k * len..start + (k + 1) * len]
                    );
                }
                end = start + len * reps;
            }
            let distinct = {
                let mut l = layer.clone();
                l.sort_unstable();
                l.dedup();
                l.len() == layer.len()
            };
            if distinct {
                let stacked: Vec<u128> = std::iter::repeat_n(layer.clone(), r).flatten().collect();
                proptest::prop_assert_eq!(repeated_layers(&stacked), vec![(0, layer.len(), r)]);
            }
        }
    }
}
