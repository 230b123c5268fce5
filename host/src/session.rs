//! Sessions: a model, the machine and the run options become a training plan and its
//! estimate; training runs it on MNIST-format data with infeed and outfeed queues.
//!
//! Training runs the device program on a thread of its own (the pipeline schedule, micro-batch
//! by micro-batch, every replica) while the calling thread plays the host: it drains the
//! outfeed queues as elements arrive (so a small `buffer_depth` stalls the device only as long
//! as the host is slow), reports progress, and at each epoch's end (the device waits) hands
//! the epoch's loss and everything the outfeeds carried to the caller's callback.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_core::schedule::Schedule;
use tessera_core::{
    Accumulation, DType, Graph, GraphError, NodeId, Optimizer, Plan, PlanError, Roles, RunError,
};
use tessera_sim::lower::LowerOptions;
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::runner::{Observe, PipelineRunner};
use tessera_sim::system::{estimate_system, SystemError, SystemEstimate, SystemOptions};

use crate::dataset::{Dataset, DatasetError};
use crate::idx::Mnist;
use crate::infeed::{InfeedError, InfeedQueue};
use crate::inspect::{Collector, GradientOutfeedMode, MaybeOutfeedQueue};
use crate::model::{BuiltModel, Model, ModelError};
use crate::outfeed::{HostTensor, OutfeedError, OutfeedMode, OutfeedQueue};
pub use crate::summary::{EstimateSummary, IpuMemorySummary, StageSummary};

/// Graph capacity of sessions (nodes of the training graph).
pub const NODES: usize = 256;

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
}

impl OptimizerKind {
    /// The learning rate used when none is given: 0.1 for SGD (the examples'), 0.01 for
    /// momentum, 0.001 for Adam (Keras').
    pub fn default_learning_rate(self) -> f32 {
        match self {
            OptimizerKind::Sgd => 0.1,
            OptimizerKind::Momentum => 0.01,
            OptimizerKind::Adam => 0.001,
        }
    }

    /// Parses `sgd`, `momentum` or `adam`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sgd" => Some(OptimizerKind::Sgd),
            "momentum" => Some(OptimizerKind::Momentum),
            "adam" => Some(OptimizerKind::Adam),
            _ => None,
        }
    }

    /// The core optimizer at `learning_rate`.
    pub fn with_rate(self, learning_rate: f32) -> Optimizer {
        match self {
            OptimizerKind::Sgd => Optimizer::sgd(learning_rate),
            OptimizerKind::Momentum => Optimizer::momentum(learning_rate, 0.9),
            OptimizerKind::Adam => Optimizer::adam(learning_rate),
        }
    }
}

/// Parses a schedule name (`grouped`, `interleaved`, `sequential`, any case).
pub fn parse_schedule(s: &str) -> Option<Schedule> {
    match s.to_ascii_lowercase().as_str() {
        "grouped" => Some(Schedule::Grouped),
        "interleaved" => Some(Schedule::Interleaved),
        "sequential" => Some(Schedule::Sequential),
        _ => None,
    }
}

/// How a model is compiled and placed: what `tessera estimate` and `tessera train` share.
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
    /// Keep optimizer state in streaming memory.
    pub offload_optimizer_state: bool,
    /// Weights' and activations' element type.
    pub dtype: DType,
    /// Put every layer in one stage on one IPU.
    pub no_pipelining: bool,
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
            offload_optimizer_state: false,
            dtype: DType::F32,
            no_pipelining: false,
        }
    }
}

