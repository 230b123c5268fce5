//! Losses: sparse categorical cross-entropy (over `[batch, classes]` or `[batch, seq, classes]`,
//! optionally ignoring one label, as masked language models need) and mean squared error.

use crate::autodiff::Backprop;
use crate::error::{derived, name_lossy, GraphError, RunError};
use crate::graph::{Graph, Node, NodeId, NodeRef};
use crate::kernels as k;
use crate::op::{Op, Operands};
use crate::ops::softmax::Softmax;
use crate::run::Exec;
use crate::storage::Storage;
use crate::{DType, Roles, Shape};

/// Losses and their gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Loss {
    /// Mean of `-log p[label]` over the positions whose label is not `ignore_index`: a scalar.
    /// With `from_logits` the operand is logits (log-softmax is applied inside); otherwise it
    /// is probabilities, clipped to [1e-7, 1 - 1e-7] as Keras does.
    SparseCrossEntropy {
        /// Probabilities or logits, `[..., classes]`.
        x: NodeId,
        /// Integer labels, `x`'s shape without the last axis.
        labels: NodeId,
        /// Whether `x` holds logits.
        from_logits: bool,
        /// A label that contributes nothing (padding, unmasked tokens).
        ignore_index: Option<i32>,
    },
    /// Gradient of [`Loss::SparseCrossEntropy`] with respect to `x`, scaled by the scalar
    /// `dloss`. With `from_logits` this is the fused form `(softmax(x) - onehot) / count`.
    SparseCrossEntropyGrad {
        /// The forward operand (probabilities or logits).
        x: NodeId,
        /// The labels.
        labels: NodeId,
        /// Upstream scalar gradient.
        dloss: NodeId,
        /// Whether `x` holds logits.
        from_logits: bool,
        /// The ignored label.
        ignore_index: Option<i32>,
    },
}

impl Loss {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Loss::SparseCrossEntropy { .. } => "SparseCategoricalCrossentropy",
            Loss::SparseCrossEntropyGrad { .. } => "SparseCategoricalCrossentropyGrad",
        }
    }

    /// Operands.
    pub fn operands(&self) -> Operands {
        match *self {
            Loss::SparseCrossEntropy { x, labels, .. } => Operands::of(&[x, labels]),
            Loss::SparseCrossEntropyGrad {
                x, labels, dloss, ..
            } => Operands::of(&[x, labels, dloss]),
        }
    }

    /// The same op reading `f(o)` for each operand `o` (a copy of a node elsewhere in the
    /// graph, as recomputation makes).
    pub(crate) fn map_operands(&self, f: &mut dyn FnMut(NodeId) -> NodeId) -> Self {
        let l = *self;
        match l {
            Loss::SparseCrossEntropy {
                x,
                labels,
                from_logits,
                ignore_index,
            } => Loss::SparseCrossEntropy {
                x: f(x),
                labels: f(labels),
                from_logits,
                ignore_index,
            },
            Loss::SparseCrossEntropyGrad {
                x,
                labels,
                dloss,
                from_logits,
                ignore_index,
            } => Loss::SparseCrossEntropyGrad {
                x: f(x),
                labels: f(labels),
                dloss: f(dloss),
                from_logits,
                ignore_index,
            },
        }
    }
}

/// Builders.
impl<S: Storage> Graph<S> {
    /// Sparse categorical cross-entropy: the mean of `-log p[label]`, a scalar loss. `x` is
    /// `[batch, classes]` (or `[batch, seq, classes]`) probabilities, or logits with
    /// `from_logits`; `labels` has `x`'s shape without the last axis, `i32` or `u8`. The loss
    /// is an output.
    pub fn sparse_categorical_crossentropy(
        &mut self,
        name: &str,
        x: impl NodeRef,
        labels: impl NodeRef,
        from_logits: bool,
    ) -> Result<NodeId, GraphError> {
        self.sparse_categorical_crossentropy_ignoring(name, x, labels, from_logits, None)
    }

