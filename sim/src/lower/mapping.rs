//! Where each graph tensor of an IPU is laid out: by the product that reads it first, like
//! its variable or element-wise partner, as the image of the view it copies, like an
//! identical earlier node's tensor, or spread linearly from a tile its identity picks.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use tessera_core::{NodeId, Op, Place, Roles, Storage};

use super::{
    elementwise, embedding, gather, layout, loss, matmul, norm, op_by_place, pool, random, reduce,
    softmax, update, Lowering, Placement,
};
use crate::planner::Operand;
use crate::program::{Mapping, TensorClass, TensorId};

/// Graph tensors' layouts of at least this many intervals are shared with an equal layout
/// made before them in the same lowering (see [`shared_layout`]); smaller ones are cheap to
/// derive again, and hashing each would cost more than it saves.
pub(super) const SHARED_LAYOUT_FROM: usize = 4096;

/// `mapping`, or an equal large one already in `made` (by digest, then compared whole), whose
/// copy shares its intervals and what is derived of them (runs per tile, the by-tile order,
/// per-tile sums) instead of deriving them again. An equal layout is the same layout, so
/// nothing computed from it changes; only the work and memory of deriving it twice go.
pub(super) fn shared_layout(made: &mut HashMap<u128, Mapping>, mapping: Mapping) -> Mapping {
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
impl<'a, S: Storage> Lowering<'a, S> {
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
    pub(super) fn map_graph_tensors(&mut self) {
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
                    Placement::Own
                        if matches!(
                            node.op(),
                            Op::Gather(tessera_core::ops::gather::Gather::ScatterAdd { .. })
                        ) =>
                    {
                        let Op::Gather(tessera_core::ops::gather::Gather::ScatterAdd {
                            indices,
                            ..
                        }) = node.op()
                        else {
                            unreachable!("matched above")
                        };
                        embedding::output_mapping(self, i, *indices)
                    }
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
            let (elements, mapping) = self.sharded(i, elements, mapping, class);
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

    /// Optimizer state `i` of `elements` elements laid out by `mapping` (its variable's), or
    /// its shard when replicated tensor sharding shards state kept on the tiles: each tile
    /// holds `1 / r` of its elements of the variable, in one run of the shard (PopART's
    /// replicated tensor sharding of on-chip state). Offloaded state moves its shard instead
    /// and is loaded whole (see `node`).
    fn sharded(
        &self,
        i: NodeId,
        elements: u64,
        mapping: Mapping,
        class: TensorClass,
    ) -> (u64, Mapping) {
        let r = self.opts.shards_of(elements);
        let state = self.node(i).roles().contains(Roles::OPTIMIZER_STATE);
        if r <= 1 || !state || class != TensorClass::AlwaysLive {
            return (elements, mapping);
        }
        let mut start = 0;
        let mut intervals = Vec::new();
        for (tile, n) in mapping.elements_per_tile() {
            let len = n.div_ceil(r);
            intervals.push(crate::program::Interval { tile, start, len });
            start += len;
        }
        (start, Mapping::from_sorted_intervals(intervals))
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
