//! ONNX models: reading a `.onnx` file and importing its graph into a Tessera graph, with
//! every tensor's shape inferred, shape arithmetic folded at import, the batch size rebound
//! on request and the nodes split into pipeline stages.
//!
//! Weights stored as external data (a file beside the model) are read from that file.
//! Weight-free files are fine for estimates: initializers whose bytes live in an external
//! file that is absent (as `strip.py`-style stripped exports) and initializers replaced by
//! `ConstantOfShape` nodes (the "light" models the `onnx` package ships) both import, as
//! variables of the right shape and type. Running numerics needs the values, and asking for
//! them without is an [`OnnxError::NoWeights`].
//!
//! As in PopART, every floating-point initializer with more than one element is a trainable
//! weight; scalars, integer and boolean initializers and `Constant` nodes are constants.

mod consts;
mod external;
mod import;
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use prost::Message;
use tessera_core::{DType, GraphError, NodeId};
use tessera_sim::techniques::Techniques;

pub use consts::{Elem, Missing};
pub use import::ops::{converters, markdown_table as op_table_markdown, Converter, Family};
pub use import::{import, import_count, supported_ops, ImportCount, OnnxGraph, Stages};

/// An op type the importer does not read, as [`OnnxError::UnsupportedOps`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// The op type, with its domain when not the default (`com.example.MyOp`).
    pub op: String,
    /// The opset of its domain the model imports.
    pub opset: i64,
    /// The version of the op in force at that opset, when it is an ONNX op the importer reads
    /// in other versions.
    pub version: Option<u32>,
    /// How many nodes use it.
    pub nodes: usize,
    /// The first of them.
    pub first: String,
}

impl std::fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (opset {}", self.op, self.opset)?;
        if let Some(v) = self.version {
            write!(f, ", version {v}")?;
        }
        let s = if self.nodes == 1 { "" } else { "s" };
        write!(f, "; {} node{s}, the first `{}`)", self.nodes, self.first)
    }
}

/// The element type a value info declares, when it is a tensor of a type the importer reads.
pub fn tensor_elem(v: &proto::ValueInfoProto) -> Option<Elem> {
    match v.r#type.as_ref()?.value.as_ref()? {
        proto::type_proto::Value::TensorType(t) => Elem::from_code(t.elem_type.unwrap_or(0)),
        _ => None,
    }
}

impl OnnxModel {
    /// Checks that every graph input and output is of a type numerics compute as the file
    /// says: not float64, float16 or bfloat16 (run in float32).
    ///
    /// # Errors
    ///
    /// [`OnnxError::FloatType`] naming the first such tensor.
    pub fn require_float32_io(&self) -> Result<(), OnnxError> {
        let graph = self.graph();
        for v in graph.input.iter().chain(&graph.output) {
            let elem = match tensor_elem(v) {
                Some(Elem::F64) => "float64",
                Some(Elem::F16) => "float16",
                Some(Elem::Bf16) => "bfloat16",
                _ => continue,
            };
            return Err(OnnxError::FloatType {
                tensor: v.name.clone().unwrap_or_default(),
                elem,
            });
        }
        Ok(())
    }
}

/// A serialised `TensorProto` (a `.pb` file of ONNX's test data sets) as its dims, element
/// type and values.
///
/// # Errors
///
/// [`OnnxError::Decode`] naming `path` when the bytes are not a tensor of a type the importer
/// reads, or hold fewer values than their dims.
pub fn read_tensor(bytes: &[u8], path: &Path) -> Result<(Vec<usize>, Elem, Vec<f64>), OnnxError> {
    let err = |message: String| OnnxError::Decode {
        path: path.to_path_buf(),
        message,
    };
    let t = proto::TensorProto::decode(bytes).map_err(|e| err(e.to_string()))?;
    let code = t.data_type.unwrap_or(0);
    let elem = Elem::from_code(code)
        .ok_or_else(|| err(format!("element type {}", consts::code_name(code))))?;
    let dims: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| err(format!("dimension {d}"))))
        .collect::<Result<_, _>>()?;
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| err(format!("{dims:?} has too many elements")))?;
    let values = consts::decode(&t, elem, count)
        .map_err(|_| err(format!("the values of a {dims:?} tensor do not decode")))?;
    Ok((dims, elem, values))
}

