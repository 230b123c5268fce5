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

/// The ONNX ops the importer reads (default domain).
pub const SUPPORTED_OPS: &[&str] = &[
    "Add",
    "And",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "Div",
    "Dropout",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "Identity",
    "LayerNormalization",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "LSTM",
    "MatMul",
    "Max",
    "MaxPool",
    "Min",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "Pow",
    "Range",
    "Reciprocal",
    "ReduceMax",
    "ReduceMean",
    "ReduceSum",
    "Relu",
    "Reshape",
    "Shape",
    "Sigmoid",
    "Size",
    "Slice",
    "Softmax",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "Transpose",
    "Unsqueeze",
    "Where",
];

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
    let graph = model.graph();
    super::validate_graph(graph)?;
    // A negative size is neither a size nor a symbol (onnx.checker refuses it too).
    for i in &graph.input {
        use super::proto::tensor_shape_proto::dimension::Value as D;
        use super::proto::type_proto::Value as T;
        let Some(T::TensorType(t)) = i.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
            continue;
        };
        for (axis, d) in t.shape.iter().flat_map(|s| s.dim.iter()).enumerate() {
            if let Some(D::DimValue(v)) = d.value {
                if v < 0 {
                    return Err(OnnxError::BadNode {
                        node: i.name.clone().unwrap_or_default(),
                        op: "input".into(),
                        message: format!(
                            "dimension {axis} is {v}; a dimension is a size (0 or more) or a symbol"
                        ),
                    });
                }
            }
        }
    }
    let batch_axes = batch_axes(model);
    let file_batch = file_batch(model, &batch_axes)?;
    let batch = match (opts.batch_size, file_batch) {
        (Some(b), _) => b,
        (None, Some(b)) => b,
        (None, None) => {
            let (input, axis, param) =
                symbolic_batch(model, &batch_axes).unwrap_or_else(|| ("?".into(), 0, "?".into()));
            return Err(OnnxError::UnboundDim {
                input,
                axis,
                param,
                hint: "bind the batch with --batch-size".into(),
            });
        }
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
            let first = Importer::new(model, &mut scratch, opts, fb, fb, None, &batch_axes)?
                .run(&vec![0; graph.node.len()])?;
            Some(first.shapes)
        }
        _ => None,
    };
    let stages = stage_of(model, &opts.stages)?;
    let device_mapping = match opts.stages {
        Stages::Attributes => ipu_mapping(model, &stages),
        _ => None,
    };
    let fb = file_batch.unwrap_or(batch);
    let mut imported =
        Importer::new(model, g, opts, batch, fb, original.as_ref(), &batch_axes)?.run(&stages)?;
    imported.device_mapping = device_mapping;
    Ok(imported)
}

/// The batch axis of each graph input: 0, or 1 for a sequence-first input of an LSTM
/// (ONNX's `layout` 0 is `[seq, batch, input]`).
fn batch_axes(model: &OnnxModel) -> HashMap<String, usize> {
    let graph = model.graph();
    graph
        .input
        .iter()
        .filter_map(|i| i.name.clone())
        .map(|name| {
            let seq_first = graph.node.iter().any(|n| {
                n.op_type.as_deref() == Some("LSTM")
                    && n.input.first() == Some(&name)
                    && attr(n, "layout").and_then(|a| a.i).unwrap_or(0) == 0
            });
            let axis = usize::from(seq_first);
            (name, axis)
        })
        .collect()
}

/// Real graph inputs (ONNX before IR 4 lists initializers among inputs too).
fn real_inputs(model: &OnnxModel) -> Vec<&super::proto::ValueInfoProto> {
    let graph = model.graph();
    let inits: HashSet<&str> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    graph
        .input
        .iter()
        .filter(|i| !inits.contains(i.name.as_deref().unwrap_or("")))
        .collect()
}

/// The dims of a value info: `Ok(size)` or `Err(symbol)` per axis.
fn info_dims(v: &super::proto::ValueInfoProto) -> Option<Vec<Result<usize, String>>> {
    use super::proto::tensor_shape_proto::dimension::Value as D;
    use super::proto::type_proto::Value as T;
    let Some(T::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
        return None;
    };
    let shape = t.shape.as_ref()?;
    Some(
        shape
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(D::DimValue(v)) if *v >= 0 => Ok(*v as usize),
                Some(D::DimParam(p)) => Err(p.clone()),
                _ => Err("?".into()),
            })
            .collect(),
    )
}

/// The batch size the file was exported with (`None` when symbolic).
fn file_batch(model: &OnnxModel, axes: &HashMap<String, usize>) -> R<Option<usize>> {
    for i in real_inputs(model) {
        let name = i.name.clone().unwrap_or_default();
        let dims = info_dims(i).ok_or_else(|| OnnxError::UnboundDim {
            input: name.clone(),
            axis: 0,
            param: "?".into(),
            hint: "the input has no tensor shape in the file".into(),
        })?;
        let axis = axes.get(&name).copied().unwrap_or(0);
        if let Some(Ok(b)) = dims.get(axis) {
            return Ok(Some(*b));
        }
    }
    Ok(None)
}

