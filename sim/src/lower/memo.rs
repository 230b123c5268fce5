//! Reuse of a node's lowering by an identical node: a transformer's layers repeat, and so do
//! their ops, operands and layouts. Poplar itself reuses the code of identical layers.
//!
//! A node's lowering reads its op, its own and its operands' nodes (shapes, types, roles,
//! whether state, whether a view), their program tensors (elements, type, class, mapping),
//! whether they are offloaded, and whether the node is the first reader of an operand; and it
//! writes steps and temporaries. Whether an operand is made here or is a copy from another
//! IPU does not matter beyond its layout and class (a copy keeps the layout its tensor has
//! where it is made). When all it reads equals
//! what an earlier node read - operand identities aside, but with the operands in the same
//! order of tensor ids - its steps and temporaries are the earlier node's, with tensor ids,
//! names and node renamed. The key is a 128-bit hash of those facts (two SipHash passes
//! with different keys). Nodes whose lowering reads another node's temporaries (a
//! cross-entropy's row statistics, a batch norm's moments) are not reused: their lowering
//! depends on more than the node.
//!
//! Identical nodes are outlined, in every lowering: a node's temporaries spread from a tile
//! its key picks (`Lowering::start_tile`), so identical nodes share their layouts, as PopART
//! grows an outlined subgraph once and each repeat of a layer runs on its layout. So a
//! node's lowering depends on its key alone, spread temporaries and all.
//!
//! Recorded lowerings are also kept for later lowerings in the same process ([`SHARED`]):
//! a pipeline split's stages, the split's retries, the fewest-IPUs search and a sweep lower
//! the same layers over and over. Across lowerings the key also holds what is constant within
//! one: the machine and the lowering options a node reads (`context`; whether the optimizer
//! state is offloaded, say, is read through the operands' facts instead), and, for matmuls,
//! whether the IPU trains the fully-connected layer the matmul is a pass of (poplibs plans a
//! trained layer's passes together). Graph tensors spread linearly start at a tile their
//! name or kind picks, not where the last tensor ended, so a layer's operands are laid out
//! alike in every lowering that holds it and its record serves them all.
//!
//! Only estimates' lowering (summarised exchanges, compute sets without vertices) reuses.
//! The unit tests and the `estimate_only` property test compare it with the full lowering.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use tessera_core::{NodeId, Op, Storage};

use super::Lowering;
use crate::exchange::{ExchangeSummary, ExchangeTile};
use crate::program::{ProgTensor, Step, TensorId, VertexCost};

/// Bytes of recorded lowerings this process keeps for later lowerings (estimate: about three
/// times what the largest estimate of the shipped and zoo models records, DenseNet-121
/// training at batch 8 with about 300 MB, and half of that estimate's own peak memory). So a
/// split or a sweep over such a model finds the records of the lowering before it. When a
/// record would pass it, the records the most recent lowerings used least recently are
/// dropped until half of it is left: a sweep over many models keeps recording without
/// growing, and keeps the records of the models it lowered last.
pub const SHARED_MEMO_BYTES: usize = 1 << 30;

/// Recorded lowerings kept for every lowering in this process.
static SHARED: LazyLock<Mutex<Shared>> = LazyLock::new(Default::default);

/// The number of the next lowering that reuses ([`Memo::new`]): the age of a kept record is
/// the number of the last lowering that used it.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Drops the recorded lowerings and product layouts this process keeps for later lowerings:
/// the next lowering starts from nothing, as the first of a process does (benches time it
/// so). Estimates are the same either way.
pub fn clear_shared_records() {
    // Taken under the lock (released at the end of the statement), freed after it.
    let dropped = std::mem::take(&mut *SHARED.lock().unwrap_or_else(|e| e.into_inner()));
    drop(dropped);
    super::matmul::clear_product_layouts();
    super::layout::clear_images();
    super::norm::clear_stats_layouts();
    super::broadcast::clear();
    super::reduce::clear_hulls();
}

