//! In-place updates of state: optimizers (SGD, momentum, Adam in Keras' forms), step counters,
//! gradient accumulators and resets. They produce no tensor; autodiff emits them.

use crate::error::{GraphError, RunError};
use crate::graph::{Graph, NodeId, NodeRef};
use crate::kernels::{self as k, Parallel};
use crate::op::{Op, Operands};
use crate::plan::{Place, Plan};
use crate::roles::Roles;
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{AccumulationMethod, DType};

/// An in-place update of state tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Update {
    /// `var -= lr * grad`.
    Sgd {
        /// The variable.
        var: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// Learning rate.
        lr: f32,
    },
    /// Keras momentum: `v = momentum * v - lr * grad; var += v`.
    Momentum {
        /// The variable.
        var: NodeId,
        /// Its velocity (optimizer state).
        velocity: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// Learning rate.
        lr: f32,
        /// Momentum.
        momentum: f32,
    },
    /// LAMB (You et al., 2020, as Graphcore's BERT pre-training runs it): Adam's moments
    /// with bias correction, the step `r = m_hat / (sqrt(v_hat) + epsilon) + weight_decay x
    /// var`, scaled per tensor by the trust ratio `||var|| / ||r||` (1 when either norm is
    /// 0): `var -= lr x ratio x r`.
    Lamb {
        /// The variable.
        var: NodeId,
        /// First moment (optimizer state).
        m: NodeId,
        /// Second moment (optimizer state).
        v: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// The step counter (optimizer state, i32 scalar).
        step: NodeId,
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator fuzz.
        epsilon: f32,
        /// Decoupled weight decay.
        weight_decay: f32,
    },
    /// LARS (You et al., 2017): momentum SGD whose step is scaled per tensor by the trust
    /// ratio `eta x ||var|| / (||grad|| + weight_decay x ||var||)` (1 when either norm is
    /// 0): `v = momentum x v + lr x ratio x (grad + weight_decay x var); var -= v`.
    Lars {
        /// The variable.
        var: NodeId,
        /// Its velocity (optimizer state).
        velocity: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// Learning rate.
        lr: f32,
        /// Momentum.
        momentum: f32,
        /// Weight decay.
        weight_decay: f32,
        /// Trust coefficient.
        eta: f32,
    },
    /// Adam (Keras form), using the shared step counter (which is about to become `step + 1`).
    Adam {
        /// The variable.
        var: NodeId,
        /// First moment (optimizer state).
        m: NodeId,
        /// Second moment (optimizer state).
        v: NodeId,
        /// Its gradient.
        grad: NodeId,
        /// The step counter (optimizer state, i32 scalar).
        step: NodeId,
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Denominator fuzz.
        epsilon: f32,
    },
    /// `counter += 1` (a step count).
    Increment {
        /// The counter (i32 scalar).
        counter: NodeId,
    },
    /// Adds a micro-batch's gradient into its accumulator: SUM `acc += g`, MEAN
    /// `acc += g / count`, RUNNING_MEAN `acc = acc * n / (n + 1) + g / (n + 1)` with `n` the
    /// micro-batches accumulated so far (the counter's value).
    Accumulate {
        /// The accumulator (state).
        acc: NodeId,
        /// The micro-batch's gradient.
        grad: NodeId,
        /// Micro-batches accumulated so far (i32 scalar state).
        counter: NodeId,
        /// How gradients combine.
        method: AccumulationMethod,
        /// Micro-batches per weight update.
        count: u32,
    },
    /// Sets every element of a state tensor to `value` (resetting accumulators).
    Fill {
        /// The tensor.
        x: NodeId,
        /// The value.
        value: f32,
    },
    /// `x = momentum * x + (1 - momentum) * value`: a running average kept as state (batch
    /// normalisation's running mean and variance).
    MovingAverage {
        /// The running average (state).
        x: NodeId,
        /// This step's value (same shape).
        value: NodeId,
        /// Weight of the old average, in [0, 1).
        momentum: f32,
    },
}

