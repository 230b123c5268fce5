//! The op families. Each module holds, for its family: the op enum, the builders on
//! [`Graph`](crate::Graph) with their shape rules, the reference kernel and the gradient.
//!
//! # Adding an op
//!
//! The matches that run, differentiate, lower, lay out and cost an op or an element-wise
//! function have no wildcard arm, in the core or in the simulator's lowering, so the compiler
//! names every place a new op or function must be handled: an op without a kernel, a
//! gradient rule, a lowering and a cost does not build. (Predicates that pick out a few ops,
//! `matches!` and `if let`, still have their default.)
//!
//! An element-wise function ([`UnaryFn`](elementwise::UnaryFn),
//! [`BinaryFn`](elementwise::BinaryFn), [`TernaryFn`](elementwise::TernaryFn)):
//! 1. core, `ops/elementwise.rs`: the variant, its formula (`apply`), its name (`name`) and
//!    its derivative (`backward`);
//! 2. simulator, `lower/elementwise.rs`: its cost (`unary_kind` for a unary function; for a
//!    binary one its vertex type in `binary_type` and what it computes beyond an add in
//!    `binary_extra`; for a ternary one its vertex type);
//! 3. to import it from ONNX, host, `onnx/import/ops/`: a converter in its family's module,
//!    listed in that module's table of converters (`docs/onnx.md`'s op table is made from
//!    the tables: the host's unit test `the_docs_op_table_is_the_registrys` prints the new
//!    table when it differs), and `scripts/make_onnx_node_tests.py` run again to take in
//!    ONNX's own test cases of the op.
//!
//! A new op of a family, or a new family:
//! 1. core: the variant (in the family's enum, with its arms in the family's `operands` and
//!    `map_operands`; or a new [`Op`] variant in `op.rs` with its `name`, `operands` and
//!    `map_operands` arms forwarding to the family), the family's module here (builders on
//!    [`Graph`](crate::Graph) with their shape rules, the reference kernel, the gradient),
//!    and, for a new family, its arms in `run` and `backward` below;
//! 2. simulator, `lower/`: the family's `placement` and `lower` (its vertices, their cycles
//!    from named constants in `cost.rs`), dispatched from `lower/mod.rs` (`layout_of`,
//!    `lower_op`);
//! 3. host: its ONNX converter as above, and, if model files name it, its layer in
//!    `model.rs`.

use crate::error::GraphError;
use crate::graph::{Node, NodeId};
use crate::op::Op;
use crate::run::Exec;
use crate::storage::Storage;
use crate::{RunError, Shape, MAX_RANK};

pub mod conv;
pub mod elementwise;
pub mod gather;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod pool;
pub mod random;
pub mod reduce;
pub mod softmax;
pub mod update;

/// Runs one non-update node's kernel: the one place ops dispatch to their family.
pub(crate) fn run<S: Storage>(node: &Node, ex: &mut Exec<'_, S>) -> Result<(), RunError> {
    match node.op {
        Op::Input | Op::Variable { .. } | Op::Constant { .. } | Op::Update(_) => Ok(()),
        Op::Elementwise(e) => elementwise::run(&e, node, ex),
        Op::MatMul(m) => matmul::run(&m, node, ex),
        Op::Softmax(s) => softmax::run(&s, node, ex),
        Op::Loss(l) => loss::run(&l, node, ex),
        Op::Reduce(r) => reduce::run(&r, node, ex),
        Op::Layout(l) => layout::run(&l, node, ex),
        Op::Conv(c) => conv::run(&c, node, ex),
        Op::Pool(p) => pool::run(&p, node, ex),
        Op::Norm(n) => norm::run(&n, node, ex),
        Op::Gather(g) => gather::run(&g, node, ex),
        Op::Random(r) => random::run(&r, node, ex),
    }
}

/// Bytes of arena workspace a node's kernel needs while it runs (0 for most ops).
pub(crate) fn workspace_bytes<S: Storage>(graph: &crate::Graph<S>, node: &Node) -> usize {
    match node.op {
        Op::Conv(c) => conv::workspace_bytes(graph, node, &c),
        Op::Input
        | Op::Variable { .. }
        | Op::Constant { .. }
        | Op::Elementwise(_)
        | Op::MatMul(_)
        | Op::Softmax(_)
        | Op::Loss(_)
        | Op::Reduce(_)
        | Op::Layout(_)
        | Op::Pool(_)
        | Op::Norm(_)
        | Op::Gather(_)
        | Op::Random(_)
        | Op::Update(_) => 0,
    }
}

