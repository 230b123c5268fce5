//! Compiling imported ONNX models: the graph imported at the options' batch size and element
//! type, a loss added for training (classification, regression or a masked-LM head for token
//! models), planned and estimated on the machine; pipeline stages as the file's attributes,
//! named boundaries or an automatic split say. Also the forward pass of an imported model run
//! with the core's reference kernels ([`run_onnx`]).

use std::collections::HashMap;

use serde::Serialize;
use tessera_core::schedule::AccumulationRule;
use tessera_core::{DType, Graph, Init, NodeId, Plan, Roles};
use tessera_sim::system::SystemEstimate;

use super::{
    check_options, compile_graph, opt_err, Front, Heap, Loops, SessionError, SessionOptions, Target,
};
use crate::onnx::{import, ImportOptions, Imported, OnnxGraph, OnnxModel, Stages};

/// The loss a training estimate of an imported model adds to its (first) output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossKind {
    /// By the output: `[batch, classes]` gets sparse cross-entropy; `[batch, seq, hidden]`
    /// of a model with a token embedding gets the masked-LM head; anything else MSE.
    #[default]
    Auto,
    /// Sparse categorical cross-entropy on the output as logits (`[batch, classes]` or
    /// `[batch, seq, classes]`), integer labels.
    SparseCategoricalCrossentropy,
    /// Mean squared error against a target of the output's shape.
    Mse,
    /// A masked-LM head as BERT's pre-training: the hidden states of the masked positions
    /// (`--mask-tokens` per sequence, gathered from the output `[batch, seq, hidden]`)
    /// projected onto the token embedding (tied; when the embedding is in an earlier pipeline
    /// stage the projection is a stage of its own on the embedding's IPU) to
    /// `[batch, masked, vocab]` logits, cross-entropy with labels (-100 ignored).
    MaskedLm,
    /// A span head as BERT's SQuAD fine-tuning: the output `[batch, seq, hidden]` projected to
    /// two logits a position (Hugging Face's `qa_outputs`, Graphcore's SQuAD heads), the
    /// start's and the end's over the sequence, each with a cross-entropy against its labelled
    /// position.
    Span,
}

/// How an imported model is compiled.
#[derive(Clone, Debug, PartialEq)]
pub struct OnnxOptions {
    /// Where pipeline stages start.
    pub stages: Stages,
    /// The loss of training.
    pub loss: LossKind,
    /// Estimate the forward pass only.
    pub inference: bool,
    /// The masked-LM head's masked positions per sequence (`None`: 15% of the sequence,
    /// rounded up: BERT's `max_predictions_per_seq`, 20 for 128 tokens).
    pub mask_tokens: Option<usize>,
    /// The IPU of each pipeline stage (TensorFlow's `device_mapping`; `None`: the file's
    /// `ipu` attributes, else stage `k` on IPU `k`). Stages sharing an IPU are reported one
    /// by one.
    pub device_mapping: Option<Vec<usize>>,
    /// Whole shapes of named inputs (`--input-shape`; see [`ImportOptions::input_shapes`]).
    pub input_shapes: Vec<(String, Vec<usize>)>,
}

/// The rule an ONNX model's pipeline takes accumulation counts by: PopART's, as PopART and
/// PopTorch (which compiles through PopART) are what run ONNX models on IPUs.
pub const ONNX_ACCUMULATION_RULE: AccumulationRule = AccumulationRule::PopArt;

/// BERT's share of masked tokens (15%, Devlin et al. 2019): the masked-LM head's positions
/// per sequence are this share of the sequence, rounded up, unless `--mask-tokens` says.
pub const MASKED_SHARE: f64 = 0.15;

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions {
            stages: Stages::Attributes,
            loss: LossKind::Auto,
            inference: false,
            mask_tokens: None,
            device_mapping: None,
            input_shapes: Vec::new(),
        }
    }
}

/// An imported model compiled for a session.
pub struct OnnxCompiled {
    /// What the import made.
    pub imported: Imported,
    /// The loss node (training).
    pub loss: Option<NodeId>,
    /// The loss that was added (training).
    pub loss_kind: Option<LossKind>,
    /// The masked-LM head, when the loss added one.
    pub head: Option<MlmHead>,
    /// The plan (training or inference), the machine and how the system runs it.
    pub target: Target,
}

