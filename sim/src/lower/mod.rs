//! Lowering a core plan onto one IPU: every tensor gets a tile mapping, every op becomes
//! compute sets of vertices, and exchanges bring each vertex's operands to its tile.
//!
//! The machinery (mappings, vertices per tile, exchanges, liveness) is here; each op family's
//! tile mapping, vertices and cost live in one module beside it, mirroring the core's
//! `ops/<family>.rs`:
//!
//! - a matmul's output is laid out by its plan (blocks on the tiles that compute them), and a
//!   variable whose first use is a matmul's right-hand operand is laid out by that plan too
//!   (as poplibs creates weights): each block spread over the tiles that read it;
//! - optimizer state is laid out like its variable;
//! - element-wise results are laid out like their full-size operand;
//! - views (reshapes) have no tensor of their own: they read their root's;
//! - every other tensor is spread linearly in chunks of at least
//!   [`LowerOptions::min_chunk_bytes`] (whole on one tile when smaller), row-aligned for
//!   row-wise ops, starting at a tile its name (or kind, below) picks, so that small tensors
//!   spread over the tiles and no layout depends on what was laid out before it;
//! - a node identical to an earlier one (op, shapes, operands' layouts) is laid out, and spreads
//!   its temporaries, like the earlier one: repeated layers share layouts, as PopART's
//!   outlining grows a repeated layer once (see `Outlined` and `memo`).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use tessera_core::{DType, Graph, Node, NodeId, Op, Place, Plan, Roles, Storage};

use strength_reduce::StrengthReducedU64;

use crate::exchange::{
    summarize_vertices, Locality, PerTile, RunReads, SpreadKey, SpreadSummaries, Summaries,
};
use crate::machine::IpuConfig;
use crate::planner::Operand;
use crate::program::{
    compress, compress_from, exchange_for, Codelet, ComputeSet, Interval, Mapping, ProgTensor,
    Program, Region, Step, TensorClass, TensorId, TileId, Vertex,
};

mod broadcast;
mod conv;
mod elementwise;
mod gather;
mod kept;
mod layout;
mod loss;
mod matmul;
mod memo;
mod norm;
mod outline;
mod pool;
mod product;
mod random;
mod reduce;
mod softmax;
mod update;

pub use memo::{clear_shared_records, SHARED_MEMO_BYTES};

/// Knobs of the lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowerOptions {
    /// The smallest chunk of a tensor a tile gets when a tensor is spread.
    pub min_chunk_bytes: u64,
    /// Keep optimizer state (momentum, Adam moments) in streaming memory: it is loaded onto
    /// its tiles for the weight update and stored back after it.
    pub offload_optimizer_state: bool,
    /// The options of poplin's planner for every product lowered (`availableMemoryProportion`,
    /// `partialsType`).
    pub plan: crate::planner::PlanOptions,
    /// Replicated tensor sharding (TensorFlow's `replicated_optimizer_state_sharding`,
    /// PopART's `replicatedTensorSharding`): the replicas the optimizer state and its update
    /// are sharded over (1: none). Each replica keeps, loads, stores and updates `1 / r` of
    /// the state of every variable of at least [`RTS_MIN_ELEMENTS`] elements.
    pub replicated_tensor_sharding: u32,
    /// Outlining (code reuse, Poplar functions; PopART's `enableOutlining`, on by default):
    /// identical nodes share one copy of their code and each call copies its tensors in and
    /// out (see `outline`).
    pub outlining: bool,
    /// Embedding serialization (PopTorch's `embedding_serialization_factor`, PopART's
    /// `serializeMatMul`; 1: none): the products over the vocabulary (the rows of the largest
    /// gathered table) run in this many serial pieces, each bringing and making its share.
    pub embedding_serialization: u64,
    /// Keep gradient accumulators in streaming memory (TensorFlow's
    /// `offload_gradient_accumulation_buffers`): each op that reads one loads it before and
    /// stores it after, and it holds tile memory only while its accumulation runs.
    pub offload_accumulators: bool,
}

pub use crate::techniques::sharding::RTS_MIN_ELEMENTS;

impl Default for LowerOptions {
    fn default() -> Self {
        // Estimate: 128 bytes keeps vertices' fixed costs below their per-element costs.
        LowerOptions {
            min_chunk_bytes: 128,
            offload_optimizer_state: false,
            plan: crate::planner::PlanOptions::default(),
            replicated_tensor_sharding: 1,
            outlining: true,
            embedding_serialization: 1,
            offload_accumulators: false,
        }
    }
}

impl LowerOptions {
    /// The replicas a variable of `elements` elements has its optimizer state and update
    /// sharded over (1 when not sharded).
    pub fn shards_of(&self, elements: u64) -> u64 {
        if self.replicated_tensor_sharding > 1 && elements >= RTS_MIN_ELEMENTS {
            u64::from(self.replicated_tensor_sharding)
        } else {
            1
        }
    }

    /// The options as a node's lowering reads them, the part of every memo key they make
    /// (see `memo`). Offloading optimizer state or accumulators acts on a node only through
    /// whether each tensor it reads is offloaded, which its key holds; outlining acts on the
    /// program after its nodes are lowered. They are set to their defaults here, so
    /// lowerings that differ only in them (a pipeline split's stages, which offload the
    /// optimizer state, and the one-IPU estimate before them) reuse each other's records.
    fn as_keyed(self) -> LowerOptions {
        let default = LowerOptions::default();
        LowerOptions {
            offload_optimizer_state: default.offload_optimizer_state,
            offload_accumulators: default.offload_accumulators,
            outlining: default.outlining,
            ..self
        }
    }
}

/// Worker cycles a multi-region vertex spends per region beyond the first (estimate: loading
/// the next region's pointers and length).
pub const REGION_OVERHEAD_CYCLES: u64 = 12;

/// An element-wise compute set's exchange is kept for others that read alike (see
/// [`SpreadSummaries`]) when the tensors it looks up hold this many intervals or more in all:
/// smaller ones summarise in less time than their key takes. (A choice of speed, never of
/// what is estimated: a kept summary is the one summarising would give.)
const SPREAD_FROM_INTERVALS: usize = 4096;

/// How a family wants a node's output laid out.
pub(crate) enum Placement {
    /// Like this operand's tensor (element for element).
    Like(NodeId),
    /// Spread linearly in chunks that are multiples of this many elements.
    Rows(u64),
    /// Spread linearly as if each element weighed this many bytes: a reduction's outputs by
    /// the input each reduces, so the work (and the input each tile receives) is spread, not
    /// only the outputs' own few bytes.
    Weighted(u64),
    /// Laid out by the family itself (a matmul's plan).
    Own,
    /// Each element on the tile of the operand element it copies (a transpose, concatenation
    /// or slice, as PopART's `cloneNcopy` of a view lays it out; `layout::image_mapping`).
    Image,
    /// No tensor of its own (a view, or an update).
    Nothing,
}

/// `op` written out with its operands by place (`#0`, `#1`, ...) instead of by node id:
/// identical ops of different nodes read the same.
pub(crate) fn op_by_place(op: &Op, nodes: &[NodeId]) -> String {
    let mut s = format!("{op:?}");
    for (k, x) in nodes.iter().enumerate() {
        s = s.replace(&format!("NodeId({})", x.index()), &format!("#{k}"));
    }
    s
}

/// Graph tensors' layouts of at least this many intervals are shared with an equal layout
/// made before them in the same lowering (see [`shared_layout`]); smaller ones are cheap to
/// derive again, and hashing each would cost more than it saves.
const SHARED_LAYOUT_FROM: usize = 4096;

/// `mapping`, or an equal large one already in `made` (by digest, then compared whole), whose
/// copy shares its intervals and what is derived of them (runs per tile, the by-tile order,
/// per-tile sums) instead of deriving them again. An equal layout is the same layout, so
/// nothing computed from it changes; only the work and memory of deriving it twice go.
fn shared_layout(made: &mut HashMap<u128, Mapping>, mapping: Mapping) -> Mapping {
    if mapping.intervals().len() < SHARED_LAYOUT_FROM {
        return mapping;
    }
    match made.entry(mapping.digest()) {
        Entry::Occupied(e) if e.get().same_layout(&mapping) => e.get().clone(),
        Entry::Occupied(_) => mapping,
        Entry::Vacant(e) => e.insert(mapping).clone(),
    }
}

/// Identical nodes' tensors spread linearly (from a start tile their kind picks), for laying
/// out a later identical node's tensor like the first's. PopART outlines the repeated layers of a model into one subgraph
/// (its `enableOutlining` option, on by default) and grows that subgraph once: the layers'
/// tensors are laid out once, and each layer runs the same code on the same layout. Nodes are
/// identical when their ops, shapes and types are and their operands are laid out alike; state
/// and inputs (no operands) are never alike, as each layer has its own weights.
#[derive(Default)]
struct Outlined {
    /// The first tensor of each kind of node.
    first: std::collections::HashMap<u128, TensorId>,
}

impl Outlined {
    /// The kind of node `i`, or `None` for a node without operands.
    fn key<S: Storage>(&self, l: &Lowering<'_, S>, i: NodeId) -> Option<u128> {
        let node = l.node(i);
        let operands = node.op().operands();
        let operands = operands.as_slice();
        if operands.is_empty() {
            return None;
        }
        let op = op_by_place(node.op(), operands);
        let mut facts = format!(
            "{op}|{:?}|{:?}|{:?}",
            node.shape(),
            node.dtype(),
            node.roles()
        );
        for &x in operands {
            let t = l.t(x);
            let digest = l.tensors[t.index()].mapping.digest();
            let n = l.node(x);
            let pt = &l.tensors[t.index()];
            let _ = std::fmt::Write::write_fmt(
                &mut facts,
                format_args!("|{:?}{:?}{}{digest}", n.shape(), pt.dtype, pt.elements),
            );
        }
        Some(xxhash_rust::xxh3::xxh3_128(facts.as_bytes()))
    }
}

pub(crate) struct Lowering<'a, S: Storage> {
    pub(crate) cfg: &'a IpuConfig,
    pub(crate) plan: &'a Plan<S>,
    pub(crate) graph: &'a Graph<S>,
    opts: LowerOptions,
    pub(crate) tensors: Vec<ProgTensor>,
    steps: Vec<Step>,
    node_steps: Vec<(usize, usize)>,
    /// The tile where the next tensor spread linearly starts. Each graph tensor spread
    /// linearly and each node's lowering set it first from what is laid out
    /// ([`start_tile`](Self::start_tile)), so no layout depends on what was laid out before.
    cursor: u32,
    pub(crate) mm: matmul::Plans,
    /// Plans by product shape: identical layers' products are planned once.
    pub(crate) plans_by_shape: matmul::PlansByShape,
    /// The fully-connected layers trained here, whose passes are planned jointly.
    pub(crate) fc_layers: std::collections::HashSet<matmul::FcLayer>,
    /// Their plans.
    pub(crate) fc_plans: matmul::FcPlansByShape,
    /// The machine's key for the process's plan caches.
    pub(crate) machine: u128,
    /// Nodes lowered onto this IPU.
    include: Vec<bool>,
    /// Per storage root: the first included node that reads it (or a view of it).
    first_readers: Vec<Option<NodeId>>,
    /// Nodes of other IPUs whose tensors this IPU reads: copies arrive over the IPU-Links.
    remote: Vec<bool>,
    /// State tensors kept in streaming memory between weight updates.
    offloaded: Vec<bool>,
    /// When set, exchanges keep only their summaries (their steps have no transfers).
    summaries: Option<Summaries>,
    /// Which tiles hold which regions, for summaries.
    locality: Locality,
    /// Each cross-entropy's per-row statistics (by its logits node), which its gradient reads.
    pub(crate) row_stats: Vec<(NodeId, TensorId)>,
    /// Every graph tensor's layout with every node on one IPU, which copies of other IPUs'
    /// tensors keep (set when there are such copies).
    layouts: Option<Arc<[Mapping]>>,
    /// Element-wise exchanges' summaries, shared by the forks.
    spread: SpreadSummaries,
}

/// Row segments of the rectangle rows `r0..r1` x cols `c0..c1` of a row-major matrix with
/// `cols` columns, as (start, len) element ranges.
pub(crate) fn rect(
    r0: u64,
    r1: u64,
    c0: u64,
    c1: u64,
    cols: u64,
) -> impl Iterator<Item = (u64, u64)> {
    (r0..r1).map(move |r| (r * cols + c0, c1 - c0))
}