/// Recorded lowerings kept for every lowering, by key.
#[derive(Default)]
struct Shared {
    /// Each record with the number of the last lowering that used it.
    records: HashMap<u128, (Arc<Recorded>, u64)>,
    /// Their bytes ([`Recorded::bytes`]).
    bytes: usize,
}

impl Shared {
    /// The record under `key`, now used by lowering `generation`.
    fn get(&mut self, key: u128, generation: u64) -> Option<Arc<Recorded>> {
        let (rec, used) = self.records.get_mut(&key)?;
        *used = (*used).max(generation);
        Some(Arc::clone(rec))
    }

    /// Keeps `rec` under `key` for lowering `generation`; returns the records dropped to
    /// make room (the caller drops them after releasing the lock).
    fn insert(&mut self, key: u128, rec: &Arc<Recorded>, generation: u64) -> Vec<Arc<Recorded>> {
        self.insert_within(key, rec, generation, SHARED_MEMO_BYTES)
    }

    /// [`insert`](Self::insert) with `bound` bytes kept at most.
    fn insert_within(
        &mut self,
        key: u128,
        rec: &Arc<Recorded>,
        generation: u64,
        bound: usize,
    ) -> Vec<Arc<Recorded>> {
        let mut dropped = Vec::new();
        if rec.bytes > bound {
            return dropped;
        }
        if let Some((old, _)) = self.records.remove(&key) {
            self.bytes -= old.bytes;
            dropped.push(old);
        }
        if self.bytes + rec.bytes > bound {
            // Least recently used first; keys break ties, so what is kept does not depend
            // on the map's order.
            let mut by_age: Vec<(u64, u128)> = self
                .records
                .iter()
                .map(|(&k, &(_, used))| (used, k))
                .collect();
            by_age.sort_unstable();
            for (_, k) in by_age {
                if self.bytes + rec.bytes <= bound / 2 {
                    break;
                }
                if let Some((old, _)) = self.records.remove(&k) {
                    self.bytes -= old.bytes;
                    dropped.push(old);
                }
            }
        }
        self.records.insert(key, (Arc::clone(rec), generation));
        self.bytes += rec.bytes;
        dropped
    }
}

/// One node's recorded lowering.
struct Recorded {
    /// The tensors it read, by place (operands' roots, then the node's own).
    refs: Vec<TensorId>,
    /// The first temporary it made.
    first_temp: u32,
    /// Its temporaries, with their names less the node's name.
    temps: Vec<(String, ProgTensor)>,
    /// Its steps (compute set names less the node's name).
    steps: Vec<(Option<String>, Step)>,
    /// The summaries of its exchanges, by offset in `steps`.
    summaries: Vec<(usize, ExchangeSummary)>,
    /// About how many bytes it holds.
    bytes: usize,
}

impl Recorded {
    /// About how many bytes the record holds (its own and its tensors' mappings).
    fn size(&self) -> usize {
        use std::mem::size_of;
        let temps: usize = self
            .temps
            .iter()
            .map(|(n, t)| {
                size_of::<(String, ProgTensor)>()
                    + n.len()
                    + std::mem::size_of_val(t.mapping.intervals())
            })
            .sum();
        let steps: usize = self
            .steps
            .iter()
            .map(|(n, s)| {
                size_of::<(Option<String>, Step)>()
                    + n.as_ref().map_or(0, String::len)
                    + match s {
                        Step::Compute(cs) => {
                            cs.name.len()
                                + cs.costs.len() * size_of::<VertexCost>()
                                + cs.touched.len() * size_of::<TensorId>()
                        }
                        _ => 0,
                    }
            })
            .sum();
        let summaries: usize = self
            .summaries
            .iter()
            .map(|(_, x)| {
                size_of::<(usize, ExchangeSummary)>()
                    + x.tiles.len() * size_of::<ExchangeTile>()
                    + x.tensors.len() * size_of::<TensorId>()
            })
            .sum();
        size_of::<Recorded>() + self.refs.len() * size_of::<TensorId>() + temps + steps + summaries
    }
}

