//! Reverse-mode autodiff: a forward graph plus a scalar loss becomes a static training graph,
//! with the optimizer's weight update applied as a graph transform.
//!
//! The backward pass is appended to the same graph in reverse topological order. Each
//! variable's update is placed right after its gradient is final (after its earliest consumer's
//! backward), so a weight gradient lives only as long as it must.

use core::fmt::Write;

use crate::error::{derived, GraphError, Name};
use crate::graph::{Graph, Init, NodeId, NodeRef};
use crate::op::Op;
use crate::ops::elementwise::{BinaryFn, Elementwise};
use crate::ops::layout::Layout;
use crate::ops::reduce::{Reduce, ReduceKind};
use crate::ops::update::Update;
use crate::ops::Axes;
use crate::storage::{Buffer, Storage};
use crate::{DType, Roles, Shape};

/// The optimizer a training graph applies once per step.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Optimizer {
    /// Plain SGD: `w -= lr * g`.
    Sgd {
        /// Learning rate.
        learning_rate: f32,
    },
    /// SGD with momentum (Keras form): `v = momentum * v - lr * g; w += v`.
    Momentum {
        /// Learning rate.
        learning_rate: f32,
        /// Momentum in [0, 1).
        momentum: f32,
    },
    /// Adam (Keras form, with bias correction).
    Adam {
        /// Learning rate.
        learning_rate: f32,
        /// First-moment decay in [0, 1).
        beta1: f32,
        /// Second-moment decay in [0, 1).
        beta2: f32,
        /// Denominator fuzz, > 0.
        epsilon: f32,
    },
    /// LAMB: Adam's moments with a per-tensor trust ratio and decoupled weight decay (the
    /// optimizer of Graphcore's BERT pre-training; [`Update::Lamb`]).
    Lamb {
        /// Learning rate.
        learning_rate: f32,
        /// First-moment decay in [0, 1).
        beta1: f32,
        /// Second-moment decay in [0, 1).
        beta2: f32,
        /// Denominator fuzz, > 0.
        epsilon: f32,
        /// Decoupled weight decay, >= 0.
        weight_decay: f32,
    },
    /// LARS: momentum SGD with a per-tensor trust ratio ([`Update::Lars`]).
    Lars {
        /// Learning rate.
        learning_rate: f32,
        /// Momentum in [0, 1).
        momentum: f32,
        /// Weight decay, >= 0.
        weight_decay: f32,
        /// Trust coefficient, > 0.
        eta: f32,
    },
}

impl Optimizer {
    /// SGD at `learning_rate`.
    pub const fn sgd(learning_rate: f32) -> Self {
        Optimizer::Sgd { learning_rate }
    }

    /// Momentum SGD.
    pub const fn momentum(learning_rate: f32, momentum: f32) -> Self {
        Optimizer::Momentum {
            learning_rate,
            momentum,
        }
    }

    /// Adam with Keras' defaults (beta1 0.9, beta2 0.999, epsilon 1e-7).
    pub const fn adam(learning_rate: f32) -> Self {
        Optimizer::Adam {
            learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-7,
        }
    }

    /// LAMB with the defaults of Graphcore's BERT pre-training (beta1 0.9, beta2 0.999,
    /// epsilon 1e-6, weight decay 0.01).
    pub const fn lamb(learning_rate: f32) -> Self {
        Optimizer::Lamb {
            learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-6,
            weight_decay: 0.01,
        }
    }

    /// LARS with momentum 0.9, weight decay 1e-4 and trust coefficient 0.001 (You et al.).
    pub const fn lars(learning_rate: f32) -> Self {
        Optimizer::Lars {
            learning_rate,
            momentum: 0.9,
            weight_decay: 1e-4,
            eta: 0.001,
        }
    }

    fn check(&self) -> Result<(), GraphError> {
        let positive = |name, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(GraphError::BadHyperParameter { name, value: v })
            }
        };
        let non_negative = |name, v: f32| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(GraphError::BadHyperParameter { name, value: v })
            }
        };
        let unit = |name, v: f32| {
            if (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err(GraphError::BadHyperParameter { name, value: v })
            }
        };
        match *self {
            Optimizer::Sgd { learning_rate } => positive("learning_rate", learning_rate),
            Optimizer::Momentum {
                learning_rate,
                momentum,
            } => {
                positive("learning_rate", learning_rate)?;
                unit("momentum", momentum)
            }
            Optimizer::Adam {
                learning_rate,
                beta1,
                beta2,
                epsilon,
            } => {
                positive("learning_rate", learning_rate)?;
                unit("beta1", beta1)?;
                unit("beta2", beta2)?;
                positive("epsilon", epsilon)
            }
            Optimizer::Lamb {
                learning_rate,
                beta1,
                beta2,
                epsilon,
                weight_decay,
            } => {
                positive("learning_rate", learning_rate)?;
                unit("beta1", beta1)?;
                unit("beta2", beta2)?;
                positive("epsilon", epsilon)?;
                non_negative("weight_decay", weight_decay)
            }
            Optimizer::Lars {
                learning_rate,
                momentum,
                weight_decay,
                eta,
            } => {
                positive("learning_rate", learning_rate)?;
                unit("momentum", momentum)?;
                non_negative("weight_decay", weight_decay)?;
                positive("eta", eta)
            }
        }
    }

    /// Optimizer-state tensors kept per trainable variable (0 for SGD, 1 momentum, 2 Adam).
    pub const fn slots_per_variable(&self) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Momentum { .. } | Optimizer::Lars { .. } => 1,
            Optimizer::Adam { .. } | Optimizer::Lamb { .. } => 2,
        }
    }
}