/// The elements `start .. start + len` of a row-major matrix with `cols` columns, as
/// (row, first column, end column) pieces, made as they are read (the copies of a dense
/// block's concatenations ask for tens of millions of them, and a list each cost an
/// allocation each).
pub(crate) fn row_segments(
    start: u64,
    len: u64,
    cols: u64,
) -> impl Iterator<Item = (u64, u64, u64)> {
    let end = start + len;
    // The first piece starts where `start` is; every later one at the start of a row.
    let (mut r, mut c0) = if len > 0 {
        (start / cols, start % cols)
    } else {
        (0, 0)
    };
    let mut i = start;
    std::iter::from_fn(move || {
        if i >= end {
            return None;
        }
        let c1 = cols.min(c0 + (end - i));
        let piece = (r, c0, c1);
        i += c1 - c0;
        r += 1;
        c0 = 0;
        Some(piece)
    })
}

impl<'a, S: Storage> Lowering<'a, S> {
    pub(crate) fn tile_count(&self) -> u32 {
        self.cfg.tiles
    }

    /// The tile where the layout of a thing with `identity` (a hash of a tensor's name, or
    /// of a node's kind) starts spreading: an even tile (partner tiles stay paired) picked
    /// by the hash. A tensor, or a node's temporaries, then has the same layout in every
    /// lowering that holds it - each pipeline stage, each of a split's retries, each
    /// configuration of a sweep - so identical nodes lower once (see [`memo`]). PopART's
    /// `LinearMapper` starts each tensor where the previous one ended instead: the spread is
    /// the same on average, but there a tensor's layout depends on everything laid out
    /// before it (docs/cost-model.md gives the figures this moved).
    fn start_tile(&self, identity: u128) -> u32 {
        let folded = (identity as u64) ^ ((identity >> 64) as u64);
        let even_tiles = u64::from(self.tile_count() / 2).max(1);
        ((folded % even_tiles) * 2) as u32
    }

    /// The identity whose [`start_tile`](Self::start_tile) a graph tensor without operands
    /// (a weight, an input, optimizer state) spreads from: its name, so that each layer's
    /// weights spread from their own tile; but a scalar's kind (type, roles, whether state),
    /// so that the copies each pipeline stage holds of one (its micro-batch counter) sit
    /// alike and the stages' nodes that read them lower alike.
    fn identity(&self, i: NodeId) -> u128 {
        let node = self.node(i);
        if node.shape().elements() == 1 {
            let kind = format!(
                "scalar|{:?}|{:?}|{}",
                node.dtype(),
                node.roles(),
                node.op().is_state()
            );
            xxhash_rust::xxh3::xxh3_128(kind.as_bytes())
        } else {
            // The name without its digits: the same weight of every repeat of a layer
            // (`layer.3.attention.bias`, `block2/b/bias:0`) spreads from the same tile, as
            // Poplar lays out identical layers' weights alike (poplin creates them from the
            // same plan), so identical layers lower alike and share outlined code.
            let name: String = node
                .name()
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .collect();
            let kind = format!("{name}|{}", node.shape());
            xxhash_rust::xxh3::xxh3_128(kind.as_bytes())
        }
    }

    /// [`start_tile`](Self::start_tile) for a thing known by `name`.
    fn start_tile_of_name(&self, name: &str) -> u32 {
        self.start_tile(xxhash_rust::xxh3::xxh3_128(name.as_bytes()))
    }