/// Recorded lowerings and what keys are made of.
pub(super) struct Memo {
    /// The machine and the lowering options as a node reads them
    /// (`LowerOptions::as_keyed`), a part of every key.
    context: u128,
    /// This lowering's number, the age it gives the kept records it uses.
    generation: u64,
    entries: HashMap<u128, Arc<Recorded>>,
    /// Lowerings reused.
    pub(super) reused: usize,
    /// Lowerings made and recorded afresh.
    pub(super) lowered: usize,
    /// Each node's key and the tensors it reads (see [`find_keys`](Self::find_keys)).
    keys: Vec<Option<(u128, Vec<TensorId>)>>,
}

/// Two hashers fed the same bytes: a 128-bit key.
struct Two(DefaultHasher, DefaultHasher);

impl Two {
    fn new() -> Two {
        let mut b = DefaultHasher::new();
        b.write_u64(0x9e37_79b9_7f4a_7c15);
        Two(DefaultHasher::new(), b)
    }
    fn u64(&mut self, x: u64) {
        self.0.write_u64(x);
        self.1.write_u64(x);
    }
    fn str(&mut self, s: &str) {
        self.0.write(s.as_bytes());
        self.1.write(s.as_bytes());
        self.u64(s.len() as u64);
    }
    fn finish(&self) -> u128 {
        (u128::from(self.0.finish()) << 64) | u128::from(self.1.finish())
    }
}

impl Memo {
    /// A memo for a lowering whose machine and options hash to `context`.
    pub(super) fn new(context: u128) -> Memo {
        Memo {
            context,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            entries: HashMap::new(),
            reused: 0,
            lowered: 0,
            keys: Vec::new(),
        }
    }

    /// The key of node `i`'s lowering and the tensors it reads, or `None` for a node that
    /// is never reused.
    pub(super) fn key<S: Storage>(
        &mut self,
        l: &Lowering<'_, S>,
        i: NodeId,
    ) -> Option<(u128, Vec<TensorId>)> {
        let node = l.node(i);
        if matches!(
            node.op(),
            Op::Loss(_)
                | Op::Norm(tessera_core::ops::norm::Norm::Moment { .. })
                | Op::Input
                | Op::Variable { .. }
                | Op::Constant { .. }
        ) {
            return None;
        }
        let mut nodes: Vec<NodeId> = node.op().operands().as_slice().to_vec();
        nodes.push(i);
        let refs: Vec<TensorId> = nodes.iter().map(|&x| l.t(x)).collect();
        let mut h = Two::new();
        h.u64(self.context as u64);
        h.u64((self.context >> 64) as u64);
        // The op with its operands by place.
        h.str(&super::op_by_place(node.op(), &nodes));
        if matches!(node.op(), Op::MatMul(_)) {
            h.u64(u64::from(super::matmul::trains_fc_layer(l, i)));
        }
        for (k, (&x, &t)) in nodes.iter().zip(&refs).enumerate() {
            let n = l.node(x);
            let mut facts = String::new();
            let _ = write!(
                facts,
                "{:?}|{:?}|{:?}|{}|{}",
                n.shape(),
                n.dtype(),
                n.roles(),
                n.op().is_state(),
                n.op().is_update()
            );
            h.str(&facts);
            let root = l.plan.storage_of(x);
            let first = if root == x { l.first_consumer(x) } else { None };
            // Whether an operand is here or a copy from another IPU does not matter beyond
            // its layout and class (a copy is laid out as its tensor is where it is made).
            for b in [
                root != x,
                first == Some(i),
                l.offloaded[x.index()],
                l.offloaded[root.index()],
            ] {
                h.u64(u64::from(b));
            }
            let pt = &l.tensors[t.index()];
            h.u64(pt.elements);
            h.str(&format!("{:?}{:?}", pt.dtype, pt.class));
            let mh = pt.mapping.digest();
            h.u64(mh as u64);
            h.u64((mh >> 64) as u64);
            // The order of the tensors' ids: a reused lowering keeps the same order.
            let rank = refs.iter().filter(|&&o| o < t).count() as u64;
            let same = refs[..k]
                .iter()
                .position(|&o| o == t)
                .map_or(0, |p| p as u64 + 1);
            h.u64(rank);
            h.u64(same);
        }
        Some((h.finish(), refs))
    }