/// How micro-batches' gradients combine in their accumulators (Graphcore's
/// `GradientAccumulationReductionMethod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AccumulationMethod {
    /// `acc += g`.
    #[default]
    Sum,
    /// `acc += g / M`.
    Mean,
    /// `acc = acc * n / (n + 1) + g / (n + 1)`, `n` the micro-batches so far.
    RunningMean,
}

impl AccumulationMethod {
    /// The name Graphcore's API uses.
    pub const fn name(self) -> &'static str {
        match self {
            AccumulationMethod::Sum => "SUM",
            AccumulationMethod::Mean => "MEAN",
            AccumulationMethod::RunningMean => "RUNNING_MEAN",
        }
    }
}

/// Gradient accumulation: one weight update per `count` micro-batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Accumulation {
    /// Micro-batches per weight update (M).
    pub count: u32,
    /// How gradients combine.
    pub method: AccumulationMethod,
    /// Element type of the accumulators (`None`: the variable's; `Some(F32)` keeps fp32
    /// accumulators for fp16 gradients).
    pub dtype: Option<DType>,
}

impl Accumulation {
    /// `count` micro-batches per update, summed, in the variables' type.
    pub const fn new(count: u32) -> Self {
        Accumulation {
            count,
            method: AccumulationMethod::Sum,
            dtype: None,
        }
    }
}

/// The state of a backward pass while the families append their gradients: what each node's
/// gradient is so far, and which nodes need one.
pub(crate) struct Backprop<'g, S: Storage> {
    pub(crate) graph: &'g mut Graph<S>,
    grad: S::Vec<Option<NodeId>>,
    count: S::Vec<u32>,
    relevant: S::Vec<bool>,
    /// Recomputed copies of forward nodes (made after the forward pass, in increasing order)
    /// with the nodes they copy: a copy's gradient is its original's.
    clones: S::Vec<(NodeId, NodeId)>,
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
fn backward_pass<S: Storage>(
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
        // Backward nodes belong to the stage of the node they differentiate.
        bp.graph.current_stage = bp.graph.nodes[i].stage;
        if let Some(dy) = bp.grad[i] {
            crate::ops::backward(bp, at, dy)?;
        }
        updates.variables_of(bp, i)?;
    }
    Ok(())
}

/// Each forward node's recomputation segment (the checkpoint closing it) and whether it is
/// recomputed.
type Segments<S> = (<S as Storage>::Vec<u32>, <S as Storage>::Vec<bool>);

/// What the backward pass does with a trainable variable's gradient once it is final: the
/// optimizer's update, or (accumulating) its accumulation, a stage's partial of a gradient
/// split over stages included.
struct Updates<'a, S: Storage> {
    optimizer: Optimizer,
    /// The optimizer's step counter (Adam, LAMB).
    step: Option<NodeId>,
    accumulation: Accumulation,
    /// Each stage's micro-batch counter (accumulating).
    counters: &'a [NodeId],
    /// Each accumulated variable's accumulator.
    accumulators: S::Vec<(NodeId, NodeId)>,
    /// Each node's earliest relevant consumer.
    first_consumer: &'a [usize],
    /// The variables whose gradient is split over stages.
    split_grad: &'a [bool],
    /// The forward pass's length (for the capacity error).
    full: usize,
}

