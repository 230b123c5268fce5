//! The optimizer's updates and gradient accumulation, appended as each gradient is final.

use core::fmt::Write;

use crate::error::{derived, GraphError, Name};
use crate::graph::{Graph, Init, NodeId};
use crate::op::Op;
use crate::ops::layout::Layout;
use crate::ops::update::Update;
use crate::storage::{Buffer, Storage};
use crate::{DType, Roles, Shape};

use super::{Accumulation, AccumulationMethod, Backprop, Optimizer};

/// What the backward pass does with a trainable variable's gradient once it is final: the
/// optimizer's update, or (accumulating) its accumulation, a stage's partial of a gradient
/// split over stages included.
pub(super) struct Updates<'a, S: Storage> {
    pub(super) optimizer: Optimizer,
    /// The optimizer's step counter (Adam, LAMB).
    pub(super) step: Option<NodeId>,
    pub(super) accumulation: Accumulation,
    /// Each stage's micro-batch counter (accumulating).
    pub(super) counters: &'a [NodeId],
    /// Each accumulated variable's accumulator.
    pub(super) accumulators: S::Vec<(NodeId, NodeId)>,
    /// Each node's earliest relevant consumer.
    pub(super) first_consumer: &'a [usize],
    /// The variables whose gradient is split over stages.
    pub(super) split_grad: &'a [bool],
    /// The forward pass's length (for the capacity error).
    pub(super) full: usize,
}

impl<S: Storage> Updates<'_, S> {
    /// After node `i`'s backward: the update (or accumulation) of each trainable operand of
    /// `i` whose gradient, or this stage's partial of it, is now final.
    pub(super) fn variables_of(
        &mut self,
        bp: &mut Backprop<'_, S>,
        i: usize,
    ) -> Result<(), GraphError> {
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
    /// Trainable variables read by relevant nodes of more than one pipeline stage (a tied
    /// embedding and masked-LM decoder, say). Accumulating, each stage adds its partial
    /// gradient into the variable's one accumulator as its own backward pass ends (PopART's
    /// `InplaceAccumulateGradPartialsIntoOptimizerAccumTensor`), so no stage waits for
    /// another's partial and nothing is carried across the pipeline.
    pub(super) fn split_gradients(
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
    pub(super) fn micro_batch_counters(
        &mut self,
    ) -> Result<heapless::Vec<NodeId, 256>, GraphError> {
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
    pub(super) fn apply_accumulated(
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