/// A masked-LM head the loss added: a projection onto the token embedding's table (tied).
#[derive(Clone, Debug, PartialEq)]
pub struct MlmHead {
    /// The token embedding's table.
    pub table: NodeId,
    /// The first graph node of the head (the head and the loss are the forward nodes from
    /// here on).
    pub first: usize,
    /// The stage of the embedding whose IPU runs the head as a stage of its own, when they
    /// are in different stages.
    pub tied_to: Option<usize>,
}

/// Imports `model` under `so` and `oo`, adds the loss and backward pass for training, and
/// plans it.
///
/// # Errors
///
/// [`SessionError::Onnx`] for import errors, [`SessionError::Option`] for bad options,
/// [`SessionError::Graph`] / [`SessionError::Plan`] when the graph cannot be built.
pub fn compile_onnx(
    model: &OnnxModel,
    so: &SessionOptions,
    oo: &OnnxOptions,
) -> Result<OnnxCompiled, SessionError> {
    check_options(so)?;
    let og = OnnxGraph::import(model, &import_options(so, oo))?;
    compile_imported(&og, so, oo)
}

/// The import a session of `so` and `oo` compiles (in one stage: the compile places the
/// stages).
pub fn import_options(so: &SessionOptions, oo: &OnnxOptions) -> ImportOptions {
    ImportOptions {
        batch_size: Some(so.batch_size),
        dtype: so.dtype,
        training: !oo.inference,
        stages: Stages::One,
        input_shapes: oo.input_shapes.clone(),
        known_inputs: Vec::new(),
        techniques: so.techniques.clone(),
    }
}

/// [`compile_onnx`] of a model imported already: its nodes placed in the stages `oo` asks
/// for, the loss and backward pass added for training, planned. Every compile of an estimate
/// (the split's attempts, the search's) reads the one import.
///
/// # Errors
///
/// As [`compile_onnx`]; [`SessionError::Option`] when `og` was imported at another batch
/// size, element type or input shape, or for inference where `so` trains (or the reverse).
pub fn compile_imported(
    og: &OnnxGraph<'_>,
    so: &SessionOptions,
    oo: &OnnxOptions,
) -> Result<OnnxCompiled, SessionError> {
    check_options(so)?;
    let have = og.options();
    if og.imported().batch != so.batch_size
        || have.dtype != so.dtype
        || have.training == oo.inference
        || have.input_shapes != oo.input_shapes
    {
        return Err(opt_err(
            "--batch-size",
            format!(
                "the model was imported at batch {} in {:?} for {} with input shapes {:?}; compiling it at batch {} in {:?} for {} with {:?} needs an import of its own",
                og.imported().batch,
                have.dtype,
                if have.training { "training" } else { "inference" },
                have.input_shapes,
                so.batch_size,
                so.dtype,
                if oo.inference { "inference" } else { "training" },
                oo.input_shapes
            ),
        ));
    }
    let stages = if so.no_pipelining {
        Stages::One
    } else {
        oo.stages.clone()
    };
    let (mut g, imported) = og.staged(&stages)?;
    let model_stages = g.stage_count();
    let (loss, loss_kind, head) = if oo.inference {
        (None, None, None)
    } else {
        let (loss, kind, head) = add_loss(&mut g, &imported, oo.loss, oo.mask_tokens, so.dtype)?;
        (Some(loss), Some(kind), head)
    };
    let mut device_mapping = match &oo.device_mapping {
        Some(m) => Some(check_device_mapping(m, model_stages)?),
        None => imported.device_mapping.clone(),
    };
    // A tied masked-LM head is a stage of its own on its embedding's IPU, planned with that
    // stage's proportion.
    let mut so = so.clone();
    if let Some(e) = head.as_ref().and_then(|h| h.tied_to) {
        let m = device_mapping.get_or_insert_with(|| (0..model_stages).collect());
        m.push(m[e]);
        let proportion = &mut so.techniques.available_memory_proportion;
        if proportion.stages() == Some(model_stages) {
            *proportion = proportion.with_stage_like(e);
        }
    }
    let target = compile_graph(
        g,
        &so,
        Front {
            train: loss.map(|l| (l, &imported.layers[..])),
            device_mapping,
            accumulation_rule: ONNX_ACCUMULATION_RULE,
            loops: Loops::Options,
            conditionals: imported.conditionals.clone(),
        },
    )?;
    Ok(OnnxCompiled {
        imported,
        loss,
        loss_kind,
        head,
        target,
    })
}

