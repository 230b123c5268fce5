//! Gathering rows of a table by index (embedding lookup; ONNX `Gather` on axis 0), its
//! gradient (a scatter-add of the rows' gradients into the table's shape), and one-hot
//! encoding.

use crate::autodiff::Backprop;
use crate::error::{GraphError, RunError};
use crate::graph::{Graph, Init, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::shape_for;
use crate::run::Exec;
use crate::storage::Storage;
use crate::{DType, Roles, MAX_RANK};

/// Gather ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Gather {
    /// `out[i..., :] = table[indices[i...], :]`: shape `indices ++ table[1..]`.
    Rows {
        /// The table (`[rows, ...]`).
        table: NodeId,
        /// Integer indices.
        indices: NodeId,
    },
    /// `out = zeros(table); out[indices[i...], :] += dy[i..., :]` (the node has the table's
    /// shape): the gradient of [`Gather::Rows`].
    ScatterAdd {
        /// Upstream gradient (`indices ++ table[1..]`).
        dy: NodeId,
        /// The indices.
        indices: NodeId,
    },
    /// `out[i..., c] = 1` where `c == indices[i...]`, else 0 (the node's last axis is the
    /// depth).
    OneHot {
        /// Integer indices.
        indices: NodeId,
    },
}

impl Gather {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Gather::Rows { .. } => "Gather",
            Gather::ScatterAdd { .. } => "ScatterAdd",
            Gather::OneHot { .. } => "OneHot",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Gather::Rows { table, indices } => Operands::of(&[table, indices]),
            Gather::ScatterAdd { dy, indices } => Operands::of(&[dy, indices]),
            Gather::OneHot { indices } => Operands::of(&[indices]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let g = *self;
        match g {
            Gather::Rows { table, indices } => Gather::Rows {
                table: f(table),
                indices: f(indices),
            },
            Gather::ScatterAdd { dy, indices } => Gather::ScatterAdd {
                dy: f(dy),
                indices: f(indices),
            },
            Gather::OneHot { indices } => Gather::OneHot {
                indices: f(indices),
            },
        }
    }
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Rows of `table` picked by the integer `indices` (ONNX `Gather`, axis 0).
    pub fn gather(
        &mut self,
        name: &str,
        table: impl NodeRef,
        indices: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (table, indices) = (table.resolve(self)?, indices.resolve(self)?);
        let n = self.check_name(name)?;
        let (st, si) = (self.node(table).shape, self.node(indices).shape);
        let it = self.node(indices).dtype;
        if !matches!(it, DType::I32 | DType::U8) {
            return Err(GraphError::DTypeMismatch {
                node: n,
                op: "Gather",
                expected: "i32 or u8 indices",
                found: it,
            });
        }
        if st.rank() == 0 || si.rank() + st.rank() - 1 > MAX_RANK {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "Gather",
                rule: "the table must have rank at least 1, and indices + table rows at most the maximum rank",
                left: st,
                right: si,
            });
        }
        let mut dims = [0usize; MAX_RANK];
        let r = si.rank();
        for (d, &x) in dims.iter_mut().zip(si.dims()) {
            *d = x as usize;
        }
        for (i, &x) in st.dims()[1..].iter().enumerate() {
            dims[r + i] = x as usize;
        }
        let shape = shape_for(name, &dims[..r + st.rank() - 1])?;
        let dtype = self.node(table).dtype;
        self.push(
            n,
            Op::Gather(Gather::Rows { table, indices }),
            shape,
            dtype,
            Roles::ACTIVATION,
        )
    }

    /// Keras' `Embedding`: a table `name/embeddings:0` of `vocabulary x dim` (uniform in
    /// [-0.05, 0.05], Keras' default) and the rows `indices` pick.
    pub fn embedding(
        &mut self,
        name: &str,
        indices: impl NodeRef,
        vocabulary: usize,
        dim: usize,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let indices = indices.resolve(self)?;
        let table = self.variable(
            &crate::error::derived(name, format_args!("/embeddings:0"))?,
            &[vocabulary, dim],
            dtype,
            Init::Uniform {
                low: -0.05,
                high: 0.05,
            },
        )?;
        self.gather(name, table, indices)
    }

    /// One-hot encoding of integer `indices` into `depth` classes (a new last axis).
    pub fn one_hot(
        &mut self,
        name: &str,
        indices: impl NodeRef,
        depth: usize,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        let indices = indices.resolve(self)?;
        let n = self.check_name(name)?;
        let si = self.node(indices).shape;
        let mut dims = [0usize; MAX_RANK + 1];
        for (d, &x) in dims.iter_mut().zip(si.dims()) {
            *d = x as usize;
        }
        dims[si.rank()] = depth;
        let shape = shape_for(name, &dims[..si.rank() + 1])?;
        self.push(
            n,
            Op::Gather(Gather::OneHot { indices }),
            shape,
            dtype,
            Roles::ACTIVATION,
        )
    }
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Gather,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let t = node.dtype;
    let es = t.size();
    let out = &mut *ex.out;
    let bad = |position: usize, index: i64, len: usize| RunError::IndexOutOfRange {
        node: node.name.clone(),
        position,
        index,
        len,
    };
    match *op {
        Gather::Rows { table, indices } => {
            let (tb, st) = (ex.ins.bytes(table), ex.ins.shape(table));
            let (ib, it) = (ex.ins.bytes(indices), ex.ins.dtype(indices));
            let rows = st.dim(0);
            let row = st.elements() / rows * es;
            for (i, chunk) in out.chunks_exact_mut(row).enumerate() {
                let r = k::load_int(ib, it, i);
                if r < 0 || r as u64 >= rows as u64 {
                    return Err(bad(i, r, rows));
                }
                let r = r as usize;
                chunk.copy_from_slice(&tb[r * row..(r + 1) * row]);
            }
        }
        Gather::ScatterAdd { dy, indices } => {
            let gb = ex.ins.bytes(dy);
            let (ib, it) = (ex.ins.bytes(indices), ex.ins.dtype(indices));
            let rows = node.shape.dim(0);
            let row = node.shape.elements() / rows;
            out.fill(0);
            for i in 0..ex.ins.shape(indices).elements() {
                let r = k::load_int(ib, it, i);
                if r < 0 || r as u64 >= rows as u64 {
                    return Err(bad(i, r, rows));
                }
                let base = r as usize * row;
                for c in 0..row {
                    let v = k::load(out, t, base + c) + k::load(gb, t, i * row + c);
                    k::store(out, t, base + c, v);
                }
            }
        }
        Gather::OneHot { indices } => {
            let (ib, it) = (ex.ins.bytes(indices), ex.ins.dtype(indices));
            let depth = node.shape.last();
            for i in 0..node.shape.rows() {
                let c = k::load_int(ib, it, i);
                for j in 0..depth {
                    k::store(out, t, i * depth + j, if c == j as i64 { 1.0 } else { 0.0 });
                }
            }
        }
    }
    Ok(())
}

/// The gradient: a scatter-add into the table.
pub(crate) fn backward<S: Storage>(
    op: &Gather,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    match *op {
        Gather::Rows { table, indices } => {
            bp.pass(table, Op::Gather(Gather::ScatterAdd { dy, indices }))?;
            Ok(())
        }
        Gather::OneHot { .. } => Ok(()),
        Gather::ScatterAdd { .. } => Err(bp.not_differentiable(id)),
    }
}