impl Update {
    /// The op's name.
    pub const fn name(&self) -> &'static str {
        match self {
            Update::Sgd { .. } => "ApplySgd",
            Update::Momentum { .. } => "ApplyMomentum",
            Update::Adam { .. } => "ApplyAdam",
            Update::Lamb { .. } => "ApplyLamb",
            Update::Lars { .. } => "ApplyLars",
            Update::Increment { .. } => "Increment",
            Update::Accumulate { .. } => "Accumulate",
            Update::Fill { .. } => "Fill",
            Update::MovingAverage { .. } => "MovingAverage",
        }
    }

    /// Operands (read, and for state, written).
    pub fn operands(&self) -> Operands {
        match *self {
            Update::Sgd { var, grad, .. } => Operands::of(&[var, grad]),
            Update::Momentum {
                var,
                velocity,
                grad,
                ..
            } => Operands::of(&[var, velocity, grad]),
            Update::Adam {
                var,
                m,
                v,
                grad,
                step,
                ..
            } => Operands::of(&[var, m, v, grad, step]),
            Update::Lamb {
                var,
                m,
                v,
                grad,
                step,
                ..
            } => Operands::of(&[var, m, v, grad, step]),
            Update::Lars {
                var,
                velocity,
                grad,
                ..
            } => Operands::of(&[var, velocity, grad]),
            Update::Increment { counter } => Operands::of(&[counter]),
            Update::Accumulate {
                acc, grad, counter, ..
            } => Operands::of(&[acc, grad, counter]),
            Update::Fill { x, .. } => Operands::of(&[x]),
            Update::MovingAverage { x, value, .. } => Operands::of(&[x, value]),
        }
    }

    /// The state tensors the update writes.
    pub fn writes(&self) -> Operands {
        match *self {
            Update::Sgd { var, .. } => Operands::of(&[var]),
            Update::Momentum { var, velocity, .. } => Operands::of(&[var, velocity]),
            Update::Adam { var, m, v, .. } | Update::Lamb { var, m, v, .. } => {
                Operands::of(&[var, m, v])
            }
            Update::Lars { var, velocity, .. } => Operands::of(&[var, velocity]),
            Update::Increment { counter } => Operands::of(&[counter]),
            Update::Accumulate { acc, .. } => Operands::of(&[acc]),
            Update::Fill { x, .. } | Update::MovingAverage { x, .. } => Operands::of(&[x]),
        }
    }
}

impl<S: Storage> Graph<S> {
    /// `var -= lr * grad`: an SGD update of the variable `var` by `grad` (same shape and
    /// element type), for a training step written by hand, as op-level estimates write a
    /// layer's passes (autodiff emits its own updates). It produces no tensor.
    pub fn apply_sgd(
        &mut self,
        name: &str,
        var: impl NodeRef,
        grad: impl NodeRef,
        lr: f32,
    ) -> Result<NodeId, GraphError> {
        let (var, grad) = (var.resolve(self)?, grad.resolve(self)?);
        let n = self.check_name(name)?;
        let dtype = self.same_dtype(&n, "ApplySgd", var, grad)?;
        let (sv, sg) = (self.node(var).shape, self.node(grad).shape);
        if !matches!(self.node(var).op, Op::Variable { .. }) {
            return Err(GraphError::BadAttribute {
                node: n,
                op: "ApplySgd",
                rule: "the updated operand must be a variable",
            });
        }
        if sv != sg {
            return Err(GraphError::ShapeMismatch {
                node: n,
                op: "ApplySgd",
                rule: "the gradient has the variable's shape",
                left: sv,
                right: sg,
            });
        }
        self.push(
            n,
            Op::Update(Update::Sgd { var, grad, lr }),
            Shape::scalar(),
            dtype,
            Roles::UPDATE,
        )
    }
}

/// LAMB's step for one element: the bias-corrected Adam direction plus the weight decay.
fn lamb_step(m: f32, v: f32, w: f32, c1: f32, c2: f32, epsilon: f32, weight_decay: f32) -> f32 {
    (m / c1) / (libm::sqrtf(v / c2) + epsilon) + weight_decay * w
}

/// The trust ratio `eta x ||w|| / (||d|| + weight_decay x ||w||)` from the squared norms of the
/// weights `w2` and of the direction `d2`; 1 when either norm is 0 (LAMB's and LARS' rule for
/// fresh or zero tensors).
fn trust_ratio(w2: f64, d2: f64, eta: f32, weight_decay: f32) -> f32 {
    let (w, d) = (libm::sqrt(w2), libm::sqrt(d2));
    let denominator = d + f64::from(weight_decay) * w;
    if w > 0.0 && denominator > 0.0 {
        (f64::from(eta) * w / denominator) as f32
    } else {
        1.0
    }
}