    /// Replays the lowering recorded under `key` for node `i` reading `refs`; false when
    /// there is none.
    pub(super) fn replay<S: Storage>(
        &mut self,
        l: &mut Lowering<'_, S>,
        key: u128,
        i: NodeId,
        refs: &[TensorId],
    ) -> bool {
        let rec = match self.entries.get(&key) {
            Some(rec) => Arc::clone(rec),
            None => {
                let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
                let Some(rec) = shared.get(key, self.generation) else {
                    return false;
                };
                drop(shared);
                self.entries.insert(key, Arc::clone(&rec));
                rec
            }
        };
        let name = l.node(i).name();
        let base = l.tensors.len() as u32;
        let remap = |t: TensorId| -> TensorId {
            if t.0 >= rec.first_temp {
                TensorId(base + (t.0 - rec.first_temp))
            } else {
                let k = rec
                    .refs
                    .iter()
                    .position(|&r| r == t)
                    .expect("recorded refs only");
                refs[k]
            }
        };
        for (suffix, pt) in &rec.temps {
            l.tensors.push(ProgTensor {
                name: format!("{name}{suffix}"),
                node: i,
                ..pt.clone()
            });
        }
        let step0 = l.steps.len();
        for (suffix, step) in &rec.steps {
            let step = match step {
                Step::Exchange { transfers, .. } => Step::Exchange {
                    node: i,
                    transfers: transfers
                        .iter()
                        .map(|t| {
                            let mut t = *t;
                            t.region.tensor = remap(t.region.tensor);
                            t
                        })
                        .collect(),
                },
                Step::Compute(cs) => {
                    let mut cs = cs.clone();
                    cs.node = i;
                    cs.name = format!("{name}{}", suffix.as_deref().unwrap_or(""));
                    for t in &mut cs.touched {
                        *t = remap(*t);
                    }
                    cs.touched.sort_unstable();
                    Step::Compute(cs)
                }
                Step::HostToDevice { tensor, bytes } => Step::HostToDevice {
                    tensor: remap(*tensor),
                    bytes: *bytes,
                },
                Step::DeviceToHost { tensor, bytes } => Step::DeviceToHost {
                    tensor: remap(*tensor),
                    bytes: *bytes,
                },
                Step::LinkReceive { tensor, bytes } => Step::LinkReceive {
                    tensor: remap(*tensor),
                    bytes: *bytes,
                },
                Step::Collective {
                    tensor,
                    bytes,
                    group,
                    partition_ipus,
                } => Step::Collective {
                    tensor: remap(*tensor),
                    bytes: *bytes,
                    group: *group,
                    partition_ipus: *partition_ipus,
                },
                Step::RemoteBuffer {
                    tensor,
                    bytes,
                    load,
                } => Step::RemoteBuffer {
                    tensor: remap(*tensor),
                    bytes: *bytes,
                    load: *load,
                },
            };
            l.steps.push(step);
        }
        if let Some(summaries) = &mut l.summaries {
            for (off, s) in &rec.summaries {
                let mut s = s.clone();
                for t in &mut s.tensors {
                    *t = remap(*t);
                }
                s.tensors.sort_unstable();
                summaries.push(step0 + off, s);
            }
        }
        self.reused += 1;
        true
    }

