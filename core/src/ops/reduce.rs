//! Reductions (sum, mean, max) over any set of axes, keeping them as size 1 or removing them,
//! and broadcasting, their adjoint. Every reduction sums in ascending index order, so results
//! are bit-identical on every target.

use crate::autodiff::Backprop;
use crate::error::{GraphError, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::elementwise::{Elementwise, TernaryFn, UnaryFn};
use crate::ops::layout::{walk_offsets, Layout};
use crate::ops::{broadcast_shapes, broadcast_walk, for_each_group, shape_for, Axes};
use crate::run::Exec;
use crate::storage::Storage;
use crate::{DType, Roles, Shape, MAX_RANK};

/// What a reduction computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ReduceKind {
    /// Sum, from index 0 upward.
    Sum,
    /// Sum divided by the count.
    Mean,
    /// Maximum.
    Max,
}

/// Reductions and broadcasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Reduce {
    /// Reduces `axes` of `x`.
    Reduce {
        /// Operand.
        x: NodeId,
        /// The reduced axes (of `x`).
        axes: Axes,
        /// Keep reduced axes as size 1 (else they are removed).
        keep_dims: bool,
        /// Sum, mean or max.
        kind: ReduceKind,
    },
    /// `x` broadcast (numpy rules) to the node's shape.
    Broadcast {
        /// Operand.
        x: NodeId,
    },
}

impl Reduce {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Reduce::Reduce {
                kind: ReduceKind::Sum,
                ..
            } => "ReduceSum",
            Reduce::Reduce {
                kind: ReduceKind::Mean,
                ..
            } => "ReduceMean",
            Reduce::Reduce {
                kind: ReduceKind::Max,
                ..
            } => "ReduceMax",
            Reduce::Broadcast { .. } => "Broadcast",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Reduce::Reduce { x, .. } | Reduce::Broadcast { x } => Operands::of(&[x]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let r = *self;
        match r {
            Reduce::Reduce {
                x,
                axes,
                keep_dims,
                kind,
            } => Reduce::Reduce {
                x: f(x),
                axes,
                keep_dims,
                kind,
            },
            Reduce::Broadcast { x } => Reduce::Broadcast { x: f(x) },
        }
    }
}

/// The shape of `s` reduced over `axes`.
pub fn reduced(s: Shape, axes: Axes, keep_dims: bool) -> Shape {
    let mut d = [1usize; MAX_RANK];
    let mut r = 0;
    for (i, &x) in s.dims().iter().enumerate() {
        if axes.contains(i) {
            if keep_dims {
                d[r] = 1;
                r += 1;
            }
        } else {
            d[r] = x as usize;
            r += 1;
        }
    }
    Shape::new(&d[..r]).unwrap_or(Shape::scalar())
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Reduces `x` over `axes` (negative counts from the end; empty means every axis).
    pub fn reduce(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axes: &[isize],
        keep_dims: bool,
        kind: ReduceKind,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let node = self.node(x);
        let (s, dtype) = (node.shape, node.dtype);
        let set = if axes.is_empty() {
            Axes::all(s.rank())
        } else {
            self.axis_set(&n, axes, s.rank())?
        };
        let op = Op::Reduce(Reduce::Reduce {
            x,
            axes: set,
            keep_dims,
            kind,
        });
        self.float_operand(&n, op.name(), x)?;
        self.push(n, op, reduced(s, set, keep_dims), dtype, Roles::ACTIVATION)
    }

    fn reduce_one(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: Option<usize>,
        kind: ReduceKind,
    ) -> Result<NodeId, GraphError> {
        match axis {
            Some(a) => self.reduce(name, x, &[a.min(isize::MAX as usize) as isize], false, kind),
            None => self.reduce(name, x, &[], false, kind),
        }
    }

    /// Sum over `axis` (removed), or over everything with `None`.
    pub fn reduce_sum(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        self.reduce_one(name, x, axis, ReduceKind::Sum)
    }

    /// Mean over `axis` (removed), or over everything with `None`.
    pub fn reduce_mean(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        self.reduce_one(name, x, axis, ReduceKind::Mean)
    }

    /// Maximum over `axis` (removed), or over everything with `None`.
    pub fn reduce_max(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        self.reduce_one(name, x, axis, ReduceKind::Max)
    }

    /// `x` broadcast to `dims` (numpy rules: `x`'s shape aligned on the right, 1s stretch).
    pub fn broadcast_to(
        &mut self,
        name: &str,
        x: impl NodeRef,
        dims: &[usize],
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let to = shape_for(name, dims)?;
        let node = self.node(x);
        let (from, dtype) = (node.shape, node.dtype);
        if broadcast_shapes(from, to) != Some(to) {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "Broadcast",
                rule: "operand must broadcast to the target shape (numpy rules)",
                left: from,
                right: to,
            });
        }
        let op = Op::Reduce(Reduce::Broadcast { x });
        self.push(n, op, to, dtype, Roles::ACTIVATION)
    }
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Reduce,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let t = node.dtype;
    let out = &mut *ex.out;
    match *op {
        Reduce::Reduce { x, axes, kind, .. } => {
            let (sx, xt) = (ex.ins.shape(x), ex.ins.dtype(x));
            let xb = ex.ins.bytes(x);
            let q = axes.end();
            if xt == DType::F32 && t == DType::F32 && q > 0 && axes == Axes::all(q) {
                leading_f32(xb, out, sx, q, kind);
                return Ok(());
            }
            let mut o = 0;
            for_each_group(sx, axes, |base, rd, rs| {
                let count: usize = rd.iter().product();
                let mut acc = if kind == ReduceKind::Max {
                    f32::NEG_INFINITY
                } else {
                    0.0
                };
                walk_offsets(rd, rs, |off| {
                    let v = k::load(xb, xt, base + off);
                    acc = if kind == ReduceKind::Max {
                        acc.max(v)
                    } else {
                        acc + v
                    };
                });
                if kind == ReduceKind::Mean {
                    acc /= count as f32;
                }
                k::store(out, t, o, acc);
                o += 1;
            });
        }
        Reduce::Broadcast { x } => {
            let (xb, xt) = (ex.ins.bytes(x), ex.ins.dtype(x));
            broadcast_walk(node.shape, [ex.ins.shape(x)], |o, [i]| {
                k::store(out, t, o, k::load(xb, xt, i));
            });
        }
    }
    Ok(())
}

