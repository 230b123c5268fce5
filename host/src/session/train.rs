//! Training: [`prepare`] checks everything a run needs (data, options, execution sizes, fit)
//! before anything is printed; [`Prepared::run`] runs the device and the host side by side and
//! evaluates the trained weights on the test split through the same device path.
//!
//! Executions run over the repeated, reshuffled dataset, as TensorFlow repeats a dataset: an
//! execution of R weight updates may be shorter or longer than a pass over the data. Epochs
//! are counted as samples seen / dataset size; `epochs` asks for that many passes, rounded to
//! whole executions, and the callbacks run at the execution nearest each pass's end (or after
//! every execution when one is longer than a pass).

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use serde::Serialize;
use tessera_sim::runner::PipelineRunner;
use tessera_sim::system::{estimate_system, loop_repeat, SystemEstimate, SystemOptions};

use super::checkpoint::save_checkpoint;
use super::device::{Device, DeviceMsg};
use super::drain::{host_loop, subscribe};
use super::evaluate::{EvaluateOptions, EvaluateReport, Evaluation, Weights};
pub use super::run::{Executions, TrainEvent, TrainOptions};
use super::taps::{Queue, Taps};
use super::{check_fits, device_pool};
use crate::compile::{opt_err, Compiled, SessionError};
use crate::dataset::Dataset;
use crate::idx::Mnist;
use crate::infeed::InfeedQueue;
use crate::summary::{EstimateSummary, IpuMemorySummary};

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
    /// Accuracy on the test split (through the device's inference path).
    pub test_accuracy: f64,
    /// Mean loss on the test split.
    pub test_loss: f64,
    /// Test samples evaluated (whole micro-batches).
    pub test_samples: usize,
    /// Mean loss of the last reporting point.
    pub final_loss: f64,
    /// Mean loss per reporting point.
    pub epoch_losses: Vec<f64>,
    /// Passes over the training data (samples seen / dataset size).
    pub epochs_seen: f64,
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
    /// The test split's evaluation, with its inference estimate.
    #[serde(skip)]
    pub evaluation: EvaluateReport,
}

/// A run that has passed every check: the estimate, the taps and the infeed are ready.
pub struct Prepared {
    compiled: Compiled,
    executions: Executions,
    estimate: SystemEstimate,
    taps: Taps,
    infeed: InfeedQueue,
    evaluation: Evaluation,
    options: TrainOptions,
}

impl Prepared {
    /// The estimate of the run (R as run).
    pub fn estimate(&self) -> &SystemEstimate {
        &self.estimate
    }

    /// The executions the run will make.
    pub fn executions(&self) -> Executions {
        self.executions
    }

    /// The compiled model.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }
}

/// The most micro-batch steps (per replica) one training run takes: the 32-bit count of
/// Poplar's repeat loops, which a run's steps would be on the device.
pub const MAX_RUN_STEPS: usize = tessera_sim::system::MAX_LOOP_COUNT;