impl<S: Storage> Updates<'_, S> {
    /// After node `i`'s backward: the update (or accumulation) of each trainable operand of
    /// `i` whose gradient, or this stage's partial of it, is now final.
    fn variables_of(&mut self, bp: &mut Backprop<'_, S>, i: usize) -> Result<(), GraphError> {
        let operands = bp.graph.nodes[i].op.operands();
        for (k, &o) in operands.as_slice().iter().enumerate() {
            let repeated = operands.as_slice()[..k].contains(&o);
            if repeated || !bp.graph.nodes[o.index()].roles.contains(Roles::TRAINABLE) {
                continue;
            }
            let stage = bp.graph.nodes[i].stage;
            let whole = self.first_consumer[o.index()] == i;
            // A split gradient's partial is complete at the stage's first reader.
            let partial = !whole
                && self.split_grad[o.index()]
                && !bp.graph.nodes[..i].iter().enumerate().any(|(j, n)| {
                    bp.relevant[j] && n.stage == stage && n.op.operands().as_slice().contains(&o)
                });
            if !(whole || partial) {
                continue;
            }
            let Some(g) = bp.grad[o.index()] else {
                continue;
            };
            let g_ = &mut *bp.graph;
            if partial {
                bp.grad[o.index()] = None;
            } else {
                g_.current_stage = g_.nodes[o.index()].stage;
            }
            let split = self.split_grad[o.index()].then_some(usize::from(g_.current_stage));
            let g = g_.finalize_var_grad(o, g, if partial { split } else { None })?;
            if self.counters.is_empty() {
                g_.emit_update(o, g, self.optimizer, self.step)?;
                continue;
            }
            let stage_counter = self.counters[usize::from(g_.current_stage)];
            let held = (self.accumulators.iter())
                .find(|(v, _)| *v == o)
                .map(|&(_, a)| a);
            // RUNNING_MEAN rescales the accumulator by each stage's own count, which partials
            // from stages at different micro-batches would break; MEAN gives the same result
            // in any order.
            let mut a = self.accumulation;
            if split.is_some() && a.method == AccumulationMethod::RunningMean {
                a.method = AccumulationMethod::Mean;
            }
            let acc = g_.accumulate(o, g, stage_counter, a, held, split)?;
            if held.is_none() {
                let full = self.full;
                self.accumulators
                    .push((o, acc))
                    .map_err(|_| GraphError::CapacityExceeded {
                        node: crate::error::name_lossy("autodiff"),
                        capacity: full,
                    })?;
            }
        }
        Ok(())
    }
}

impl<S: Storage> Graph<S> {
    /// Appends the backward pass of `loss` and `optimizer`'s update of every trainable variable
    /// the loss depends on. Gradients of variables are named `<variable>_grad` and carry
    /// [`Roles::GRADIENT`]; optimizer state (`<variable>/momentum`, `<variable>/m`,
    /// `<variable>/v`, `optimizer/iterations`) carries [`Roles::OPTIMIZER_STATE`].
    ///
    /// A softmax feeding a cross-entropy is differentiated in the fused form
    /// `(softmax(z) - onehot) / batch`.
    pub fn differentiate(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
    ) -> Result<(), GraphError> {
        self.differentiate_inner(loss, optimizer, None)
    }

    /// [`Graph::differentiate`] with gradient accumulation: each micro-batch's gradients are
    /// added into accumulators (`<variable>/accumulator`, [`Roles::ACCUMULATOR`]), and the
    /// optimizer applies them once every `accumulation.count` micro-batches (the nodes with
    /// [`Roles::UPDATE`]), then resets them. [`crate::Plan::train_step`] runs a micro-batch and,
    /// when it completes a set of `count`, the update. A count of 1 gives plain training's
    /// numbers with the update as a separate phase (as replication and pipelining need).
    pub fn differentiate_accumulating(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Accumulation,
    ) -> Result<(), GraphError> {
        self.differentiate_inner(loss, optimizer, Some(accumulation))
    }

    /// Which of the first `len` nodes node `last` reads, directly or not (itself included).
    fn reaching(&self, len: usize, last: usize) -> Option<S::Vec<bool>> {
        let mut out: S::Vec<bool> = S::filled(len, false)?;
        out[last] = true;
        for i in (0..=last).rev() {
            if out[i] {
                for o in self.nodes[i].op.operands().as_slice() {
                    out[o.index()] = true;
                }
            }
        }
        Some(out)
    }

    /// Which of the first `len` nodes are made from variables alone (a reshaped bias, a
    /// transposed weight): parameters in another shape, the same for every micro-batch, not
    /// activations to stash, recompute or cut at. Constants and inputs are data.
    fn parameter_derived(&self, len: usize) -> Option<S::Vec<bool>> {
        let mut out: S::Vec<bool> = S::filled(len, false)?;
        for i in 0..len {
            let op = &self.nodes[i].op;
            let ops = op.operands();
            out[i] = !op.is_state()
                && !matches!(op, Op::Input)
                && !ops.as_slice().is_empty()
                && ops.as_slice().iter().all(|o| {
                    matches!(self.nodes[o.index()].op, Op::Variable { .. }) || out[o.index()]
                });
        }
        Some(out)
    }

