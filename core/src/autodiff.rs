//! Reverse-mode autodiff: a forward graph plus a scalar loss becomes a static training graph,
//! with the optimizer's weight update applied as a graph transform.
//!
//! The backward pass is appended to the same graph in reverse topological order. Each
//! variable's update is placed right after its gradient is final (after its earliest consumer's
//! backward), so a weight gradient lives only as long as it must.

use core::fmt::Write;

use crate::error::{GraphError, Name};
use crate::graph::{Graph, Init, NodeId, NodeRef, Op};
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

    fn check(&self) -> Result<(), GraphError> {
        let positive = |name, v: f32| {
            if v.is_finite() && v > 0.0 {
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
        }
    }

    /// Optimizer-state tensors kept per trainable variable (0 for SGD, 1 momentum, 2 Adam).
    pub const fn slots_per_variable(&self) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::Momentum { .. } => 1,
            Optimizer::Adam { .. } => 2,
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

/// `<base><suffix>` as a node name.
fn derived(base: &str, suffix: core::fmt::Arguments<'_>) -> Result<Name, GraphError> {
    let mut n = Name::new();
    n.push_str(base).map_err(|_| GraphError::BadName {
        name: crate::error::name_lossy(base),
    })?;
    n.write_fmt(suffix).map_err(|_| GraphError::BadName {
        name: crate::error::name_lossy(base),
    })?;
    Ok(n)
}

struct Backward<const N: usize> {
    grad: [Option<NodeId>; N],
    count: [u8; N],
}

impl<const N: usize> Graph<N> {
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

    fn differentiate_inner(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Option<Accumulation>,
    ) -> Result<(), GraphError> {
        let accumulating = accumulation.is_some();
        let accumulation = accumulation.unwrap_or(Accumulation::new(1));
        let (len, scope) = (self.nodes.len(), self.current_stage);
        let result = self.append_backward(loss, optimizer, accumulation, accumulating);
        if result.is_err() {
            // Leave the graph as it was: no half-built backward pass.
            self.nodes.truncate(len);
            self.forward_len = None;
            self.accumulation = None;
            self.current_stage = scope;
        }
        result
    }

    fn append_backward(
        &mut self,
        loss: impl NodeRef,
        optimizer: Optimizer,
        accumulation: Accumulation,
        accumulating: bool,
    ) -> Result<(), GraphError> {
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
        let forward_len = self.len();
        let last = loss.index();

        // Which nodes lie on a path from a trainable variable to the loss.
        let mut reaches_loss = [false; N];
        reaches_loss[last] = true;
        for i in (0..=last).rev() {
            if reaches_loss[i] {
                for o in self.nodes[i].op.operands().as_slice() {
                    reaches_loss[o.index()] = true;
                }
            }
        }
        let mut depends_on_var = [false; N];
        for i in 0..=last {
            let n = &self.nodes[i];
            depends_on_var[i] = n.roles.contains(Roles::TRAINABLE)
                || n.op
                    .operands()
                    .as_slice()
                    .iter()
                    .any(|o| depends_on_var[o.index()]);
        }
        let relevant = |i: usize| reaches_loss[i] && depends_on_var[i];
        if !self.nodes[..=last]
            .iter()
            .enumerate()
            .any(|(i, n)| relevant(i) && n.roles.contains(Roles::TRAINABLE))
        {
            return Err(GraphError::NothingToTrain {
                loss: self.nodes[last].name.clone(),
            });
        }
        // The earliest relevant consumer of each variable: its gradient is final after that
        // consumer's backward.
        let mut first_consumer = [usize::MAX; N];
        for i in (0..=last).rev() {
            if relevant(i) {
                for o in self.nodes[i].op.operands().as_slice() {
                    first_consumer[o.index()] = i;
                }
            }
        }

        let step = match optimizer {
            Optimizer::Adam { .. } => Some(self.push(
                derived("optimizer", format_args!("/iterations"))?,
                Op::Variable { init: Init::Zeros },
                Shape::scalar(),
                DType::I32,
                Roles::OPTIMIZER_STATE,
            )?),
            _ => None,
        };

        let scope = self.current_stage;
        self.current_stage = 0;
        // One micro-batch counter per pipeline stage, so each stage's RUNNING_MEAN sees its own
        // count however the schedule interleaves the stages' backward passes.
        let stages = self.stage_count();
        let mut counters: heapless::Vec<NodeId, 256> = heapless::Vec::new();
        if accumulating {
            for k in 0..stages {
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
        }
        let counter = counters.first().copied();
        let mut accumulators: heapless::Vec<(NodeId, NodeId), N> = heapless::Vec::new();

        let mut bw = Backward {
            grad: [None; N],
            count: [0; N],
        };
        let ldt = self.nodes[last].dtype;
        self.current_stage = self.nodes[last].stage;
        let seed = self.push(
            derived(&self.nodes[last].name.clone(), format_args!("_grad/seed"))?,
            Op::Constant { value: 1.0 },
            Shape::scalar(),
            ldt,
            Roles::CONSTANT | Roles::BACKWARD,
        )?;
        bw.grad[last] = Some(seed);

        for i in (0..=last).rev() {
            if !relevant(i) {
                continue;
            }
            // Backward nodes belong to the stage of the node they differentiate.
            self.current_stage = self.nodes[i].stage;
            if let Some(dy) = bw.grad[i] {
                self.backward_of(NodeId(i as u16), dy, &mut bw, &relevant)?;
            }
            let operands = self.nodes[i].op.operands();
            for (k, &o) in operands.as_slice().iter().enumerate() {
                let repeated = operands.as_slice()[..k].contains(&o);
                if !repeated
                    && first_consumer[o.index()] == i
                    && self.nodes[o.index()].roles.contains(Roles::TRAINABLE)
                {
                    if let Some(g) = bw.grad[o.index()] {
                        self.current_stage = self.nodes[o.index()].stage;
                        let g = self.finalize_var_grad(o, g)?;
                        match counter {
                            None => self.emit_update(o, g, optimizer, step)?,
                            Some(_) => {
                                let stage_counter =
                                    counters[usize::from(self.nodes[o.index()].stage)];
                                let acc = self.accumulate(o, g, stage_counter, accumulation)?;
                                let _ = accumulators.push((o, acc));
                            }
                        }
                    }
                }
            }
        }
        if let Some(counter) = counter {
            // Each stage's micro-batch is done; once per weight update, apply and reset.
            // Last stage first, as the backward pass runs.
            for (k, &c) in counters.iter().enumerate().rev() {
                self.current_stage = k as u8;
                let name = derived(
                    &self.nodes[c.index()].name.clone(),
                    format_args!("/increment"),
                )?;
                self.push(
                    name,
                    Op::Increment { counter: c },
                    Shape::scalar(),
                    DType::I32,
                    Roles::BACKWARD,
                )?;
            }
            for &(var, acc) in &accumulators {
                self.current_stage = self.nodes[var.index()].stage;
                self.emit_update(var, acc, optimizer, step)?;
                let name = derived(
                    &self.nodes[acc.index()].name.clone(),
                    format_args!("/reset"),
                )?;
                let dt = self.node(acc).dtype;
                self.push(
                    name,
                    Op::Fill { x: acc, value: 0.0 },
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
                    Op::Fill { x: c, value: 0.0 },
                    Shape::scalar(),
                    DType::I32,
                    Roles::UPDATE | Roles::BACKWARD,
                )?;
            }
            self.accumulation = Some((counter, accumulation.count));
        }
        if let Some(step) = step {
            self.current_stage = 0;
            self.push(
                derived("optimizer", format_args!("/increment"))?,
                Op::Increment { counter: step },
                Shape::scalar(),
                DType::I32,
                Roles::UPDATE | Roles::BACKWARD,
            )?;
        }
        self.forward_len = Some(forward_len as u16);
        self.current_stage = scope;
        Ok(())
    }

    /// Pushes a gradient contribution node for `target`, named `<target>_grad/<k>`.
    fn grad_node(
        &mut self,
        target: NodeId,
        bw: &mut Backward<N>,
        op: Op,
        shape: Shape,
        dtype: DType,
    ) -> Result<NodeId, GraphError> {
        bw.count[target.index()] = bw.count[target.index()].saturating_add(1);
        let k = bw.count[target.index()];
        let name = derived(
            &self.nodes[target.index()].name.clone(),
            format_args!("_grad/{k}"),
        )?;
        self.push(name, op, shape, dtype, Roles::GRADIENT | Roles::BACKWARD)
    }

    /// Adds `g` to `target`'s gradient.
    fn contribute(
        &mut self,
        target: NodeId,
        g: NodeId,
        bw: &mut Backward<N>,
    ) -> Result<(), GraphError> {
        bw.grad[target.index()] = Some(match bw.grad[target.index()] {
            None => g,
            Some(prev) => {
                let t = self.node(target);
                let (shape, dtype) = (t.shape, t.dtype);
                self.grad_node(target, bw, Op::Add { a: prev, b: g }, shape, dtype)?
            }
        });
        Ok(())
    }

    /// Gives a variable's final gradient the name `<variable>_grad`.
    fn finalize_var_grad(&mut self, var: NodeId, g: NodeId) -> Result<NodeId, GraphError> {
        let name = derived(&self.nodes[var.index()].name.clone(), format_args!("_grad"))?;
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
                Op::Reshape { x: g },
                shape,
                dtype,
                Roles::GRADIENT | Roles::BACKWARD,
            )
        }
    }

    /// An accumulator for `var` and the op adding `grad` into it.
    fn accumulate(
        &mut self,
        var: NodeId,
        grad: NodeId,
        counter: NodeId,
        a: Accumulation,
    ) -> Result<NodeId, GraphError> {
        let vname = self.nodes[var.index()].name.clone();
        let (shape, vdt) = (self.node(var).shape, self.node(var).dtype);
        let acc = self.push(
            derived(&vname, format_args!("/accumulator"))?,
            Op::Variable { init: Init::Zeros },
            shape,
            a.dtype.unwrap_or(vdt),
            Roles::ACCUMULATOR,
        )?;
        self.push(
            derived(&vname, format_args!("/accumulate"))?,
            Op::Accumulate {
                acc,
                grad,
                counter,
                method: a.method,
                count: a.count,
            },
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
            Optimizer::Sgd { learning_rate } => Op::ApplySgd {
                var,
                grad,
                lr: learning_rate,
            },
            Optimizer::Momentum {
                learning_rate,
                momentum,
            } => {
                let velocity = state(self, "momentum")?;
                Op::ApplyMomentum {
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
                Op::ApplyAdam {
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
        };
        self.push(
            derived(&vname, format_args!("/update"))?,
            op,
            Shape::scalar(),
            dtype,
            Roles::UPDATE | Roles::BACKWARD,
        )?;
        Ok(())
    }

    fn backward_of(
        &mut self,
        id: NodeId,
        dy: NodeId,
        bw: &mut Backward<N>,
        relevant: &dyn Fn(usize) -> bool,
    ) -> Result<(), GraphError> {
        let node = self.node(id).clone();
        let wants = |x: NodeId| relevant(x.index());
        let shape_of = |g: &Self, x: NodeId| (g.node(x).shape, g.node(x).dtype);
        match node.op {
            Op::Input | Op::Variable { .. } | Op::Constant { .. } => {}
            Op::MatMul {
                a,
                b,
                transpose_a: ta,
                transpose_b: tb,
            } => {
                if wants(a) {
                    let (s, t) = shape_of(self, a);
                    let op = match (ta, tb) {
                        (false, false) => Op::MatMul {
                            a: dy,
                            b,
                            transpose_a: false,
                            transpose_b: true,
                        },
                        (false, true) => Op::MatMul {
                            a: dy,
                            b,
                            transpose_a: false,
                            transpose_b: false,
                        },
                        (true, false) => Op::MatMul {
                            a: b,
                            b: dy,
                            transpose_a: false,
                            transpose_b: true,
                        },
                        (true, true) => Op::MatMul {
                            a: b,
                            b: dy,
                            transpose_a: true,
                            transpose_b: true,
                        },
                    };
                    let g = self.grad_node(a, bw, op, s, t)?;
                    self.contribute(a, g, bw)?;
                }
                if wants(b) {
                    let (s, t) = shape_of(self, b);
                    let op = match (ta, tb) {
                        (false, false) => Op::MatMul {
                            a,
                            b: dy,
                            transpose_a: true,
                            transpose_b: false,
                        },
                        (false, true) => Op::MatMul {
                            a: dy,
                            b: a,
                            transpose_a: true,
                            transpose_b: false,
                        },
                        (true, false) => Op::MatMul {
                            a,
                            b: dy,
                            transpose_a: false,
                            transpose_b: false,
                        },
                        (true, true) => Op::MatMul {
                            a: dy,
                            b: a,
                            transpose_a: true,
                            transpose_b: true,
                        },
                    };
                    let g = self.grad_node(b, bw, op, s, t)?;
                    self.contribute(b, g, bw)?;
                }
            }
            Op::BiasAdd { x, bias } => {
                if wants(x) {
                    self.contribute(x, dy, bw)?;
                }
                if wants(bias) {
                    let (s, t) = shape_of(self, bias);
                    let ds = self.node(dy).shape;
                    let rows = if ds.rank() > 2 {
                        let flat = Shape::new(&[ds.rows(), ds.last()]).map_err(|reason| {
                            GraphError::BadShape {
                                node: node.name.clone(),
                                reason,
                            }
                        })?;
                        self.grad_node(bias, bw, Op::Reshape { x: dy }, flat, t)?
                    } else {
                        dy
                    };
                    let g = if ds.rank() == 1 {
                        dy
                    } else {
                        self.grad_node(
                            bias,
                            bw,
                            Op::ReduceSum {
                                x: rows,
                                axis: Some(0),
                            },
                            s,
                            t,
                        )?
                    };
                    self.contribute(bias, g, bw)?;
                }
            }
            Op::Add { a, b } | Op::Sub { a, b } => {
                if wants(a) {
                    self.contribute(a, dy, bw)?;
                }
                if wants(b) {
                    let g = if matches!(node.op, Op::Sub { .. }) {
                        let (s, t) = shape_of(self, b);
                        self.grad_node(
                            b,
                            bw,
                            Op::Scale {
                                x: dy,
                                factor: -1.0,
                            },
                            s,
                            t,
                        )?
                    } else {
                        dy
                    };
                    self.contribute(b, g, bw)?;
                }
            }
            Op::Mul { a, b } => {
                for (x, other) in [(a, b), (b, a)] {
                    if wants(x) {
                        let (s, t) = shape_of(self, x);
                        let g = self.grad_node(x, bw, Op::Mul { a: dy, b: other }, s, t)?;
                        self.contribute(x, g, bw)?;
                    }
                }
            }
            Op::Scale { x, factor } => {
                if wants(x) {
                    let (s, t) = shape_of(self, x);
                    let g = self.grad_node(x, bw, Op::Scale { x: dy, factor }, s, t)?;
                    self.contribute(x, g, bw)?;
                }
            }
            Op::Relu { x } | Op::Sigmoid { x } | Op::Tanh { x } | Op::Softmax { x } => {
                if wants(x) {
                    let (s, t) = shape_of(self, x);
                    let op = match node.op {
                        Op::Relu { .. } => Op::ReluGrad { dy, y: id },
                        Op::Sigmoid { .. } => Op::SigmoidGrad { dy, y: id },
                        Op::Tanh { .. } => Op::TanhGrad { dy, y: id },
                        _ => Op::SoftmaxGrad { dy, y: id },
                    };
                    let g = self.grad_node(x, bw, op, s, t)?;
                    self.contribute(x, g, bw)?;
                }
            }
            Op::SparseCrossEntropy {
                x,
                labels,
                from_logits,
            } => {
                // Fused form: a softmax feeding the loss is skipped, and the gradient goes
                // straight to its logits. Other users of the softmax still backpropagate
                // through it, and their contributions add up at the logits.
                let (target, from_logits) = match self.node(x).op {
                    Op::Softmax { x: z } if !from_logits && wants(z) => (z, true),
                    _ => (x, from_logits),
                };
                if wants(target) {
                    let (s, t) = shape_of(self, target);
                    let g = self.grad_node(
                        target,
                        bw,
                        Op::SparseCrossEntropyGrad {
                            x: target,
                            labels,
                            dloss: dy,
                            from_logits,
                        },
                        s,
                        t,
                    )?;
                    self.contribute(target, g, bw)?;
                }
            }
            Op::Reshape { x } | Op::Cast { x } => {
                if wants(x) {
                    let (s, t) = shape_of(self, x);
                    let op = if matches!(node.op, Op::Cast { .. }) {
                        Op::Cast { x: dy }
                    } else {
                        Op::Reshape { x: dy }
                    };
                    let g = self.grad_node(x, bw, op, s, t)?;
                    self.contribute(x, g, bw)?;
                }
            }
            Op::Tap { x } => {
                if wants(x) {
                    self.contribute(x, dy, bw)?;
                }
            }
            Op::Concat { a, b } => {
                let ca = self.node(a).shape.last() as u32;
                for (x, offset) in [(a, 0u32), (b, ca)] {
                    if wants(x) {
                        let (s, t) = shape_of(self, x);
                        let g = self.grad_node(x, bw, Op::Slice { x: dy, offset }, s, t)?;
                        self.contribute(x, g, bw)?;
                    }
                }
            }
            Op::ReduceSum { x, axis } | Op::ReduceMean { x, axis } => {
                if wants(x) {
                    let (s, t) = shape_of(self, x);
                    let mut up = dy;
                    if matches!(node.op, Op::ReduceMean { .. }) {
                        let n = match axis {
                            Some(a) => s.dim(a as usize),
                            None => s.elements(),
                        };
                        let ds = self.node(dy).shape;
                        up = self.grad_node(
                            x,
                            bw,
                            Op::Scale {
                                x: dy,
                                factor: 1.0 / n as f32,
                            },
                            ds,
                            t,
                        )?;
                    }
                    let g = self.grad_node(x, bw, Op::Broadcast { x: up, axis }, s, t)?;
                    self.contribute(x, g, bw)?;
                }
            }
            Op::Broadcast { x, axis } => {
                if wants(x) {
                    let (s, t) = shape_of(self, x);
                    let g = self.grad_node(x, bw, Op::ReduceSum { x: dy, axis }, s, t)?;
                    self.contribute(x, g, bw)?;
                }
            }
            op => {
                return Err(GraphError::NotDifferentiable {
                    node: node.name.clone(),
                    op: op.name(),
                })
            }
        }
        Ok(())
    }
}