/// The first input whose batch axis is symbolic.
fn symbolic_batch(
    model: &OnnxModel,
    axes: &HashMap<String, usize>,
) -> Option<(String, usize, String)> {
    real_inputs(model).into_iter().find_map(|i| {
        let name = i.name.clone().unwrap_or_default();
        let axis = axes.get(&name).copied().unwrap_or(0);
        match info_dims(i)?.get(axis)? {
            Err(p) => Some((name, axis, p.clone())),
            Ok(_) => None,
        }
    })
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

/// The tensors nodes read as weights: convolution and product weights and biases,
/// normalisation parameters, recurrent weights and embedding tables.
fn weight_slots(graph: &super::proto::GraphProto) -> HashSet<String> {
    let mut out = HashSet::new();
    for n in &graph.node {
        let slots: &[usize] = match n.op_type.as_deref().unwrap_or("") {
            "Conv" | "Gemm" | "LayerNormalization" => &[1, 2],
            "MatMul" => &[1],
            "BatchNormalization" => &[1, 2, 3, 4],
            "LSTM" => &[1, 2, 3],
            "Gather" => &[0],
            _ => &[],
        };
        for &k in slots {
            if let Some(t) = n.input.get(k).filter(|t| !t.is_empty()) {
                out.insert(t.clone());
            }
        }
    }
    out
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
    batch_axes: &'a HashMap<String, usize>,
    values: HashMap<String, Val>,
    weights: Vec<Weight>,
    placed: HashMap<(usize, usize), NodeId>,
    state: Vec<StateValue>,
    embeddings: Vec<Embedding>,
    used: HashSet<String>,
    stage: usize,
    /// Tensors that nodes read as weights (a light model's ConstantOfShape there is one).
    weight_slots: HashSet<String>,
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
        batch_axes: &'a HashMap<String, usize>,
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
            state: Vec::new(),
            embeddings: Vec::new(),
            used: HashSet::new(),
            stage: 0,
            weight_slots: weight_slots(graph),
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

    fn run(mut self, stages: &[usize]) -> R<Imported> {
        let model = self.model;
        let graph = model.graph();
        let mut inputs = Vec::new();
        for i in real_inputs(model) {
            let name = i.name.clone().unwrap_or_default();
            let dims = info_dims(i).unwrap_or_default();
            let elem = match i.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(super::proto::type_proto::Value::TensorType(t)) => {
                    Elem::from_code(t.elem_type.unwrap_or(0))
                }
                _ => None,
            };
            let Some(elem) = elem else {
                return Err(OnnxError::BadNode {
                    node: name,
                    op: "input".into(),
                    message: "the input is not a tensor of a type the importer reads (float, float16, int64, int32, bool, uint8)".into(),
                });
            };
            let axis = self.batch_axes.get(&name).copied().unwrap_or(0);
            let mut bound = Vec::with_capacity(dims.len());
            for (k, d) in dims.iter().enumerate() {
                bound.push(match d {
                    _ if k == axis => self.batch,
                    Ok(v) => *v,
                    Err(p) => {
                        return Err(OnnxError::UnboundDim {
                            input: name,
                            axis: k,
                            param: p.clone(),
                            hint: "only the batch dimension is bound (by `estimate --batch-size`, or by the array `run` is given); export the model with this dimension fixed".into(),
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
            inputs.push(ImportedInput {
                name,
                node: id,
                dims: bound,
                elem,
                batch_axis: axis,
            });
        }
        let mut layers = Vec::with_capacity(graph.node.len());
        let mut shapes: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, node) in graph.node.iter().enumerate() {
            self.stage = stages[i];
            self.g
                .set_stage(self.stage)
                .map_err(|e| self.graph_err(e))?;
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
                stage: self.stage,
            });
        }
        for i in &inputs {
            shapes.insert(i.name.clone(), i.dims.clone());
        }
        for t in &graph.initializer {
            let name = t.name.clone().unwrap_or_default();
            if let Some(v) = self.values.get(&name) {
                shapes.entry(name).or_insert_with(|| self.dims(v));
            }
        }
        let mut outputs = Vec::new();
        for o in &graph.output {
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
        let count = stages.iter().copied().max().map_or(1, |s| s + 1);
        Ok(Imported {
            inputs,
            outputs,
            layers,
            shapes,
            state: self.state,
            embeddings: self.embeddings,
            batch: self.batch,
            file_batch: self.file_batch,
            stages: count,
            device_mapping: None,
        })
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
        if stem.len() != base.len() || self.used.contains(&stem) {
            let root = stem.clone();
            let mut k = 1;
            loop {
                stem = format!("{root}~{k}");
                if !self.used.contains(&stem) {
                    break;
                }
                k += 1;
            }
        }
        self.used.insert(stem.clone());
        stem
    }

    /// The graph element type of an ONNX element type.
    fn dtype(&self, e: Elem) -> DType {
        match e {
            Elem::F32 | Elem::F16 | Elem::Bf16 | Elem::F64 => self.opts.dtype,
            Elem::I64 | Elem::I32 | Elem::I8 => DType::I32,
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
    /// float tensor of more than one element (`trainable` initializers), else a constant.
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

    /// Weight `i` as a variable of the current stage (one per stage: a weight used on two
    /// IPUs is held on each, as tied weights are).
    fn place(&mut self, i: usize) -> R<NodeId> {
        if let Some(&id) = self.placed.get(&(i, self.stage)) {
            return Ok(id);
        }
        let w = self.weights[i].clone();
        let base = if self.placed.keys().any(|&(j, _)| j == i) {
            format!("{}@stage{}", w.name, self.stage)
        } else {
            w.name.clone()
        };
        let core = self.fresh(&base);
        let dtype = self.opts.dtype;
        let id = if w.trainable {
            self.g.variable(&core, &w.dims, dtype, w.init)
        } else {
            self.g.state(&core, &w.dims, dtype, w.init)
        }
        .map_err(|e| self.graph_err(e))?;
        self.placed.insert((i, self.stage), id);
        self.state.push(StateValue {
            node: id,
            tensor: w.name,
            values: w.values,
        });
        Ok(id)
    }

    /// A new graph node name for output `k` of the current node.
    fn out_name(&mut self, node: &NodeProto, suffix: &str) -> String {
        let base = node
            .output
            .first()
            .filter(|s| !s.is_empty())
            .cloned()
            .unwrap_or_else(|| self.node.clone());
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
        let one = |v: Val| Ok(vec![v]);
        match op.as_str() {
            "Identity" | "Dropout" => {
                if op == "Dropout" {
                    if let Some(Val::C(c)) = self.opt(node, 2)? {
                        if c.scalar().unwrap_or(0.0) != 0.0 {
                            return Err(self.unsupported("training_mode = true"));
                        }
                    } else if self.opt(node, 2)?.is_some() {
                        return Err(self.unsupported("a run-time training_mode"));
                    }
                    if node.output.get(1).is_some_and(|s| !s.is_empty()) {
                        return Err(self.unsupported("the mask output"));
                    }
                }
                one(self.req(node, 0)?)
            }
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Sum" => self.arith(node),
            "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" => {
                let f = match op.as_str() {
                    "Equal" => BinaryFn::Equal,
                    "Less" => BinaryFn::Less,
                    "LessOrEqual" => BinaryFn::LessOrEqual,
                    "Greater" => BinaryFn::Greater,
                    "GreaterOrEqual" => BinaryFn::GreaterOrEqual,
                    "And" => BinaryFn::And,
                    _ => BinaryFn::Or,
                };
                let (a, b) = self.pair(node)?;
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.binary(&name, a, b, f))?;
                one(Val::T(id, Elem::Bool))
            }
            "Not" => {
                let x = self.ti(node, 0)?;
                let zero = self.out_name(node, "zero");
                let z = chk!(self, self.g.constant(&zero, &[], DType::U8, 0.0))?;
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.binary(&name, x, z, BinaryFn::Equal))?;
                one(Val::T(id, Elem::Bool))
            }
            "Where" => {
                let c = self.ti(node, 0)?;
                let (a, b) = self.pair_at(node, 1, 2)?;
                let e = self.elem(&self.req(node, 1)?);
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.select(&name, c, a, b))?;
                one(Val::T(id, e))
            }
            "Relu" | "Sigmoid" | "Tanh" | "Exp" | "Log" | "Sqrt" | "Erf" | "Neg" | "Gelu"
            | "Clip" => {
                let f = match op.as_str() {
                    "Relu" => UnaryFn::Relu,
                    "Sigmoid" => UnaryFn::Sigmoid,
                    "Tanh" => UnaryFn::Tanh,
                    "Exp" => UnaryFn::Exp,
                    "Log" => UnaryFn::Log,
                    "Sqrt" => UnaryFn::Sqrt,
                    "Erf" => UnaryFn::Erf,
                    "Neg" => UnaryFn::Neg,
                    "Gelu" => match self.attr_s(node, "approximate").as_deref() {
                        None | Some("none") => UnaryFn::Gelu(GeluForm::Erf),
                        Some("tanh") => UnaryFn::Gelu(GeluForm::Tanh),
                        Some(other) => {
                            return Err(self.unsupported(format!("approximate = {other}")))
                        }
                    },
                    _ => {
                        let (min, max) = if self.model.opset >= 11 {
                            let lo = self.konst(node, 1, "min")?;
                            let hi = self.konst(node, 2, "max")?;
                            (
                                lo.and_then(|c| c.scalar()).unwrap_or(f64::NEG_INFINITY),
                                hi.and_then(|c| c.scalar()).unwrap_or(f64::INFINITY),
                            )
                        } else {
                            (
                                f64::from(self.attr_f(node, "min", f32::NEG_INFINITY)),
                                f64::from(self.attr_f(node, "max", f32::INFINITY)),
                            )
                        };
                        UnaryFn::Clip {
                            min: min as f32,
                            max: max as f32,
                        }
                    }
                };
                self.one_input(node, |g, name, x| g.unary(name, x, f))
            }
            "Reciprocal" => {
                let x = self.ti(node, 0)?;
                let e = self.elem(&self.req(node, 0)?);
                let dtype = self.g.node(x).dtype();
                let oname = self.out_name(node, "one");
                let o = chk!(self, self.g.constant(&oname, &[], dtype, 1.0))?;
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.binary(&name, o, x, BinaryFn::Div))?;
                one(Val::T(id, e))
            }
            "Cast" => {
                let to = Elem::from_code(self.attr_i(node, "to", 1) as i32)
                    .ok_or_else(|| self.unsupported("the target element type"))?;
                let v = self.req(node, 0)?;
                let from = self.elem(&v);
                let x = self.ti(node, 0)?;
                if self.dtype(from) == self.dtype(to) {
                    return one(Val::T(x, to));
                }
                let name = self.out_name(node, "");
                let dtype = self.dtype(to);
                let id = chk!(self, self.g.cast(&name, x, dtype))?;
                one(Val::T(id, to))
            }
            "MatMul" => {
                let (a, b) = (self.ti(node, 0)?, self.ti(node, 1)?);
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.matmul(&name, a, b))?;
                one(Val::T(id, Elem::F32))
            }
            "Gemm" => self.gemm(node),
            "Conv" => self.conv(node),
            "MaxPool" | "AveragePool" => self.pool(node),
            "GlobalAveragePool" => {
                let x = self.ti(node, 0)?;
                let name = self.out_name(node, "");
                let id = chk!(
                    self,
                    self.g.global_average_pool(&name, x, DataLayout::Nchw, true)
                )?;
                one(Val::T(id, Elem::F32))
            }
            "GlobalMaxPool" => {
                let x = self.ti(node, 0)?;
                let name = self.out_name(node, "");
                let id = chk!(
                    self,
                    self.g.reduce(&name, x, &[2, 3], true, ReduceKind::Max)
                )?;
                one(Val::T(id, Elem::F32))
            }
            "BatchNormalization" => self.batch_norm(node),
            "LayerNormalization" => self.layer_norm(node),
            "Softmax" | "LogSoftmax" => self.softmax(node),
            "ReduceMean" | "ReduceSum" | "ReduceMax" => self.reduce(node),
            "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
                let dims = self.reshaped_dims(node, &self.req(node, 0)?)?;
                self.one_input(node, |g, name, x| g.reshape(name, x, &dims))
            }
            "Transpose" => {
                let perm = self.perm(node, self.dims(&self.req(node, 0)?).len())?;
                self.one_input(node, |g, name, x| g.transpose(name, x, &perm))
            }
            "Concat" => self.concat(node),
            "Split" => self.split(node),
            "Slice" => self.slice(node),
            "Gather" => self.gather(node),
            "GatherElements" | "GatherND" => self.gather_flat(node),
            "Expand" => {
                let target = self.expand_dims(node, &self.req(node, 0)?)?;
                self.one_input(node, |g, name, x| g.broadcast_to(name, x, &target))
            }
            "Shape" => {
                let v = self.req(node, 0)?;
                let d: Vec<i64> = self.dims(&v).iter().map(|&x| x as i64).collect();
                let r = d.len() as i64;
                let clampi = |a: i64| (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
                let start = clampi(self.attr_i(node, "start", 0));
                let end = clampi(self.attr_i(node, "end", r));
                let part = if start < end { &d[start..end] } else { &[][..] };
                one(Val::C(Rc::new(Const::ints(part, false))))
            }
            "Size" => {
                let v = self.req(node, 0)?;
                let n: usize = self.dims(&v).iter().product();
                one(Val::C(Rc::new(Const::new(
                    vec![],
                    Elem::I64,
                    vec![n as f64],
                    false,
                ))))
            }
            "Constant" => self.constant(node).map(|v| vec![v]),
            "ConstantOfShape" => self.constant_of_shape(node).map(|v| vec![v]),
            "LSTM" => self.lstm(node),
            "Range" => Err(self.unsupported("inputs computed at run time")),
            _ => Err(self.unsupported("")),
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

    fn arith(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let op = self.op.clone();
        let f = match op.as_str() {
            "Add" | "Sum" => BinaryFn::Add,
            "Sub" => BinaryFn::Sub,
            "Mul" => BinaryFn::Mul,
            "Div" => BinaryFn::Div,
            "Pow" => BinaryFn::Pow,
            "Max" => BinaryFn::Max,
            _ => BinaryFn::Min,
        };
        let n = node.input.len();
        if n == 1 {
            return Ok(vec![self.req(node, 0)?]);
        }
        if n > 2 && !matches!(op.as_str(), "Sum" | "Max" | "Min") {
            return Err(self.bad(format!("{n} inputs; the op takes 2")));
        }
        let first = self.req(node, 0)?;
        let e = match (&first, self.req(node, 1)?) {
            (Val::C(_), other) => self.elem(&other),
            (v, _) => self.elem(v),
        };
        // x * c and x / c for a scalar c: a scale, as Poplar's scaled ops.
        if n == 2 && matches!(f, BinaryFn::Mul | BinaryFn::Div) && e.is_float() {
            let b = self.req(node, 1)?;
            let a = self.req(node, 0)?;
            let scalar = |v: &Val| match v {
                Val::C(c) => c.scalar(),
                _ => None,
            };
            let pick = match (scalar(&a), scalar(&b)) {
                (_, Some(c)) => Some((0, if f == BinaryFn::Mul { c } else { 1.0 / c })),
                (Some(c), None) if f == BinaryFn::Mul => Some((1, c)),
                _ => None,
            };
            if let Some((k, factor)) = pick {
                let x = self.ti(node, k)?;
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.scale(&name, x, factor as f32))?;
                return Ok(vec![Val::T(id, e)]);
            }
        }
        let (mut acc, b) = self.pair_at(node, 0, 1)?;
        for k in 1..n {
            let bk = if k == 1 {
                b
            } else {
                let v = self.req(node, k)?;
                let name = node.input[k].clone();
                self.t(&v, &name)?
            };
            let suffix = if k + 1 == n {
                String::new()
            } else {
                format!("partial{k}")
            };
            let name = self.out_name(node, &suffix);
            acc = chk!(self, self.g.binary(&name, acc, bk, f))?;
        }
        Ok(vec![Val::T(acc, e)])
    }

    fn gemm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let (ta, tb) = (
            self.attr_i(node, "transA", 0) != 0,
            self.attr_i(node, "transB", 0) != 0,
        );
        let (alpha, beta) = (
            self.attr_f(node, "alpha", 1.0),
            self.attr_f(node, "beta", 1.0),
        );
        let (a, b) = (self.ti(node, 0)?, self.ti(node, 1)?);
        let has_c = self.opt(node, 2)?.is_some();
        let product = if alpha != 1.0 || has_c {
            self.out_name(node, "product")
        } else {
            self.out_name(node, "")
        };
        let mut y = chk!(self, self.g.matmul_t(&product, a, b, ta, tb))?;
        if alpha != 1.0 {
            let name = if has_c {
                self.out_name(node, "alpha")
            } else {
                self.out_name(node, "")
            };
            y = chk!(self, self.g.scale(&name, y, alpha))?;
        }
        if has_c {
            let mut c = self.ti(node, 2)?;
            if beta != 1.0 {
                let name = self.out_name(node, "beta");
                c = chk!(self, self.g.scale(&name, c, beta))?;
            }
            let name = self.out_name(node, "");
            y = chk!(self, self.g.add(&name, y, c))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }

    /// Explicit `[top, left, bottom, right]` pads of a 2-D window op.
    fn pads2d(
        &self,
        node: &NodeProto,
        size: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
    ) -> R<[u32; 4]> {
        let auto = self
            .attr_s(node, "auto_pad")
            .unwrap_or_else(|| "NOTSET".into());
        match auto.as_str() {
            "NOTSET" => {
                let p = self.attr_ints(node, "pads").unwrap_or_else(|| vec![0; 4]);
                if p.len() != 4 || p.iter().any(|&x| x < 0) {
                    return Err(self.bad(format!("pads {p:?}: four non-negative values expected")));
                }
                Ok([p[0] as u32, p[1] as u32, p[2] as u32, p[3] as u32])
            }
            "VALID" => Ok([0; 4]),
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut p = [0u32; 4];
                for a in 0..2 {
                    let out = size[a].div_ceil(stride[a].max(1));
                    let span = (kernel[a].max(1) - 1) * dilation[a] + 1;
                    let total =
                        ((out.max(1) - 1) * stride[a] + span).saturating_sub(size[a]) as u32;
                    let (small, large) = (total / 2, total - total / 2);
                    if auto == "SAME_UPPER" {
                        p[a] = small;
                        p[a + 2] = large;
                    } else {
                        p[a] = large;
                        p[a + 2] = small;
                    }
                }
                Ok(p)
            }
            other => Err(self.bad(format!("auto_pad {other} is not an ONNX value"))),
        }
    }

    fn pair2(&self, node: &NodeProto, name: &str) -> R<[usize; 2]> {
        match self.attr_ints(node, name) {
            None => Ok([1, 1]),
            Some(v) if v.len() == 2 && v.iter().all(|&x| x >= 1) => {
                Ok([v[0] as usize, v[1] as usize])
            }
            Some(v) => Err(self.unsupported(format!(
                "{name} {v:?} (2-D windows with positive values only)"
            ))),
        }
    }

    fn conv(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let wv = self.req(node, 1)?;
        let (sx, sw) = (self.dims(&xv), self.dims(&wv));
        if sx.len() != 4 || sw.len() != 4 {
            return Err(self.unsupported(format!(
                "a {}-D convolution (only 2-D: input [N, C, H, W])",
                sx.len().saturating_sub(2)
            )));
        }
        let stride = self.pair2(node, "strides")?;
        let dilation = self.pair2(node, "dilations")?;
        let groups = self.attr_i(node, "group", 1).max(1) as u32;
        let pads = self.pads2d(node, [sx[2], sx[3]], [sw[2], sw[3]], stride, dilation)?;
        let mut p = ConvParams::new(DataLayout::Nchw);
        p.stride = [stride[0] as u32, stride[1] as u32];
        p.dilation = [dilation[0] as u32, dilation[1] as u32];
        p.groups = groups;
        let (x, w) = (self.ti(node, 0)?, self.ti(node, 1)?);
        let has_b = self.opt(node, 2)?.is_some();
        let name = if has_b {
            self.out_name(node, "conv")
        } else {
            self.out_name(node, "")
        };
        let mut y = chk!(self, self.g.conv2d(&name, x, w, p, Padding::Explicit(pads)))?;
        if has_b {
            let b = self.ti(node, 2)?;
            let vname = self.out_name(node, "bias_view");
            let bv = chk!(self, self.g.reshape(&vname, b, &[sw[0], 1, 1]))?;
            let name = self.out_name(node, "");
            y = chk!(self, self.g.add(&name, y, bv))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }

    fn pool(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let sx = self.dims(&xv);
        if sx.len() != 4 {
            return Err(self.unsupported("only 2-D pooling (input [N, C, H, W])"));
        }
        if self.attr_i(node, "ceil_mode", 0) != 0 {
            return Err(self.unsupported("ceil_mode = 1"));
        }
        if self.pair2(node, "dilations")? != [1, 1] {
            return Err(self.unsupported("dilated pooling"));
        }
        if node.output.get(1).is_some_and(|s| !s.is_empty()) {
            return Err(self.unsupported("the Indices output"));
        }
        let kernel = match self.attr_ints(node, "kernel_shape") {
            Some(k) if k.len() == 2 && k.iter().all(|&v| v >= 1) => [k[0] as usize, k[1] as usize],
            k => return Err(self.bad(format!("kernel_shape {k:?}: two positive values expected"))),
        };
        let stride = self.pair2(node, "strides")?;
        let pads = self.pads2d(node, [sx[2], sx[3]], kernel, stride, [1, 1])?;
        let kind = if self.op == "MaxPool" {
            PoolKind::Max
        } else {
            PoolKind::Average {
                count_include_pad: self.attr_i(node, "count_include_pad", 0) != 0,
            }
        };
        let params = PoolParams::new(
            kind,
            DataLayout::Nchw,
            [kernel[0] as u32, kernel[1] as u32],
            [stride[0] as u32, stride[1] as u32],
        );
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(
            self,
            self.g.pool2d(&name, x, params, Padding::Explicit(pads))
        )?;
        Ok(vec![Val::T(id, Elem::F32)])
    }

    fn batch_norm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if node.output.iter().skip(1).any(|s| !s.is_empty()) {
            return Err(self.unsupported("the running mean and variance outputs"));
        }
        let x = self.ti(node, 0)?;
        let scale = self.ti(node, 1)?;
        let bias = self.ti(node, 2)?;
        // The running statistics are state, not trained.
        for k in [3, 4] {
            if let Val::W(i) = self.req(node, k)? {
                self.weights[i].trainable = false;
                if k == 4 {
                    self.weights[i].init = Init::Fill(1.0);
                }
            }
        }
        let mean = self.ti(node, 3)?;
        let var = self.ti(node, 4)?;
        let bn = BatchNorm {
            axis: 1,
            epsilon: self.attr_f(node, "epsilon", 1e-5),
            momentum: self.attr_f(node, "momentum", 0.9),
            training: self.opts.training,
        };
        let name = self.out_name(node, "");
        let id = chk!(
            self,
            self.g.batch_norm_with(
                &name,
                x,
                bn,
                BatchNormParams {
                    scale,
                    bias,
                    mean,
                    var,
                },
            )
        )?;
        Ok(vec![Val::T(id, Elem::F32)])
    }

    fn layer_norm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        if node.output.iter().skip(1).any(|s| !s.is_empty()) {
            return Err(self.unsupported("the Mean and InvStdDev outputs"));
        }
        let xv = self.req(node, 0)?;
        let r = self.dims(&xv).len();
        let axis = self.axis(self.attr_i(node, "axis", -1), r)?;
        let axes: Vec<isize> = (axis..r).map(|a| a as isize).collect();
        let eps = self.attr_f(node, "epsilon", 1e-5);
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "normalize");
        let xhat = chk!(self, self.g.normalize(&name, x, &axes, eps))?;
        let scale = self.ti(node, 1)?;
        let has_b = self.opt(node, 2)?.is_some();
        let name = if has_b {
            self.out_name(node, "scale")
        } else {
            self.out_name(node, "")
        };
        let mut y = chk!(self, self.g.mul(&name, xhat, scale))?;
        if has_b {
            let b = self.ti(node, 2)?;
            let name = self.out_name(node, "");
            y = chk!(self, self.g.add(&name, y, b))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }

    fn softmax(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let xv = self.req(node, 0)?;
        let d = self.dims(&xv);
        let r = d.len();
        let log = self.op == "LogSoftmax";
        let x = self.ti(node, 0)?;
        let mut y = if self.model.opset >= 13 {
            let axis = self.axis(self.attr_i(node, "axis", -1), r)?;
            let name = if log {
                self.out_name(node, "softmax")
            } else {
                self.out_name(node, "")
            };
            chk!(self, self.g.softmax_axis(&name, x, axis as isize))?
        } else {
            // Before opset 13 the input is coerced to 2-D at `axis`.
            let axis = self.axis(self.attr_i(node, "axis", 1), r)?;
            let rows: usize = d[..axis].iter().product();
            let cols: usize = d[axis..].iter().product();
            let name = self.out_name(node, "rows");
            let v = chk!(self, self.g.reshape(&name, x, &[rows, cols]))?;
            let name = self.out_name(node, "softmax2d");
            let s = chk!(self, self.g.softmax_axis(&name, v, 1))?;
            let name = if log {
                self.out_name(node, "softmax")
            } else {
                self.out_name(node, "")
            };
            chk!(self, self.g.reshape(&name, s, &d))?
        };
        if log {
            let name = self.out_name(node, "");
            y = chk!(self, self.g.unary(&name, y, UnaryFn::Log))?;
        }
        Ok(vec![Val::T(y, Elem::F32)])
    }

    /// Reduction axes: the attribute (older opsets) or the second input.
    fn reduce_axes(&self, node: &NodeProto, input_since: i64) -> R<Option<Vec<i64>>> {
        if self.model.opset >= input_since {
            Ok(self.konst(node, 1, "axes")?.map(|c| c.as_ints()))
        } else {
            Ok(self.attr_ints(node, "axes"))
        }
    }

    fn reduce(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let (kind, since) = match self.op.as_str() {
            "ReduceMean" => (ReduceKind::Mean, 18),
            "ReduceSum" => (ReduceKind::Sum, 13),
            _ => (ReduceKind::Max, 18),
        };
        let axes = self.reduce_axes(node, since)?.unwrap_or_default();
        let keep = self.attr_i(node, "keepdims", 1) != 0;
        let v = self.req(node, 0)?;
        if axes.is_empty() && self.attr_i(node, "noop_with_empty_axes", 0) != 0 {
            return Ok(vec![v]);
        }
        let e = self.elem(&v);
        let axes: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.reduce(&name, x, &axes, keep, kind))?;
        Ok(vec![Val::T(id, e)])
    }

    fn perm(&self, node: &NodeProto, r: usize) -> R<Vec<usize>> {
        match self.attr_ints(node, "perm") {
            None => Ok((0..r).rev().collect()),
            Some(p) => {
                let mut seen = vec![false; r];
                let mut out = Vec::with_capacity(r);
                for &a in &p {
                    let a = self.axis(a, r)?;
                    if seen[a] {
                        return Err(self.bad(format!("perm {p:?} repeats an axis")));
                    }
                    seen[a] = true;
                    out.push(a);
                }
                if out.len() != r {
                    return Err(self.bad(format!("perm {p:?} is not a permutation of {r} axes")));
                }
                Ok(out)
            }
        }
    }

    /// The batch axis of tensor `name` as rebinding changed it: the one axis whose size
    /// differs from the file's. `None` when the batch is not rebound or the tensor does not
    /// carry it.
    fn rebound_axis(&self, name: &str, now: &[usize]) -> R<Option<usize>> {
        let Some(orig) = self.original.and_then(|o| o.get(name)) else {
            return Ok(None);
        };
        if orig.len() != now.len() {
            return Err(self.bad(format!(
                "rebinding the batch changed the rank of `{name}` ({orig:?} -> {now:?})"
            )));
        }
        let changed: Vec<usize> = (0..now.len()).filter(|&i| orig[i] != now[i]).collect();
        match changed.as_slice() {
            [] => Ok(None),
            [a] => Ok(Some(*a)),
            _ => Err(self.unsupported(format!(
                "rebinding the batch: `{name}` changed on several axes ({orig:?} -> {now:?})"
            ))),
        }
    }

    /// A shape written into the file at the file's batch, for output `out` of a node whose
    /// data input `input` now has `now`: the output axis that carries the batch is scaled.
    fn rebind_written(&self, input: &str, now: &[usize], out: &str) -> R<Option<Vec<usize>>> {
        let Some(a) = self.rebound_axis(input, now)? else {
            return Ok(None);
        };
        let (Some(orig_in), Some(orig_out)) = (
            self.original.and_then(|o| o.get(input)),
            self.original.and_then(|o| o.get(out)),
        ) else {
            return Ok(None);
        };
        let outer: usize = orig_in[..a].iter().product();
        let mut prefix = 1usize;
        for (j, &d) in orig_out.iter().enumerate() {
            if prefix == outer && (d * self.batch) % self.file_batch == 0 && d > 0 {
                let mut dims = orig_out.clone();
                dims[j] = d * self.batch / self.file_batch;
                return Ok(Some(dims));
            }
            prefix *= d;
            if prefix > outer {
                break;
            }
        }
        Err(self.unsupported(format!(
            "rebinding the batch through a shape written in the file ({orig_in:?} -> {orig_out:?}); export the model at the batch size wanted"
        )))
    }

    /// The output dims of Reshape / Flatten / Squeeze / Unsqueeze of `v`.
    fn reshaped_dims(&self, node: &NodeProto, v: &Val) -> R<Vec<usize>> {
        let d = self.dims(v);
        let r = d.len();
        let total: usize = d.iter().product();
        match self.op.as_str() {
            "Flatten" => {
                let a = self.attr_i(node, "axis", 1);
                let a = if a < 0 { a + r as i64 } else { a };
                if a < 0 || a > r as i64 {
                    return Err(self.bad(format!("axis {a} is out of range for rank {r}")));
                }
                let a = a as usize;
                Ok(vec![d[..a].iter().product(), d[a..].iter().product()])
            }
            "Squeeze" => {
                let axes = if self.model.opset >= 13 {
                    self.konst(node, 1, "axes")?.map(|c| c.as_ints())
                } else {
                    self.attr_ints(node, "axes")
                };
                let axes: Vec<usize> = match axes {
                    Some(a) => a.iter().map(|&x| self.axis(x, r)).collect::<R<_>>()?,
                    None => (0..r).filter(|&i| d[i] == 1).collect(),
                };
                if let Some(&bad) = axes.iter().find(|&&a| d[a] != 1) {
                    return Err(self.bad(format!("axis {bad} has size {}, not 1", d[bad])));
                }
                Ok((0..r).filter(|i| !axes.contains(i)).map(|i| d[i]).collect())
            }
            "Unsqueeze" => {
                let axes = if self.model.opset >= 13 {
                    self.konst(node, 1, "axes")?.map(|c| c.as_ints())
                } else {
                    self.attr_ints(node, "axes")
                }
                .ok_or_else(|| self.bad("axes are required"))?;
                let out_r = r + axes.len();
                let axes: Vec<usize> = axes
                    .iter()
                    .map(|&x| self.axis(x, out_r))
                    .collect::<R<_>>()?;
                let mut it = d.iter();
                Ok((0..out_r)
                    .map(|i| {
                        if axes.contains(&i) {
                            1
                        } else {
                            *it.next().unwrap_or(&1)
                        }
                    })
                    .collect())
            }
            _ => {
                let shape = self
                    .konst(node, 1, "shape")?
                    .ok_or_else(|| self.bad("the shape input is required"))?;
                if shape.baked {
                    let input = node.input.first().cloned().unwrap_or_default();
                    let out = node.output.first().cloned().unwrap_or_default();
                    if let Some(dims) = self.rebind_written(&input, &d, &out)? {
                        return Ok(dims);
                    }
                }
                let allow_zero = self.attr_i(node, "allowzero", 0) != 0;
                let want = shape.as_ints();
                let mut out = Vec::with_capacity(want.len());
                let mut infer = None;
                for (i, &s) in want.iter().enumerate() {
                    out.push(match s {
                        -1 if infer.is_none() => {
                            infer = Some(i);
                            1
                        }
                        0 if !allow_zero => *d.get(i).ok_or_else(|| {
                            self.bad(format!(
                                "shape {want:?} copies axis {i}, which the input lacks"
                            ))
                        })?,
                        s if s >= 0 => s as usize,
                        _ => return Err(self.bad(format!("shape {want:?} is not valid"))),
                    });
                }
                let known: usize = out.iter().product();
                if let Some(i) = infer {
                    if known == 0 || total % known != 0 {
                        return Err(self.bad(format!(
                            "cannot reshape {d:?} ({total} elements) to {want:?}"
                        )));
                    }
                    out[i] = total / known;
                }
                if out.iter().product::<usize>() != total {
                    return Err(self.bad(format!(
                        "cannot reshape {d:?} ({total} elements) to {want:?}"
                    )));
                }
                Ok(out)
            }
        }
    }

    /// The output dims of Expand (numpy broadcast of the input and the shape).
    fn expand_dims(&self, node: &NodeProto, v: &Val) -> R<Vec<usize>> {
        let shape = self
            .konst(node, 1, "shape")?
            .ok_or_else(|| self.bad("the shape input is required"))?;
        let d = self.dims(v);
        let want: Vec<usize> = shape
            .as_ints()
            .iter()
            .map(|&x| usize::try_from(x).map_err(|_| self.bad(format!("shape value {x}"))))
            .collect::<R<_>>()?;
        let mut target = consts::broadcast(&d, &want)
            .ok_or_else(|| self.bad(format!("{d:?} does not broadcast to {want:?}")))?;
        if shape.baked {
            let input = node.input.first().cloned().unwrap_or_default();
            if let Some(a) = self.rebound_axis(&input, &d)? {
                // The input's batch axis keeps its (rebound) size.
                let off = target.len() - d.len();
                target[off + a] = d[a];
            }
        }
        Ok(target)
    }

    fn concat(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let first = self.req(node, 0)?;
        let r = self.dims(&first).len();
        let e = self.elem(&first);
        let axis = self.axis(self.attr_i(node, "axis", 0), r)?;
        let mut parts = Vec::new();
        for k in 0..node.input.len() {
            let Some(v) = self.opt(node, k)? else {
                continue;
            };
            if self.dims(&v).iter().product::<usize>() == 0 {
                continue;
            }
            let v = self.retype(&v, &first);
            let name = node.input[k].clone();
            parts.push(self.t(&v, &name)?);
        }
        let mut acc = *parts
            .first()
            .ok_or_else(|| self.bad("every input is empty"))?;
        let n = parts.len();
        for (k, &p) in parts.iter().enumerate().skip(1) {
            let suffix = if k + 1 == n {
                String::new()
            } else {
                format!("partial{k}")
            };
            let name = self.out_name(node, &suffix);
            acc = chk!(self, self.g.concat_axis(&name, acc, p, axis as isize))?;
        }
        if n == 1 {
            return Ok(vec![Val::T(acc, e)]);
        }
        Ok(vec![Val::T(acc, e)])
    }

    /// The sizes a Split cuts `len` into.
    fn split_sizes(&self, node: &NodeProto, len: usize) -> R<Vec<usize>> {
        let given = if self.model.opset >= 13 {
            self.konst(node, 1, "split")?.map(|c| c.as_ints())
        } else {
            self.attr_ints(node, "split")
        };
        let outs = node.output.len();
        let sizes: Vec<usize> = match given {
            Some(s) => s.iter().map(|&x| x.max(0) as usize).collect(),
            None => {
                let n = if self.model.opset >= 18 {
                    self.attr_i(node, "num_outputs", outs as i64).max(1) as usize
                } else {
                    outs.max(1)
                };
                let chunk = len.div_ceil(n);
                (0..n)
                    .map(|i| chunk.min(len.saturating_sub(i * chunk)))
                    .collect()
            }
        };
        if sizes.iter().sum::<usize>() != len || sizes.len() != outs {
            return Err(self.bad(format!(
                "split sizes {sizes:?} do not cut an axis of {len} into {outs} outputs"
            )));
        }
        Ok(sizes)
    }

    fn split(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let v = self.req(node, 0)?;
        let d = self.dims(&v);
        let e = self.elem(&v);
        let axis = self.axis(self.attr_i(node, "axis", 0), d.len())?;
        let sizes = self.split_sizes(node, d[axis])?;
        let x = self.ti(node, 0)?;
        let mut outs = Vec::new();
        let mut start = 0;
        for (k, &len) in sizes.iter().enumerate() {
            let base = node
                .output
                .get(k)
                .filter(|s| !s.is_empty())
                .cloned()
                .unwrap_or_else(|| format!("{}/{k}", self.node));
            let name = self.fresh(&base);
            let id = chk!(self, self.g.slice(&name, x, axis as isize, start, len))?;
            outs.push(Val::T(id, e));
            start += len;
        }
        Ok(outs)
    }

    /// Per-axis `(start, len, step)` of a Slice of `d`.
    fn slice_ranges(&self, node: &NodeProto, d: &[usize]) -> R<Vec<(usize, i64, i64, i64)>> {
        let r = d.len();
        let (starts, ends, axes, steps) = if self.model.opset >= 10 {
            (
                self.konst(node, 1, "starts")?.map(|c| c.as_ints()),
                self.konst(node, 2, "ends")?.map(|c| c.as_ints()),
                self.konst(node, 3, "axes")?.map(|c| c.as_ints()),
                self.konst(node, 4, "steps")?.map(|c| c.as_ints()),
            )
        } else {
            (
                self.attr_ints(node, "starts"),
                self.attr_ints(node, "ends"),
                self.attr_ints(node, "axes"),
                None,
            )
        };
        let starts = starts.ok_or_else(|| self.bad("starts are required"))?;
        let ends = ends.ok_or_else(|| self.bad("ends are required"))?;
        let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err(self.bad("starts, ends, axes and steps differ in length"));
        }
        let mut out = Vec::new();
        for k in 0..starts.len() {
            let a = self.axis(axes[k], r)?;
            let n = d[a] as i64;
            let step = steps[k];
            if step == 0 {
                return Err(self.bad("a step of 0"));
            }
            let clampv = |v: i64, lo: i64, hi: i64| v.clamp(lo, hi);
            let norm = |v: i64| if v < 0 { v + n } else { v };
            let (s, e) = if step > 0 {
                (clampv(norm(starts[k]), 0, n), clampv(norm(ends[k]), 0, n))
            } else {
                (
                    clampv(norm(starts[k]), -1, n - 1),
                    clampv(norm(ends[k]), -1, n - 1),
                )
            };
            out.push((a, s, e, step));
        }
        Ok(out)
    }

    fn slice(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let v = self.req(node, 0)?;
        let d = self.dims(&v);
        let e = self.elem(&v);
        let input = node.input.first().cloned().unwrap_or_default();
        let rebound = self.rebound_axis(&input, &d)?;
        let mut x = self.ti(node, 0)?;
        let ranges = self.slice_ranges(node, &d)?;
        let n = ranges.len();
        for (k, &(a, s, e_, step)) in ranges.iter().enumerate() {
            if step != 1 {
                return Err(self.unsupported(format!("step {step} on a run-time tensor")));
            }
            let (mut start, mut len) = (s as usize, (e_ - s).max(0) as usize);
            if rebound == Some(a) {
                let orig = self.original.and_then(|o| o.get(&input)).map(|o| o[a]);
                if Some(e_ as usize) == orig && s == 0 {
                    (start, len) = (0, d[a]);
                } else {
                    return Err(self.unsupported(
                        "rebinding the batch through a Slice of part of the batch axis",
                    ));
                }
            }
            if start == 0 && len == d[a] {
                continue;
            }
            let suffix = if k + 1 == n {
                String::new()
            } else {
                format!("axis{a}")
            };
            let name = self.out_name(node, &suffix);
            x = chk!(self, self.g.slice(&name, x, a as isize, start, len))?;
        }
        Ok(vec![Val::T(x, e)])
    }

    fn gather(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let data = self.req(node, 0)?;
        let idx = self.req(node, 1)?;
        let d = self.dims(&data);
        let e = self.elem(&data);
        let axis = self.axis(self.attr_i(node, "axis", 0), d.len())?;
        // A constant index on a run-time tensor: a slice (the LSTM's last step, say).
        if let Val::C(c) = &idx {
            if c.len() == 1 && !matches!(data, Val::W(_)) || axis != 0 {
                if c.len() != 1 {
                    return Err(self.unsupported(format!(
                        "axis {axis} with {} indices (only one index off axis 0)",
                        c.len()
                    )));
                }
                let mut i = c.data[0] as i64;
                if i < 0 {
                    i += d[axis] as i64;
                }
                if i < 0 || i >= d[axis] as i64 {
                    return Err(self.bad(format!(
                        "index {} is out of range for axis {axis} of size {}",
                        c.data[0], d[axis]
                    )));
                }
                let x = self.ti(node, 0)?;
                let name = self.out_name(node, "slice");
                let s = chk!(self, self.g.slice(&name, x, axis as isize, i as usize, 1))?;
                let mut dims: Vec<usize> = d.clone();
                if c.dims.is_empty() {
                    dims.remove(axis);
                } else {
                    dims[axis] = 1;
                    // Indices of shape [1, ...] replace the axis by their dims.
                    dims.splice(axis..=axis, c.dims.iter().copied());
                }
                let name = self.out_name(node, "");
                let id = chk!(self, self.g.reshape(&name, s, &dims))?;
                return Ok(vec![Val::T(id, e)]);
            }
        }
        let idx = match idx {
            Val::C(c) => {
                // Negative indices count from the end.
                let n = d[0] as f64;
                let mut c2 = (*c).clone();
                for v in &mut c2.data {
                    if *v < 0.0 {
                        *v += n;
                    }
                }
                Val::C(Rc::new(c2))
            }
            v => v,
        };
        let table = self.ti(node, 0)?;
        if let Val::W(i) = data {
            let name = self.weights[i].name.clone();
            if !self.embeddings.iter().any(|e| e.tensor == name) {
                self.embeddings.push(Embedding {
                    tensor: name,
                    node: table,
                    dims: d.clone(),
                });
            }
        }
        let iname = node.input[1].clone();
        let indices = self.t(&idx, &iname)?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.gather(&name, table, indices))?;
        Ok(vec![Val::T(id, e)])
    }

    /// GatherElements / GatherND with constant indices on a run-time tensor: the flat
    /// element (or row) indices are computed here and gathered as rows.
    fn gather_flat(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let data = self.req(node, 0)?;
        let d = self.dims(&data);
        let e = self.elem(&data);
        let Some(idx) = self.konst(node, 1, "indices")? else {
            return Err(self.unsupported("indices computed at run time"));
        };
        let st = consts::strides(&d);
        let (rows, row_len, flat, out_dims) = if self.op == "GatherElements" {
            let axis = self.axis(self.attr_i(node, "axis", 0), d.len())?;
            let ist = consts::strides(&idx.dims);
            let mut flat = Vec::with_capacity(idx.len());
            for (p, &v) in idx.data.iter().enumerate() {
                let mut off = 0usize;
                for a in 0..d.len() {
                    let pos = (p / ist[a]) % idx.dims[a].max(1);
                    let pos = if a == axis {
                        let n = d[a] as i64;
                        let v = v as i64;
                        usize::try_from(if v < 0 { v + n } else { v })
                            .map_err(|_| self.bad(format!("index {v} out of range")))?
                    } else {
                        pos
                    };
                    off += pos * st[a];
                }
                flat.push(off as f64);
            }
            (d.iter().product::<usize>(), 1, flat, idx.dims.clone())
        } else {
            if self.attr_i(node, "batch_dims", 0) != 0 {
                return Err(self.unsupported("batch_dims != 0"));
            }
            let k = *idx
                .dims
                .last()
                .ok_or_else(|| self.bad("indices must have rank >= 1"))?;
            if k > d.len() {
                return Err(self.bad("index tuples longer than the data's rank"));
            }
            let row_len: usize = d[k..].iter().product();
            let rows: usize = d[..k].iter().product();
            let mut flat = Vec::new();
            for t in idx.data.chunks(k.max(1)) {
                let mut off = 0usize;
                for (a, &v) in t.iter().enumerate() {
                    let n = d[a] as i64;
                    let v = v as i64;
                    let v = usize::try_from(if v < 0 { v + n } else { v })
                        .map_err(|_| self.bad(format!("index {v} out of range")))?;
                    off += v * st[a] / row_len.max(1);
                }
                flat.push(off as f64);
            }
            let mut out = idx.dims[..idx.dims.len() - 1].to_vec();
            out.extend_from_slice(&d[k..]);
            (rows, row_len, flat, out)
        };
        let x = self.ti(node, 0)?;
        let name = self.out_name(node, "rows");
        let table = chk!(self, self.g.reshape(&name, x, &[rows, row_len]))?;
        let ic = Const::new(vec![flat.len()], Elem::I64, flat, false);
        let iname = format!(
            "{}/indices",
            node.output.first().cloned().unwrap_or_default()
        );
        let indices = self.t(&Val::C(Rc::new(ic)), &iname)?;
        let name = self.out_name(node, "gather");
        let rows_g = chk!(self, self.g.gather(&name, table, indices))?;
        let name = self.out_name(node, "");
        let id = chk!(self, self.g.reshape(&name, rows_g, &out_dims))?;
        Ok(vec![Val::T(id, e)])
    }

    fn constant(&mut self, node: &NodeProto) -> R<Val> {
        let a = node
            .attribute
            .first()
            .ok_or_else(|| self.bad("no value attribute"))?;
        let name = node.output.first().cloned().unwrap_or_default();
        let kind = a.r#type.and_then(|t| AttributeType::try_from(t).ok());
        match (a.name.as_deref().unwrap_or(""), kind) {
            ("value", _) => {
                let t =
                    a.t.as_ref()
                        .ok_or_else(|| self.bad("value holds no tensor"))?;
                self.tensor_value(t, &name, false)
            }
            ("value_float", _) => Ok(Val::C(Rc::new(Const::new(
                vec![],
                Elem::F32,
                vec![f64::from(a.f.unwrap_or(0.0))],
                true,
            )))),
            ("value_floats", _) => Ok(Val::C(Rc::new(Const::new(
                vec![a.floats.len()],
                Elem::F32,
                a.floats.iter().map(|&v| f64::from(v)).collect(),
                true,
            )))),
            ("value_int", _) => Ok(Val::C(Rc::new(Const::new(
                vec![],
                Elem::I64,
                vec![a.i.unwrap_or(0) as f64],
                true,
            )))),
            ("value_ints", _) => Ok(Val::C(Rc::new(Const::ints(&a.ints, true)))),
            (other, _) => Err(self.unsupported(format!("a `{other}` value"))),
        }
    }

    fn constant_of_shape(&mut self, node: &NodeProto) -> R<Val> {
        let shape = self
            .konst(node, 0, "shape")?
            .ok_or_else(|| self.bad("the shape input is required"))?;
        let dims: Vec<usize> = shape
            .as_ints()
            .iter()
            .map(|&x| usize::try_from(x).map_err(|_| self.bad(format!("shape value {x}"))))
            .collect::<R<_>>()?;
        let (elem, value) = match attr(node, "value").and_then(|a| a.t.as_ref()) {
            Some(t) => {
                let code = t.data_type.unwrap_or(1);
                let elem = Elem::from_code(code)
                    .ok_or_else(|| self.unsupported(consts::code_name(code)))?;
                let v = decode(t, elem, 1)
                    .ok()
                    .and_then(|v| v.first().copied())
                    .ok_or_else(|| self.bad("value must hold one element"))?;
                (elem, v)
            }
            None => (Elem::F32, 0.0),
        };
        let n: usize = dims.iter().product();
        if n > FOLD_LIMIT {
            return Err(self.unsupported(format!("a constant of {n} elements")));
        }
        let mut c = Const::new(dims, elem, vec![value; n], shape.baked);
        // A float fill of a written shape read as a weight: a "light" model's placeholder.
        c.light = shape.baked
            && elem.is_float()
            && node
                .output
                .first()
                .is_some_and(|o| self.weight_slots.contains(o));
        Ok(Val::C(Rc::new(c)))
    }

    fn lstm(&mut self, node: &NodeProto) -> R<Vec<Val>> {
        let dir = self
            .attr_s(node, "direction")
            .unwrap_or_else(|| "forward".into());
        if dir != "forward" {
            return Err(self.unsupported(format!("direction {dir} (forward only)")));
        }
        if self.attr_i(node, "layout", 0) != 0 {
            return Err(self.unsupported("layout 1 (batch first)"));
        }
        if attr(node, "activations").is_some() || attr(node, "clip").is_some() {
            return Err(self.unsupported("custom activations or clip"));
        }
        if self.attr_i(node, "input_forget", 0) != 0 {
            return Err(self.unsupported("input_forget = 1"));
        }
        if self.opt(node, 4)?.is_some() {
            if let Some(c) = self.konst(node, 4, "sequence_lens")? {
                let steps = self.dims(&self.req(node, 0)?)[0] as f64;
                if c.data.iter().any(|&v| v != steps) {
                    return Err(self.unsupported("sequences of different lengths"));
                }
            }
        }
        if self.opt(node, 7)?.is_some() {
            return Err(self.unsupported("peephole weights P"));
        }
        let xd = self.dims(&self.req(node, 0)?);
        let x = self.ti(node, 0)?;
        let w = self.ti(node, 1)?;
        let r = self.ti(node, 2)?;
        let b = match self.opt(node, 3)? {
            Some(v) => Some(self.t(&v, &node.input[3].clone())?),
            None => None,
        };
        let mut states = [None, None];
        for (slot, k) in [(0usize, 5usize), (1, 6)] {
            if let Some(v) = self.opt(node, k)? {
                let dims = self.dims(&v);
                let name = node.input[k].clone();
                let id = if dims.len() == 3 && xd.len() == 3 && dims[1] != xd[1] {
                    // Initial states written at the file's batch: rebound with it.
                    let dims2 = [dims[0], xd[1], dims[2]];
                    let values = match &v {
                        Val::W(i) => self.weights[*i].values.clone(),
                        Val::C(c) => Ok(Arc::new(c.data.clone())),
                        Val::T(..) => {
                            return Err(
                                self.unsupported("rebinding the batch of run-time initial states")
                            )
                        }
                    };
                    let values = values.map(|vals| {
                        let fill = vals.first().copied().unwrap_or(0.0);
                        Arc::new(vec![fill; dims2.iter().product()])
                    });
                    if let Ok(vals) = match &v {
                        Val::W(i) => self.weights[*i].values.clone(),
                        _ => Err(Missing::Light),
                    } {
                        if vals.iter().any(|&x| x.to_bits() != vals[0].to_bits()) {
                            return Err(self.unsupported(
                                "rebinding the batch of initial states that differ per sample",
                            ));
                        }
                    }
                    self.weights.push(Weight {
                        name: format!("{name}@batch{}", xd[1]),
                        dims: dims2.to_vec(),
                        values,
                        trainable: true,
                        init: Init::Zeros,
                    });
                    let i = self.weights.len() - 1;
                    self.place(i)?
                } else {
                    self.t(&v, &name)?
                };
                states[slot] = Some(id);
            }
        }
        let name = self.out_name(node, "");
        let out = chk!(
            self,
            self.g.lstm_onnx(&name, x, w, r, b, states[0], states[1])
        )?;
        Ok(vec![
            Val::T(out.sequence, Elem::F32),
            Val::T(out.hidden, Elem::F32),
            Val::T(out.cell, Elem::F32),
        ])
    }

    // ----- folding -----

    /// The node's outputs when every input is a constant and the op folds.
    fn fold(&mut self, node: &NodeProto, op: &str) -> R<Option<Vec<Val>>> {
        const FOLDS: &[&str] = &[
            "Identity",
            "Cast",
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Max",
            "Min",
            "Sum",
            "Equal",
            "Less",
            "LessOrEqual",
            "Greater",
            "GreaterOrEqual",
            "And",
            "Or",
            "Not",
            "Neg",
            "Sqrt",
            "Where",
            "Unsqueeze",
            "Squeeze",
            "Reshape",
            "Flatten",
            "Concat",
            "Gather",
            "GatherElements",
            "GatherND",
            "Slice",
            "Expand",
            "Range",
            "Transpose",
            "Split",
        ];
        if !FOLDS.contains(&op) {
            return Ok(None);
        }
        let mut ins: Vec<Option<Rc<Const>>> = Vec::new();
        for k in 0..node.input.len() {
            match self.opt(node, k)? {
                None => ins.push(None),
                Some(Val::C(c)) => ins.push(Some(c)),
                Some(_) => return Ok(None),
            }
        }
        let Some(Some(a)) = ins.first().cloned() else {
            return Ok(None);
        };
        let get = |k: usize| ins.get(k).cloned().flatten();
        let c = |x: Const| Ok(Some(vec![Val::C(Rc::new(x))]));
        let bin = |f: &dyn Fn(f64, f64) -> f64, elem: Elem| -> R<Option<Vec<Val>>> {
            let b = get(1).ok_or_else(|| self.bad("input 1 is required"))?;
            let out = consts::zip(&a, &b, elem, f).ok_or_else(|| {
                self.bad(format!("{:?} and {:?} do not broadcast", a.dims, b.dims))
            })?;
            if out.len() > FOLD_LIMIT {
                return Err(self.unsupported("folding a constant that large"));
            }
            Ok(Some(vec![Val::C(Rc::new(out))]))
        };
        let int = !a.elem.is_float();
        let b01 = |x: bool| f64::from(u8::from(x));
        match op {
            "Identity" => c((*a).clone()),
            "Cast" => {
                let to = Elem::from_code(self.attr_i(node, "to", 1) as i32)
                    .ok_or_else(|| self.unsupported("the target element type"))?;
                let mut out = (*a).clone();
                out.elem = to;
                out.data = out.data.iter().map(|&v| cast_value(v, to)).collect();
                c(out)
            }
            "Add" | "Sum" if ins.len() <= 2 => bin(&|x, y| x + y, a.elem),
            "Sub" => bin(&|x, y| x - y, a.elem),
            "Mul" => bin(&|x, y| x * y, a.elem),
            "Div" => bin(
                &move |x, y| if int { (x / y).trunc() } else { x / y },
                a.elem,
            ),
            "Pow" => bin(&f64::powf, a.elem),
            "Max" if ins.len() == 2 => bin(&f64::max, a.elem),
            "Min" if ins.len() == 2 => bin(&f64::min, a.elem),
            "Equal" => bin(&|x, y| b01(x == y), Elem::Bool),
            "Less" => bin(&|x, y| b01(x < y), Elem::Bool),
            "LessOrEqual" => bin(&|x, y| b01(x <= y), Elem::Bool),
            "Greater" => bin(&|x, y| b01(x > y), Elem::Bool),
            "GreaterOrEqual" => bin(&|x, y| b01(x >= y), Elem::Bool),
            "And" => bin(&|x, y| b01(x != 0.0 && y != 0.0), Elem::Bool),
            "Or" => bin(&|x, y| b01(x != 0.0 || y != 0.0), Elem::Bool),
            "Not" => {
                let mut out = (*a).clone();
                out.data = out.data.iter().map(|&v| b01(v == 0.0)).collect();
                c(out)
            }
            "Neg" => {
                let mut out = (*a).clone();
                out.data = out.data.iter().map(|&v| -v).collect();
                c(out)
            }
            "Sqrt" => {
                let mut out = (*a).clone();
                out.data = out.data.iter().map(|&v| v.sqrt()).collect();
                c(out)
            }
            "Where" => {
                let (x, y) = (
                    get(1).ok_or_else(|| self.bad("input 1 is required"))?,
                    get(2).ok_or_else(|| self.bad("input 2 is required"))?,
                );
                let xy = consts::broadcast(&x.dims, &y.dims)
                    .and_then(|d| consts::broadcast(&a.dims, &d))
                    .ok_or_else(|| self.bad("inputs do not broadcast"))?;
                let (ce, xe, ye) = (
                    consts::expand(&a, &xy),
                    consts::expand(&x, &xy),
                    consts::expand(&y, &xy),
                );
                let (Some(ce), Some(xe), Some(ye)) = (ce, xe, ye) else {
                    return Err(self.bad("inputs do not broadcast"));
                };
                let data = (0..ce.len())
                    .map(|i| {
                        if ce.data[i] != 0.0 {
                            xe.data[i]
                        } else {
                            ye.data[i]
                        }
                    })
                    .collect();
                c(Const::new(xy, x.elem, data, a.baked || x.baked || y.baked))
            }
            "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten" => {
                let v = Val::C(a.clone());
                let dims = self.reshaped_dims(node, &v)?;
                let mut out = (*a).clone();
                out.dims = dims;
                c(out)
            }
            "Expand" => {
                let v = Val::C(a.clone());
                let dims = self.expand_dims(node, &v)?;
                let out =
                    consts::expand(&a, &dims).ok_or_else(|| self.bad("does not broadcast"))?;
                if out.len() > FOLD_LIMIT {
                    return Err(self.unsupported("folding a constant that large"));
                }
                c(out)
            }
            "Concat" => {
                let r = a.dims.len();
                let axis = self.axis(self.attr_i(node, "axis", 0), r)?;
                let parts: Vec<Rc<Const>> = ins.iter().flatten().cloned().collect();
                let mut dims = a.dims.clone();
                dims[axis] = parts
                    .iter()
                    .map(|p| p.dims.get(axis).copied().unwrap_or(0))
                    .sum();
                let outer: usize = a.dims[..axis].iter().product();
                let mut data = Vec::new();
                for o in 0..outer {
                    for p in &parts {
                        if p.dims.len() != r {
                            return Err(self.bad("inputs differ in rank"));
                        }
                        let inner: usize = p.dims[axis..].iter().product();
                        data.extend_from_slice(&p.data[o * inner..(o + 1) * inner]);
                    }
                }
                let baked = parts.iter().any(|p| p.baked);
                c(Const::new(dims, a.elem, data, baked))
            }
            "Gather" => {
                let idx = get(1).ok_or_else(|| self.bad("input 1 is required"))?;
                let axis = self.axis(self.attr_i(node, "axis", 0), a.dims.len())?;
                let n = a.dims[axis] as i64;
                let outer: usize = a.dims[..axis].iter().product();
                let inner: usize = a.dims[axis + 1..].iter().product();
                let mut data = Vec::new();
                for o in 0..outer {
                    for &i in &idx.data {
                        let mut i = i as i64;
                        if i < 0 {
                            i += n;
                        }
                        if i < 0 || i >= n {
                            return Err(
                                self.bad(format!("index {i} is out of range (axis of {n})"))
                            );
                        }
                        let base = (o * n as usize + i as usize) * inner;
                        data.extend_from_slice(&a.data[base..base + inner]);
                    }
                }
                let mut dims = a.dims[..axis].to_vec();
                dims.extend_from_slice(&idx.dims);
                dims.extend_from_slice(&a.dims[axis + 1..]);
                c(Const::new(dims, a.elem, data, a.baked))
            }
            "GatherElements" => {
                let idx = get(1).ok_or_else(|| self.bad("input 1 is required"))?;
                let axis = self.axis(self.attr_i(node, "axis", 0), a.dims.len())?;
                let (st, ist) = (consts::strides(&a.dims), consts::strides(&idx.dims));
                let mut data = Vec::with_capacity(idx.len());
                for (p, &v) in idx.data.iter().enumerate() {
                    let mut off = 0;
                    for k in 0..a.dims.len() {
                        let pos = (p / ist[k]) % idx.dims[k].max(1);
                        let pos = if k == axis {
                            let v = v as i64;
                            (if v < 0 { v + a.dims[k] as i64 } else { v }) as usize
                        } else {
                            pos
                        };
                        off += pos * st[k];
                    }
                    data.push(
                        *a.data
                            .get(off)
                            .ok_or_else(|| self.bad("index out of range"))?,
                    );
                }
                c(Const::new(idx.dims.clone(), a.elem, data, a.baked))
            }
            "GatherND" => {
                let idx = get(1).ok_or_else(|| self.bad("input 1 is required"))?;
                if self.attr_i(node, "batch_dims", 0) != 0 {
                    return Err(self.unsupported("batch_dims != 0"));
                }
                let k = *idx
                    .dims
                    .last()
                    .ok_or_else(|| self.bad("indices of rank 0"))?;
                let st = consts::strides(&a.dims);
                let inner: usize = a.dims[k..].iter().product();
                let mut data = Vec::new();
                for t in idx.data.chunks(k.max(1)) {
                    let off: usize = t.iter().enumerate().map(|(j, &v)| v as usize * st[j]).sum();
                    data.extend_from_slice(
                        a.data
                            .get(off..off + inner)
                            .ok_or_else(|| self.bad("index out of range"))?,
                    );
                }
                let mut dims = idx.dims[..idx.dims.len() - 1].to_vec();
                dims.extend_from_slice(&a.dims[k..]);
                c(Const::new(dims, a.elem, data, a.baked))
            }
            "Slice" => {
                let ranges = self.slice_ranges(node, &a.dims)?;
                let mut cur = (*a).clone();
                for (axis, s, e, step) in ranges {
                    let picks: Vec<usize> = if step > 0 {
                        (s..e).step_by(step as usize).map(|v| v as usize).collect()
                    } else {
                        let mut v = Vec::new();
                        let mut i = s;
                        while i > e {
                            v.push(i as usize);
                            i += step;
                        }
                        v
                    };
                    let outer: usize = cur.dims[..axis].iter().product();
                    let n = cur.dims[axis];
                    let inner: usize = cur.dims[axis + 1..].iter().product();
                    let mut data = Vec::new();
                    for o in 0..outer {
                        for &p in &picks {
                            let base = (o * n + p) * inner;
                            data.extend_from_slice(&cur.data[base..base + inner]);
                        }
                    }
                    cur.dims[axis] = picks.len();
                    cur.data = data;
                }
                c(cur)
            }
            "Range" => {
                let (s, l, d) = (
                    a.scalar(),
                    get(1).and_then(|c| c.scalar()),
                    get(2).and_then(|c| c.scalar()),
                );
                let (Some(s), Some(l), Some(d)) = (s, l, d) else {
                    return Err(self.bad("start, limit and delta must be scalars"));
                };
                if d == 0.0 {
                    return Err(self.bad("delta is 0"));
                }
                let n = ((l - s) / d).ceil().max(0.0) as usize;
                if n > FOLD_LIMIT {
                    return Err(self.unsupported("folding a constant that large"));
                }
                let data = (0..n).map(|i| s + i as f64 * d).collect();
                c(Const::new(vec![n], a.elem, data, a.baked))
            }
            "Transpose" => {
                let perm = self.perm(node, a.dims.len())?;
                let st = consts::strides(&a.dims);
                let dims: Vec<usize> = perm.iter().map(|&p| a.dims[p]).collect();
                let ost = consts::strides(&dims);
                let mut data = vec![0.0; a.len()];
                for (o, slot) in data.iter_mut().enumerate() {
                    let mut off = 0;
                    for (k, &p) in perm.iter().enumerate() {
                        off += ((o / ost[k]) % dims[k].max(1)) * st[p];
                    }
                    *slot = a.data[off];
                }
                c(Const::new(dims, a.elem, data, a.baked))
            }
            "Split" => {
                let axis = self.axis(self.attr_i(node, "axis", 0), a.dims.len())?;
                let sizes = self.split_sizes(node, a.dims[axis])?;
                let outer: usize = a.dims[..axis].iter().product();
                let inner: usize = a.dims[axis + 1..].iter().product();
                let n = a.dims[axis];
                let mut outs = Vec::new();
                let mut start = 0;
                for len in sizes {
                    let mut data = Vec::new();
                    for o in 0..outer {
                        let base = (o * n + start) * inner;
                        data.extend_from_slice(&a.data[base..base + len * inner]);
                    }
                    let mut dims = a.dims.clone();
                    dims[axis] = len;
                    outs.push(Val::C(Rc::new(Const::new(dims, a.elem, data, a.baked))));
                    start += len;
                }
                Ok(Some(outs))
            }
            _ => Ok(None),
        }
    }
}
