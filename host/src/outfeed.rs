//! Outfeed queues: tensors that a device program enqueues and the host dequeues.
//!
//! This reproduces the semantics of Graphcore's `IPUOutfeedQueue`:
//!
//! - Each enqueue carries one [`Element`] per replica: a tensor, or a map of named tensors
//!   (a `BTreeMap`, so keys are always in sorted order). The first successful enqueue fixes the
//!   queue's structure (tensor or map, the keys, every shape); every later enqueue, and every
//!   replica's element within one enqueue, must match it exactly.
//! - In [`OutfeedMode::All`] every element is kept until the host dequeues it. The queue holds at
//!   most `buffer_depth` undrained elements; an [`OutfeedQueue::enqueue`] into a full queue blocks
//!   (the device stalls) until the host drains it, and the stall is counted. Nothing enqueued is
//!   ever lost or reordered. [`OutfeedQueue::try_enqueue`] reports [`OutfeedError::Full`] instead
//!   of blocking and hands the rejected elements back.
//! - In [`OutfeedMode::Last`] an enqueue never blocks: it replaces the element held so far.
//!
//! The host side, [`OutfeedQueue::dequeue`], returns:
//!
//! | mode | replicas | element shape `S` gives |
//! |------|----------|-------------------------|
//! | ALL  | 1        | `[n, S...]`             |
//! | ALL  | r > 1    | `[n, r, S...]`          |
//! | LAST | 1        | `[S...]`                |
//! | LAST | r > 1    | `[r, S...]`             |
//!
//! where `n` is the number of elements enqueued since the previous dequeue, oldest first. A map
//! element gives a map of such tensors, one per key.
//!
//! Decisions where TensorFlow blocks instead:
//!
//! - ALL mode with nothing undrained returns `n = 0` tensors (`[0, S...]` / `[0, r, S...]`) when
//!   the structure is known from an earlier enqueue, and [`Dequeued::Empty`] when nothing has ever
//!   been enqueued (the shapes are unknown).
//! - LAST mode before any enqueue is [`OutfeedError::NothingEnqueued`]. A LAST-mode dequeue does
//!   not consume: it returns the newest element until a newer one replaces it.
//!
//! The queue is `Send + Sync`: share it through an `Arc` between a device thread that enqueues
//! and a host thread that dequeues. It uses a `Mutex` and two `Condvar`s (one wakes a stalled
//! device when the host drains, one wakes a host waiting in
//! [`OutfeedQueue::wait_for_elements`]). A poisoned lock is recovered rather than propagated:
//! the queue's state is only changed in short sections that cannot panic.
//!
//! A host watching several queues need not poll them: [`OutfeedQueue::subscribe`] gives a
//! channel receiver that gets one message per successful enqueue, so the host can block in
//! `crossbeam_channel::select!` until one of its queues has data.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tessera_host::outfeed::{Dequeued, Element, HostTensor, OutfeedMode, OutfeedQueue};
//!
//! let q = OutfeedQueue::new("losses", OutfeedMode::All, 3, 1).unwrap();
//! for step in 0..2 {
//!     let loss = HostTensor::new(vec![2], vec![step as f32, 1.0]).unwrap();
//!     q.enqueue(vec![Element::Tensor(loss)]).unwrap();
//! }
//! let Dequeued::Tensor(t) = q.dequeue().unwrap() else { unreachable!() };
//! assert_eq!(t.shape, vec![2, 2]);
//! assert_eq!(t.data, vec![0.0, 1.0, 1.0, 1.0]);
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use crate::tensor::format_shape;
pub use crate::tensor::{HostTensor, TensorError};

/// Buffer depth used by [`OutfeedQueue::with_defaults`]: how many undrained elements an ALL-mode
/// queue holds before the device stalls.
pub const DEFAULT_BUFFER_DEPTH: usize = 3;

/// Largest accepted buffer depth (the smallest is 1).
pub const MAX_BUFFER_DEPTH: usize = 255;

/// Which enqueued elements an [`OutfeedQueue`] keeps for the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OutfeedMode {
    /// Keep every element until the host dequeues it; the device stalls when `buffer_depth`
    /// elements are undrained.
    #[default]
    All,
    /// Keep only the newest element; the device never stalls.
    Last,
}

impl fmt::Display for OutfeedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutfeedMode::All => "ALL",
            OutfeedMode::Last => "LAST",
        })
    }
}

/// One replica's contribution to an enqueue: a tensor or a map of named tensors.
#[derive(Debug, Clone, PartialEq)]
pub enum Element {
    /// A single tensor.
    Tensor(HostTensor),
    /// Named tensors, keys sorted (a `BTreeMap`) so that the order is deterministic.
    Map(BTreeMap<String, HostTensor>),
}

impl From<HostTensor> for Element {
    fn from(t: HostTensor) -> Self {
        Element::Tensor(t)
    }
}

impl From<BTreeMap<String, HostTensor>> for Element {
    fn from(m: BTreeMap<String, HostTensor>) -> Self {
        Element::Map(m)
    }
}

/// What a position in an element's structure holds, as reported by a mismatch error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// A tensor of this shape.
    Tensor(Vec<usize>),
    /// A map with these keys (sorted).
    Map(Vec<String>),
    /// Nothing: the key is absent.
    Missing,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Tensor(shape) => write!(f, "shape {}", format_shape(shape)),
            Layout::Map(keys) => write!(f, "a map with keys [{}]", keys.join(", ")),
            Layout::Missing => f.write_str("no such key"),
        }
    }
}

/// The elements a failed [`OutfeedQueue::try_enqueue`] hands back, one per replica, so that
/// nothing is lost. Its `Debug` output summarises rather than prints the data.
#[derive(Clone, PartialEq)]
pub struct Rejected(pub Vec<Element>);

impl fmt::Debug for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rejected(<{} element(s)>)", self.0.len())
    }
}