    /// The checkpoints `auto` recomputation puts at the output of each repeated block: the
    /// forward activations where the graph narrows to that one tensor, that is, after which no
    /// earlier activation that depends on a trainable variable is read again (masks and other
    /// tensors made from the inputs alone may be). Residual blocks, transformer sublayers
    /// (attention and feed-forward, each closed by its residual add and norm) and the
    /// embeddings end at such points. Of a chain of such points (a residual add and the norm
    /// or activation after it, a stem's convolution, norm, activation and pooling) only the
    /// last is taken: the block's output, where PopTorch's `recomputationCheckpoint` and
    /// TensorFlow's `recomputation_checkpoint` go in Graphcore's models, and where a stage
    /// ending with the block hands one tensor to the next and stashes none of its own
    /// (taking the chain's first point, a post-norm layer's residual sum, left its norm to be
    /// recomputed from a stashed copy of that sum). A chain that runs into the loss (the
    /// last block's output, then the head) gives the last block's output: its last point
    /// of its first point's shape, before the head pools or gathers. The loss is never one.
    ///
    /// # Errors
    ///
    /// [`GraphError::UnknownNode`] and the like for a `loss` that is not a node of the graph.
    pub fn auto_checkpoints(&self, loss: impl NodeRef) -> Result<S::Vec<NodeId>, GraphError> {
        let loss = loss.resolve(self)?;
        let last = loss.index();
        let len = last + 1;
        let full = || GraphError::CapacityExceeded {
            node: crate::error::name_lossy("checkpoints"),
            capacity: len,
        };
        // What the loss reads, directly or not: a batch norm's statistics for its running
        // averages do not, and are no activation the backward pass keeps; their reads keep
        // nothing alive for it.
        let reaches_loss = self.reaching(len, last).ok_or_else(full)?;
        let mut depends: S::Vec<bool> = S::filled(len, false).ok_or_else(full)?;
        let mut last_reader: S::Vec<usize> = S::filled(len, 0).ok_or_else(full)?;
        for i in 0..len {
            let n = &self.nodes[i];
            depends[i] = n.roles.contains(Roles::TRAINABLE);
            for o in n.op.operands().as_slice() {
                depends[i] |= depends[o.index()];
                if reaches_loss[i] {
                    last_reader[o.index()] = i;
                }
            }
        }
        let parameter = self.parameter_derived(len).ok_or_else(full)?;
        // Activations (depending on a variable) made so far and read after node i, with how
        // many close at each node: a sweep of opening and closing counts.
        let mut closing: S::Vec<u32> = S::filled(len + 1, 0).ok_or_else(full)?;
        let mut open = 0u32;
        let mut out: S::Vec<NodeId> = S::vec();
        // The chain under way: its last cut of the first cut's shape, and its last cut. The
        // last is pushed when an activation ends the chain; when the chain runs into the loss,
        // the last of the first shape (the last block's output, before a head changes it).
        let mut chain: Option<(usize, usize)> = None;
        for i in 0..len {
            open -= closing[i];
            let n = &self.nodes[i];
            let activation = depends[i]
                && reaches_loss[i]
                && !parameter[i]
                && !n.op.is_state()
                && !n.op.is_update()
                && !matches!(n.op, Op::Input);
            let lives_on = activation && last_reader[i] > i;
            if lives_on {
                open += 1;
                closing[last_reader[i]] += 1;
            }
            // `open` counts the activations read after node i, i among them: a cut when i is
            // the only one.
            let cut = lives_on && i != last && open == 1;
            // A chain runs over activations: variables and inputs between them do not end it.
            if cut {
                chain = Some(match chain {
                    Some((block, _)) if n.shape == self.nodes[block].shape => (i, i),
                    Some((block, _)) => (block, i),
                    None => (i, i),
                });
            } else if activation || i == last {
                if let Some((block, end)) = chain.take() {
                    let at = if i == last { block } else { end };
                    out.push(NodeId::at(at)).map_err(|_| full())?;
                }
            }
        }
        self.repeated_blocks(&mut out)?;
        Ok(out)
    }

    /// Keeps, of the narrowing points `cuts`, those that end each repeated block: when the
    /// segments between them repeat with a period of several segments (a transformer layer
    /// is an attention and a feed-forward sublayer, each ending at a narrowing point), every
    /// period-th point, the last one kept. The first such point closes the stem or the
    /// embeddings; points before it (a BERT's word-embedding lookup, before the other
    /// embeddings are added) are inside that first segment and are not kept.
    /// Segments compare by their ops and shapes; the period is the one of 1 to 4 under which
    /// most segments equal the one a period later (the shortest of equals).
    fn repeated_blocks(&self, cuts: &mut S::Vec<NodeId>) -> Result<(), GraphError> {
        let n = cuts.len();
        if n < 3 {
            return Ok(());
        }
        let full = || GraphError::CapacityExceeded {
            node: crate::error::name_lossy("checkpoints"),
            capacity: n,
        };
        // A signature of each segment (c[j-1], c[j]]: FNV-1a over its ops' names and shapes.
        let mut sig: S::Vec<u64> = S::filled(n, 0).ok_or_else(full)?;
        for j in 1..n {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            let mut eat = |x: u64| {
                h ^= x;
                h = h.wrapping_mul(0x0100_0000_01b3);
            };
            for node in &self.nodes[cuts[j - 1].index() + 1..=cuts[j].index()] {
                for b in node.op.name().bytes() {
                    eat(u64::from(b));
                }
                for &d in node.shape.dims() {
                    eat(u64::from(d));
                }
                eat(0xff);
            }
            sig[j] = h;
        }
        let matches = |p: usize| (1..n - p).filter(|&j| sig[j] == sig[j + p]).count();
        let mut best = (1, matches(1));
        for p in 2..=4usize.min(n - 2) {
            let m = matches(p);
            if m > best.1 {
                best = (p, m);
            }
        }
        let p = best.0;
        if p == 1 {
            return Ok(());
        }
        let keep_phase = (n - 1) % p;
        let mut kept: S::Vec<NodeId> = S::vec();
        for (j, &c) in cuts.iter().enumerate() {
            if j % p == keep_phase {
                kept.push(c).map_err(|_| full())?;
            }
        }
        *cuts = kept;
        Ok(())
    }

