//! The import: ONNX nodes in file order (ONNX graphs are topologically sorted) become graph
//! nodes; shape arithmetic on constants folds away; every tensor gets its static shape from
//! the graph builder, which checks it.

// The core's GraphError carries node names inline (the core has no heap), so closures that
// return it are large; they run once per node.
#![allow(clippy::result_large_err)]

use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use tessera_core::ops::conv::{ConvParams, DataLayout, Padding};
use tessera_core::ops::elementwise::{BinaryFn, GeluForm, UnaryFn};
use tessera_core::ops::norm::{BatchNorm, BatchNormParams};
use tessera_core::ops::pool::{PoolKind, PoolParams};
use tessera_core::ops::reduce::ReduceKind;
use tessera_core::{DType, Graph, GraphError, Init, NodeId};
use tessera_sim::Heap;

use super::consts::{self, cast_value, decode, Const, Elem, Missing};
use super::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto, TensorProto};
use super::{
    node_name, Embedding, ImportOptions, Imported, ImportedInput, ImportedOutput, Layer, OnnxError,
    OnnxModel, StateValue,
};

/// Where pipeline stages start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stages {
    /// Every node in stage 0.
    One,
    /// PopART's `__pipeline_stage` (else `__ipu_number`) node attributes when present, else
    /// one stage.
    Attributes,
    /// A new stage after each named node (or the node making the named tensor).
    After(Vec<String>),
    /// The stage of every node, in file order.
    PerNode(Vec<usize>),
}

/// The most elements a folded constant may have.
const FOLD_LIMIT: usize = 1 << 24;

/// A value during import.
#[derive(Clone, Debug)]
enum Val {
    /// A tensor of the graph, with its ONNX element type.
    T(NodeId, Elem),
    /// A tensor known at import time.
    C(Rc<Const>),
    /// A weight (index into `Importer::weights`), placed in a stage on first use.
    W(usize),
}

/// An initializer (or weight-like constant) that becomes a variable when used.
#[derive(Clone, Debug)]
struct Weight {
    name: String,
    dims: Vec<usize>,
    values: Result<Arc<Vec<f64>>, Missing>,
    trainable: bool,
    init: Init,
}

type R<T> = Result<T, OnnxError>;

/// A graph-builder call whose error names the node being imported.
macro_rules! chk {
    ($s:ident, $e:expr) => {{
        let r = $e;
        $s.check(r)
    }};
}

mod count;
use inputs::*;
mod fold;
mod inputs;
pub mod ops;
mod rewrite;
mod staging;
#[cfg(test)]
mod testing;
pub mod versions;

pub use count::{import_count, ImportCount};
pub use staging::OnnxGraph;

/// The ONNX ops the importer reads (default domain), sorted: the registry's.
pub fn supported_ops() -> Vec<&'static str> {
    ops::supported_ops()
}

/// Imports `model` into `g`.
///
/// # Errors
///
/// Any [`OnnxError`] naming the node, tensor or input at fault.
pub fn import(
    model: &OnnxModel,
    g: &mut Graph<Heap>,
    opts: &ImportOptions,
) -> Result<Imported, OnnxError> {
    let base = g.len();
    let (mut imported, placements) = import_unstaged(model, g, opts)?;
    staging::stage(model, g, base, &mut imported, &placements, &opts.stages)?;
    Ok(imported)
}