/// Plans the executions: R as given (or one pass's worth of updates), and how many.
fn plan_executions(
    c: &Compiled,
    dataset_len: usize,
    options: &TrainOptions,
) -> Result<Executions, SessionError> {
    let so = &c.target.options;
    let (b, m, replicas) = (so.batch_size, so.gradient_accumulation_count, so.replicas);
    // The run trains `--epochs` passes over the data (rounded to whole executions, which may
    // be longer than the run, as the tensor-inspection example's is); one weight update must
    // fit in it, and a run steps at most MAX_RUN_STEPS micro-batches.
    let run_samples = options.epochs.checked_mul(dataset_len).ok_or_else(|| {
        opt_err(
            "--epochs",
            format!(
                "{} passes over {dataset_len} samples overflow a 64-bit sample count",
                options.epochs
            ),
        )
    })?;
    let per_update = b
        .checked_mul(m)
        .and_then(|x| x.checked_mul(replicas))
        .filter(|&x| x <= run_samples)
        .ok_or_else(|| {
            opt_err(
                "--gradient-accumulation-count",
                format!(
                    "one weight update of {m} micro-batches of {b} on {replicas} replica(s) takes more samples than the run trains ({run_samples}: {} epoch(s) of {dataset_len}); lower the count or the batch size, or raise --epochs",
                    options.epochs
                ),
            )
        })?;
    let repeat = match (so.repeat_count, so.steps_per_execution) {
        (None, None) => (dataset_len / per_update).max(1),
        (r, k) => loop_repeat(k, r, m)?,
    };
    let per_execution = repeat as f64 * per_update as f64;
    let nearest = |x: f64| (x.round() as usize).max(1);
    let (executions, executions_per_report) = if options.run_single_step {
        (1, 1)
    } else {
        (
            nearest(options.epochs as f64 * dataset_len as f64 / per_execution),
            nearest(dataset_len as f64 / per_execution),
        )
    };
    // Micro-batch steps per replica: the executions', and the epochs' own.
    let execution_steps = executions as u128 * repeat as u128 * m as u128;
    let epoch_steps = run_samples as u128 / (b * replicas).max(1) as u128;
    let steps = execution_steps.max(epoch_steps);
    if steps > MAX_RUN_STEPS as u128 {
        let option = match (execution_steps > epoch_steps, so.repeat_count.is_some()) {
            (false, _) => "--epochs",
            (true, true) => "--repeat-count",
            (true, false) => "--steps-per-execution",
        };
        return Err(opt_err(
            option,
            format!(
                "the run would be {steps} micro-batch steps; a run takes at most {MAX_RUN_STEPS}"
            ),
        ));
    }
    Ok(Executions {
        repeat,
        executions,
        executions_per_report,
        micro_batches_per_update: m,
        replicas,
        batch_size: b,
        dataset_len,
    })
}

/// Checks a training run before anything runs or is printed: the data against the model,
/// the options, the execution sizes, that the model fits; makes the outfeed queues and starts
/// the infeed.
///
/// # Errors
///
/// A [`SessionError`] naming what is wrong.
pub fn prepare(
    compiled: Compiled,
    data: &Mnist,
    options: &TrainOptions,
) -> Result<Prepared, SessionError> {
    let classes = data
        .train_labels
        .labels
        .iter()
        .chain(&data.test_labels.labels)
        .map(|&l| usize::from(l) + 1)
        .max()
        .unwrap_or(0)
        .max(10);
    compiled
        .model
        .check_data(&[data.train_images.rows, data.train_images.cols], classes)?;
    if options.epochs == 0 {
        return Err(opt_err("--epochs", "must be at least 1".into()));
    }
    let executions = plan_executions(&compiled, data.train_images.count, options)?;
    // The run's executions: R weight updates each, as the data's passes make them.
    let system = SystemOptions {
        repeat_count: Some(executions.repeat),
        steps_per_execution: None,
        ..compiled.target.system.clone()
    };
    let estimate = estimate_system(&compiled.target.plan, &compiled.target.machine, &system)?;
    check_fits(&estimate)?;
    let taps = Taps::new(&compiled, options)?;
    let so = &compiled.target.options;
    let train_set = Dataset::from_mnist_split(&data.train_images, &data.train_labels)?
        .map("images", |x| x / 255.0)?
        .cast("images", so.dtype)?
        .shuffle(options.seed)?
        .batch(so.batch_size, true)?
        .repeat(None)?;
    let infeed = InfeedQueue::new("infeed", train_set, options.prefetch_depth)?;
    let evaluation = Evaluation::new(&compiled.model, so, data, &EvaluateOptions::default(), true)?;
    Ok(Prepared {
        compiled,
        executions,
        estimate,
        taps,
        infeed,
        evaluation,
        options: options.clone(),
    })
}

/// Trains `compiled` on `data`, calling `on_event` from the calling thread as it goes:
/// [`prepare`] then [`Prepared::run`].
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
    on_event: impl FnMut(TrainEvent),
) -> Result<TrainReport, SessionError> {
    prepare(compiled, data, options)?.run(data, on_event)
}

