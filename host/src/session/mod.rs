//! Sessions: a model compiled for the machine ([`crate::compile`]) trained or run for
//! inference on MNIST-format data through infeed and outfeed queues, on the simulated device.
//!
//! Training is a chain of small steps, each in its own module: [`compile()`] builds and plans
//! the graph, [`train::prepare`] checks the run (data, execution sizes, fit) before anything
//! is printed, `taps` decides which tensors each outfeed reads, `device` runs the executions
//! on a thread of its own in pipeline-schedule order, `drain` is the host's side (outfeed
//! queues drained as elements arrive, epoch callbacks while the device waits), [`evaluate()`]
//! runs inference on the device with the inference schedule, and [`checkpoint`] saves and
//! loads weights.

pub mod checkpoint;
mod device;
mod drain;
pub mod evaluate;
mod run;
mod taps;
pub mod train;

use tessera_sim::system::{SystemError, SystemEstimate};

pub use crate::compile::onnx;
pub use crate::compile::{
    compile, inference_estimate, Checkpoints, Compiled, Heap, OptimizerKind, Recompute,
    SessionError, SessionOptions, Target,
};
pub use crate::summary::{EstimateSummary, IpuMemorySummary, StageSummary};
pub use checkpoint::{load_checkpoint, save_checkpoint};
pub use evaluate::{evaluate, predict, EvaluateOptions, EvaluateReport, Evaluation, Weights};
pub use train::{
    prepare, train, Executions, OutfeedSummary, Prepared, TrainEvent, TrainOptions, TrainReport,
};

/// A rayon pool for the device's kernels, one thread per core (or `RAYON_NUM_THREADS`): the
/// device runs on one of its workers (`ThreadPool::install`) and its large products are cut
/// into pieces the workers share. `None` when threads cannot be started; the device then runs
/// on the calling thread alone, with the same results bit for bit.
fn device_pool() -> Option<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("device-{i}"))
        .build()
        .ok()
}

/// The typed out-of-memory error of an estimate made with `allow_out_of_memory`, if a tile
/// overflows: training and evaluation refuse to run a model that does not fit.
fn check_fits(estimate: &SystemEstimate) -> Result<(), SessionError> {
    match &estimate.out_of_memory {
        Some(oom) => Err(SessionError::from(SystemError::Sim(
            tessera_sim::estimate::SimError::OutOfMemory(Box::new(oom.clone())),
        ))),
        None => Ok(()),
    }
}
