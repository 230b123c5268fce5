//! Lowering a core plan onto one IPU: every tensor gets a tile mapping, every op becomes
//! compute sets of vertices, and exchanges bring each vertex's operands to its tile.
//!
//! The machinery is here and in the modules beside it: `mapping` lays out the graph tensors,
//! `compute` appends compute sets and the exchanges they need, `node` lowers one node,
//! `assemble` lowers every node into a program and works out liveness, and `reads` describes
//! the regions vertices read. Each op family's tile mapping, vertices and cost live in one
//! module beside it too, mirroring the core's `ops/<family>.rs`:
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

use std::sync::Arc;

use tessera_core::{DType, Graph, Node, NodeId, Op, Plan, Storage};

use crate::exchange::{Locality, SpreadSummaries, Summaries};
use crate::machine::IpuConfig;
use crate::program::{Mapping, ProgTensor, Program, Step, TensorClass, TensorId, TileId};

pub(crate) use assemble::{lower_with, whole_graph_layouts};
pub(crate) use reads::{rect, row_segments, weighted_digits, BroadcastReads, Runs};

mod assemble;
mod broadcast;
mod compute;
mod conv;
mod elementwise;
mod embedding;
mod gather;
mod kept;
mod layout;
mod loss;
mod mapping;
mod matmul;
mod memo;
mod node;
mod norm;
mod outline;
mod pool;
mod product;
mod random;
mod reads;
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
    /// Distributed batch norm (`crate::techniques::distributed_norm`): the replicas in each
    /// group whose batch statistics are summed (1: none).
    pub distributed_batch_norm: u32,
    /// IPUs of the whole partition (every replica's), which each step of a collective syncs.
    pub partition_ipus: u32,
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
            distributed_batch_norm: 1,
            partition_ipus: 1,
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
            // The partition is read only by distributed batch norm's collectives.
            partition_ipus: if self.distributed_batch_norm > 1 {
                self.partition_ipus
            } else {
                default.partition_ipus
            },
            ..self
        }
    }
}

/// Worker cycles a multi-region vertex spends per region beyond the first (estimate: loading
/// the next region's pointers and length).
pub const REGION_OVERHEAD_CYCLES: u64 = 12;

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

    /// The first node on this IPU that reads `x` (or a view of it); `None` for a view
    /// itself, whose readers read its root.
    pub(crate) fn first_consumer(&self, x: NodeId) -> Option<NodeId> {
        self.first_readers[x.index()]
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

#[cfg(test)]
mod tests {
    use tessera_core::models::{bert, mnist_cnn, Bert};
    use tessera_core::{Accumulation, DType, Graph, Optimizer, Plan};

    use std::collections::HashMap;

    use tessera_core::Roles;

    use super::mapping::{shared_layout, SHARED_LAYOUT_FROM};
    use super::*;
    use crate::exchange::summarize;
    use crate::heap::Heap;
    use crate::machine::Preset;
    use crate::memory::{account, account_with};
    use crate::planner::AVAILABLE_MEMORY_PROPORTION;
    use crate::program::{Codelet, ComputeSet, Interval, Region, Vertex};

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
            crate::planner::plan_matmul_with(&cfg, [16, 8192, 64], DType::F16, b, 64, o)
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
                [m, k, n],
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