/// Why a session cannot be set up or run.
#[derive(Debug)]
#[non_exhaustive]
pub enum SessionError {
    /// An option is out of range or inconsistent.
    Option {
        /// The option, as the command line spells it.
        option: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The model is invalid or does not match the data.
    Model(ModelError),
    /// The core refused the training graph.
    Graph(Box<GraphError>),
    /// The core could not plan the graph.
    Plan(PlanError),
    /// The system configuration (schedule, accumulation, mapping, replicas) is invalid, or
    /// the model does not fit.
    System(SystemError),
    /// The data could not be read.
    Data(String),
    /// The dataset pipeline failed.
    Dataset(DatasetError),
    /// The infeed failed.
    Infeed(InfeedError),
    /// An outfeed failed.
    Outfeed(OutfeedError),
    /// Running the program failed.
    Run(RunError),
    /// The checkpoint could not be written.
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::Option { option, message } => write!(f, "{option}: {message}"),
            SessionError::Model(e) => e.fmt(f),
            SessionError::Graph(e) => write!(f, "building the training graph: {e}"),
            SessionError::Plan(e) => write!(f, "planning the training graph: {e}"),
            SessionError::System(e) => e.fmt(f),
            SessionError::Data(e) => e.fmt(f),
            SessionError::Dataset(e) => write!(f, "dataset: {e}"),
            SessionError::Infeed(e) => write!(f, "infeed: {e}"),
            SessionError::Outfeed(e) => write!(f, "outfeed: {e}"),
            SessionError::Run(e) => write!(f, "running the program: {e}"),
            SessionError::Checkpoint { path, message } => {
                write!(f, "checkpoint {}: {message}", path.display())
            }
        }
    }
}

impl std::error::Error for SessionError {}

impl From<ModelError> for SessionError {
    fn from(e: ModelError) -> Self {
        SessionError::Model(e)
    }
}
impl From<GraphError> for SessionError {
    fn from(e: GraphError) -> Self {
        SessionError::Graph(Box::new(e))
    }
}
impl From<SystemError> for SessionError {
    fn from(e: SystemError) -> Self {
        SessionError::System(e)
    }
}
impl From<RunError> for SessionError {
    fn from(e: RunError) -> Self {
        SessionError::Run(e)
    }
}
impl From<OutfeedError> for SessionError {
    fn from(e: OutfeedError) -> Self {
        SessionError::Outfeed(e)
    }
}
impl From<DatasetError> for SessionError {
    fn from(e: DatasetError) -> Self {
        SessionError::Dataset(e)
    }
}
impl From<InfeedError> for SessionError {
    fn from(e: InfeedError) -> Self {
        SessionError::Infeed(e)
    }
}

/// A model compiled for a session: its training plan, where its taps and gradients are, and
/// how the system runs it.
pub struct Compiled {
    /// The model (pipelining removed if asked).
    pub model: Model,
    /// The options.
    pub options: SessionOptions,
    /// The training plan.
    pub plan: Plan<NODES>,
    /// What the model added to the graph.
    pub built: BuiltModel,
    /// The loss node.
    pub loss: NodeId,
    /// The machine.
    pub machine: IpuConfig,
    /// The system options of the estimate.
    pub system: SystemOptions,
}

fn opt_err(option: &'static str, message: String) -> SessionError {
    SessionError::Option { option, message }
}

/// Builds the training graph of `model` under `options` and plans it.
///
/// # Errors
///
/// [`SessionError::Option`] for out-of-range options, [`SessionError::Model`] /
/// [`SessionError::Graph`] / [`SessionError::Plan`] when the model cannot be built.
pub fn compile(model: &Model, options: &SessionOptions) -> Result<Compiled, SessionError> {
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
    if !(options.learning_rate.is_finite() && options.learning_rate > 0.0) {
        return Err(opt_err(
            "--learning-rate",
            format!("{} is not a positive number", options.learning_rate),
        ));
    }
    if !matches!(options.dtype, DType::F32 | DType::F16) {
        return Err(opt_err("--dtype", "use f32 or f16".into()));
    }
    let model = if options.no_pipelining {
        model.clone().without_pipelining()
    } else {
        model.clone()
    };
    let m = u32::try_from(options.gradient_accumulation_count)
        .map_err(|_| opt_err("--gradient-accumulation-count", "is too large".to_string()))?;
    let mut g: Box<Graph<NODES>> = Box::new(Graph::new());
    let built = model.build(&mut g, options.batch_size, options.dtype)?;
    let labels = g.input("labels", &[options.batch_size], DType::I32)?;
    let loss =
        g.sparse_categorical_crossentropy("loss", built.output, labels, !built.softmax_output)?;
    g.differentiate_accumulating(
        loss,
        options.optimizer.with_rate(options.learning_rate),
        Accumulation {
            // fp32 accumulators for fp16 gradients, as mixed-precision training on IPUs does.
            dtype: (options.dtype == DType::F16).then_some(DType::F32),
            ..Accumulation::new(m)
        },
    )?;
    let plan = Plan::new(&g).map_err(SessionError::Plan)?;
    let machine = IpuConfig::preset(options.ipu);
    // One stage is plain training: no overlap, so no schedule constraint on M.
    let mut options = options.clone();
    if model.stage_count() == 1 {
        options.schedule = Schedule::Sequential;
    }
    let system = SystemOptions {
        schedule: options.schedule,
        device_mapping: model.device_mapping.clone(),
        replicas: options.replicas,
        micro_batch: options.batch_size as u64,
        lower: LowerOptions {
            offload_optimizer_state: options.offload_optimizer_state,
            ..LowerOptions::default()
        },
        allow_out_of_memory: true,
        steps_per_execution: options.steps_per_execution,
        repeat_count: options.repeat_count,
        ..SystemOptions::default()
    };
    Ok(Compiled {
        model,
        options,
        plan,
        built,
        loss,
        machine,
        system,
    })
}

