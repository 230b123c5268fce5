//! Matrix products: `op(a) . op(b)` over the last two axes, batched over the leading axes with
//! numpy broadcasting (as attention's `[batch, heads, seq, dim]` products need), either operand
//! optionally transposed.

use crate::autodiff::Backprop;
use crate::error::{GraphError, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::layout::Layout;
use crate::ops::{broadcast_shapes, broadcast_walk, shape_for};
use crate::run::Exec;
use crate::storage::Storage;
use crate::{Roles, Shape, MAX_RANK};

/// A (batched) matrix product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MatMul {
    /// Left operand, `[..., m, k]` (or `[..., k, m]` transposed).
    pub a: NodeId,
    /// Right operand, `[..., k, n]` (or `[..., n, k]` transposed).
    pub b: NodeId,
    /// Use a's transpose (of its last two axes).
    pub transpose_a: bool,
    /// Use b's transpose.
    pub transpose_b: bool,
}

impl MatMul {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        "MatMul"
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        Operands::of(&[self.a, self.b])
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let m = *self;
        MatMul {
            a: f(m.a),
            b: f(m.b),
            ..m
        }
    }
}

/// The leading (batch) axes of a rank >= 2 shape.
fn batch_of(s: Shape) -> Shape {
    Shape::new(
        &{
            let mut d = [0usize; MAX_RANK];
            for (o, &x) in d.iter_mut().zip(&s.dims()[..s.rank() - 2]) {
                *o = x as usize;
            }
            d
        }[..s.rank() - 2],
    )
    .unwrap_or(Shape::scalar())
}

/// The (rows, cols) of a stored matrix operand, and of its `op()`.
fn matrix(s: Shape, transposed: bool) -> (usize, usize) {
    let (r, c) = (s.dim(s.rank() - 2), s.dim(s.rank() - 1));
    if transposed {
        (c, r)
    } else {
        (r, c)
    }
}

/// `batch ++ [rows, cols]`.
fn with_matrix(name: &str, batch: Shape, rows: usize, cols: usize) -> Result<Shape, GraphError> {
    let mut d = [0usize; MAX_RANK + 2];
    let r = batch.rank();
    for (o, &x) in d.iter_mut().zip(batch.dims()) {
        *o = x as usize;
    }
    d[r] = rows;
    d[r + 1] = cols;
    shape_for(name, &d[..r + 2])
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Matrix product `a . b`.
    pub fn matmul(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        self.matmul_t(name, a, b, false, false)
    }

    /// Matrix product with optional transposes: `op(a) . op(b)` over the last two axes,
    /// batched over the leading axes (broadcast as numpy does).
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
        let mismatch = |rule| GraphError::ShapeMismatch {
            node: n.clone(),
            op: "MatMul",
            rule,
            left: sa,
            right: sb,
        };
        if sa.rank() < 2 || sb.rank() < 2 {
            return Err(mismatch("operands must be at least rank 2"));
        }
        let (m, ka) = matrix(sa, transpose_a);
        let (kb, cols) = matrix(sb, transpose_b);
        if ka != kb {
            return Err(mismatch("inner dimensions must agree"));
        }
        let batch = broadcast_shapes(batch_of(sa), batch_of(sb))
            .ok_or_else(|| mismatch("batch dimensions must broadcast (numpy rules)"))?;
        let shape = with_matrix(name, batch, m, cols)?;
        let op = Op::MatMul(MatMul {
            a,
            b,
            transpose_a,
            transpose_b,
        });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }
}

/// The reference kernel: one 2-D product per batch element.
pub(crate) fn run<S: Storage>(
    op: &MatMul,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let (sa, sb, so) = (ex.ins.shape(op.a), ex.ins.shape(op.b), node.shape);
    let (m, kk) = matrix(sa, op.transpose_a);
    let n = so.last();
    let dt = node.dtype;
    let (xa, xb) = (ex.ins.bytes(op.a), ex.ins.bytes(op.b));
    let es = dt.size();
    let (ma, mb, mo) = (
        sa.dim(sa.rank() - 2) * sa.last(),
        sb.dim(sb.rank() - 2) * sb.last(),
        m * n,
    );
    let out = &mut *ex.out;
    let par = ex.par;
    broadcast_walk(batch_of(so), [batch_of(sa), batch_of(sb)], |o, [i, j]| {
        k::matmul_on(
            par,
            &xa[i * ma * es..(i + 1) * ma * es],
            &xb[j * mb * es..(j + 1) * mb * es],
            dt,
            &mut out[o * mo * es..(o + 1) * mo * es],
            k::Product {
                m,
                k: kk,
                n,
                ta: op.transpose_a,
                tb: op.transpose_b,
            },
        );
    });
    Ok(())
}