/// Imports `model` into `g` in the stage `g` is in, with what placing its nodes in stages
/// needs.
fn import_unstaged(
    model: &OnnxModel,
    g: &mut Graph<Heap>,
    opts: &ImportOptions,
) -> R<(Imported, staging::Placements)> {
    let graph = model.graph();
    super::validate_graph(graph)?;
    let rewritten = match opts.training || !opts.techniques.inference_rewrites {
        true => None,
        false => rewrite::fold_batch_norms(model),
    };
    let model = rewritten.as_ref().unwrap_or(model);
    let graph = model.graph();
    // A negative size other than -1 (a symbol, above) is neither a size nor a symbol.
    for i in &graph.input {
        use super::proto::tensor_shape_proto::dimension::Value as D;
        use super::proto::type_proto::Value as T;
        let Some(T::TensorType(t)) = i.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
            continue;
        };
        for (axis, d) in t.shape.iter().flat_map(|s| s.dim.iter()).enumerate() {
            if let Some(D::DimValue(v)) = d.value {
                if v < -1 {
                    return Err(OnnxError::BadNode {
                        node: i.name.clone().unwrap_or_default(),
                        op: "input".into(),
                        message: format!(
                            "dimension {axis} is {v}; a dimension is a size (0 or more), a symbol, or -1 (a symbol)"
                        ),
                    });
                }
            }
        }
    }
    check_input_shapes(model, &opts.input_shapes)?;
    let mut batching = Batching {
        axes: batch_axes(model),
        rebatched: HashSet::new(),
    };
    let batch_axes = &batching.axes;
    check_shared_sizes(model, batch_axes, &opts.input_shapes)?;
    let opts = &match given_batch(model, batch_axes, opts)? {
        Some((o, rebatched)) => {
            batching.rebatched = rebatched;
            o
        }
        None => opts.clone(),
    };
    let batch_axes = &batching.axes;
    let file_batch = file_batch(model, batch_axes, &opts.input_shapes)?;
    let batch = match (opts.batch_size, file_batch) {
        (Some(b), _) => b,
        (None, Some(b)) => b,
        (None, None) => match symbolic_batch(model, batch_axes, &opts.input_shapes) {
            // No input has a batch axis (scalars only, or no inputs): a batch of one.
            None => 1,
            Some((input, axis, param)) => {
                return Err(OnnxError::UnboundDim {
                    input,
                    axis,
                    param,
                    hint: "bind the batch with --batch-size (or the input's whole shape with --input-shape)".into(),
                })
            }
        },
    };
    if batch == 0 {
        return Err(OnnxError::BadStages(String::new())).or(Err(OnnxError::UnboundDim {
            input: graph
                .input
                .first()
                .and_then(|i| i.name.clone())
                .unwrap_or_default(),
            axis: 0,
            param: "0".into(),
            hint: "--batch-size must be at least 1".into(),
        }));
    }
    // Rebinding the batch rewrites the shapes written into the file (Reshape targets and
    // the like), which needs every tensor's shape at the file's own batch first.
    let original = match file_batch {
        Some(fb) if fb != batch => {
            let mut scratch: Graph<Heap> = Graph::new();
            count::shape_pass();
            let (first, _) =
                Importer::new(model, &mut scratch, opts, fb, fb, None, &batching)?.run()?;
            Some(first.shapes)
        }
        _ => None,
    };
    let fb = file_batch.unwrap_or(batch);
    count::import();
    Importer::new(model, g, opts, batch, fb, original.as_ref(), &batching)?.run()
}

/// The stage of every node.
fn stage_of(model: &OnnxModel, stages: &Stages) -> R<Vec<usize>> {
    let graph = model.graph();
    let n = graph.node.len();
    match stages {
        Stages::One => Ok(vec![0; n]),
        Stages::PerNode(v) => {
            if v.len() == n {
                Ok(v.clone())
            } else {
                Err(OnnxError::BadStages(format!(
                    "{} stages given for {n} nodes",
                    v.len()
                )))
            }
        }
        Stages::Attributes => {
            let mut out = Vec::with_capacity(n);
            let mut current = 0usize;
            for node in &graph.node {
                let a = attr(node, "__pipeline_stage").or_else(|| attr(node, "__ipu_number"));
                if let Some(s) = a.and_then(|a| a.i) {
                    current = usize::try_from(s).map_err(|_| {
                        OnnxError::BadStages(format!(
                            "node `{}` has stage attribute {s}",
                            node.name.as_deref().unwrap_or("")
                        ))
                    })?;
                }
                out.push(current);
            }
            Ok(out)
        }
        Stages::After(names) => {
            let names_of: Vec<String> = model.node_names();
            let mut cuts = Vec::new();
            for name in names {
                let found = names_of.iter().position(|s| s == name).or_else(|| {
                    graph
                        .node
                        .iter()
                        .position(|nd| nd.output.iter().any(|o| o == name))
                });
                let Some(i) = found else {
                    let lower = name.to_lowercase();
                    let mut suggestions: Vec<String> = names_of
                        .iter()
                        .filter(|s| {
                            let s = s.to_lowercase();
                            s.contains(&lower) || (!s.is_empty() && lower.contains(&s))
                        })
                        .take(5)
                        .cloned()
                        .collect();
                    if suggestions.is_empty() {
                        suggestions = names_of.iter().take(3).cloned().collect();
                        suggestions.push("... (see `tessera estimate MODEL --layers`)".into());
                    }
                    return Err(OnnxError::UnknownStageNode {
                        name: name.clone(),
                        suggestions,
                    });
                };
                if let Some(&last) = cuts.last() {
                    if i <= last {
                        return Err(OnnxError::BadStages(format!(
                            "`{name}` (node {i}) does not come after the previous boundary (node {last}); list boundaries in graph order"
                        )));
                    }
                }
                if i + 1 >= n {
                    return Err(OnnxError::BadStages(format!(
                        "`{name}` is the last node; a stage after it would be empty"
                    )));
                }
                cuts.push(i);
            }
            Ok((0..n)
                .map(|i| cuts.iter().filter(|&&c| c < i).count())
                .collect())
        }
    }
}

