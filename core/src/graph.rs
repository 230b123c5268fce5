//! Static graphs: nodes with fixed shapes, built and checked ahead of time.
//!
//! Every node produces at most one tensor, so a [`NodeId`] names both. Nodes are stored in the
//! order they are added, which is always a topological order (an operand must exist before its
//! user), and that order is the execution order of a [`crate::Plan`].

use crate::error::{name_lossy, GraphError, Name};
use crate::kernels::Reduction;
use crate::{DType, Roles, Shape};

/// A node of a [`Graph`] (and the tensor it produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NodeId(pub(crate) u16);

impl NodeId {
    /// The node's position in its graph (its execution step).
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a variable's initial values are made (see [`crate::Plan::init_state`]).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Init {
    /// All zeros.
    Zeros,
    /// Every element the same value.
    Fill(f32),
    /// Glorot (Xavier) uniform: U(-l, l), l = sqrt(6 / (fan_in + fan_out)), as Keras' default.
    GlorotUniform,
    /// Uniform on [low, high).
    Uniform {
        /// Lower bound.
        low: f32,
        /// Upper bound.
        high: f32,
    },
}

/// What a node computes. Operands are [`NodeId`]s of earlier nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Op {
    /// Data fed by the host before each run.
    Input,
    /// A weight, kept in the state buffer.
    Variable {
        /// How it starts.
        init: Init,
    },
    /// A constant, every element `value`, kept in the state buffer.
    Constant {
        /// The value.
        value: f32,
    },
    /// Matrix product of two rank-2 operands, either optionally transposed.
    MatMul {
        /// Left operand.
        a: NodeId,
        /// Right operand.
        b: NodeId,
        /// Use a's transpose.
        transpose_a: bool,
        /// Use b's transpose.
        transpose_b: bool,
    },
    /// `x + bias`, bias broadcast along every axis but the last.
    BiasAdd {
        /// Operand.
        x: NodeId,
        /// Rank-1 bias, the size of x's last axis.
        bias: NodeId,
    },
    /// Element-wise `a + b` (same shapes).
    Add {
        /// Left operand.
        a: NodeId,
        /// Right operand.
        b: NodeId,
    },
    /// Element-wise `a - b` (same shapes).
    Sub {
        /// Left operand.
        a: NodeId,
        /// Right operand.
        b: NodeId,
    },
    /// Element-wise `a * b` (same shapes).
    Mul {
        /// Left operand.
        a: NodeId,
        /// Right operand.
        b: NodeId,
    },
    /// `x * factor`.
    Scale {
        /// Operand.
        x: NodeId,
        /// The factor.
        factor: f32,
    },
    /// `max(x, 0)`.
    Relu {
        /// Operand.
        x: NodeId,
    },
    /// `1 / (1 + exp(-x))`.
    Sigmoid {
        /// Operand.
        x: NodeId,
    },
    /// `tanh(x)`.
    Tanh {
        /// Operand.
        x: NodeId,
    },
    /// Softmax over the last axis.
    Softmax {
        /// Operand.
        x: NodeId,
    },
    /// Mean over the batch of `-log p[label]`: a scalar loss. With `from_logits` the operand is
    /// logits (log-softmax is applied inside); otherwise it is probabilities, clipped to
    /// [1e-7, 1 - 1e-7] as Keras does.
    SparseCrossEntropy {
        /// Probabilities or logits, shape (batch, classes).
        x: NodeId,
        /// Integer labels, shape (batch,).
        labels: NodeId,
        /// Whether `x` holds logits.
        from_logits: bool,
    },
    /// Same data, another shape (same element count).
    Reshape {
        /// Operand.
        x: NodeId,
    },
    /// Element type conversion (float to int truncates toward zero and saturates).
    Cast {
        /// Operand.
        x: NodeId,
    },
    /// Sum over one axis, or over everything (`axis: None`); the axis is removed.
    ReduceSum {
        /// Operand.
        x: NodeId,
        /// The axis, or all.
        axis: Option<u8>,
    },
    /// Mean over one axis, or over everything.
    ReduceMean {
        /// Operand.
        x: NodeId,
        /// The axis, or all.
        axis: Option<u8>,
    },
    /// Maximum over one axis, or over everything.
    ReduceMax {
        /// Operand.
        x: NodeId,
        /// The axis, or all.
        axis: Option<u8>,
    },
    /// Copies along a new axis (the inverse shape of a reduction); the output shape is the node's.
    Broadcast {
        /// Operand.
        x: NodeId,
        /// The inserted axis, or all (from a scalar).
        axis: Option<u8>,
    },
    /// `a` and `b` side by side along the last axis (all other axes equal).
    Concat {
        /// Left part.
        a: NodeId,
        /// Right part.
        b: NodeId,
    },
    /// Columns `offset .. offset + len` of the last axis of `x` (the node's shape says `len`).
    Slice {
        /// Operand.
        x: NodeId,
        /// First column.
        offset: u32,
    },
    /// Identity that marks a tensor for the host to read (an outfeed tap).
    Tap {
        /// Operand.
        x: NodeId,
    },
    /// Backward of ReLU: `dy` where `y > 0`, else 0.
    ReluGrad {
        /// Upstream gradient.
        dy: NodeId,
        /// The ReLU's output.
        y: NodeId,
    },
    /// Backward of sigmoid: `dy * y * (1 - y)`.
    SigmoidGrad {
        /// Upstream gradient.
        dy: NodeId,
        /// The sigmoid's output.
        y: NodeId,
    },
    /// Backward of tanh: `dy * (1 - y^2)`.
    TanhGrad {
        /// Upstream gradient.
        dy: NodeId,
        /// The tanh's output.
        y: NodeId,
    },
    /// Backward of softmax: `y * (dy - sum(dy * y))` over the last axis.
    SoftmaxGrad {
        /// Upstream gradient.
        dy: NodeId,
        /// The softmax's output.
        y: NodeId,
    },
    /// Backward of [`Op::SparseCrossEntropy`] with respect to `x`, scaled by the scalar `dloss`.
    /// With `from_logits` this is the fused softmax form `(softmax(x) - onehot) / batch`.
    SparseCrossEntropyGrad {
        /// The forward operand (probabilities or logits).
        x: NodeId,
        /// The labels.
        labels: NodeId,
        /// Upstream scalar gradient.
        dloss: NodeId,
        /// Whether `x` holds logits.
        from_logits: bool,
    },
    /// `var -= lr * grad`, in place.
    ApplySgd {
        /// The variable.
        var: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// Learning rate.
        lr: f32,
    },
    /// Keras momentum: `v = momentum * v - lr * grad; var += v`, in place.
    ApplyMomentum {
        /// The variable.
        var: NodeId,
        /// Its velocity (optimizer state).
        velocity: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// Learning rate.
        lr: f32,
        /// Momentum.
        momentum: f32,
    },
    /// Adam (Keras form), in place, using the shared step counter (which is about to become
    /// `step + 1`).
    ApplyAdam {
        /// The variable.
        var: NodeId,
        /// First moment (optimizer state).
        m: NodeId,
        /// Second moment (optimizer state).
        v: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// The step counter (optimizer state, i32 scalar).
        step: NodeId,
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator fuzz.
        epsilon: f32,
    },
    /// `counter += 1`, in place (the optimizer's step count).
    Increment {
        /// The counter (i32 scalar).
        counter: NodeId,
    },
    /// Adds a micro-batch's gradient into its accumulator, in place: SUM `acc += g`, MEAN
    /// `acc += g / count`, RUNNING_MEAN `acc = acc * n / (n + 1) + g / (n + 1)` with `n` the
    /// micro-batches accumulated so far (the counter's value).
    Accumulate {
        /// The accumulator (state).
        acc: NodeId,
        /// The micro-batch's gradient.
        grad: NodeId,
        /// Micro-batches accumulated so far (i32 scalar state).
        counter: NodeId,
        /// How gradients combine.
        method: crate::AccumulationMethod,
        /// Micro-batches per weight update.
        count: u32,
    },
    /// Sets every element of a state tensor to `value`, in place (resetting accumulators).
    Fill {
        /// The tensor.
        x: NodeId,
        /// The value.
        value: f32,
    },
}