    /// [`Graph::differentiate_accumulating`] with recomputation from `checkpoints` (PopART's
    /// recomputation with checkpoints, TensorFlow's `recomputation_checkpoint`, PopTorch's
    /// `recomputationCheckpoint`): the backward pass keeps only the checkpoints of the forward
    /// activations (and what follows the last checkpoint of each stage, and activations that
    /// depend on no trainable variable, such as masks); every other activation is recomputed
    /// from the checkpoints before the backward pass of its segment needs it. A segment is
    /// the activations of a stage up to a checkpoint; its copies (`<node>/recompute`) are
    /// appended, in forward order, right before the first backward node that reads one, so
    /// the forward's activations die after the forward pass and each segment's copies live
    /// only through its backward. A checkpoint whose own gradient reads recomputed operands
    /// is copied with its segment. Empty `checkpoints` is plain differentiation.
    ///
    /// # Errors
    ///
    /// As [`Graph::differentiate_accumulating`], and [`GraphError::BadCheckpoint`] for a
    /// checkpoint that is not a forward activation the loss depends on.
    pub fn differentiate_recomputing(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Accumulation,
        checkpoints: &[NodeId],
    ) -> Result<(), GraphError> {
        self.differentiate_inner_with(loss, optimizer, Some(accumulation), checkpoints)
    }

    fn differentiate_inner(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Option<Accumulation>,
    ) -> Result<(), GraphError> {
        self.differentiate_inner_with(loss, optimizer, accumulation, &[])
    }

    fn differentiate_inner_with(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Option<Accumulation>,
        checkpoints: &[NodeId],
    ) -> Result<(), GraphError> {
        let accumulating = accumulation.is_some();
        let accumulation = accumulation.unwrap_or(Accumulation::new(1));
        let (len, scope) = (self.nodes.len(), self.current_stage);
        let result = self.append_backward(loss, optimizer, accumulation, accumulating, checkpoints);
        if result.is_err() {
            // Leave the graph as it was: no half-built backward pass.
            self.nodes.truncate(len);
            self.forward_len = None;
            self.accumulation = None;
            self.current_stage = scope;
        }
        result
    }

    /// Appends the backward pass of `loss` and the optimizer's updates, in phases: the
    /// checks, which forward nodes the gradients run through (and which are recomputed),
    /// the optimizer's step and micro-batch counters, the backward pass in reverse with each
    /// variable's update (or accumulation) once its gradient is final, and, accumulating, the
    /// updates and resets of each weight update.
    fn append_backward(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Accumulation,
        accumulating: bool,
        checkpoints: &[NodeId],
    ) -> Result<(), GraphError> {
        let last = self.check_backward(loss, optimizer, accumulation)?;
        let forward_len = self.len();
        let full = || GraphError::CapacityExceeded {
            node: crate::error::name_lossy("autodiff"),
            capacity: forward_len,
        };
        // Which nodes lie on a path from a trainable variable to the loss.
        let reaches_loss = self.reaching(forward_len, last).ok_or_else(full)?;
        let depends_on_var = self.on_variables(forward_len, last).ok_or_else(full)?;
        let mut relevant: S::Vec<bool> = S::filled(forward_len, false).ok_or_else(full)?;
        for i in 0..forward_len {
            relevant[i] = reaches_loss[i] && depends_on_var[i];
        }
        let (segment, recomputed) =
            self.segments(checkpoints, last, &reaches_loss, &depends_on_var)?;
        drop((reaches_loss, depends_on_var));
        if !self.nodes[..=last]
            .iter()
            .enumerate()
            .any(|(i, n)| relevant[i] && n.roles.contains(Roles::TRAINABLE))
        {
            return Err(GraphError::NothingToTrain {
                loss: self.nodes[last].name.clone(),
            });
        }
        // The earliest relevant consumer of each variable: its gradient is final after that
        // consumer's backward.
        let mut first_consumer: S::Vec<usize> =
            S::filled(forward_len, usize::MAX).ok_or_else(full)?;
        for i in (0..=last).rev() {
            if relevant[i] {
                for o in self.nodes[i].op.operands().as_slice() {
                    first_consumer[o.index()] = i;
                }
            }
        }
        let split_grad = match accumulating {
            true => self.split_gradients(last, &relevant, &first_consumer)?,
            false => S::filled(forward_len, false).ok_or_else(full)?,
        };
        let step = match optimizer {
            Optimizer::Adam { .. } | Optimizer::Lamb { .. } => Some(self.push(
                derived("optimizer", format_args!("/iterations"))?,
                Op::Variable { init: Init::Zeros },
                Shape::scalar(),
                DType::I32,
                Roles::OPTIMIZER_STATE,
            )?),
            _ => None,
        };
        let scope = self.current_stage;
        let counters = match accumulating {
            true => self.micro_batch_counters()?,
            false => heapless::Vec::new(),
        };
        let mut updates = Updates::<S> {
            optimizer,
            step,
            accumulation,
            counters: &counters,
            accumulators: S::vec(),
            first_consumer: &first_consumer,
            split_grad: &split_grad,
            full: forward_len,
        };
        let grad = S::filled(forward_len, None).ok_or_else(full)?;
        let count = S::filled(forward_len, 0u32).ok_or_else(full)?;
        let ldt = self.nodes[last].dtype;
        self.current_stage = self.nodes[last].stage;
        let seed = self.push(
            derived(&self.nodes[last].name.clone(), format_args!("_grad/seed"))?,
            Op::Constant { value: 1.0 },
            Shape::scalar(),
            ldt,
            Roles::CONSTANT | Roles::BACKWARD,
        )?;
        let mut bp = Backprop {
            graph: self,
            grad,
            count,
            relevant,
            clones: S::vec(),
        };
        bp.grad[last] = Some(seed);
        backward_pass(&mut bp, last, (&segment, &recomputed), &mut updates)?;
        let accumulators = updates.accumulators;
        if let Some(&counter) = counters.first() {
            self.apply_accumulated(&counters, &accumulators, optimizer, step)?;
            self.accumulation = Some((counter, accumulation.count));
        }
        if let Some(step) = step {
            self.current_stage = 0;
            self.push(
                derived("optimizer", format_args!("/increment"))?,
                Op::Update(Update::Increment { counter: step }),
                Shape::scalar(),
                DType::I32,
                Roles::UPDATE | Roles::BACKWARD,
            )?;
        }
        self.forward_len = Some(forward_len as u32);
        self.current_stage = scope;
        Ok(())
    }

