//! Keras' `evaluate()` and `predict()` on the simulated device: the model's forward pass as
//! an inference plan ([`crate::compile::inference`]), pipelined over its stages with the
//! inference schedule, replicated, K micro-batches per execution (Keras'
//! `steps_per_execution`), fed by the infeed from the test split in order, predictions outfed
//! to the host.
//!
//! IPU datasets need static shapes, so the test split is batched with `drop_remainder`: the
//! last partial micro-batch (and micro-batches that do not fill an execution) are not run.

use std::path::Path;

use serde::Serialize;
use tessera_core::Plan;
use tessera_sim::runner::{Observe, PipelineRunner};
use tessera_sim::system::SystemEstimate;

use super::checkpoint::load_checkpoint;
use super::device::feed;
use super::taps::read_first;
use super::{check_fits, device_pool};
use crate::compile::inference::{compile_inference, Inference};
use crate::compile::{Heap, SessionError, SessionOptions};
use crate::dataset::{Batch, Dataset};
use crate::idx::Mnist;
use crate::infeed::InfeedQueue;
use crate::model::Model;
use crate::outfeed::HostTensor;

/// Options of `evaluate` and `predict`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvaluateOptions {
    /// Micro-batches per execution (per replica), a multiple of the inference schedule's
    /// overlap; default: as many as the test split fills.
    pub steps_per_execution: Option<usize>,
    /// Infeed prefetch depth (default 3).
    pub prefetch_depth: Option<usize>,
}

/// Where the weights come from.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// Freshly initialised from a seed (an untrained model).
    Seed(u64),
    /// A checkpoint written by `tessera train --checkpoint`.
    Checkpoint(&'a Path),
    /// A trained plan's state (its variables are copied by name).
    Trained {
        /// The trained plan.
        plan: &'a Plan<Heap>,
        /// Its state.
        state: &'a [u8],
    },
}

/// The result of `evaluate` or `predict`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EvaluateReport {
    /// The model.
    pub model: String,
    /// Mean loss over the micro-batches run (NaN for `predict`, which has no labels).
    pub loss: f64,
    /// Fraction of samples whose largest output is their label.
    pub accuracy: f64,
    /// Samples run.
    pub samples: usize,
    /// Samples in the split.
    pub split_samples: usize,
    /// Executions of the on-device loop.
    pub executions: usize,
    /// Micro-batches per execution and replica (K).
    pub steps_per_execution: usize,
    /// Micro-batches the inference schedule overlaps (K must be a multiple).
    pub overlap: usize,
    /// The inference schedule.
    pub schedule: String,
    /// Cycles per execution on the simulated machine.
    pub cycles_per_execution: u64,
    /// Samples per second on the simulated machine.
    pub samples_per_second: f64,
    /// The predictions, `[samples, outputs]`, in the split's order (`predict` only).
    #[serde(skip)]
    pub predictions: Option<HostTensor>,
    /// The inference estimate.
    #[serde(skip)]
    pub estimate: SystemEstimate,
}

/// Loads the weights into every replica.
fn load_weights(
    runner: &mut PipelineRunner<Heap>,
    replicas: usize,
    weights: Weights<'_>,
) -> Result<(), SessionError> {
    if let Weights::Seed(seed) = weights {
        return Ok(runner.init_state(seed)?);
    }
    let plan = runner.plan().clone();
    for r in 0..replicas {
        match weights {
            Weights::Checkpoint(path) => load_checkpoint(path, &plan, runner.state_mut(r))?,
            Weights::Trained { plan: src, state } => {
                plan.copy_state_from(runner.state_mut(r), src, state)?;
            }
            Weights::Seed(_) => {}
        }
    }
    Ok(())
}

/// What the device run produced.
struct Outputs {
    loss_sum: f64,
    loss_n: u64,
    /// Per sample, the row of outputs, in the split's order.
    rows: Vec<f32>,
    width: usize,
}

/// Runs the executions, reading the output (and loss) of every micro-batch as it completes.
fn run_device(
    inf: &Inference,
    so: &SessionOptions,
    infeed: &mut InfeedQueue,
    weights: Weights<'_>,
    input_name: &str,
) -> Result<Outputs, SessionError> {
    let replicas = so.replicas;
    let mut runner = PipelineRunner::inference(
        inf.target.plan.clone(),
        inf.target.options.schedule,
        replicas,
        inf.k,
    )?;
    load_weights(&mut runner, replicas, weights)?;
    let width = inf.target.plan.graph().node(inf.output).shape().elements() / so.batch_size;
    let executions = inf.micro_batches / inf.k;
    let per_execution = inf.k * replicas;
    let mut out = Outputs {
        loss_sum: 0.0,
        loss_n: 0,
        rows: vec![0.0; executions * per_execution * so.batch_size * width],
        width,
    };
    let output = inf.output.index();
    // The device's large products run on every core.
    let pool = device_pool();
    runner.use_threads(pool.is_some());
    let mut executions_run = || {
        for e in 0..executions {
            let batches = (0..per_execution)
                .map(|_| {
                    infeed
                        .next_batch()?
                        .ok_or_else(|| SessionError::Data("the test infeed ran dry".into()))
                })
                .collect::<Result<Vec<Batch>, SessionError>>()?;
            runner.run_update_observed(
                |r, mb, plan, arena| feed(plan, arena, &batches[mb * replicas + r], input_name),
                |point, plan, arena, state| {
                    let Observe::Node {
                        replica,
                        micro_batch,
                        node,
                    } = point
                    else {
                        return Ok(());
                    };
                    if let Some(l) = inf.loss.filter(|l| l.index() == node) {
                        out.loss_sum += f64::from(read_first(plan, l, arena, state)?);
                        out.loss_n += 1;
                    } else if node == output {
                        let t = plan.tensor(inf.output, arena, state)?;
                        let at = (e * per_execution + micro_batch * replicas + replica) * t.len();
                        t.copy_to(&mut out.rows[at..at + t.len()]);
                    }
                    Ok::<(), SessionError>(())
                },
            )?;
        }
        Ok::<(), SessionError>(())
    };
    match &pool {
        Some(pool) => pool.install(executions_run)?,
        None => executions_run()?,
    }
    Ok(out)
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |a, (i, &v)| if v > a.1 { (i, v) } else { a },
        )
        .0
}

