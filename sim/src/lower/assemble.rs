//! A lowering made and run: the nodes of one IPU and the state they read selected, every graph
//! tensor laid out, every node lowered in order (outlined calls copying in and out), and the
//! tensors' live ranges worked out, into a [`Program`].

use std::sync::Arc;

use tessera_core::{Graph, NodeId, Op, Place, Plan, Roles, Storage};

use super::{matmul, memo, outline, LowerOptions, Lowering};
use crate::exchange::{Locality, SpreadSummaries, Summaries};
use crate::machine::IpuConfig;
use crate::program::{Mapping, Program, Step, TensorId};

impl<'a, S: Storage> Lowering<'a, S> {
    /// A lowering of the nodes `include` selects, with the state they read, before any
    /// tensor is laid out.
    fn new(
        plan: &'a Plan<S>,
        cfg: &'a IpuConfig,
        mut opts: LowerOptions,
        include: &dyn Fn(usize) -> bool,
        summarize: bool,
    ) -> Lowering<'a, S> {
        let graph = plan.graph();
        let n = graph.len();
        // Embedding serialization splits the products over the vocabulary: the rows of the
        // largest table a gather reads (the word embedding), found in the whole graph so that
        // every IPU's lowering splits alike.
        if opts.embedding_serialization > 1 {
            opts.plan.serialization = opts.embedding_serialization;
            opts.plan.serialized_size = graph
                .nodes()
                .iter()
                .filter_map(|node| match node.op() {
                    Op::Gather(tessera_core::ops::gather::Gather::Rows { table, .. }) => {
                        graph.node(*table).shape().dims().first().map(|&d| d as u64)
                    }
                    _ => None,
                })
                .max()
                .unwrap_or(0);
        }
        let mut inc: Vec<bool> = (0..n).map(include).collect();
        // Which tensors (roots) the included nodes read.
        let reads = |inc: &[bool]| {
            let mut read = vec![false; n];
            for (c, node) in graph.nodes().iter().enumerate() {
                if inc[c] {
                    for &o in node.op().operands().as_slice() {
                        read[plan.storage_of(o).index()] = true;
                    }
                }
            }
            read
        };
        let read = reads(&inc);
        for i in 0..n {
            if !inc[i] && graph.nodes()[i].op().is_state() && read[i] {
                inc[i] = true;
            }
        }
        let read = reads(&inc);
        let remote: Vec<bool> = (0..n)
            .map(|i| !inc[i] && !graph.nodes()[i].op().is_update() && read[i])
            .collect();
        let offloaded: Vec<bool> = (0..n)
            .map(|i| {
                let roles = graph.nodes()[i].roles();
                inc[i]
                    && graph.nodes()[i].shape().rank() > 0
                    && ((opts.offload_optimizer_state && roles.contains(Roles::OPTIMIZER_STATE))
                        || (opts.offload_accumulators && roles.contains(Roles::ACCUMULATOR)))
            })
            .collect();
        // Each storage root's first included reader, found once: the lowering asks for it for
        // every state tensor and product.
        let mut first_readers = vec![None; n];
        for (c, node) in graph.nodes().iter().enumerate() {
            if inc[c] {
                for &o in node.op().operands().as_slice() {
                    first_readers[plan.storage_of(o).index()]
                        .get_or_insert(NodeId::from_index(c as u32));
                }
            }
        }
        Lowering {
            cfg,
            plan,
            graph,
            opts,
            tensors: Vec::with_capacity(n * 2),
            steps: Vec::new(),
            node_steps: Vec::with_capacity(n),
            cursor: 0,
            mm: matmul::Plans::default(),
            plans_by_shape: matmul::PlansByShape::default(),
            fc_layers: matmul::trained_fc_layers(graph, &inc),
            fc_plans: matmul::FcPlansByShape::default(),
            machine: crate::planner::machine_key(cfg),
            include: inc,
            first_readers,
            remote,
            offloaded,
            summaries: summarize.then(Summaries::default),
            locality: Locality::default(),
            row_stats: Vec::new(),
            layouts: None,
            spread: SpreadSummaries::default(),
        }
    }
}