/// Stage -> IPU from `__ipu_number` attributes, when nodes have both attributes.
fn ipu_mapping(model: &OnnxModel, stages: &[usize]) -> Option<Vec<usize>> {
    let graph = model.graph();
    let count = stages.iter().copied().max().map_or(1, |s| s + 1);
    let mut map: Vec<Option<usize>> = vec![None; count];
    let mut any = false;
    for (node, &s) in graph.node.iter().zip(stages) {
        if attr(node, "__pipeline_stage").is_none() {
            continue;
        }
        if let Some(ipu) = attr(node, "__ipu_number").and_then(|a| a.i) {
            any = true;
            map[s] = usize::try_from(ipu).ok();
        }
    }
    if !any {
        return None;
    }
    let mut last = 0;
    Some(
        map.into_iter()
            .map(|m| {
                last = m.unwrap_or(last);
                last
            })
            .collect(),
    )
}

/// The tensors nodes read as weights, at the inputs the registry names: convolution and
/// product weights and biases, normalisation parameters, recurrent weights and embedding
/// tables.
fn weight_slots(graph: &super::proto::GraphProto) -> HashSet<String> {
    let mut out = HashSet::new();
    for n in &graph.node {
        let slots = ops::entry(n.op_type.as_deref().unwrap_or("")).map_or(&[][..], |c| c.weights);
        for &k in slots {
            if let Some(t) = n.input.get(k).filter(|t| !t.is_empty()) {
                out.insert(t.clone());
            }
        }
    }
    out
}

/// A graph node name from `base` that no name in `used` is, cut to 64 bytes (`~k` added
/// when cut or taken), added to `used`.
fn fresh(used: &mut HashSet<String>, base: &str) -> String {
    let limit = 64;
    let mut stem: String = if base.len() > limit {
        let mut cut = limit;
        while !base.is_char_boundary(cut) {
            cut -= 1;
        }
        base[..cut].to_string()
    } else if base.is_empty() {
        "tensor".to_string()
    } else {
        base.to_string()
    };
    if stem.len() != base.len() || used.contains(&stem) {
        let root = stem.clone();
        let mut k = 1;
        loop {
            stem = format!("{root}~{k}");
            if !used.contains(&stem) {
                break;
            }
            k += 1;
        }
    }
    used.insert(stem.clone());
    stem
}

/// A node's attribute.
fn attr<'a>(node: &'a NodeProto, name: &str) -> Option<&'a AttributeProto> {
    node.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
}

struct Importer<'a> {
    model: &'a OnnxModel,
    g: &'a mut Graph<Heap>,
    opts: &'a ImportOptions,
    batch: usize,
    file_batch: usize,
    original: Option<&'a HashMap<String, Vec<usize>>>,
    batch_axes: &'a Batching,
    values: HashMap<String, Val>,
    weights: Vec<Weight>,
    /// Each weight's variable, once placed.
    placed: HashMap<usize, NodeId>,
    /// Every read of a weight, for the placement of stages.
    uses: Vec<staging::WeightUse>,
    state: Vec<StateValue>,
    embeddings: Vec<Embedding>,
    used: HashSet<String>,
    /// The ONNX node being converted (`None` before and after them).
    layer: Option<usize>,
    /// Tensors that nodes read as weights (a light model's ConstantOfShape there is one).
    weight_slots: HashSet<String>,
    /// Every `If` decided at run time, with its branches' graph nodes.
    conditionals: Vec<tessera_sim::system::Conditional>,
    // The node being imported, for messages.
    node: String,
    op: String,
}

