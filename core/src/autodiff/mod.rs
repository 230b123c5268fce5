//! Reverse-mode autodiff: a forward graph plus a scalar loss becomes a static training graph,
//! with the optimizer's weight update applied as a graph transform.
//!
//! The backward pass is appended to the same graph in reverse topological order. Each
//! variable's update is placed right after its gradient is final (after its earliest consumer's
//! backward), so a weight gradient lives only as long as it must.

mod backprop;
mod checkpoints;
mod optimizer;
mod update;

pub(crate) use backprop::Backprop;
pub use optimizer::{Accumulation, AccumulationMethod, Optimizer};

use crate::error::{derived, GraphError};
use crate::graph::{Graph, Init, NodeId, NodeRef};
use crate::op::Op;
use crate::ops::update::Update;
use crate::storage::{Buffer, Storage};
use crate::{DType, Roles, Shape};

use backprop::backward_pass;
use update::Updates;

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
}
