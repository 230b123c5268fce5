//! Compiling a model into a system program: a model, the machine and the resolved options
//! become a training (or inference) plan and how the system runs it, ready to estimate or to
//! run (see [`crate::session`]).
//!
//! Every front end ends in `compile_graph`: a model file's training compile ([`compile()`]),
//! an imported ONNX graph's ([`onnx`]) and a model file's inference compile ([`inference`])
//! build the forward graph and hand it over with a `Front`; the compile adds the backward
//! pass and the updates for training, plans the graph and resolves the system options.

mod error;
pub mod inference;
pub mod onnx;
mod options;

use tessera_core::schedule::{overlap_length, AccumulationRule, Schedule};
use tessera_core::{Accumulation, DType, Graph, NodeId, Plan};
use tessera_sim::machine::IpuConfig;
use tessera_sim::system::{
    estimate_system, SystemEstimate, SystemOptions, MAX_LOOP_COUNT, MAX_SYSTEM_IPUS,
};
pub use tessera_sim::techniques::{Checkpoints, Recompute};

use crate::model::{BuiltModel, Model};
pub use error::SessionError;
pub use inference::inference_estimate;
pub use options::{OptimizerKind, SessionOptions};

/// Where compiles keep their graphs and plans: the heap, so any model's graph fits.
pub use tessera_sim::Heap;

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
    /// Conditionals decided at run time (an ONNX model's `If` nodes).
    pub conditionals: Vec<tessera_sim::system::Conditional>,
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
        conditionals: front.conditionals,
        ..SystemOptions::default()
    };
    Ok(Target {
        plan,
        machine: IpuConfig::preset(options.ipu),
        system,
        options,
    })
}

pub(crate) fn opt_err(option: &'static str, message: String) -> SessionError {
    SessionError::Option { option, message }
}

/// The model as the options place it: every layer on one IPU under `no_pipelining`.
pub(crate) fn placed(model: &Model, options: &SessionOptions) -> Model {
    if options.no_pipelining {
        model.clone().without_pipelining()
    } else {
        model.clone()
    }
}

/// Checks the options every session shares.
pub(crate) fn check_options(options: &SessionOptions) -> Result<(), SessionError> {
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
            conditionals: Vec::new(),
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