impl Prepared {
    /// Runs the device on a thread of its own while this thread drains the outfeeds and
    /// reports; then evaluates on the test split and saves the checkpoint.
    ///
    /// # Errors
    ///
    /// A [`SessionError`] naming what failed.
    pub fn run(
        self,
        data: &Mnist,
        mut on_event: impl FnMut(TrainEvent),
    ) -> Result<TrainReport, SessionError> {
        let start = Instant::now();
        // AVX2 / AVX-512 with fused multiply-adds where the CPU has them: faster, the same bits
        // on every such CPU and thread count (the last bits differ from the portable kernels').
        tessera_sim::use_fast_kernels();
        let Prepared {
            compiled,
            executions: x,
            estimate,
            taps,
            infeed,
            evaluation,
            options,
        } = self;
        let so = &compiled.target.options;
        let mut runner =
            PipelineRunner::new(compiled.target.plan.clone(), so.schedule, so.replicas)?;
        runner.init_state(options.seed)?;
        let per_report = (x.executions_per_report * x.steps_per_execution()) as u64;
        on_event(TrainEvent::Start {
            total_steps: (x.executions * x.steps_per_execution()) as u64,
            steps_per_epoch: per_report,
        });
        let (to_host, from_device) = crossbeam_channel::unbounded::<DeviceMsg>();
        let (ack_tx, ack_rx) = crossbeam_channel::bounded::<()>(1);
        let subscriptions = subscribe(&taps);
        let stop = AtomicBool::new(false);
        let device = Device {
            infeed,
            taps: &taps,
            plan: x,
            input_name: compiled.model.input_name.clone(),
            to_host,
            acks: ack_rx,
            stop: &stop,
        };
        // The device's large products run on every core.
        let pool = device_pool();
        runner.use_threads(pool.is_some());
        // Weight gradients go straight into their accumulators, but for those the taps read.
        runner.fuse_accumulation(&taps.observed());
        let (losses, device_result) = std::thread::scope(|scope| {
            let runner = &mut runner;
            let handle = scope.spawn(move || match &pool {
                Some(pool) => pool.install(|| device.run(runner)),
                None => device.run(runner),
            });
            let (losses, held) = host_loop(
                &taps,
                &subscriptions,
                &from_device,
                &ack_tx,
                &stop,
                &mut on_event,
            );
            let result = handle
                .join()
                .unwrap_or_else(|_| Err(SessionError::Data("the device thread panicked".into())))
                .and(held.map_err(SessionError::from));
            (losses, result)
        });
        device_result?;
        let weights = Weights::Trained {
            plan: runner.plan(),
            state: runner.state(0),
        };
        let evaluation = evaluation.run(
            &compiled.model,
            so,
            weights,
            data,
            &EvaluateOptions::default(),
        )?;
        if let Some(path) = &options.checkpoint {
            save_checkpoint(path, runner.plan(), runner.state(0))?;
        }
        let summary = EstimateSummary::new(
            &compiled.model.name,
            so.ipu,
            &compiled.target.machine,
            &estimate,
        );
        let outfeeds = outfeed_summaries(&taps);
        let executions = x.executions as u64;
        Ok(TrainReport {
            model: compiled.model.name.clone(),
            test_accuracy: evaluation.accuracy,
            test_loss: evaluation.loss,
            test_samples: evaluation.samples,
            final_loss: losses.last().copied().unwrap_or(f64::NAN),
            epoch_losses: losses,
            epochs_seen: x.epochs_after(x.executions),
            steps: executions * x.steps_per_execution() as u64,
            weight_updates: executions * x.repeat as u64,
            executions,
            repeat_count: x.repeat,
            steps_per_execution: x.steps_per_execution(),
            cycles_per_step: summary.cycles_per_step,
            cycles_per_weight_update: summary.cycles_per_weight_update,
            samples_per_second: summary.samples_per_second,
            memory: summary.ipus,
            outfeeds,
            wall_seconds: start.elapsed().as_secs_f64(),
            seed: options.seed,
            estimate,
            evaluation,
        })
    }
}

/// What each outfeed queue carried and how often its enqueues waited for the host.
fn outfeed_summaries(taps: &Taps) -> Vec<OutfeedSummary> {
    Queue::ALL
        .iter()
        .map(|&q| {
            let q = taps.queue(q);
            OutfeedSummary {
                queue: q.name().to_string(),
                enqueued: q.enqueued(),
                stalled_enqueues: q.stalled_enqueues(),
                stall_seconds: q.stall_time().as_secs_f64(),
            }
        })
        .collect()
}