/// Applies `op` to the state in place; gradients and values are read where the plan put them
/// (the arena, or the state for accumulators).
pub(crate) fn run<S: Storage>(
    op: &Update,
    plan: &Plan<S>,
    arena: &[u8],
    st: &mut [u8],
    par: &dyn Parallel,
) -> Result<(), RunError> {
    let cx = Cx { plan, arena, par };
    match *op {
        Update::Sgd { .. } => sgd(&cx, op, st),
        Update::Momentum { .. } => momentum(&cx, op, st),
        Update::Adam { .. } => adam(&cx, op, st),
        Update::Lamb { .. } => lamb(&cx, op, st),
        Update::Lars { .. } => lars(&cx, op, st),
        Update::Increment { .. } => increment(&cx, op, st),
        Update::Accumulate { .. } => accumulate(&cx, op, st),
        Update::Fill { .. } => fill(&cx, op, st),
        Update::MovingAverage { .. } => moving_average(&cx, op, st),
    }
}

/// What an update reads besides the state: the plan (where each tensor is) and the arena.
struct Cx<'a, S: Storage> {
    plan: &'a Plan<S>,
    arena: &'a [u8],
    par: &'a dyn Parallel,
}

impl<S: Storage> Cx<'_, S> {
    /// Where tensor `x` starts (in the arena or the state).
    fn off(&self, x: NodeId) -> usize {
        self.plan.slots[x.index()].offset
    }

    /// The node of tensor `x`.
    fn node(&self, x: NodeId) -> &crate::graph::Node {
        self.plan.graph.node(x)
    }

    /// A gradient lives in the arena, or in the state when it is an accumulator.
    fn grad_in_state(&self, g: NodeId) -> bool {
        self.plan.slots[g.index()].place == Place::State
    }

    /// Element `i` of gradient (or value) `g`, wherever it lives.
    fn load_grad(&self, st: &[u8], g: NodeId, i: usize) -> f32 {
        let (s, t) = (self.plan.slots[g.index()], self.node(g).dtype);
        if s.place == Place::State {
            k::load(&st[s.offset..], t, i)
        } else {
            k::load(&self.arena[s.offset..], t, i)
        }
    }
}

/// Plain SGD: `var -= lr * grad`.
fn sgd<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Sgd { var, grad, lr } = *op else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let par = cx.par;
    let arena = cx.arena;
    let grad_in_state = |g: NodeId| cx.grad_in_state(g);
    let load_grad = |st: &[u8], g: NodeId, i: usize| cx.load_grad(st, g, i);
    let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
    let wo = off(var);
    if !grad_in_state(grad) && node_of(grad).dtype == t {
        let g = &arena[off(grad)..off(grad) + node_of(grad).bytes()];
        let w = &mut st[wo..wo + n * t.size()];
        k::zip_in_place_on(par, w, g, t, n, |w, g| w - lr * g);
    } else if grad_in_state(grad) && node_of(grad).dtype == t && off(grad) != wo {
        // An accumulated gradient: another region of the state.
        let (go, len) = (off(grad), n * t.size());
        let (w, g) = if wo < go {
            let (a, b) = st.split_at_mut(go);
            (&mut a[wo..wo + len], &b[..len])
        } else {
            let (a, b) = st.split_at_mut(wo);
            (&mut b[..len], &a[go..go + len])
        };
        k::zip_in_place_on(par, w, g, t, n, |w, g| w - lr * g);
    } else {
        for i in 0..n {
            let v = k::load(&st[wo..], t, i) - lr * load_grad(st, grad, i);
            k::store(&mut st[wo..], t, i, v);
        }
    }
    Ok(())
}

/// Momentum (Keras' SGD with momentum).
fn momentum<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Momentum {
        var,
        velocity,
        grad,
        lr,
        momentum,
    } = *op
    else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let load_grad = |st: &[u8], g: NodeId, i: usize| cx.load_grad(st, g, i);
    let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
    let (wo, vo) = (off(var), off(velocity));
    for i in 0..n {
        let v = momentum * k::load(&st[vo..], t, i) - lr * load_grad(st, grad, i);
        k::store(&mut st[vo..], t, i, v);
        let w = k::load(&st[wo..], t, i) + v;
        k::store(&mut st[wo..], t, i, w);
    }
    Ok(())
}