/// Appends the gradient of node `id` (whose upstream gradient is `dy`) to the graph: the one
/// place autodiff dispatches to the families.
pub(crate) fn backward<S: Storage>(
    bp: &mut crate::autodiff::Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    let op = bp.graph.node(id).op;
    match op {
        Op::Input | Op::Variable { .. } | Op::Constant { .. } => Ok(()),
        Op::Elementwise(e) => elementwise::backward(&e, bp, id, dy),
        Op::MatMul(m) => matmul::backward(&m, bp, id, dy),
        Op::Softmax(s) => softmax::backward(&s, bp, id, dy),
        Op::Loss(l) => loss::backward(&l, bp, id, dy),
        Op::Reduce(r) => reduce::backward(&r, bp, id, dy),
        Op::Layout(l) => layout::backward(&l, bp, id, dy),
        Op::Conv(c) => conv::backward(&c, bp, id, dy),
        Op::Pool(p) => pool::backward(&p, bp, id, dy),
        Op::Norm(n) => norm::backward(&n, bp, id, dy),
        Op::Gather(g) => gather::backward(&g, bp, id, dy),
        // A random mask depends on no variable.
        Op::Random(_) => Ok(()),
        Op::Update(_) => Err(bp.not_differentiable(id)),
    }
}

/// A set of axes (bit `i` is axis `i`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Axes(pub u8);

impl Axes {
    /// No axis.
    pub const NONE: Axes = Axes(0);

    /// Every axis of a rank-`rank` tensor.
    pub const fn all(rank: usize) -> Axes {
        Axes(((1u16 << rank) - 1) as u8)
    }

    /// One axis.
    pub const fn one(axis: usize) -> Axes {
        Axes(1 << axis)
    }

    /// The axes listed (each below [`MAX_RANK`]; checked by the builders).
    pub fn of(list: &[usize]) -> Axes {
        Axes(list.iter().fold(0u8, |m, &a| m | (1u8 << (a & 7))))
    }

