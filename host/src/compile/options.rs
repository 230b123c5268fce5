//! The resolved options of a compile: what `tessera estimate`, `train`, `evaluate` and
//! `predict` share, and the optimizers they offer.

use tessera_core::schedule::Schedule;
use tessera_core::{DType, Optimizer};
use tessera_sim::machine::Preset;
use tessera_sim::techniques::Techniques;

/// The optimizers a session offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OptimizerKind {
    /// Plain SGD.
    #[default]
    Sgd,
    /// SGD with momentum 0.9.
    Momentum,
    /// Adam (Keras defaults).
    Adam,
    /// LAMB (beta1 0.9, beta2 0.999, epsilon 1e-6, weight decay 0.01: Graphcore's BERT
    /// pre-training's), Adam's moments with a per-tensor trust ratio.
    Lamb,
    /// LARS (momentum 0.9, weight decay 1e-4, trust coefficient 0.001), momentum SGD with a
    /// per-tensor trust ratio.
    Lars,
}

impl OptimizerKind {
    /// The learning rate used when none is given: 0.1 for SGD (the examples'), 0.01 for
    /// momentum, 0.001 for Adam (Keras'), 0.006 for LAMB (Graphcore's BERT-Base phase 1),
    /// 0.1 for LARS.
    pub fn default_learning_rate(self) -> f32 {
        match self {
            OptimizerKind::Sgd | OptimizerKind::Lars => 0.1,
            OptimizerKind::Momentum => 0.01,
            OptimizerKind::Adam => 0.001,
            OptimizerKind::Lamb => 0.006,
        }
    }

    /// The core optimizer at `learning_rate`.
    pub fn with_rate(self, learning_rate: f32) -> Optimizer {
        match self {
            OptimizerKind::Sgd => Optimizer::sgd(learning_rate),
            OptimizerKind::Momentum => Optimizer::momentum(learning_rate, 0.9),
            OptimizerKind::Adam => Optimizer::adam(learning_rate),
            OptimizerKind::Lamb => Optimizer::lamb(learning_rate),
            OptimizerKind::Lars => Optimizer::lars(learning_rate),
        }
    }

    /// Whether the optimizer keeps state besides the weights (what offloading moves).
    pub fn has_state(self) -> bool {
        !matches!(self, OptimizerKind::Sgd)
    }
}

/// How a model is compiled and placed: what `tessera estimate`, `train`, `evaluate` and
/// `predict` share.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionOptions {
    /// Samples per micro-batch (per replica).
    pub batch_size: usize,
    /// Micro-batches per weight update (M).
    pub gradient_accumulation_count: usize,
    /// Weight updates per execution (R); exclusive with `steps_per_execution`.
    pub repeat_count: Option<usize>,
    /// Micro-batches per execution (K, a multiple of M).
    pub steps_per_execution: Option<usize>,
    /// Pipeline schedule.
    pub schedule: Schedule,
    /// Replicas.
    pub replicas: usize,
    /// IPU generation.
    pub ipu: Preset,
    /// Optimizer.
    pub optimizer: OptimizerKind,
    /// Learning rate.
    pub learning_rate: f32,
    /// Weights' and activations' element type.
    pub dtype: DType,
    /// Put every layer in one stage on one IPU.
    pub no_pipelining: bool,
    /// The gradient accumulators' element type (TensorFlow's `gradient_accumulation_dtype`,
    /// PopART's `accumType`); `None`: the weights' type, as both default.
    pub accumulation_dtype: Option<DType>,
    /// The memory techniques (see [`tessera_sim::techniques`]).
    pub techniques: Techniques,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            batch_size: 32,
            gradient_accumulation_count: 4,
            repeat_count: None,
            steps_per_execution: None,
            schedule: Schedule::Grouped,
            replicas: 1,
            ipu: Preset::Mk2,
            optimizer: OptimizerKind::Sgd,
            learning_rate: 0.1,
            dtype: DType::F32,
            no_pipelining: false,
            accumulation_dtype: None,
            techniques: Techniques::default(),
        }
    }
}