/// [`run`]'s reduction over the leading `q` axes of `f32` data, row after row of the kept
/// elements, so that the loop over them is vectorised: each output still takes its terms in
/// the order the generic walk gives them (the reduced coordinates in row-major order), from
/// the same starting value.
fn leading_f32(xb: &[u8], out: &mut [u8], sx: Shape, q: usize, kind: ReduceKind) {
    let dims = sx.dims();
    let count: usize = dims[..q].iter().map(|&d| d as usize).product();
    let inner = 4 * dims[q..].iter().map(|&d| d as usize).product::<usize>();
    let out = &mut out[..inner];
    let start = if kind == ReduceKind::Max {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    for o in out.chunks_exact_mut(4) {
        o.copy_from_slice(&start.to_le_bytes());
    }
    if inner == 0 {
        return;
    }
    for row in xb[..count * inner].chunks_exact(inner) {
        if kind == ReduceKind::Max {
            k::zip_in_place(out, row, DType::F32, inner / 4, |acc, v| acc.max(v));
        } else {
            k::zip_in_place(out, row, DType::F32, inner / 4, |acc, v| acc + v);
        }
    }
    if kind == ReduceKind::Mean {
        let n = count as f32;
        for o in out.chunks_exact_mut(4) {
            let v = f32::from_le_bytes([o[0], o[1], o[2], o[3]]) / n;
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The gradient.
pub(crate) fn backward<S: Storage>(
    op: &Reduce,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    match *op {
        Reduce::Broadcast { x } => {
            if bp.wants(x) {
                let g = bp.sum_to(x, dy)?;
                bp.contribute(x, g)?;
            }
            Ok(())
        }
        Reduce::Reduce {
            x,
            axes,
            keep_dims,
            kind,
        } => {
            if !bp.wants(x) {
                return Ok(());
            }
            let (sx, t) = bp.meta(x);
            let kept = reduced(sx, axes, true);
            // The upstream gradient (and, for max, the result) with the reduced axes kept.
            let view = |bp: &mut Backprop<'_, S>, v: NodeId| {
                if keep_dims {
                    Ok(v)
                } else {
                    bp.node(x, Op::Layout(Layout::Reshape { x: v }), kept, t)
                }
            };
            let mut up = view(bp, dy)?;
            let g = match kind {
                ReduceKind::Sum | ReduceKind::Mean => {
                    if kind == ReduceKind::Mean {
                        let count = sx.elements() / kept.elements();
                        let f = UnaryFn::Scale(1.0 / count as f32);
                        up =
                            bp.node(x, Op::Elementwise(Elementwise::Unary { x: up, f }), kept, t)?;
                    }
                    bp.like(x, Op::Reduce(Reduce::Broadcast { x: up }))?
                }
                ReduceKind::Max => {
                    let y = view(bp, id)?;
                    let f = TernaryFn::PickGrad;
                    bp.like(
                        x,
                        Op::Elementwise(Elementwise::Ternary {
                            a: up,
                            b: x,
                            c: y,
                            f,
                        }),
                    )?
                }
            };
            bp.contribute(x, g)
        }
    }
}
