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
    // The last node reading each tensor (by its storage root).
    let mut last_reader = vec![0usize; n];
    for (c, node) in graph.nodes().iter().enumerate() {
        for &o in node.op().operands().as_slice() {
            let r = plan.storage_of(o).index();
            last_reader[r] = last_reader[r].max(c);
        }
    }
    let mut out = Outline {
        shared: vec![false; n],
        calls: Vec::new(),
    };
    let mut seen: std::collections::HashSet<u128> = std::collections::HashSet::new();
    // The open call: its first node, last outlined node and the keys in it.
    let mut open: Option<(usize, usize, std::collections::HashSet<u128>)> = None;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, key) in keys.iter().enumerate().take(n) {
        if !l.include[i] {
            continue;
        }
        if !outlined(i) {
            if view(i) {
                continue;
            }
            if let Some((a, b, _)) = open.take() {
                runs.push((a, b));
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
                    runs.push((a, b));
                }
                open = Some((i, i, std::collections::HashSet::from([k])));
            }
        }
    }
    if let Some((a, b, _)) = open.take() {
        runs.push((a, b));
    }
    for (first, last) in runs {
        let member = |i: usize| (first..=last).contains(&i) && (outlined(i) || view(i));
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
            for i in first..=last {
                out.shared[i] = false;
            }
            continue;
        }
        out.calls.push(Call {
            first,
            last,
            inputs,
            outputs,
        });
    }
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
            let costs: Vec<VertexCost> = (0..tiles)
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