impl Compiled {
    /// The estimate (produced even when a tile overflows: see `fits` and `out_of_memory`).
    ///
    /// # Errors
    ///
    /// [`SessionError::System`] for an invalid schedule, accumulation count, mapping or
    /// execution size.
    pub fn estimate(&self) -> Result<SystemEstimate, SessionError> {
        Ok(estimate_system(&self.plan, &self.machine, &self.system)?)
    }
}

/// Training options beyond the session's.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    /// Epochs.
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
    /// Training starts: micro-batches to run in all.
    Start {
        /// Micro-batches (per replica) over all epochs.
        total_steps: u64,
        /// Micro-batches per epoch.
        steps_per_epoch: u64,
    },
    /// Micro-batches done so far (per replica).
    Progress {
        /// Done.
        steps: u64,
    },
    /// An epoch ended.
    Epoch {
        /// 1-based.
        epoch: usize,
        /// Mean loss over its micro-batches and replicas.
        loss: f64,
        /// The callbacks' data: (callback name, stacked tensors by key).
        outfeeds: Vec<(String, BTreeMap<String, HostTensor>)>,
    },
}

/// One outfeed queue's counters after training.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutfeedSummary {
    /// The queue.
    pub queue: String,
    /// Elements enqueued.
    pub enqueued: u64,
    /// Enqueues that waited for the host to drain.
    pub stalled_enqueues: u64,
    /// Time the device spent waiting, seconds (wall clock).
    pub stall_seconds: f64,
}

/// The result of training.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainReport {
    /// The model.
    pub model: String,
    /// Accuracy on the test split.
    pub test_accuracy: f64,
    /// Mean loss of the last epoch.
    pub final_loss: f64,
    /// Mean loss per epoch.
    pub epoch_losses: Vec<f64>,
    /// Micro-batch steps run (per replica).
    pub steps: u64,
    /// Weight updates.
    pub weight_updates: u64,
    /// Executions of the on-device loop.
    pub executions: u64,
    /// Weight updates per execution (R).
    pub repeat_count: usize,
    /// Micro-batches per execution (K).
    pub steps_per_execution: usize,
    /// Average cycles per micro-batch step.
    pub cycles_per_step: u64,
    /// Cycles per weight update.
    pub cycles_per_weight_update: u64,
    /// Samples per second on the simulated machine.
    pub samples_per_second: f64,
    /// Memory per IPU.
    pub memory: Vec<IpuMemorySummary>,
    /// Outfeed queues.
    pub outfeeds: Vec<OutfeedSummary>,
    /// Wall-clock seconds of the run.
    pub wall_seconds: f64,
    /// Seed.
    pub seed: u64,
    /// The estimate of the run (R as run).
    #[serde(skip)]
    pub estimate: SystemEstimate,
}

/// Messages from the device thread.
enum DeviceMsg {
    Progress(u64),
    EpochEnd { epoch: usize, loss: f64 },
}

/// What the observe hook does with a node.
#[derive(Clone, Debug)]
enum Watch {
    Loss,
    Plain(String),
    Maybe(String),
    Grad(String),
}