/// A `--device-mapping` of `m` for `stages` pipeline stages: one IPU per stage, the IPUs
/// numbered from 0 without gaps.
fn check_device_mapping(m: &[usize], stages: usize) -> Result<Vec<usize>, SessionError> {
    if m.len() != stages {
        return Err(opt_err(
            "--device-mapping",
            format!(
                "has {} entries for {stages} pipeline stages (one IPU per stage)",
                m.len()
            ),
        ));
    }
    if let Some(missing) = (0..=m.iter().copied().max().unwrap_or(0)).find(|i| !m.contains(i)) {
        return Err(opt_err(
            "--device-mapping",
            format!(
                "{m:?} leaves IPU {missing} without a stage; number the IPUs from 0 without gaps"
            ),
        ));
    }
    Ok(m.to_vec())
}

/// The loss `kind` is for `imported` (`Auto` resolved by its first output, float or not).
fn resolve_loss(kind: LossKind, imported: &Imported, float_out: bool) -> LossKind {
    let dims = imported.outputs.first().map_or(0, |o| o.dims.len());
    match kind {
        LossKind::Auto if float_out && dims == 2 => LossKind::SparseCategoricalCrossentropy,
        LossKind::Auto if float_out && dims == 3 && !imported.embeddings.is_empty() => {
            LossKind::MaskedLm
        }
        LossKind::Auto => LossKind::Mse,
        k => k,
    }
}

/// The pipeline stages training `imported` (as imported: its outputs' types are known) on
/// `stages` model stages makes: one more for a masked-LM head, which is a stage of its own on
/// its embedding's IPU when there are several (the embedding is in an earlier stage).
pub fn pipeline_stages(
    imported: &Imported,
    loss: LossKind,
    inference: bool,
    stages: usize,
) -> usize {
    let head = !inference && stages > 1 && resolve_loss(loss, imported, true) == LossKind::MaskedLm;
    stages + usize::from(head)
}