/// The operands of a node, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operands {
    ids: [NodeId; 5],
    len: u8,
}

impl Operands {
    fn of(list: &[NodeId]) -> Self {
        let mut ids = [NodeId(0); 5];
        ids[..list.len()].copy_from_slice(list);
        Operands {
            ids,
            len: list.len() as u8,
        }
    }

    /// The operands as a slice.
    pub fn as_slice(&self) -> &[NodeId] {
        &self.ids[..self.len as usize]
    }
}

impl Op {
    /// The op's name, as reports and errors print it.
    pub const fn name(&self) -> &'static str {
        match self {
            Op::Input => "Input",
            Op::Variable { .. } => "Variable",
            Op::Constant { .. } => "Constant",
            Op::MatMul { .. } => "MatMul",
            Op::BiasAdd { .. } => "BiasAdd",
            Op::Add { .. } => "Add",
            Op::Sub { .. } => "Sub",
            Op::Mul { .. } => "Mul",
            Op::Scale { .. } => "Scale",
            Op::Relu { .. } => "Relu",
            Op::Sigmoid { .. } => "Sigmoid",
            Op::Tanh { .. } => "Tanh",
            Op::Softmax { .. } => "Softmax",
            Op::SparseCrossEntropy { .. } => "SparseCategoricalCrossentropy",
            Op::Reshape { .. } => "Reshape",
            Op::Cast { .. } => "Cast",
            Op::ReduceSum { .. } => "ReduceSum",
            Op::ReduceMean { .. } => "ReduceMean",
            Op::ReduceMax { .. } => "ReduceMax",
            Op::Broadcast { .. } => "Broadcast",
            Op::Tap { .. } => "Tap",
            Op::Concat { .. } => "Concat",
            Op::Slice { .. } => "Slice",
            Op::ReluGrad { .. } => "ReluGrad",
            Op::SigmoidGrad { .. } => "SigmoidGrad",
            Op::TanhGrad { .. } => "TanhGrad",
            Op::SoftmaxGrad { .. } => "SoftmaxGrad",
            Op::SparseCrossEntropyGrad { .. } => "SparseCategoricalCrossentropyGrad",
            Op::ApplySgd { .. } => "ApplySgd",
            Op::ApplyMomentum { .. } => "ApplyMomentum",
            Op::ApplyAdam { .. } => "ApplyAdam",
            Op::Increment { .. } => "Increment",
            Op::Accumulate { .. } => "Accumulate",
            Op::Fill { .. } => "Fill",
        }
    }

    /// The operands this op reads (and, for updates, writes).
    pub fn operands(&self) -> Operands {
        match *self {
            Op::Input | Op::Variable { .. } | Op::Constant { .. } => Operands::of(&[]),
            Op::MatMul { a, b, .. } | Op::Add { a, b } | Op::Sub { a, b } | Op::Mul { a, b } => {
                Operands::of(&[a, b])
            }
            Op::BiasAdd { x, bias } => Operands::of(&[x, bias]),
            Op::Scale { x, .. }
            | Op::Relu { x }
            | Op::Sigmoid { x }
            | Op::Tanh { x }
            | Op::Softmax { x }
            | Op::Reshape { x }
            | Op::Cast { x }
            | Op::ReduceSum { x, .. }
            | Op::ReduceMean { x, .. }
            | Op::ReduceMax { x, .. }
            | Op::Broadcast { x, .. }
            | Op::Tap { x }
            | Op::Slice { x, .. } => Operands::of(&[x]),
            Op::Concat { a, b } => Operands::of(&[a, b]),
            Op::SparseCrossEntropy { x, labels, .. } => Operands::of(&[x, labels]),
            Op::ReluGrad { dy, y }
            | Op::SigmoidGrad { dy, y }
            | Op::TanhGrad { dy, y }
            | Op::SoftmaxGrad { dy, y } => Operands::of(&[dy, y]),
            Op::SparseCrossEntropyGrad {
                x, labels, dloss, ..
            } => Operands::of(&[x, labels, dloss]),
            Op::ApplySgd { var, grad, .. } => Operands::of(&[var, grad]),
            Op::ApplyMomentum {
                var,
                velocity,
                grad,
                ..
            } => Operands::of(&[var, velocity, grad]),
            Op::ApplyAdam {
                var,
                m,
                v,
                grad,
                step,
                ..
            } => Operands::of(&[var, m, v, grad, step]),
            Op::Increment { counter } => Operands::of(&[counter]),
            Op::Accumulate {
                acc, grad, counter, ..
            } => Operands::of(&[acc, grad, counter]),
            Op::Fill { x, .. } => Operands::of(&[x]),
        }
    }

    /// Whether the op writes its operands in place and produces no tensor of its own.
    pub const fn is_update(&self) -> bool {
        matches!(
            self,
            Op::ApplySgd { .. }
                | Op::ApplyMomentum { .. }
                | Op::ApplyAdam { .. }
                | Op::Increment { .. }
                | Op::Accumulate { .. }
                | Op::Fill { .. }
        )
    }

    /// Whether the node is a leaf whose data lives in the state buffer.
    pub const fn is_state(&self) -> bool {
        matches!(self, Op::Variable { .. } | Op::Constant { .. })
    }
}