/// Per-update buffers, indexed `[micro_batch][replica]`.
type PerMicroBatch = Vec<Vec<BTreeMap<String, HostTensor>>>;

fn read(
    plan: &Plan<NODES>,
    id: NodeId,
    arena: &[u8],
    state: &[u8],
) -> Result<HostTensor, RunError> {
    let view = plan.tensor(id, arena, state)?;
    let shape = view.shape().dims().iter().map(|&d| d as usize).collect();
    Ok(HostTensor {
        shape,
        data: view.iter().collect(),
    })
}

/// Trains `compiled` on `data`, calling `on_event` from the calling thread as it goes.
///
/// # Errors
///
/// A [`SessionError`] naming what failed: data that does not match the model, an invalid
/// execution size, a model that does not fit, a failing queue or run, an unwritable
/// checkpoint.
pub fn train(
    compiled: Compiled,
    data: &Mnist,
    options: &TrainOptions,
    mut on_event: impl FnMut(TrainEvent),
) -> Result<TrainReport, SessionError> {
    let start = Instant::now();
    // Bit-identical results with or without; faster where the CPU has AVX2 / AVX-512.
    tessera_sim::use_fast_kernels();
    let Compiled {
        model,
        options: so,
        plan,
        built,
        loss,
        machine,
        system,
    } = compiled;
    let classes = data
        .train_labels
        .labels
        .iter()
        .chain(&data.test_labels.labels)
        .map(|&l| usize::from(l) + 1)
        .max()
        .unwrap_or(0)
        .max(10);
    model.check_data(&[data.train_images.rows, data.train_images.cols], classes)?;
    if options.epochs == 0 {
        return Err(opt_err("--epochs", "must be at least 1".into()));
    }
    let (b, m, replicas) = (so.batch_size, so.gradient_accumulation_count, so.replicas);
    let steps_available = data.train_images.count / b;
    let updates_per_epoch = steps_available / (m * replicas);
    if updates_per_epoch == 0 {
        return Err(opt_err(
            "--batch-size",
            format!(
                "one weight update takes {} samples ({} replicas x {m} micro-batches x {b}) but the training split has {}",
                b * m * replicas,
                replicas,
                data.train_images.count
            ),
        ));
    }
    let repeat = match (so.repeat_count, so.steps_per_execution) {
        (None, None) => updates_per_epoch,
        (r, k) => tessera_sim::system::loop_repeat(k, r, m)?,
    };
    let mut system = system;
    system.repeat_count = Some(repeat);
    system.steps_per_execution = None;
    let estimate = estimate_system(&plan, &machine, &system)?;
    if let Some(oom) = &estimate.out_of_memory {
        return Err(SessionError::System(SystemError::Sim(
            tessera_sim::estimate::SimError::OutOfMemory(Box::new(oom.clone())),
        )));
    }
    let executions_per_epoch = updates_per_epoch / repeat;
    if executions_per_epoch == 0 {
        return Err(opt_err(
            "--repeat-count",
            format!(
                "an execution of {repeat} weight updates is longer than an epoch ({updates_per_epoch} weight updates of {} samples)",
                b * m * replicas
            ),
        ));
    }

    // Where to look during a weight update.
    let g = plan.graph();
    let ids: Vec<NodeId> = g.ids().collect();
    let mut watch: Vec<Option<Watch>> = vec![None; g.len()];
    watch[loss.index()] = Some(Watch::Loss);
    for (name, id, _) in &built.outfeeds {
        watch[id.index()] = Some(Watch::Plain(name.clone()));
    }
    let maybe_acts = MaybeOutfeedQueue::new(
        OutfeedQueue::new(
            "multi_activations_outfeed",
            OutfeedMode::All,
            options.buffer_depth,
            replicas,
        )?,
        options.activations_filters.clone(),
    );
    for (name, id, _) in &built.maybe_outfeeds {
        if maybe_acts.keeps(name) {
            watch[id.index()] = Some(Watch::Maybe(name.clone()));
        }
    }
    let grads = MaybeOutfeedQueue::new(
        OutfeedQueue::new(
            "optimizer_outfeed",
            OutfeedMode::All,
            options.buffer_depth,
            replicas,
        )?,
        options.gradients_filters.clone(),
    );
    let mut accumulators: Vec<(String, NodeId)> = Vec::new();
    for n in g.nodes() {
        if !n.roles().contains(Roles::TRAINABLE) {
            continue;
        }
        let key = format!("{}_grad", n.name());
        if !grads.keeps(&key) {
            continue;
        }
        match options.gradient_outfeed_mode {
            GradientOutfeedMode::AfterCompute => {
                let id = g.find(&key)?;
                watch[id.index()] = Some(Watch::Grad(key));
            }
            GradientOutfeedMode::BeforeApply => {
                let id = g.find(&format!("{}/accumulator", n.name()))?;
                accumulators.push((key, id));
            }
        }
    }
    let mut last_watched = [usize::MAX; 3];
    for (i, w) in watch.iter().enumerate() {
        let q = match w {
            Some(Watch::Grad(_)) => 0,
            Some(Watch::Plain(_)) => 1,
            Some(Watch::Maybe(_)) => 2,
            _ => continue,
        };
        last_watched[q] = i;
    }
    let plain = OutfeedQueue::new(
        "activations_outfeed",
        OutfeedMode::All,
        options.buffer_depth,
        replicas,
    )?;

    // Data.
    let train_set = Dataset::from_mnist_split(&data.train_images, &data.train_labels)?
        .map("images", |x| x / 255.0)?
        .cast("images", so.dtype)?
        .shuffle(options.seed)?
        .batch(b, true)?
        .repeat(None)?;
    let mut infeed = InfeedQueue::new("infeed", train_set, options.prefetch_depth)?;

    let mut runner = PipelineRunner::new(plan, so.schedule, replicas)?;
    runner.init_state(options.seed)?;
    let epochs = if options.run_single_step {
        1
    } else {
        options.epochs
    };
    let executions_per_epoch = if options.run_single_step {
        1
    } else {
        executions_per_epoch
    };
    let steps_per_epoch = (executions_per_epoch * repeat * m) as u64;
    on_event(TrainEvent::Start {
        total_steps: steps_per_epoch * epochs as u64,
        steps_per_epoch,
    });

    let input_name = model.input_name.clone();
    let (to_host, from_device) = mpsc::channel::<DeviceMsg>();
    let (ack_tx, ack_rx) = mpsc::channel::<()>();
    let queues: [(&str, &OutfeedQueue); 3] = [
        ("Gradients callback", grads.queue()),
        ("Single layer activations callback", &plain),
        ("Multi-layer activations callback", maybe_acts.queue()),
    ];
    let mut epoch_losses = Vec::new();

    let mut device = |runner: &mut PipelineRunner<NODES>,
                      to_host: &mpsc::Sender<DeviceMsg>,
                      ack_rx: &mpsc::Receiver<()>|
     -> Result<(), SessionError> {
        let mut done = 0u64;
        for epoch in 1..=epochs {
            let (mut loss_sum, mut loss_n) = (0f64, 0u64);
            for _ in 0..executions_per_epoch {
                for _ in 0..repeat {
                    let mut batches = Vec::with_capacity(m * replicas);
                    for _ in 0..m * replicas {
                        batches.push(
                            infeed
                                .next_batch()?
                                .ok_or(SessionError::Data("the infeed ran dry".into()))?,
                        );
                    }
                    let empty = || vec![vec![BTreeMap::new(); replicas]; m];
                    let mut pending: [PerMicroBatch; 3] = [empty(), empty(), empty()];
                    let mut before: Vec<BTreeMap<String, HostTensor>> =
                        vec![BTreeMap::new(); replicas];
                    let last_replica = replicas - 1;
                    runner.run_update_observed(
                        |r, mb, plan, arena| {
                            let batch = &batches[mb * replicas + r];
                            for (name, _, values) in &batch.fields {
                                let target = if name == "images" {
                                    input_name.as_str()
                                } else {
                                    name.as_str()
                                };
                                plan.fill_input(target, arena, values.len(), |i| values[i])?;
                            }
                            Ok::<(), SessionError>(())
                        },
                        |point, plan, arena, state| {
                            match point {
                                Observe::Node {
                                    replica,
                                    micro_batch,
                                    node,
                                } => {
                                    let (q, key) = match &watch[node] {
                                        None => return Ok(()),
                                        Some(Watch::Loss) => {
                                            let t = read(plan, ids[node], arena, state)?;
                                            loss_sum += f64::from(t.data[0]);
                                            loss_n += 1;
                                            return Ok(());
                                        }
                                        Some(Watch::Grad(k)) => (0, k),
                                        Some(Watch::Plain(k)) => (1, k),
                                        Some(Watch::Maybe(k)) => (2, k),
                                    };
                                    pending[q][micro_batch][replica]
                                        .insert(key.clone(), read(plan, ids[node], arena, state)?);
                                    // The micro-batch's last tap of this queue on the last
                                    // replica: enqueue now, as the device would.
                                    if node == last_watched[q] && replica == last_replica {
                                        let maps = std::mem::take(&mut pending[q][micro_batch]);
                                        match q {
                                            0 => grads.maybe_enqueue(maps).map(drop)?,
                                            1 => plain
                                                .enqueue(
                                                    maps.into_iter()
                                                        .map(crate::outfeed::Element::Map)
                                                        .collect(),
                                                )
                                                .map(drop)?,
                                            _ => maybe_acts.maybe_enqueue(maps).map(drop)?,
                                        }
                                    }
                                }
                                Observe::BeforeUpdate { replica } => {
                                    for (k, id) in &accumulators {
                                        before[replica]
                                            .insert(k.clone(), read(plan, *id, arena, state)?);
                                    }
                                    if replica == last_replica {
                                        grads.maybe_enqueue(std::mem::take(&mut before))?;
                                    }
                                }
                            }
                            Ok(())
                        },
                    )?;
                    done += m as u64;
                    let _ = to_host.send(DeviceMsg::Progress(done));
                }
            }
            let loss = if loss_n > 0 {
                loss_sum / loss_n as f64
            } else {
                f64::NAN
            };
            let _ = to_host.send(DeviceMsg::EpochEnd { epoch, loss });
            // The host runs its callbacks while the device waits, as Keras does.
            if ack_rx.recv().is_err() {
                break;
            }
        }
        Ok(())
    };

    let stop = std::sync::atomic::AtomicBool::new(false);
    let collectors: Vec<std::sync::Mutex<Collector>> = (0..3)
        .map(|_| std::sync::Mutex::new(Collector::new()))
        .collect();
    // Holding a collector's lock while dequeuing into it: once a queue has nothing pending
    // and its collector's lock is free, the collector holds everything dequeued.
    let drain = |i: usize, q: &OutfeedQueue| {
        let mut c = collectors[i]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if q.pending() > 0 {
            if let Ok(d) = q.dequeue() {
                c.push(d);
            }
        }
    };
    let device_result = std::thread::scope(|scope| {
        // The host's outfeed threads: drain each queue as elements arrive.
        for (i, (_, q)) in queues.iter().enumerate() {
            let (stop, drain) = (&stop, &drain);
            scope.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    if q.wait_for_elements(Duration::from_millis(5)) > 0 {
                        drain(i, q);
                    }
                }
            });
        }
        let runner = &mut runner;
        let handle = scope.spawn(move || {
            let r = device(runner, &to_host, &ack_rx);
            drop(to_host);
            r
        });
        for msg in &from_device {
            match msg {
                DeviceMsg::Progress(steps) => on_event(TrainEvent::Progress { steps }),
                DeviceMsg::EpochEnd { epoch, loss } => {
                    // The device is waiting: everything of this epoch is in the queues or
                    // already drained.
                    let mut outfeeds = Vec::new();
                    for (i, (name, q)) in queues.iter().enumerate() {
                        drain(i, q);
                        let data = collectors[i]
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .take();
                        let has_layers = match i {
                            1 => !built.outfeeds.is_empty(),
                            2 => !built.maybe_outfeeds.is_empty(),
                            _ => true,
                        };
                        if has_layers {
                            outfeeds.push((name.to_string(), data));
                        }
                    }
                    epoch_losses.push(loss);
                    on_event(TrainEvent::Epoch {
                        epoch,
                        loss,
                        outfeeds,
                    });
                    let _ = ack_tx.send(());
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        handle
            .join()
            .unwrap_or_else(|_| Err(SessionError::Data("the device thread panicked".into())))
    });
    device_result?;

    // Test accuracy with the trained weights.
    let test_n = data.test_images.count;
    let eval_b = (1..=100).rev().find(|d| test_n % d == 0).unwrap_or(1);
    let mut ig: Box<Graph<NODES>> = Box::new(Graph::new());
    let ib = model.build(&mut ig, eval_b, so.dtype)?;
    let infer = Plan::new(&ig).map_err(SessionError::Plan)?;
    let mut arena = vec![0u8; infer.arena_bytes()];
    let mut state = vec![0u8; infer.state_bytes()];
    infer.copy_state_from(&mut state, runner.plan(), runner.state(0))?;
    let px = data.test_images.rows * data.test_images.cols;
    let mut correct = 0usize;
    for start_i in (0..test_n).step_by(eval_b) {
        let pixels = &data.test_images.pixels[start_i * px..(start_i + eval_b) * px];
        infer.fill_input(model.input_name.as_str(), &mut arena, pixels.len(), |i| {
            f32::from(pixels[i]) / 255.0
        })?;
        infer.infer(&mut arena, &state)?;
        let out = infer.tensor(ib.output, &arena, &state)?;
        let classes_out = out.len() / eval_b;
        for s in 0..eval_b {
            let row = (0..classes_out).map(|c| out.get(s * classes_out + c));
            let best = row
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |a, (i, v)| if v > a.1 { (i, v) } else { a },
                )
                .0;
            correct += usize::from(best == usize::from(data.test_labels.labels[start_i + s]));
        }
    }
    if let Some(path) = &options.checkpoint {
        save_checkpoint(path, runner.plan(), runner.state(0))?;
    }

    let summary = EstimateSummary::new(&model.name, so.ipu, &machine, &estimate);
    let executions = (epochs * executions_per_epoch) as u64;
    let outfeeds = queues
        .iter()
        .map(|(_, q)| OutfeedSummary {
            queue: q.name().to_string(),
            enqueued: q.enqueued(),
            stalled_enqueues: q.stalled_enqueues(),
            stall_seconds: q.stall_time().as_secs_f64(),
        })
        .collect();
    Ok(TrainReport {
        model: model.name.clone(),
        test_accuracy: correct as f64 / test_n.max(1) as f64,
        final_loss: epoch_losses.last().copied().unwrap_or(f64::NAN),
        epoch_losses,
        steps: executions * (repeat * m) as u64,
        weight_updates: executions * repeat as u64,
        executions,
        repeat_count: repeat,
        steps_per_execution: repeat * m,
        cycles_per_step: summary.cycles_per_step,
        cycles_per_weight_update: summary.cycles_per_weight_update,
        samples_per_second: summary.samples_per_second,
        memory: summary.ipus,
        outfeeds,
        wall_seconds: start.elapsed().as_secs_f64(),
        seed: options.seed,
        estimate,
    })
}

/// Writes the trained variables of `plan` as a safetensors file (f32, the variables' names).
///
/// # Errors
///
/// [`SessionError::Checkpoint`] naming the file.
pub fn save_checkpoint(path: &Path, plan: &Plan<NODES>, state: &[u8]) -> Result<(), SessionError> {
    let g = plan.graph();
    let arena = vec![0u8; plan.arena_bytes()];
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (id, n) in g.ids().zip(g.nodes()) {
        if !n.roles().contains(Roles::TRAINABLE) {
            continue;
        }
        let v = plan.tensor(id, &arena, state)?;
        let shape = v.shape().dims().iter().map(|&d| d as usize).collect();
        let bytes = v.iter().flat_map(f32::to_le_bytes).collect();
        tensors.push((n.name().to_string(), shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| SessionError::Checkpoint {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })
        })
        .collect::<Result<_, _>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "tessera".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| SessionError::Checkpoint {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