/// Adds the loss of `kind` on the model's first output, in the last stage; a masked-LM head
/// tied to an embedding of an earlier stage goes into a stage of its own after it (whose IPU
/// is the embedding's).
fn add_loss(
    g: &mut Graph<Heap>,
    imported: &Imported,
    kind: LossKind,
    mask_tokens: Option<usize>,
    dtype: DType,
) -> Result<(NodeId, LossKind, Option<MlmHead>), SessionError> {
    let first = g.len();
    let out = imported
        .outputs
        .first()
        .ok_or_else(|| opt_err("--loss", "the model has no output".into()))?;
    let dims = out.dims.clone();
    let last = g.stage_count() - 1;
    g.set_stage(last)?;
    let mut head = None;
    let float_out = g.node(out.node).dtype().is_float();
    let kind = resolve_loss(kind, imported, float_out);
    if !float_out {
        return Err(opt_err(
            "--loss",
            format!(
                "output `{}` is not a float tensor; train a model whose output is",
                out.name
            ),
        ));
    }
    let loss = match kind {
        LossKind::SparseCategoricalCrossentropy => {
            if dims.len() < 2 {
                return Err(opt_err(
                    "--loss",
                    format!(
                        "output `{}` is {dims:?}; cross-entropy needs [batch, ..., classes]",
                        out.name
                    ),
                ));
            }
            let labels = g.input("labels", &dims[..dims.len() - 1], DType::I32)?;
            g.sparse_categorical_crossentropy("loss", out.node, labels, true)?
        }
        LossKind::Mse => {
            let target = g.input("target", &dims, dtype)?;
            g.mean_squared_error("loss", out.node, target)?
        }
        LossKind::MaskedLm => {
            if dims.len() != 3 {
                return Err(opt_err(
                    "--loss",
                    format!(
                        "masked-LM needs a [batch, seq, hidden] output; `{}` is {dims:?}",
                        out.name
                    ),
                ));
            }
            // The token embedding: the largest table whose rows are as wide as the hidden size.
            let table = imported
                .embeddings
                .iter()
                .filter(|e| e.dims.len() == 2 && e.dims[1] == dims[2])
                .max_by_key(|e| e.dims[0])
                .ok_or_else(|| {
                    opt_err(
                        "--loss",
                        format!(
                            "masked-LM needs a token embedding of width {}; the model has none",
                            dims[2]
                        ),
                    )
                })?;
            let table_stage = g.node(table.node).stage();
            if table_stage != last {
                // Graphcore's pipelined BERTs keep the decoder tied to the token embedding
                // and run the head after the last encoder stage on the embedding's IPU
                // (PopTorch's `BeginBlock(cls, ipu_id=0)`, PopART's and TensorFlow's last
                // stage mapped to IPU 0): a stage of its own, reading the embedding's table.
                // It gathers the masked positions itself, as TensorFlow's last stage
                // (`enc_out`, `pool`, `heads`) and PopTorch's (after the pooler's
                // `BeginBlock` on IPU 0) do.
                g.set_stage(last + 1)?;
            }
            let tied = (table_stage != last).then_some(table_stage);
            head = Some(MlmHead {
                table: table.node,
                first,
                tied_to: tied,
            });
            let decoder = table.node;
            // BERT's pre-training head runs on the masked positions only (Google's
            // `gather_indexes` over `max_predictions_per_seq`, Graphcore's `mask_tokens`):
            // their hidden states are gathered, by flat position, before the projection.
            let (batch, seq) = (dims[0], dims[1]);
            if mask_tokens.is_some_and(|m| m == 0 || m > seq) {
                return Err(opt_err(
                    "--mask-tokens",
                    format!("must be 1 to the sequence length {seq}"),
                ));
            }
            let masked = mask_tokens.unwrap_or_else(|| (seq as f64 * MASKED_SHARE).ceil() as usize);
            let hidden = if masked < seq {
                let flat = g.reshape("mlm/flat", out.node, &[batch * seq, dims[2]])?;
                let positions = g.input("masked_positions", &[batch, masked], DType::I32)?;
                g.gather("mlm/masked", flat, positions)?
            } else {
                out.node
            };
            let bias = g.variable("mlm/bias", &[table.dims[0]], dtype, Init::Zeros)?;
            let logits = g.matmul_t("mlm/logits", hidden, decoder, false, true)?;
            let logits = g.add("mlm/logits_bias", logits, bias)?;
            let labels = g.input("labels", &[batch, masked], DType::I32)?;
            g.sparse_categorical_crossentropy_ignoring("loss", logits, labels, true, Some(-100))?
        }
        LossKind::Span => span_loss(g, out.node, &out.name, &dims, dtype)?,
        LossKind::Auto => unreachable!("resolved above"),
    };
    Ok((loss, kind, head))
}

/// The span loss of [`LossKind::Span`] on output `out` (`name`, `dims`): a dense layer of two
/// units over the hidden size (`span/qa_outputs`), its `[batch, seq, 2]` logits turned to
/// `[batch, 2, seq]`, and a sparse cross-entropy over the sequence with `[batch, 2]` labels,
/// the start and end positions (the mean of the two losses, as Hugging Face's
/// `BertForQuestionAnswering` takes it, up to the factor).
fn span_loss(
    g: &mut Graph<Heap>,
    out: NodeId,
    name: &str,
    dims: &[usize],
    dtype: DType,
) -> Result<NodeId, SessionError> {
    if dims.len() != 3 {
        return Err(opt_err(
            "--loss",
            format!("a span head needs a [batch, seq, hidden] output; `{name}` is {dims:?}"),
        ));
    }
    let logits = g.dense(
        "span/qa_outputs",
        out,
        2,
        tessera_core::Activation::Linear,
        dtype,
    )?;
    let by_end = g.transpose("span/logits", logits, &[0, 2, 1])?;
    let positions = g.input("span_positions", &[dims[0], 2], DType::I32)?;
    Ok(g.sparse_categorical_crossentropy("loss", by_end, positions, true)?)
}

pub use crate::summary::LayerRow;