/// One node of a graph: its op, the shape and type of the tensor it makes, its roles.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Node {
    pub(crate) name: Name,
    pub(crate) op: Op,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    pub(crate) roles: Roles,
    pub(crate) stage: u8,
}

impl Node {
    /// The user-given (or autodiff-derived) name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What the node computes.
    pub fn op(&self) -> &Op {
        &self.op
    }
    /// Shape of the tensor it produces (a scalar for update ops, which produce none).
    pub fn shape(&self) -> Shape {
        self.shape
    }
    /// Element type of the tensor it produces.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The tensor's roles.
    pub fn roles(&self) -> Roles {
        self.roles
    }
    /// The pipeline stage the node belongs to (0 without pipelining). Backward nodes belong
    /// to the stage of the forward node they differentiate; updates to their variable's.
    pub fn stage(&self) -> usize {
        usize::from(self.stage)
    }
    /// Bytes of the tensor it produces (0 for update ops).
    pub fn bytes(&self) -> usize {
        if self.op.is_update() {
            0
        } else {
            self.shape.elements() * self.dtype.size()
        }
    }
}

/// Something that names a node: a [`NodeId`] or its name.
pub trait NodeRef {
    /// Finds the node in `graph`.
    fn resolve<const N: usize>(&self, graph: &Graph<N>) -> Result<NodeId, GraphError>;
}