/// The oldest default-domain opset the importer reads.
pub const MIN_OPSET: i64 = 6;
/// The newest default-domain opset the importer reads.
pub const MAX_OPSET: i64 = 22;

/// Why an ONNX model cannot be read or imported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnnxError {
    /// The file cannot be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not an ONNX model (protobuf decoding failed).
    #[error("{}: not an ONNX model: {message}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// Where and why decoding failed.
        message: String,
    },
    /// The model's opset is outside what the importer reads.
    #[error("{}: opset {opset} of the default ONNX domain is not supported (supported: {MIN_OPSET} to {MAX_OPSET}); convert the model with onnx.version_converter", path.display())]
    Opset {
        /// The file.
        path: PathBuf,
        /// The model's opset.
        opset: i64,
    },
    /// A node's op (or op variant) is not supported. The supported ops are listed when the
    /// op itself is not one of them; a variant of a supported op says what is not read.
    #[error("node `{node}`: {op} (opset {opset}) is not supported{}{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") }, ops_unless_supported(op))]
    Unsupported {
        /// The node.
        node: String,
        /// Its op type (with its domain when not the default).
        op: String,
        /// The model's opset.
        opset: i64,
        /// Which variant is unsupported, if the op itself is.
        detail: String,
    },
    /// Several op types of the model are not read by the importer: each with its opset, how
    /// many nodes use it and the first of them, so that one run tells everything missing.
    #[error("{} op types are not supported: {}; supported ops: {}", ops.len(), ops.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "), supported_ops().join(", "))]
    UnsupportedOps {
        /// The op types, in the order their first nodes appear.
        ops: Vec<UnsupportedOp>,
    },
    /// A graph input has a symbolic dimension that nothing binds.
    #[error("input `{input}`: dimension {axis} is symbolic (`{param}`); {hint}")]
    UnboundDim {
        /// The input.
        input: String,
        /// The axis.
        axis: usize,
        /// The symbol's name.
        param: String,
        /// How to bind it.
        hint: String,
    },
    /// A graph input or output of a floating-point type other than float32 where numerics
    /// run (`tessera run` computes in float32; onnxruntime would compute in that type).
    #[error("tensor `{tensor}` is {elem}: `tessera run` computes in float32, so its values would not be the {elem} ones onnxruntime gives; convert the model to float32 (estimates read it, with --dtype)")]
    FloatType {
        /// The graph input or output.
        tensor: String,
        /// Its element type (`float64`, `float16`, `bfloat16`).
        elem: &'static str,
    },
    /// An input shape given for the import (`--input-shape`) does not fit the model.
    #[error("--input-shape {input}: {message}")]
    InputShape {
        /// The input named.
        input: String,
        /// What is wrong.
        message: String,
    },
    /// The model imports no opset of the default ONNX domain: its nodes are all of other
    /// domains (`ai.onnx.ml`'s trees, scalers and linear classifiers, as skl2onnx writes).
    #[error("{}: every node is of another domain than the default ONNX one ({domains}: {}); these ops (trees, scalers, linear classifiers and the like) are outside what an IPU graph runs, and Tessera reads the default domain's ops only", path.display(), ops.join(", "))]
    OtherDomain {
        /// The file.
        path: PathBuf,
        /// The domains the model imports, with their opsets (`ai.onnx.ml 3`).
        domains: String,
        /// The op types its nodes use, each once, with its domain (`ai.onnx.ml.TreeEnsembleClassifier`).
        ops: Vec<String>,
    },
    /// The graph declares no outputs: nothing it computes is a result.
    #[error("{}: the graph declares no outputs (its `output` list is empty), so none of its nodes computes a result; declare the outputs (onnx.helper.make_tensor_value_info) or export the model again", path.display())]
    NoOutputs {
        /// The file.
        path: PathBuf,
    },
    /// A node is malformed or does not fit its inputs (attributes, shapes, types).
    #[error("node `{node}` ({op}): {message}")]
    BadNode {
        /// The node.
        node: String,
        /// Its op type.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// The graph builder refused a node.
    #[error("node `{node}` ({op})")]
    Graph {
        /// The node.
        node: String,
        /// Its op type.
        op: String,
        /// The builder's error.
        #[source]
        source: Box<GraphError>,
    },
    /// A value a node reads is not produced by any node, input or initializer.
    #[error("node `{node}` reads `{tensor}`, which no node, input or initializer makes")]
    MissingTensor {
        /// The node.
        node: String,
        /// The tensor.
        tensor: String,
    },
    /// Numerics were asked of a model without its weights.
    #[error(
        "weight `{tensor}` has no values: {missing}; numerics need the weights (estimates do not)"
    )]
    NoWeights {
        /// The initializer.
        tensor: String,
        /// Why its values are absent.
        missing: Missing,
    },
    /// A tensor's external data cannot be read.
    #[error("tensor `{tensor}`: external data `{location}`: {message}")]
    ExternalData {
        /// The tensor.
        tensor: String,
        /// Its `location` entry.
        location: String,
        /// What is wrong.
        message: String,
    },
    /// A pipeline-stage boundary names no node of the graph.
    #[error("--pipeline-stages: no node or tensor is named `{name}`{}", if suggestions.is_empty() { String::new() } else { format!(" (similar: {})", suggestions.join(", ")) })]
    UnknownStageNode {
        /// The name given.
        name: String,
        /// Node names that contain it or that it contains.
        suggestions: Vec<String>,
    },
    /// The stage boundaries are out of order or repeated.
    #[error("--pipeline-stages: {0}")]
    BadStages(String),
    /// Two nodes (or a node and a graph input or initializer) make the same tensor.
    #[error("tensor `{tensor}` is made by both {first} and {second}; an ONNX graph makes each tensor once")]
    DuplicateProducer {
        /// The tensor.
        tensor: String,
        /// What makes it first (`node \`N\``, `graph input`, `initializer`).
        first: String,
        /// What makes it again.
        second: String,
    },
    /// Nodes that read each other's outputs in a ring.
    #[error("nodes {} form a cycle; an ONNX graph is acyclic", .nodes.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(" -> "))]
    Cycle {
        /// The nodes of the cycle, the first repeated at the end.
        nodes: Vec<String>,
    },
    /// A node reads a tensor that a later node makes (no cycle).
    #[error("node `{node}` reads `{tensor}` before node `{producer}` makes it; ONNX nodes must be in topological order (as onnx.checker requires)")]
    Unsorted {
        /// The reading node.
        node: String,
        /// The tensor.
        tensor: String,
        /// The later node making it.
        producer: String,
    },
}

