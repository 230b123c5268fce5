//! The optimizers a training graph applies, and gradient accumulation.

use crate::error::GraphError;
#[cfg(doc)]
use crate::ops::update::Update;
use crate::DType;

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

    pub(super) fn check(&self) -> Result<(), GraphError> {
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
