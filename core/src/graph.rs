//! Static graphs: nodes with fixed shapes, built and checked ahead of time.
//!
//! Every node produces at most one tensor, so a [`NodeId`] names both. Nodes are stored in the
//! order they are added, which is always a topological order (an operand must exist before its
//! user), and that order is the execution order of a [`crate::Plan`].

use crate::error::{name_lossy, GraphError, Name};
use crate::op::Op;
use crate::storage::{Buffer, Storage};
use crate::{DType, Roles, Shape};

/// A node of a [`Graph`] (and the tensor it produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NodeId(pub(crate) u32);

impl NodeId {
    /// The node's position in its graph (its execution step).
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The id of the node at `index` (ids are positions in the graph).
    pub(crate) const fn at(index: usize) -> NodeId {
        NodeId(index as u32)
    }

    /// The id of the node at position `index`. Ids are checked against the graph wherever a
    /// graph resolves them ([`NodeRef`]); this is for tools that number nodes themselves.
    pub const fn from_index(index: u32) -> NodeId {
        NodeId(index)
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
    /// The index of the forward node whose gradient rule made this one, or `u32::MAX`.
    pub(crate) origin: u32,
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
    /// The forward node whose gradient rule made this backward node: a product's input
    /// gradient is made by the product's rule (though named after the input, `X_grad/k`), a
    /// shared weight's share by the rule of the node that reads it. `None` for forward nodes,
    /// recomputed copies and the updates.
    pub fn origin(&self) -> Option<NodeId> {
        (self.origin != u32::MAX).then(|| NodeId::at(self.origin as usize))
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
    fn resolve<S: Storage>(&self, graph: &Graph<S>) -> Result<NodeId, GraphError>;
}

impl NodeRef for NodeId {
    fn resolve<S: Storage>(&self, graph: &Graph<S>) -> Result<NodeId, GraphError> {
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
    fn resolve<S: Storage>(&self, graph: &Graph<S>) -> Result<NodeId, GraphError> {
        graph.find(self)
    }
}

/// A static graph whose nodes live in storage `S` ([`Fixed<N>`](crate::Fixed): at most `N`
/// nodes, in place). Shapes are checked as nodes are added; a graph that exists is well-formed.
///
/// ```
/// use tessera_core::{Activation, DType, Fixed, Graph};
/// let mut g: Graph<Fixed<32>> = Graph::new();
/// let x = g.input("x", &[4, 3], DType::F32)?;
/// let y = g.dense("Dense_2", x, 2, Activation::Softmax, DType::F32)?;
/// assert_eq!(g.node(y).shape().dims(), &[4, 2]);
/// // A wrong shape is an error naming the node, never a panic:
/// let w = g.variable("w", &[5, 2], DType::F32, tessera_core::Init::Zeros)?;
/// assert!(g.matmul("bad", x, w).is_err());
/// # Ok::<(), tessera_core::GraphError>(())
/// ```
pub struct Graph<S: Storage> {
    pub(crate) nodes: S::Vec<Node>,
    /// Number of forward nodes once differentiated (those an inference run executes).
    pub(crate) forward_len: Option<u32>,
    /// With gradient accumulation: the micro-batch counter and micro-batches per update.
    pub(crate) accumulation: Option<(NodeId, u32)>,
    /// The pipeline stage of nodes added from now on.
    pub(crate) current_stage: u8,
    /// The forward node whose gradient rule adds the nodes added from now on (autodiff's).
    pub(crate) current_origin: Option<NodeId>,
}

impl<S: Storage> Clone for Graph<S> {
    fn clone(&self) -> Self {
        Graph {
            nodes: self.nodes.clone(),
            forward_len: self.forward_len,
            accumulation: self.accumulation,
            current_stage: self.current_stage,
            current_origin: self.current_origin,
        }
    }
}

impl<S: Storage> core::fmt::Debug for Graph<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Graph")
            .field("nodes", &&self.nodes[..])
            .field("forward_len", &self.forward_len)
            .field("accumulation", &self.accumulation)
            .finish()
    }
}

impl<S: Storage> PartialEq for Graph<S> {
    fn eq(&self, other: &Self) -> bool {
        self.nodes[..] == other.nodes[..]
            && self.forward_len == other.forward_len
            && self.accumulation == other.accumulation
            && self.current_stage == other.current_stage
    }
}

impl<S: Storage> Default for Graph<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Storage> Graph<S> {
    /// An empty graph.
    pub fn new() -> Self {
        Graph {
            nodes: S::vec(),
            forward_len: None,
            accumulation: None,
            current_stage: 0,
            current_origin: None,
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
        self.forward_len.map_or(self.nodes.len(), |n| n as usize)
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
        (0..self.nodes.len()).map(NodeId::at)
    }

    /// The node named `name`.
    pub fn find(&self, name: &str) -> Result<NodeId, GraphError> {
        self.nodes
            .iter()
            .position(|n| n.name.as_str() == name)
            .map(NodeId::at)
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
        let capacity = self.nodes.capacity().min(u32::MAX as usize);
        if index >= capacity {
            return Err(GraphError::CapacityExceeded {
                node: name,
                capacity,
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
                origin: self.current_origin.map_or(u32::MAX, |o| o.index() as u32),
            })
            .map_err(|_| GraphError::CapacityExceeded {
                node: name,
                capacity,
            })?;
        Ok(NodeId::at(index))
    }

    pub(crate) fn shape_of(name: &str, dims: &[usize]) -> Result<Shape, GraphError> {
        Shape::new(dims).map_err(|reason| GraphError::BadShape {
            node: name_lossy(name),
            reason,
        })
    }

    pub(crate) fn float_operand(
        &self,
        name: &Name,
        op: &'static str,
        x: NodeId,
    ) -> Result<(), GraphError> {
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

    pub(crate) fn same_dtype(
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

    /// `axis` of a rank-`rank` operand as an index (negative counts from the end), or an
    /// error naming the node.
    pub(crate) fn axis(&self, node: &Name, axis: isize, rank: usize) -> Result<usize, GraphError> {
        let a = if axis < 0 { axis + rank as isize } else { axis };
        if a < 0 || a as usize >= rank {
            return Err(GraphError::BadAxis {
                node: node.clone(),
                axis,
                rank,
            });
        }
        Ok(a as usize)
    }

    /// The set of `axes` (each checked as [`Graph::axis`] does) of a tensor of rank `rank`.
    pub(crate) fn axis_set(
        &self,
        node: &Name,
        axes: &[isize],
        rank: usize,
    ) -> Result<crate::ops::Axes, GraphError> {
        let mut set = crate::ops::Axes::NONE;
        for &a in axes {
            set.0 |= 1 << self.axis(node, a, rank)?;
        }
        Ok(set)
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

    /// State the graph updates itself but does not train (running averages, counters): a
    /// variable with [`Roles::STATE`] instead of [`Roles::TRAINABLE`].
    pub fn state(
        &mut self,
        name: &str,
        dims: &[usize],
        dtype: DType,
        init: Init,
    ) -> Result<NodeId, GraphError> {
        let n = self.check_name(name)?;
        let shape = Self::shape_of(name, dims)?;
        self.push(n, Op::Variable { init }, shape, dtype, Roles::STATE)
    }

    /// Appends a copy of node `id` of graph `from` (this graph's nodes or another's) in the
    /// current stage, named `name`, with its roles, reading `f(o)` in place of each operand
    /// `o`. Each operand read must have the shape and type of the one it replaces, so the
    /// copy is as well-formed as the original (restaging a graph, as an importer's placement
    /// of nodes in pipeline stages does, copies it node by node).
    ///
    /// # Errors
    ///
    /// [`GraphError::UnknownNode`] for an id of neither graph,
    /// [`GraphError::ShapeMismatch`] / [`GraphError::DTypeMismatch`] for an operand unlike the
    /// one it replaces, [`GraphError::BadAttribute`] for an update (it writes its operands and
    /// is never copied), and the name errors of every builder.
    pub fn push_copy<T: Storage>(
        &mut self,
        from: &Graph<T>,
        id: NodeId,
        name: &str,
        f: &mut dyn FnMut(NodeId) -> NodeId,
    ) -> Result<NodeId, GraphError> {
        let src = from
            .get(id)
            .ok_or(GraphError::UnknownNode { index: id.index() })?;
        let n = self.check_name(name)?;
        let mut bad: Option<GraphError> = None;
        let op = src.op.map_operands(&mut |o| {
            let to = f(o);
            if bad.is_some() {
                return to;
            }
            let (Some(was), Some(now)) = (from.get(o), self.get(to)) else {
                bad = Some(GraphError::UnknownNode { index: to.index() });
                return to;
            };
            if was.shape != now.shape {
                bad = Some(GraphError::ShapeMismatch {
                    node: n.clone(),
                    op: src.op.name(),
                    rule: "a copy reads operands of the original's shapes",
                    left: was.shape,
                    right: now.shape,
                });
            } else if was.dtype != now.dtype {
                bad = Some(GraphError::DTypeMismatch {
                    node: n.clone(),
                    op: src.op.name(),
                    expected: "the original operand's type",
                    found: now.dtype,
                });
            }
            to
        });
        let Some(op) = op else {
            return Err(GraphError::BadAttribute {
                node: n,
                op: src.op.name(),
                rule: "an update writes its operands and is never copied",
            });
        };
        if let Some(e) = bad {
            return Err(e);
        }
        self.push(n, op, src.shape, src.dtype, src.roles)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fixed;

    /// A copy reads the operands it is given, keeps the op, shape, type and roles, and takes
    /// the current stage.
    #[test]
    fn a_copy_reads_the_operands_given_in_the_current_stage() {
        let mut g: Graph<Fixed<16>> = Graph::new();
        let x = g.input("x", &[2, 3], DType::F32).unwrap();
        let w = g.variable("w", &[3, 4], DType::F32, Init::Zeros).unwrap();
        let y = g.matmul("y", x, w).unwrap();
        let mut h: Graph<Fixed<16>> = Graph::new();
        let x2 = h.push_copy(&g, x, "x", &mut |o| o).unwrap();
        h.set_stage(1).unwrap();
        let w2 = h.push_copy(&g, w, "w@stage1", &mut |o| o).unwrap();
        let y2 = h
            .push_copy(&g, y, "y", &mut |o| if o == w { w2 } else { x2 })
            .unwrap();
        assert_eq!(h.node(y2).op().operands().as_slice(), &[x2, w2]);
        assert_eq!(h.node(y2).shape(), g.node(y).shape());
        assert_eq!(h.node(w2).roles(), Roles::TRAINABLE);
        assert_eq!((h.node(x2).stage(), h.node(y2).stage()), (0, 1));
    }

    /// An operand of another shape or type, an unknown id or a name taken is an error,
    /// never a malformed graph.
    #[test]
    fn a_copy_of_other_shapes_or_names_is_refused() {
        let mut g: Graph<Fixed<16>> = Graph::new();
        let x = g.input("x", &[2, 3], DType::F32).unwrap();
        let w = g.variable("w", &[3, 4], DType::F32, Init::Zeros).unwrap();
        let y = g.matmul("y", x, w).unwrap();
        let mut h: Graph<Fixed<16>> = Graph::new();
        let x2 = h.push_copy(&g, x, "x", &mut |o| o).unwrap();
        let v = h.variable("v", &[3, 5], DType::F32, Init::Zeros).unwrap();
        let i = h.input("i", &[3, 4], DType::I32).unwrap();
        let shape = h.push_copy(&g, y, "y", &mut |o| if o == w { v } else { x2 });
        assert!(
            matches!(shape, Err(GraphError::ShapeMismatch { .. })),
            "{shape:?}"
        );
        let dtype = h.push_copy(&g, y, "y", &mut |o| if o == w { i } else { x2 });
        assert!(
            matches!(dtype, Err(GraphError::DTypeMismatch { .. })),
            "{dtype:?}"
        );
        let unknown = h.push_copy(&g, y, "y", &mut |_| NodeId::from_index(99));
        assert!(matches!(
            unknown,
            Err(GraphError::UnknownNode { index: 99 })
        ));
        let taken = h.push_copy(&g, x, "x", &mut |o| o);
        assert!(matches!(taken, Err(GraphError::DuplicateName { .. })));
        assert_eq!(h.len(), 3, "nothing was added");
    }
}