/// `; supported ops: ...` unless `op` is one of them.
fn ops_unless_supported(op: &str) -> String {
    let ops = supported_ops();
    if ops.contains(&op) {
        String::new()
    } else {
        format!("; supported ops: {}", ops.join(", "))
    }
}

/// Checks the top-level graph as onnx.checker does before anything is imported: every tensor
/// made once (by one node, graph input or initializer), and every node reading only tensors
/// made before it, a ring of nodes named as a cycle. Names that nothing makes are reported
/// where they are read ([`OnnxError::MissingTensor`]).
///
/// # Errors
///
/// [`OnnxError::DuplicateProducer`], [`OnnxError::Cycle`] or [`OnnxError::Unsorted`].
pub(crate) fn validate_graph(graph: &proto::GraphProto) -> Result<(), OnnxError> {
    use std::collections::HashMap;
    #[derive(Clone, Copy)]
    enum Maker {
        Input,
        Initializer,
        Node(usize),
    }
    let describe = |m: Maker| match m {
        Maker::Input => "a graph input".to_string(),
        Maker::Initializer => "an initializer".to_string(),
        Maker::Node(k) => format!("node `{}`", node_name(&graph.node[k], k)),
    };
    let mut made: HashMap<&str, Maker> = HashMap::new();
    let claim = |made: &mut HashMap<&str, Maker>, name: &str, by: Maker| -> Result<(), OnnxError> {
        if name.is_empty() {
            return Ok(());
        }
        if let Some(&first) = made.get(name) {
            // An initializer that is also a graph input (a default value, IR < 4) is one
            // tensor, not two.
            let input_default = matches!(
                (first, by),
                (Maker::Input, Maker::Initializer) | (Maker::Initializer, Maker::Input)
            );
            if !input_default {
                return Err(OnnxError::DuplicateProducer {
                    tensor: name.to_string(),
                    first: describe(first),
                    second: describe(by),
                });
            }
        }
        Ok(())
    };
    for i in &graph.input {
        let name = i.name.as_deref().unwrap_or_default();
        claim(&mut made, name, Maker::Input)?;
        made.insert(name, Maker::Input);
    }
    for t in &graph.initializer {
        let name = t.name.as_deref().unwrap_or_default();
        claim(&mut made, name, Maker::Initializer)?;
        made.entry(name).or_insert(Maker::Initializer);
    }
    for (k, n) in graph.node.iter().enumerate() {
        for o in &n.output {
            claim(&mut made, o, Maker::Node(k))?;
            if !o.is_empty() {
                made.insert(o, Maker::Node(k));
            }
        }
    }
    // Each node reads only what graph inputs, initializers and earlier nodes make.
    let producer = |name: &str| match made.get(name) {
        Some(Maker::Node(j)) => Some(*j),
        _ => None,
    };
    for (k, n) in graph.node.iter().enumerate() {
        for t in n.input.iter().filter(|t| !t.is_empty()) {
            let Some(j) = producer(t) else { continue };
            if j < k {
                continue;
            }
            // A later (or the same) node makes it: a cycle when node j reaches node k back
            // through what it reads.
            let mut path = vec![j];
            let mut seen = vec![false; graph.node.len()];
            if let Some(ring) = reaches(graph, &producer, j, k, &mut seen, &mut path) {
                // `ring` runs from j back to k against the data; in data order it is k, ...,
                // j, and j feeds k again.
                let mut nodes: Vec<String> = ring
                    .iter()
                    .rev()
                    .map(|&x| node_name(&graph.node[x], x))
                    .collect();
                nodes.push(node_name(&graph.node[k], k));
                return Err(OnnxError::Cycle { nodes });
            }
            return Err(OnnxError::Unsorted {
                node: node_name(n, k),
                tensor: t.clone(),
                producer: node_name(&graph.node[j], j),
            });
        }
    }
    Ok(())
}