    /// Whether `axis` is in the set.
    pub const fn contains(self, axis: usize) -> bool {
        axis < 8 && self.0 & (1 << axis) != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The highest axis in the set plus one (0 when empty).
    pub const fn end(self) -> usize {
        8 - self.0.leading_zeros() as usize
    }
}

/// Dimensions as `usize`s, padded on the left with 1s to `rank` (numpy's alignment).
pub(crate) fn aligned(shape: Shape, rank: usize) -> [usize; MAX_RANK] {
    let mut out = [1usize; MAX_RANK];
    let pad = rank - shape.rank();
    for (i, &d) in shape.dims().iter().enumerate() {
        out[pad + i] = d as usize;
    }
    out
}

/// The numpy broadcast of two shapes, or `None` when a pair of dimensions differs and neither
/// is 1.
pub fn broadcast_shapes(a: Shape, b: Shape) -> Option<Shape> {
    let rank = a.rank().max(b.rank());
    let (da, db) = (aligned(a, rank), aligned(b, rank));
    let mut out = [1usize; MAX_RANK];
    for i in 0..rank {
        out[i] = match (da[i], db[i]) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Shape::new(&out[..rank]).ok()
}

/// Row-major strides of `shape` seen as a tensor of rank `out.rank()` broadcast to `out`:
/// 0 on broadcast axes.
fn broadcast_strides(shape: Shape, out: Shape) -> [usize; MAX_RANK] {
    let rank = out.rank();
    let dims = aligned(shape, rank);
    let mut strides = [0usize; MAX_RANK];
    let mut s = 1;
    for i in (0..rank).rev() {
        strides[i] = if dims[i] == 1 && out.dim(i) != 1 {
            0
        } else {
            s
        };
        s *= dims[i];
    }
    strides
}

/// Calls `f(out_index, operand_indices)` for every element of `out` in row-major order, with
/// each operand's element index under numpy broadcasting.
pub(crate) fn broadcast_walk<const K: usize>(
    out: Shape,
    operands: [Shape; K],
    mut f: impl FnMut(usize, [usize; K]),
) {
    let rank = out.rank();
    if rank == 0 {
        f(0, [0; K]);
        return;
    }
    let strides: [[usize; MAX_RANK]; K] = operands.map(|s| broadcast_strides(s, out));
    let dims = out.dims();
    let last = rank - 1;
    let inner = dims[last] as usize;
    let mut counter = [0usize; MAX_RANK];
    let mut base = [0usize; K];
    let mut o = 0;
    let rows = out.elements() / inner;
    for _ in 0..rows {
        let mut idx = base;
        for _ in 0..inner {
            f(o, idx);
            o += 1;
            for k in 0..K {
                idx[k] += strides[k][last];
            }
        }
        // Advance the outer counters.
        let mut axis = last;
        while axis > 0 {
            axis -= 1;
            counter[axis] += 1;
            for k in 0..K {
                base[k] += strides[k][axis];
            }
            if counter[axis] < dims[axis] as usize {
                break;
            }
            for k in 0..K {
                base[k] -= strides[k][axis] * counter[axis];
            }
            counter[axis] = 0;
        }
    }
}

/// Calls `f(base, dims, strides)` for each group of elements that share their coordinates
/// outside `axes`, in row-major order of those coordinates: `base` is the group's first
/// element, and `dims` / `strides` walk the group over `axes` (with
/// [`layout::walk_offsets`]).
pub(crate) fn for_each_group(s: Shape, axes: Axes, mut f: impl FnMut(usize, &[usize], &[usize])) {
    let st = strides(s);
    let (mut kd, mut ks, mut rd, mut rs) =
        ([0; MAX_RANK], [0; MAX_RANK], [0; MAX_RANK], [0; MAX_RANK]);
    let (mut nk, mut nr) = (0, 0);
    for (i, &stride) in st.iter().enumerate().take(s.rank()) {
        if axes.contains(i) {
            (rd[nr], rs[nr]) = (s.dim(i), stride);
            nr += 1;
        } else {
            (kd[nk], ks[nk]) = (s.dim(i), stride);
            nk += 1;
        }
    }
    layout::walk_offsets(&kd[..nk], &ks[..nk], |base| f(base, &rd[..nr], &rs[..nr]));
}

/// Row-major strides of a shape.
pub(crate) fn strides(shape: Shape) -> [usize; MAX_RANK] {
    let mut s = [0usize; MAX_RANK];
    let mut acc = 1;
    for i in (0..shape.rank()).rev() {
        s[i] = acc;
        acc *= shape.dim(i);
    }
    s
}

/// A shape from `usize` dimensions, as a build-time error naming `node` when invalid.
pub(crate) fn shape_for(node: &str, dims: &[usize]) -> Result<Shape, GraphError> {
    Shape::new(dims).map_err(|reason| GraphError::BadShape {
        node: crate::error::name_lossy(node),
        reason,
    })
}

/// The dims of `s` as `usize`s (and the rank).
pub(crate) fn dims_of(s: Shape) -> ([usize; MAX_RANK], usize) {
    let mut d = [1usize; MAX_RANK];
    for (o, &x) in d.iter_mut().zip(s.dims()) {
        *o = x as usize;
    }
    (d, s.rank())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[usize]) -> Shape {
        Shape::new(d).unwrap()
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shapes(s(&[2, 3, 1, 5]), s(&[4, 1])),
            Some(s(&[2, 3, 4, 5]))
        );
        assert_eq!(broadcast_shapes(s(&[3]), s(&[])), Some(s(&[3])));
        assert_eq!(broadcast_shapes(s(&[2, 3]), s(&[3, 2])), None);
    }

    #[test]
    fn walk_visits_operand_elements_as_numpy_does() {
        // out (2, 3): a (2, 1), b (3,)
        let mut seen = [[0usize; 2]; 6];
        broadcast_walk(s(&[2, 3]), [s(&[2, 1]), s(&[3])], |o, [a, b]| {
            seen[o] = [a, b]
        });
        assert_eq!(seen, [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]);
    }

    #[test]
    fn axes_sets() {
        let a = Axes::of(&[1, 3]);
        assert!(a.contains(1) && a.contains(3) && !a.contains(0));
        assert_eq!(a.end(), 4);
        assert_eq!(Axes::all(3), Axes(0b111));
    }
}
