//! The ahead-of-time plan: execution order, liveness of every tensor and a static arena
//! layout, fixed before anything runs ([`crate::run`] executes it).
//!
//! Tensors live in one of two caller-supplied byte buffers:
//! - the **state** buffer holds what lives for the whole program: variables, optimizer state and
//!   constants, one after another;
//! - the **arena** holds everything else (inputs, activations, gradients, and the workspace a
//!   kernel needs while it runs), each at a fixed offset chosen so that no two tensors alive at
//!   the same step overlap.
//!
//! A view (a reshape) has no bytes of its own: it shares its operand's, and keeps them alive as
//! long as it is read.

use crate::error::{name_lossy, PlanError, RunError};
use crate::graph::{Graph, NodeId, NodeRef};
use crate::op::Op;
use crate::storage::{Buffer, Storage};
use crate::Roles;

/// Alignment of every tensor's offset, in bytes (a 128-bit load on the tile, a cache line's
/// fraction on a host).
pub const ALIGN: usize = 16;

/// Which buffer holds a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Place {
    /// The arena (inputs, activations, gradients).
    Arena,
    /// The state buffer (variables, optimizer state, constants).
    State,
    /// No storage: the node produces no tensor (a weight update).
    Nowhere,
}

/// Where a tensor lives and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Slot {
    /// The buffer.
    pub place: Place,
    /// Byte offset in that buffer (a multiple of [`ALIGN`]).
    pub offset: usize,
    /// Bytes reserved (the tensor's size rounded up to [`ALIGN`]; 0 for a view, whose bytes
    /// are its root's, and for updates).
    pub bytes: usize,
    /// First step at which the tensor holds live data (0 for inputs, written before a run).
    /// Inputs stay live to the end, so they survive a run and can be reused by the next one.
    pub first: usize,
    /// Last step that reads it (the end of the program for outputs). A root's last step
    /// includes its views' readers.
    pub last: usize,
    /// For a view: the node that owns the bytes (never itself a view).
    pub view_of: Option<NodeId>,
    /// Arena offset of the workspace the node's kernel uses while it runs.
    pub workspace_offset: usize,
    /// Bytes of that workspace (0 for most ops).
    pub workspace_bytes: usize,
}

impl Slot {
    /// Whether the tensor is live at `step`.
    pub fn live_at(&self, step: usize) -> bool {
        self.first <= step && step <= self.last
    }

    /// Whether two tensors are live at some common step.
    pub fn overlaps_in_time(&self, other: &Slot) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    /// Whether two tensors share any byte of the same buffer.
    pub fn overlaps_in_space(&self, other: &Slot) -> bool {
        self.place == other.place
            && self.place != Place::Nowhere
            && self.offset < other.offset + other.bytes
            && other.offset < self.offset + self.bytes
    }
}

pub(crate) fn align_up(x: usize) -> Option<usize> {
    x.checked_add(ALIGN - 1).map(|v| v & !(ALIGN - 1))
}

/// An immutable, compiled plan of a graph whose lists live in storage `S`.
///
/// ```
/// use tessera_core::{Activation, DType, Fixed, Graph, Plan};
/// let mut g: Graph<Fixed<16>> = Graph::new();
/// let x = g.input("x", &[2, 3], DType::F32)?;
/// let y = g.dense("Dense_4", x, 4, Activation::Relu, DType::F32)?;
/// g.mark_output(y)?;
/// let plan = Plan::new(&g)?;
/// let mut arena = [0u8; 256];
/// let mut state = [0u8; 256];
/// assert!(plan.arena_bytes() <= arena.len() && plan.state_bytes() <= state.len());
/// plan.init_state(&mut state, 42)?;
/// plan.write_input("x", &mut arena, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?;
/// plan.infer(&mut arena, &state)?;
/// let out = plan.tensor(y, &arena, &state)?;
/// assert!(out.iter().all(|v| v >= 0.0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Plan<S: Storage> {
    pub(crate) graph: Graph<S>,
    pub(crate) slots: S::Vec<Slot>,
    pub(crate) arena_bytes: usize,
    pub(crate) state_bytes: usize,
    pub(crate) peak_live_bytes: usize,
}

impl<S: Storage> Clone for Plan<S> {
    fn clone(&self) -> Self {
        Plan {
            graph: self.graph.clone(),
            slots: self.slots.clone(),
            arena_bytes: self.arena_bytes,
            state_bytes: self.state_bytes,
            peak_live_bytes: self.peak_live_bytes,
        }
    }
}

impl<S: Storage> core::fmt::Debug for Plan<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Plan")
            .field("nodes", &self.graph.len())
            .field("arena_bytes", &self.arena_bytes)
            .field("state_bytes", &self.state_bytes)
            .field("peak_live_bytes", &self.peak_live_bytes)
            .finish()
    }
}