/// Whether node `from` reads, directly or through other nodes, an output of node `to`; `path`
/// collects the nodes walked from `from` (ending at `to`) when it does.
fn reaches(
    graph: &proto::GraphProto,
    producer: &dyn Fn(&str) -> Option<usize>,
    from: usize,
    to: usize,
    seen: &mut [bool],
    path: &mut Vec<usize>,
) -> Option<Vec<usize>> {
    if from == to {
        return Some(path.clone());
    }
    if std::mem::replace(&mut seen[from], true) {
        return None;
    }
    for t in graph.node[from].input.iter().filter(|t| !t.is_empty()) {
        if let Some(j) = producer(t) {
            path.push(j);
            if let Some(p) = reaches(graph, producer, j, to, seen, path) {
                return Some(p);
            }
            path.pop();
        }
    }
    None
}

/// A graph input as the import bound it.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedInput {
    /// The ONNX name.
    pub name: String,
    /// The graph node.
    pub node: NodeId,
    /// Dimensions, with the batch bound.
    pub dims: Vec<usize>,
    /// The ONNX element type.
    pub elem: Elem,
    /// Which axis is the batch.
    pub batch_axis: Option<usize>,
}

/// A graph output.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedOutput {
    /// The ONNX name.
    pub name: String,
    /// The graph node.
    pub node: NodeId,
    /// Dimensions.
    pub dims: Vec<usize>,
}