    /// Checks what differentiating takes: an accumulation count and type, an optimizer's
    /// hyper-parameters, a graph not yet differentiated and a float scalar loss (its index).
    fn check_backward(
        &self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Accumulation,
    ) -> Result<usize, GraphError> {
        if accumulation.count == 0 {
            return Err(GraphError::BadHyperParameter {
                name: "gradient accumulation count",
                value: 0.0,
            });
        }
        if accumulation.dtype.is_some_and(|d| !d.is_float()) {
            return Err(GraphError::BadHyperParameter {
                name: "accumulator type",
                value: 0.0,
            });
        }
        if self.is_training() {
            return Err(GraphError::AlreadyTraining);
        }
        optimizer.check()?;
        let loss = loss.resolve(self)?;
        let ln = self.node(loss);
        if ln.shape.rank() != 0 || !ln.dtype.is_float() {
            return Err(GraphError::BadLoss {
                node: ln.name.clone(),
                shape: ln.shape,
            });
        }
        Ok(loss.index())
    }

    /// Which of the first `len` nodes (up to `last`) depend on a trainable variable.
    fn on_variables(&self, len: usize, last: usize) -> Option<S::Vec<bool>> {
        let mut out: S::Vec<bool> = S::filled(len, false)?;
        for i in 0..=last {
            let n = &self.nodes[i];
            out[i] = n.roles.contains(Roles::TRAINABLE)
                || n.op.operands().as_slice().iter().any(|o| out[o.index()]);
        }
        Some(out)
    }

    /// Recomputation: each forward node's segment (the checkpoint closing it, in its stage),
    /// and whether it is recomputed. Checkpoints, state, inputs, activations that depend on no
    /// trainable variable and what follows a stage's last checkpoint are kept.
    fn segments(
        &self,
        checkpoints: &[NodeId],
        last: usize,
        reaches_loss: &[bool],
        depends_on_var: &[bool],
    ) -> Result<Segments<S>, GraphError> {
        let forward_len = reaches_loss.len();
        let full = || GraphError::CapacityExceeded {
            node: crate::error::name_lossy("autodiff"),
            capacity: forward_len,
        };
        let mut segment: S::Vec<u32> = S::filled(forward_len, u32::MAX).ok_or_else(full)?;
        let mut recomputed: S::Vec<bool> = S::filled(forward_len, false).ok_or_else(full)?;
        if checkpoints.is_empty() {
            return Ok((segment, recomputed));
        }
        let mut is_checkpoint: S::Vec<bool> = S::filled(forward_len, false).ok_or_else(full)?;
        for &c in checkpoints {
            let ok = c.index() < forward_len
                && c.index() != last
                && reaches_loss[c.index()]
                && depends_on_var[c.index()]
                && !self.nodes[c.index()].op.is_state()
                && !matches!(self.nodes[c.index()].op, Op::Input);
            if !ok {
                let node = match self.nodes.get(c.index()) {
                    Some(n) => n.name.clone(),
                    None => crate::error::name_lossy("?"),
                };
                return Err(GraphError::BadCheckpoint { node });
            }
            is_checkpoint[c.index()] = true;
        }
        // Walking backwards: the next checkpoint of each stage. A stage before the loss's
        // ends a segment with its last node too: its activations after its last checkpoint
        // are recomputed as well (only the stage's inputs and checkpoints are stashed, as
        // PopART's pipelined recomputation does); the loss's stage keeps what follows its
        // last checkpoint, which its backward reads at once.
        let parameter = self.parameter_derived(forward_len).ok_or_else(full)?;
        let mut next: [u32; 256] = [u32::MAX; 256];
        let loss_stage = usize::from(self.nodes[last].stage);
        for i in 0..=last {
            let st = usize::from(self.nodes[i].stage);
            if st != loss_stage {
                next[st] = i as u32;
            }
        }
        for i in (0..=last).rev() {
            let n = &self.nodes[i];
            let st = usize::from(n.stage);
            if is_checkpoint[i] {
                next[st] = i as u32;
                segment[i] = i as u32;
                continue;
            }
            let activation = !n.op.is_state() && !matches!(n.op, Op::Input) && !parameter[i];
            // Only what the backward pass reads: a value that does not reach the loss
            // (a batch norm's statistics for its running averages) is no gradient's
            // operand, so no copy of it is made (as dead-code elimination drops it).
            if activation && depends_on_var[i] && reaches_loss[i] && next[st] != u32::MAX {
                segment[i] = next[st];
                recomputed[i] = true;
            }
        }
        Ok((segment, recomputed))
    }

