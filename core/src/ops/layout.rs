//! Data movement: reshapes (views without a copy: flatten, squeeze, unsqueeze), transposes
//! (any permutation), concatenation, slicing and zero-padding along an axis, and taps (a copy
//! the host reads).

use crate::autodiff::Backprop;
use crate::error::{name_lossy, GraphError, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::op::{Op, Operands};
use crate::ops::{dims_of, shape_for, strides};
use crate::run::Exec;
use crate::storage::Storage;
use crate::{Roles, Shape, MAX_RANK};

/// Layout ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Layout {
    /// The same data in another shape (same element count): a view, with no copy.
    Reshape {
        /// Operand.
        x: NodeId,
    },
    /// Axes permuted: output axis `i` is input axis `perm[i]`.
    Transpose {
        /// Operand.
        x: NodeId,
        /// The permutation (entries past the rank are unused).
        perm: [u8; MAX_RANK],
    },
    /// `a` and `b` joined along `axis` (all other axes equal).
    Concat {
        /// First part.
        a: NodeId,
        /// Second part.
        b: NodeId,
        /// The axis.
        axis: u8,
    },
    /// Positions `start .. start + len` of `axis` (the node's shape gives `len`).
    Slice {
        /// Operand.
        x: NodeId,
        /// The axis.
        axis: u8,
        /// First position.
        start: u32,
    },
    /// `x` placed at `before` along `axis` in zeros of the node's shape (a slice's gradient).
    Pad {
        /// Operand.
        x: NodeId,
        /// The axis.
        axis: u8,
        /// Zeros before `x`.
        before: u32,
    },
    /// A copy that marks a tensor for the host to read (an outfeed tap).
    Tap {
        /// Operand.
        x: NodeId,
    },
}

impl Layout {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Layout::Reshape { .. } => "Reshape",
            Layout::Transpose { .. } => "Transpose",
            Layout::Concat { .. } => "Concat",
            Layout::Slice { .. } => "Slice",
            Layout::Pad { .. } => "Pad",
            Layout::Tap { .. } => "Tap",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Layout::Concat { a, b, .. } => Operands::of(&[a, b]),
            Layout::Reshape { x }
            | Layout::Transpose { x, .. }
            | Layout::Slice { x, .. }
            | Layout::Pad { x, .. }
            | Layout::Tap { x } => Operands::of(&[x]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let l = *self;
        match l {
            Layout::Reshape { x } => Layout::Reshape { x: f(x) },
            Layout::Transpose { x, perm } => Layout::Transpose { x: f(x), perm },
            Layout::Concat { a, b, axis } => Layout::Concat {
                a: f(a),
                b: f(b),
                axis,
            },
            Layout::Slice { x, axis, start } => Layout::Slice {
                x: f(x),
                axis,
                start,
            },
            Layout::Pad { x, axis, before } => Layout::Pad {
                x: f(x),
                axis,
                before,
            },
            Layout::Tap { x } => Layout::Tap { x: f(x) },
        }
    }
}