/// One ONNX node and the graph nodes it became.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// The node's name (`op_type` and its position when it has none).
    pub name: String,
    /// Its op type.
    pub op: String,
    /// The first graph node it made.
    pub first: usize,
    /// One past the last graph node it made (`first` when it folded to a constant).
    pub end: usize,
    /// Its pipeline stage.
    pub stage: usize,
}

/// Values to load into the plan's state before running numerics.
#[derive(Clone, Debug, PartialEq)]
pub struct StateValue {
    /// The graph node (a variable or a constant tensor).
    pub node: NodeId,
    /// The ONNX tensor it holds.
    pub tensor: String,
    /// The values, or why the file has none.
    pub values: Result<std::sync::Arc<Vec<f64>>, Missing>,
}

/// A weight used as an embedding table.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// The initializer.
    pub tensor: String,
    /// Its variable (in the stage that first used it).
    pub node: NodeId,
    /// `[rows, ...]`.
    pub dims: Vec<usize>,
}

/// What an import added to the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    /// The model's inputs.
    pub inputs: Vec<ImportedInput>,
    /// The model's outputs.
    pub outputs: Vec<ImportedOutput>,
    /// Every ONNX node, in order.
    pub layers: Vec<Layer>,
    /// The inferred dimensions of every tensor, by ONNX name.
    pub shapes: HashMap<String, Vec<usize>>,
    /// Weights and data constants, with their values where the file has them.
    pub state: Vec<StateValue>,
    /// Embedding tables: weights that `Gather` picks rows of (token embeddings first).
    pub embeddings: Vec<Embedding>,
    /// Samples per batch as bound (the file's when not rebound).
    pub batch: usize,
    /// The file's own batch size.
    pub file_batch: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// Stage -> IPU from PopART's `__ipu_number` attributes, when the file has them.
    pub device_mapping: Option<Vec<usize>>,
    /// Every `If` decided at run time, with the graph nodes of its two branches.
    pub conditionals: Vec<tessera_sim::system::Conditional>,
}

impl Imported {
    /// The layer (ONNX node) that made graph node `index`, if any.
    pub fn layer_of(&self, index: usize) -> Option<&Layer> {
        let i = self.layers.partition_point(|l| l.end <= index);
        self.layers
            .get(i)
            .filter(|l| l.first <= index && index < l.end)
    }

    /// Checks that every weight and constant has its values.
    ///
    /// # Errors
    ///
    /// [`OnnxError::NoWeights`] naming the first tensor without.
    pub fn require_weights(&self) -> Result<(), OnnxError> {
        for s in &self.state {
            if let Err(missing) = &s.values {
                return Err(OnnxError::NoWeights {
                    tensor: s.tensor.clone(),
                    missing: missing.clone(),
                });
            }
        }
        Ok(())
    }
}

/// How to import.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportOptions {
    /// Rebind the batch dimension to this size (`None`: the file's).
    pub batch_size: Option<usize>,
    /// Element type of float tensors.
    pub dtype: DType,
    /// Import for training (batch normalisation uses batch statistics).
    pub training: bool,
    /// Where pipeline stages start.
    pub stages: Stages,
    /// Whole shapes of named graph inputs (`--input-shape NAME=D0,D1,...`, as `trtexec
    /// --shapes` and onnxruntime's free-dimension overrides bind them): they stand as given,
    /// the batch axis included.
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// Graph inputs whose values are known at import (`tessera run` is given them): each
    /// becomes a constant of those values (dims, values), so that a node needing it at
    /// import (axes, starts, sizes, clip bounds, indices) reads it, as onnxruntime reads it
    /// at run time. They are no graph inputs of the import.
    pub known_inputs: Vec<(String, Vec<usize>, Vec<f64>)>,
    /// The resolved techniques of the estimate or run: the import applies those that
    /// rewrite the graph; the compile reads the rest.
    pub techniques: Techniques,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            batch_size: None,
            dtype: DType::F32,
            training: false,
            stages: Stages::Attributes,
            input_shapes: Vec::new(),
            known_inputs: Vec::new(),
            techniques: Techniques::default(),
        }
    }
}