/// Every graph tensor's layout when every node is on one IPU. A tensor sent to another IPU
/// keeps its layout there, tile for tile, as poputil's `copyToIpu` (which PopART's IPU copies
/// use) maps the copy like its source: so a copy is laid out as its tensor is where it is
/// made, and the nodes that read it lower as they do where it is made.
pub(crate) fn whole_graph_layouts<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: LowerOptions,
) -> Arc<[Mapping]> {
    let n = plan.graph().len();
    let mut l = Lowering::new(plan, cfg, opts, &|_| true, false);
    l.map_graph_tensors();
    l.tensors[..n].iter().map(|t| t.mapping.clone()).collect()
}

/// [`lower_subset`], keeping only the summaries of the exchanges (what estimates need) when
/// `summarize` is set: the program's exchange steps then have no transfers. `layouts` are
/// the tensors' layouts with every node on one IPU ([`whole_graph_layouts`]), which copies
/// of other IPUs' tensors keep; made here when needed and not given.
pub(crate) fn lower_with<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: LowerOptions,
    include: &dyn Fn(usize) -> bool,
    summarize: bool,
    layouts: Option<Arc<[Mapping]>>,
) -> (Program, Summaries)
where
    Plan<S>: Sync,
    Graph<S>: Sync,
{
    let graph = plan.graph();
    let mut l = Lowering::new(plan, cfg, opts, include, summarize);
    if l.remote.iter().any(|&r| r) {
        l.layouts = Some(layouts.unwrap_or_else(|| whole_graph_layouts(plan, cfg, opts)));
    }
    matmul::plan_products(&l, |i| l.include[i.index()]);
    l.map_graph_tensors();
    // Estimates reuse identical nodes' lowerings.
    let context =
        xxhash_rust::xxh3::xxh3_128(format!("{:x}{:?}", l.machine, l.opts.as_keyed()).as_bytes());
    let mut memo = memo::Memo::new(context);
    memo.find_keys(&l);
    if l.summaries.is_some() {
        memo.prelower(&l);
    }
    let outline = if opts.outlining {
        outline::outline(&l, &memo.keys())
    } else {
        outline::Outline::default()
    };
    let keys = memo.keys();
    let mut exchange_keys: Vec<(usize, u128)> = Vec::new();
    let mut calls = outline.calls.iter().peekable();
    // The body's parameters a call copies its tensors into: (tensor, first and last step the
    // clone is live). A clone of an input lives from the copy-in to the end of the body, a
    // clone of an output for the copy-out.
    let mut call_clones: Vec<(TensorId, usize, usize)> = Vec::new();
    let mut call_in: Vec<TensorId> = Vec::new();
    let mut shared_steps: Vec<(usize, usize)> = Vec::new();
    let mut call_start = 0;
    for i in graph.ids() {
        let start = l.steps.len();
        let call = calls.peek().copied();
        if let Some(c) = call.filter(|c| c.first == i.index()) {
            call_start = l.steps.len();
            call_in = l.call_copies(i, "call/in", &c.inputs);
        }
        let body = l.steps.len();
        l.lower_node(i, &mut memo);
        if outline.shared.get(i.index()).copied().unwrap_or(false) && l.steps.len() > body {
            shared_steps.push((body, l.steps.len()));
        }
        if let Some(key) = keys.get(i.index()).copied().flatten() {
            exchange_keys.extend(
                (body..l.steps.len())
                    .filter(|&s| matches!(l.steps[s], Step::Exchange { .. }))
                    .map(|s| {
                        let mut b = key.to_le_bytes().to_vec();
                        b.extend_from_slice(&((s - body) as u64).to_le_bytes());
                        (s, xxhash_rust::xxh3::xxh3_128(&b))
                    }),
            );
        }
        if let Some(c) = call.filter(|c| c.last == i.index()) {
            let end = l.steps.len().saturating_sub(1);
            call_clones.extend(call_in.drain(..).map(|t| (t, call_start, end)));
            let out_step = l.steps.len();
            let outs = l.call_copies(i, "call/out", &c.outputs);
            call_clones.extend(outs.into_iter().map(|t| (t, out_step, out_step)));
            calls.next();
        }
        l.node_steps.push((start, l.steps.len()));
    }
    if let Some(s) = &mut l.summaries {
        s.reused = memo.reused;
        s.lowered = memo.lowered;
    }
    liveness(&mut l);
    let program = Program {
        tiles: cfg.tiles,
        tensors: l.tensors,
        steps: l.steps,
        node_steps: l.node_steps,
        shared_steps,
        exchange_keys,
        calls: outline.calls.len(),
        call_clones,
        node_names: graph.nodes().iter().map(|n| n.name().to_string()).collect(),
        forward_nodes: graph.forward_len(),
    };
    (program, l.summaries.unwrap_or_default())
}