    /// [`Graph::sparse_categorical_crossentropy`] where positions labelled `ignore_index`
    /// contribute nothing and the mean is over the others (PyTorch's `ignore_index`, Keras'
    /// `ignore_class`).
    pub fn sparse_categorical_crossentropy_ignoring(
        &mut self,
        name: &str,
        x: impl NodeRef,
        labels: impl NodeRef,
        from_logits: bool,
        ignore_index: Option<i32>,
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
        if sx.rank() < 2 || sl != sx.without_axis(sx.rank() - 1) {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op,
                rule: "x must be (batch, [seq,] classes) and labels x's shape without classes",
                left: sx,
                right: sl,
            });
        }
        let dtype = self.node(x).dtype;
        let op = Op::Loss(Loss::SparseCrossEntropy {
            x,
            labels,
            from_logits,
            ignore_index,
        });
        self.push(n, op, Shape::scalar(), dtype, Roles::LOSS | Roles::OUTPUT)
    }

    /// Mean squared error `mean((pred - target)^2)`, a scalar loss, built from a subtraction
    /// (`name/diff`), a square (`name/square`) and a mean (`name`).
    pub fn mean_squared_error(
        &mut self,
        name: &str,
        pred: impl NodeRef,
        target: impl NodeRef,
    ) -> Result<NodeId, GraphError> {
        let (p, t) = (pred.resolve(self)?, target.resolve(self)?);
        let (sp, st) = (self.node(p).shape, self.node(t).shape);
        if sp != st {
            return Err(GraphError::ShapeMismatch {
                node: name_lossy(name),
                op: "MeanSquaredError",
                rule: "prediction and target must have the same shape",
                left: sp,
                right: st,
            });
        }
        let d = self.sub(&derived(name, format_args!("/diff"))?, p, t)?;
        let sq = self.mul(&derived(name, format_args!("/square"))?, d, d)?;
        let loss = self.reduce_mean(name, sq, None)?;
        self.add_roles(loss, Roles::LOSS | Roles::OUTPUT)?;
        Ok(loss)
    }
}

/// Keras' clip for probabilities fed to a cross-entropy.
const PROB_EPS: f32 = 1e-7;

/// The label of row `r`, `None` when ignored, or the error for one out of range.
fn label(
    labels: &[u8],
    lt: DType,
    r: usize,
    cols: usize,
    ignore: Option<i32>,
) -> Result<Option<usize>, (usize, i64)> {
    let l = k::load_int(labels, lt, r);
    if ignore.is_some_and(|i| i64::from(i) == l) {
        return Ok(None);
    }
    if l < 0 || l as u64 >= cols as u64 {
        Err((r, l))
    } else {
        Ok(Some(l as usize))
    }
}

/// `log(sum(exp(row)))`, computed stably.
fn log_sum_exp(x: &[u8], t: DType, base: usize, cols: usize) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for c in 0..cols {
        max = max.max(k::load(x, t, base + c));
    }
    let mut sum = 0f32;
    for c in 0..cols {
        sum += libm::expf(k::load(x, t, base + c) - max);
    }
    max + libm::logf(sum)
}

/// Rows whose label counts.
fn counted(labels: &[u8], lt: DType, rows: usize, ignore: Option<i32>) -> usize {
    match ignore {
        None => rows,
        Some(i) => (0..rows)
            .filter(|&r| k::load_int(labels, lt, r) != i64::from(i))
            .count(),
    }
}