/// Per-layer rows: each graph node's bytes and each compute set's cycles summed into the
/// ONNX node that made it: a backward node's into the node whose gradient rule made it
/// ([`tessera_core::Node::origin`]), others by name (`X/recompute`, `X/...` into the node of
/// `X`).
pub fn layer_rows(c: &OnnxCompiled, e: &SystemEstimate) -> Vec<LayerRow> {
    let g = c.target.plan.graph();
    let imp = &c.imported;
    let mut rows: Vec<LayerRow> = imp
        .layers
        .iter()
        .map(|l| LayerRow {
            name: l.name.clone(),
            op: l.op.clone(),
            stage: l.stage,
            weight_bytes: 0,
            activation_bytes: 0,
            forward_cycles: 0,
            backward_cycles: 0,
            backward_gradient_cycles: 0,
            backward_recompute_cycles: 0,
            backward_exchange_cycles: 0,
            backward_update_cycles: 0,
            code: Default::default(),
        })
        .collect();
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, n) in g.nodes().iter().enumerate() {
        let Some(l) = layer_index(imp, i) else {
            continue;
        };
        by_name.insert(n.name(), l);
        let bytes = n.bytes() as u64;
        if n.op().is_state() && n.roles().intersects(Roles::TRAINABLE | Roles::STATE) {
            rows[l].weight_bytes += bytes;
        } else if c.target.plan.slots()[i].view_of.is_none() {
            rows[l].activation_bytes += bytes;
        }
    }
    let find = |op: &str| owner(&by_name, op);
    for (i, n) in g.nodes().iter().enumerate() {
        let ipu = e.stages.get(n.stage()).map_or(0, |s| s.ipu);
        let Some(code) = e.ipus.get(ipu).and_then(|r| r.node_code.get(i)) else {
            continue;
        };
        let l = layer_index(imp, i).or_else(|| find(n.name()));
        if let Some(l) = l {
            rows[l].code.add(code);
        }
    }
    // A backward node belongs to the layer whose gradient rule made it (a product's input
    // gradient to the product, though named after the input), else to the layer its name says.
    let ids: HashMap<&str, usize> = g
        .nodes()
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name(), i))
        .collect();
    // The event's layer, and its graph node when it names one.
    let layer_of = |op: &str| {
        let node = ids.get(op).map(|&i| &g.nodes()[i]);
        let layer = match node.and_then(tessera_core::Node::origin) {
            Some(o) => layer_index(imp, o.index()).or_else(|| find(g.node(o).name())),
            None => find(op),
        };
        layer.map(|l| (l, node))
    };
    for s in &e.stages {
        for ev in &s.forward_trace {
            if let Some((l, _)) = layer_of(&ev.op) {
                rows[l].forward_cycles += ev.cycles;
            }
        }
        for ev in &s.backward_trace {
            if let Some((l, node)) = layer_of(&ev.op) {
                let row = &mut rows[l];
                row.backward_cycles += ev.cycles;
                *backward_part(row, ev, node) += ev.cycles;
            }
        }
    }
    rows
}

/// Which part of `row`'s backward event `ev` (of graph node `node`) is: an exchange, the
/// recomputation of a forward node, an accumulation or update of a weight, or else the
/// gradient rule's own work.
fn backward_part<'r>(
    row: &'r mut LayerRow,
    ev: &tessera_sim::estimate::TraceEvent,
    node: Option<&tessera_core::Node>,
) -> &'r mut u64 {
    if ev.phase == tessera_sim::estimate::Phase::Exchange {
        return &mut row.backward_exchange_cycles;
    }
    let Some(n) = node else {
        return &mut row.backward_gradient_cycles;
    };
    if n.origin().is_some() {
        &mut row.backward_gradient_cycles
    } else if n.name().contains("/recompute") {
        &mut row.backward_recompute_cycles
    } else if n.op().is_update() || n.roles().intersects(Roles::UPDATE | Roles::ACCUMULATOR) {
        &mut row.backward_update_cycles
    } else {
        &mut row.backward_gradient_cycles
    }
}

/// What `by_name` maps `op`'s forward node to: a gradient `X_grad/...` belongs to X, a
/// recomputed copy `X/recompute` or an update `X/...` to X.
fn owner(by_name: &HashMap<&str, usize>, op: &str) -> Option<usize> {
    by_name
        .get(op)
        .copied()
        .or_else(|| by_name.get(op.strip_suffix("/recompute")?).copied())
        .or_else(|| by_name.get(&op[..op.rfind("_grad")?]).copied())
        .or_else(|| by_name.get(op.split('/').next()?).copied())
}