    /// The node `x`.
    pub(crate) fn node(&self, x: NodeId) -> &'a Node {
        self.graph.node(x)
    }

    /// The program tensor holding `x`'s data (its root's, for a view).
    pub(crate) fn t(&self, x: NodeId) -> TensorId {
        TensorId::of(self.plan.storage_of(x))
    }

    /// A linear mapping with chunks of at least `min_chunk_bytes`, multiples of `grain`. Rows
    /// of `cols` elements are cut at the same places in every row (chunks that divide the row,
    /// or whole rows), so blocks of the matrix read as strided regions.
    pub(crate) fn linear(
        &mut self,
        elements: u64,
        elem_bytes: u64,
        grain: u64,
        cols: u64,
    ) -> Mapping {
        let mut min_chunk = self.opts.min_chunk_bytes.div_ceil(elem_bytes.max(1));
        let per = elements
            .div_ceil(u64::from(self.tile_count().max(1)))
            .max(min_chunk);
        let mut grain = grain.max(1);
        // Row alignment matters only with more than one row, and only when a chunk that
        // divides the row is near the even share: a row of prime-rich length (a vocabulary
        // of 50,257) would otherwise land on a few tiles in huge chunks.
        if cols > 1 && grain < cols && elements > cols {
            if per >= cols {
                grain = cols;
            } else if let Some(d) =
                (per..=cols.min(2 * per)).find(|d| cols % d == 0 && d % grain == 0)
            {
                min_chunk = d;
                grain = d;
            }
        }
        let m = Mapping::linear(
            elements,
            grain,
            min_chunk,
            TileId(self.cursor),
            self.tile_count(),
            self.tile_count(),
        );
        let used = m.intervals().len() as u64;
        self.cursor = TileId::wrapping(u64::from(self.cursor) + used, self.tile_count()).0;
        m
    }

    pub(crate) fn new_tensor(
        &mut self,
        name: String,
        node: NodeId,
        dtype: DType,
        elements: u64,
        mapping: Mapping,
        class: TensorClass,
    ) -> TensorId {
        self.tensors.push(ProgTensor {
            name,
            node,
            dtype,
            elements,
            mapping,
            class,
            live: (0, 0),
            interleaved: false,
        });
        TensorId((self.tensors.len() - 1) as u32)
    }

    /// A temporary of node `node` (`<node>/<what>`), laid out by `mapping`.
    pub(crate) fn temporary(
        &mut self,
        node: NodeId,
        what: &str,
        dtype: DType,
        elements: u64,
        mapping: Mapping,
    ) -> TensorId {
        let name = format!("{}/{what}", self.node(node).name());
        self.new_tensor(name, node, dtype, elements, mapping, TensorClass::Temporary)
    }

    /// The tile holding element 0 of `t`.
    pub(crate) fn first_tile(&self, t: TensorId) -> TileId {
        self.tensors[t.index()]
            .mapping
            .intervals()
            .first()
            .map_or(TileId(0), |iv| iv.tile)
    }

    /// Appends a compute set whose vertices read only what their tiles hold (no exchange).
    pub(crate) fn local_compute(&mut self, node: NodeId, phase: &str, vertices: Vec<Vertex>) {
        if vertices.is_empty() {
            return;
        }
        debug_assert!(
            self.summaries.is_some() || exchange_for(&self.tensors, &vertices).is_empty(),
            "a local compute set reads another tile's data"
        );
        let name = format!("{}/{phase}", self.node(node).name());
        self.push_compute(ComputeSet::new(name, node, vertices));
    }

    /// Appends a compute set (without its vertices when the lowering keeps only costs).
    pub(crate) fn push_compute(&mut self, cs: ComputeSet) {
        self.steps.push(Step::Compute(if self.summaries.is_some() {
            cs.without_vertices()
        } else {
            cs
        }));
    }

    /// Appends a compute set, preceded by the exchange its vertices need.
    pub(crate) fn compute(&mut self, node: NodeId, phase: &str, vertices: Vec<Vertex>) {
        self.compute_reading_locally(node, phase, vertices, &[]);
    }

    /// [`compute`](Self::compute) for vertices that read the tensors `local` only on their
    /// own tiles (the tiles' runs of tensors laid out like what they write), which the
    /// exchange's summary then need not look up.
    fn compute_reading_locally(
        &mut self,
        node: NodeId,
        phase: &str,
        vertices: Vec<Vertex>,
        local: &[TensorId],
    ) {
        self.compute_spread(node, phase, vertices, local, None, None, false);
    }

    /// [`compute_reading_locally`](Self::compute_reading_locally) for vertices that read each
    /// tensor of `runs` as [`Runs`] says, and nothing else of it.
    pub(crate) fn compute_reading_runs(
        &mut self,
        node: NodeId,
        phase: &str,
        vertices: Vec<Vertex>,
        local: &[TensorId],
        runs: Runs,
    ) {
        self.compute_spread(node, phase, vertices, local, None, Some(runs), false);
    }

    /// [`compute`](Self::compute) for vertices whose distinct reads are disjoint (no two
    /// share an element; see [`summarize_vertices`]).
    pub(crate) fn compute_disjoint(&mut self, node: NodeId, phase: &str, vertices: Vec<Vertex>) {
        self.compute_spread(node, phase, vertices, &[], None, None, true);
    }

    /// [`compute_reading_locally`](Self::compute_reading_locally), with the summary taken
    /// from (or kept in) the lowering's element-wise summaries under `spread`'s key when it
    /// is given (the key, and the tensors read in its order), and what the reads of `runs`'
    /// tensors add taken from (or kept in) them too.
    #[allow(clippy::too_many_arguments)]
    fn compute_spread(
        &mut self,
        node: NodeId,
        phase: &str,
        vertices: Vec<Vertex>,
        local: &[TensorId],
        spread: Option<(SpreadKey, Vec<TensorId>)>,
        runs: Option<Runs>,
        disjoint: bool,
    ) {
        if vertices.is_empty() {
            return;
        }
        if let Some(summaries) = &mut self.summaries {
            let (tiles, tensors, locality) = (self.cfg.tiles, &self.tensors, &mut self.locality);
            let kept = &self.spread;
            let mut summarize = || {
                let runs = runs.as_ref().map(|r| RunReads {
                    over: tensors[r.over.index()].mapping.digest(),
                    tensors: &r.tensors,
                    kept,
                });
                summarize_vertices(tiles, tensors, &vertices, locality, local, disjoint, runs)
            };
            let s = match spread {
                Some((key, reads)) => self.spread.get_or_summarize(key, &reads, summarize),
                None => summarize(),
            };
            if let Some(s) = s {
                summaries.push(self.steps.len(), s);
                self.steps.push(Step::Exchange {
                    node,
                    transfers: Vec::new(),
                });
            }
        } else {
            let transfers = exchange_for(&self.tensors, &vertices);
            // What the summaries take on trust: nothing of a tensor read locally moves (the
            // unit tests compare both lowerings, so a wrong hint fails them).
            debug_assert!(
                transfers.iter().all(|t| !local.contains(&t.region.tensor)),
                "a tensor said to be read locally moves in {}",
                self.node(node).name()
            );
            if !transfers.is_empty() {
                self.steps.push(Step::Exchange { node, transfers });
            }
        }
        let name = format!("{}/{phase}", self.node(node).name());
        let cs = ComputeSet::new(name, node, vertices);
        // Estimates need only the costs: without the vertices, a large model's program
        // takes a fraction of the memory.
        self.steps.push(Step::Compute(if self.summaries.is_some() {
            cs.without_vertices()
        } else {
            cs
        }));
    }

    /// One vertex per tile of `over`'s mapping, covering all the tile's intervals (in order
    /// of their start): `regions(intervals)` gives the vertex's reads and writes, and the vertex
    /// costs `cycles(elements)` plus [`REGION_OVERHEAD_CYCLES`] per region written beyond the
    /// first. Gives the vertices; the caller appends their compute set.
    fn per_tile_groups(
        &self,
        over: TensorId,
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        mut regions: impl FnMut(&[Interval]) -> (Vec<Region>, Vec<Region>),
    ) -> Vec<Vertex> {
        let mapping = self.tensors[over.index()].mapping.clone();
        let ivs = mapping.intervals_by_tile();
        ivs.chunk_by(|a, b| a.tile == b.tile)
            .map(|group| {
                let (reads, writes) = regions(group);
                let elements: u64 = group.iter().map(|iv| iv.len).sum();
                // Per region written beyond the first, after joining: a run of rows of one
                // channel group is one region, as it is contiguous in Poplar's grouped layout.
                let extra = REGION_OVERHEAD_CYCLES * (writes.len() as u64).saturating_sub(1);
                Vertex {
                    tile: group[0].tile,
                    codelet,
                    cycles: cycles(elements) + extra,
                    reads,
                    writes,
                }
            })
            .collect()
    }

    /// The tensors among `ts` laid out like `over`, leaving out those `except` names (regions
    /// read besides the runs): a vertex reading its tile's runs of `over`'s mapping in them
    /// reads only its own tile.
    fn laid_out_like(&self, over: TensorId, ts: &[TensorId], except: &[Region]) -> Vec<TensorId> {
        let m = &self.tensors[over.index()].mapping;
        ts.iter()
            .copied()
            .filter(|&t| {
                self.tensors[t.index()].mapping.same_layout(m)
                    && !except.iter().any(|r| r.tensor == t)
            })
            .collect()
    }

    /// One vertex per tile of `over`'s mapping, covering all the tile's intervals and writing
    /// them: `reads(interval, out)` appends each interval's reads to `out`, and the vertex
    /// costs `cycles(elements)` plus [`REGION_OVERHEAD_CYCLES`] per region written beyond the
    /// first. The writes are the tile's intervals joined into runs (made once per mapping),
    /// the regions joining each interval's span of `over` gives.
    pub(crate) fn per_tile(
        &mut self,
        node: NodeId,
        phase: &str,
        over: TensorId,
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        mut reads: impl FnMut(&Interval, &mut Vec<Region>),
    ) {
        let mapping = self.tensors[over.index()].mapping.clone();
        let mut tiles = mapping.runs_per_tile().iter();
        // Each tile's reads, before they are joined (the buffer is reused from tile to tile).
        let mut buf: Vec<Region> = Vec::new();
        let vertices = self.per_tile_groups(over, codelet, cycles, |group| {
            // The groups come in the order of the tiles.
            let (tile, runs) = tiles.next().expect("a group per tile");
            debug_assert_eq!(*tile, group[0].tile);
            for iv in group {
                reads(iv, &mut buf);
            }
            let writes = runs.iter().map(|r| Region { tensor: over, ..*r }).collect();
            (compress_from(&mut buf), writes)
        });
        self.compute(node, phase, vertices);
    }

    /// [`per_tile`](Self::per_tile) for the common case of vertices reading and writing the
    /// same elements of several tensors (each interval of `over`'s mapping in each of `reads`
    /// and `writes`) plus the fixed regions `fixed` (a counter, a step). Gives exactly the
    /// vertices `per_tile` gives, without making a region per interval and tensor and joining
    /// them again: each tile's intervals are joined into strided runs once, and every tensor
    /// reads those runs.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn per_tile_same(
        &mut self,
        node: NodeId,
        phase: &str,
        over: TensorId,
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        reads: &[TensorId],
        writes: &[TensorId],
        fixed: &[Region],
    ) {
        let once = |ts: &[TensorId]| {
            let mut ts = ts.to_vec();
            ts.sort_unstable();
            ts.dedup();
            ts
        };
        let (reads, writes) = (once(reads), once(writes));
        // The regions of `runs` in each of `ts`, and `fixed`, sorted.
        let on = |ts: &[TensorId], runs: &[Region], fixed: &[Region]| {
            let mut out: Vec<Region> = Vec::with_capacity(ts.len() * runs.len() + fixed.len());
            for &t in ts {
                out.extend(runs.iter().map(|r| Region { tensor: t, ..*r }));
            }
            out.extend_from_slice(fixed);
            out.sort_unstable();
            out.dedup();
            out
        };
        let mapping = self.tensors[over.index()].mapping.clone();
        let mut tiles = mapping.runs_per_tile().iter();
        let vertices = self.per_tile_groups(over, codelet, cycles, |group| {
            // The groups come in the order of the tiles.
            let (tile, runs) = tiles.next().expect("a group per tile");
            debug_assert_eq!(*tile, group[0].tile);
            (on(&reads, runs, fixed), on(&writes, runs, &[]))
        });
        let local = self.laid_out_like(over, &reads, fixed);
        let spread = if fixed.is_empty() {
            self.spread_key(over, &reads, &local)
        } else {
            None
        };
        // (A tensor `fixed` reads too is read otherwise than by runs.)
        let runs = Runs::of(
            over,
            reads
                .iter()
                .copied()
                .filter(|&t| fixed.iter().all(|f| f.tensor != t)),
        );
        self.compute_spread(node, phase, vertices, &local, spread, Some(runs), false);
    }

    /// A vertex per tile of `out`'s mapping, reading the same elements of the operands in
    /// `same` and the regions `extra(start, len, out)` appends to `out` for each interval.
    pub(crate) fn elementwise(
        &mut self,
        node: NodeId,
        out: TensorId,
        same: &[TensorId],
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        mut extra: impl FnMut(u64, u64, &mut Vec<Region>),
    ) {
        self.elementwise_by_tile(node, out, same, codelet, cycles, &[], |_, group, others| {
            for iv in group {
                extra(iv.start, iv.len, others);
            }
        });
    }

    /// [`elementwise`](Self::elementwise) whose other operands are read by broadcast
    /// (`broadcast`): each tile's reads of them, joined, are made once per layout of `out`
    /// and kind of broadcast ([`broadcast::per_tile`]) and shared by every compute set that
    /// reads alike (a batch norm's normalisation, its recomputation and its gradient, its
    /// scale and its shift).
    pub(crate) fn elementwise_broadcast(
        &mut self,
        node: NodeId,
        out: TensorId,
        same: &[TensorId],
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        broadcast: &[broadcast::Broadcast],
    ) {
        let Some(operands) = broadcast::distinct(same, broadcast) else {
            // An operand read both ways, or broadcast two ways: its regions are joined
            // together, interval by interval.
            let mut tmp = Vec::new();
            return self.elementwise(node, out, same, codelet, cycles, |s, len, reads| {
                for b in broadcast {
                    b.push(s, len, reads, &mut tmp);
                }
            });
        };
        let mapping = self.tensors[out.index()].mapping.clone();
        let lists: Vec<(TensorId, broadcast::TileReads)> = operands
            .iter()
            .map(|b| (b.tensor(), broadcast::per_tile(&mapping, b)))
            .collect();
        let how: Vec<(TensorId, PerTile)> = operands
            .iter()
            .map(|b| (b.tensor(), b.per_tile()))
            .collect();
        self.elementwise_by_tile(node, out, same, codelet, cycles, &how, |k, _, others| {
            for (t, list) in &lists {
                others.extend(list.tile(k).iter().map(|r| Region { tensor: *t, ..*r }));
            }
        });
    }

    /// [`elementwise`](Self::elementwise) with the other reads of the `k`th tile (of `out`'s
    /// mapping, by tile) appended by `extra(k, intervals, out)`: joined already when they are
    /// `broadcast`'s (each tensor's as [`compress`] joins them, each tile reading a tensor as
    /// its [`PerTile`] says, and no tensor of `same`), else as they come, and joined here.
    #[allow(clippy::too_many_arguments)]
    fn elementwise_by_tile(
        &mut self,
        node: NodeId,
        out: TensorId,
        same: &[TensorId],
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        broadcast: &[(TensorId, PerTile)],
        mut extra: impl FnMut(usize, &[Interval], &mut Vec<Region>),
    ) {
        let joined = !broadcast.is_empty();
        // The vertices `per_tile` gives with each interval's spans of `same` and `extra`'s
        // regions as reads and its span of `out` as the write, computed with less work: a
        // tile's intervals are joined into runs once, and every tensor of `same` reads those
        // runs (joining each tensor's spans is separate from joining another's).
        let mut once = same.to_vec();
        once.sort_unstable();
        once.dedup();
        let mapping = self.tensors[out.index()].mapping.clone();
        let mut tiles = mapping.runs_per_tile().iter().enumerate();
        let mut runs: Vec<Region> = Vec::new();
        let mut others: Vec<Region> = Vec::new();
        // Whether some tile's `extra` reads a tensor of `same` (its reads are then joined
        // with the others), and whether it reads anything.
        let mut mixed = false;
        let mut any_extra = false;
        let vertices = self.per_tile_groups(out, codelet, cycles, |group| {
            // The groups come in the order of the tiles.
            let (k, (tile, joined_runs)) = tiles.next().expect("a group per tile");
            debug_assert_eq!(*tile, group[0].tile);
            runs.clear();
            runs.extend(joined_runs.iter().map(|r| Region { tensor: out, ..*r }));
            others.clear();
            extra(k, group, &mut others);
            any_extra |= !others.is_empty();
            let reads = if others.iter().any(|r| once.binary_search(&r.tensor).is_ok()) {
                // `extra` reads a tensor of `same` too: join their regions together.
                debug_assert!(!joined, "joined reads of a tensor read alike");
                mixed = true;
                let mut reads: Vec<Region> = group
                    .iter()
                    .flat_map(|iv| same.iter().map(|&t| Region::span(t, iv.start, iv.len)))
                    .collect();
                reads.append(&mut others);
                compress(reads)
            } else {
                // Joining each tensor's regions is separate from joining another's, and the
                // regions are sorted at the end: regions joined already are taken as they are.
                let mut reads = if joined {
                    let mut r = Vec::with_capacity(others.len() + once.len() * runs.len());
                    r.append(&mut others);
                    r
                } else {
                    compress_from(&mut others)
                };
                for &t in &once {
                    reads.extend(runs.iter().map(|r| Region { tensor: t, ..*r }));
                }
                reads.sort_unstable();
                reads
            };
            // (The runs are sorted.)
            (reads, runs.clone())
        });
        let local = if mixed {
            Vec::new()
        } else {
            self.laid_out_like(out, &once, &[])
        };
        let spread = if any_extra {
            None
        } else {
            self.spread_key(out, &once, &local)
        };
        // (Mixed, some tensor of `same` is also read otherwise.)
        let runs = (!mixed).then(|| {
            let mut runs = Runs::of(out, once);
            runs.tensors.extend_from_slice(broadcast);
            runs
        });
        self.compute_spread(node, "op", vertices, &local, spread, runs, false);
    }

    /// The key under which the exchange of vertices that read, on each tile of `over`'s
    /// layout, its runs of each of `reads` (distinct) and nothing else is kept for other
    /// compute sets that read alike (see [`SpreadSummaries`]), with `reads` in its order;
    /// `None` when exchanges are not summarised or the tensors looked up are small.
    fn spread_key(
        &self,
        over: TensorId,
        reads: &[TensorId],
        local: &[TensorId],
    ) -> Option<(SpreadKey, Vec<TensorId>)> {
        let looked_up: usize = reads
            .iter()
            .filter(|t| !local.contains(t))
            .map(|t| self.tensors[t.index()].mapping.intervals().len())
            .sum();
        (self.summaries.is_some() && looked_up >= SPREAD_FROM_INTERVALS)
            .then(|| SpreadKey::new(self.cfg.tiles, &self.tensors, over, reads, local))
    }

    /// The first node on this IPU that reads `x` (or a view of it); `None` for a view
    /// itself, whose readers read its root.
    pub(crate) fn first_consumer(&self, x: NodeId) -> Option<NodeId> {
        self.first_readers[x.index()]
    }

    fn lower_node(&mut self, i: NodeId, memo: &mut memo::Memo) {
        let node = self.node(i);
        if !self.include[i.index()] {
            if self.remote[i.index()] {
                self.steps.push(Step::LinkReceive {
                    tensor: TensorId::of(i),
                    bytes: node.bytes() as u64,
                });
            }
            return;
        }
        // Offloaded optimizer state comes from streaming memory for this op and goes back after.
        let offloaded: Vec<NodeId> = node
            .op()
            .operands()
            .as_slice()
            .iter()
            .copied()
            .filter(|o| self.offloaded[o.index()])
            .collect();
        // With replicated tensor sharding each replica moves its shard.
        let moved = |l: &Self, t: NodeId| {
            let n = l.node(t);
            (n.bytes() as u64).div_ceil(l.opts.shards_of(n.shape().elements() as u64))
        };
        for &t in &offloaded {
            self.steps.push(Step::RemoteBuffer {
                tensor: TensorId::of(t),
                bytes: moved(self, t),
                load: true,
            });
        }
        self.lower_op_reusing(i, memo);
        for &t in &offloaded {
            self.steps.push(Step::RemoteBuffer {
                tensor: TensorId::of(t),
                bytes: moved(self, t),
                load: false,
            });
        }
    }

    /// [`lower_op`](Self::lower_op), or (estimates) the replay of an identical node's
    /// lowering. A node's temporaries spread from a tile its key picks
    /// ([`start_tile`](Self::start_tile)), so identical nodes share their layouts: PopART
    /// grows an outlined subgraph once, so the repeats of a layer share its layouts. Nodes
    /// that are never reused spread from a tile their name picks.
    fn lower_op_reusing(&mut self, i: NodeId, memo: &mut memo::Memo) {
        let Some((key, refs)) = memo.take_key(i) else {
            self.cursor = self.start_tile_of_name(self.node(i).name());
            return self.lower_op(i);
        };
        self.cursor = self.start_tile(key);
        if !(self.summaries.is_some() && memo.replay(self, key, i, &refs)) {
            let (step0, tensor0) = (self.steps.len(), self.tensors.len());
            self.lower_op(i);
            if self.summaries.is_some() {
                memo.record(self, key, i, refs, step0, tensor0);
            }
        }
    }

    /// A lowering of the same graph tensors with no steps or temporaries yet, for lowering
    /// single nodes apart ([`memo::Memo::prelower`]).
    fn fork(&self) -> Lowering<'a, S> {
        Lowering {
            cfg: self.cfg,
            plan: self.plan,
            graph: self.graph,
            opts: self.opts,
            tensors: self.tensors.clone(),
            steps: Vec::new(),
            node_steps: Vec::new(),
            cursor: 0,
            mm: self.mm.clone(),
            plans_by_shape: self.plans_by_shape.clone(),
            fc_layers: self.fc_layers.clone(),
            fc_plans: self.fc_plans.clone(),
            machine: self.machine,
            include: self.include.clone(),
            first_readers: self.first_readers.clone(),
            remote: self.remote.clone(),
            offloaded: self.offloaded.clone(),
            summaries: Some(Summaries::default()),
            locality: Locality::default(),
            row_stats: Vec::new(),
            layouts: self.layouts.clone(),
            spread: self.spread.clone(),
        }
    }

    /// Drops what a fork's last node made: its steps, temporaries and what is known of them.
    fn forget_from(&mut self, tensors: usize) {
        self.tensors.truncate(tensors);
        self.steps.clear();
        self.summaries = Some(Summaries::default());
        self.row_stats.clear();
    }

    /// The one place lowering dispatches to the families.
    fn lower_op(&mut self, i: NodeId) {
        let node = self.node(i);
        match *node.op() {
            Op::Input => self.steps.push(Step::HostToDevice {
                tensor: TensorId::of(i),
                bytes: node.bytes() as u64,
            }),
            Op::Variable { .. } | Op::Constant { .. } => {}
            Op::Elementwise(e) => elementwise::lower(self, i, &e),
            Op::MatMul(_) | Op::Conv(_) => matmul::lower(self, i),
            Op::Pool(p) => pool::lower(self, i, &p),
            Op::Norm(n) => norm::lower(self, i, &n),
            Op::Gather(g) => gather::lower(self, i, &g),
            Op::Random(r) => random::lower(self, i, &r),
            Op::Softmax(s) => softmax::lower(self, i, &s),
            Op::Loss(l) => loss::lower(self, i, &l),
            Op::Reduce(r) => reduce::lower(self, i, &r),
            Op::Layout(l) => layout::lower(self, i, &l),
            Op::Update(u) => update::lower(self, i, &u),
        }
        if node
            .roles()
            .intersects(Roles::TAPPED | Roles::LOSS | Roles::OUTPUT)
            && !node.op().is_update()
        {
            self.steps.push(Step::DeviceToHost {
                tensor: self.t(i),
                bytes: node.bytes() as u64,
            });
        }
    }

    /// How a family wants `i`'s output laid out.
    fn layout_of(&self, i: NodeId) -> Placement {
        let node = self.node(i);
        match node.op() {
            // Sources: spread by rows (a weight a product reads first is laid out by that
            // product instead, see `map_graph_tensors`).
            Op::Input | Op::Variable { .. } | Op::Constant { .. } => Placement::Rows(1),
            Op::Elementwise(e) => elementwise::placement(self, node, e),
            Op::MatMul(_) | Op::Conv(_) => matmul::placement(),
            Op::Norm(n) => norm::placement(self, node, n),
            Op::Gather(g) => gather::placement(node, g),
            Op::Pool(p) => pool::placement(p),
            Op::Random(r) => random::placement(r),
            Op::Softmax(s) => softmax::placement(node, s),
            Op::Loss(l) => loss::placement(l),
            Op::Reduce(r) => reduce::placement(self, node, r),
            Op::Layout(l) => layout::placement(l),
            Op::Update(u) => update::placement(u),
        }
    }

    /// Lays out every graph tensor of this IPU.
    fn map_graph_tensors(&mut self) {
        let mut outlined = Outlined::default();
        // Large layouts made so far, by digest: an equal one made again (a dense block's
        // concatenation and the gradient flowing into it) shares the first one's intervals
        // and what is computed of them (runs per tile, by-tile order, sums).
        let mut made: HashMap<u128, Mapping> = HashMap::new();
        for i in self.graph.ids() {
            let node = self.node(i);
            let k = i.index();
            let here = self.include[k] || self.remote[k];
            let hint = self.layout_of(i);
            let view = self.plan.slots()[k].view_of.is_some();
            let elements = if matches!(hint, Placement::Nothing) || view || !here {
                0
            } else {
                node.shape().elements() as u64
            };
            let class = if self.plan.slots()[k].place == Place::State
                && self.include[k]
                && !self.offloaded[k]
            {
                TensorClass::AlwaysLive
            } else {
                TensorClass::NotAlwaysLive
            };
            let es = node.dtype().size() as u64;
            let cols = node.shape().last() as u64;
            // A product written straight from the AMP (no reduction) is interleaved.
            let mut interleaved = false;
            let mapping = if elements == 0 {
                Mapping::default()
            } else if !self.include[k] {
                // A copy of another IPU's tensor, laid out as its tensor is there.
                self.layouts
                    .as_ref()
                    .expect("`lower_with` gives the layouts when there are copies")[k]
                    .clone()
            } else if let Some((product, operand)) = self.laying_out_consumer(i) {
                matmul::operand_mapping(self, product, operand)
            } else if let Some(var) = self.state_owner(i) {
                self.tensors[var.index()].mapping.clone()
            } else if let Some(x) = self.elementwise_partner(i, elements) {
                if x.index() < k {
                    self.tensors[self.t(x).index()].mapping.clone()
                } else {
                    matmul::output_mapping(self, x).0
                }
            } else if let Some(m) = self.image_of(i, &hint) {
                m
            } else {
                match hint {
                    Placement::Own => {
                        let (mapping, amp_written) = matmul::output_mapping(self, i);
                        interleaved = amp_written;
                        mapping
                    }
                    Placement::Like(x) if self.tensors[self.t(x).index()].elements == elements => {
                        // Laid out like its operand (as poplibs clones it), so the op needs no
                        // exchange and the next op sees the same layout.
                        self.tensors[self.t(x).index()].mapping.clone()
                    }
                    _ => {
                        let (grain, weight) = match hint {
                            Placement::Rows(grain) => (grain, es),
                            Placement::Weighted(bytes) => (1, bytes.max(es)),
                            _ => (1, es),
                        };
                        match outlined.key(self, i) {
                            Some(key) => match outlined.first.get(&key) {
                                Some(&like) => self.tensors[like.index()].mapping.clone(),
                                None => {
                                    outlined
                                        .first
                                        .insert(key, TensorId(self.tensors.len() as u32));
                                    self.cursor = self.start_tile(key);
                                    self.linear(elements, weight, grain, cols)
                                }
                            },
                            None => {
                                self.cursor = self.start_tile(self.identity(i));
                                self.linear(elements, weight, grain, cols)
                            }
                        }
                    }
                }
            };
            let mapping = shared_layout(&mut made, mapping);
            let t = self.new_tensor(
                node.name().to_string(),
                i,
                node.dtype(),
                elements,
                mapping,
                class,
            );
            self.tensors[t.index()].interleaved = interleaved;
        }
    }

    /// The layout of layout op `i` placed as [`Placement::Image`], when its operands are laid
    /// out here.
    fn image_of(&self, i: NodeId, hint: &Placement) -> Option<Mapping> {
        let (Placement::Image, Op::Layout(op)) = (hint, self.node(i).op()) else {
            return None;
        };
        let m = layout::image_mapping(self, i, op);
        (!m.intervals().is_empty()).then_some(m)
    }

    /// The product that reads state tensor `i` first and lays it out, and which of its
    /// operands `i` is.
    fn laying_out_consumer(&mut self, i: NodeId) -> Option<(NodeId, Operand)> {
        if !self.node(i).op().is_state() {
            return None;
        }
        let c = self.first_consumer(i)?;
        let operand = match self.node(c).op() {
            Op::MatMul(m) if m.b == i => Operand::B,
            Op::MatMul(m) if m.a == i => Operand::A,
            Op::Conv(tessera_core::ops::conv::Conv::Forward { w, .. }) if *w == i => Operand::B,
            _ => return None,
        };
        matmul::lays_out(self, c, operand).then_some((c, operand))
    }

    /// The operand that state tensor `i` (of `elements` elements) is laid out like: its first
    /// reader is an elementwise op whose other operand has as many elements and is already
    /// laid out, or is a product's output (laid out by its plan). poplibs clones such an
    /// operand's layout (`graph.clone`, as `general_matrix_multiply` makes `C` for
    /// `C += A . B`), so the op needs no exchange.
    fn elementwise_partner(&mut self, i: NodeId, elements: u64) -> Option<NodeId> {
        if !self.node(i).op().is_state() {
            return None;
        }
        let c = self.first_consumer(i)?;
        let Op::Elementwise(e) = self.node(c).op() else {
            return None;
        };
        let x = *e.operands().as_slice().iter().find(|&&x| x != i)?;
        if self.node(x).shape().elements() as u64 != elements || !self.include[x.index()] {
            return None;
        }
        if x.index() < i.index() {
            return (self.tensors[self.t(x).index()].elements == elements).then_some(x);
        }
        matches!(self.node(x).op(), Op::MatMul(_) | Op::Conv(_)).then_some(x)
    }

    /// The variable whose update uses optimizer-state or accumulator tensor `i`, if any.
    fn state_owner(&self, i: NodeId) -> Option<NodeId> {
        let node = self.node(i);
        if !node
            .roles()
            .intersects(Roles::OPTIMIZER_STATE | Roles::ACCUMULATOR)
        {
            return None;
        }
        self.graph
            .nodes()
            .iter()
            .find_map(|n| match n.op() {
                Op::Update(u) if u.operands().as_slice()[1..].contains(&i) => {
                    u.operands().as_slice().first().copied()
                }
                _ => None,
            })
            .filter(|&var| self.node(var).shape() == node.shape())
    }
}