/// The number of the step being taken (1 for the first), from the step counter at `at`.
fn step_number(st: &[u8], at: usize) -> f32 {
    (k::load_int(&st[at..], DType::I32, 0) + 1) as f32
}

/// Adam's (and LAMB's) moments of element `i` with gradient `gi`, updated in place at
/// offsets `(mo, vo)`: `m += (g - m)(1 - beta1)`, `v += (g^2 - v)(1 - beta2)`.
fn update_moments(
    st: &mut [u8],
    t: DType,
    (mo, vo): (usize, usize),
    i: usize,
    gi: f32,
    (beta1, beta2): (f32, f32),
) -> (f32, f32) {
    let mi = k::load(&st[mo..], t, i);
    let mi = mi + (gi - mi) * (1.0 - beta1);
    k::store(&mut st[mo..], t, i, mi);
    let vi = k::load(&st[vo..], t, i);
    let vi = vi + (gi * gi - vi) * (1.0 - beta2);
    k::store(&mut st[vo..], t, i, vi);
    (mi, vi)
}

/// Adam, its step counter read from the state.
fn adam<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Adam {
        var,
        m,
        v,
        grad,
        step,
        lr,
        beta1,
        beta2,
        epsilon,
    } = *op
    else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let load_grad = |st: &[u8], g: NodeId, i: usize| cx.load_grad(st, g, i);
    let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
    let local = step_number(st, off(step));
    let lr_t = lr * libm::sqrtf(1.0 - libm::powf(beta2, local)) / (1.0 - libm::powf(beta1, local));
    let (wo, mo, vo) = (off(var), off(m), off(v));
    for i in 0..n {
        let gi = load_grad(st, grad, i);
        let (mi, vi) = update_moments(st, t, (mo, vo), i, gi, (beta1, beta2));
        let w = k::load(&st[wo..], t, i) - lr_t * mi / (libm::sqrtf(vi) + epsilon);
        k::store(&mut st[wo..], t, i, w);
    }
    Ok(())
}

/// LAMB: Adam's moments, the step scaled by the trust ratio of the variable's and the step's norms.
fn lamb<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Lamb {
        var,
        m,
        v,
        grad,
        step,
        lr,
        beta1,
        beta2,
        epsilon,
        weight_decay,
    } = *op
    else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let load_grad = |st: &[u8], g: NodeId, i: usize| cx.load_grad(st, g, i);
    let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
    let local = step_number(st, off(step));
    let (c1, c2) = (
        1.0 - libm::powf(beta1, local),
        1.0 - libm::powf(beta2, local),
    );
    let (wo, mo, vo) = (off(var), off(m), off(v));
    // The moments, and the norms of the variable and of the step (in f64, in order).
    let (mut w2, mut r2) = (0f64, 0f64);
    for i in 0..n {
        let gi = load_grad(st, grad, i);
        let (mi, vi) = update_moments(st, t, (mo, vo), i, gi, (beta1, beta2));
        let wi = k::load(&st[wo..], t, i);
        let r = lamb_step(mi, vi, wi, c1, c2, epsilon, weight_decay);
        w2 += f64::from(wi) * f64::from(wi);
        r2 += f64::from(r) * f64::from(r);
    }
    let ratio = trust_ratio(w2, r2, 1.0, 0.0);
    for i in 0..n {
        let (mi, vi) = (k::load(&st[mo..], t, i), k::load(&st[vo..], t, i));
        let wi = k::load(&st[wo..], t, i);
        let r = lamb_step(mi, vi, wi, c1, c2, epsilon, weight_decay);
        k::store(&mut st[wo..], t, i, wi - lr * ratio * r);
    }
    Ok(())
}