/// Cycles per micro-batch of the masked-LM head and the loss, forward and backward (every
/// stage's), when the loss added a head.
pub fn head_cycles(c: &OnnxCompiled, e: &SystemEstimate) -> u64 {
    let Some(head) = &c.head else {
        return 0;
    };
    let g = c.target.plan.graph();
    let by_name: HashMap<&str, usize> = g.nodes()[head.first..g.forward_len()]
        .iter()
        .map(|n| (n.name(), 0))
        .collect();
    e.stages
        .iter()
        .flat_map(|s| s.forward_trace.iter().chain(&s.backward_trace))
        .filter(|ev| owner(&by_name, &ev.op).is_some())
        .map(|ev| ev.cycles)
        .sum()
}

fn layer_index(imp: &Imported, index: usize) -> Option<usize> {
    let i = imp.layers.partition_point(|l| l.end <= index);
    imp.layers
        .get(i)
        .filter(|l| l.first <= index && index < l.end)
        .map(|_| i)
}

/// One tensor of an ONNX model's run: its name, dims and values (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    /// The ONNX name.
    pub name: String,
    /// Dimensions.
    pub dims: Vec<usize>,
    /// Values (integers and booleans as their value).
    pub data: Vec<f32>,
}

/// The most elements a float input of `run_onnx` may have to be read at import as a
/// constant of its values (integer and boolean inputs always are).
const KNOWN_INPUT_ELEMENTS: usize = 16;

/// Runs an imported model's forward pass with the core's reference kernels (f32, the file's
/// batch) on `inputs` (by ONNX name) and returns its outputs. Every weight must have its
/// values.
///
/// # Errors
///
/// [`SessionError::Onnx`] for import errors and weights without values
/// ([`crate::onnx::OnnxError::NoWeights`]); [`SessionError::Option`] for a missing or
/// misshapen input; [`SessionError::Run`] if a kernel fails.
pub fn run_onnx(
    model: &OnnxModel,
    inputs: &[NamedTensor],
) -> Result<Vec<NamedTensor>, SessionError> {
    model.require_float32_io()?;
    let known = known_inputs(model, inputs);
    let (g, imported) = import_for_run(model, inputs, &known)?;
    imported.require_weights()?;
    let plan = Plan::new(&g)?;
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 0)?;
    for s in &imported.state {
        if let Ok(values) = &s.values {
            let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
            plan.write_state(s.node, &mut state, &v)?;
        }
    }
    check_given(inputs, &imported, &known)?;
    for i in &imported.inputs {
        let t = inputs.iter().find(|t| t.name == i.name).ok_or_else(|| {
            opt_err(
                "--input",
                format!("the model's input `{}` ({:?}) is not given", i.name, i.dims),
            )
        })?;
        if t.dims != i.dims {
            return Err(opt_err(
                "--input",
                format!("`{}` is {:?}; the model wants {:?}", i.name, t.dims, i.dims),
            ));
        }
        plan.write_input(i.node, &mut arena, &t.data)?;
    }
    for k in 0..g.len() {
        plan.run_node(k, &mut arena, &mut state)?;
    }
    imported
        .outputs
        .iter()
        .map(|o| {
            let t = plan.tensor(o.node, &arena, &state)?;
            Ok(NamedTensor {
                name: o.name.clone(),
                dims: o.dims.clone(),
                data: t.iter().collect(),
            })
        })
        .collect()
}

/// A model input's name, dims and values, known at import.
type Known = (String, Vec<usize>, Vec<f64>);

/// The inputs given that are index or shape data (integers, booleans) or a few values (a
/// clip's bounds, a resize's scales): they are read at import as constants of the values
/// given, as onnxruntime reads them when it runs, so that a node needing them at import finds
/// them.
fn known_inputs(model: &OnnxModel, inputs: &[NamedTensor]) -> Vec<Known> {
    model
        .graph()
        .input
        .iter()
        .filter_map(|vi| {
            let name = vi.name.as_deref()?;
            let t = inputs.iter().find(|t| t.name == name)?;
            let elem = crate::onnx::tensor_elem(vi)?;
            (!elem.is_float() || t.data.len() <= KNOWN_INPUT_ELEMENTS).then(|| {
                (
                    t.name.clone(),
                    t.dims.clone(),
                    t.data.iter().map(|&v| f64::from(v)).collect(),
                )
            })
        })
        .collect()
}