/// An evaluation checked and compiled, ready to run: what training prepares before it starts
/// so that a bad evaluation setting fails before any work.
pub struct Evaluation {
    inf: Inference,
    with_labels: bool,
}

impl Evaluation {
    /// Checks the data and options, compiles the inference plan and estimates it.
    ///
    /// # Errors
    ///
    /// A [`SessionError`] naming what is wrong, including a model that does not fit.
    pub fn new(
        model: &Model,
        so: &SessionOptions,
        data: &Mnist,
        opts: &EvaluateOptions,
        with_labels: bool,
    ) -> Result<Self, SessionError> {
        let split = data.test_images.count;
        model.check_data(&[data.test_images.rows, data.test_images.cols], 10)?;
        let inf = compile_inference(
            model,
            so,
            with_labels,
            Some(split),
            opts.steps_per_execution,
        )?;
        check_fits(&inf.estimate)?;
        Ok(Evaluation { inf, with_labels })
    }

    /// The inference estimate.
    pub fn estimate(&self) -> &SystemEstimate {
        &self.inf.estimate
    }

    /// Runs the test split through the device with `weights`.
    ///
    /// # Errors
    ///
    /// A [`SessionError`] naming what failed.
    pub fn run(
        self,
        model: &Model,
        so: &SessionOptions,
        weights: Weights<'_>,
        data: &Mnist,
        opts: &EvaluateOptions,
    ) -> Result<EvaluateReport, SessionError> {
        tessera_sim::use_fast_kernels();
        let Evaluation { inf, with_labels } = self;
        let test_set = Dataset::from_mnist_split(&data.test_images, &data.test_labels)?
            .map("images", |x| x / 255.0)?
            .cast("images", so.dtype)?
            .batch(so.batch_size, true)?;
        let mut infeed =
            InfeedQueue::new("test_infeed", test_set, opts.prefetch_depth.unwrap_or(3))?;
        let out = run_device(&inf, so, &mut infeed, weights, &model.input_name)?;
        let samples = out.rows.len() / out.width.max(1);
        let correct = (0..samples)
            .filter(|&s| {
                argmax(&out.rows[s * out.width..(s + 1) * out.width])
                    == usize::from(data.test_labels.labels[s])
            })
            .count();
        let e = &inf.estimate;
        Ok(EvaluateReport {
            model: model.name.clone(),
            loss: if out.loss_n > 0 {
                out.loss_sum / out.loss_n as f64
            } else {
                f64::NAN
            },
            accuracy: correct as f64 / samples.max(1) as f64,
            samples,
            split_samples: data.test_images.count,
            executions: inf.micro_batches / inf.k,
            steps_per_execution: inf.k,
            overlap: inf.overlap,
            schedule: e.schedule.clone(),
            cycles_per_execution: e.cycles_per_weight_update,
            samples_per_second: e.samples_per_second,
            predictions: (!with_labels).then(|| HostTensor {
                shape: vec![samples, out.width],
                data: out.rows,
            }),
            estimate: inf.estimate,
        })
    }
}

fn run(
    model: &Model,
    so: &SessionOptions,
    weights: Weights<'_>,
    data: &Mnist,
    opts: &EvaluateOptions,
    with_labels: bool,
) -> Result<EvaluateReport, SessionError> {
    Evaluation::new(model, so, data, opts, with_labels)?.run(model, so, weights, data, opts)
}

/// Keras' `evaluate()`: loss and accuracy on the test split, on the simulated device.
///
/// # Errors
///
/// A [`SessionError`] naming what is wrong: options, data, weights, a model that does not fit.
pub fn evaluate(
    model: &Model,
    so: &SessionOptions,
    weights: Weights<'_>,
    data: &Mnist,
    opts: &EvaluateOptions,
) -> Result<EvaluateReport, SessionError> {
    run(model, so, weights, data, opts, true)
}

/// Keras' `predict()`: the model's outputs for the test split's images, outfed to the host
/// (`predictions`), with the accuracy they give against the split's labels.
///
/// # Errors
///
/// As [`evaluate`].
pub fn predict(
    model: &Model,
    so: &SessionOptions,
    weights: Weights<'_>,
    data: &Mnist,
    opts: &EvaluateOptions,
) -> Result<EvaluateReport, SessionError> {
    run(model, so, weights, data, opts, false)
}