    /// Finds every included node's key and the tensors it reads, before any node is
    /// lowered: keys read only graph tensors, whose layouts are made before lowering.
    pub(super) fn find_keys<S: Storage>(&mut self, l: &Lowering<'_, S>) {
        self.keys = l
            .graph
            .ids()
            .map(|i| {
                if l.include[i.index()] {
                    self.key(l, i)
                } else {
                    None
                }
            })
            .collect();
    }

    /// Every node's key (from [`find_keys`](Self::find_keys)), before any is taken.
    pub(super) fn keys(&self) -> Vec<Option<u128>> {
        self.keys.iter().map(|k| k.as_ref().map(|k| k.0)).collect()
    }

    /// Node `i`'s key and the tensors it reads (from [`find_keys`](Self::find_keys)), or
    /// `None` for a node that is never reused.
    pub(super) fn take_key(&mut self, i: NodeId) -> Option<(u128, Vec<TensorId>)> {
        self.keys.get_mut(i.index()).and_then(Option::take)
    }

    /// Lowers one node of each key that no record holds yet, on all cores, and records
    /// them: the lowering's own pass then replays every keyed node. A node's lowering
    /// depends on its key alone (its temporaries' start tile too), so lowering it apart, in
    /// a fork of the lowering that holds only the graph tensors, records what the pass
    /// would have. A node whose lowering reads more than its operands (its own temporaries
    /// aside) is not recorded, and the pass lowers it in place.
    pub(super) fn prelower<S: Storage>(&mut self, l: &Lowering<'_, S>)
    where
        tessera_core::Plan<S>: Sync,
        tessera_core::Graph<S>: Sync,
    {
        let mut todo: Vec<(NodeId, u128, &[TensorId])> = Vec::new();
        {
            let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
            let mut seen = std::collections::HashSet::new();
            for (i, k) in self.keys.iter().enumerate() {
                let Some((key, refs)) = k else { continue };
                if seen.insert(*key) && !self.entries.contains_key(key) {
                    match shared.get(*key, self.generation) {
                        Some(rec) => {
                            self.entries.insert(*key, rec);
                        }
                        None => todo.push((NodeId::from_index(i as u32), *key, refs)),
                    }
                }
            }
        }
        if todo.len() < 2 {
            return;
        }
        let graph_tensors = l.tensors.len();
        // Each worker takes the next node left, in one fork of its own: the nodes' lowerings
        // take from microseconds to a tenth of a second, and a worker that ran out of nodes
        // while another still held a long run of them (a parallel iterator splits the list
        // into runs) sat idle for most of a second at the end of a large model's pass.
        // Results are put back in the list's order.
        let mut recorded = crate::threads::each_in_turn(
            todo.iter().enumerate(),
            || l.fork(),
            |w, (k, &(i, key, refs))| {
                w.forget_from(graph_tensors);
                w.cursor = w.start_tile(key);
                w.lower_op(i);
                (k, key, Recorded::of(w, i, refs.to_vec(), 0, graph_tensors))
            },
        );
        recorded.sort_unstable_by_key(|r| r.0);
        let mut dropped = Vec::new();
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        for (_, key, rec) in recorded {
            if let Some(rec) = rec {
                self.lowered += 1;
                let rec = Arc::new(rec);
                dropped.extend(shared.insert(key, &rec, self.generation));
                self.entries.insert(key, rec);
            }
        }
        drop(shared);
        // Outside the lock: freeing many records takes a while.
        drop(dropped);
    }

    /// Records node `i`'s lowering (the steps from `step0` and the tensors from `tensor0`)
    /// under `key`, unless it read something other than `refs` and its own temporaries.
    pub(super) fn record<S: Storage>(
        &mut self,
        l: &Lowering<'_, S>,
        key: u128,
        i: NodeId,
        refs: Vec<TensorId>,
        step0: usize,
        tensor0: usize,
    ) {
        let Some(rec) = Recorded::of(l, i, refs, step0, tensor0) else {
            return;
        };
        self.lowered += 1;
        let rec = Arc::new(rec);
        let dropped =
            SHARED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, &rec, self.generation);
        // Outside the lock: freeing many records takes a while.
        drop(dropped);
        self.entries.insert(key, rec);
    }
}

