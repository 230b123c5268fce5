//! The ahead-of-time plan: execution order, liveness of every tensor and a static arena
//! layout, fixed before anything runs.
//!
//! Tensors live in one of two caller-supplied byte buffers:
//! - the **state** buffer holds what lives for the whole program: variables, optimizer state and
//!   constants, one after another;
//! - the **arena** holds everything else (inputs, activations, gradients), each tensor at a
//!   fixed offset chosen so that no two tensors alive at the same step overlap.
//!
//! Running a plan needs only those two slices: no allocator, no run-time shape checks.

use crate::error::{name_lossy, Name, PlanError, RunError};
use crate::graph::{Graph, Init, Node, NodeId, NodeRef, Op};
use crate::kernels as k;
use crate::rng::SplitMix64;
use crate::{DType, Roles, Shape};

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
    /// Bytes reserved (the tensor's size rounded up to [`ALIGN`]).
    pub bytes: usize,
    /// First step at which the tensor holds live data (0 for inputs, written before a run).
    /// Inputs stay live to the end, so they survive a run and can be reused by the next one.
    pub first: usize,
    /// Last step that reads it (the end of the program for outputs).
    pub last: usize,
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

fn align_up(x: usize) -> Option<usize> {
    x.checked_add(ALIGN - 1).map(|v| v & !(ALIGN - 1))
}

/// An immutable, compiled plan of a graph of at most `N` nodes.
///
/// ```
/// use tessera_core::{Graph, DType, Activation, Plan};
/// let mut g: Graph<16> = Graph::new();
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
#[derive(Clone, Debug)]
pub struct Plan<const N: usize> {
    graph: Graph<N>,
    slots: heapless::Vec<Slot, N>,
    arena_bytes: usize,
    state_bytes: usize,
    peak_live_bytes: usize,
}

enum StateBuf<'a> {
    Ref(&'a [u8]),
    Mut(&'a mut [u8]),
}

impl StateBuf<'_> {
    fn get(&self) -> &[u8] {
        match self {
            StateBuf::Ref(s) => s,
            StateBuf::Mut(s) => s,
        }
    }
}

/// The arena split around one output: shared views of everything before and after it.
struct Around<'a> {
    before: &'a [u8],
    after: &'a [u8],
    end: usize,
}

impl Around<'_> {
    fn get(&self, offset: usize, len: usize) -> &[u8] {
        if offset + len <= self.before.len() {
            &self.before[offset..offset + len]
        } else {
            // The plan never places a live operand over the output; indexing enforces it.
            &self.after[offset - self.end..offset - self.end + len]
        }
    }
}

/// A read-only view of a tensor's data.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    data: &'a [u8],
    dtype: DType,
    shape: Shape,
}

impl<'a> TensorRef<'a> {
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.elements()
    }
    /// Whether the tensor has no elements (never, for a valid shape).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Element `i` as `f32` (panics if out of range, as slice indexing does).
    pub fn get(&self, i: usize) -> f32 {
        k::load(self.data, self.dtype, i)
    }
    /// All elements as `f32`.
    pub fn iter(&self) -> impl Iterator<Item = f32> + 'a {
        let (data, dtype) = (self.data, self.dtype);
        (0..self.len()).map(move |i| k::load(data, dtype, i))
    }
    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }
}

