//! Sessions: a model, the machine and the run options become a training (or inference) plan
//! and its estimate; training and inference run it on MNIST-format data through infeed and
//! outfeed queues, on the simulated device.
//!
//! Training is a chain of small steps, each in its own module: [`compile`] builds and plans
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
pub mod onnx;
mod run;
mod taps;
pub mod train;

use std::path::PathBuf;

use tessera_core::schedule::{overlap_length, AccumulationRule, Schedule};
use tessera_core::{
    Accumulation, DType, Graph, GraphError, NodeId, Optimizer, Plan, PlanError, RunError,
};
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::system::{
    estimate_system, SystemError, SystemEstimate, SystemOptions, MAX_LOOP_COUNT, MAX_SYSTEM_IPUS,
};
use tessera_sim::techniques::Techniques;
pub use tessera_sim::techniques::{Checkpoints, Recompute};

use crate::dataset::DatasetError;
use crate::infeed::InfeedError;
use crate::model::{BuiltModel, Model, ModelError};
use crate::outfeed::OutfeedError;
pub use crate::summary::{EstimateSummary, IpuMemorySummary, StageSummary};
pub use checkpoint::{load_checkpoint, save_checkpoint};
pub use evaluate::{
    evaluate, inference_estimate, predict, EvaluateOptions, EvaluateReport, Evaluation, Weights,
};
pub use train::{
    prepare, train, Executions, OutfeedSummary, Prepared, TrainEvent, TrainOptions, TrainReport,
};

/// Where sessions keep their graphs and plans: the heap, so any model's graph fits.
pub use tessera_sim::Heap;

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