/// The error for a model that imports no default-domain opset: the domains it imports and
/// the ops of its nodes.
fn other_domain(proto: &proto::ModelProto, path: &Path) -> OnnxError {
    let domains: Vec<String> = proto
        .opset_import
        .iter()
        .map(|o| {
            let d = o.domain.as_deref().unwrap_or("");
            format!(
                "{} {}",
                if d.is_empty() { "(default)" } else { d },
                o.version.unwrap_or(0)
            )
        })
        .collect();
    let mut ops: Vec<String> = Vec::new();
    for n in proto.graph.iter().flat_map(|g| &g.node) {
        let d = n.domain.as_deref().unwrap_or("");
        let op = n.op_type.as_deref().unwrap_or("?");
        let name = if d.is_empty() {
            op.to_string()
        } else {
            format!("{d}.{op}")
        };
        if !ops.contains(&name) {
            ops.push(name);
        }
    }
    OnnxError::OtherDomain {
        path: path.to_path_buf(),
        domains: if domains.is_empty() {
            "no opset imports".into()
        } else {
            domains.join(", ")
        },
        ops,
    }
}

/// A decoded ONNX model.
#[derive(Clone, Debug)]
pub struct OnnxModel {
    /// Where it was read from.
    pub path: PathBuf,
    /// The model.
    pub proto: proto::ModelProto,
    /// The default-domain opset.
    pub opset: i64,
}

impl OnnxModel {
    /// Reads and decodes `path`, checking its opset, and reads the bytes of tensors stored
    /// as external data (files beside the model) where those files are
    /// there.
    ///
    /// # Errors
    ///
    /// [`OnnxError::Io`], [`OnnxError::Decode`] (with the byte offset where the protobuf
    /// breaks), [`OnnxError::Opset`], [`OnnxError::ExternalData`].
    pub fn load(path: &Path) -> Result<OnnxModel, OnnxError> {
        let bytes = std::fs::read(path).map_err(|source| OnnxError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut model = OnnxModel::from_bytes(&bytes, path)?;
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if let Some(graph) = model.proto.graph.as_mut() {
            external::load(graph, &folder)?;
        }
        Ok(model)
    }

    /// Decodes a model from `bytes` (`path` names it in messages).
    ///
    /// # Errors
    ///
    /// As [`OnnxModel::load`].
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<OnnxModel, OnnxError> {
        let decode_err = |message: String| OnnxError::Decode {
            path: path.to_path_buf(),
            message,
        };
        if let Some(problem) = wire_problem(bytes) {
            return Err(decode_err(problem));
        }
        let proto = proto::ModelProto::decode(bytes)
            .map_err(|e| decode_err(format!("{e} ({} bytes)", bytes.len())))?;
        if proto.graph.is_none() {
            return Err(decode_err(
                "the file decodes but holds no graph (field 7 of ModelProto)".into(),
            ));
        }
        let opset = proto
            .opset_import
            .iter()
            .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
            .and_then(|o| o.version)
            .ok_or_else(|| other_domain(&proto, path))?;
        if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
            return Err(OnnxError::Opset {
                path: path.to_path_buf(),
                opset,
            });
        }
        if proto.graph.as_ref().is_some_and(|g| g.output.is_empty()) {
            return Err(OnnxError::NoOutputs {
                path: path.to_path_buf(),
            });
        }
        Ok(OnnxModel {
            path: path.to_path_buf(),
            proto,
            opset,
        })
    }

    /// The graph (present: [`OnnxModel::load`] checks).
    pub fn graph(&self) -> &proto::GraphProto {
        self.proto
            .graph
            .as_ref()
            .expect("load() refuses models without a graph")
    }