/// The gradient: products of the upstream gradient with the other operand, summed over any
/// batch axes the operand was broadcast along.
pub(crate) fn backward<S: Storage>(
    op: &MatMul,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    let &MatMul {
        a,
        b,
        transpose_a: ta,
        transpose_b: tb,
    } = op;
    let batch = batch_of(bp.graph.node(id).shape);
    let mm = |a, b, transpose_a, transpose_b| {
        Op::MatMul(MatMul {
            a,
            b,
            transpose_a,
            transpose_b,
        })
    };
    if bp.wants(a) {
        let g = match (ta, tb) {
            (false, false) => mm(dy, b, false, true),
            (false, true) => mm(dy, b, false, false),
            (true, false) => mm(b, dy, false, true),
            (true, true) => mm(b, dy, true, true),
        };
        contribute_batched(bp, a, g, batch)?;
    }
    if bp.wants(b) && fold_batch(bp, a, b, ta, tb, dy, batch)? {
        return Ok(());
    }
    if bp.wants(b) {
        let g = match (ta, tb) {
            (false, false) => mm(a, dy, true, false),
            (false, true) => mm(dy, a, true, false),
            (true, false) => mm(a, dy, false, false),
            (true, true) => mm(dy, a, true, true),
        };
        contribute_batched(bp, b, g, batch)?;
    }
    Ok(())
}

/// The gradient of a matrix `b` shared by every batch of a batched, untransposed `a` (a dense
/// layer on a sequence): the batch axes are folded into the contracted axis, `a` and `dy` read
/// as `[batch x rows, cols]` matrices (views), so one product gives it without a gradient per
/// batch and their sum (XLA contracts the batch axes of such a dot the same way). Returns
/// whether it applied.
fn fold_batch<S: Storage>(
    bp: &mut Backprop<'_, S>,
    a: NodeId,
    b: NodeId,
    ta: bool,
    tb: bool,
    dy: NodeId,
    batch: Shape,
) -> Result<bool, GraphError> {
    let ((sa, da), (sb, db), (sy, dty)) = (bp.meta(a), bp.meta(b), bp.meta(dy));
    // A scalar batch has one element: nothing to fold.
    let folded = batch.elements();
    if ta || sb.rank() != 2 || folded <= 1 || batch_of(sa) != batch {
        return Ok(false);
    }
    let (m, k) = matrix(sa, false);
    let (_, n) = matrix(sy, false);
    let name = &bp.graph.node(b).name;
    let (a2, y2) = (
        shape_for(name, &[folded * m, k])?,
        shape_for(name, &[folded * m, n])?,
    );
    let a2 = bp.node(b, Op::Layout(Layout::Reshape { x: a }), a2, da)?;
    let y2 = bp.node(b, Op::Layout(Layout::Reshape { x: dy }), y2, dty)?;
    let (x, y) = if tb { (y2, a2) } else { (a2, y2) };
    let op = Op::MatMul(MatMul {
        a: x,
        b: y,
        transpose_a: true,
        transpose_b: false,
    });
    let g = bp.node(b, op, sb, db)?;
    bp.contribute(b, g)?;
    Ok(true)
}

/// Pushes `op` (a product giving `x`'s matrix shape over the output's batch) and contributes
/// it to `x`, summed over broadcast batch axes.
fn contribute_batched<S: Storage>(
    bp: &mut Backprop<'_, S>,
    x: NodeId,
    op: Op,
    batch: Shape,
) -> Result<(), GraphError> {
    let (sx, dt) = bp.meta(x);
    let (r, c) = matrix(sx, false);
    let shape = with_matrix(&bp.graph.node(x).name, batch, r, c)?;
    let g = bp.node(x, op, shape, dt)?;
    let g = bp.sum_to(x, g)?;
    bp.contribute(x, g)
}