/// Differentiates `loss` with `checkpoints` resolved in `g` (an ONNX node's name, through
/// `layers`, stands for the last graph node it became): plain differentiation without.
pub(crate) fn differentiate(
    g: &mut Graph<Heap>,
    loss: tessera_core::NodeId,
    optimizer: tessera_core::Optimizer,
    accumulation: Accumulation,
    checkpoints: Option<&Checkpoints>,
    layers: &[crate::onnx::Layer],
) -> Result<(), SessionError> {
    let ids: Vec<tessera_core::NodeId> = match checkpoints {
        None => Vec::new(),
        Some(Checkpoints::Auto) => g.auto_checkpoints(loss)?.to_vec(),
        Some(Checkpoints::Named(names)) => {
            let mut ids = Vec::new();
            for name in names {
                let id = match layers.iter().find(|l| &l.name == name && l.end > l.first) {
                    Some(l) => g.nodes()[l.first..l.end]
                        .iter()
                        .rposition(|n| !n.op().is_state() && !n.op().is_update())
                        .and_then(|k| g.find(g.nodes()[l.first + k].name()).ok()),
                    None => g.find(name.as_str()).ok(),
                };
                ids.push(id.ok_or_else(|| {
                    opt_err(
                        "--recompute-checkpoints",
                        format!(
                            "no node is named `{name}` (see `tessera estimate MODEL --layers`)"
                        ),
                    )
                })?);
            }
            ids
        }
    };
    g.differentiate_recomputing(loss, optimizer, accumulation, &ids)?;
    Ok(())
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

/// Why a session cannot be set up or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// An option is out of range or inconsistent.
    #[error("{option}: {message}")]
    Option {
        /// The option, as the command line spells it.
        option: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The model is invalid or does not match the data.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An ONNX model cannot be read or imported.
    #[error(transparent)]
    Onnx(#[from] crate::onnx::OnnxError),
    /// The core refused the graph.
    #[error("building the graph")]
    Graph(#[source] Box<GraphError>),
    /// The core could not plan the graph.
    #[error("planning the graph")]
    Plan(#[source] Box<PlanError>),
    /// The system configuration (schedule, accumulation, mapping, replicas) is invalid, or
    /// the model does not fit.
    #[error(transparent)]
    System(Box<SystemError>),
    /// The data ran out or does not suit the run.
    #[error("{0}")]
    Data(String),
    /// The dataset pipeline failed.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The infeed failed.
    #[error(transparent)]
    Infeed(#[from] InfeedError),
    /// An outfeed failed.
    #[error(transparent)]
    Outfeed(#[from] OutfeedError),
    /// Running the program failed.
    #[error("running the program")]
    Run(#[source] Box<RunError>),
    /// A checkpoint could not be written or read.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl From<GraphError> for SessionError {
    fn from(e: GraphError) -> Self {
        SessionError::Graph(Box::new(e))
    }
}

impl From<SystemError> for SessionError {
    fn from(e: SystemError) -> Self {
        SessionError::System(Box::new(e))
    }
}

impl From<RunError> for SessionError {
    fn from(e: RunError) -> Self {
        SessionError::Run(Box::new(e))
    }
}

impl From<PlanError> for SessionError {
    fn from(e: PlanError) -> Self {
        SessionError::Plan(Box::new(e))
    }
}

/// A model compiled for a session: its training plan, where its taps and gradients are, and
/// how the system runs it.
pub struct Compiled {
    /// The model (pipelining removed if asked).
    pub model: Model,
    /// What the model added to the graph.
    pub built: BuiltModel,
    /// The loss node.
    pub loss: NodeId,
    /// The training plan, the machine and how the system runs it.
    pub target: Target,
}

/// A graph compiled for the machine, as every session's compile ends (`compile_graph`):
/// the plan, the machine, how the system runs it and the options as compiled.
pub struct Target {
    /// The plan (training or inference).
    pub plan: Plan<Heap>,
    /// The machine.
    pub machine: IpuConfig,
    /// The system options of the estimate.
    pub system: SystemOptions,
    /// The session options as compiled (one pipeline stage runs the Sequential schedule).
    pub options: SessionOptions,
}

impl Target {
    /// The estimate (produced even when a tile overflows: see `fits` and `out_of_memory`).
    ///
    /// # Errors
    ///
    /// [`SessionError::System`] for an invalid schedule, accumulation count, mapping or
    /// execution size.
    pub fn estimate(&self) -> Result<SystemEstimate, SessionError> {
        Ok(estimate_system(&self.plan, &self.machine, &self.system)?)
    }

    /// The estimate of cycles alone: every tile's memory left unaccounted (the memory figures
    /// are zero and the target fits), which is all a profile of where time goes needs.
    ///
    /// # Errors
    ///
    /// As [`Target::estimate`].
    pub fn estimate_cycles(&self) -> Result<SystemEstimate, SessionError> {
        let system = SystemOptions {
            memory: false,
            ..self.system.clone()
        };
        Ok(estimate_system(&self.plan, &self.machine, &system)?)
    }
}

/// What a front end hands the compile besides the forward graph and the session options:
/// whether it trains, where its stages run and how its executions are counted.
pub(crate) struct Front<'a> {
    /// Training: the loss and the front end's layers (which name recomputation checkpoints).
    /// `None`: inference.
    pub train: Option<(NodeId, &'a [crate::onnx::Layer])>,
    /// Stage -> IPU (`None`: stage k on IPU k).
    pub device_mapping: Option<Vec<usize>>,
    /// Whose rule the accumulation count must meet: TensorFlow's (model files) or PopART's
    /// (ONNX models, which PopART and PopTorch compile).
    pub accumulation_rule: AccumulationRule,
    /// How an execution's micro-batches are counted.
    pub loops: Loops,
}

/// How an execution's micro-batches are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loops {
    /// As the session options say (`repeat_count`, `steps_per_execution`); an inference
    /// runs M micro-batches rounded up to a multiple of its schedule's overlap.
    Options,
    /// An evaluation's: K micro-batches an execution, with no training loop.
    Evaluation(usize),
}

/// The compile path every session shares once its front end (a model file's layers, an ONNX
/// import) has built the forward graph `g` and its loss: for training, the backward pass and
/// the optimizer's updates, accumulated over `gradient_accumulation_count` micro-batches; the
/// plan; the machine; the schedule (one pipeline stage runs Sequential: no overlap, so no
/// schedule constraint on M); and the system options of the estimate, whole: the front's
/// placement and executions, and the techniques (an inference's without offloads: it keeps
/// no optimizer state and stashes nothing).
///
/// # Errors
///
/// [`SessionError::Graph`] / [`SessionError::Plan`] when the graph cannot be differentiated
/// or planned, [`SessionError::Option`] for a checkpoint no node is named.
pub(crate) fn compile_graph(
    mut g: Graph<Heap>,
    so: &SessionOptions,
    front: Front<'_>,
) -> Result<Target, SessionError> {
    if let Some((loss, layers)) = front.train {
        // At most MAX_LOOP_COUNT (check_options).
        let m = u32::try_from(so.gradient_accumulation_count).unwrap_or(u32::MAX);
        differentiate(
            &mut g,
            loss,
            so.optimizer.with_rate(so.learning_rate),
            Accumulation {
                // The weights' type unless asked (TensorFlow's `gradient_accumulation_dtype`).
                dtype: so.accumulation_dtype,
                ..Accumulation::new(m)
            },
            so.techniques.recompute.checkpoints.as_ref(),
            layers,
        )?;
    }
    let plan = Plan::new(&g)?;
    let mut options = so.clone();
    let stages = g.stage_count();
    if stages == 1 {
        options.schedule = Schedule::Sequential;
    }
    let training = front.train.is_some();
    let (inference_micro_batches, loops) = match front.loops {
        Loops::Evaluation(k) => (k, false),
        Loops::Options if training => (1, true),
        Loops::Options => {
            let overlap = overlap_length(options.schedule, stages, false);
            (
                options.gradient_accumulation_count.div_ceil(overlap) * overlap,
                true,
            )
        }
    };
    let system = SystemOptions {
        schedule: options.schedule,
        device_mapping: front.device_mapping,
        accumulation_rule: front.accumulation_rule,
        replicas: options.replicas,
        micro_batch: options.batch_size as u64,
        inference_micro_batches,
        techniques: if training {
            options.techniques.clone()
        } else {
            options.techniques.for_inference()
        },
        allow_out_of_memory: true,
        steps_per_execution: options.steps_per_execution.filter(|_| loops),
        repeat_count: options.repeat_count.filter(|_| loops),
        ..SystemOptions::default()
    };
    Ok(Target {
        plan,
        machine: IpuConfig::preset(options.ipu),
        system,
        options,
    })
}

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

pub(crate) fn opt_err(option: &'static str, message: String) -> SessionError {
    SessionError::Option { option, message }
}

/// The model as the options place it: every layer on one IPU under `no_pipelining`.
fn placed(model: &Model, options: &SessionOptions) -> Model {
    if options.no_pipelining {
        model.clone().without_pipelining()
    } else {
        model.clone()
    }
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

/// Checks the options every session shares.
fn check_options(options: &SessionOptions) -> Result<(), SessionError> {
    let t = &options.techniques;
    if t.replicated_tensor_sharding && !t.offload.optimizer_state {
        return Err(opt_err(
            "--replicated-tensor-sharding",
            "shards offloaded optimizer state: it needs the state offloaded (drop --no-offload-optimizer-state, as TensorFlow's replicated_optimizer_state_sharding needs offload_weight_update_variables)".into(),
        ));
    }
    if options.batch_size == 0 {
        return Err(opt_err("--batch-size", "must be at least 1".into()));
    }
    if options.gradient_accumulation_count == 0 {
        return Err(opt_err(
            "--gradient-accumulation-count",
            "must be at least 1".into(),
        ));
    }
    if options.replicas == 0 {
        return Err(opt_err("--replicas", "must be at least 1".into()));
    }
    if options.replicas > MAX_SYSTEM_IPUS {
        return Err(opt_err(
            "--replicas",
            format!(
                "{} is more replicas than IPUs in the largest IPU-POD system ({MAX_SYSTEM_IPUS})",
                options.replicas
            ),
        ));
    }
    for (option, count) in [
        (
            "--gradient-accumulation-count",
            Some(options.gradient_accumulation_count),
        ),
        ("--repeat-count", options.repeat_count),
        ("--steps-per-execution", options.steps_per_execution),
    ] {
        if let Some(count) = count.filter(|&c| c > MAX_LOOP_COUNT) {
            return Err(opt_err(
                option,
                format!(
                    "{count} is more than an on-device loop runs (Poplar's repeat count is 32-bit: at most {MAX_LOOP_COUNT})"
                ),
            ));
        }
    }
    if !(options.learning_rate.is_finite() && options.learning_rate > 0.0) {
        return Err(opt_err(
            "--learning-rate",
            format!("{} is not a positive number", options.learning_rate),
        ));
    }
    if !matches!(options.dtype, DType::F32 | DType::F16) {
        return Err(opt_err("--dtype", "use f32 or f16".into()));
    }
    Ok(())
}

/// Builds the training graph of `model` under `options` and plans it.
///
/// # Errors
///
/// [`SessionError::Option`] for out-of-range options, [`SessionError::Model`] /
/// [`SessionError::Graph`] / [`SessionError::Plan`] when the model cannot be built.
pub fn compile(model: &Model, options: &SessionOptions) -> Result<Compiled, SessionError> {
    check_options(options)?;
    let model = placed(model, options);
    let mut g: Graph<Heap> = Graph::new();
    let built = model.build(&mut g, options.batch_size, options.dtype, true)?;
    let labels = g.input("labels", &[options.batch_size], DType::I32)?;
    let loss =
        g.sparse_categorical_crossentropy("loss", built.output, labels, !built.softmax_output)?;
    let target = compile_graph(
        g,
        options,
        Front {
            train: Some((loss, &[])),
            device_mapping: model.device_mapping.clone(),
            accumulation_rule: AccumulationRule::TensorFlow,
            loops: Loops::Options,
        },
    )?;
    Ok(Compiled {
        model,
        built,
        loss,
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gradient accumulators take the weights' type unless asked (TensorFlow's
    /// `gradient_accumulation_dtype` defaults to the variable's type, PopART SGD's `accumType`
    /// to the weight's).
    #[test]
    fn accumulators_take_the_weights_type_unless_asked() {
        let model = crate::model::shipped("sequential").unwrap().unwrap();
        let accumulators = |asked: Option<DType>| -> Vec<DType> {
            let options = SessionOptions {
                dtype: DType::F16,
                gradient_accumulation_count: 4,
                accumulation_dtype: asked,
                ..SessionOptions::default()
            };
            let c = compile(&model, &options).unwrap();
            let g = c.target.plan.graph();
            let found: Vec<DType> = g
                .nodes()
                .iter()
                .filter(|n| n.name().ends_with("/accumulator"))
                .map(|n| n.dtype())
                .collect();
            assert!(!found.is_empty());
            found
        };
        assert!(accumulators(None).iter().all(|&d| d == DType::F16));
        assert!(accumulators(Some(DType::F32))
            .iter()
            .all(|&d| d == DType::F32));
    }
}