/// Lowers `plan` onto one IPU described by `cfg`.
pub fn lower<S: Storage>(plan: &Plan<S>, cfg: &IpuConfig, opts: LowerOptions) -> Program
where
    Plan<S>: Sync,
    Graph<S>: Sync,
{
    lower_subset(plan, cfg, opts, &|_| true)
}

/// Lowers the nodes `include` selects onto one IPU (one IPU of a sharded or pipelined system).
/// Tensors of other IPUs that these nodes read arrive over the IPU-Links into copies here;
/// state tensors (weights, counters) that these nodes read are kept here too.
pub fn lower_subset<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: LowerOptions,
    include: &dyn Fn(usize) -> bool,
) -> Program
where
    Plan<S>: Sync,
    Graph<S>: Sync,
{
    lower_with(plan, cfg, opts, include, false, None).0
}

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

/// Tensors that every vertex of a compute set reads the same way from its tile of `over`'s
/// layout (one vertex per tile of the layout, in its order), and reads nothing else of: the
/// tile's runs, or a broadcast operand's elements that the tile's elements read ([`PerTile`]).
/// What each such read adds to the exchange is kept for compute sets that read alike
/// ([`RunReads`]).
pub(crate) struct Runs {
    /// The tensor on whose layout's tiles the vertices are.
    pub(crate) over: TensorId,
    /// The tensors read so, with how each tile reads them.
    pub(crate) tensors: Vec<(TensorId, PerTile)>,
}

impl Runs {
    /// Each of `tensors` read as the tiles' runs of `over`'s layout.
    pub(crate) fn of(over: TensorId, tensors: impl IntoIterator<Item = TensorId>) -> Self {
        Runs {
            over,
            tensors: tensors.into_iter().map(|t| (t, PerTile::Runs)).collect(),
        }
    }
}

/// The regions of a broadcast operand (of shape `from`) that elements of the output (of shape
/// `to`) read, one span per run along the output's last axis, with the operand's strides
/// worked out once for the many intervals of a mapping.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BroadcastReads {
    /// The operand.
    t: TensorId,
    /// How the operand's elements are read.
    kind: BroadcastKind,
    /// The output's rank.
    rank: usize,
    /// Operand strides in output coordinates (0 on broadcast axes).
    strides: [u64; tessera_core::MAX_RANK],
    /// Elements along the output's last axis.
    cols: u64,
    /// Rows reading the same element (constant along the last axis): those that differ only
    /// along broadcast axes just above the last.
    same_rows: u64,
    /// The outermost axis above the last along which the operand moves (`rank - 1` when
    /// none does): the axes outside it add nothing to an offset.
    top: usize,
    /// Division by `cols`, by `same_rows` and by each of the output's dims, as
    /// multiplications: a large mapping's intervals each take a few divisions by them, which
    /// were a few percent of a large model's estimate.
    by_cols: StrengthReducedU64,
    by_same_rows: StrengthReducedU64,
    by_dim: [StrengthReducedU64; tessera_core::MAX_RANK],
}