    /// Trainable variables read by relevant nodes of more than one pipeline stage (a tied
    /// embedding and masked-LM decoder, say). Accumulating, each stage adds its partial
    /// gradient into the variable's one accumulator as its own backward pass ends (PopART's
    /// `InplaceAccumulateGradPartialsIntoOptimizerAccumTensor`), so no stage waits for
    /// another's partial and nothing is carried across the pipeline.
    fn split_gradients(
        &self,
        last: usize,
        relevant: &[bool],
        first_consumer: &[usize],
    ) -> Result<S::Vec<bool>, GraphError> {
        let mut split_grad: S::Vec<bool> =
            S::filled(relevant.len(), false).ok_or(GraphError::CapacityExceeded {
                node: crate::error::name_lossy("autodiff"),
                capacity: relevant.len(),
            })?;
        for i in (0..=last).filter(|&i| relevant[i]) {
            for o in self.nodes[i].op.operands().as_slice() {
                let f = first_consumer[o.index()];
                if self.nodes[o.index()].roles.contains(Roles::TRAINABLE)
                    && f != usize::MAX
                    && self.nodes[f].stage != self.nodes[i].stage
                {
                    split_grad[o.index()] = true;
                }
            }
        }
        Ok(split_grad)
    }

    /// One micro-batch counter per pipeline stage, so each stage's RUNNING_MEAN sees its own
    /// count however the schedule interleaves the stages' backward passes.
    fn micro_batch_counters(&mut self) -> Result<heapless::Vec<NodeId, 256>, GraphError> {
        let mut counters: heapless::Vec<NodeId, 256> = heapless::Vec::new();
        for k in 0..self.stage_count() {
            self.current_stage = k as u8;
            let name = if k == 0 {
                derived("optimizer", format_args!("/micro_batches"))?
            } else {
                derived("optimizer", format_args!("/micro_batches_stage{k}"))?
            };
            let c = self.push(
                name,
                Op::Variable { init: Init::Zeros },
                Shape::scalar(),
                DType::I32,
                Roles::ACCUMULATOR,
            )?;
            let _ = counters.push(c);
        }
        Ok(counters)
    }

    /// Each stage's micro-batch is done: the counters' increments (last stage first, as the
    /// backward pass runs); then, once per weight update, each variable's update from its
    /// accumulator and the accumulator's reset, and the counters' resets.
    fn apply_accumulated(
        &mut self,
        counters: &[NodeId],
        accumulators: &[(NodeId, NodeId)],
        optimizer: Optimizer,
        step: Option<NodeId>,
    ) -> Result<(), GraphError> {
        for (k, &c) in counters.iter().enumerate().rev() {
            self.current_stage = k as u8;
            let name = derived(
                &self.nodes[c.index()].name.clone(),
                format_args!("/increment"),
            )?;
            self.push(
                name,
                Op::Update(Update::Increment { counter: c }),
                Shape::scalar(),
                DType::I32,
                Roles::BACKWARD,
            )?;
        }
        for &(var, acc) in accumulators {
            self.current_stage = self.nodes[var.index()].stage;
            self.emit_update(var, acc, optimizer, step)?;
            let name = derived(
                &self.nodes[acc.index()].name.clone(),
                format_args!("/reset"),
            )?;
            let dt = self.node(acc).dtype;
            self.push(
                name,
                Op::Update(Update::Fill { x: acc, value: 0.0 }),
                Shape::scalar(),
                dt,
                Roles::UPDATE | Roles::BACKWARD,
            )?;
        }
        for (k, &c) in counters.iter().enumerate() {
            self.current_stage = k as u8;
            let name = derived(&self.nodes[c.index()].name.clone(), format_args!("/reset"))?;
            self.push(
                name,
                Op::Update(Update::Fill { x: c, value: 0.0 }),
                Shape::scalar(),
                DType::I32,
                Roles::UPDATE | Roles::BACKWARD,
            )?;
        }
        Ok(())
    }
    /// Gives a variable's final gradient the name `<variable>_grad` (a stage's partial of a
    /// split gradient: `<variable>_grad_stage<k>`).
    fn finalize_var_grad(
        &mut self,
        var: NodeId,
        g: NodeId,
        partial: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        let vname = self.nodes[var.index()].name.clone();
        let name = match partial {
            None => derived(&vname, format_args!("_grad"))?,
            Some(k) => derived(&vname, format_args!("_grad_stage{k}"))?,
        };
        let mut own = Name::new();
        let _ = write!(own, "{}_grad/", self.nodes[var.index()].name);
        if self.nodes[g.index()].name.starts_with(own.as_str()) {
            self.nodes[g.index()].name = name;
            Ok(g)
        } else {
            // The gradient is another node's (a pass-through); give the variable its own copy.
            let v = self.node(var);
            let (shape, dtype) = (v.shape, v.dtype);
            self.push(
                name,
                Op::Layout(Layout::Reshape { x: g }),
                shape,
                dtype,
                Roles::GRADIENT | Roles::BACKWARD,
            )
        }
    }