/// The reference kernel.
pub(crate) fn run<S: Storage>(
    op: &Loss,
    node: &Node,
    ex: &mut Exec<'_, S>,
) -> Result<(), RunError> {
    let bad = |(row, label): (usize, i64), classes: usize| RunError::LabelOutOfRange {
        node: node.name.clone(),
        row,
        label,
        classes,
    };
    match *op {
        Loss::SparseCrossEntropy {
            x,
            labels,
            from_logits,
            ignore_index,
        } => {
            let (sx, t, lt) = (ex.ins.shape(x), ex.ins.dtype(x), ex.ins.dtype(labels));
            let (xb, lb) = (ex.ins.bytes(x), ex.ins.bytes(labels));
            let (rows, cols) = (sx.rows(), sx.last());
            let mut total = 0f32;
            for r in 0..rows {
                let Some(l) = label(lb, lt, r, cols, ignore_index).map_err(|e| bad(e, cols))?
                else {
                    continue;
                };
                let base = r * cols;
                total += if from_logits {
                    log_sum_exp(xb, t, base, cols) - k::load(xb, t, base + l)
                } else {
                    -libm::logf(k::load(xb, t, base + l).clamp(PROB_EPS, 1.0 - PROB_EPS))
                };
            }
            let n = counted(lb, lt, rows, ignore_index);
            let mean = if n == 0 { 0.0 } else { total / n as f32 };
            k::store(ex.out, node.dtype, 0, mean);
        }
        Loss::SparseCrossEntropyGrad {
            x,
            labels,
            dloss,
            from_logits,
            ignore_index,
        } => {
            let (t, lt) = (node.dtype, ex.ins.dtype(labels));
            let (xb, lb) = (ex.ins.bytes(x), ex.ins.bytes(labels));
            let dl = k::load(ex.ins.bytes(dloss), ex.ins.dtype(dloss), 0);
            let (rows, cols) = (node.shape.rows(), node.shape.last());
            let n = counted(lb, lt, rows, ignore_index).max(1);
            let scale = dl / n as f32;
            let out = &mut *ex.out;
            for r in 0..rows {
                let l = label(lb, lt, r, cols, ignore_index).map_err(|e| bad(e, cols))?;
                let base = r * cols;
                let Some(l) = l else {
                    (0..cols).for_each(|c| k::store(out, t, base + c, 0.0));
                    continue;
                };
                if from_logits {
                    let lse = log_sum_exp(xb, t, base, cols);
                    for c in 0..cols {
                        let p = libm::expf(k::load(xb, t, base + c) - lse);
                        let onehot = if c == l { 1.0 } else { 0.0 };
                        k::store(out, t, base + c, (p - onehot) * scale);
                    }
                } else {
                    for c in 0..cols {
                        let p = k::load(xb, t, base + c);
                        // The clip has zero gradient outside its range.
                        let g = if c == l && (PROB_EPS..=1.0 - PROB_EPS).contains(&p) {
                            -scale / p
                        } else {
                            0.0
                        };
                        k::store(out, t, base + c, g);
                    }
                }
            }
        }
    }
    Ok(())
}

/// The gradient. A softmax (over the last axis) feeding the loss is skipped, and the gradient
/// goes straight to its logits in the fused form; other users of the softmax still
/// backpropagate through it, and their contributions add up at the logits.
pub(crate) fn backward<S: Storage>(
    op: &Loss,
    bp: &mut Backprop<'_, S>,
    id: NodeId,
    dy: NodeId,
) -> Result<(), GraphError> {
    let Loss::SparseCrossEntropy {
        x,
        labels,
        from_logits,
        ignore_index,
    } = *op
    else {
        return Err(bp.not_differentiable(id));
    };
    let last = bp.meta(x).0.rank() as u8 - 1;
    let (target, from_logits) = match bp.graph.node(x).op {
        Op::Softmax(Softmax::Forward { x: z, axis })
            if !from_logits && axis == last && bp.wants(z) =>
        {
            (z, true)
        }
        _ => (x, from_logits),
    };
    bp.pass(
        target,
        Op::Loss(Loss::SparseCrossEntropyGrad {
            x: target,
            labels,
            dloss: dy,
            from_logits,
            ignore_index,
        }),
    )
}
