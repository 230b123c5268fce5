//! The backward pass: each node's gradient rule in reverse order, through recomputed copies
//! where a segment is recomputed.

use crate::error::{derived, GraphError};
use crate::graph::{Graph, NodeId};
use crate::op::Op;
use crate::ops::elementwise::{BinaryFn, Elementwise};
use crate::ops::layout::Layout;
use crate::ops::reduce::{Reduce, ReduceKind};
use crate::ops::Axes;
use crate::storage::{Buffer, Storage};
use crate::{DType, Roles, Shape};

use super::update::Updates;

/// The state of a backward pass while the families append their gradients: what each node's
/// gradient is so far, and which nodes need one.
pub(crate) struct Backprop<'g, S: Storage> {
    pub(crate) graph: &'g mut Graph<S>,
    pub(super) grad: S::Vec<Option<NodeId>>,
    pub(super) count: S::Vec<u32>,
    pub(super) relevant: S::Vec<bool>,
    /// Recomputed copies of forward nodes (made after the forward pass, in increasing order)
    /// with the nodes they copy: a copy's gradient is its original's.
    pub(super) clones: S::Vec<(NodeId, NodeId)>,
}

impl<S: Storage> Backprop<'_, S> {
    /// The forward node `x` is, or copies (recomputation).
    fn origin(&self, x: NodeId) -> NodeId {
        if x.index() < self.grad.len() {
            return x;
        }
        match self.clones.binary_search_by_key(&x, |&(c, _)| c) {
            Ok(k) => self.clones[k].1,
            Err(_) => x,
        }
    }

    /// Whether `x` needs a gradient (it lies between a trainable variable and the loss).
    pub(crate) fn wants(&self, x: NodeId) -> bool {
        let x = self.origin(x);
        self.relevant.get(x.index()).copied().unwrap_or(false)
    }

    /// Shape and type of node `x`.
    pub(crate) fn meta(&self, x: NodeId) -> (Shape, DType) {
        let n = self.graph.node(x);
        (n.shape, n.dtype)
    }

    /// Pushes a backward node for `target` (its gradient's or its recomputation's), named
    /// `<target><what><k>`, the k-th such node of `target` or its copies.
    fn numbered(
        &mut self,
        target: NodeId,
        what: &str,
        op: Op,
        (shape, dtype): (Shape, DType),
        roles: Roles,
    ) -> Result<NodeId, GraphError> {
        let target = self.origin(target);
        let c = &mut self.count[target.index()];
        *c += 1;
        let k = *c;
        let name = derived(
            &self.graph.nodes[target.index()].name.clone(),
            format_args!("{what}{k}"),
        )?;
        self.graph.push(name, op, shape, dtype, roles)
    }

    /// Pushes a node of `target`'s gradient computation, named `<target>_grad/<k>`.
    pub(crate) fn node(
        &mut self,
        target: NodeId,
        op: Op,
        shape: Shape,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let roles = Roles::GRADIENT | Roles::BACKWARD;
        self.numbered(target, "_grad/", op, (shape, dtype), roles)
    }

    /// A node the backward pass computes again from forward values (not a gradient), with
    /// `target`'s shape and type: `<target>/again/<k>`.
    pub(crate) fn again(&mut self, target: NodeId, op: Op) -> Result<NodeId, GraphError> {
        let meta = self.meta(target);
        self.numbered(target, "/again/", op, meta, Roles::BACKWARD)
    }

    /// A gradient node for `target` with `target`'s own shape and type.
    pub(crate) fn like(&mut self, target: NodeId, op: Op) -> Result<NodeId, GraphError> {
        let (s, t) = self.meta(target);
        self.node(target, op, s, t)
    }

    /// When `target` needs a gradient: pushes `op` (which computes it, with `target`'s shape
    /// and type) and adds it to `target`'s gradient. The common shape of a family's backward.
    pub(crate) fn pass(&mut self, target: NodeId, op: Op) -> Result<(), GraphError> {
        if self.wants(target) {
            let g = self.like(target, op)?;
            self.contribute(target, g)?;
        }
        Ok(())
    }

    /// Adds `g` (of `target`'s shape) to `target`'s gradient.
    pub(crate) fn contribute(&mut self, target: NodeId, g: NodeId) -> Result<(), GraphError> {
        let target = self.origin(target);
        let sum = match self.grad[target.index()] {
            None => g,
            Some(prev) => self.like(
                target,
                Op::Elementwise(Elementwise::Binary {
                    a: prev,
                    b: g,
                    f: BinaryFn::Add,
                }),
            )?,
        };
        self.grad[target.index()] = Some(sum);
        Ok(())
    }

    /// `g`, a gradient with respect to a broadcast of `target`, summed back to `target`'s
    /// shape (over the axes broadcasting added or stretched).
    pub(crate) fn sum_to(&mut self, target: NodeId, g: NodeId) -> Result<NodeId, GraphError> {
        let (ts, tt) = self.meta(target);
        let gs = self.graph.node(g).shape;
        if gs == ts {
            return Ok(g);
        }
        let rank = gs.rank();
        let dims = crate::ops::aligned(ts, rank);
        let mut axes = Axes::NONE;
        for (i, &d) in dims.iter().enumerate().take(rank) {
            if d == 1 && gs.dim(i) != 1 {
                axes.0 |= 1 << i;
            }
        }
        let mut kept = [1usize; crate::MAX_RANK];
        for (i, k) in kept.iter_mut().enumerate().take(rank) {
            *k = if axes.contains(i) { 1 } else { gs.dim(i) };
        }
        let kept_shape =
            crate::ops::shape_for(&self.graph.nodes[target.index()].name, &kept[..rank])?;
        let mut out = g;
        if !axes.is_empty() {
            out = self.node(
                target,
                Op::Reduce(Reduce::Reduce {
                    x: g,
                    axes,
                    keep_dims: true,
                    kind: ReduceKind::Sum,
                }),
                kept_shape,
                tt,
            )?;
        }
        if kept_shape != ts {
            out = self.like(target, Op::Layout(Layout::Reshape { x: out }))?;
        }
        Ok(out)
    }

    /// The error for a node autodiff cannot differentiate.
    pub(crate) fn not_differentiable(&self, id: NodeId) -> GraphError {
        let n = self.graph.node(id);
        GraphError::NotDifferentiable {
            node: n.name.clone(),
            op: n.op.name(),
        }
    }
}

