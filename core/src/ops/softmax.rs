//! Softmax over any axis, computed stably (the axis' maximum subtracted first), and its
//! gradient `y * (dy - sum(dy * y))`.

use crate::autodiff::Backprop;
use crate::error::{GraphError, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::run::Exec;
use crate::storage::Storage;
use crate::Roles;

/// Softmax and its gradient.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Softmax {
    /// `exp(x) / sum(exp(x))` along `axis`.
    Forward {
        /// Operand.
        x: NodeId,
        /// The axis.
        axis: u8,
    },
    /// Backward: `y * (dy - sum(dy * y))` along `axis`.
    Backward {
        /// Upstream gradient.
        dy: NodeId,
        /// The softmax's output.
        y: NodeId,
        /// The axis.
        axis: u8,
    },
}

impl Softmax {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Softmax::Forward { .. } => "Softmax",
            Softmax::Backward { .. } => "SoftmaxGrad",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Softmax::Forward { x, .. } => Operands::of(&[x]),
            Softmax::Backward { dy, y, .. } => Operands::of(&[dy, y]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let sm = *self;
        match sm {
            Softmax::Forward { x, axis } => Softmax::Forward { x: f(x), axis },
            Softmax::Backward { dy, y, axis } => Softmax::Backward {
                dy: f(dy),
                y: f(y),
                axis,
            },
        }
    }
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Softmax over the last axis.
    pub fn softmax(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let rank = self.node(x).shape.rank();
        self.softmax_axis(name, x, rank as isize - 1)
    }

    /// Softmax over `axis` (negative counts from the end, as numpy).
    pub fn softmax_axis(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: isize,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        self.float_operand(&n, "Softmax", x)?;
        let node = self.node(x);
        let (shape, dtype) = (node.shape, node.dtype);
        let axis = self.axis(&n, axis, shape.rank())?;
        let op = Op::Softmax(Softmax::Forward {
            x,
            axis: axis as u8,
        });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Softmax,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let t = node.dtype;
    let out = &mut *ex.out;
    match *op {
        Softmax::Forward { x, axis } => {
            let (outer, len, inner) = node.shape.split_at_axis(axis as usize);
            let xb = ex.ins.bytes(x);
            for o in 0..outer {
                for j in 0..inner {
                    let at = |l: usize| (o * len + l) * inner + j;
                    let mut max = f32::NEG_INFINITY;
                    for l in 0..len {
                        max = max.max(k::load(xb, t, at(l)));
                    }
                    let mut sum = 0f32;
                    for l in 0..len {
                        let e = libm::expf(k::load(xb, t, at(l)) - max);
                        sum += e;
                        k::store(out, t, at(l), e);
                    }
                    for l in 0..len {
                        let v = k::load(out, t, at(l)) / sum;
                        k::store(out, t, at(l), v);
                    }
                }
            }
        }
        Softmax::Backward { dy, y, axis } => {
            let (outer, len, inner) = node.shape.split_at_axis(axis as usize);
            let (gb, yb) = (ex.ins.bytes(dy), ex.ins.bytes(y));
            for o in 0..outer {
                for j in 0..inner {
                    let at = |l: usize| (o * len + l) * inner + j;
                    let mut dot = 0f32;
                    for l in 0..len {
                        dot += k::load(gb, t, at(l)) * k::load(yb, t, at(l));
                    }
                    for l in 0..len {
                        let i = at(l);
                        k::store(out, t, i, k::load(yb, t, i) * (k::load(gb, t, i) - dot));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The gradient.
pub(crate) fn backward<S: Storage>(
    op: &Softmax,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    match *op {
        Softmax::Forward { x, axis } => {
            bp.pass(x, Op::Softmax(Softmax::Backward { dy, y: id, axis }))?;
            Ok(())
        }
        Softmax::Backward { .. } => Err(bp.not_differentiable(id)),
    }
}