/// How a broadcast operand is read ([`BroadcastReads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BroadcastKind {
    /// The operand has the output's shape.
    Same,
    /// The operand is one element.
    Scalar,
    /// Rows of the output read one element each.
    PerRow,
    /// Rows of the output read a run each.
    Runs,
}

impl BroadcastReads {
    /// The reads of operand `t` of shape `from` broadcast to `to`.
    pub(crate) fn new(t: TensorId, from: tessera_core::Shape, to: tessera_core::Shape) -> Self {
        let rank = to.rank();
        let mut dims = [0u64; tessera_core::MAX_RANK];
        let mut strides = [0u64; tessera_core::MAX_RANK];
        for (i, d) in dims.iter_mut().enumerate().take(rank) {
            *d = to.dim(i) as u64;
        }
        let kind = if from == to {
            BroadcastKind::Same
        } else if from.elements() == 1 {
            BroadcastKind::Scalar
        } else {
            let pad = rank - from.rank();
            let mut s = 1u64;
            for i in (0..rank).rev() {
                let d = if i >= pad { from.dim(i - pad) } else { 1 } as u64;
                strides[i] = if d == 1 && dims[i] != 1 { 0 } else { s };
                s *= d;
            }
            if strides[rank - 1] == 0 {
                BroadcastKind::PerRow
            } else {
                BroadcastKind::Runs
            }
        };
        let same_rows: u64 = (0..rank.saturating_sub(1))
            .rev()
            .take_while(|&i| strides[i] == 0 || dims[i] == 1)
            .map(|i| dims[i])
            .product();
        let top = (0..rank.saturating_sub(1))
            .find(|&i| strides[i] != 0)
            .unwrap_or(rank.saturating_sub(1));
        let cols = if rank == 0 { 1 } else { dims[rank - 1] };
        // (A dim of 0 leaves nothing to read: its divisor is never used.)
        let reduced = |d: u64| StrengthReducedU64::new(d.max(1));
        BroadcastReads {
            t,
            kind,
            rank,
            strides,
            cols,
            same_rows: same_rows.max(1),
            top,
            by_cols: reduced(cols),
            by_same_rows: reduced(same_rows),
            by_dim: dims.map(reduced),
        }
    }

    /// The operand offset of (row, c0): the row's index along each axis from the last but one
    /// out to [`top`](Self::top), times the operand's stride there (axes it is broadcast
    /// along only divide the row), the divisions reduced.
    fn offset(&self, row: u64, c0: u64) -> u64 {
        let (top, last) = (self.top, self.rank - 1);
        c0 * self.strides[last]
            + weighted_digits(row, &self.by_dim[top..last], &self.strides[top..last])
    }

    /// Appends the reads of output elements `start .. start + len` to `out` (a region equal
    /// to the last one there is not repeated).
    pub(crate) fn push(&self, start: u64, len: u64, out: &mut Vec<Region>) {
        let t = self.t;
        let mut push = |r: Region| {
            if out.last() != Some(&r) {
                out.push(r);
            }
        };
        match self.kind {
            BroadcastKind::Same => return push(Region::span(t, start, len)),
            BroadcastKind::Scalar => return push(Region::span(t, 0, 1)),
            _ => {}
        }
        let cols = self.cols;
        if len == 0 || cols == 0 {
            return;
        }
        if self.kind == BroadcastKind::PerRow {
            // Each row reads one element; rows that differ only along broadcast axes just
            // above the last (a channel's positions) read the same one: step over them.
            let same_rows = self.same_rows;
            let (first, last) = (start / self.by_cols, (start + len - 1) / self.by_cols);
            let mut row = first;
            while row <= last {
                push(Region::span(t, self.offset(row, 0), 1));
                row = (row / self.by_same_rows + 1) * same_rows;
            }
            return;
        }
        for (row, c0, c1) in row_segments(start, len, cols) {
            push(Region::span(t, self.offset(row, c0), c1 - c0));
        }
    }
}