/// Whether forward node `j` (of op `op`) is differentiated through a recomputed copy: it is
/// recomputed, or it is a checkpoint (closing its own segment) with an operand recomputed in
/// that segment, whose gradient would otherwise read the forward's value.
fn copied(op: &Op, j: usize, segment: &[u32], recomputed: &[bool]) -> bool {
    recomputed[j]
        || (segment[j] == j as u32
            && op
                .operands()
                .as_slice()
                .iter()
                .any(|o| recomputed[o.index()] && segment[o.index()] == j as u32))
}

/// Appends the copies of segment `c` (the checkpoint closing it): every recomputed node of
/// the segment and, when its operands are recomputed, the checkpoint itself, in forward
/// order, each reading the copies made before it, named `<node>/recompute`.
fn recompute_segment<S: Storage>(
    bp: &mut Backprop<'_, S>,
    c: usize,
    segment: &[u32],
    recomputed: &[bool],
    copy: &mut S::Vec<Option<NodeId>>,
) -> Result<(), GraphError> {
    let full = || GraphError::CapacityExceeded {
        node: crate::error::name_lossy("recomputation"),
        capacity: segment.len(),
    };
    for j in 0..=c {
        if segment[j] != c as u32 || copy[j].is_some() {
            continue;
        }
        let n = bp.graph.nodes[j].clone();
        if !copied(&n.op, j, segment, recomputed) {
            continue;
        }
        let Some(op) = n.op.map_operands(&mut |o| copy[o.index()].unwrap_or(o)) else {
            continue;
        };
        bp.graph.current_stage = n.stage;
        let name = derived(&n.name, format_args!("/recompute"))?;
        let id = bp
            .graph
            .push(name, op, n.shape, n.dtype, n.roles | Roles::BACKWARD)?;
        copy[j] = Some(id);
        bp.clones.push((id, NodeId::at(j))).map_err(|_| full())?;
    }
    Ok(())
}

/// The backward pass from node `last` down: each relevant node's gradient rule (through its
/// recomputed copy when its segment is recomputed, the segment's copies made first), in the
/// stage of the node it differentiates, then the updates of the variables whose gradients it
/// finished.
pub(super) fn backward_pass<S: Storage>(
    bp: &mut Backprop<'_, S>,
    last: usize,
    (segment, recomputed): (&[u32], &[bool]),
    updates: &mut Updates<'_, S>,
) -> Result<(), GraphError> {
    // Each forward node's recomputed copy, once its segment is recomputed.
    let mut copy: S::Vec<Option<NodeId>> =
        S::filled(segment.len(), None).ok_or(GraphError::CapacityExceeded {
            node: crate::error::name_lossy("autodiff"),
            capacity: segment.len(),
        })?;
    for i in (0..=last).rev() {
        if !bp.relevant[i] {
            continue;
        }
        // A recomputed node, or a checkpoint whose gradient reads recomputed operands, is
        // differentiated through its copy: its segment is recomputed first.
        let through_copy = copied(&bp.graph.nodes[i].op, i, segment, recomputed);
        let at = if through_copy {
            let c = segment[i] as usize;
            if copy[i].is_none() {
                recompute_segment(bp, c, segment, recomputed, &mut copy)?;
            }
            copy[i].unwrap_or(NodeId::at(i))
        } else {
            NodeId::at(i)
        };
        // Backward nodes belong to the stage of the node they differentiate, and come of
        // its rule.
        bp.graph.current_stage = bp.graph.nodes[i].stage;
        if let Some(dy) = bp.grad[i] {
            bp.graph.current_origin = Some(NodeId::at(i));
            let done = crate::ops::backward(bp, at, dy);
            bp.graph.current_origin = None;
            done?;
        }
        updates.variables_of(bp, i)?;
    }
    Ok(())
}

/// Each forward node's recomputation segment (the checkpoint closing it) and whether it is
/// recomputed.
pub(super) type Segments<S> = (<S as Storage>::Vec<u32>, <S as Storage>::Vec<bool>);