impl Recorded {
    /// Node `i`'s lowering in `l` (the steps from `step0` and the tensors from `tensor0`),
    /// or `None` when it read something other than `refs` and its own temporaries.
    fn of<S: Storage>(
        l: &Lowering<'_, S>,
        i: NodeId,
        refs: Vec<TensorId>,
        step0: usize,
        tensor0: usize,
    ) -> Option<Recorded> {
        let name = l.node(i).name();
        let ok = |t: TensorId| t.index() >= tensor0 || refs.contains(&t);
        let mut temps = Vec::new();
        for pt in &l.tensors[tensor0..] {
            let suffix = pt.name.strip_prefix(name)?;
            temps.push((suffix.to_string(), pt.clone()));
        }
        let mut steps = Vec::new();
        for step in &l.steps[step0..] {
            let suffix = match step {
                Step::Exchange { transfers, .. } => {
                    if !transfers.iter().all(|t| ok(t.region.tensor)) {
                        return None;
                    }
                    None
                }
                Step::Compute(cs) => {
                    if !cs.vertices.is_empty() || !cs.touched.iter().all(|&t| ok(t)) {
                        return None;
                    }
                    let suffix = cs.name.strip_prefix(name)?;
                    Some(suffix.to_string())
                }
                Step::HostToDevice { tensor, .. }
                | Step::DeviceToHost { tensor, .. }
                | Step::LinkReceive { tensor, .. }
                | Step::Collective { tensor, .. }
                | Step::RemoteBuffer { tensor, .. } => {
                    if !ok(*tensor) {
                        return None;
                    }
                    None
                }
            };
            steps.push((suffix, step.clone()));
        }
        let mut summaries = Vec::new();
        if let Some(all) = &l.summaries {
            for s in step0..l.steps.len() {
                if let Some(x) = all.get(s) {
                    if !x.tensors.iter().all(|&t| ok(t)) {
                        return None;
                    }
                    summaries.push((s - step0, x.clone()));
                }
            }
        }
        let mut rec = Recorded {
            refs,
            first_temp: tensor0 as u32,
            temps,
            steps,
            summaries,
            bytes: 0,
        };
        rec.bytes = rec.size();
        Some(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(bytes: usize) -> Arc<Recorded> {
        Arc::new(Recorded {
            refs: Vec::new(),
            first_temp: 0,
            temps: Vec::new(),
            steps: Vec::new(),
            summaries: Vec::new(),
            bytes,
        })
    }

    #[test]
    fn kept_records_past_the_bound_go_least_recently_used_first_down_to_half() {
        let mut shared = Shared::default();
        // Lowering 0 records keys 1..=4, lowering 1 uses key 2 again.
        for key in 1..=4 {
            assert!(shared.insert_within(key, &record(20), 0, 100).is_empty());
        }
        assert!(shared.get(2, 1).is_some());
        assert_eq!(shared.bytes, 80);
        // Lowering 2's record passes the bound: the least recently used (1, 3, 4 by key)
        // go until half the bound is left with the new record.
        let dropped = shared.insert_within(5, &record(30), 2, 100);
        assert_eq!(dropped.len(), 3);
        let mut kept: Vec<u128> = shared.records.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, [2, 5]);
        assert_eq!(shared.bytes, 50);
        // A record larger than the bound is not kept, and drops nothing.
        assert!(shared.insert_within(6, &record(101), 3, 100).is_empty());
        assert_eq!(shared.bytes, 50);
        // A key recorded again replaces its record.
        assert_eq!(shared.insert_within(5, &record(10), 3, 100).len(), 1);
        assert_eq!(shared.bytes, 30);
        assert!(shared.get(7, 3).is_none());
    }
}