    /// A short name: the file name without `.onnx` (and `.stripped`).
    pub fn name(&self) -> String {
        let stem = self
            .path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("model");
        stem.trim_end_matches(".onnx").to_string()
    }

    /// Node names, for messages and for choosing stage boundaries.
    pub fn node_names(&self) -> Vec<String> {
        self.graph()
            .node
            .iter()
            .enumerate()
            .map(|(i, n)| node_name(n, i))
            .collect()
    }
}

/// A node's name, or `op_type_index` when it has none.
pub(crate) fn node_name(n: &proto::NodeProto, index: usize) -> String {
    match n.name.as_deref() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => format!("{}_{index}", n.op_type.as_deref().unwrap_or("node")),
    }
}

/// Walks the top level of a protobuf message and says where it breaks, if it does: a
/// truncated file or bytes that are not protobuf are caught here with the byte offset
/// (the decoder's own message does not say where).
fn wire_problem(bytes: &[u8]) -> Option<String> {
    if bytes.is_empty() {
        return Some("the file is empty".into());
    }
    let varint = |at: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *bytes.get(*at)?;
            *at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    };
    let mut at = 0usize;
    while at < bytes.len() {
        let start = at;
        let Some(key) = varint(&mut at) else {
            return Some(format!(
                "byte {start}: a field key runs past the end of the file (truncated?)"
            ));
        };
        let (field, wire) = (key >> 3, key & 7);
        // ModelProto's fields (onnx.proto): anything else means these are not its bytes.
        if !matches!(field, 1..=8 | 14 | 20 | 25 | 26) {
            return Some(format!(
                "byte {start}: field number {field} is not one of ModelProto's (not protobuf, or not an ONNX model)"
            ));
        }
        let rest = bytes.len() - at.min(bytes.len());
        let skip = match wire {
            0 => {
                if varint(&mut at).is_none() {
                    return Some(format!("byte {start}: field {field}'s value runs past the end of the file (truncated?)"));
                }
                0
            }
            1 => 8,
            5 => 4,
            2 => {
                let vstart = at;
                let Some(len) = varint(&mut at) else {
                    return Some(format!("byte {vstart}: field {field}'s length runs past the end of the file (truncated?)"));
                };
                let rest = bytes.len() - at.min(bytes.len());
                if len > rest as u64 {
                    return Some(format!(
                        "byte {start}: field {field} says it holds {len} bytes but only {rest} remain (the file is truncated)"
                    ));
                }
                len as usize
            }
            w => {
                return Some(format!(
                    "byte {start}: wire type {w} of field {field} is not valid protobuf"
                ))
            }
        };
        if (wire == 1 || wire == 5) && skip > rest {
            return Some(format!(
                "byte {start}: field {field} needs {skip} bytes but only {rest} remain (the file is truncated)"
            ));
        }
        at += skip;
    }
    None
}