/// Live ranges in program steps: graph tensors from their plan slots, temporaries from the
/// first step that touches them to the last.
fn liveness<S: Storage>(l: &mut Lowering<'_, S>) {
    let (graph, plan) = (l.graph, l.plan);
    let n_graph = graph.len();
    let last_step = l.steps.len().saturating_sub(1);
    let step_range = |first_node: usize, last_node: usize, ns: &[(usize, usize)]| {
        let s = ns[first_node].0;
        let e = ns[last_node].1.max(s + 1) - 1;
        (s, e.min(last_step))
    };
    // For offloaded state: the first and last node that reads it.
    let mut users: Vec<Option<(usize, usize)>> = vec![None; n_graph];
    for (c, node) in graph.nodes().iter().enumerate() {
        for &o in node.op().operands().as_slice() {
            let u = &mut users[o.index()];
            *u = Some(u.map_or((c, c), |(a, _)| (a, c)));
        }
    }
    for (i, slot) in plan.slots().iter().enumerate() {
        l.tensors[i].live = match slot.place {
            // Offloaded state is on its tiles only while the ops that use it run; an
            // offloaded accumulator while its accumulation runs (the weight update, which
            // loads it again, runs after the activations are gone).
            Place::State if l.offloaded[i] => users[i]
                .map(|(a, b)| {
                    if graph.nodes()[i].roles().contains(Roles::ACCUMULATOR) {
                        step_range(a, a, &l.node_steps)
                    } else {
                        step_range(a, b, &l.node_steps)
                    }
                })
                .unwrap_or((0, 0)),
            Place::State => (0, last_step),
            _ => step_range(
                if graph.nodes()[i].op() == &Op::Input {
                    0
                } else {
                    slot.first
                },
                slot.last,
                &l.node_steps,
            ),
        };
    }
    let mut first = vec![usize::MAX; l.tensors.len()];
    let mut last = vec![0usize; l.tensors.len()];
    for (s, step) in l.steps.iter().enumerate() {
        let mut touch = |t: TensorId| {
            let t = t.index();
            if t >= n_graph {
                first[t] = first[t].min(s);
                last[t] = last[t].max(s);
            }
        };
        match step {
            Step::Compute(cs) => cs.touched.iter().for_each(|&t| touch(t)),
            Step::Exchange { transfers, .. } => match l.summaries.as_ref().and_then(|x| x.get(s)) {
                Some(summary) => summary.tensors.iter().for_each(|&t| touch(t)),
                None => transfers.iter().for_each(|t| touch(t.region.tensor)),
            },
            _ => {}
        }
    }
    for t in n_graph..l.tensors.len() {
        l.tensors[t].live = (first[t].min(last[t]), last[t]);
    }
}