/// `s` with axis `axis` set to `len`.
fn with_axis(node: &str, s: Shape, axis: usize, len: usize) -> Result<Shape, GraphError> {
    let (mut d, r) = dims_of(s);
    d[axis] = len;
    shape_for(node, &d[..r])
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// The same data in another shape (same element count): a view, no copy.
    pub fn reshape(
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
        if from.elements() != to.elements() {
            return Err(GraphError::ReshapeSize { node: n, from, to });
        }
        self.push(
            n,
            Op::Layout(Layout::Reshape { x }),
            to,
            dtype,
            Roles::ACTIVATION,
        )
    }

    /// Keeps the first axis and flattens the rest, as Keras' `Flatten` (a view).
    pub fn flatten(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let s = self.node(x).shape;
        if s.rank() == 0 {
            return Err(GraphError::BadAxis {
                node: name_lossy(name),
                axis: 0,
                rank: 0,
            });
        }
        self.reshape(name, x, &[s.dim(0), s.elements() / s.dim(0)])
    }

    /// Removes the given axes, each of size 1 (a view).
    pub fn squeeze(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axes: &[isize],
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = name_lossy(name);
        let s = self.node(x).shape;
        let mut drop = 0u8;
        for &a in axes {
            let a = self.axis(&n, a, s.rank())?;
            if s.dim(a) != 1 {
                return Err(GraphError::BadAttribute {
                    node: n,
                    op: "Squeeze",
                    rule: "only axes of size 1 can be squeezed",
                });
            }
            drop |= 1 << a;
        }
        let (d, r) = dims_of(s);
        let mut out = [0usize; MAX_RANK];
        let mut k = 0;
        for (i, &v) in d[..r].iter().enumerate() {
            if drop & (1 << i) == 0 {
                out[k] = v;
                k += 1;
            }
        }
        self.reshape(name, x, &out[..k])
    }

    /// Inserts axes of size 1 at the given positions of the result (a view).
    pub fn unsqueeze(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axes: &[isize],
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = name_lossy(name);
        let s = self.node(x).shape;
        let rank = s.rank() + axes.len();
        if rank > MAX_RANK {
            return Err(GraphError::BadShape {
                node: n,
                reason: crate::ShapeError::RankTooLarge { rank },
            });
        }
        let mut ones = 0u8;
        for &a in axes {
            ones |= 1 << self.axis(&n, a, rank)?;
        }
        let mut out = [1usize; MAX_RANK];
        let mut src = s.dims().iter();
        for (i, o) in out.iter_mut().enumerate().take(rank) {
            if ones & (1 << i) == 0 {
                *o = src.next().map_or(1, |&v| v as usize);
            }
        }
        self.reshape(name, x, &out[..rank])
    }

    /// Permutes axes: output axis `i` is input axis `perm[i]`.
    pub fn transpose(
        &mut self,
        name: &str,
        x: impl NodeRef,
        perm: &[usize],
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let node = self.node(x);
        let (s, dtype) = (node.shape, node.dtype);
        let mut seen = 0u8;
        let mut p = [0u8; MAX_RANK];
        let bad = perm.len() != s.rank()
            || perm.iter().enumerate().any(|(i, &a)| {
                let dup = a >= s.rank() || seen & (1 << a) != 0;
                if !dup {
                    seen |= 1 << a;
                    p[i] = a as u8;
                }
                dup
            });
        if bad {
            return Err(GraphError::BadAttribute {
                node: n,
                op: "Transpose",
                rule: "perm must list every axis of the operand exactly once",
            });
        }
        for (i, q) in p.iter_mut().enumerate().skip(s.rank()) {
            *q = i as u8;
        }
        let (d, r) = dims_of(s);
        let mut out = [0usize; MAX_RANK];
        for i in 0..r {
            out[i] = d[p[i] as usize];
        }
        let shape = shape_for(name, &out[..r])?;
        self.push(
            n,
            Op::Layout(Layout::Transpose { x, perm: p }),
            shape,
            dtype,
            Roles::ACTIVATION,
        )
    }

    /// `a` and `b` side by side along the last axis.
    pub fn concat(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let a = a.resolve(self)?;
        let rank = self.node(a).shape.rank() as isize;
        self.concat_axis(name, a, b, rank - 1)
    }

    /// `a` and `b` joined along `axis` (every other axis equal).
    pub fn concat_axis(
        &mut self,
        name: &str,
        a: impl NodeRef,
        b: impl NodeRef,
        axis: isize,
    ) -> Result<NodeId, GraphError> {
        let (a, b) = (a.resolve(self)?, b.resolve(self)?);
        let n = self.check_name(name)?;
        let dtype = self.same_dtype(&n, "Concat", a, b)?;
        let (sa, sb) = (self.node(a).shape, self.node(b).shape);
        let axis = self.axis(&n, axis, sa.rank())?;
        let same_elsewhere =
            sb.rank() == sa.rank() && (0..sa.rank()).all(|i| i == axis || sa.dim(i) == sb.dim(i));
        if !same_elsewhere {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "Concat",
                rule: "operands must agree on every axis but the joined one",
                left: sa,
                right: sb,
            });
        }
        let shape = with_axis(name, sa, axis, sa.dim(axis) + sb.dim(axis))?;
        let op = Op::Layout(Layout::Concat {
            a,
            b,
            axis: axis as u8,
        });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }

    /// Positions `start .. start + len` of `axis`.
    pub fn slice(
        &mut self,
        name: &str,
        x: impl NodeRef,
        axis: isize,
        start: usize,
        len: usize,
    ) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let node = self.node(x);
        let (s, dtype) = (node.shape, node.dtype);
        let axis = self.axis(&n, axis, s.rank())?;
        if len == 0 || start.checked_add(len).is_none_or(|e| e > s.dim(axis)) {
            return Err(GraphError::BadAttribute {
                node: n,
                op: "Slice",
                rule: "the slice must be non-empty and lie within the axis",
            });
        }
        let shape = with_axis(name, s, axis, len)?;
        let op = Op::Layout(Layout::Slice {
            x,
            axis: axis as u8,
            start: start as u32,
        });
        self.push(n, op, shape, dtype, Roles::ACTIVATION)
    }

    /// Identity that marks `x` for the host to read (an outfeed tap). The tap is an output.
    pub fn tap(&mut self, name: &str, x: impl NodeRef) -> Result<NodeId, GraphError> {
        let x = x.resolve(self)?;
        let n = self.check_name(name)?;
        let node = self.node(x);
        let (shape, dtype) = (node.shape, node.dtype);
        self.push(
            n,
            Op::Layout(Layout::Tap { x }),
            shape,
            dtype,
            Roles::ACTIVATION | Roles::TAPPED | Roles::OUTPUT,
        )
    }
}