/// The lowest offset at which `bytes` fit between the `busy` (start, end) ranges, sorted.
fn lowest_fit(busy: &mut [(usize, usize)], bytes: usize) -> usize {
    busy.sort_unstable();
    let mut at = 0usize;
    for &(start, stop) in busy.iter() {
        if start >= at + bytes {
            break;
        }
        at = at.max(stop);
    }
    at
}

impl<S: Storage> Plan<S> {
    /// Plans `graph`: liveness from the execution order, the state layout, and the arena layout
    /// (greedy by size: largest tensors first, each at the lowest offset free over its
    /// lifetime; then each kernel's workspace, live only while its node runs).
    pub fn new(graph: &Graph<S>) -> Result<Self, PlanError> {
        Self::with_workspaces(graph, true)
    }

    /// [`Plan::new`] without kernel workspaces (`workspaces: false`): the smallest arena, for
    /// a microcontroller's RAM. Kernels that would use a workspace (convolutions unfold their
    /// patches there) run the same sums as direct loops instead, with bit-identical results
    /// (unless the host turned on the fast matmul, `kernels::wide`, whose fused multiply-adds
    /// round each term once where the direct loops round twice).
    pub fn with_workspaces(graph: &Graph<S>, workspaces: bool) -> Result<Self, PlanError> {
        let (mut slots, state_bytes) = Self::slots_of(graph, workspaces)?;
        let mut arena_bytes = Self::place_tensors(graph, &mut slots)?;
        arena_bytes = arena_bytes.max(Self::place_workspaces(graph, &mut slots)?);
        // Views read their root's bytes.
        for i in 0..slots.len() {
            if let Some(root) = slots[i].view_of {
                let r = slots[root.index()];
                let s = &mut slots[i];
                (s.place, s.offset, s.first) = (r.place, r.offset, r.first);
            }
        }
        let mut peak_live_bytes = 0;
        for step in 0..graph.len() {
            let live: usize = slots
                .iter()
                .filter(|s| s.place == Place::Arena && s.live_at(step))
                .map(|s| s.bytes)
                .sum::<usize>()
                + slots[step].workspace_bytes;
            peak_live_bytes = peak_live_bytes.max(live);
        }
        Ok(Plan {
            graph: graph.clone(),
            slots,
            arena_bytes,
            state_bytes,
            peak_live_bytes,
        })
    }

    /// Every node's slot with its liveness, state offsets assigned; arena offsets still 0.
    fn slots_of(graph: &Graph<S>, workspaces: bool) -> Result<(S::Vec<Slot>, usize), PlanError> {
        let len = graph.len();
        let end = len.saturating_sub(1);
        let mut slots: S::Vec<Slot> = S::vec();
        let mut state_bytes = 0usize;
        for (i, node) in graph.nodes().iter().enumerate() {
            let too_large = || PlanError::TooLarge {
                node: node.name.clone(),
            };
            let view_of = node.op.view_of().map(|x| match slots[x.index()].view_of {
                Some(root) => root,
                None => x,
            });
            let raw = node
                .shape
                .elements()
                .checked_mul(node.dtype.size())
                .ok_or_else(too_large)?;
            let bytes = if node.op.is_update() || view_of.is_some() {
                0
            } else {
                align_up(raw).ok_or_else(too_large)?
            };
            let place = if node.op.is_update() {
                Place::Nowhere
            } else if node.op.is_state() {
                Place::State
            } else {
                Place::Arena
            };
            let (first, offset) = match place {
                Place::State if view_of.is_none() => {
                    let off = state_bytes;
                    state_bytes = state_bytes.checked_add(bytes).ok_or_else(too_large)?;
                    (0, off)
                }
                _ if node.op == Op::Input => (0, 0),
                _ => (i, 0),
            };
            let last = if place == Place::State
                || node.op == Op::Input
                || node
                    .roles
                    .intersects(Roles::OUTPUT | Roles::TAPPED | Roles::LOSS)
            {
                end
            } else {
                i
            };
            let workspace_bytes = if workspaces {
                align_up(crate::ops::workspace_bytes(graph, node)).ok_or_else(too_large)?
            } else {
                0
            };
            slots
                .push(Slot {
                    place,
                    offset,
                    bytes,
                    first,
                    last,
                    view_of,
                    workspace_offset: 0,
                    workspace_bytes,
                })
                .map_err(|_| PlanError::Capacity)?;
        }
        for (i, node) in graph.nodes().iter().enumerate() {
            for o in node.op.operands().as_slice() {
                let s = &mut slots[o.index()];
                s.last = s.last.max(i);
            }
        }
        // A root stays live while any of its views is read.
        for i in (0..len).rev() {
            if let Some(root) = slots[i].view_of {
                let last = slots[i].last;
                let r = &mut slots[root.index()];
                r.last = r.last.max(last);
            }
        }
        Ok((slots, state_bytes))
    }

