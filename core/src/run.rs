//! Running a [`Plan`]: the forward pass, a training step, one node at a time. Everything a run
//! touches is the two buffers the caller owns; kernels come from [`crate::ops`].

use crate::error::{Name, RunError};
use crate::graph::{Init, Node, NodeId, NodeRef};
use crate::kernels::{self as k, Parallel, Serial};
use crate::op::Op;
use crate::plan::{Place, Plan, Slot};
use crate::rng::SplitMix64;
use crate::storage::Storage;
use crate::{DType, Roles, Shape};

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
    /// Copies the elements, as `f32`, into `out`: the values [`TensorRef::iter`] gives, in
    /// bulk (an `f32` tensor is one pass over its bytes). Copies the first
    /// `min(out.len(), self.len())` elements and returns how many that is.
    pub fn copy_to(&self, out: &mut [f32]) -> usize {
        let n = out.len().min(self.len());
        let out = &mut out[..n];
        if self.dtype == DType::F32 {
            for (o, b) in out.iter_mut().zip(self.data.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                *o = k::load(self.data, self.dtype, i);
            }
        }
        n
    }
    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }
}

/// The state buffer as a run sees it: read-only for inference, writable for training.
pub(crate) enum StateBuf<'a> {
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

/// The arena with up to two holes (a node's output and its workspace) cut out: shared views
/// of everything else, where the node's operands are.
struct Pieces<'a> {
    parts: [(usize, &'a [u8]); 3],
}

impl<'a> Pieces<'a> {
    fn get(&self, offset: usize, len: usize) -> &'a [u8] {
        for &(start, part) in &self.parts {
            if offset >= start && offset + len <= start + part.len() {
                return &part[offset - start..offset - start + len];
            }
        }
        // The plan never places a live operand over the output or the workspace.
        unreachable!(
            "operand at {offset}..{} overlaps the node's output",
            offset + len
        )
    }
}

/// What a kernel reads: its operands' bytes, shapes and types.
pub(crate) struct Inputs<'a, S: Storage> {
    graph: &'a crate::Graph<S>,
    slots: &'a [Slot],
    arena: Pieces<'a>,
    state: &'a [u8],
}

impl<'a, S: Storage> Inputs<'a, S> {
    /// The bytes of operand `x`.
    pub(crate) fn bytes(&self, x: NodeId) -> &'a [u8] {
        let s = self.slots[x.index()];
        let n = self.graph.node(x).bytes();
        match s.place {
            Place::State => &self.state[s.offset..s.offset + n],
            _ => self.arena.get(s.offset, n),
        }
    }
    /// Operand `x`'s shape.
    pub(crate) fn shape(&self, x: NodeId) -> Shape {
        self.graph.node(x).shape
    }
    /// Operand `x`'s element type.
    pub(crate) fn dtype(&self, x: NodeId) -> DType {
        self.graph.node(x).dtype
    }
}

/// One node's execution: its operands, its output bytes and its workspace.
pub(crate) struct Exec<'a, S: Storage> {
    pub(crate) ins: Inputs<'a, S>,
    pub(crate) out: &'a mut [u8],
    /// The node's workspace ([`crate::Slot::workspace_bytes`]); convolutions lay out
    /// unfolded patches there.
    pub(crate) work: &'a mut [u8],
    /// How the kernel may run its independent pieces.
    pub(crate) par: &'a dyn Parallel,
}

/// Splits `arena` around `[a, a + la)` and `[b, b + lb)` (disjoint; either may be empty).
fn split_two(
    arena: &mut [u8],
    a: (usize, usize),
    b: (usize, usize),
) -> (Pieces<'_>, &mut [u8], &mut [u8]) {
    let swap = b.1 > 0 && (a.1 == 0 || b.0 < a.0);
    let (first, second) = if swap { (b, a) } else { (a, b) };
    let (p0, rest) = arena.split_at_mut(first.0);
    let (h1, rest) = rest.split_at_mut(first.1);
    let start1 = first.0 + first.1;
    let (p1, h2, p2, start2) = if second.1 == 0 {
        (rest, &mut [][..], &mut [][..], start1)
    } else {
        let (p1, rest) = rest.split_at_mut(second.0 - start1);
        let (h2, p2) = rest.split_at_mut(second.1);
        (p1, h2, p2, second.0 + second.1)
    };
    let pieces = Pieces {
        parts: [(0, &*p0), (start1, &*p1), (start2, &*p2)],
    };
    if swap {
        (pieces, h2, h1)
    } else {
        (pieces, h1, h2)
    }
}