/// (outer, bytes per outer index) of `s` from `axis` on.
fn chunks(s: Shape, axis: usize, es: usize) -> (usize, usize) {
    let (outer, len, inner) = s.split_at_axis(axis);
    (outer, len * inner * es)
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Layout,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let es = node.dtype.size();
    let out = &mut *ex.out;
    match *op {
        // A view: its bytes are its root's.
        Layout::Reshape { .. } => {}
        Layout::Tap { x } => out.copy_from_slice(ex.ins.bytes(x)),
        Layout::Transpose { x, perm } => {
            let (sx, xb) = (ex.ins.shape(x), ex.ins.bytes(x));
            let st = strides(sx);
            let r = sx.rank();
            let (mut d, mut s) = ([1usize; MAX_RANK], [0usize; MAX_RANK]);
            for i in 0..r {
                d[i] = sx.dim(perm[i] as usize);
                s[i] = st[perm[i] as usize];
            }
            let mut o = 0;
            walk_offsets(&d[..r], &s[..r], |i| {
                out[o * es..(o + 1) * es].copy_from_slice(&xb[i * es..(i + 1) * es]);
                o += 1;
            });
        }
        Layout::Concat { a, b, axis } => {
            let (xa, xb) = (ex.ins.bytes(a), ex.ins.bytes(b));
            let (outer, ca) = chunks(ex.ins.shape(a), axis as usize, es);
            let cb = chunks(ex.ins.shape(b), axis as usize, es).1;
            for (o, row) in out.chunks_exact_mut(ca + cb).enumerate().take(outer) {
                row[..ca].copy_from_slice(&xa[o * ca..(o + 1) * ca]);
                row[ca..].copy_from_slice(&xb[o * cb..(o + 1) * cb]);
            }
        }
        Layout::Slice { x, axis, start } => {
            let sx = ex.ins.shape(x);
            let xb = ex.ins.bytes(x);
            let (_, cx) = chunks(sx, axis as usize, es);
            let (outer, c) = chunks(node.shape, axis as usize, es);
            let at = start as usize * (cx / sx.dim(axis as usize));
            for (o, row) in out.chunks_exact_mut(c).enumerate().take(outer) {
                row.copy_from_slice(&xb[o * cx + at..o * cx + at + c]);
            }
        }
        Layout::Pad { x, axis, before } => {
            let sx = ex.ins.shape(x);
            let xb = ex.ins.bytes(x);
            let (outer, cx) = chunks(sx, axis as usize, es);
            let (_, c) = chunks(node.shape, axis as usize, es);
            let at = before as usize * (c / node.shape.dim(axis as usize));
            out.fill(0);
            for o in 0..outer {
                out[o * c + at..o * c + at + cx].copy_from_slice(&xb[o * cx..(o + 1) * cx]);
            }
        }
    }
    Ok(())
}

/// Calls `f(offset)` for every coordinate of `dims` (row-major) with the given strides.
pub(crate) fn walk_offsets(dims: &[usize], strides: &[usize], mut f: impl FnMut(usize)) {
    let r = dims.len();
    let total: usize = dims.iter().product();
    let mut c = [0usize; MAX_RANK];
    let mut off = 0usize;
    for _ in 0..total {
        f(off);
        let mut a = r;
        while a > 0 {
            a -= 1;
            c[a] += 1;
            off += strides[a];
            if c[a] < dims[a] {
                break;
            }
            off -= strides[a] * c[a];
            c[a] = 0;
        }
    }
}

/// The gradient.
pub(crate) fn backward<S: Storage>(
    op: &Layout,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    let _ = id;
    match *op {
        Layout::Reshape { x } => {
            bp.pass(x, Op::Layout(Layout::Reshape { x: dy }))?;
        }
        Layout::Tap { x } => {
            if bp.wants(x) {
                bp.contribute(x, dy)?;
            }
        }
        Layout::Transpose { x, perm } => {
            let mut inv = perm;
            for (i, &p) in perm.iter().enumerate() {
                inv[p as usize] = i as u8;
            }
            bp.pass(x, Op::Layout(Layout::Transpose { x: dy, perm: inv }))?;
        }
        Layout::Concat { a, b, axis } => {
            let la = bp.meta(a).0.dim(axis as usize) as u32;
            for (x, start) in [(a, 0), (b, la)] {
                bp.pass(x, Op::Layout(Layout::Slice { x: dy, axis, start }))?;
            }
        }
        Layout::Slice { x, axis, start } => {
            bp.pass(
                x,
                Op::Layout(Layout::Pad {
                    x: dy,
                    axis,
                    before: start,
                }),
            )?;
        }
        Layout::Pad { x, axis, before } => {
            bp.pass(
                x,
                Op::Layout(Layout::Slice {
                    x: dy,
                    axis,
                    start: before,
                }),
            )?;
        }
    }
    Ok(())
}