/// LARS: momentum with the update scaled by the trust ratio of the variable's and the gradient's norms.
fn lars<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Lars {
        var,
        velocity,
        grad,
        lr,
        momentum,
        weight_decay,
        eta,
    } = *op
    else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let load_grad = |st: &[u8], g: NodeId, i: usize| cx.load_grad(st, g, i);
    let (t, n) = (node_of(var).dtype, node_of(var).shape.elements());
    let (wo, vo) = (off(var), off(velocity));
    let (mut w2, mut g2) = (0f64, 0f64);
    for i in 0..n {
        let (wi, gi) = (k::load(&st[wo..], t, i), load_grad(st, grad, i));
        w2 += f64::from(wi) * f64::from(wi);
        g2 += f64::from(gi) * f64::from(gi);
    }
    let ratio = trust_ratio(w2, g2, eta, weight_decay);
    for i in 0..n {
        let (wi, gi) = (k::load(&st[wo..], t, i), load_grad(st, grad, i));
        let vi = momentum * k::load(&st[vo..], t, i) + lr * ratio * (gi + weight_decay * wi);
        k::store(&mut st[vo..], t, i, vi);
        k::store(&mut st[wo..], t, i, wi - vi);
    }
    Ok(())
}

/// A counter's increment.
fn increment<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Increment { counter } = *op else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let o = off(counter);
    let c = k::load_int(&st[o..], DType::I32, 0).wrapping_add(1) as i32;
    st[o..o + 4].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

/// A gradient added into its accumulator (sum, mean or running mean).
fn accumulate<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Accumulate {
        acc,
        grad,
        counter,
        method,
        count,
    } = *op
    else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let par = cx.par;
    let arena = cx.arena;
    let grad_in_state = |g: NodeId| cx.grad_in_state(g);
    let load_grad = |st: &[u8], g: NodeId, i: usize| cx.load_grad(st, g, i);
    let (t, n) = (node_of(acc).dtype, node_of(acc).shape.elements());
    let ao = off(acc);
    let seen = k::load_int(&st[off(counter)..], DType::I32, 0) as f32;
    if !grad_in_state(grad) && node_of(grad).dtype == t {
        // The common case, vectorisable; the same arithmetic as the loop below.
        let g = &arena[off(grad)..off(grad) + node_of(grad).bytes()];
        let a = &mut st[ao..ao + n * t.size()];
        match method {
            AccumulationMethod::Sum => {
                k::zip_in_place_on(par, a, g, t, n, |a, g| a + g);
            }
            AccumulationMethod::Mean => {
                let c = count as f32;
                k::zip_in_place_on(par, a, g, t, n, |a, g| a + g / c);
            }
            AccumulationMethod::RunningMean => {
                let (keep, next) = (seen / (seen + 1.0), seen + 1.0);
                k::zip_in_place_on(par, a, g, t, n, |a, g| a * keep + g / next);
            }
        }
        return Ok(());
    }
    for i in 0..n {
        let g = load_grad(st, grad, i);
        let a = k::load(&st[ao..], t, i);
        let v = match method {
            AccumulationMethod::Sum => a + g,
            AccumulationMethod::Mean => a + g / count as f32,
            AccumulationMethod::RunningMean => a * (seen / (seen + 1.0)) + g / (seen + 1.0),
        };
        k::store(&mut st[ao..], t, i, v);
    }
    Ok(())
}

/// A tensor of the state filled with one value (an accumulator's or counter's reset).
fn fill<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::Fill { x, value } = *op else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let par = cx.par;
    let (t, n) = (node_of(x).dtype, node_of(x).shape.elements());
    let o = off(x);
    k::fill_on(par, &mut st[o..o + n * t.size()], t, n, value);
    Ok(())
}

/// A moving average (batch normalisation's running statistics).
fn moving_average<S: Storage>(cx: &Cx<'_, S>, op: &Update, st: &mut [u8]) -> Result<(), RunError> {
    let Update::MovingAverage { x, value, momentum } = *op else {
        return Ok(());
    };
    let off = |x: NodeId| cx.off(x);
    let node_of = |x: NodeId| cx.node(x);
    let load_grad = |st: &[u8], g: NodeId, i: usize| cx.load_grad(st, g, i);
    let (t, n) = (node_of(x).dtype, node_of(x).shape.elements());
    let o = off(x);
    for i in 0..n {
        let old = k::load(&st[o..], t, i);
        let v = momentum * old + (1.0 - momentum) * load_grad(st, value, i);
        k::store(&mut st[o..], t, i, v);
    }
    Ok(())
}