impl<'a> Importer<'a> {
    fn new(
        model: &'a OnnxModel,
        g: &'a mut Graph<Heap>,
        opts: &'a ImportOptions,
        batch: usize,
        file_batch: usize,
        original: Option<&'a HashMap<String, Vec<usize>>>,
        batch_axes: &'a Batching,
    ) -> R<Importer<'a>> {
        let graph = model.graph();
        let mut im = Importer {
            model,
            g,
            opts,
            batch,
            file_batch,
            original,
            batch_axes,
            values: HashMap::new(),
            weights: Vec::new(),
            placed: HashMap::new(),
            uses: Vec::new(),
            state: Vec::new(),
            embeddings: Vec::new(),
            used: HashSet::new(),
            layer: None,
            weight_slots: weight_slots(graph),
            conditionals: Vec::new(),
            node: String::new(),
            op: String::new(),
        };
        for t in &graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            im.node = name.clone();
            im.op = "initializer".into();
            let v = im.tensor_value(t, &name, true)?;
            im.values.insert(name, v);
        }
        Ok(im)
    }

    /// Imports the model in one pipeline stage (the stage the graph is in); [`staging`]
    /// places its nodes in stages. In phases: the graph inputs, the nodes, the outputs.
    fn run(mut self) -> R<(Imported, staging::Placements)> {
        let model = self.model;
        let graph = model.graph();
        let mut inputs = Vec::new();
        for i in real_inputs(model) {
            inputs.extend(self.input(i)?);
        }
        self.check_ops()?;
        let mut shapes: HashMap<String, Vec<usize>> = HashMap::new();
        let stage = self.g.nodes().last().map_or(0, |n| n.stage());
        let layers = self.nodes(stage, &mut shapes)?;
        for i in &inputs {
            shapes.insert(i.name.clone(), i.dims.clone());
        }
        for t in &graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            if let Some(v) = self.values.get(&name) {
                shapes.entry(name).or_insert_with(|| self.dims(v));
            }
        }
        let outputs = self.outputs(&mut shapes)?;
        let placements = staging::Placements {
            uses: self.uses,
            placed: self.placed,
            used: self.used,
        };
        let imported = Imported {
            inputs,
            outputs,
            layers,
            shapes,
            state: self.state,
            embeddings: self.embeddings,
            batch: self.batch,
            file_batch: self.file_batch,
            stages: stage + 1,
            device_mapping: None,
            conditionals: self.conditionals,
        };
        Ok((imported, placements))
    }

    /// Graph input `i` as a graph input of its bound shape, or as a constant when its values
    /// are known (`None` then).
    fn input(&mut self, i: &super::proto::ValueInfoProto) -> R<Option<ImportedInput>> {
        let name = i.name.clone().unwrap_or_default();
        let dims = info_dims(i).unwrap_or_default();
        let Some(elem) = super::tensor_elem(i) else {
            return Err(OnnxError::BadNode {
                node: name,
                op: "input".into(),
                message: "the input is not a tensor of a type the importer reads (float, double, float16, bfloat16, int64, int32, int16, uint16, int8, uint8, bool)".into(),
            });
        };
        if let Some((_, kdims, values)) = self.opts.known_inputs.iter().find(|(n, _, _)| *n == name)
        {
            let c = Const::new(kdims.clone(), elem, values.clone(), false);
            self.values.insert(name.clone(), Val::C(Rc::new(c)));
            return Ok(None);
        }
        let axis = self.batch_axes.axes.get(&name).copied().unwrap_or(0);
        let given = self.opts.input_shapes.iter().find(|(n, _)| *n == name);
        let rebatched = self.batch_axes.rebatched.contains(&name);
        // The batch axis carries the batch when it is symbolic or holds the file's batch
        // (an input whose first axis is some other fixed size keeps it: a MatMul's
        // [3, 4] right operand beside a [5, 3] batch of rows); a given shape stands, but for
        // its batch when it set the batch ([`given_batch`]).
        let batch_axis = match (given, dims.get(axis)) {
            (Some(_), _) if rebatched => Some(axis),
            (Some(_), _) | (None, None) => None,
            (None, Some(Err(_))) => Some(axis),
            (None, Some(Ok(v))) => (*v == self.file_batch).then_some(axis),
        };
        let dims: Vec<Result<usize, String>> = match given {
            Some((_, d)) => d.iter().map(|&v| Ok(v)).collect(),
            None => dims,
        };
        let mut bound = Vec::with_capacity(dims.len());
        for (k, d) in dims.iter().enumerate() {
            bound.push(match d {
                _ if Some(k) == batch_axis => self.batch,
                Ok(v) => *v,
                Err(p) => {
                    return Err(OnnxError::UnboundDim {
                        input: name,
                        axis: k,
                        param: p.clone(),
                        hint: "bind it with --input-shape (the input's whole shape; `tessera run` takes it from the array given), or export the model with it fixed; --batch-size binds only the batch".into(),
                    })
                }
            });
        }
        self.node = name.clone();
        self.op = "input".into();
        let core_name = self.fresh(&name);
        let dtype = self.dtype(elem);
        let id = self
            .g
            .input(&core_name, &bound, dtype)
            .map_err(|e| self.graph_err(e))?;
        self.values.insert(name.clone(), Val::T(id, elem));
        Ok(Some(ImportedInput {
            name,
            node: id,
            dims: bound,
            elem,
            batch_axis,
        }))
    }

    /// Converts every node in file order, in `stage`, noting each output's shape in
    /// `shapes`; the layers they made.
    fn nodes(&mut self, stage: usize, shapes: &mut HashMap<String, Vec<usize>>) -> R<Vec<Layer>> {
        let model = self.model;
        let graph = model.graph();
        let mut layers = Vec::with_capacity(graph.node.len());
        for (i, node) in graph.node.iter().enumerate() {
            self.layer = Some(i);
            self.node = node_name(node, i);
            self.op = node.op_type.clone().unwrap_or_default();
            let first = self.g.len();
            let outs = self.convert(node)?;
            for (name, v) in node.output.iter().zip(outs) {
                if name.is_empty() {
                    continue;
                }
                shapes.insert(name.clone(), self.dims(&v));
                self.values.insert(name.clone(), v);
            }
            layers.push(Layer {
                name: self.node.clone(),
                op: self.op.clone(),
                first,
                end: self.g.len(),
                stage,
            });
        }
        self.layer = None;
        Ok(layers)
    }

    /// The graph outputs, each a graph node (kept for the host in inference), noting their
    /// shapes in `shapes`.
    fn outputs(&mut self, shapes: &mut HashMap<String, Vec<usize>>) -> R<Vec<ImportedOutput>> {
        let model = self.model;
        let mut outputs = Vec::new();
        for o in &model.graph().output {
            let name = o.name.clone().unwrap_or_default();
            self.node = name.clone();
            self.op = "output".into();
            let v = self
                .values
                .get(&name)
                .cloned()
                .ok_or_else(|| OnnxError::MissingTensor {
                    node: "graph outputs".into(),
                    tensor: name.clone(),
                })?;
            let id = self.t(&v, &name)?;
            // Inference returns the outputs to the host. Training feeds them to the loss and
            // returns the loss, as the frameworks' training loops outfeed it alone (PopART's
            // anchors, TensorFlow's outfeed of the step's results): they are neither kept to
            // the end of the step nor streamed out.
            if !self.opts.training {
                self.g.mark_output(id).map_err(|e| self.graph_err(e))?;
            }
            let dims = self.dims(&v);
            shapes.insert(name.clone(), dims.clone());
            outputs.push(ImportedOutput {
                name,
                node: id,
                dims,
            });
        }
        Ok(outputs)
    }

    /// Before converting anything: every op type of the graph that no converter reads (or
    /// not in the version the opset gives) in one error, when there are several; one such op
    /// type is reported by its node as it is reached.
    fn check_ops(&self) -> R<()> {
        let graph = self.model.graph();
        let mut missing: Vec<super::UnsupportedOp> = Vec::new();
        for (i, node) in graph.node.iter().enumerate() {
            let op = node.op_type.as_deref().unwrap_or("");
            let domain = node.domain.as_deref().unwrap_or("");
            let (name, opset, version) = if domain.is_empty() || domain == "ai.onnx" {
                let version = match ops::converter_at(op, self.model.opset) {
                    Ok(_) => continue,
                    Err(ops::NotRead::Op) => None,
                    Err(ops::NotRead::Version(v)) => Some(v),
                };
                (op.to_string(), self.model.opset, version)
            } else {
                let opset = self
                    .model
                    .proto
                    .opset_import
                    .iter()
                    .find(|o| o.domain.as_deref() == Some(domain))
                    .and_then(|o| o.version)
                    .unwrap_or(0);
                (format!("{domain}.{op}"), opset, None)
            };
            match missing.iter_mut().find(|m| m.op == name) {
                Some(m) => m.nodes += 1,
                None => missing.push(super::UnsupportedOp {
                    op: name,
                    opset,
                    version,
                    nodes: 1,
                    first: node_name(node, i),
                }),
            }
        }
        if missing.len() > 1 {
            return Err(OnnxError::UnsupportedOps { ops: missing });
        }
        Ok(())
    }

    // ----- helpers -----

    fn bad(&self, message: impl Into<String>) -> OnnxError {
        OnnxError::BadNode {
            node: self.node.clone(),
            op: self.op.clone(),
            message: message.into(),
        }
    }

    fn unsupported(&self, detail: impl Into<String>) -> OnnxError {
        OnnxError::Unsupported {
            node: self.node.clone(),
            op: self.op.clone(),
            opset: self.model.opset,
            detail: detail.into(),
        }
    }

    fn graph_err(&self, e: GraphError) -> OnnxError {
        OnnxError::Graph {
            node: self.node.clone(),
            op: self.op.clone(),
            source: Box::new(e),
        }
    }

    /// A graph node name from `base` that is unique and short enough.
    fn fresh(&mut self, base: &str) -> String {
        fresh(&mut self.used, base)
    }

    /// The graph element type of an ONNX element type.
    fn dtype(&self, e: Elem) -> DType {
        match e {
            Elem::F32 | Elem::F16 | Elem::Bf16 | Elem::F64 => self.opts.dtype,
            Elem::I64 | Elem::U64 | Elem::I32 | Elem::U32 | Elem::I16 | Elem::U16 | Elem::I8 => {
                DType::I32
            }
            Elem::U8 | Elem::Bool => DType::U8,
        }
    }

    fn dims(&self, v: &Val) -> Vec<usize> {
        match v {
            Val::T(id, _) => self
                .g
                .node(*id)
                .shape()
                .dims()
                .iter()
                .map(|&d| d as usize)
                .collect(),
            Val::C(c) => c.dims.clone(),
            Val::W(i) => self.weights[*i].dims.clone(),
        }
    }

    fn elem(&self, v: &Val) -> Elem {
        match v {
            Val::T(_, e) => *e,
            Val::C(c) => c.elem,
            Val::W(_) => Elem::F32,
        }
    }

    /// A tensor of the file (initializer or `Constant`) as a value: a weight when it is a
    /// float tensor of more than one element (trained when `trainable`), else a constant.
    fn tensor_value(&mut self, t: &TensorProto, name: &str, trainable: bool) -> R<Val> {
        let code = t.data_type.unwrap_or(0);
        let elem = Elem::from_code(code).ok_or_else(|| OnnxError::BadNode {
            node: name.to_string(),
            op: self.op.clone(),
            message: format!(
                "element type {} is not one the importer reads",
                consts::code_name(code)
            ),
        })?;
        let mut dims = Vec::with_capacity(t.dims.len());
        for &d in &t.dims {
            dims.push(usize::try_from(d).map_err(|_| OnnxError::BadNode {
                node: name.to_string(),
                op: self.op.clone(),
                message: format!("dimension {d} is negative"),
            })?);
        }
        let count: usize = dims.iter().product();
        let values = match decode(t, elem, count) {
            Ok(v) => Ok(v),
            Err(Some(m)) => Err(m),
            Err(None) => {
                return Err(OnnxError::BadNode {
                    node: name.to_string(),
                    op: self.op.clone(),
                    message: format!(
                        "the tensor's data does not hold {count} {} values",
                        elem.name()
                    ),
                })
            }
        };
        if elem.is_float() && count > 1 || values.is_err() {
            let init = if dims.len() >= 2 {
                Init::GlorotUniform
            } else {
                Init::Zeros
            };
            self.weights.push(Weight {
                name: name.to_string(),
                dims,
                values: values.map(Arc::new),
                trainable: trainable && elem.is_float(),
                init,
            });
            return Ok(Val::W(self.weights.len() - 1));
        }
        let data = values.unwrap_or_default();
        Ok(Val::C(Rc::new(Const::new(dims, elem, data, true))))
    }

    /// Input `k` of `node`, or `None` when absent or empty.
    fn opt(&self, node: &NodeProto, k: usize) -> R<Option<Val>> {
        match node.input.get(k) {
            None => Ok(None),
            Some(s) if s.is_empty() => Ok(None),
            Some(s) => {
                self.values
                    .get(s)
                    .cloned()
                    .map(Some)
                    .ok_or_else(|| OnnxError::MissingTensor {
                        node: self.node.clone(),
                        tensor: s.clone(),
                    })
            }
        }
    }

    fn req(&self, node: &NodeProto, k: usize) -> R<Val> {
        self.opt(node, k)?
            .ok_or_else(|| self.bad(format!("input {k} is required")))
    }

    /// A constant input (shape, axes, pads ...).
    fn konst(&self, node: &NodeProto, k: usize, what: &str) -> R<Option<Rc<Const>>> {
        match self.opt(node, k)? {
            None => Ok(None),
            Some(Val::C(c)) => Ok(Some(c)),
            Some(Val::W(i)) if self.weights[i].values.is_err() => {
                let missing = self.weights[i].values.as_ref().err().cloned();
                Err(self.bad(format!(
                    "input {k} ({what}) must be known at import time, but `{}` has no values: {}",
                    self.weights[i].name,
                    missing.map(|m| m.to_string()).unwrap_or_default()
                )))
            }
            // A float initializer of several elements is a weight, but one read as an
            // attribute (Resize's scales, say) is its values.
            Some(Val::W(i)) => {
                let w = &self.weights[i];
                let values = w.values.as_ref().map(|v| v.to_vec()).unwrap_or_default();
                Ok(Some(Rc::new(Const::new(
                    w.dims.clone(),
                    Elem::F32,
                    values,
                    true,
                ))))
            }
            Some(_) => Err(self.unsupported(format!(
                "input {k} ({what}) must be known at import time; here it is computed at run time"
            ))),
        }
    }

    fn attr_i(&self, node: &NodeProto, name: &str, default: i64) -> i64 {
        attr(node, name).and_then(|a| a.i).unwrap_or(default)
    }

    fn attr_f(&self, node: &NodeProto, name: &str, default: f32) -> f32 {
        attr(node, name).and_then(|a| a.f).unwrap_or(default)
    }

    fn attr_ints(&self, node: &NodeProto, name: &str) -> Option<Vec<i64>> {
        attr(node, name).map(|a| a.ints.clone())
    }

    fn attr_s(&self, node: &NodeProto, name: &str) -> Option<String> {
        attr(node, name)
            .and_then(|a| a.s.as_ref())
            .map(|s| String::from_utf8_lossy(s).into_owned())
    }

    /// Axis `a` (negative from the end) of a rank-`r` tensor.
    fn axis(&self, a: i64, r: usize) -> R<usize> {
        let ai = if a < 0 { a + r as i64 } else { a };
        if ai < 0 || ai >= r.max(1) as i64 {
            return Err(self.bad(format!("axis {a} is out of range for rank {r}")));
        }
        Ok(ai as usize)
    }

    /// The graph node of a value, materialising constants and placing weights in the
    /// current stage. `name` is the ONNX tensor's name.
    fn t(&mut self, v: &Val, name: &str) -> R<NodeId> {
        match v {
            Val::T(id, _) => Ok(*id),
            Val::W(i) => self.place(*i),
            Val::C(c) => {
                if c.light && c.elem.is_float() && c.len() > 1 {
                    self.weights.push(Weight {
                        name: name.to_string(),
                        dims: c.dims.clone(),
                        values: Err(Missing::Light),
                        trainable: true,
                        init: if c.dims.len() >= 2 {
                            Init::GlorotUniform
                        } else {
                            Init::Zeros
                        },
                    });
                    let i = self.weights.len() - 1;
                    return self.place(i);
                }
                let dtype = self.dtype(c.elem);
                let core = self.fresh(name);
                if let Some(value) = c.uniform().filter(|_| c.len() > 0) {
                    return self
                        .g
                        .constant(&core, &c.dims, dtype, value as f32)
                        .map_err(|e| self.graph_err(e));
                }
                let id = self
                    .g
                    .state(&core, &c.dims, dtype, Init::Zeros)
                    .map_err(|e| self.graph_err(e))?;
                self.state.push(StateValue {
                    node: id,
                    tensor: name.to_string(),
                    values: Ok(Arc::new(c.data.clone())),
                });
                Ok(id)
            }
        }
    }

    /// Input `k` as a graph node.
    fn ti(&mut self, node: &NodeProto, k: usize) -> R<NodeId> {
        let v = self.req(node, k)?;
        let name = node.input[k].clone();
        self.t(&v, &name)
    }

    /// Weight `i` as a variable, placed where it is first read. Every read is recorded:
    /// when pipeline stages are placed, a weight read in several stages is held on each
    /// ([`staging`]).
    fn place(&mut self, i: usize) -> R<NodeId> {
        self.uses.push(staging::WeightUse {
            weight: i,
            at: self.g.len(),
            layer: self.layer,
        });
        if let Some(&id) = self.placed.get(&i) {
            return Ok(id);
        }
        let w = self.weights[i].clone();
        let core = self.fresh(&w.name);
        let dtype = self.opts.dtype;
        let id = if w.trainable {
            self.g.variable(&core, &w.dims, dtype, w.init)
        } else {
            self.g.state(&core, &w.dims, dtype, w.init)
        }
        .map_err(|e| self.graph_err(e))?;
        self.placed.insert(i, id);
        self.state.push(StateValue {
            node: id,
            tensor: w.name,
            values: w.values,
        });
        Ok(id)
    }

    /// Whether a node or a graph output reads the tensor `name`.
    fn is_read(&self, name: &str) -> bool {
        let graph = self.model.graph();
        graph.node.iter().any(|n| n.input.iter().any(|i| i == name))
            || graph.output.iter().any(|o| o.name.as_deref() == Some(name))
    }

    /// What the graph nodes of `node` are named after: its first output's name, else the
    /// node's own.
    fn output_base(&self, node: &NodeProto) -> String {
        node.output
            .first()
            .filter(|s| !s.is_empty())
            .cloned()
            .unwrap_or_else(|| self.node.clone())
    }

    /// A new graph node name for output `k` of the current node.
    fn out_name(&mut self, node: &NodeProto, suffix: &str) -> String {
        let base = self.output_base(node);
        if suffix.is_empty() {
            self.fresh(&base)
        } else {
            self.fresh(&format!("{base}/{suffix}"))
        }
    }

    fn check<T>(&self, r: Result<T, GraphError>) -> R<T> {
        r.map_err(|e| self.graph_err(e))
    }

    // ----- the ops -----

    /// Converts one node: folded when its inputs are constants, else by its op's converter
    /// ([`ops::REGISTRY`]), which must read the op's version at the model's opset.
    fn convert(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let domain = node.domain.as_deref().unwrap_or("");
        if !(domain.is_empty() || domain == "ai.onnx") {
            self.op = format!("{domain}.{}", self.op);
            return Err(self.unsupported(""));
        }
        let op = self.op.clone();
        // Constant inputs everywhere: fold.
        if let Some(v) = self.fold(node, &op)? {
            return Ok(v);
        }
        match ops::converter_at(&op, self.model.opset) {
            Ok(convert) => convert(self, node),
            Err(ops::NotRead::Op) => Err(self.unsupported("")),
            Err(ops::NotRead::Version(v)) => {
                let read: Vec<String> = ops::converter(&op)
                    .map(|c| c.versions.iter().map(u32::to_string).collect())
                    .unwrap_or_default();
                Err(self.unsupported(format!(
                    "version {v}; the importer reads versions {}",
                    read.join(", ")
                )))
            }
        }
    }

    /// A node of one run-time operand (input 0) whose output has its element type, made by
    /// `build` (graph, output name, operand).
    fn one_input(
        &mut self,
        node: &NodeProto,
        build: impl FnOnce(&mut Graph<Heap>, &str, NodeId) -> Result<NodeId, GraphError>,
    ) -> R<Vec<Val>> {
        let e = self.elem(&self.req(node, 0)?);
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(self, build(self.g, &name, x))?;
        Ok(vec![Val::T(id, e)])
    }

    /// Two operands broadcast together: constants take the other operand's element type.
    fn pair(&mut self, node: &NodeProto) -> R<(NodeId, NodeId)> {
        self.pair_at(node, 0, 1)
    }

    fn pair_at(&mut self, node: &NodeProto, i: usize, j: usize) -> R<(NodeId, NodeId)> {
        let (va, vb) = (self.req(node, i)?, self.req(node, j)?);
        let (na, nb) = (node.input[i].clone(), node.input[j].clone());
        // A constant's element type follows its partner's (int64 0 against float x).
        let (va, vb) = (self.retype(&va, &vb), self.retype(&vb, &va));
        Ok((self.t(&va, &na)?, self.t(&vb, &nb)?))
    }

    /// `v` with `other`'s element type when `v` is a constant and `other` is not.
    fn retype(&self, v: &Val, other: &Val) -> Val {
        match (v, other) {
            (Val::C(c), Val::T(..) | Val::W(_)) => {
                let e = self.elem(other);
                if self.dtype(c.elem) == self.dtype(e) {
                    v.clone()
                } else {
                    let mut c2 = (**c).clone();
                    c2.elem = e;
                    c2.data = c2.data.iter().map(|&x| cast_value(x, e)).collect();
                    Val::C(Rc::new(c2))
                }
            }
            _ => v.clone(),
        }
    }

    // ----- folding -----
}

#[cfg(test)]
mod tests {
    use super::super::proto::{GraphProto, NodeProto};
    use super::testing::{float_info, model};
    use super::*;

    /// An input dimension written as `-1` (as some exporters write a dynamic axis; onnx's
    /// checker and onnxruntime take it) is a symbol: unbound, the error says how to bind it;
    /// bound by the batch size, the model imports.
    #[test]
    fn a_dimension_of_minus_one_is_a_symbol() {
        let model = model(
            "m",
            GraphProto {
                node: vec![NodeProto {
                    op_type: Some("Relu".into()),
                    input: vec!["x".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                input: vec![float_info("x", &[-1, 16])],
                output: vec![float_info("y", &[-1, 16])],
                ..Default::default()
            },
        );
        let inference = |batch_size| ImportOptions {
            batch_size,
            training: false,
            ..ImportOptions::default()
        };
        let err = import(&model, &mut Graph::new(), &inference(None))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("dimension 0 is symbolic (`-1`)") && err.contains("--batch-size"),
            "{err}"
        );
        let imported = import(&model, &mut Graph::new(), &inference(Some(3))).unwrap();
        assert_eq!(imported.batch, 3);
    }
}