/// Everything that can go wrong creating, filling or draining an outfeed queue. Every variant
/// names the queue, and the replica and key where one is at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum OutfeedError {
    /// The buffer depth is outside `1..=255`.
    #[error("outfeed '{queue}': buffer depth {depth} is outside 1..={max}", max = MAX_BUFFER_DEPTH)]
    InvalidBufferDepth {
        /// The queue being created.
        queue: String,
        /// The depth asked for.
        depth: usize,
    },
    /// The replica count is zero.
    #[error("outfeed '{queue}': the replica count must be at least 1")]
    NoReplicas {
        /// The queue being created.
        queue: String,
    },
    /// An enqueue did not carry exactly one element per replica.
    #[error(
        "outfeed '{queue}': an enqueue needs one element per replica ({expected}), found {found}"
    )]
    WrongReplicaCount {
        /// The queue.
        queue: String,
        /// The queue's replica count.
        expected: usize,
        /// Elements given.
        found: usize,
    },
    /// The host could not hold what a queue delivers between two reports: a report's
    /// outfeed is stacked whole before it is handed over.
    #[error(
        "outfeed '{queue}': holding '{key}' until the next report needs {bytes} bytes, more than the host could allocate; report more often (--repeat-count, --steps-per-execution), outfeed fewer tensors (--activations-filters, --gradients-filters) or use a larger --batch-size"
    )]
    HostMemory {
        /// The queue.
        queue: String,
        /// The map key of the tensor (empty for a tensor element).
        key: String,
        /// The bytes the key's data would have needed.
        bytes: u64,
    },
    /// A tensor in an enqueued element is inconsistent (its data does not fill its shape).
    #[error("outfeed '{queue}': replica {replica}{}: {source}", At(.key))]
    BadTensor {
        /// The queue.
        queue: String,
        /// The replica whose element holds the tensor.
        replica: usize,
        /// The map key of the tensor, `None` for a tensor element.
        key: Option<String>,
        /// What is wrong with it.
        #[source]
        source: TensorError,
    },
    /// Replica `replica`'s element differs in structure or shape from replica 0's.
    #[error(
        "outfeed '{queue}': replica {replica}{} has {found}, but replica 0 has {expected}",
        At(.key)
    )]
    ReplicaMismatch {
        /// The queue.
        queue: String,
        /// The replica that differs from replica 0.
        replica: usize,
        /// The first map key that differs, `None` if the elements differ as a whole.
        key: Option<String>,
        /// What replica 0 has there.
        expected: Layout,
        /// What this replica has there.
        found: Layout,
    },
    /// The element differs in structure or shape from the ones enqueued before.
    #[error(
        "outfeed '{queue}':{} has {found}, but earlier enqueues had {expected}",
        KeyOrElement(.key)
    )]
    StructureChanged {
        /// The queue.
        queue: String,
        /// The first map key that differs, `None` if the elements differ as a whole.
        key: Option<String>,
        /// What earlier enqueues had there.
        expected: Layout,
        /// What this enqueue has there.
        found: Layout,
    },
    /// [`OutfeedQueue::try_enqueue`] found `depth` undrained elements in an ALL-mode queue.
    #[error(
        "outfeed '{queue}': full, {depth} undrained element(s) (the buffer depth); the host \
         must dequeue first"
    )]
    Full {
        /// The queue.
        queue: String,
        /// Its buffer depth.
        depth: usize,
        /// The elements that were not enqueued, handed back.
        rejected: Rejected,
    },
    /// A LAST-mode queue was dequeued before anything was enqueued.
    #[error(
        "outfeed '{queue}': nothing has been enqueued yet (LAST mode has no element to return)"
    )]
    NothingEnqueued {
        /// The queue.
        queue: String,
    },
}

impl OutfeedError {
    /// The queue the error is about.
    #[must_use]
    pub fn queue(&self) -> &str {
        match self {
            OutfeedError::InvalidBufferDepth { queue, .. }
            | OutfeedError::NoReplicas { queue }
            | OutfeedError::WrongReplicaCount { queue, .. }
            | OutfeedError::BadTensor { queue, .. }
            | OutfeedError::ReplicaMismatch { queue, .. }
            | OutfeedError::StructureChanged { queue, .. }
            | OutfeedError::Full { queue, .. }
            | OutfeedError::HostMemory { queue, .. }
            | OutfeedError::NothingEnqueued { queue } => queue,
        }
    }

    /// The elements a [`OutfeedError::Full`] handed back, `None` for any other error.
    #[must_use]
    pub fn into_rejected(self) -> Option<Vec<Element>> {
        match self {
            OutfeedError::Full { rejected, .. } => Some(rejected.0),
            _ => None,
        }
    }
}

/// `" key 'k'"` or nothing.
struct At<'a>(&'a Option<String>);

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(key) => write!(f, " key '{key}'"),
            None => Ok(()),
        }
    }
}

/// `" key 'k'"`, or `" element"` when the elements differ as a whole.
struct KeyOrElement<'a>(&'a Option<String>);

impl fmt::Display for KeyOrElement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(_) => At(self.0).fmt(f),
            None => f.write_str(" element"),
        }
    }
}

/// What an enqueue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueueReport {
    /// The queue was full and the device waited for the host to drain it.
    pub stalled: bool,
    /// How long it waited (zero if it did not stall).
    pub stall_time: Duration,
    /// Undrained elements in the queue right after this enqueue (at most 1 in LAST mode).
    pub pending: usize,
}

/// What a dequeue returned: stacked tensors (see the [module docs](self) for the shapes).
#[derive(Debug, Clone, PartialEq)]
pub enum Dequeued {
    /// The queue's elements are tensors.
    Tensor(HostTensor),
    /// The queue's elements are maps; one stacked tensor per key.
    Map(BTreeMap<String, HostTensor>),
    /// ALL mode, nothing has ever been enqueued, so not even the structure is known.
    Empty,
}