impl<const N: usize> Plan<N> {
    /// Plans `graph`: liveness from the execution order, the state layout, and the arena layout
    /// (greedy by size: largest tensors first, each at the lowest offset free over its
    /// lifetime).
    pub fn new(graph: &Graph<N>) -> Result<Self, PlanError> {
        let len = graph.len();
        let end = len.saturating_sub(1);
        let mut slots: heapless::Vec<Slot, N> = heapless::Vec::new();
        let mut state_bytes = 0usize;
        for (i, node) in graph.nodes().iter().enumerate() {
            let too_large = || PlanError::TooLarge {
                node: node.name.clone(),
            };
            let raw = node
                .shape
                .elements()
                .checked_mul(node.dtype.size())
                .ok_or_else(too_large)?;
            let bytes = if node.op.is_update() {
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
                Place::State => {
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
            // Capacity is N and len <= N: this push cannot fail.
            let _ = slots.push(Slot {
                place,
                offset,
                bytes,
                first,
                last,
            });
        }
        for (i, node) in graph.nodes().iter().enumerate() {
            for o in node.op.operands().as_slice() {
                let s = &mut slots[o.index()];
                s.last = s.last.max(i);
            }
        }

        // Arena: greedy by size.
        let mut order: heapless::Vec<u16, N> = heapless::Vec::new();
        for (i, s) in slots.iter().enumerate() {
            if s.place == Place::Arena {
                let _ = order.push(i as u16);
            }
        }
        order.sort_unstable_by(|&a, &b| {
            let (sa, sb) = (&slots[a as usize], &slots[b as usize]);
            sb.bytes
                .cmp(&sa.bytes)
                .then(sa.first.cmp(&sb.first))
                .then(a.cmp(&b))
        });
        let mut placed = [false; N];
        let mut arena_bytes = 0usize;
        for &t in &order {
            let t = t as usize;
            let me = slots[t];
            let mut busy: heapless::Vec<(usize, usize), N> = heapless::Vec::new();
            for (j, s) in slots.iter().enumerate() {
                if placed[j] && s.place == Place::Arena && s.overlaps_in_time(&me) {
                    let _ = busy.push((s.offset, s.offset + s.bytes));
                }
            }
            busy.sort_unstable();
            let mut at = 0usize;
            for &(start, stop) in &busy {
                if start >= at + me.bytes {
                    break;
                }
                at = at.max(stop);
            }
            slots[t].offset = at;
            placed[t] = true;
            let top = at
                .checked_add(me.bytes)
                .ok_or_else(|| PlanError::TooLarge {
                    node: graph.node(NodeId(t as u16)).name.clone(),
                })?;
            arena_bytes = arena_bytes.max(top);
        }

        let mut peak_live_bytes = 0;
        for step in 0..len {
            let live: usize = slots
                .iter()
                .filter(|s| s.place == Place::Arena && s.live_at(step))
                .map(|s| s.bytes)
                .sum();
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

    /// The graph this plan runs.
    pub fn graph(&self) -> &Graph<N> {
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

    /// The largest total of arena tensors live at one step: a lower bound on any arena layout.
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

    fn resolve(&self, x: impl NodeRef) -> Result<NodeId, RunError> {
        x.resolve(&self.graph).map_err(|e| match e {
            crate::GraphError::UnknownName { name } => RunError::UnknownTensor { name },
            _ => RunError::UnknownTensor {
                name: name_lossy("<node id from another graph>"),
            },
        })
    }

    fn check(&self, arena: usize, state: usize) -> Result<(), RunError> {
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

    /// Fills the state buffer: each variable from its [`Init`] with a stream seeded by `seed`
    /// and the variable's name (so graphs sharing variable names start from the same weights),
    /// optimizer state with zeros, constants with their value.
    pub fn init_state(&self, state: &mut [u8], seed: u64) -> Result<(), RunError> {
        self.check(self.arena_bytes, state.len())?;
        for (node, slot) in self.graph.nodes().iter().zip(self.slots.iter()) {
            if slot.place != Place::State {
                continue;
            }
            let buf = &mut state[slot.offset..slot.offset + node.bytes()];
            let n = node.shape.elements();
            match node.op {
                Op::Constant { value } => (0..n).for_each(|i| k::store(buf, node.dtype, i, value)),
                Op::Variable { init } => {
                    let mut rng = SplitMix64::new(seed ^ name_hash(&node.name));
                    let (low, high) = match init {
                        Init::Zeros => (0.0, 0.0),
                        Init::Fill(v) => (v, v),
                        Init::Uniform { low, high } => (low, high),
                        Init::GlorotUniform => {
                            let (fan_in, fan_out) = fans(node.shape);
                            let limit = libm::sqrtf(6.0 / (fan_in + fan_out) as f32);
                            (-limit, limit)
                        }
                    };
                    for i in 0..n {
                        let v = if low == high {
                            low
                        } else {
                            low + (high - low) * rng.next_f32()
                        };
                        k::store(buf, node.dtype, i, v);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn input_slot(&self, x: impl NodeRef, len: usize) -> Result<(&Node, Slot), RunError> {
        let id = self.resolve(x)?;
        let node = self.graph.node(id);
        if node.op != Op::Input {
            return Err(RunError::WrongKind {
                tensor: node.name.clone(),
                expected: "an input",
            });
        }
        if len != node.shape.elements() {
            return Err(RunError::WrongLength {
                tensor: node.name.clone(),
                expected: node.shape.elements(),
                supplied: len,
            });
        }
        Ok((node, self.slots[id.index()]))
    }

    /// Writes an input's values (converted to its element type) into the arena.
    pub fn write_input(
        &self,
        x: impl NodeRef,
        arena: &mut [u8],
        values: &[f32],
    ) -> Result<(), RunError> {
        self.fill_input(x, arena, values.len(), |i| values[i])
    }

    /// Writes an input of `len` elements from a function of the element index.
    pub fn fill_input(
        &self,
        x: impl NodeRef,
        arena: &mut [u8],
        len: usize,
        mut f: impl FnMut(usize) -> f32,
    ) -> Result<(), RunError> {
        self.check(arena.len(), self.state_bytes)?;
        let (node, slot) = self.input_slot(x, len)?;
        let buf = &mut arena[slot.offset..slot.offset + node.bytes()];
        for i in 0..len {
            k::store(buf, node.dtype, i, f(i));
        }
        Ok(())
    }

    /// Overwrites a state tensor (a variable, optimizer state or constant) with `values`,
    /// converted to its element type: loading trained weights, for example.
    pub fn write_state(
        &self,
        x: impl NodeRef,
        state: &mut [u8],
        values: &[f32],
    ) -> Result<(), RunError> {
        self.check(self.arena_bytes, state.len())?;
        let id = self.resolve(x)?;
        let node = self.graph.node(id);
        let slot = self.slots[id.index()];
        if slot.place != Place::State {
            return Err(RunError::WrongKind {
                tensor: node.name.clone(),
                expected: "a state tensor (variable, optimizer state or constant)",
            });
        }
        if values.len() != node.shape.elements() {
            return Err(RunError::WrongLength {
                tensor: node.name.clone(),
                expected: node.shape.elements(),
                supplied: values.len(),
            });
        }
        let buf = &mut state[slot.offset..slot.offset + node.bytes()];
        for (i, &v) in values.iter().enumerate() {
            k::store(buf, node.dtype, i, v);
        }
        Ok(())
    }

    /// A view of any tensor: an input, activation or gradient in the arena (valid after a run,
    /// for outputs and tapped tensors; others may have been overwritten by later tensors), or a
    /// variable in the state.
    pub fn tensor<'a>(
        &self,
        x: impl NodeRef,
        arena: &'a [u8],
        state: &'a [u8],
    ) -> Result<TensorRef<'a>, RunError> {
        self.check(arena.len(), state.len())?;
        let id = self.resolve(x)?;
        let node = self.graph.node(id);
        let slot = self.slots[id.index()];
        let data = match slot.place {
            Place::Arena => &arena[slot.offset..slot.offset + node.bytes()],
            Place::State => &state[slot.offset..slot.offset + node.bytes()],
            Place::Nowhere => {
                return Err(RunError::WrongKind {
                    tensor: node.name.clone(),
                    expected: "a tensor (it is a weight update)",
                })
            }
        };
        Ok(TensorRef {
            data,
            dtype: node.dtype,
            shape: node.shape,
        })
    }

    /// Copies every state tensor (variables, optimizer state) that `from` has under the same
    /// name, shape and type into `state`. Returns how many were copied. This moves trained
    /// weights from a training plan to an inference plan.
    pub fn copy_state_from<const M: usize>(
        &self,
        state: &mut [u8],
        from: &Plan<M>,
        from_state: &[u8],
    ) -> Result<usize, RunError> {
        self.check(self.arena_bytes, state.len())?;
        from.check(from.arena_bytes, from_state.len())?;
        let mut copied = 0;
        for (node, slot) in self.graph.nodes().iter().zip(self.slots.iter()) {
            if slot.place != Place::State || node.roles.contains(Roles::CONSTANT) {
                continue;
            }
            if let Ok(src) = from.graph.find(&node.name) {
                let (sn, ss) = (from.graph.node(src), from.slots[src.index()]);
                if ss.place == Place::State && sn.shape == node.shape && sn.dtype == node.dtype {
                    let n = node.bytes();
                    state[slot.offset..slot.offset + n]
                        .copy_from_slice(&from_state[ss.offset..ss.offset + n]);
                    copied += 1;
                }
            }
        }
        Ok(copied)
    }

    /// Runs the forward pass (all nodes of an inference graph, the forward part of a training
    /// graph). The state is only read.
    pub fn infer(&self, arena: &mut [u8], state: &[u8]) -> Result<(), RunError> {
        self.check(arena.len(), state.len())?;
        let mut st = StateBuf::Ref(state);
        for i in 0..self.graph.forward_len() {
            self.exec(i, arena, &mut st)?;
        }
        Ok(())
    }

    /// Runs one training step: forward, backward and the weight update (in place in `state`).
    /// With gradient accumulation a step is one micro-batch: its gradients are accumulated, and
    /// every `count`-th step also applies the update and resets the accumulators.
    pub fn train_step(&self, arena: &mut [u8], state: &mut [u8]) -> Result<(), RunError> {
        if !self.graph.is_training() {
            return Err(RunError::NotATrainingPlan);
        }
        self.check(arena.len(), state.len())?;
        let Some((counter, count)) = self.graph.accumulation else {
            let mut st = StateBuf::Mut(state);
            for i in 0..self.graph.len() {
                self.exec(i, arena, &mut st)?;
            }
            return Ok(());
        };
        let mut st = StateBuf::Mut(state);
        for (i, n) in self.graph.nodes().iter().enumerate() {
            if !n.roles.contains(Roles::UPDATE) {
                self.exec(i, arena, &mut st)?;
            }
        }
        let seen = k::load_int(
            &st.get()[self.slots[counter.index()].offset..],
            DType::I32,
            0,
        );
        if seen >= i64::from(count) {
            self.apply_update(arena, &mut st)?;
        }
        Ok(())
    }

    /// Runs the weight-update nodes (once per `count` micro-batches with accumulation).
    fn apply_update(&self, arena: &mut [u8], st: &mut StateBuf<'_>) -> Result<(), RunError> {
        for (i, n) in self.graph.nodes().iter().enumerate() {
            if n.roles.contains(Roles::UPDATE) {
                self.exec(i, arena, st)?;
            }
        }
        Ok(())
    }

    /// Executes node `i` alone, reading its operands where the plan put them. Nodes must run in
    /// order; this is the building block of [`Plan::infer`] and [`Plan::train_step`] for
    /// executors that interleave their own work between nodes.
    pub fn run_node(&self, i: usize, arena: &mut [u8], state: &mut [u8]) -> Result<(), RunError> {
        self.check(arena.len(), state.len())?;
        self.exec(i, arena, &mut StateBuf::Mut(state))
    }

    fn exec(&self, i: usize, arena: &mut [u8], state: &mut StateBuf<'_>) -> Result<(), RunError> {
        let node = &self.graph.nodes()[i];
        if node.op.is_update() {
            return self.update(node, arena, state);
        }
        let slot = self.slots[i];
        if slot.place != Place::Arena || node.op == Op::Input {
            return Ok(());
        }
        let out_len = node.bytes();
        let (before, rest) = arena.split_at_mut(slot.offset);
        let (out, after) = rest.split_at_mut(out_len);
        let around = Around {
            before,
            after,
            end: slot.offset + out_len,
        };
        let st = state.get();
        let get = |x: NodeId| -> &[u8] {
            let s = self.slots[x.index()];
            let n = self.graph.node(x).bytes();
            match s.place {
                Place::State => &st[s.offset..s.offset + n],
                _ => around.get(s.offset, n),
            }
        };
        let dt = node.dtype;
        let shape = node.shape;
        let n = shape.elements();
        let bad_label = |(row, label): k::BadLabel, classes: usize| RunError::LabelOutOfRange {
            node: node.name.clone(),
            row,
            label,
            classes,
        };
        match node.op {
            Op::Input | Op::Variable { .. } | Op::Constant { .. } => {}
            Op::MatMul {
                a,
                b,
                transpose_a,
                transpose_b,
            } => {
                let sa = self.graph.node(a).shape;
                let kdim = if transpose_a { sa.dim(0) } else { sa.dim(1) };
                k::matmul(
                    get(a),
                    get(b),
                    dt,
                    out,
                    shape.dim(0),
                    kdim,
                    shape.dim(1),
                    transpose_a,
                    transpose_b,
                );
            }
            Op::BiasAdd { x, bias } => {
                k::bias_add(get(x), get(bias), dt, out, shape.rows(), shape.last())
            }
            Op::Add { a, b } => k::zip(get(a), get(b), dt, out, n, |x, y| x + y),
            Op::Sub { a, b } => k::zip(get(a), get(b), dt, out, n, |x, y| x - y),
            Op::Mul { a, b } => k::zip(get(a), get(b), dt, out, n, |x, y| x * y),
            Op::Scale { x, factor } => k::map(get(x), dt, out, dt, n, |v| v * factor),
            Op::Relu { x } => k::map(get(x), dt, out, dt, n, |v| if v > 0.0 { v } else { 0.0 }),
            Op::Sigmoid { x } => k::map(get(x), dt, out, dt, n, |v| 1.0 / (1.0 + libm::expf(-v))),
            Op::Tanh { x } => k::map(get(x), dt, out, dt, n, libm::tanhf),
            Op::Softmax { x } => k::softmax(get(x), dt, out, shape.rows(), shape.last()),
            Op::SparseCrossEntropy {
                x,
                labels,
                from_logits,
            } => {
                let sx = self.graph.node(x).shape;
                let lt = self.graph.node(labels).dtype;
                let v = k::sparse_cross_entropy(
                    get(x),
                    self.graph.node(x).dtype,
                    get(labels),
                    lt,
                    sx.dim(0),
                    sx.dim(1),
                    from_logits,
                )
                .map_err(|e| bad_label(e, sx.dim(1)))?;
                k::store(out, dt, 0, v);
            }
            Op::Reshape { x } | Op::Tap { x } => out.copy_from_slice(get(x)),
            Op::Concat { a, b } => {
                let es = dt.size();
                let (ca, cb) = (
                    self.graph.node(a).shape.last() * es,
                    self.graph.node(b).shape.last() * es,
                );
                let (xa, xb) = (get(a), get(b));
                for (r, row) in out.chunks_exact_mut(ca + cb).enumerate() {
                    row[..ca].copy_from_slice(&xa[r * ca..(r + 1) * ca]);
                    row[ca..].copy_from_slice(&xb[r * cb..(r + 1) * cb]);
                }
            }
            Op::Slice { x, offset } => {
                let es = dt.size();
                let (cx, c) = (self.graph.node(x).shape.last() * es, shape.last() * es);
                let o = offset as usize * es;
                let src = get(x);
                for (r, row) in out.chunks_exact_mut(c).enumerate() {
                    row.copy_from_slice(&src[r * cx + o..r * cx + o + c]);
                }
            }
            Op::Cast { x } => k::map(get(x), self.graph.node(x).dtype, out, dt, n, |v| v),
            Op::ReduceSum { x, axis } | Op::ReduceMean { x, axis } | Op::ReduceMax { x, axis } => {
                let sx = self.graph.node(x).shape;
                let (outer, len, inner) = match axis {
                    Some(a) => sx.split_at_axis(a as usize),
                    None => (1, sx.elements(), 1),
                };
                let kind = match node.op {
                    Op::ReduceSum { .. } => k::Reduction::Sum,
                    Op::ReduceMean { .. } => k::Reduction::Mean,
                    _ => k::Reduction::Max,
                };
                k::reduce(get(x), dt, out, outer, len, inner, kind);
            }
            Op::Broadcast { x: src, axis } => {
                let (outer, len, inner) = match axis {
                    Some(a) => shape.split_at_axis(a as usize),
                    None => (1, n, 1),
                };
                k::broadcast(get(src), dt, out, outer, len, inner);
            }
            Op::ReluGrad { dy, y } => {
                k::zip(
                    get(dy),
                    get(y),
                    dt,
                    out,
                    n,
                    |g, y| if y > 0.0 { g } else { 0.0 },
                )
            }
            Op::SigmoidGrad { dy, y } => {
                k::zip(get(dy), get(y), dt, out, n, |g, y| g * y * (1.0 - y))
            }
            Op::TanhGrad { dy, y } => k::zip(get(dy), get(y), dt, out, n, |g, y| g * (1.0 - y * y)),
            Op::SoftmaxGrad { dy, y } => {
                k::softmax_grad(get(dy), get(y), dt, out, shape.rows(), shape.last())
            }
            Op::SparseCrossEntropyGrad {
                x,
                labels,
                dloss,
                from_logits,
            } => {
                let lt = self.graph.node(labels).dtype;
                let dl = k::load(get(dloss), self.graph.node(dloss).dtype, 0);
                k::sparse_cross_entropy_grad(
                    get(x),
                    dt,
                    get(labels),
                    lt,
                    dl,
                    out,
                    shape.dim(0),
                    shape.dim(1),
                    from_logits,
                )
                .map_err(|e| bad_label(e, shape.dim(1)))?;
            }
            Op::ApplySgd { .. }
            | Op::ApplyMomentum { .. }
            | Op::ApplyAdam { .. }
            | Op::Increment { .. }
            | Op::Accumulate { .. }
            | Op::Fill { .. } => {}
        }
        Ok(())
    }

    fn update(&self, node: &Node, arena: &[u8], state: &mut StateBuf<'_>) -> Result<(), RunError> {
        let StateBuf::Mut(st) = state else {
            return Ok(()); // inference never reaches updates; nothing to write through a shared view
        };
        let off = |x: NodeId| self.slots[x.index()].offset;
        let node_of = |x: NodeId| self.graph.node(x);
        // A gradient lives in the arena, or in the state when it is an accumulator.
        let grad_in_state = |g: NodeId| self.slots[g.index()].place == Place::State;
        let load_grad = |st: &[u8], g: NodeId, i: usize| {
            let (s, t) = (self.slots[g.index()], node_of(g).dtype);
            if s.place == Place::State {
                k::load(&st[s.offset..], t, i)
            } else {
                k::load(&arena[s.offset..], t, i)
            }
        };
        match node.op {
            Op::ApplySgd { var, grad, lr } => {
                let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
                let wo = off(var);
                if !grad_in_state(grad) && node_of(grad).dtype == t {
                    let g = &arena[off(grad)..off(grad) + node_of(grad).bytes()];
                    k::zip_in_place(&mut st[wo..wo + n * t.size()], g, t, n, |w, g| w - lr * g);
                } else if grad_in_state(grad) && node_of(grad).dtype == t && off(grad) != wo {
                    // An accumulated gradient: another region of the state.
                    let (go, len) = (off(grad), n * t.size());
                    let (w, g) = if wo < go {
                        let (a, b) = st.split_at_mut(go);
                        (&mut a[wo..wo + len], &b[..len])
                    } else {
                        let (a, b) = st.split_at_mut(wo);
                        (&mut b[..len], &a[go..go + len])
                    };
                    k::zip_in_place(w, g, t, n, |w, g| w - lr * g);
                } else {
                    for i in 0..n {
                        let v = k::load(&st[wo..], t, i) - lr * load_grad(st, grad, i);
                        k::store(&mut st[wo..], t, i, v);
                    }
                }
            }
            Op::ApplyMomentum {
                var,
                velocity,
                grad,
                lr,
                momentum,
            } => {
                let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
                let (wo, vo) = (off(var), off(velocity));
                for i in 0..n {
                    let v = momentum * k::load(&st[vo..], t, i) - lr * load_grad(st, grad, i);
                    k::store(&mut st[vo..], t, i, v);
                    let w = k::load(&st[wo..], t, i) + v;
                    k::store(&mut st[wo..], t, i, w);
                }
            }
            Op::ApplyAdam {
                var,
                m,
                v,
                grad,
                step,
                lr,
                beta1,
                beta2,
                epsilon,
            } => {
                let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
                let iterations = k::load_int(&st[off(step)..], DType::I32, 0);
                let local = (iterations + 1) as f32;
                let lr_t = lr * libm::sqrtf(1.0 - libm::powf(beta2, local))
                    / (1.0 - libm::powf(beta1, local));
                let (wo, mo, vo) = (off(var), off(m), off(v));
                for i in 0..n {
                    let gi = load_grad(st, grad, i);
                    let mi = k::load(&st[mo..], t, i);
                    let mi = mi + (gi - mi) * (1.0 - beta1);
                    k::store(&mut st[mo..], t, i, mi);
                    let vi = k::load(&st[vo..], t, i);
                    let vi = vi + (gi * gi - vi) * (1.0 - beta2);
                    k::store(&mut st[vo..], t, i, vi);
                    let w = k::load(&st[wo..], t, i) - lr_t * mi / (libm::sqrtf(vi) + epsilon);
                    k::store(&mut st[wo..], t, i, w);
                }
            }
            Op::Increment { counter } => {
                let o = off(counter);
                let c = k::load_int(&st[o..], DType::I32, 0).wrapping_add(1) as i32;
                st[o..o + 4].copy_from_slice(&c.to_le_bytes());
            }
            Op::Accumulate {
                acc,
                grad,
                counter,
                method,
                count,
            } => {
                let (t, n) = (node_of(acc).dtype, node_of(acc).shape.elements());
                let ao = off(acc);
                let seen = k::load_int(&st[off(counter)..], DType::I32, 0) as f32;
                if !grad_in_state(grad) && node_of(grad).dtype == t {
                    // The common case, vectorisable; the same arithmetic as the loop below.
                    let g = &arena[off(grad)..off(grad) + node_of(grad).bytes()];
                    let a = &mut st[ao..ao + n * t.size()];
                    match method {
                        crate::AccumulationMethod::Sum => {
                            k::zip_in_place(a, g, t, n, |a, g| a + g);
                        }
                        crate::AccumulationMethod::Mean => {
                            let c = count as f32;
                            k::zip_in_place(a, g, t, n, |a, g| a + g / c);
                        }
                        crate::AccumulationMethod::RunningMean => {
                            let (keep, next) = (seen / (seen + 1.0), seen + 1.0);
                            k::zip_in_place(a, g, t, n, |a, g| a * keep + g / next);
                        }
                    }
                    return Ok(());
                }
                for i in 0..n {
                    let g = load_grad(st, grad, i);
                    let a = k::load(&st[ao..], t, i);
                    let v = match method {
                        crate::AccumulationMethod::Sum => a + g,
                        crate::AccumulationMethod::Mean => a + g / count as f32,
                        crate::AccumulationMethod::RunningMean => {
                            a * (seen / (seen + 1.0)) + g / (seen + 1.0)
                        }
                    };
                    k::store(&mut st[ao..], t, i, v);
                }
            }
            Op::Fill { x, value } => {
                let (t, n) = (node_of(x).dtype, node_of(x).shape.elements());
                let o = off(x);
                if t == DType::F32 {
                    for c in st[o..o + 4 * n].chunks_exact_mut(4) {
                        c.copy_from_slice(&value.to_le_bytes());
                    }
                } else {
                    for i in 0..n {
                        k::store(&mut st[o..], t, i, value);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// FNV-1a of a name, to seed each variable's stream.
fn name_hash(name: &Name) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Keras' fan-in and fan-out of a weight shape.
fn fans(shape: Shape) -> (usize, usize) {
    let d = shape.dims();
    match d.len() {
        0 => (1, 1),
        1 => (d[0] as usize, d[0] as usize),
        r => {
            let receptive: usize = d[..r - 2].iter().map(|&x| x as usize).product();
            (d[r - 2] as usize * receptive, d[r - 1] as usize * receptive)
        }
    }
}