/// The sum of `value`'s digits in the mixed radix `radices` (outermost first) times
/// `weights`: a row's offset in a tensor of those dims and strides, or an element's group. A
/// digit of weight 0 only divides, and the outermost is not divided out.
/// The radices may be plain `u64`s or divisors made once (`StrengthReducedU64`).
pub(crate) fn weighted_digits<R>(mut value: u64, radices: &[R], weights: &[u64]) -> u64
where
    R: Copy,
    u64: std::ops::Rem<R, Output = u64> + std::ops::Div<R, Output = u64>,
{
    let mut sum = 0;
    for (k, (&r, &w)) in radices.iter().zip(weights).enumerate().rev() {
        if w != 0 {
            sum += (value % r) * w;
        }
        if k > 0 {
            value = value / r;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use tessera_core::models::{bert, mnist_cnn, Bert};
    use tessera_core::{Accumulation, DType, Graph, Optimizer, Plan};

    use super::*;
    use crate::exchange::summarize;
    use crate::heap::Heap;
    use crate::machine::Preset;
    use crate::memory::{account, account_with};
    use crate::planner::AVAILABLE_MEMORY_PROPORTION;

    /// A large layout equal to one made before shares that one's intervals (and so what is
    /// derived of them); a different one, or a small one, is kept as it was made.
    #[test]
    fn equal_large_layouts_are_shared() {
        let spread = |n: u64, shift: u32| {
            Mapping::from_intervals(
                (0..n)
                    .map(|k| Interval {
                        tile: TileId(((k as u32) + shift) % 1472),
                        start: k * 3,
                        len: 3,
                    })
                    .collect(),
            )
        };
        let big = SHARED_LAYOUT_FROM as u64;
        let mut made = HashMap::new();
        let first = shared_layout(&mut made, spread(big, 0));
        let again = shared_layout(&mut made, spread(big, 0));
        assert_eq!(first.intervals().as_ptr(), again.intervals().as_ptr());
        let other = shared_layout(&mut made, spread(big, 1));
        assert_ne!(first.intervals().as_ptr(), other.intervals().as_ptr());
        assert_ne!(first, other);
        let small = shared_layout(&mut made, spread(big - 1, 0));
        let small_again = shared_layout(&mut made, spread(big - 1, 0));
        assert_eq!(small, small_again);
        assert_ne!(small.intervals().as_ptr(), small_again.intervals().as_ptr());
    }

    /// The regions of a broadcast operand (of shape `from`) that elements `start .. start + len`
    /// of the output (of shape `to`) read: one span per run along the output's last axis.
    fn broadcast_reads(
        t: TensorId,
        from: tessera_core::Shape,
        to: tessera_core::Shape,
        start: u64,
        len: u64,
    ) -> Vec<Region> {
        let mut out = Vec::new();
        BroadcastReads::new(t, from, to).push(start, len, &mut out);
        out
    }

    /// Lowering with summaries gives the program lowering with transfers gives, less the
    /// transfers, and each exchange's summary is the summary of its transfers.
    /// Returns how many node lowerings the summarised lowering reused, and how many it made
    /// and recorded afresh.
    fn same_both_ways<S: Storage>(
        plan: &Plan<S>,
        cfg: &IpuConfig,
        opts: LowerOptions,
    ) -> (usize, usize)
    where
        Plan<S>: Sync,
        Graph<S>: Sync,
    {
        let g = plan.graph();
        let (mut reused, mut lowered) = (0, 0);
        for stage in 0..g.stage_count() {
            let include = |i: usize| g.nodes()[i].stage() == stage;
            let (r, exchanges, fresh) = same_both_ways_on(plan, cfg, opts, &include);
            assert!(exchanges > 0);
            reused += r;
            lowered += fresh;
        }
        (reused, lowered)
    }

    /// [`same_both_ways`] for the nodes `include` takes; returns the lowerings reused, the
    /// exchanges and the lowerings made afresh.
    fn same_both_ways_on<S: Storage>(
        plan: &Plan<S>,
        cfg: &IpuConfig,
        opts: LowerOptions,
        include: &dyn Fn(usize) -> bool,
    ) -> (usize, usize, usize)
    where
        Plan<S>: Sync,
        Graph<S>: Sync,
    {
        let (full, none) = lower_with(plan, cfg, opts, &include, false, None);
        let (lean, summaries) = lower_with(plan, cfg, opts, &include, true, None);
        assert_eq!(full.tensors, lean.tensors);
        assert_eq!(full.node_steps, lean.node_steps);
        assert_eq!(full.steps.len(), lean.steps.len());
        let mut exchanges = 0;
        for (s, (a, b)) in full.steps.iter().zip(&lean.steps).enumerate() {
            match (a, b) {
                (Step::Exchange { node, transfers }, Step::Exchange { node: n2, .. }) => {
                    assert_eq!(node, n2);
                    let want = summarize(cfg.tiles, &full.tensors, transfers);
                    assert_eq!(summaries.get(s), Some(&want), "step {s}");
                    exchanges += 1;
                }
                (Step::Compute(x), Step::Compute(y)) => {
                    assert!(y.vertices.is_empty(), "step {s} kept its vertices");
                    assert_eq!(x.clone().without_vertices(), *y, "step {s}");
                }
                _ => assert_eq!(a, b),
            }
        }
        assert_eq!(account(&full, cfg), account_with(&lean, &summaries, cfg));
        assert_eq!(
            crate::estimate::cost_steps_with(&full, &none, cfg, 0..full.steps.len()),
            crate::estimate::cost_steps_with(&lean, &summaries, cfg, 0..lean.steps.len())
        );
        (summaries.reused, exchanges, summaries.lowered)
    }

    /// A two-layer BERT small enough for full lowerings, on `stages` stages, untrained.
    fn tiny_bert(stages: usize, dtype: DType) -> (Graph<Heap>, NodeId) {
        let c = Bert {
            layers: 2,
            hidden: 32,
            heads: 4,
            intermediate: 64,
            sequence: 8,
            batch: 2,
            vocabulary: 40,
            stages,
        };
        let mut g: Graph<Heap> = Graph::new();
        let loss = bert(&mut g, &c, dtype).unwrap().loss;
        (g, loss)
    }

    #[test]
    fn summarized_lowering_equals_lowering_with_transfers() {
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let (mut g, loss) = tiny_bert(2, DType::F16);
        g.differentiate_accumulating(loss, Optimizer::adam(1e-3), Accumulation::new(4))
            .unwrap();
        let plan = Plan::new(&g).unwrap();
        for offload in [false, true] {
            let opts = LowerOptions {
                min_chunk_bytes: 16,
                offload_optimizer_state: offload,
                ..LowerOptions::default()
            };
            // The two layers are alike: the second's nodes reuse the first's lowerings.
            let (reused, lowered) = same_both_ways(&plan, &cfg, opts);
            assert!(reused > 20);
            if offload {
                // Only nodes that read or make optimizer state lower afresh: every other
                // node reuses its record from the lowering without offloading before.
                let state = |x: NodeId| g.node(x).roles().contains(Roles::OPTIMIZER_STATE);
                let touching = g
                    .nodes()
                    .iter()
                    .enumerate()
                    .filter(|(i, node)| {
                        state(NodeId::from_index(*i as u32))
                            || node.op().operands().as_slice().iter().any(|&o| state(o))
                    })
                    .count();
                assert!(touching > 0);
                assert!(
                    lowered <= touching,
                    "{lowered} lowered afresh, {touching} touch state"
                );
            }
        }

        let mut g: Graph<Heap> = Graph::new();
        let m = mnist_cnn(&mut g, 4, DType::F32).unwrap();
        let labels = g.input("labels", &[4], DType::I32).unwrap();
        let loss = g
            .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
            .unwrap();
        g.differentiate(loss, Optimizer::momentum(0.1, 0.9))
            .unwrap();
        let plan = Plan::new(&g).unwrap();
        same_both_ways(&plan, &cfg, LowerOptions::default());
    }

    /// A transpose, a concatenation and a slice keep every element on the tile of the
    /// operand element it copies (PopART's `cloneNcopy` of a view): their copies exchange
    /// nothing, and the product reading the transposed tensor receives it from the tiles of
    /// the product that made it.
    #[test]
    fn layout_ops_keep_each_element_on_its_tile() {
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[48, 32], DType::F32).unwrap();
        let w = g.input("w", &[32, 40], DType::F32).unwrap();
        let y = g.matmul("y", x, w).unwrap();
        let t = g.transpose("t", y, &[1, 0]).unwrap();
        let c = g.concat("c", y, y).unwrap();
        let s = g.slice("s", c, 1, 8, 48).unwrap();
        let v = g.input("v", &[48, 16], DType::F32).unwrap();
        g.matmul("z", t, v).unwrap();
        let plan = Plan::new(&g).unwrap();
        let p = lower(&plan, &cfg, LowerOptions::default());
        crate::check::check(&p).unwrap();
        let tensor = |name: &str| p.tensors.iter().find(|t| t.name == name).unwrap();
        let tile_of = |name: &str, at: u64| {
            let m = &tensor(name).mapping;
            m.intervals()
                .iter()
                .find(|iv| iv.start <= at && at < iv.end())
                .unwrap()
                .tile
        };
        for r in 0..48u64 {
            for col in 0..40u64 {
                let here = tile_of("y", r * 40 + col);
                assert_eq!(tile_of("t", col * 48 + r), here, "t[{col}, {r}]");
                assert_eq!(tile_of("c", r * 80 + col), here, "c[{r}, {col}]");
                assert_eq!(
                    tile_of("c", r * 80 + 40 + col),
                    here,
                    "c[{r}, {}]",
                    40 + col
                );
                if (8..56).contains(&(col + 40)) {
                    assert_eq!(tile_of("s", r * 48 + col + 40 - 8), here);
                }
                if (8..40).contains(&col) {
                    assert_eq!(tile_of("s", r * 48 + col - 8), here);
                }
            }
        }
        // The layout ops' copies are on-tile: no exchange precedes them.
        for (k, step) in p.steps.iter().enumerate() {
            let Step::Compute(cs) = step else { continue };
            if ["t/", "c/", "s/"].iter().any(|n| cs.name.starts_with(n)) {
                let before = k.checked_sub(1).map(|j| &p.steps[j]);
                assert!(
                    !matches!(before, Some(Step::Exchange { node, .. }) if *node == cs.node),
                    "{} exchanges",
                    cs.name
                );
            }
        }
        let _ = s;
    }

    /// A norm's statistics are mapped by use (poplin's `createBroadcastOperand`): each group's
    /// statistics sit on a tile that holds elements of that group.
    #[test]
    fn norm_statistics_sit_on_tiles_that_hold_their_groups() {
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let mut g: Graph<Heap> = Graph::new();
        // Channels in the middle (NCHW-like): groups are channels, reduced over the rest.
        let x = g.input("x", &[4, 24, 8, 8], DType::F32).unwrap();
        g.normalize("n", x, &[0, 2, 3], 1e-5).unwrap();
        let plan = Plan::new(&g).unwrap();
        let p = lower(&plan, &cfg, LowerOptions::default());
        crate::check::check(&p).unwrap();
        let by_name = |name: &str| p.tensors.iter().find(|t| t.name == name).unwrap();
        let xs = &by_name("x").mapping;
        let stats = &by_name("n/statistics").mapping;
        assert_eq!(
            stats.intervals().iter().map(|iv| iv.len).sum::<u64>(),
            2 * 24
        );
        for iv in stats.intervals() {
            for v in iv.start..iv.end() {
                // A grain of two channels goes together: this channel or its partner.
                let channel = v / 2;
                let grain = channel / 2 * 2..(channel / 2 * 2 + 2).min(24);
                let holds = grain.clone().any(|c| {
                    // Elements of channel c: image n, positions 0..64.
                    (0..4u64).any(|n| {
                        let first = (n * 24 + c) * 64;
                        xs.intervals()
                            .iter()
                            .any(|x| x.tile == iv.tile && x.start < first + 64 && first < x.end())
                    })
                });
                assert!(
                    holds,
                    "channel {channel}'s statistics on tile {:?}",
                    iv.tile
                );
            }
        }
    }

    #[test]
    fn later_lowerings_replay_earlier_ones_exactly() {
        // A machine of its own, so that no other test's records are replayed here.
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(53);
        let model = |stages: usize| {
            let (mut g, loss) = tiny_bert(stages, DType::F32);
            g.differentiate(loss, Optimizer::adam(1e-3)).unwrap();
            g
        };
        let opts = LowerOptions {
            min_chunk_bytes: 16,
            offload_optimizer_state: false,
            ..LowerOptions::default()
        };
        let (one, two) = (model(1), model(2));
        let (one, two) = (Plan::new(&one).unwrap(), Plan::new(&two).unwrap());
        // The first lowering makes each kind of node once and replays it for every node of
        // that kind; the same lowering again makes nothing afresh and replays as much; the
        // one-stage split's IPU (its layers' tensors laid out as in the two stages) makes
        // only what differs at the stages' boundary (copies from the other IPU, first
        // readers) and replays the rest, exactly.
        let (first, made) = same_both_ways(&two, &cfg, opts);
        assert!(made > 0 && first > made, "{first} reused, {made} made");
        let (again, made_again) = same_both_ways(&two, &cfg, opts);
        assert_eq!((again, made_again), (first, 0));
        let (whole, made_whole) = same_both_ways(&one, &cfg, opts);
        assert!(
            made_whole < made && whole > first / 2,
            "one stage: {whole} reused, {made_whole} made; two stages: {first}, {made}"
        );
        // Other options are another context: nothing recorded under these is replayed.
        let other = LowerOptions {
            min_chunk_bytes: 32,
            ..opts
        };
        same_both_ways(&one, &cfg, other);
    }

    #[test]
    fn records_replay_exactly_in_lowerings_of_any_nodes() {
        // Lowerings of contiguous and scattered node sets of one training graph, one after
        // the other: a forward matmul without its weight's update, an update without its
        // forward, tensors spread from other starts. Each replays what the earlier ones
        // recorded and equals its full lowering.
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(47);
        let (mut g, loss) = tiny_bert(1, DType::F32);
        g.differentiate(loss, Optimizer::adam(1e-3)).unwrap();
        let plan = Plan::new(&g).unwrap();
        let len = g.len();
        let opts = LowerOptions {
            min_chunk_bytes: 16,
            offload_optimizer_state: false,
            ..LowerOptions::default()
        };
        let mut reused = 0;
        // Every node but those of one residue modulo m; then the first and the last q/8.
        for m in 2..=7 {
            for r in 0..m {
                reused += same_both_ways_on(&plan, &cfg, opts, &|i| i % m != r).0;
            }
        }
        for q in 1..8 {
            let cut = len * q / 8;
            reused += same_both_ways_on(&plan, &cfg, opts, &|i| i < cut).0;
            reused += same_both_ways_on(&plan, &cfg, opts, &|i| i >= cut).0;
        }
        assert!(reused > 100, "{reused} reused");
    }

    #[test]
    fn a_trained_layers_input_gradient_reads_its_weights_transposed_on_their_tiles() {
        // Two dense layers: the second's input gradient (dY . W^T) exists, the first's not.
        let cfg = IpuConfig::preset(Preset::Mk1).with_tiles(64);
        let build = |train: bool| dense_net(8, 64, &[48, 10], train);
        let g = build(true);
        let plan = Plan::new(&g).unwrap();
        let program = lower(&plan, &cfg, LowerOptions::default());
        let sets: Vec<&ComputeSet> = program
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Compute(cs) => Some(cs),
                _ => None,
            })
            .collect();
        let transposes: Vec<&&ComputeSet> = sets
            .iter()
            .filter(|cs| cs.name.ends_with("/weight transpose"))
            .collect();
        assert_eq!(
            transposes.len(),
            1,
            "{:?}",
            sets.iter().map(|c| &c.name).collect::<Vec<_>>()
        );
        let cs = transposes[0];
        let weight = cs.vertices[0].reads[0].tensor;
        assert!(
            program.tensors[weight.index()].name.starts_with("fc2"),
            "{}",
            program.tensors[weight.index()].name
        );
        let copy = cs.vertices[0].writes[0].tensor;
        let (w, t) = (
            &program.tensors[weight.index()],
            &program.tensors[copy.index()],
        );
        assert!(t.name.ends_with("/weights transposed"));
        assert_eq!(
            (t.elements, t.dtype, &t.mapping),
            (w.elements, w.dtype, &w.mapping)
        );
        // Every element is transposed once, on the tile that holds it.
        let mut seen = vec![0u32; w.elements as usize];
        for v in &cs.vertices {
            assert_eq!(v.codelet, Codelet::Copy);
            assert_eq!(v.reads.len(), v.writes.len());
            for (r, o) in v.reads.iter().zip(&v.writes) {
                assert_eq!(
                    (r.tensor, o.tensor, r.start, r.len),
                    (weight, copy, o.start, o.len)
                );
                w.mapping.for_each_piece(r.start, r.len, |tile, s, len| {
                    assert_eq!(tile, v.tile);
                    for e in s..s + len {
                        seen[e as usize] += 1;
                    }
                });
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        // The input-gradient product reads the copy, never the weight.
        let product: Vec<&&ComputeSet> = sets
            .iter()
            .filter(|c| c.node == t.node && !c.name.ends_with("/weight transpose"))
            .collect();
        assert!(!product.is_empty());
        for c in product {
            for v in &c.vertices {
                assert!(v.reads.iter().all(|r| r.tensor != weight), "{}", c.name);
            }
            assert!(c
                .vertices
                .iter()
                .any(|v| v.reads.iter().any(|r| r.tensor == copy)));
        }
        same_both_ways(&plan, &cfg, LowerOptions::default());
        // Inference transposes nothing.
        let g = build(false);
        let plan = Plan::new(&g).unwrap();
        let program = lower(&plan, &cfg, LowerOptions::default());
        assert!(program
            .steps
            .iter()
            .all(|s| !matches!(s, Step::Compute(cs) if cs.name.ends_with("weight transpose"))));
    }

    #[test]
    fn a_batch_1_layer_on_horizontal_macs_keeps_nothing_in_interleaved_memory() {
        // 1 x 1000 -> 1000 in fp32, trained: planned on HMAC and outer-product vertices, whose
        // outputs need no interleaved memory, so no tile has the AMP's gap below its data.
        let cfg = IpuConfig::preset(Preset::Mk1);
        let g = dense_net(1, 1000, &[1000, 1000], true);
        let plan = Plan::new(&g).unwrap();
        let program = lower(&plan, &cfg, LowerOptions::default());
        assert!(program
            .tensors
            .iter()
            .all(|t| !(t.interleaved && t.name.starts_with("fc"))));
        let report = account(&program, &cfg);
        assert!(
            report.tiles.iter().all(|t| t.gaps == 0),
            "{:?}",
            report.tiles.iter().find(|t| t.gaps > 0)
        );
        same_both_ways(&plan, &cfg, LowerOptions::default());
    }

    #[test]
    fn a_layer_without_its_update_is_lowered_exactly_after_one_with_it() {
        // 1 x 1000 -> 5 is planned jointly when the IPU trains it (forward, input gradient and
        // weight update together), alone when the weight's update is on another IPU; a
        // lowering without the update, after one with it, equals its full lowering.
        let cfg = IpuConfig::preset(Preset::Mk1);
        let g = dense_net(1, 1000, &[5], true);
        let plan = Plan::new(&g).unwrap();
        let update = g
            .nodes()
            .iter()
            .position(|n| matches!(n.op(), Op::Update(_)) && n.name().contains("kernel"))
            .expect("the kernel's update");
        let trained = |include: &dyn Fn(usize) -> bool| {
            let inc: Vec<bool> = (0..g.len()).map(include).collect();
            matmul::trained_fc_layers(&g, &inc).len()
        };
        assert_eq!((trained(&|_| true), trained(&|i| i != update)), (1, 0));
        assert!(crate::planner::plan_fc(&cfg, 1, 1000, 5, DType::F32, cfg.tiles.into()).joint);
        let opts = LowerOptions::default();
        same_both_ways_on(&plan, &cfg, opts, &|_| true);
        same_both_ways_on(&plan, &cfg, opts, &|i| i != update);
    }

    proptest::proptest! {
        /// Row segments cover the range in order, one piece per row it meets, each inside
        /// its row.
        #[test]
        fn row_segments_cut_the_range_at_row_ends(
            start in 0u64..500,
            len in 0u64..500,
            cols in 1u64..40,
        ) {
            let mut at = start;
            let mut rows = Vec::new();
            for (r, c0, c1) in row_segments(start, len, cols) {
                proptest::prop_assert!(c0 < c1 && c1 <= cols);
                proptest::prop_assert_eq!(r * cols + c0, at);
                at += c1 - c0;
                rows.push(r);
            }
            proptest::prop_assert_eq!(at, start + len);
            let want: Vec<u64> = if len == 0 {
                Vec::new()
            } else {
                (start / cols..=(start + len - 1) / cols).collect()
            };
            proptest::prop_assert_eq!(rows, want);
        }

        /// The broadcast regions are those of reading every row segment on its own, with
        /// repeats of the previous region dropped.
        #[test]
        fn broadcast_reads_are_each_row_segments(
            dims in proptest::collection::vec(1usize..5, 1..5),
            keep in proptest::collection::vec(proptest::bool::ANY, 5),
            lead in 0usize..3,
            start in 0u64..600,
            len in 1u64..300,
        ) {
            let to = tessera_core::Shape::new(&dims).unwrap();
            let from_dims: Vec<usize> =
                dims.iter().zip(&keep).map(|(&d, &k)| if k { d } else { 1 }).collect();
            // The operand's leading axes of size 1 may be left out (a lower rank, as NumPy
            // broadcasting pads it).
            let lead = lead.min(from_dims.len() - 1);
            let dropped = from_dims[..lead].iter().all(|&d| d == 1);
            let from = if dropped {
                tessera_core::Shape::new(&from_dims[lead..]).unwrap()
            } else {
                tessera_core::Shape::new(&from_dims).unwrap()
            };
            let full = tessera_core::Shape::new(&from_dims).unwrap();
            let n = to.elements() as u64;
            let start = start % n;
            let len = len.min(n - start);
            let rank = to.rank();
            let mut strides = [0u64; tessera_core::MAX_RANK];
            let mut s = 1u64;
            for i in (0..rank).rev() {
                let d = full.dim(i) as u64;
                strides[i] = if d == 1 && to.dim(i) != 1 { 0 } else { s };
                s *= d;
            }
            let t = TensorId(0);
            let mut want: Vec<Region> = Vec::new();
            for (row, c0, c1) in row_segments(start, len, to.last() as u64) {
                let mut rem = row;
                let mut off = c0 * strides[rank - 1];
                for i in (0..rank - 1).rev() {
                    let d = to.dim(i) as u64;
                    off += (rem % d) * strides[i];
                    rem /= d;
                }
                let r = if strides[rank - 1] == 0 {
                    Region::span(t, off, 1)
                } else {
                    Region::span(t, off, c1 - c0)
                };
                if want.last() != Some(&r) {
                    want.push(r);
                }
            }
            let got = if from == to {
                vec![Region::span(t, start, len)]
            } else if full.elements() == 1 {
                vec![Region::span(t, 0, 1)]
            } else {
                want.clone()
            };
            proptest::prop_assert_eq!(broadcast_reads(t, from, to, start, len), got);
        }
    }

    #[test]
    fn identical_nodes_share_a_layout_and_no_layout_depends_on_earlier_tensors() {
        // Two transposes of one input are identical: the second is laid out like the first
        // (an outlined subgraph's tensors are laid out once). A transpose of another input is
        // not identical. Tensors laid out before them (here another input and its transpose)
        // move none of their layouts.
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let build = |before: bool| {
            let mut g: Graph<Heap> = Graph::new();
            if before {
                let w = g.input("w", &[8, 40], DType::F32).unwrap();
                g.transpose("w'", w, &[1, 0]).unwrap();
            }
            let x = g.input("x", &[16, 24], DType::F32).unwrap();
            let y = g.input("y", &[16, 24], DType::F32).unwrap();
            let a = g.transpose("a", x, &[1, 0]).unwrap();
            let b = g.transpose("b", x, &[1, 0]).unwrap();
            let c = g.transpose("c", y, &[1, 0]).unwrap();
            g.add("a+b", a, b).unwrap();
            g.add("a+c", a, c).unwrap();
            g
        };
        let opts = LowerOptions::default();
        let (g, g_after) = (build(false), build(true));
        let (plan, plan_after) = (Plan::new(&g).unwrap(), Plan::new(&g_after).unwrap());
        let program = lower(&plan, &cfg, opts);
        let after = lower(&plan_after, &cfg, opts);
        let m = |p: &Program, name: &str| {
            let t = p.tensors.iter().find(|t| t.name == name).unwrap();
            t.mapping.clone()
        };
        assert_eq!(m(&program, "a"), m(&program, "b"));
        assert_ne!(m(&program, "a"), m(&program, "c"));
        for name in ["x", "y", "a", "b", "c", "a+b", "a+c"] {
            assert_eq!(m(&program, name), m(&after, name), "{name}");
        }
        // Spreads start on even tiles, so partner tiles stay paired.
        for t in &program.tensors {
            if let Some(first) = t.mapping.intervals().iter().min_by_key(|iv| iv.start) {
                assert_eq!(first.tile.0 % 2, 0, "{}", t.name);
            }
        }
        same_both_ways(&plan, &cfg, opts);
        same_both_ways(&plan_after, &cfg, opts);
    }

    /// A product whose `k` is split across tiles, lowered with `opts`: its program, and the
    /// bytes and element types of its partial-sum temporaries.
    fn split_product(opts: LowerOptions) -> (Program, u64, Vec<DType>) {
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let mut g: Graph<Heap> = Graph::new();
        let z = tessera_core::Init::Zeros;
        let a = g.variable("A", &[16, 8192], DType::F16, z).unwrap();
        let b = g.variable("B", &[8192, 64], DType::F16, z).unwrap();
        g.matmul("A.B", a, b).unwrap();
        let plan = Plan::new(&g).unwrap();
        let program = lower(&plan, &cfg, opts);
        let partials: Vec<&ProgTensor> = program
            .tensors
            .iter()
            .filter(|t| t.name.contains("/partials"))
            .collect();
        let bytes = partials.iter().map(|t| t.elements * t.elem_bytes()).sum();
        let types = partials.iter().map(|t| t.dtype).collect();
        (program, bytes, types)
    }

    #[test]
    fn half_partials_halve_the_partials_bytes_and_run_the_amp_at_its_fp16_peak() {
        let float = LowerOptions::default();
        let half = LowerOptions {
            plan: crate::planner::PlanOptions {
                partials: crate::planner::PartialsType::Half,
                ..Default::default()
            },
            ..float
        };
        let (pf, float_bytes, float_types) = split_product(float);
        let (ph, half_bytes, half_types) = split_product(half);
        assert!(
            float_bytes > 0,
            "k is split: the product keeps partial sums"
        );
        assert!(
            float_types.iter().all(|&t| t == DType::F32),
            "{float_types:?}"
        );
        assert!(
            half_types.iter().all(|&t| t == DType::F16),
            "{half_types:?}"
        );
        // The same grid both ways (the planner's choice may differ; here it does not), so
        // the partials hold the same elements at half the bytes.
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let plan = |o| {
            let b = crate::planner::LaidOut::B;
            crate::planner::plan_matmul_with(&cfg, 16, 8192, 64, DType::F16, b, 64, o)
        };
        let (mf, mh) = (plan(float.plan), plan(half.plan));
        if (mf.pm, mf.pk, mf.pn, mf.serial) == (mh.pm, mh.pk, mh.pn, mh.serial) {
            assert_eq!(half_bytes * 2, float_bytes);
        } else {
            assert!(half_bytes < float_bytes, "{mf:?} {mh:?}");
        }
        // And the product's compute is cheaper (twice the conv units).
        let compute = |p: &Program| -> u64 {
            p.steps
                .iter()
                .filter_map(|s| match s {
                    Step::Compute(cs) => Some(cs.costs.iter().map(|v| v.cycles).max().unwrap_or(0)),
                    _ => None,
                })
                .sum()
        };
        assert!(compute(&ph) < compute(&pf));
    }

    #[test]
    fn the_available_memory_proportion_bounds_the_planners_temporary_bytes() {
        // A large fp16 product on a few tiles: poplin's first pass keeps each tile's operand
        // copies and partial sums under proportion x SRAM, with serial steps if need be
        // (every bound here can be met; `BoundLevel` ranks plans when none can).
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let (m, k, n) = (512u64, 2048u64, 512u64);
        let options = |proportion| crate::planner::PlanOptions {
            available_memory_proportion: proportion,
            ..Default::default()
        };
        let plan = |proportion| {
            let none = crate::planner::LaidOut::NONE;
            crate::planner::plan_matmul_with(
                &cfg,
                m,
                k,
                n,
                DType::F16,
                none,
                64,
                options(proportion),
            )
        };
        let mut last_cycles = 0;
        for proportion in [1.0, 0.6, 0.3, 0.1] {
            let p = plan(proportion);
            // Temporary bytes of one serial step on a tile: both operands' blocks (none laid
            // out by the plan) and fp32 partials of the block (k is long: a cast follows),
            // with the serial accumulators when there are steps over k.
            let (bk, bn) = (p.bk.div_ceil(p.serial), p.bn.div_ceil(p.serial_n));
            let operands = (p.bm * bk + bk * bn) * 2;
            let partials = p.bm * bn * 4;
            let accumulators = if p.serial > 1 {
                (p.bm * p.bn).div_ceil(p.pk) * 4 * (1 + u64::from(p.pk > 1)) + p.bm * p.bn * 4
                    - partials
            } else {
                0
            };
            let temporary = operands + partials + accumulators;
            let bound = options(proportion).bound_bytes(&cfg);
            assert!(
                temporary <= bound,
                "{proportion}: {temporary} > {bound}: {p:?}"
            );
            // A tighter bound never finds a faster plan.
            assert!(p.planned_cycles >= last_cycles, "{proportion}: {p:?}");
            last_cycles = p.planned_cycles;
        }
        // The bound is what chose: at 0.1 the plan differs from the unbounded one.
        assert_ne!(plan(1.0), plan(0.1));
    }

    #[test]
    fn operands_created_for_a_product_are_laid_out_by_its_plan_and_pairs_share_broadcasts() {
        // C = A . B + C with all three variables, as poplibs' general_matrix_multiply.
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        let (m, k, n) = (64u64, 256u64, 512u64);
        let mut g: Graph<Heap> = Graph::new();
        let z = tessera_core::Init::Zeros;
        let a = g.variable("A", &[64, 256], DType::F16, z).unwrap();
        let b = g.variable("B", &[256, 512], DType::F16, z).unwrap();
        let c = g.variable("C", &[64, 512], DType::F16, z).unwrap();
        let ab = g.matmul("A.B", a, b).unwrap();
        g.add("A.B+C", ab, c).unwrap();
        let plan = Plan::new(&g).unwrap();
        let laid_out = crate::planner::LaidOut { a: true, b: true };
        let p = crate::planner::plan_matmul(&cfg, m, k, n, DType::F16, laid_out, 64);
        assert_eq!(
            p.paired_operand(),
            Some(crate::planner::Operand::A),
            "{p:?}"
        );
        let program = lower(&plan, &cfg, LowerOptions::default());
        // Every element of A is on a tile reading its block: (im, ik, in) for some in.
        for iv in program.tensors[a.index()].mapping.intervals() {
            for e in [iv.start, iv.start + iv.len - 1] {
                let (im, ik) = (e / k / p.bm, e % k / p.bk);
                let readers: Vec<u64> = (0..p.pn).map(|i_n| p.grid(im, ik, i_n)).collect();
                assert!(
                    readers.contains(&u64::from(iv.tile.0)),
                    "element {e}: {iv:?}"
                );
            }
        }
        // C is laid out like A . B: the add moves nothing.
        assert_eq!(
            program.tensors[c.index()].mapping,
            program.tensors[ab.index()].mapping
        );
        let add_first = program.node_steps[g.len() - 1].0;
        assert!(!program.steps[add_first..]
            .iter()
            .any(|s| matches!(s, Step::Exchange { .. })));
        // The product's exchange: both tiles of each pair receive A's block together.
        let transfers = program
            .steps
            .iter()
            .find_map(|s| match s {
                Step::Exchange { transfers, .. } => Some(transfers),
                _ => None,
            })
            .unwrap();
        let x = summarize(cfg.tiles, &program.tensors, transfers);
        let receivers: Vec<_> = x.tiles.iter().filter(|t| t.receives).collect();
        assert!(!receivers.is_empty());
        for t in &receivers {
            assert!(t.paired > 0 && t.paired <= t.received, "{t:?}");
        }
        let most = receivers.iter().map(|t| t.received).max().unwrap();
        assert!(x.busiest < most, "{x:?}");
        same_both_ways(&plan, &cfg, LowerOptions::default());
    }

    #[test]
    fn an_fp16_product_writes_its_output_from_the_amp_only_when_one_input_group_covers_k() {
        // poplin's rule: fp16 products keep fp32 partials (cast or reduced to the output)
        // unless k fits one AMP input group; fp32 products have fp32 partials anyway.
        let cfg = IpuConfig::preset(Preset::Mk2).with_tiles(64);
        for (dtype, k, amp_may_write) in [
            (DType::F16, 64, false),
            (DType::F16, 300, false),
            (DType::F16, 16, true),
            (DType::F32, 64, true),
        ] {
            let mut g: Graph<Heap> = Graph::new();
            let a = g
                .variable("a", &[96, k], dtype, tessera_core::Init::Zeros)
                .unwrap();
            let b = g.input("b", &[k, 200], dtype).unwrap();
            let c = g.matmul("c", a, b).unwrap();
            let plan = Plan::new(&g).unwrap();
            let program = lower(&plan, &cfg, LowerOptions::default());
            let out = TensorId::of(plan.storage_of(c));
            let writers: Vec<Codelet> = program
                .steps
                .iter()
                .filter_map(|s| match s {
                    Step::Compute(cs) => Some(cs),
                    _ => None,
                })
                .flat_map(|cs| &cs.vertices)
                .filter(|v| v.writes.iter().any(|r| r.tensor == out))
                .map(|v| v.codelet)
                .collect();
            let case = format!("{dtype:?}, k = {k}: {writers:?}");
            assert!(!writers.is_empty(), "{case}");
            let from_amp = writers.iter().all(|&w| w == Codelet::MatMulPartial);
            let from_stage = writers
                .iter()
                .all(|&w| matches!(w, Codelet::Cast(_) | Codelet::Reduce(_)));
            assert!(from_amp || from_stage, "{case}");
            if !amp_may_write {
                assert!(from_stage, "{case}");
            }
            // The AMP's outputs live in interleaved memory; a cast's or reduction's do not.
            assert_eq!(program.tensors[out.index()].interleaved, from_amp, "{case}");
            if writers.iter().any(|w| matches!(w, Codelet::Cast(_))) {
                // A cast reads fp32 partials of the whole output.
                let partials = program
                    .tensors
                    .iter()
                    .find(|t| t.name == "c/partials")
                    .unwrap_or_else(|| panic!("{case}"));
                assert_eq!(partials.dtype, DType::F32, "{case}");
                assert_eq!(partials.elements, 96 * 200, "{case}");
                assert!(partials.interleaved, "{case}");
            }
            same_both_ways(&plan, &cfg, LowerOptions::default());
        }
    }

    /// A classifier of dense layers `fc1`, `fc2`, ... of `widths` on `batch` fp32 inputs of
    /// `input` values (ReLU between, linear last), trained with SGD when `train`.
    fn dense_net(batch: usize, input: usize, widths: &[usize], train: bool) -> Graph<Heap> {
        let mut g: Graph<Heap> = Graph::new();
        let mut h = g.input("x", &[batch, input], DType::F32).unwrap();
        let labels = g.input("labels", &[batch], DType::I32).unwrap();
        for (j, &w) in widths.iter().enumerate() {
            let act = if j + 1 == widths.len() {
                tessera_core::Activation::Linear
            } else {
                tessera_core::Activation::Relu
            };
            h = g
                .dense(&format!("fc{}", j + 1), h, w, act, DType::F32)
                .unwrap();
        }
        let loss = g
            .sparse_categorical_crossentropy("loss", h, labels, true)
            .unwrap();
        if train {
            g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
        }
        g
    }

    /// The compute sets of node `c` (name after `c/`) with their vertices.
    fn compute_sets_of<'p>(program: &'p Program, node: &str) -> Vec<(&'p str, &'p [Vertex])> {
        program
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Compute(cs) => cs
                    .name
                    .strip_prefix(&format!("{node}/"))
                    .map(|n| (n, cs.vertices.as_slice())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn serial_steps_over_k_accumulate_as_poplin_does() {
        // [16, 16384] x [16384, 8] in fp16 on 4 tiles of 48 KiB: the operands are 768 KiB, far
        // over the bound however they are split; the output is too narrow to step over.
        let cfg = IpuConfig::preset(Preset::Mk2)
            .with_tiles(4)
            .with_sram_bytes_per_tile(48 * 1024);
        let mut g: Graph<Heap> = Graph::new();
        let a = g
            .variable("a", &[16, 16384], DType::F16, tessera_core::Init::Zeros)
            .unwrap();
        let b = g.input("b", &[16384, 8], DType::F16).unwrap();
        let c = g.matmul("c", a, b).unwrap();
        let plan = Plan::new(&g).unwrap();
        let program = lower(&plan, &cfg, LowerOptions::default());
        let sets = compute_sets_of(&program, "c");
        let names: Vec<&str> = sets.iter().map(|(n, _)| *n).collect();
        let accumulate: Vec<&[Vertex]> = sets
            .iter()
            .filter(|(n, _)| n.starts_with("accumulate "))
            .map(|(_, v)| *v)
            .collect();
        let steps = accumulate.len();
        assert!(steps > 1, "{names:?}");
        let acc = program
            .tensors
            .iter()
            .position(|t| t.name == "c/accumulator")
            .map(|i| TensorId(i as u32))
            .unwrap_or_else(|| panic!("{names:?}"));
        assert_eq!(program.tensors[acc.index()].dtype, DType::F32);
        // The first step copies its sum into the accumulator; the others add theirs to it.
        for (s, vertices) in accumulate.iter().enumerate() {
            // An in-place add of fp32 values, a vertex type of its own.
            let want = if s == 0 {
                Codelet::Copy
            } else {
                Codelet::Binary(super::elementwise::binary_type(
                    tessera_core::ops::elementwise::BinaryFn::Add,
                    DType::F32,
                    super::elementwise::BinaryForm::InPlace,
                ))
            };
            for v in vertices.iter() {
                assert_eq!(v.codelet, want, "step {s}");
                assert!(v.writes.iter().all(|r| r.tensor == acc));
                assert_eq!(v.reads.iter().any(|r| r.tensor == acc), s > 0, "step {s}");
            }
        }
        // Each step's partial sums are made afresh and dead before the next step's.
        let partials: Vec<&ProgTensor> = (1..=steps)
            .map(|s| {
                let name = format!("c/partials {s}/{steps}");
                program.tensors.iter().find(|t| t.name == name).unwrap()
            })
            .collect();
        for w in partials.windows(2) {
            assert!(w[0].live.1 < w[1].live.0, "{:?} {:?}", w[0].live, w[1].live);
        }
        // After the loop the accumulator is cast to the fp16 output.
        let (last, cast) = sets.last().unwrap();
        assert_eq!(*last, "cast");
        let out = TensorId::of(plan.storage_of(c));
        assert!(cast.iter().all(|v| v.codelet
            == Codelet::Cast(crate::program::VertexType::cast(DType::F32, DType::F16))
            && v.reads.iter().all(|r| r.tensor == acc)
            && v.writes.iter().all(|r| r.tensor == out)));
        same_both_ways(&plan, &cfg, LowerOptions::default());
    }

    #[test]
    fn products_in_serial_steps_pass_the_checker() {
        // Products too big for small tiles, split over k across tiles and in serial steps,
        // with blocks of uneven k (the last shorter than the steps): every step's partials are
        // written before they are reduced or accumulated, and every vertex writes its tile.
        let cfg = IpuConfig::preset(Preset::Mk2)
            .with_tiles(16)
            .with_sram_bytes_per_tile(24 * 1024);
        for (m, k, n, dtype) in [
            (1, 10930, 200, DType::F32),
            (4, 6000, 700, DType::F16),
            (8, 3000, 4000, DType::F16),
            (16, 4000, 48, DType::F16),
        ] {
            let mut g: Graph<Heap> = Graph::new();
            let a = g
                .variable("a", &[m, k], dtype, tessera_core::Init::Zeros)
                .unwrap();
            let b = g.input("b", &[k, n], dtype).unwrap();
            g.matmul("c", a, b).unwrap();
            let plan = Plan::new(&g).unwrap();
            let program = lower(&plan, &cfg, LowerOptions::default());
            crate::check::check(&program).unwrap_or_else(|e| panic!("{m}x{k}x{n} {dtype:?}: {e}"));
            let steps = compute_sets_of(&program, "c")
                .iter()
                .filter(|(n, _)| n.starts_with("partials ") || n.starts_with("matmul "))
                .count();
            assert!(steps > 1, "{m}x{k}x{n} {dtype:?} runs at once");
            if (m, k) == (1, 10930) {
                // Split over k across tiles and in steps, the last block shorter.
                let names: Vec<&str> = compute_sets_of(&program, "c")
                    .iter()
                    .map(|(n, _)| *n)
                    .collect();
                assert!(names.iter().any(|n| n.starts_with("reduce")), "{names:?}");
                assert!(
                    names.iter().any(|n| n.starts_with("accumulate")),
                    "{names:?}"
                );
            }
        }
    }

    #[test]
    fn serial_steps_over_n_write_each_output_element_once() {
        // [64, 64] x [64, 4096] in fp32 on 16 tiles of 48 KiB: steps over the columns.
        let cfg = IpuConfig::preset(Preset::Mk2)
            .with_tiles(16)
            .with_sram_bytes_per_tile(48 * 1024);
        let mut g: Graph<Heap> = Graph::new();
        let a = g
            .variable("a", &[64, 64], DType::F32, tessera_core::Init::Zeros)
            .unwrap();
        let b = g.input("b", &[64, 4096], DType::F32).unwrap();
        let c = g.matmul("c", a, b).unwrap();
        let plan = Plan::new(&g).unwrap();
        let program = lower(&plan, &cfg, LowerOptions::default());
        let sets = compute_sets_of(&program, "c");
        let names: Vec<&str> = sets.iter().map(|(n, _)| *n).collect();
        assert!(
            names.iter().all(|n| !n.starts_with("accumulate")),
            "{names:?}"
        );
        let steps = names
            .iter()
            .filter(|n| n.starts_with("matmul ") || n.starts_with("partials "))
            .count();
        assert!(steps > 1, "{names:?}");
        // Over all steps, every output element is written exactly once.
        let out = TensorId::of(plan.storage_of(c));
        let mut written = vec![0u32; 64 * 4096];
        for (_, vertices) in &sets {
            for r in vertices
                .iter()
                .flat_map(|v| &v.writes)
                .filter(|r| r.tensor == out)
            {
                for row in 0..r.rows {
                    for e in 0..r.len {
                        written[(r.start + row * r.stride + e) as usize] += 1;
                    }
                }
            }
        }
        assert!(written.iter().all(|&w| w == 1), "{names:?}");
        same_both_ways(&plan, &cfg, LowerOptions::default());
    }

    #[test]
    fn a_product_too_big_for_its_tiles_runs_in_serial_steps_under_the_bound() {
        // [64, 4096] x [4096, 64] in fp32 on 16 tiles of 48 KiB: the operands alone are 2 MiB,
        // 128 KiB a tile, far over 0.6 of a tile at once.
        let cfg = IpuConfig::preset(Preset::Mk2)
            .with_tiles(16)
            .with_sram_bytes_per_tile(48 * 1024);
        let mut g: Graph<Heap> = Graph::new();
        let a = g
            .variable("a", &[64, 4096], DType::F32, tessera_core::Init::Zeros)
            .unwrap();
        let b = g.input("b", &[4096, 64], DType::F32).unwrap();
        g.matmul("c", a, b).unwrap();
        let plan = Plan::new(&g).unwrap();
        let program = lower(&plan, &cfg, LowerOptions::default());
        let steps: Vec<&str> = program
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Compute(cs) if cs.name.starts_with("c/") => Some(cs.name.as_str()),
                _ => None,
            })
            .collect();
        let serial = steps
            .iter()
            .filter(|n| n.contains("partials") || n.contains("matmul"))
            .count();
        assert!(serial > 1, "{steps:?}");
        assert!(
            steps.iter().any(|n| n.ends_with(&format!("1/{serial}"))),
            "{steps:?}"
        );
        // Each step brings its share: no tile receives more than the bound in one exchange.
        let bound = (cfg.sram_bytes_per_tile as f64 * AVAILABLE_MEMORY_PROPORTION) as u64;
        let report = account(&program, &cfg);
        for t in &report.tiles {
            assert!(t.exchange_buffers <= bound, "tile {}: {t:?}", t.tile);
        }
        // Estimates (summarised exchanges, reused lowerings) agree with the full lowering.
        same_both_ways(&plan, &cfg, LowerOptions::default());
    }
}