impl NodeRef for NodeId {
    fn resolve<const N: usize>(&self, graph: &Graph<N>) -> Result<NodeId, GraphError> {
        if self.index() < graph.len() {
            Ok(*self)
        } else {
            Err(GraphError::UnknownNode {
                index: self.index(),
            })
        }
    }
}

impl NodeRef for &str {
    fn resolve<const N: usize>(&self, graph: &Graph<N>) -> Result<NodeId, GraphError> {
        graph.find(self)
    }
}

/// The activation of a [`Graph::dense`] layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Activation {
    /// None (linear).
    Linear,
    /// ReLU.
    Relu,
    /// Sigmoid.
    Sigmoid,
    /// Tanh.
    Tanh,
    /// Softmax over the last axis.
    Softmax,
}

/// A static graph of at most `N` nodes. Shapes are checked as nodes are added; a graph that
/// exists is well-formed.
///
/// ```
/// use tessera_core::{Graph, DType, Activation};
/// let mut g: Graph<32> = Graph::new();
/// let x = g.input("x", &[4, 3], DType::F32)?;
/// let y = g.dense("Dense_2", x, 2, Activation::Softmax, DType::F32)?;
/// assert_eq!(g.node(y).shape().dims(), &[4, 2]);
/// // A wrong shape is an error naming the node, never a panic:
/// let w = g.variable("w", &[5, 2], DType::F32, tessera_core::Init::Zeros)?;
/// assert!(g.matmul("bad", x, w).is_err());
/// # Ok::<(), tessera_core::GraphError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Graph<const N: usize> {
    pub(crate) nodes: heapless::Vec<Node, N>,
    /// Number of forward nodes once differentiated (those an inference run executes).
    pub(crate) forward_len: Option<u16>,
    /// With gradient accumulation: the micro-batch counter and micro-batches per update.
    pub(crate) accumulation: Option<(NodeId, u32)>,
    /// The pipeline stage of nodes added from now on.
    pub(crate) current_stage: u8,
}

impl<const N: usize> Default for Graph<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Graph<N> {
    /// An empty graph.
    pub const fn new() -> Self {
        Graph {
            nodes: heapless::Vec::new(),
            forward_len: None,
            accumulation: None,
            current_stage: 0,
        }
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Whether [`Graph::differentiate`] has added a backward pass.
    pub fn is_training(&self) -> bool {
        self.forward_len.is_some()
    }

    /// Starts a pipeline stage scope: nodes added from now on belong to `stage` (as Keras'
    /// `PipelineStage(stage)` scope does).
    pub fn set_stage(&mut self, stage: usize) -> Result<(), GraphError> {
        self.current_stage = u8::try_from(stage).map_err(|_| GraphError::BadStage { stage })?;
        Ok(())
    }

    /// Puts node `x` in pipeline stage `stage`.
    pub fn assign_stage(&mut self, x: impl NodeRef, stage: usize) -> Result<(), GraphError> {
        let id = x.resolve(self)?;
        self.nodes[id.index()].stage =
            u8::try_from(stage).map_err(|_| GraphError::BadStage { stage })?;
        Ok(())
    }

    /// Number of pipeline stages (1 + the highest stage of any node).
    pub fn stage_count(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| usize::from(n.stage) + 1)
            .max()
            .unwrap_or(1)
    }

