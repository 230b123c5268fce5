//! What a node computes: a closed enum of op families.
//!
//! Each family lives in one module of [`crate::ops`], which holds its builders (with their
//! shape rules), its reference kernel and its gradient. This enum only names the families;
//! every question about an op (its operands, its name, how it runs, how it differentiates) is
//! one short `match` that forwards to the family.

use crate::graph::{Init, NodeId};
use crate::ops::{
    conv::Conv, elementwise::Elementwise, gather::Gather, layout::Layout, loss::Loss,
    matmul::MatMul, norm::Norm, pool::Pool, random::Random, reduce::Reduce, softmax::Softmax,
    update::Update,
};

/// What a node computes. Operands are [`NodeId`]s of earlier nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
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
    /// Element-wise functions of one, two or three operands, with numpy broadcasting.
    Elementwise(Elementwise),
    /// Matrix products, batched with broadcasting.
    MatMul(MatMul),
    /// Softmax on any axis and its gradient.
    Softmax(Softmax),
    /// Losses and their gradients.
    Loss(Loss),
    /// Reductions over chosen axes and their adjoint, broadcasting.
    Reduce(Reduce),
    /// Data movement: views (reshape), transpose, concat, slice, taps.
    Layout(Layout),
    /// Convolutions and their input and weight gradients.
    Conv(Conv),
    /// Max and average pooling and their gradients.
    Pool(Pool),
    /// Normalisation over chosen axes (batch, layer and group norms build on it).
    Norm(Norm),
    /// Gather (embedding lookup), its scatter-add gradient, one-hot.
    Gather(Gather),
    /// Seeded random masks (dropout).
    Random(Random),
    /// In-place updates of state: optimizers, counters, accumulators.
    Update(Update),
}

/// The operands of a node, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Operands {
    ids: [NodeId; Operands::MAX],
    len: u8,
}

impl Operands {
    /// The most operands an op has.
    pub const MAX: usize = 5;

    pub(crate) fn of(list: &[NodeId]) -> Self {
        let mut ids = [NodeId(0); Operands::MAX];
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
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "Input",
            Op::Variable { .. } => "Variable",
            Op::Constant { .. } => "Constant",
            Op::Elementwise(e) => e.name(),
            Op::MatMul(m) => m.name(),
            Op::Softmax(s) => s.name(),
            Op::Loss(l) => l.name(),
            Op::Reduce(r) => r.name(),
            Op::Layout(l) => l.name(),
            Op::Conv(c) => c.name(),
            Op::Pool(p) => p.name(),
            Op::Norm(n) => n.name(),
            Op::Gather(g) => g.name(),
            Op::Random(r) => r.name(),
            Op::Update(u) => u.name(),
        }
    }

    /// The operands this op reads (and, for updates, writes).
    pub fn operands(&self) -> Operands {
        match self {
            Op::Input | Op::Variable { .. } | Op::Constant { .. } => Operands::of(&[]),
            Op::Elementwise(e) => e.operands(),
            Op::MatMul(m) => m.operands(),
            Op::Softmax(s) => s.operands(),
            Op::Loss(l) => l.operands(),
            Op::Reduce(r) => r.operands(),
            Op::Layout(l) => l.operands(),
            Op::Conv(c) => c.operands(),
            Op::Pool(p) => p.operands(),
            Op::Norm(n) => n.operands(),
            Op::Gather(g) => g.operands(),
            Op::Random(r) => r.operands(),
            Op::Update(u) => u.operands(),
        }
    }

    /// The same op reading `f(o)` for each operand `o`: a clone of a node elsewhere in the
    /// graph (recomputation's copies of forward nodes). `None` for updates, which write their
    /// operands and are never cloned.
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Option<Op> {
        Some(match self {
            Op::Input | Op::Variable { .. } | Op::Constant { .. } => *self,
            Op::Elementwise(e) => Op::Elementwise(e.map_operands(f)),
            Op::MatMul(m) => Op::MatMul(m.map_operands(f)),
            Op::Softmax(s) => Op::Softmax(s.map_operands(f)),
            Op::Loss(l) => Op::Loss(l.map_operands(f)),
            Op::Reduce(r) => Op::Reduce(r.map_operands(f)),
            Op::Layout(l) => Op::Layout(l.map_operands(f)),
            Op::Conv(c) => Op::Conv(c.map_operands(f)),
            Op::Pool(p) => Op::Pool(p.map_operands(f)),
            Op::Norm(n) => Op::Norm(n.map_operands(f)),
            Op::Gather(g) => Op::Gather(g.map_operands(f)),
            Op::Random(r) => Op::Random(r.map_operands(f)),
            Op::Update(_) => return None,
        })
    }

    /// Whether the op writes its operands in place and produces no tensor of its own.
    pub const fn is_update(&self) -> bool {
        matches!(self, Op::Update(_))
    }

    /// Whether the node is a leaf whose data lives in the state buffer.
    pub const fn is_state(&self) -> bool {
        matches!(self, Op::Variable { .. } | Op::Constant { .. })
    }

    /// The operand whose bytes this node's tensor shares, if it is a view (a reshape): a view
    /// has no storage of its own and runs no code.
    pub const fn view_of(&self) -> Option<NodeId> {
        match self {
            Op::Layout(Layout::Reshape { x }) => Some(*x),
            _ => None,
        }
    }
}