    /// The op adding `grad` into `var`'s accumulator: `held`, or a new one (in `var`'s
    /// stage). `partial`: the stage whose partial of a split gradient `grad` is.
    fn accumulate(
        &mut self,
        var: NodeId,
        grad: NodeId,
        counter: NodeId,
        a: Accumulation,
        held: Option<NodeId>,
        partial: Option<usize>,
    ) -> Result<NodeId, GraphError> {
        let vname = self.nodes[var.index()].name.clone();
        let (shape, vdt) = (self.node(var).shape, self.node(var).dtype);
        let acc = match held {
            Some(acc) => acc,
            None => {
                let scope = self.current_stage;
                self.current_stage = self.nodes[var.index()].stage;
                let acc = self.push(
                    derived(&vname, format_args!("/accumulator"))?,
                    Op::Variable { init: Init::Zeros },
                    shape,
                    a.dtype.unwrap_or(vdt),
                    Roles::ACCUMULATOR,
                );
                self.current_stage = scope;
                acc?
            }
        };
        let name = match partial {
            None => derived(&vname, format_args!("/accumulate"))?,
            Some(k) => derived(&vname, format_args!("/accumulate_stage{k}"))?,
        };
        self.push(
            name,
            Op::Update(Update::Accumulate {
                acc,
                grad,
                counter,
                method: a.method,
                count: a.count,
            }),
            Shape::scalar(),
            vdt,
            Roles::BACKWARD,
        )?;
        Ok(acc)
    }

    fn emit_update(
        &mut self,
        var: NodeId,
        grad: NodeId,
        optimizer: Optimizer,
        step: Option<NodeId>,
    ) -> Result<(), GraphError> {
        let vname = self.nodes[var.index()].name.clone();
        let (shape, dtype) = (self.node(var).shape, self.node(var).dtype);
        let state = |g: &mut Self, suffix: &str| {
            g.push(
                derived(&vname, format_args!("/{suffix}"))?,
                Op::Variable { init: Init::Zeros },
                shape,
                dtype,
                Roles::OPTIMIZER_STATE,
            )
        };
        let op = match optimizer {
            Optimizer::Sgd { learning_rate } => Update::Sgd {
                var,
                grad,
                lr: learning_rate,
            },
            Optimizer::Momentum {
                learning_rate,
                momentum,
            } => {
                let velocity = state(self, "momentum")?;
                Update::Momentum {
                    var,
                    velocity,
                    grad,
                    lr: learning_rate,
                    momentum,
                }
            }
            Optimizer::Adam {
                learning_rate,
                beta1,
                beta2,
                epsilon,
            } => {
                let m = state(self, "m")?;
                let v = state(self, "v")?;
                let step = step.ok_or(GraphError::AlreadyTraining)?;
                Update::Adam {
                    var,
                    m,
                    v,
                    grad,
                    step,
                    lr: learning_rate,
                    beta1,
                    beta2,
                    epsilon,
                }
            }
            Optimizer::Lamb {
                learning_rate,
                beta1,
                beta2,
                epsilon,
                weight_decay,
            } => {
                let m = state(self, "m")?;
                let v = state(self, "v")?;
                let step = step.ok_or(GraphError::AlreadyTraining)?;
                Update::Lamb {
                    var,
                    m,
                    v,
                    grad,
                    step,
                    lr: learning_rate,
                    beta1,
                    beta2,
                    epsilon,
                    weight_decay,
                }
            }
            Optimizer::Lars {
                learning_rate,
                momentum,
                weight_decay,
                eta,
            } => {
                let velocity = state(self, "momentum")?;
                Update::Lars {
                    var,
                    velocity,
                    grad,
                    lr: learning_rate,
                    momentum,
                    weight_decay,
                    eta,
                }
            }
        };
        self.push(
            derived(&vname, format_args!("/update"))?,
            Op::Update(op),
            Shape::scalar(),
            dtype,
            Roles::UPDATE | Roles::BACKWARD,
        )?;
        Ok(())
    }
}