    /// Whether the graph accumulates gradients and updates weights in a separate phase
    /// ([`Graph::differentiate_accumulating`]).
    pub fn is_accumulating(&self) -> bool {
        self.accumulation.is_some()
    }

    /// Micro-batches per weight update (1 without gradient accumulation).
    pub fn accumulation_count(&self) -> u32 {
        self.accumulation.map_or(1, |(_, m)| m)
    }

    /// The nodes an inference run executes: all of them, or the forward pass of a training
    /// graph.
    pub fn forward_len(&self) -> usize {
        self.forward_len.map_or(self.nodes.len(), usize::from)
    }

    /// The node `id`. Panics if `id` is not from this graph (ids come only from this graph's
    /// builders; use [`Graph::get`] for a checked look-up).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The node `id`, if it belongs to this graph.
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id.index())
    }

    /// All nodes in execution order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Ids of all nodes in execution order.
    pub fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.nodes.len()).map(|i| NodeId(i as u16))
    }

    /// The node named `name`.
    pub fn find(&self, name: &str) -> Result<NodeId, GraphError> {
        self.nodes
            .iter()
            .position(|n| n.name.as_str() == name)
            .map(|i| NodeId(i as u16))
            .ok_or_else(|| GraphError::UnknownName {
                name: name_lossy(name),
            })
    }

    /// Adds `roles` to a node (for example [`Roles::OUTPUT`], to keep it for the host).
    pub fn add_roles(&mut self, x: impl NodeRef, roles: Roles) -> Result<(), GraphError> {
        let id = x.resolve(self)?;
        self.nodes[id.index()].roles |= roles;
        Ok(())
    }

    /// Marks a node's tensor as an output: the plan keeps it until the end of the run.
    pub fn mark_output(&mut self, x: impl NodeRef) -> Result<(), GraphError> {
        self.add_roles(x, Roles::OUTPUT)
    }

    pub(crate) fn check_name(&self, name: &str) -> Result<Name, GraphError> {
        if name.is_empty() || name.len() > crate::error::USER_NAME_MAX {
            return Err(GraphError::BadName {
                name: name_lossy(name),
            });
        }
        if self.nodes.iter().any(|n| n.name.as_str() == name) {
            return Err(GraphError::DuplicateName {
                name: name_lossy(name),
            });
        }
        Ok(name_lossy(name))
    }

    pub(crate) fn push(
        &mut self,
        name: Name,
        op: Op,
        shape: Shape,
        dtype: DType,
        roles: Roles,
    ) -> Result<NodeId, GraphError> {
        let index = self.nodes.len();
        if index >= N || index >= u16::MAX as usize {
            return Err(GraphError::CapacityExceeded {
                node: name,
                capacity: N,
            });
        }
        self.nodes
            .push(Node {
                name: name.clone(),
                op,
                shape,
                dtype,
                roles,
                stage: self.current_stage,
            })
            .map_err(|_| GraphError::CapacityExceeded {
                node: name,
                capacity: N,
            })?;
        Ok(NodeId(index as u16))
    }

    fn shape_of(name: &str, dims: &[usize]) -> Result<Shape, GraphError> {
        Shape::new(dims).map_err(|reason| GraphError::BadShape {
            node: name_lossy(name),
            reason,
        })
    }

    fn float_operand(&self, name: &Name, op: &'static str, x: NodeId) -> Result<(), GraphError> {
        let dtype = self.node(x).dtype;
        if dtype.is_float() {
            Ok(())
        } else {
            Err(GraphError::DTypeMismatch {
                node: name.clone(),
                op,
                expected: "a float type",
                found: dtype,
            })
        }
    }

    fn same_dtype(
        &self,
        name: &Name,
        op: &'static str,
        a: NodeId,
        b: NodeId,
    ) -> Result<DType, GraphError> {
        let (da, db) = (self.node(a).dtype, self.node(b).dtype);
        if da == db {
            Ok(da)
        } else {
            Err(GraphError::DTypeMismatch {
                node: name.clone(),
                op,
                expected: da.name(),
                found: db,
            })
        }
    }

    /// An input the host feeds before each run.
    pub fn input(
        &mut self,
        name: &str,
        dims: &[usize],
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let n = self.check_name(name)?;
        let shape = Self::shape_of(name, dims)?;
        self.push(n, Op::Input, shape, dtype, Roles::INPUT)
    }

    /// A trainable weight (float type).
    pub fn variable(
        &mut self,
        name: &str,
        dims: &[usize],
        dtype: DType,
        init: Init,
    ) -> Result<NodeId, GraphError> {
        let n = self.check_name(name)?;
        let shape = Self::shape_of(name, dims)?;
        if !dtype.is_float() {
            return Err(GraphError::DTypeMismatch {
                node: n,
                op: "Variable",
                expected: "a float type",
                found: dtype,
            });
        }
        self.push(n, Op::Variable { init }, shape, dtype, Roles::TRAINABLE)
    }

    /// A constant tensor, every element `value`.
    pub fn constant(
        &mut self,
        name: &str,
        dims: &[usize],
        dtype: DType,
        value: f32,
    ) -> Result<NodeId, GraphError> {
        let n = self.check_name(name)?;
        let shape = Self::shape_of(name, dims)?;
        self.push(n, Op::Constant { value }, shape, dtype, Roles::CONSTANT)
    }

    /// Matrix product `a . b` of rank-2 operands.
    pub fn matmul(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        self.matmul_t(name, a, b, false, false)
    }

    /// Matrix product with optional transposes: `op(a) . op(b)`.
    pub fn matmul_t(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<NodeId, GraphError> {
        let (a, b) = (a.resolve(self)?, b.resolve(self)?);
        let n = self.check_name(name)?;
        self.float_operand(&n, "MatMul", a)?;
        let dtype = self.same_dtype(&n, "MatMul", a, b)?;
        let (sa, sb) = (self.node(a).shape, self.node(b).shape);
        if sa.rank() != 2 || sb.rank() != 2 {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "MatMul",
                rule: "operands must be rank 2",
                left: sa,
                right: sb,
            });
        }
        let (m, ka) = if transpose_a {
            (sa.dim(1), sa.dim(0))
        } else {
            (sa.dim(0), sa.dim(1))
        };
        let (kb, cols) = if transpose_b {
            (sb.dim(1), sb.dim(0))
        } else {
            (sb.dim(0), sb.dim(1))
        };
        if ka != kb {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "MatMul",
                rule: "inner dimensions must agree",
                left: sa,
                right: sb,
            });
        }
        let shape = Self::shape_of(name, &[m, cols])?;
        self.push(
            n,
            Op::MatMul {
                a,
                b,
                transpose_a,
                transpose_b,
            },
            shape,
            dtype,
            Roles::ACTIVATION,
        )
    }

    /// `x + bias`, the rank-1 bias broadcast over every axis but the last.
    pub fn bias_add(
        &mut self,
        name: &str,
        x: impl NodeRef,
        bias: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (x, bias) = (x.resolve(self)?, bias.resolve(self)?);
        let n = self.check_name(name)?;
        self.float_operand(&n, "BiasAdd", x)?;
        let dtype = self.same_dtype(&n, "BiasAdd", x, bias)?;
        let (sx, sb) = (self.node(x).shape, self.node(bias).shape);
        if sb.rank() != 1 || sx.rank() == 0 || sx.last() != sb.dim(0) {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "BiasAdd",
                rule: "bias must be rank 1, the size of x's last axis",
                left: sx,
                right: sb,
            });
        }
        self.push(n, Op::BiasAdd { x, bias }, sx, dtype, Roles::ACTIVATION)
    }

    fn binary(&mut self, name: &str, a: NodeId, b: NodeId, op: Op) -> Result<NodeId, GraphError> {
        let n = self.check_name(name)?;
        let dtype = self.same_dtype(&n, op.name(), a, b)?;
        self.float_operand(&n, op.name(), a)?;
        let (sa, sb) = (self.node(a).shape, self.node(b).shape);
        if sa != sb {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: op.name(),
                rule: "operands must have the same shape",
                left: sa,
                right: sb,
            });
        }
        self.push(n, op, sa, dtype, Roles::ACTIVATION)
    }

    /// Element-wise `a + b`.
    pub fn add(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (a, b) = (a.resolve(self)?, b.resolve(self)?);
        self.binary(name, a, b, Op::Add { a, b })
    }

    /// Element-wise `a - b`.
    pub fn sub(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (a, b) = (a.resolve(self)?, b.resolve(self)?);
        self.binary(name, a, b, Op::Sub { a, b })
    }

    /// Element-wise `a * b`.
    pub fn mul(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (a, b) = (a.resolve(self)?, b.resolve(self)?);
        self.binary(name, a, b, Op::Mul { a, b })
    }

    fn unary(&mut self, name: &str, x: NodeId, op: Op, roles: Roles) -> Result<NodeId, GraphError> {
        let n = self.check_name(name)?;
        self.float_operand(&n, op.name(), x)?;
        let node = self.node(x);
        let (shape, dtype) = (node.shape, node.dtype);
        if matches!(op, Op::Softmax { .. }) && shape.rank() == 0 {
            return Err(GraphError::BadAxis {
                node: n,
                axis: 0,
                rank: 0,
            });
        }
        self.push(n, op, shape, dtype, roles)
    }

    /// `x * factor`.
    pub fn scale(
        &mut self,
        name: &str,
        x: impl NodeRef,
        factor: f32,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.unary(name, x, Op::Scale { x, factor }, Roles::ACTIVATION)
    }

    /// ReLU.
    pub fn relu(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.unary(name, x, Op::Relu { x }, Roles::ACTIVATION)
    }

    /// Sigmoid.
    pub fn sigmoid(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.unary(name, x, Op::Sigmoid { x }, Roles::ACTIVATION)
    }

    /// Tanh.
    pub fn tanh(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.unary(name, x, Op::Tanh { x }, Roles::ACTIVATION)
    }

    /// Softmax over the last axis.
    pub fn softmax(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.unary(name, x, Op::Softmax { x }, Roles::ACTIVATION)
    }

    /// `a` and `b` side by side along the last axis, as concurrent pipeline stages' outputs
    /// reach the next stage.
    pub fn concat(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (a, b) = (a.resolve(self)?, b.resolve(self)?);
        let n = self.check_name(name)?;
        let dtype = self.same_dtype(&n, "Concat", a, b)?;
        let (sa, sb) = (self.node(a).shape, self.node(b).shape);
        let r = sa.rank();
        if r == 0 || sb.rank() != r || sa.dims()[..r - 1] != sb.dims()[..r - 1] {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "Concat",
                rule: "operands must agree on every axis but the last",
                left: sa,
                right: sb,
            });
        }
        let mut dims = [0usize; crate::MAX_RANK];
        for (d, &x) in dims.iter_mut().zip(sa.dims()) {
            *d = x as usize;
        }
        dims[r - 1] = sa.last() + sb.last();
        let shape = Self::shape_of(name, &dims[..r])?;
        self.push(n, Op::Concat { a, b }, shape, dtype, Roles::ACTIVATION)
    }

    /// Identity that marks `x` for the host to read (an outfeed tap). The tap is an output.
    pub fn tap(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let node = self.node(x);
        let (shape, dtype) = (node.shape, node.dtype);
        self.push(
            n,
            Op::Tap { x },
            shape,
            dtype,
            Roles::ACTIVATION | Roles::TAPPED | Roles::OUTPUT,
        )
    }

    /// Sparse categorical cross-entropy: the batch mean of `-log p[label]`, a scalar loss.
    /// `x` is (batch, classes) probabilities (or logits with `from_logits`); `labels` is
    /// (batch,) of `i32` or `u8`. The loss is an output.
    pub fn sparse_categorical_crossentropy(
        &mut self,
        name: &str,
        x: impl NodeRef,
        labels: impl NodeRef,
        from_logits: bool,
    ) -> Result<NodeId, GraphError> {
        let (x, labels) = (x.resolve(self)?, labels.resolve(self)?);
        let n = self.check_name(name)?;
        let op = "SparseCategoricalCrossentropy";
        self.float_operand(&n, op, x)?;
        let (sx, sl) = (self.node(x).shape, self.node(labels).shape);
        let ldt = self.node(labels).dtype;
        if !matches!(ldt, DType::I32 | DType::U8) {
            return Err(GraphError::DTypeMismatch {
                node: n,
                op,
                expected: "i32 or u8 labels",
                found: ldt,
            });
        }
        if sx.rank() != 2 || sl.rank() != 1 || sl.dim(0) != sx.dim(0) {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op,
                rule: "x must be (batch, classes) and labels (batch,)",
                left: sx,
                right: sl,
            });
        }
        let dtype = self.node(x).dtype;
        self.push(
            n,
            Op::SparseCrossEntropy {
                x,
                labels,
                from_logits,
            },
            Shape::scalar(),
            dtype,
            Roles::LOSS | Roles::OUTPUT,
        )
    }

    /// The same data in another shape (same element count).
    pub fn reshape(
        &mut self,
        name: &str,
        x: impl NodeRef,
        dims: &[usize],
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let to = Self::shape_of(name, dims)?;
        let node = self.node(x);
        let (from, dtype) = (node.shape, node.dtype);
        if from.elements() != to.elements() {
            return Err(GraphError::ReshapeSize { node: n, from, to });
        }
        self.push(n, Op::Reshape { x }, to, dtype, Roles::ACTIVATION)
    }

    /// Keeps the first axis and flattens the rest, as Keras' `Flatten`.
    pub fn flatten(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let s = self.node(x).shape;
        if s.rank() == 0 {
            let n = name_lossy(name);
            return Err(GraphError::BadAxis {
                node: n,
                axis: 0,
                rank: 0,
            });
        }
        self.reshape(name, x, &[s.dim(0), s.elements() / s.dim(0)])
    }

    /// Element type conversion.
    pub fn cast(
        &mut self,
        name: &str,
        x: impl NodeRef,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let shape = self.node(x).shape;
        self.push(n, Op::Cast { x }, shape, dtype, Roles::ACTIVATION)
    }

    fn reduce(
        &mut self,
        name: &str,
        x: NodeId,
        axis: Option<usize>,
        kind: crate::kernels::Reduction,
    ) -> Result<NodeId, GraphError> {
        let n = self.check_name(name)?;
        let node = self.node(x);
        let (s, dtype) = (node.shape, node.dtype);
        let out = match axis {
            None => Shape::scalar(),
            Some(a) if a < s.rank() => s.without_axis(a),
            Some(a) => {
                return Err(GraphError::BadAxis {
                    node: n,
                    axis: a,
                    rank: s.rank(),
                })
            }
        };
        let axis = axis.map(|a| a as u8);
        let op = match kind {
            Reduction::Sum => Op::ReduceSum { x, axis },
            Reduction::Mean => Op::ReduceMean { x, axis },
            Reduction::Max => Op::ReduceMax { x, axis },
        };
        self.float_operand(&n, op.name(), x)?;
        self.push(n, op, out, dtype, Roles::ACTIVATION)
    }

    /// Sum over `axis` (removed), or over everything with `None`.
    pub fn reduce_sum(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.reduce(name, x, axis, Reduction::Sum)
    }

    /// Mean over `axis` (removed), or over everything with `None`.
    pub fn reduce_mean(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.reduce(name, x, axis, Reduction::Mean)
    }

    /// Maximum over `axis` (removed), or over everything with `None`.
    pub fn reduce_max(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        self.reduce(name, x, axis, Reduction::Max)
    }

    /// A Keras-style dense layer named `name`: variables `name/kernel:0` (Glorot uniform) and
    /// `name/bias:0` (zeros), then `name/MatMul`, `name/BiasAdd` and the activation
    /// (`name/Relu`, ...). Returns the layer's output. `x` must be rank 2.
    pub fn dense(
        &mut self,
        name: &str,
        x: impl NodeRef,
        units: usize,
        activation: Activation,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let s = self.node(x).shape;
        if s.rank() != 2 {
            let kernel_shape = Self::shape_of(name, &[s.last(), units.max(1)])?;
            return Err(GraphError::ShapeMismatch {
                node: name_lossy(name),
                op: "Dense",
                rule: "input must be rank 2 (batch, features)",
                left: s,
                right: kernel_shape,
            });
        }
        let mut buf = Name::new();
        let mut sub = |suffix: &str| -> Result<Name, GraphError> {
            buf.clear();
            buf.push_str(name)
                .and_then(|_| buf.push_str(suffix))
                .map_err(|_| GraphError::BadName {
                    name: name_lossy(name),
                })?;
            Ok(buf.clone())
        };
        let kernel = self.variable(
            &sub("/kernel:0")?,
            &[s.dim(1), units],
            dtype,
            Init::GlorotUniform,
        )?;
        let bias = self.variable(&sub("/bias:0")?, &[units], dtype, Init::Zeros)?;
        let mm = self.matmul(&sub("/MatMul")?, x, kernel)?;
        let out = self.bias_add(&sub("/BiasAdd")?, mm, bias)?;
        match activation {
            Activation::Linear => Ok(out),
            Activation::Relu => self.relu(&sub("/Relu")?, out),
            Activation::Sigmoid => self.sigmoid(&sub("/Sigmoid")?, out),
            Activation::Tanh => self.tanh(&sub("/Tanh")?, out),
            Activation::Softmax => self.softmax(&sub("/Softmax")?, out),
        }
    }
}
