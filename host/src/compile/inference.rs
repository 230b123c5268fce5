//! The inference compile of a model file: the forward pass (with the loss when labels are
//! given) as an inference plan, pipelined over its stages with the inference schedule (forward
//! slots only, overlap of S micro-batches for Grouped and Interleaved, no stash), K
//! micro-batches per execution; what `evaluate` and `predict` run and the inference estimate
//! reports.

use tessera_core::schedule::{overlap_length, AccumulationRule, Schedule};
use tessera_core::{DType, Graph, NodeId};
use tessera_sim::system::SystemEstimate;

use super::{
    check_options, compile_graph, opt_err, placed, Front, Heap, Loops, SessionError,
    SessionOptions, Target,
};
use crate::model::Model;

/// The forward pass compiled for inference.
pub(crate) struct Inference {
    /// The inference plan, the machine and how the system runs it.
    pub(crate) target: Target,
    /// The model's output node.
    pub(crate) output: NodeId,
    /// The loss node, when labels are given.
    pub(crate) loss: Option<NodeId>,
    /// Micro-batches the inference schedule overlaps.
    pub(crate) overlap: usize,
    /// Micro-batches per execution and replica (K).
    pub(crate) k: usize,
    /// Micro-batches per replica the split fills (K without a split).
    pub(crate) micro_batches: usize,
    /// The estimate of one execution.
    pub(crate) estimate: SystemEstimate,
}

/// Builds and plans the inference graph, chooses K (`steps_per_execution` if asked) and
/// estimates one execution.
pub(crate) fn compile_inference(
    model: &Model,
    so: &SessionOptions,
    with_labels: bool,
    split: Option<usize>,
    steps_per_execution: Option<usize>,
) -> Result<Inference, SessionError> {
    check_options(so)?;
    let model = placed(model, so);
    let b = so.batch_size;
    let mut g: Graph<Heap> = Graph::new();
    let built = model.build(&mut g, b, so.dtype, false)?;
    let loss = if with_labels {
        let labels = g.input("labels", &[b], DType::I32)?;
        Some(g.sparse_categorical_crossentropy(
            "loss",
            built.output,
            labels,
            !built.softmax_output,
        )?)
    } else {
        None
    };
    // One stage runs the Sequential schedule, as the compile makes it.
    let stages = model.stage_count();
    let schedule = if stages == 1 {
        Schedule::Sequential
    } else {
        so.schedule
    };
    let overlap = overlap_length(schedule, stages, false);
    let (k, micro_batches) =
        choose_k(split, b, so, overlap, steps_per_execution, stages, schedule)?;
    let target = compile_graph(
        g,
        so,
        Front {
            train: None,
            device_mapping: model.device_mapping.clone(),
            accumulation_rule: AccumulationRule::TensorFlow,
            loops: Loops::Evaluation(k),
            conditionals: Vec::new(),
        },
    )?;
    let estimate = target.estimate()?;
    Ok(Inference {
        target,
        output: built.output,
        loss,
        overlap,
        k,
        micro_batches,
        estimate,
    })
}

/// Micro-batches per execution: as asked (a positive multiple of the overlap that the split
/// fills), else as many as the split fills, else (no data: an estimate) M rounded up to a
/// multiple of the overlap. Returns K and the micro-batches per replica the split fills.
fn choose_k(
    split: Option<usize>,
    b: usize,
    so: &SessionOptions,
    overlap: usize,
    asked: Option<usize>,
    stages: usize,
    schedule: Schedule,
) -> Result<(usize, usize), SessionError> {
    let fills = split.map(|n| n / b / so.replicas);
    let limit = fills.unwrap_or(usize::MAX);
    let k = match asked {
        Some(k) if k > 0 && k % overlap == 0 && k <= limit => k,
        Some(k) => {
            let most = fills.map_or(String::new(), |f| {
                format!(", at most the {f} micro-batches of {b} the test split fills per replica")
            });
            return Err(opt_err(
                "--steps-per-execution",
                format!(
                    "{k} micro-batches per execution: inference with the {} schedule over {stages} stage(s) needs a positive multiple of {overlap}{most}",
                    schedule.name()
                ),
            ));
        }
        None => match fills {
            Some(f) => f / overlap * overlap,
            None => so.gradient_accumulation_count.div_ceil(overlap) * overlap,
        },
    };
    if k == 0 {
        return Err(SessionError::Data(format!(
            "the test split's {} samples fill {} micro-batch(es) of {b} per replica; the {} schedule's inference needs {overlap}",
            split.unwrap_or(0),
            fills.unwrap_or(0),
            schedule.name()
        )));
    }
    Ok((k, fills.unwrap_or(k)))
}

/// The inference estimate of `model` (the forward pass, pipelined with the inference
/// schedule, K micro-batches per execution: `steps_per_execution`, else M rounded up to a
/// multiple of the schedule's overlap), with the micro-batches per execution it used.
///
/// # Errors
///
/// A [`SessionError`] for bad options or a model that cannot be built.
pub fn inference_estimate(
    model: &Model,
    so: &SessionOptions,
) -> Result<SystemEstimate, SessionError> {
    Ok(compile_inference(model, so, false, None, so.steps_per_execution)?.estimate)
}
