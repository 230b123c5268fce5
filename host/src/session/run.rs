//! What a training run is given and reports as it goes: its options ([`TrainOptions`]), its
//! executions and reporting points ([`Executions`]) and its events ([`TrainEvent`]). The
//! device, the taps and the host's drain loop read them; `train.rs` runs them together.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::inspect::GradientOutfeedMode;
use crate::outfeed::HostTensor;

/// Training options beyond the session's.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    /// Passes over the training data (rounded to whole executions).
    pub epochs: usize,
    /// Run one execution only.
    pub run_single_step: bool,
    /// When gradients are outfed.
    pub gradient_outfeed_mode: GradientOutfeedMode,
    /// Gradient filters (`None`: all; empty: none).
    pub gradients_filters: Option<Vec<String>>,
    /// Activation filters for MaybeOutfeed layers (`None`: all; empty: none).
    pub activations_filters: Option<Vec<String>>,
    /// Seed of weights and shuffling.
    pub seed: u64,
    /// Infeed prefetch depth.
    pub prefetch_depth: usize,
    /// Outfeed buffer depth.
    pub buffer_depth: usize,
    /// Save the final weights here (safetensors).
    pub checkpoint: Option<PathBuf>,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            epochs: 3,
            run_single_step: false,
            gradient_outfeed_mode: GradientOutfeedMode::BeforeApply,
            gradients_filters: Some(vec!["Dense_128".to_string()]),
            activations_filters: None,
            seed: 0,
            prefetch_depth: 3,
            buffer_depth: 3,
            checkpoint: None,
        }
    }
}

/// What training reports to its caller as it goes.
#[derive(Debug)]
pub enum TrainEvent {
    /// Training starts.
    Start {
        /// Micro-batches (per replica) over the whole run.
        total_steps: u64,
        /// Micro-batches between reporting points.
        steps_per_epoch: u64,
    },
    /// Micro-batches done so far (per replica).
    Progress {
        /// Done.
        steps: u64,
    },
    /// A reporting point (an epoch's end, or an execution's when it spans epochs).
    Epoch {
        /// 1-based.
        epoch: usize,
        /// Passes over the training data so far: samples seen / dataset size.
        epochs_seen: f64,
        /// Mean loss since the last reporting point, over micro-batches and replicas.
        loss: f64,
        /// The callbacks' data: (callback name, stacked tensors by key).
        outfeeds: Vec<(String, BTreeMap<String, HostTensor>)>,
    },
}

/// How many executions a run has, and where its reporting points are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Executions {
    /// Weight updates per execution (R).
    pub repeat: usize,
    /// Executions in the run.
    pub executions: usize,
    /// Executions between reporting points.
    pub executions_per_report: usize,
    /// Micro-batches per weight update (M).
    pub micro_batches_per_update: usize,
    /// Replicas.
    pub replicas: usize,
    /// Samples per micro-batch.
    pub batch_size: usize,
    /// Samples in one pass over the training data.
    pub dataset_len: usize,
}

impl Executions {
    /// Samples one execution consumes over all replicas.
    pub fn samples_per_execution(&self) -> usize {
        self.repeat * self.micro_batches_per_update * self.replicas * self.batch_size
    }

    /// Passes over the data after `executions` executions.
    pub fn epochs_after(&self, executions: usize) -> f64 {
        (executions * self.samples_per_execution()) as f64 / self.dataset_len.max(1) as f64
    }

    /// Micro-batches (per replica) in one execution.
    pub fn steps_per_execution(&self) -> usize {
        self.repeat * self.micro_batches_per_update
    }
}