impl<S: Storage> Plan<S> {
    /// Executes node `i`: its kernel, or its in-place state update.
    pub(crate) fn exec(
        &self,
        i: usize,
        arena: &mut [u8],
        state: &mut StateBuf<'_>,
        par: &dyn Parallel,
    ) -> Result<(), RunError> {
        let node = &self.graph.nodes()[i];
        if let Op::Update(u) = node.op {
            let StateBuf::Mut(st) = state else {
                // Inference never reaches updates; nothing to write through a shared view.
                return Ok(());
            };
            return crate::ops::update::run(&u, self, arena, st, par);
        }
        let slot = self.slots[i];
        if slot.place != Place::Arena || node.op == Op::Input || slot.view_of.is_some() {
            return Ok(());
        }
        let (pieces, out, work) = split_two(
            arena,
            (slot.offset, node.bytes()),
            (slot.workspace_offset, slot.workspace_bytes),
        );
        let mut ex = Exec {
            ins: Inputs {
                graph: &self.graph,
                slots: &self.slots,
                arena: pieces,
                state: state.get(),
            },
            out,
            work,
            par,
        };
        crate::ops::run(node, &mut ex)
    }

    /// Fills the state buffer: each variable from its [`Init`] with a stream seeded by `seed`
    /// and the variable's name (so graphs sharing variable names start from the same weights),
    /// optimizer state with zeros, constants with their value.
    pub fn init_state(&self, state: &mut [u8], seed: u64) -> Result<(), RunError> {
        self.check(self.arena_bytes, state.len())?;
        for (node, slot) in self.graph.nodes().iter().zip(self.slots.iter()) {
            if slot.place != Place::State || slot.view_of.is_some() {
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
        if node.dtype == DType::F32 {
            // The common case, without a type test per element.
            for (i, o) in buf.chunks_exact_mut(4).enumerate().take(len) {
                o.copy_from_slice(&f(i).to_le_bytes());
            }
            return Ok(());
        }
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
    pub fn copy_state_from<T: Storage>(
        &self,
        state: &mut [u8],
        from: &Plan<T>,
        from_state: &[u8],
    ) -> Result<usize, RunError> {
        self.check(self.arena_bytes, state.len())?;
        from.check(from.arena_bytes, from_state.len())?;
        let mut copied = 0;
        for (node, slot) in self.graph.nodes().iter().zip(self.slots.iter()) {
            if slot.place != Place::State
                || slot.view_of.is_some()
                || node.roles.contains(Roles::CONSTANT)
            {
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
            self.exec(i, arena, &mut st, &Serial)?;
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
                self.exec(i, arena, &mut st, &Serial)?;
            }
            return Ok(());
        };
        let mut st = StateBuf::Mut(state);
        for (i, n) in self.graph.nodes().iter().enumerate() {
            if !n.roles.contains(Roles::UPDATE) {
                self.exec(i, arena, &mut st, &Serial)?;
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
                self.exec(i, arena, st, &Serial)?;
            }
        }
        Ok(())
    }

    /// Executes node `i` alone, reading its operands where the plan put them. Nodes must run in
    /// order; this is the building block of [`Plan::infer`] and [`Plan::train_step`] for
    /// executors that interleave their own work between nodes.
    pub fn run_node(&self, i: usize, arena: &mut [u8], state: &mut [u8]) -> Result<(), RunError> {
        self.run_node_on(i, arena, state, &Serial)
    }

    /// [`Plan::run_node`], the kernel's independent pieces run by `par` (on a host's threads,
    /// say). Results are the same bit for bit whatever `par` is.
    pub fn run_node_on(
        &self,
        i: usize,
        arena: &mut [u8],
        state: &mut [u8],
        par: &dyn Parallel,
    ) -> Result<(), RunError> {
        self.check(arena.len(), state.len())?;
        self.exec(i, arena, &mut StateBuf::Mut(state), par)
    }
}

/// A product and the accumulation that adds it, as [`Plan::fusable_accumulation`] finds them.
struct AccumulatedProduct {
    product: crate::ops::matmul::MatMul,
    /// The product's node.
    node: NodeId,
    /// The accumulator.
    acc: NodeId,
    /// The product's shape and layout.
    shape: k::Product,
}

impl<S: Storage> Plan<S> {
    /// The product node `accumulate` adds, and its operands, if the pair has the form
    /// [`Plan::run_accumulated_product_on`] takes (whoever else reads the product).
    fn accumulated_product(&self, accumulate: usize) -> Option<AccumulatedProduct> {
        let node = self.graph.nodes().get(accumulate)?;
        let Op::Update(crate::ops::update::Update::Accumulate {
            acc,
            grad,
            method: crate::AccumulationMethod::Sum,
            ..
        }) = node.op
        else {
            return None;
        };
        let (g, a) = (self.graph.node(grad), self.graph.node(acc));
        let Op::MatMul(product) = g.op else {
            return None;
        };
        let (gs, accs) = (self.slots[grad.index()], self.slots[acc.index()]);
        let (sa, sb) = (
            self.graph.node(product.a).shape,
            self.graph.node(product.b).shape,
        );
        let plain = g.dtype == DType::F32
            && a.dtype == DType::F32
            && a.shape == g.shape
            && gs.place == Place::Arena
            && gs.view_of.is_none()
            && accs.place == Place::State
            && accs.view_of.is_none()
            && g.shape.rank() == 2
            && sa.rank() == 2
            && sb.rank() == 2;
        if !plain {
            return None;
        }
        let d = |s: Shape, i: usize| s.dims()[i] as usize;
        let (m, k) = if product.transpose_a {
            (d(sa, 1), d(sa, 0))
        } else {
            (d(sa, 0), d(sa, 1))
        };
        let n = d(g.shape, 1);
        if !k::accumulates_rows_of(DType::F32, n) {
            return None;
        }
        Some(AccumulatedProduct {
            product,
            node: grad,
            acc,
            shape: k::Product {
                m,
                k,
                n,
                ta: product.transpose_a,
                tb: product.transpose_b,
            },
        })
    }

    /// The matrix product (its node index) that accumulate node `accumulate` adds into its
    /// accumulator, when [`Plan::run_accumulated_product_on`] can run the two as one: a SUM
    /// accumulation of an `f32` product of two matrices, placed in the arena, into an `f32`
    /// accumulator, rows short enough for [`k::matmul_accumulate_on`], and nothing else in the
    /// graph reading the product (neither another op, nor as an output or a tap). `None` for
    /// any other node. One pass over the graph.
    pub fn fusable_accumulation(&self, accumulate: usize) -> Option<usize> {
        let found = self.accumulated_product(accumulate)?;
        let g = self.graph.node(found.node);
        if g.roles.intersects(Roles::OUTPUT | Roles::TAPPED) {
            return None;
        }
        let readers: usize = self
            .graph
            .nodes()
            .iter()
            .map(|n| {
                n.op.operands()
                    .as_slice()
                    .iter()
                    .filter(|&&x| x == found.node)
                    .count()
            })
            .sum();
        (readers == 1).then_some(found.node.index())
    }

    /// Runs accumulate node `accumulate` together with the product it adds, which
    /// [`Plan::fusable_accumulation`] names: the accumulator ends as the product followed by
    /// the accumulation would leave it, bit for bit (a NaN's payload aside, see
    /// [`k::matmul_accumulate_on`]), but the product's own bytes in the arena are never
    /// written. Call it where the product would run (its operands must be there), and run
    /// neither node on its own. Checking that nothing else reads the product is
    /// [`Plan::fusable_accumulation`]'s, done once: this call trusts it.
    ///
    /// # Errors
    ///
    /// [`RunError::ArenaTooSmall`] / [`RunError::StateTooSmall`] for short buffers, and
    /// [`RunError::WrongKind`] when `accumulate` is not such an accumulation.
    pub fn run_accumulated_product_on(
        &self,
        accumulate: usize,
        arena: &[u8],
        state: &mut [u8],
        par: &dyn Parallel,
    ) -> Result<(), RunError> {
        self.check(arena.len(), state.len())?;
        let Some(found) = self.accumulated_product(accumulate) else {
            let tensor = self
                .graph
                .nodes()
                .get(accumulate)
                .map(|n| n.name.clone())
                .unwrap_or_default();
            return Err(RunError::WrongKind {
                tensor,
                expected: "a SUM accumulation of an f32 matrix product into an f32 accumulator",
            });
        };
        let acc = self.slots[found.acc.index()];
        let len = self.graph.node(found.acc).bytes();
        let (rest, acc_bytes, _) = split_two(state, (acc.offset, len), (0, 0));
        let operand = |x: NodeId| {
            let (s, n) = (self.slots[x.index()], self.graph.node(x).bytes());
            match s.place {
                Place::State => rest.get(s.offset, n),
                _ => &arena[s.offset..s.offset + n],
            }
        };
        let p = found.product;
        k::matmul_accumulate_on(
            par,
            operand(p.a),
            operand(p.b),
            DType::F32,
            acc_bytes,
            found.shape,
        );
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