    /// Places arena tensors, largest first; returns the arena's top.
    fn place_tensors(graph: &Graph<S>, slots: &mut S::Vec<Slot>) -> Result<usize, PlanError> {
        let mut order: S::Vec<u32> = S::vec();
        for (i, s) in slots.iter().enumerate() {
            if s.place == Place::Arena && s.view_of.is_none() {
                order.push(i as u32).map_err(|_| PlanError::Capacity)?;
            }
        }
        order.sort_unstable_by(|&a, &b| {
            let (sa, sb) = (&slots[a as usize], &slots[b as usize]);
            sb.bytes
                .cmp(&sa.bytes)
                .then(sa.first.cmp(&sb.first))
                .then(a.cmp(&b))
        });
        let mut placed: S::Vec<bool> = S::filled(slots.len(), false).ok_or(PlanError::Capacity)?;
        let mut busy: S::Vec<(usize, usize)> = S::vec();
        let mut top = 0usize;
        for &t in order.iter() {
            let t = t as usize;
            let me = slots[t];
            busy.truncate(0);
            for (j, s) in slots.iter().enumerate() {
                if placed[j] && s.overlaps_in_time(&me) {
                    busy.push((s.offset, s.offset + s.bytes))
                        .map_err(|_| PlanError::Capacity)?;
                }
            }
            let at = lowest_fit(&mut busy, me.bytes);
            slots[t].offset = at;
            placed[t] = true;
            let end = at
                .checked_add(me.bytes)
                .ok_or_else(|| PlanError::TooLarge {
                    node: graph.node(NodeId::at(t)).name.clone(),
                })?;
            top = top.max(end);
        }
        Ok(top)
    }

    /// Places each kernel workspace where no tensor live at its node's step lies; returns the
    /// arena's top.
    fn place_workspaces(graph: &Graph<S>, slots: &mut S::Vec<Slot>) -> Result<usize, PlanError> {
        let mut busy: S::Vec<(usize, usize)> = S::vec();
        let mut top = 0usize;
        for i in 0..slots.len() {
            let bytes = slots[i].workspace_bytes;
            if bytes == 0 {
                continue;
            }
            busy.truncate(0);
            for s in slots.iter() {
                if s.place == Place::Arena && s.view_of.is_none() && s.live_at(i) {
                    busy.push((s.offset, s.offset + s.bytes))
                        .map_err(|_| PlanError::Capacity)?;
                }
            }
            let at = lowest_fit(&mut busy, bytes);
            slots[i].workspace_offset = at;
            let end = at.checked_add(bytes).ok_or_else(|| PlanError::TooLarge {
                node: graph.node(NodeId::at(i)).name.clone(),
            })?;
            top = top.max(end);
        }
        Ok(top)
    }

    /// The graph this plan runs.
    pub fn graph(&self) -> &Graph<S> {
        &self.graph
    }

    /// Bytes of arena a run needs.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// Bytes of state (variables, optimizer state, constants).
    pub fn state_bytes(&self) -> usize {
        self.state_bytes
    }

    /// The largest total of arena tensors (and workspace) live at one step: a lower bound on
    /// any arena layout.
    pub fn peak_live_bytes(&self) -> usize {
        self.peak_live_bytes
    }

    /// Where and when each node's tensor lives, in execution order.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The slot of one tensor.
    pub fn slot(&self, x: impl NodeRef) -> Result<Slot, RunError> {
        let id = self.resolve(x)?;
        Ok(self.slots[id.index()])
    }

    /// The node whose bytes `x` reads: `x` itself, or the root of a view.
    pub fn storage_of(&self, x: NodeId) -> NodeId {
        self.slots
            .get(x.index())
            .and_then(|s| s.view_of)
            .unwrap_or(x)
    }

    pub(crate) fn resolve(&self, x: impl NodeRef) -> Result<NodeId, RunError> {
        x.resolve(&self.graph).map_err(|e| match e {
            crate::GraphError::UnknownName { name } => RunError::UnknownTensor { name },
            _ => RunError::UnknownTensor {
                name: name_lossy("<node id from another graph>"),
            },
        })
    }

    pub(crate) fn check(&self, arena: usize, state: usize) -> Result<(), RunError> {
        if arena < self.arena_bytes {
            return Err(RunError::ArenaTooSmall {
                needed: self.arena_bytes,
                supplied: arena,
            });
        }
        if state < self.state_bytes {
            return Err(RunError::StateTooSmall {
                needed: self.state_bytes,
                supplied: state,
            });
        }
        Ok(())
    }
}