impl Dequeued {
    /// The tensor, if the queue holds tensors.
    #[must_use]
    pub fn tensor(&self) -> Option<&HostTensor> {
        match self {
            Dequeued::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The map, if the queue holds maps.
    #[must_use]
    pub fn map(&self) -> Option<&BTreeMap<String, HostTensor>> {
        match self {
            Dequeued::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The stacked tensor of map key `key`, if the queue holds maps with that key.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&HostTensor> {
        self.map().and_then(|m| m.get(key))
    }

    /// The tensor, if the queue holds tensors.
    #[must_use]
    pub fn into_tensor(self) -> Option<HostTensor> {
        match self {
            Dequeued::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The map, if the queue holds maps.
    #[must_use]
    pub fn into_map(self) -> Option<BTreeMap<String, HostTensor>> {
        match self {
            Dequeued::Map(m) => Some(m),
            _ => None,
        }
    }

    /// True for [`Dequeued::Empty`].
    #[must_use]
    pub fn is_empty(&self) -> bool {
        matches!(self, Dequeued::Empty)
    }
}

/// The structure every element of a queue shares, fixed by the first enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Structure {
    Tensor(Vec<usize>),
    Map(BTreeMap<String, Vec<usize>>),
}

impl Structure {
    fn of(element: &Element) -> Self {
        match element {
            Element::Tensor(t) => Structure::Tensor(t.shape.clone()),
            Element::Map(m) => Structure::Map(
                m.iter()
                    .map(|(k, t)| (k.clone(), t.shape.clone()))
                    .collect(),
            ),
        }
    }

    /// The first difference between this structure (`expected`) and `found`: the key (if
    /// inside a map), what each has there. `None` if they match.
    fn diff(&self, found: &Structure) -> Option<(Option<String>, Layout, Layout)> {
        match (self, found) {
            (Structure::Tensor(a), Structure::Tensor(b)) => {
                (a != b).then(|| (None, Layout::Tensor(a.clone()), Layout::Tensor(b.clone())))
            }
            (Structure::Map(a), Structure::Map(b)) => {
                if a == b {
                    return None;
                }
                let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                keys.into_iter().find_map(|k| {
                    let (x, y) = (a.get(k), b.get(k));
                    (x != y).then(|| {
                        let layout = |s: Option<&Vec<usize>>| {
                            s.map_or(Layout::Missing, |s| Layout::Tensor(s.clone()))
                        };
                        (Some(k.clone()), layout(x), layout(y))
                    })
                })
            }
            (expected, found) => Some((None, expected.layout(), found.layout())),
        }
    }

    fn layout(&self) -> Layout {
        match self {
            Structure::Tensor(s) => Layout::Tensor(s.clone()),
            Structure::Map(m) => Layout::Map(m.keys().cloned().collect()),
        }
    }
}

/// One enqueue, flattened: one slot per tensor of the structure (one for a tensor element, one
/// per key in key order for a map), each holding the replicas' data back to back.
type Entry = Vec<Vec<f32>>;

/// Flattens one enqueue's validated elements (one per replica) into an [`Entry`]. With one
/// replica the data is moved, not copied.
fn flatten(per_replica: Vec<Element>) -> Entry {
    let replicas = per_replica.len();
    let mut slots: Entry = Vec::new();
    for (r, element) in per_replica.into_iter().enumerate() {
        let tensors: Vec<Vec<f32>> = match element {
            Element::Tensor(t) => vec![t.data],
            Element::Map(m) => m.into_values().map(|t| t.data).collect(),
        };
        if r == 0 {
            if replicas == 1 {
                return tensors;
            }
            slots = tensors
                .into_iter()
                .map(|d| {
                    let mut slot = Vec::with_capacity(d.len() * replicas);
                    slot.extend_from_slice(&d);
                    slot
                })
                .collect();
        } else {
            for (slot, d) in slots.iter_mut().zip(tensors) {
                slot.extend_from_slice(&d);
            }
        }
    }
    slots
}

#[derive(Debug, Default)]
struct State {
    /// Fixed by the first successful enqueue.
    structure: Option<Structure>,
    /// ALL: undrained entries, oldest first. LAST: the newest entry, if any.
    entries: VecDeque<Entry>,
    enqueued: u64,
    dequeued: u64,
    stalled_enqueues: u64,
    full_rejections: u64,
    stall_time: Duration,
    /// Enqueues blocked right now.
    waiting: usize,
    /// One sender per [`OutfeedQueue::subscribe`] whose receiver is still alive.
    subscribers: Vec<Sender<()>>,
}

/// A queue carrying tensors from a device program to the host (see the [module docs](self)).
#[derive(Debug)]
pub struct OutfeedQueue {
    name: String,
    mode: OutfeedMode,
    buffer_depth: usize,
    replicas: usize,
    state: Mutex<State>,
    /// Signalled when the host drains: wakes stalled enqueues.
    drained: Condvar,
    /// Signalled when an element arrives: wakes [`OutfeedQueue::wait_for_elements`].
    arrived: Condvar,
}

impl OutfeedQueue {
    /// A queue named `name` (used in every error) in `mode`, holding up to `buffer_depth`
    /// undrained elements in ALL mode, fed by `replicas` replicas.
    ///
    /// # Errors
    ///
    /// [`OutfeedError::InvalidBufferDepth`] if `buffer_depth` is outside `1..=255`,
    /// [`OutfeedError::NoReplicas`] if `replicas` is 0.
    pub fn new(
        name: &str,
        mode: OutfeedMode,
        buffer_depth: usize,
        replicas: usize,
    ) -> Result<Self, OutfeedError> {
        if !(1..=MAX_BUFFER_DEPTH).contains(&buffer_depth) {
            return Err(OutfeedError::InvalidBufferDepth {
                queue: name.to_owned(),
                depth: buffer_depth,
            });
        }
        if replicas == 0 {
            return Err(OutfeedError::NoReplicas {
                queue: name.to_owned(),
            });
        }
        Ok(OutfeedQueue {
            name: name.to_owned(),
            mode,
            buffer_depth,
            replicas,
            state: Mutex::new(State::default()),
            drained: Condvar::new(),
            arrived: Condvar::new(),
        })
    }

    /// A queue with the defaults: ALL mode, [`DEFAULT_BUFFER_DEPTH`], one replica.
    #[must_use]
    pub fn with_defaults(name: &str) -> Self {
        OutfeedQueue {
            name: name.to_owned(),
            mode: OutfeedMode::All,
            buffer_depth: DEFAULT_BUFFER_DEPTH,
            replicas: 1,
            state: Mutex::new(State::default()),
            drained: Condvar::new(),
            arrived: Condvar::new(),
        }
    }

    /// The queue's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's mode.
    #[must_use]
    pub fn mode(&self) -> OutfeedMode {
        self.mode
    }

    /// Undrained elements an ALL-mode queue holds before the device stalls.
    #[must_use]
    pub fn buffer_depth(&self) -> usize {
        self.buffer_depth
    }

    /// Number of replicas feeding the queue (elements per enqueue).
    #[must_use]
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Recovering is sound: no section holding the lock can panic half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Undrained elements now (ALL), or whether an element is held (LAST: 0 or 1).
    #[must_use]
    pub fn pending(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether an enqueue would stall now (always false in LAST mode).
    #[must_use]
    pub fn is_full(&self) -> bool {
        self.mode == OutfeedMode::All && self.pending() >= self.buffer_depth
    }

    /// Successful enqueues so far.
    #[must_use]
    pub fn enqueued(&self) -> u64 {
        self.lock().enqueued
    }

    /// Elements handed to the host so far (ALL mode; a LAST-mode dequeue counts 1).
    #[must_use]
    pub fn dequeued(&self) -> u64 {
        self.lock().dequeued
    }

    /// Every stall so far: blocking enqueues that had to wait plus `try_enqueue` calls that
    /// found the queue full.
    #[must_use]
    pub fn stall_count(&self) -> u64 {
        let s = self.lock();
        s.stalled_enqueues + s.full_rejections
    }

    /// Blocking [`enqueue`](Self::enqueue) calls that had to wait for the host.
    #[must_use]
    pub fn stalled_enqueues(&self) -> u64 {
        self.lock().stalled_enqueues
    }

    /// [`try_enqueue`](Self::try_enqueue) calls that returned [`OutfeedError::Full`].
    #[must_use]
    pub fn full_rejections(&self) -> u64 {
        self.lock().full_rejections
    }

    /// Blocking enqueues waiting for the host right now (a stalled device).
    #[must_use]
    pub fn waiting_enqueues(&self) -> usize {
        self.lock().waiting
    }

    /// Total time blocking enqueues spent waiting for the host.
    #[must_use]
    pub fn stall_time(&self) -> Duration {
        self.lock().stall_time
    }

    /// Checks one enqueue's elements on their own: one per replica, every tensor consistent,
    /// every replica shaped like replica 0.
    fn validate(&self, per_replica: &[Element]) -> Result<(), OutfeedError> {
        if per_replica.len() != self.replicas {
            return Err(OutfeedError::WrongReplicaCount {
                queue: self.name.clone(),
                expected: self.replicas,
                found: per_replica.len(),
            });
        }
        for (replica, element) in per_replica.iter().enumerate() {
            let bad = |key: Option<&String>, source| OutfeedError::BadTensor {
                queue: self.name.clone(),
                replica,
                key: key.cloned(),
                source,
            };
            match element {
                Element::Tensor(t) => t.check().map_err(|e| bad(None, e))?,
                Element::Map(m) => {
                    for (k, t) in m {
                        t.check().map_err(|e| bad(Some(k), e))?;
                    }
                }
            }
        }
        if let Some((first, rest)) = per_replica.split_first() {
            let structure = Structure::of(first);
            for (i, element) in rest.iter().enumerate() {
                if let Some((key, expected, found)) = structure.diff(&Structure::of(element)) {
                    return Err(OutfeedError::ReplicaMismatch {
                        queue: self.name.clone(),
                        replica: i + 1,
                        key,
                        expected,
                        found,
                    });
                }
            }
        }
        Ok(())
    }

    /// Checks an enqueue against the structure earlier enqueues fixed.
    fn check_structure(&self, state: &State, found: &Structure) -> Result<(), OutfeedError> {
        match &state.structure {
            Some(structure) => match structure.diff(found) {
                Some((key, expected, found)) => Err(OutfeedError::StructureChanged {
                    queue: self.name.clone(),
                    key,
                    expected,
                    found,
                }),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// Stores a checked entry (the lock is held) and wakes a waiting host.
    fn push(&self, state: &mut State, structure: Structure, entry: Entry) -> usize {
        if state.structure.is_none() {
            state.structure = Some(structure);
        }
        if self.mode == OutfeedMode::Last {
            state.entries.clear();
        }
        state.entries.push_back(entry);
        state.enqueued += 1;
        self.arrived.notify_all();
        // Unbounded channels: a send never blocks, and fails only once the receiver is gone.
        state.subscribers.retain(|s| s.send(()).is_ok());
        state.entries.len()
    }

    /// Device side: enqueues one element per replica.
    ///
    /// In ALL mode, if `buffer_depth` elements are undrained this blocks until the host
    /// dequeues (the device stalls); the stall is counted and timed. In LAST mode it never
    /// blocks and replaces the element held so far.
    ///
    /// # Errors
    ///
    /// [`OutfeedError::WrongReplicaCount`], [`OutfeedError::BadTensor`],
    /// [`OutfeedError::ReplicaMismatch`] or [`OutfeedError::StructureChanged`] if the elements
    /// do not fit the queue; nothing is enqueued then.
    pub fn enqueue(&self, per_replica: Vec<Element>) -> Result<EnqueueReport, OutfeedError> {
        self.validate(&per_replica)?;
        // `validate` checked there is one element per replica, and there is at least one replica.
        let structure = Structure::of(&per_replica[0]);
        let entry = flatten(per_replica);
        let mut state = self.lock();
        self.check_structure(&state, &structure)?;
        let mut stall_time = Duration::ZERO;
        let stalled = self.mode == OutfeedMode::All && state.entries.len() >= self.buffer_depth;
        if stalled {
            let start = Instant::now();
            state.waiting += 1;
            while state.entries.len() >= self.buffer_depth {
                state = self
                    .drained
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.waiting -= 1;
            stall_time = start.elapsed();
            state.stalled_enqueues += 1;
            state.stall_time += stall_time;
            // Another producer may have fixed the structure while this one waited.
            self.check_structure(&state, &structure)?;
        }
        let pending = self.push(&mut state, structure, entry);
        Ok(EnqueueReport {
            stalled,
            stall_time,
            pending,
        })
    }

    /// Device side, non-blocking: like [`enqueue`](Self::enqueue), but an ALL-mode queue holding
    /// `buffer_depth` undrained elements returns [`OutfeedError::Full`] (counted as a stall)
    /// with the elements handed back, instead of waiting.
    ///
    /// # Errors
    ///
    /// [`OutfeedError::Full`] as above, and the errors of [`enqueue`](Self::enqueue).
    pub fn try_enqueue(&self, per_replica: Vec<Element>) -> Result<EnqueueReport, OutfeedError> {
        self.validate(&per_replica)?;
        let structure = Structure::of(&per_replica[0]);
        let mut state = self.lock();
        self.check_structure(&state, &structure)?;
        if self.mode == OutfeedMode::All && state.entries.len() >= self.buffer_depth {
            state.full_rejections += 1;
            return Err(OutfeedError::Full {
                queue: self.name.clone(),
                depth: self.buffer_depth,
                rejected: Rejected(per_replica),
            });
        }
        let pending = self.push(&mut state, structure, flatten(per_replica));
        Ok(EnqueueReport {
            stalled: false,
            stall_time: Duration::ZERO,
            pending,
        })
    }

    /// Host side: a receiver that gets one `()` for every successful enqueue from now on
    /// ([`enqueue`](Self::enqueue) or [`try_enqueue`](Self::try_enqueue); a rejected or failed
    /// enqueue sends nothing), in both modes.
    ///
    /// The channel is unbounded, so a slow subscriber never stalls the device; any number of
    /// subscribers may exist, and dropping a receiver unsubscribes it. With one receiver per
    /// queue, the host can block on several queues at once with `crossbeam_channel::select!`
    /// instead of polling, then [`dequeue`](Self::dequeue) the queue that has data (an ALL-mode
    /// dequeue drains several enqueues at once, so later notifications may find it empty).
    ///
    /// ```
    /// use crossbeam_channel::select;
    /// use tessera_host::outfeed::{Element, HostTensor, OutfeedQueue};
    ///
    /// let losses = OutfeedQueue::with_defaults("losses");
    /// let grads = OutfeedQueue::with_defaults("grads");
    /// let (on_loss, on_grad) = (losses.subscribe(), grads.subscribe());
    /// grads.enqueue(vec![Element::Tensor(HostTensor::scalar(0.5))]).unwrap();
    /// let drained = select! {
    ///     recv(on_loss) -> _ => losses.dequeue().unwrap(),
    ///     recv(on_grad) -> _ => grads.dequeue().unwrap(),
    /// };
    /// assert_eq!(drained.into_tensor().unwrap().data, [0.5]);
    /// ```
    #[must_use]
    pub fn subscribe(&self) -> Receiver<()> {
        let (sender, receiver) = crossbeam_channel::unbounded();
        self.lock().subscribers.push(sender);
        receiver
    }

    /// Host side: waits up to `timeout` until at least one element is undrained (ALL) or held
    /// (LAST), and returns how many there are (0 on timeout).
    #[must_use]
    pub fn wait_for_elements(&self, timeout: Duration) -> usize {
        let state = self.lock();
        let (state, _) = self
            .arrived
            .wait_timeout_while(state, timeout, |s| s.entries.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        state.entries.len()
    }

    /// Host side: dequeues (see the [module docs](self) for shapes and the empty cases).
    ///
    /// ALL mode drains every undrained element, oldest first, and wakes a stalled device.
    /// LAST mode returns the newest element without removing it.
    ///
    /// # Errors
    ///
    /// [`OutfeedError::NothingEnqueued`] in LAST mode before the first enqueue.
    pub fn dequeue(&self) -> Result<Dequeued, OutfeedError> {
        let mut state = self.lock();
        let Some(structure) = state.structure.clone() else {
            return match self.mode {
                OutfeedMode::All => Ok(Dequeued::Empty),
                OutfeedMode::Last => Err(OutfeedError::NothingEnqueued {
                    queue: self.name.clone(),
                }),
            };
        };
        let (entries, lead): (Vec<Entry>, Vec<usize>) = match self.mode {
            OutfeedMode::All => {
                let entries: Vec<Entry> = std::mem::take(&mut state.entries).into();
                state.dequeued += entries.len() as u64;
                self.drained.notify_all();
                let n = entries.len();
                (entries, vec![n])
            }
            OutfeedMode::Last => match state.entries.back().cloned() {
                Some(entry) => {
                    state.dequeued += 1;
                    (vec![entry], Vec::new())
                }
                None => {
                    return Err(OutfeedError::NothingEnqueued {
                        queue: self.name.clone(),
                    })
                }
            },
        };
        drop(state);
        // Stack outside the lock so the device is not held up by the copy.
        let mut lead = lead;
        if self.replicas > 1 {
            lead.push(self.replicas);
        }
        let mut entries = entries;
        let mut stacked = |slot: usize, shape: &[usize]| {
            let mut full = lead.clone();
            full.extend_from_slice(shape);
            if let [only] = entries.as_mut_slice() {
                // One element (a host that drains as elements arrive): its data, moved.
                let data = only.get_mut(slot).map(std::mem::take).unwrap_or_default();
                return HostTensor { shape: full, data };
            }
            let mut data = Vec::with_capacity(
                entries
                    .iter()
                    .filter_map(|e| e.get(slot))
                    .map(Vec::len)
                    .sum(),
            );
            for part in entries.iter().filter_map(|e| e.get(slot)) {
                data.extend_from_slice(part);
            }
            HostTensor { shape: full, data }
        };
        Ok(match structure {
            Structure::Tensor(shape) => Dequeued::Tensor(stacked(0, &shape)),
            Structure::Map(shapes) => Dequeued::Map(
                shapes
                    .iter()
                    .enumerate()
                    .map(|(slot, (key, shape))| (key.clone(), stacked(slot, shape)))
                    .collect(),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    fn t(shape: &[usize], data: &[f32]) -> HostTensor {
        HostTensor::new(shape.to_vec(), data.to_vec()).unwrap()
    }

    fn te(shape: &[usize], data: &[f32]) -> Element {
        Element::Tensor(t(shape, data))
    }

    fn map(entries: &[(&str, HostTensor)]) -> Element {
        Element::Map(
            entries
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn construction_checks_depth_and_replicas() {
        for depth in [0, 256, usize::MAX] {
            let err = OutfeedQueue::new("q", OutfeedMode::All, depth, 1).unwrap_err();
            assert_eq!(
                err,
                OutfeedError::InvalidBufferDepth {
                    queue: "q".into(),
                    depth
                }
            );
        }
        assert!(OutfeedQueue::new("q", OutfeedMode::All, 1, 1).is_ok());
        assert!(OutfeedQueue::new("q", OutfeedMode::Last, 255, 1).is_ok());
        assert_eq!(
            OutfeedQueue::new("q", OutfeedMode::All, 3, 0).unwrap_err(),
            OutfeedError::NoReplicas { queue: "q".into() }
        );
        let q = OutfeedQueue::with_defaults("d");
        assert_eq!(q.name(), "d");
        assert_eq!(q.mode(), OutfeedMode::All);
        assert_eq!(OutfeedMode::default(), OutfeedMode::All);
        assert_eq!(q.buffer_depth(), DEFAULT_BUFFER_DEPTH);
        assert_eq!(q.replicas(), 1);
    }

    #[test]
    fn all_mode_stacks_tensors_oldest_first() {
        let q = OutfeedQueue::new("q", OutfeedMode::All, 3, 1).unwrap();
        assert_eq!(q.dequeue().unwrap(), Dequeued::Empty);
        q.enqueue(vec![te(&[2], &[1.0, 2.0])]).unwrap();
        q.enqueue(vec![te(&[2], &[3.0, 4.0])]).unwrap();
        assert_eq!(q.pending(), 2);
        let out = q.dequeue().unwrap().into_tensor().unwrap();
        assert_eq!(out, t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]));
        assert_eq!(q.pending(), 0);
        assert_eq!((q.enqueued(), q.dequeued()), (2, 2));
        // Drained, but the structure is known: n = 0.
        let out = q.dequeue().unwrap().into_tensor().unwrap();
        assert_eq!(out.shape, vec![0, 2]);
        assert!(out.data.is_empty());
    }

    #[test]
    fn all_mode_with_replicas_adds_a_replica_dimension() {
        let q = OutfeedQueue::new("q", OutfeedMode::All, 3, 2).unwrap();
        q.enqueue(vec![te(&[], &[1.0]), te(&[], &[2.0])]).unwrap();
        q.enqueue(vec![te(&[], &[3.0]), te(&[], &[4.0])]).unwrap();
        let out = q.dequeue().unwrap().into_tensor().unwrap();
        assert_eq!(out, t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]));
        assert_eq!(q.dequeue().unwrap().tensor().unwrap().shape, vec![0, 2]);
    }

    #[test]
    fn maps_stack_per_key() {
        let q = OutfeedQueue::new("q", OutfeedMode::All, 3, 1).unwrap();
        for i in 0..3 {
            let i = i as f32;
            q.enqueue(vec![map(&[
                ("b", t(&[2], &[i, i])),
                ("a", HostTensor::scalar(i)),
            ])])
            .unwrap();
        }
        let out = q.dequeue().unwrap();
        assert_eq!(out.get("a").unwrap(), &t(&[3], &[0.0, 1.0, 2.0]));
        assert_eq!(
            out.get("b").unwrap(),
            &t(&[3, 2], &[0.0, 0.0, 1.0, 1.0, 2.0, 2.0])
        );
        let keys: Vec<&String> = out.map().unwrap().keys().collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(q.dequeue().unwrap().get("b").unwrap().shape, vec![0, 2]);
    }

    #[test]
    fn last_mode_keeps_the_newest_and_does_not_consume() {
        let q = OutfeedQueue::new("last", OutfeedMode::Last, 1, 2).unwrap();
        assert_eq!(
            q.dequeue().unwrap_err(),
            OutfeedError::NothingEnqueued {
                queue: "last".into()
            }
        );
        for i in 0..10 {
            let i = i as f32;
            let r = q.enqueue(vec![te(&[1], &[i]), te(&[1], &[-i])]).unwrap();
            assert!(!r.stalled);
            assert_eq!(r.pending, 1);
        }
        assert_eq!(q.stall_count(), 0);
        let out = q.dequeue().unwrap().into_tensor().unwrap();
        assert_eq!(out, t(&[2, 1], &[9.0, -9.0]));
        assert_eq!(q.dequeue().unwrap().into_tensor().unwrap(), out);
        assert!(q
            .try_enqueue(vec![te(&[1], &[1.0]), te(&[1], &[2.0])])
            .is_ok());
        assert!(!q.is_full());
    }

    #[test]
    fn enqueue_checks_replicas_tensors_and_structure() {
        let q = OutfeedQueue::new("grads", OutfeedMode::All, 3, 2).unwrap();
        assert_eq!(
            q.enqueue(vec![te(&[1], &[1.0])]).unwrap_err(),
            OutfeedError::WrongReplicaCount {
                queue: "grads".into(),
                expected: 2,
                found: 1
            }
        );
        let broken = HostTensor {
            shape: vec![3],
            data: vec![0.0],
        };
        let err = q
            .enqueue(vec![map(&[("w", broken.clone())]), map(&[("w", broken)])])
            .unwrap_err();
        assert!(matches!(
            &err,
            OutfeedError::BadTensor { replica: 0, key: Some(k), .. } if k == "w"
        ));
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(
            err.to_string(),
            "outfeed 'grads': replica 0 key 'w': a tensor of shape (3,) needs 3 elements, found 1"
        );

        let err = q
            .enqueue(vec![
                map(&[("a", t(&[1], &[0.0])), ("b", t(&[2], &[0.0; 2]))]),
                map(&[("a", t(&[1], &[0.0])), ("b", t(&[3], &[0.0; 3]))]),
            ])
            .unwrap_err();
        assert_eq!(
            err,
            OutfeedError::ReplicaMismatch {
                queue: "grads".into(),
                replica: 1,
                key: Some("b".into()),
                expected: Layout::Tensor(vec![2]),
                found: Layout::Tensor(vec![3]),
            }
        );
        assert_eq!(
            err.to_string(),
            "outfeed 'grads': replica 1 key 'b' has shape (3,), but replica 0 has shape (2,)"
        );
        let err = q
            .enqueue(vec![map(&[("a", t(&[1], &[0.0]))]), te(&[1], &[0.0])])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "outfeed 'grads': replica 1 has shape (1,), but replica 0 has a map with keys [a]"
        );
        let err = q
            .enqueue(vec![
                map(&[("a", t(&[1], &[0.0]))]),
                map(&[("a", t(&[1], &[0.0])), ("c", t(&[1], &[0.0]))]),
            ])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "outfeed 'grads': replica 1 key 'c' has shape (1,), but replica 0 has no such key"
        );
        // Nothing was enqueued by the failures, so the structure is still open.
        assert_eq!(q.enqueued(), 0);
        q.enqueue(vec![te(&[2], &[0.0; 2]), te(&[2], &[0.0; 2])])
            .unwrap();
        let err = q
            .enqueue(vec![te(&[3], &[0.0; 3]), te(&[3], &[0.0; 3])])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "outfeed 'grads': element has shape (3,), but earlier enqueues had shape (2,)"
        );
        let err = q.try_enqueue(vec![map(&[]), map(&[])]).unwrap_err();
        assert!(matches!(
            err,
            OutfeedError::StructureChanged { key: None, .. }
        ));
        assert_eq!(q.enqueued(), 1);
    }

    #[test]
    fn structure_change_names_the_key() {
        let q = OutfeedQueue::with_defaults("taps");
        q.enqueue(vec![map(&[("x", t(&[2], &[0.0; 2]))])]).unwrap();
        let err = q
            .enqueue(vec![map(&[("y", t(&[2], &[0.0; 2]))])])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "outfeed 'taps': key 'x' has no such key, but earlier enqueues had shape (2,)"
        );
        assert_eq!(err.queue(), "taps");
    }

    #[test]
    fn try_enqueue_reports_full_and_hands_the_elements_back() {
        let q = OutfeedQueue::new("q", OutfeedMode::All, 2, 1).unwrap();
        q.try_enqueue(vec![te(&[], &[0.0])]).unwrap();
        q.try_enqueue(vec![te(&[], &[1.0])]).unwrap();
        assert!(q.is_full());
        let err = q.try_enqueue(vec![te(&[], &[2.0])]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "outfeed 'q': full, 2 undrained element(s) (the buffer depth); the host must \
             dequeue first"
        );
        assert_eq!(
            format!("{:?}", Rejected(vec![])),
            "Rejected(<0 element(s)>)"
        );
        let back = err.into_rejected().unwrap();
        assert_eq!(back, vec![te(&[], &[2.0])]);
        assert_eq!(
            (q.stall_count(), q.full_rejections(), q.stalled_enqueues()),
            (1, 1, 0)
        );
        q.dequeue().unwrap();
        q.try_enqueue(back).unwrap();
        assert_eq!(q.dequeue().unwrap().into_tensor().unwrap().data, [2.0]);
        assert!(OutfeedError::NoReplicas { queue: "q".into() }
            .into_rejected()
            .is_none());
    }

    #[test]
    fn a_full_queue_stalls_the_device_until_the_host_drains() {
        let q = Arc::new(OutfeedQueue::new("q", OutfeedMode::All, 1, 1).unwrap());
        assert!(!q.enqueue(vec![te(&[], &[0.0])]).unwrap().stalled);
        let producer = {
            let q = Arc::clone(&q);
            thread::spawn(move || q.enqueue(vec![te(&[], &[1.0])]).unwrap())
        };
        // The producer cannot finish before the drain; wait until it is blocked.
        while q.waiting_enqueues() == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        assert!(!producer.is_finished());
        assert_eq!(q.dequeue().unwrap().into_tensor().unwrap().data, [0.0]);
        let report = producer.join().unwrap();
        assert!(report.stalled);
        assert!(report.stall_time > Duration::ZERO);
        assert_eq!(q.stalled_enqueues(), 1);
        assert_eq!(q.stall_count(), 1);
        assert_eq!(q.waiting_enqueues(), 0);
        assert!(q.stall_time() >= report.stall_time);
        assert_eq!(q.dequeue().unwrap().into_tensor().unwrap().data, [1.0]);
    }

    #[test]
    fn wait_for_elements_wakes_on_arrival_or_times_out() {
        let q = Arc::new(OutfeedQueue::with_defaults("q"));
        assert_eq!(q.wait_for_elements(Duration::from_millis(5)), 0);
        let producer = {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(10));
                q.enqueue(vec![te(&[], &[0.0])]).unwrap();
            })
        };
        assert_eq!(q.wait_for_elements(Duration::from_secs(60)), 1);
        producer.join().unwrap();
    }

    #[test]
    fn subscribers_get_one_message_per_successful_enqueue() {
        let q = OutfeedQueue::new("q", OutfeedMode::All, 2, 1).unwrap();
        let early = q.subscribe();
        q.enqueue(vec![te(&[], &[0.0])]).unwrap();
        let late = q.subscribe();
        q.try_enqueue(vec![te(&[], &[1.0])]).unwrap();
        // A rejected (full) or failed (changed structure) enqueue sends nothing.
        assert!(q.try_enqueue(vec![te(&[], &[2.0])]).is_err());
        assert_eq!(q.dequeue().unwrap().into_tensor().unwrap().data, [0.0, 1.0]);
        assert!(q.enqueue(vec![te(&[3], &[0.0; 3])]).is_err());
        assert_eq!(early.try_iter().count(), 2);
        assert_eq!(late.try_iter().count(), 1);
        // Nothing more is on its way: every message was for an enqueue that happened.
        q.enqueue(vec![te(&[], &[3.0])]).unwrap();
        assert_eq!((early.len(), late.len()), (1, 1));
    }

    #[test]
    fn a_dropped_subscriber_is_ignored_and_forgotten() {
        let q = OutfeedQueue::new("q", OutfeedMode::Last, 1, 1).unwrap();
        let kept = q.subscribe();
        drop(q.subscribe());
        for i in 0..3 {
            let report = q.enqueue(vec![te(&[], &[i as f32])]).unwrap();
            assert!(!report.stalled);
        }
        assert_eq!(kept.try_iter().count(), 3);
        assert_eq!(q.lock().subscribers.len(), 1);
        drop(kept);
        q.enqueue(vec![te(&[], &[3.0])]).unwrap();
        assert!(q.lock().subscribers.is_empty());
    }

    #[test]
    fn a_stalled_enqueue_notifies_once_it_completes() {
        let q = Arc::new(OutfeedQueue::new("q", OutfeedMode::All, 1, 1).unwrap());
        let events = q.subscribe();
        q.enqueue(vec![te(&[], &[0.0])]).unwrap();
        events.recv().unwrap();
        let producer = {
            let q = Arc::clone(&q);
            thread::spawn(move || q.enqueue(vec![te(&[], &[1.0])]).unwrap())
        };
        while q.waiting_enqueues() == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        // Blocked in the enqueue: it has not stored its element, so it cannot have notified.
        assert!(events.is_empty());
        assert_eq!(q.dequeue().unwrap().into_tensor().unwrap().data, [0.0]);
        events
            .recv_timeout(Duration::from_secs(60))
            .expect("the stalled enqueue completed");
        assert!(producer.join().unwrap().stalled);
        assert_eq!(q.dequeue().unwrap().into_tensor().unwrap().data, [1.0]);
    }

    #[test]
    fn the_host_selects_over_several_queues_without_polling() {
        const N: usize = 30;
        let a = Arc::new(OutfeedQueue::with_defaults("a"));
        let b = Arc::new(OutfeedQueue::with_defaults("b"));
        let (on_a, on_b) = (a.subscribe(), b.subscribe());
        let device = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || {
                for i in 0..N {
                    let q = if i % 3 == 0 { &a } else { &b };
                    q.enqueue(vec![te(&[], &[i as f32])]).unwrap();
                }
            })
        };
        let drain = |q: &OutfeedQueue| q.dequeue().unwrap().into_tensor().unwrap().data;
        let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
        let deadline = crossbeam_channel::after(Duration::from_secs(60));
        while got_a.len() + got_b.len() < N {
            crossbeam_channel::select! {
                recv(on_a) -> m => {
                    m.unwrap();
                    got_a.extend(drain(&a));
                }
                recv(on_b) -> m => {
                    m.unwrap();
                    got_b.extend(drain(&b));
                }
                recv(deadline) -> _ => panic!("only {} + {} elements arrived", got_a.len(), got_b.len()),
            }
        }
        device.join().unwrap();
        let expected = |keep: fn(usize) -> bool| -> Vec<f32> {
            (0..N).filter(|&i| keep(i)).map(|i| i as f32).collect()
        };
        assert_eq!(got_a, expected(|i| i % 3 == 0));
        assert_eq!(got_b, expected(|i| i % 3 != 0));
    }

    #[test]
    fn queue_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<OutfeedQueue>();
        assert_send_sync::<OutfeedError>();
    }

    #[test]
    fn dequeued_accessors() {
        let d = Dequeued::Tensor(HostTensor::scalar(1.0));
        assert!(d.tensor().is_some() && d.map().is_none() && d.get("a").is_none());
        assert!(!d.is_empty() && Dequeued::Empty.is_empty());
        assert!(d.clone().into_map().is_none());
        assert!(Dequeued::Map(BTreeMap::new()).into_tensor().is_none());
        assert_eq!(OutfeedMode::Last.to_string(), "LAST");
        assert_eq!(Layout::Missing.to_string(), "no such key");
    }
}