impl fmt::Display for Stages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stages::One => write!(f, "one stage"),
            Stages::Attributes => write!(f, "the file's __pipeline_stage attributes"),
            Stages::After(names) => write!(f, "boundaries after {}", names.join(", ")),
            Stages::PerNode(_) => write!(f, "a stage per node"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_and_garbage_are_located() {
        // A ModelProto with ir_version 8 and a graph field claiming 100 bytes.
        let mut bytes = vec![0x08, 0x08, 0x3a, 100];
        bytes.extend_from_slice(&[0u8; 10]);
        let msg = wire_problem(&bytes).unwrap();
        assert!(msg.contains("byte 2") && msg.contains("truncated"), "{msg}");
        let msg = wire_problem(b"hello, world").unwrap();
        assert!(msg.starts_with("byte 0"), "{msg}");
        assert_eq!(wire_problem(&[0x08, 0x08]), None);
    }

    #[test]
    fn a_graph_without_outputs_is_refused_naming_the_file() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/onnx/cnn.onnx"
        ));
        let bytes = std::fs::read(path).unwrap();
        let mut proto = proto::ModelProto::decode(bytes.as_slice()).unwrap();
        assert!(OnnxModel::from_bytes(&bytes, path).is_ok());
        proto.graph.as_mut().unwrap().output.clear();
        let Err(err) = OnnxModel::from_bytes(&proto.encode_to_vec(), Path::new("m.onnx")) else {
            panic!("a graph without outputs was accepted");
        };
        let err = err.to_string();
        assert!(
            err.starts_with("m.onnx: the graph declares no outputs"),
            "{err}"
        );
    }

    /// A model whose nodes are all of `ai.onnx.ml` (as skl2onnx writes a scaler and a tree
    /// ensemble) is refused naming the domain and its ops, not as undecodable bytes.
    #[test]
    fn a_model_of_another_domain_names_the_domain_and_its_ops() {
        let node = |op: &str| proto::NodeProto {
            op_type: Some(op.into()),
            domain: Some("ai.onnx.ml".into()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            ..Default::default()
        };
        let proto = proto::ModelProto {
            opset_import: vec![proto::OperatorSetIdProto {
                domain: Some("ai.onnx.ml".into()),
                version: Some(3),
            }],
            graph: Some(proto::GraphProto {
                node: vec![
                    node("Scaler"),
                    node("TreeEnsembleClassifier"),
                    node("Scaler"),
                ],
                output: vec![proto::ValueInfoProto {
                    name: Some("y".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = OnnxModel::from_bytes(&proto.encode_to_vec(), Path::new("m.onnx"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("m.onnx: every node is of another domain than the default ONNX one (ai.onnx.ml 3: ai.onnx.ml.Scaler, ai.onnx.ml.TreeEnsembleClassifier)"),
            "{err}"
        );
        assert!(!err.contains("not an ONNX model"), "{err}");
    }

    /// A graph of `(name, inputs, outputs)` nodes over graph input `x` and initializer `w`.
    fn graph(nodes: &[(&str, &[&str], &[&str])]) -> proto::GraphProto {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        proto::GraphProto {
            node: nodes
                .iter()
                .map(|(name, i, o)| proto::NodeProto {
                    name: Some(name.to_string()),
                    op_type: Some("Add".into()),
                    input: s(i),
                    output: s(o),
                    ..Default::default()
                })
                .collect(),
            input: vec![proto::ValueInfoProto {
                name: Some("x".into()),
                ..Default::default()
            }],
            initializer: vec![proto::TensorProto {
                name: Some("w".into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn graphs_are_checked_as_onnx_checker_does() {
        validate_graph(&graph(&[
            ("a", &["x", "w"], &["t"]),
            ("b", &["t", ""], &["u"]),
        ]))
        .unwrap();
        // An initializer that is also a graph input is one tensor.
        let mut g = graph(&[("a", &["x", "w"], &["t"])]);
        g.initializer[0].name = Some("x".into());
        validate_graph(&g).unwrap();
        let e = validate_graph(&graph(&[("a", &["x"], &["t"]), ("b", &["x"], &["t"])]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`t` is made by both node `a` and node `b`"),
            "{e}"
        );
        let e = validate_graph(&graph(&[("a", &["x"], &["w"])]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("an initializer and node `a`"), "{e}");
        // A ring is a cycle, named in the data's order; a later producer alone is an order.
        let e = validate_graph(&graph(&[
            ("a", &["x", "v"], &["t"]),
            ("b", &["t"], &["u"]),
            ("c", &["u"], &["v"]),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("nodes `a` -> `b` -> `c` -> `a` form a cycle"),
            "{e}"
        );
        let e = validate_graph(&graph(&[("a", &["t"], &["t"])]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`a` -> `a` form a cycle"), "{e}");
        let e = validate_graph(&graph(&[("a", &["u"], &["t"]), ("b", &["x"], &["u"])]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("node `a` reads `u` before node `b` makes it"),
            "{e}"
        );
    }
}