/// The model imported for a run with `known` inputs: at the file's batch, or, when it is
/// symbolic, at the batch of the array given for its input, and every input whose declared
/// shape has symbols (a sequence length, an image size) at the shape of the array given for
/// it, as onnxruntime binds them.
fn import_for_run(
    model: &OnnxModel,
    inputs: &[NamedTensor],
    known: &[Known],
) -> Result<(Graph<Heap>, Imported), SessionError> {
    let mut input_shapes: Vec<(String, Vec<usize>)> = Vec::new();
    for vi in &model.graph().input {
        let (Some(name), Some(declared)) = (vi.name.as_deref(), declared_dims(vi)) else {
            continue;
        };
        let Some(t) = inputs.iter().find(|t| t.name == name) else {
            continue;
        };
        // An array of another rank is left to the check of the given shapes; one whose size
        // differs where the file fixes it is refused here, naming the input.
        if declared.len() != t.dims.len() || declared.iter().all(Option::is_some) {
            continue;
        }
        if let Some(axis) =
            (0..declared.len()).find(|&a| declared[a].is_some_and(|d| d != t.dims[a]))
        {
            let shown: Vec<String> = declared
                .iter()
                .map(|d| d.map_or("?".into(), |d| d.to_string()))
                .collect();
            return Err(opt_err(
                "--input",
                format!(
                    "`{name}` is {:?}; the model's input is [{}], whose axis {axis} is fixed at {}",
                    t.dims,
                    shown.join(", "),
                    declared[axis].unwrap_or(0)
                ),
            ));
        }
        input_shapes.push((name.to_string(), t.dims.clone()));
    }
    let import_at = |batch_size: Option<usize>| {
        let mut g: Graph<Heap> = Graph::new();
        let options = ImportOptions {
            batch_size,
            stages: Stages::One,
            known_inputs: known.to_vec(),
            input_shapes: input_shapes.clone(),
            ..ImportOptions::default()
        };
        import(model, &mut g, &options).map(|imported| (g, imported))
    };
    match import_at(None) {
        Err(crate::onnx::OnnxError::UnboundDim { input, axis, .. }) => {
            let Some(t) = inputs.iter().find(|t| t.name == input) else {
                return Err(opt_err(
                    "--input",
                    format!(
                        "the model's input `{input}` is not given (its batch is taken from it)"
                    ),
                ));
            };
            let batch = t.dims.get(axis).copied().ok_or_else(|| {
                opt_err(
                    "--input",
                    format!(
                        "`{input}` is {:?}; the model's input has a dimension {axis}",
                        t.dims
                    ),
                )
            })?;
            Ok(import_at(Some(batch))?)
        }
        other => Ok(other?),
    }
}

/// The dims a value info declares, if it declares a tensor shape: each a size, or `None`
/// where it is symbolic (a name, `-1`, or blank).
fn declared_dims(vi: &crate::onnx::proto::ValueInfoProto) -> Option<Vec<Option<usize>>> {
    use crate::onnx::proto::tensor_shape_proto::dimension::Value as D;
    match vi.r#type.as_ref()?.value.as_ref()? {
        crate::onnx::proto::type_proto::Value::TensorType(t) => Some(
            t.shape
                .as_ref()?
                .dim
                .iter()
                .map(|d| match d.value {
                    Some(D::DimValue(v)) if v >= 0 => Some(v as usize),
                    _ => None,
                })
                .collect(),
        ),
        _ => None,
    }
}

/// Every tensor given is an input of the model (or one known at import), given once.
fn check_given(
    inputs: &[NamedTensor],
    imported: &Imported,
    known: &[Known],
) -> Result<(), SessionError> {
    for (k, t) in inputs.iter().enumerate() {
        if inputs[..k].iter().any(|u| u.name == t.name) {
            return Err(opt_err(
                "--input",
                format!("`{}` is given twice; give each input once", t.name),
            ));
        }
        if !imported.inputs.iter().any(|i| i.name == t.name) && !known.iter().any(|k| k.0 == t.name)
        {
            let names: Vec<&str> = imported.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(opt_err(
                "--input",
                format!(
                    "the model has no input `{}` (its inputs: {})",
                    t.name,
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(())
}
