//! [`EstimateOptions`]: every option of an estimate, in one serde type that the command
//! line, sweep specs, whole-model calibration entries and Python fill alike.

use serde::{Deserialize, Serialize};
use tessera_core::schedule::Schedule;
use tessera_core::DType;
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::planner::PartialsType;

use super::system::System;
use super::EstimateError;
use crate::compile::onnx::LossKind;
use crate::compile::{OptimizerKind, SessionOptions};
use crate::model::TrainingDefaults;
use crate::names::{named, parser};
pub use tessera_sim::techniques::serialization::MAX_EMBEDDING_SERIALIZATION;
use tessera_sim::techniques::{
    distributed_norm, offload, serialization, sharding, Checkpoints, MemoryProportion, Offload,
    Recompute, Techniques,
};

/// How a model is estimated: `tessera estimate`'s options, named as its flags are with
/// underscores for dashes (`batch_size` is `--batch-size`). A value left out takes the model
/// file's, else Tessera's default; every field is optional in serde.
///
/// Each option is declared here once: its field, its flag and help (clap, from the doc
/// comment), and how serde reads it for sweeps, model files and Python. A flag that has a
/// `no_` form on the command line and an automatic default (`offload_optimizer_state`,
/// `replicated_tensor_sharding`) is `Option<bool>`: `Some(true)` asks for it, `Some(false)`
/// refuses it, `None` takes the default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct EstimateOptions {
    /// Samples per micro-batch [default: the model file's, else 32; an ONNX file's batch].
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Micro-batches per weight update, M [default: the model file's, else 1; pipelines:
    /// the least their schedule takes]. Pipelines of model files take TensorFlow's rule (a
    /// multiple of the overlap, 2 x stages for Grouped training), of ONNX models PopART's
    /// (at least 2 x stages - 1).
    #[arg(long)]
    pub gradient_accumulation_count: Option<usize>,
    /// Weight updates per execution of the on-device loop, R [default: one pass over the
    /// data's worth of updates].
    #[arg(long, conflicts_with = "steps_per_execution")]
    pub repeat_count: Option<usize>,
    /// Micro-batches per execution, K (Keras' steps_per_execution; a multiple of M).
    #[arg(long)]
    pub steps_per_execution: Option<usize>,
    /// Pipeline schedule [default: the model file's, else grouped].
    #[arg(long, value_parser = parser::<Schedule>())]
    #[serde(with = "named::option")]
    pub pipeline_schedule: Option<Schedule>,
    /// Put every layer on one IPU (ignore the model's pipeline stages).
    #[arg(long)]
    pub no_pipelining: bool,
    /// Replicas of the whole model, each with its own data. On Mk2 and Bow, replicas beyond one
    /// IPU-Link domain (64 IPUs) take the pod they need (IPU-POD128, Bow Pod256, ...), and
    /// their all-reduce crosses its gateways; the report names the system [default: 1; with
    /// --system, as many as the system holds].
    #[arg(long)]
    pub replicas: Option<usize>,
    /// IPU generation.
    #[arg(long, value_parser = parser::<Preset>(), default_value = "mk2")]
    #[serde(with = "named")]
    pub ipu: Preset,
    /// A Graphcore system: its IPU generation and IPU count. Replicas fill it: each takes the
    /// pipeline IPUs given, else the fewest (a power of two) an automatic split of an ONNX
    /// model fits on.
    #[arg(long, value_parser = parser::<System>(), conflicts_with = "ipu")]
    #[serde(with = "named::option")]
    pub system: Option<System>,
    /// Optimizer (momentum is 0.9) [default: the model file's, else sgd].
    #[arg(long, value_parser = parser::<OptimizerKind>())]
    #[serde(with = "named::option")]
    pub optimizer: Option<OptimizerKind>,
    /// Learning rate [default: the model file's for its optimizer, else 0.1 for sgd, 0.01 for
    /// momentum, 0.001 for adam].
    #[arg(long)]
    pub learning_rate: Option<f32>,
    /// Keep optimizer state in streaming memory (remote buffers), loaded for each update.
    /// On by default (TensorFlow's offload_weight_update_variables) for pipelined models and
    /// gradient accumulation when the machine has remote buffers.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide_possible_values = true)]
    pub offload_optimizer_state: Option<bool>,
    /// Element type of weights and activations.
    #[arg(long, value_parser = parser::<DType>(), default_value = "f32")]
    #[serde(with = "named")]
    pub dtype: DType,
    /// Type of matmuls' and convolutions' partial sums: Poplar's `partialsType` (TensorFlow
    /// `set_matmul_options` / `set_convolution_options({'partialsType': 'half'})`, PopART
    /// `partialsTypeMatMuls`, PopTorch `Precision.setPartialsType`) [default: the model
    /// file's, else float]. Half applies to f16 products only.
    #[arg(long, value_parser = parser::<PartialsType>())]
    #[serde(with = "named::option")]
    pub partials_type: Option<PartialsType>,
    /// Element type of the gradient accumulators: TensorFlow's `gradient_accumulation_dtype`
    /// (pipelining and `GradientAccumulationOptimizerV2`), PopART's `accumType` [default: the
    /// model file's, else the weights' type, TensorFlow's and PopART SGD's default].
    #[arg(long, value_parser = parser::<DType>())]
    #[serde(with = "named::option")]
    pub gradient_accumulation_dtype: Option<DType>,
    /// Share of each tile a matmul's or convolution's temporary memory may take in the
    /// planner's first pass: poplin's `availableMemoryProportion` (TensorFlow
    /// `set_matmul_options` / `set_convolution_options`, PopART per-IPU
    /// `availableMemoryProportion`, PopTorch `setAvailableMemoryProportion`). One value, or one
    /// per pipeline stage `P0,P1,...` [default: the model file's, else 0.6].
    #[arg(long, value_delimiter = ',', value_parser = proportion)]
    #[serde(deserialize_with = "one_or_many")]
    pub available_memory_proportion: Vec<f64>,
    /// Training: keep only these forward activations for the backward pass and recompute the
    /// rest from them, segment by segment (PopART's recomputation with checkpoints, TensorFlow
    /// `recomputation_checkpoint`, PopTorch `recomputationCheckpoint`). `auto`: one at the
    /// output of each repeated block (each residual block, each transformer sublayer), as
    /// PopTorch's `recompute_checkpoint_every_layer`; or node names, comma-separated. Works
    /// with one stage on one IPU too.
    #[arg(long, value_delimiter = ',')]
    #[serde(deserialize_with = "names")]
    pub recompute_checkpoints: Vec<String>,
    /// Shard the optimizer state and its update over the replicas (TensorFlow
    /// `replicated_optimizer_state_sharding`, PopART `replicatedTensorSharding`): each replica
    /// keeps and updates its share of every variable of 8192 elements or more (offloaded state:
    /// loads and stores its share; state on the tiles, as PopART allows: holds its share
    /// there); the gradients' all-reduce becomes a reduce-scatter and an all-gather of the
    /// weights. On by default wherever the state is offloaded and there are several replicas:
    /// TensorFlow's default for it is the offload setting.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", hide_possible_values = true)]
    pub replicated_tensor_sharding: Option<bool>,
    /// Turn code reuse off (PopART `enableOutlining=false`; on by default, as in Poplar,
    /// PopART and TensorFlow): without it, every repeat of an identical layer has its own
    /// vertex state, exchange code and control code, and no call copies its tensors in and
    /// out.
    #[arg(long)]
    pub no_outlining: bool,
    /// Run the products over the vocabulary in N serial pieces (PopTorch
    /// `embedding_serialization_factor`, PopART `serializeMatMul`): the masked-LM projection and
    /// its gradients over the largest gathered table's rows, each piece bringing and making its
    /// share, so their temporary memory is about 1/N [default: the model file's, else 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_EMBEDDING_SERIALIZATION))]
    pub embedding_serialization: Option<u64>,
    /// Distributed batch norm (TensorFlow `distributed_batch_norm_replica_group_size`, the
    /// `BN_span` of Graphcore's MLPerf ResNet-50): each batch norm sums its statistics, and
    /// their gradients, over groups of N consecutive replicas, an all-reduce in every batch
    /// norm whose every step syncs all the replicas' IPUs. N divides the replicas [default: 1,
    /// none].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub distributed_batch_norm: Option<u64>,
    /// Keep the pipeline stash in streaming memory (TensorFlow `offload_activations`): each
    /// stage stores the activations it stashes after its forward pass and loads them before
    /// its backward pass, so they hold no tile memory in between.
    #[arg(long)]
    pub offload_activations: bool,
    /// Keep the gradient accumulators in streaming memory (TensorFlow
    /// `offload_gradient_accumulation_buffers`): each accumulation loads, adds into and stores
    /// its accumulator, which holds tile memory only while it runs.
    #[arg(long)]
    pub offload_gradient_accumulation_buffers: bool,
    /// ONNX models, inference: compile the graph as the file has it, without the rewrites
    /// inference compilers make (PopRT, onnxruntime's graph optimiser): a batch norm that
    /// reads a convolution's only output is folded into its weights and bias.
    #[arg(long)]
    pub no_inference_rewrites: bool,
    /// Estimate inference (the forward pass with the inference schedule) instead of training.
    #[arg(long)]
    pub inference: bool,
    /// Recompute each pipeline stage's forward pass before its backward pass instead of
    /// stashing its activations.
    #[arg(long)]
    pub recompute: bool,
    /// ONNX models: a new pipeline stage (and IPU) after each named node (or the node making
    /// the named tensor), comma-separated in graph order.
    #[arg(long, value_delimiter = ',', conflicts_with = "pipeline_ipus")]
    #[serde(deserialize_with = "names")]
    pub pipeline_stages: Vec<String>,
    /// ONNX models: the IPU of each pipeline stage, comma-separated (TensorFlow's
    /// `device_mapping`, PopART's `virtualGraph`) [default: the file's `ipu` attributes, else
    /// stage k on IPU k]. Stages sharing an IPU run one after another, and the estimate gives
    /// each one's memory on its own: its steps' code, the variables they touch and its tiles'
    /// peak over them, as PopLiner attributes a profiled program to layer ranges.
    #[arg(long, value_delimiter = ',', requires = "pipeline_stages")]
    #[serde(deserialize_with = "indices")]
    pub device_mapping: Vec<usize>,
    /// ONNX models: split into N pipeline stages on N IPUs automatically, balancing the
    /// stages' cycles within each IPU's memory.
    #[arg(long)]
    pub pipeline_ipus: Option<usize>,
    /// ONNX models: the repeated blocks (transformer layers, residual blocks) on each IPU,
    /// comma-separated, PopTorch's and Optimum Graphcore's `layers_per_ipu`. The embeddings
    /// or the stem go with the first IPU and a masked-LM head with the embedding: `0,4,4,4`
    /// is Graphcore's BERT-Base phase-1 split, `3,7,7,7` its BERT-Large one.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["pipeline_stages", "pipeline_ipus"])]
    #[serde(deserialize_with = "indices")]
    pub layers_per_ipu: Vec<usize>,
    /// ONNX models: the whole shape of a graph input, NAME=D0,D1,... (repeat for several),
    /// as trtexec's `--shapes` and onnxruntime's free-dimension overrides bind them: the
    /// sequence length of a transformer, say. It stands as given, its batch axis included;
    /// `--batch-size` binds the batch of the other inputs.
    #[arg(long = "input-shape", value_name = "NAME=D0,D1,...", value_parser = input_shape)]
    #[serde(alias = "input_shape")]
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// ONNX models: when the model does not fit, do not search for the fewest IPUs an
    /// automatic split fits on (the search makes several estimates; sweeps want only this one).
    #[arg(long)]
    pub no_search: bool,
    /// ONNX models: the loss of training [default: auto, by the output's shape].
    #[arg(long, value_parser = parser::<LossKind>())]
    #[serde(with = "named::option")]
    pub loss: Option<LossKind>,
    /// ONNX models, masked-LM loss: masked positions per sequence that the head projects
    /// onto the vocabulary (BERT's `max_predictions_per_seq`, Graphcore's `mask_tokens`)
    /// [default: 15% of the sequence, rounded up: 20 for 128 tokens].
    #[arg(long)]
    pub mask_tokens: Option<usize>,
}

/// One option as [`EstimateOptions::help`] describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionHelp {
    /// Its name (serde's; the flag's with underscores for dashes).
    pub name: String,
    /// Its command-line flag, without the dashes (`input-shape` for `input_shapes`).
    pub flag: String,
    /// What it does.
    pub help: String,
    /// The names it takes, when it is a choice.
    pub values: Vec<String>,
    /// Its value when left out, when that is one fixed value.
    pub default: Option<String>,
    /// What TensorFlow for the IPU, PopART and PopTorch call it, where they have it
    /// ([`FRAMEWORK_NAMES`]).
    pub frameworks: Option<&'static str>,
}

impl OptionHelp {
    /// The option's row of [`EstimateOptions::markdown_table`].
    fn markdown_row(&self) -> String {
        let help = self.help.split_whitespace().collect::<Vec<_>>().join(" ");
        // A `[default: ...]` in the help goes to the default column.
        let (text, bracket) = match help.find(" [default: ") {
            Some(at) => {
                let rest = &help[at + " [default: ".len()..];
                let end = rest.rfind(']').unwrap_or(rest.len());
                let after = rest.get(end + 1..).unwrap_or("");
                (
                    format!("{}{after}", &help[..at]),
                    Some(rest[..end].to_string()),
                )
            }
            None => (help.clone(), None),
        };
        let mut sentences = text.split_inclusive(". ");
        let mut what = sentences.next().unwrap_or("").trim().to_string();
        // An automatic default is said in a sentence of its own.
        let automatic = sentences
            .find(|x| x.starts_with("On by default"))
            .map(|x| format!("on{}", x.trim().trim_start_matches("On by default")));
        if !self.values.is_empty() {
            let names: Vec<String> = self.values.iter().map(|v| format!("`{v}`")).collect();
            what = format!(
                "{}. One of {}.",
                what.trim_end_matches('.'),
                names.join(", ")
            );
        }
        let default = self.default.clone().or(bracket).or(automatic);
        let cell = |s: &str| s.replace('|', "\\|");
        format!(
            "| `--{}` (`{}`) | {} | {} | {} |",
            self.flag,
            self.name,
            cell(&what),
            cell(&default.unwrap_or_default()),
            self.frameworks.map(cell).unwrap_or_default()
        )
    }
}

/// What Graphcore's frameworks call each option that has a counterpart there: TensorFlow for
/// the IPU (`TF`, its Keras and pipelining APIs), PopART and PopTorch (with Optimum Graphcore's
/// names for PopTorch models).
pub const FRAMEWORK_NAMES: &[(&str, &str)] = &[
    ("batch_size", "TF: the dataset's `batch`; PopTorch: `DataLoader(batch_size)`"),
    ("gradient_accumulation_count", "TF `gradient_accumulation_count`; PopART `accumulationFactor`; PopTorch `Training.gradientAccumulation`"),
    ("repeat_count", "TF `repeat_count` (`loops.repeat`, pipelining); PopTorch `deviceIterations`"),
    ("steps_per_execution", "Keras `steps_per_execution`; PopART `batchesPerStep`"),
    ("pipeline_schedule", "TF `pipeline_schedule` (`PipelineSchedule`)"),
    ("no_pipelining", "PopART `enablePipelining = false`"),
    ("replicas", "TF `replication_factor`; PopART `replicatedGraphCount`; PopTorch `replicationFactor`"),
    ("ipu", "the device: TF `IPUConfig.device_connection.version`"),
    ("optimizer", "TF `tf.keras.optimizers`; PopART `SGD` / `Adam`; PopTorch `poptorch.optim`"),
    ("learning_rate", "the optimizer's `learning_rate` / `lr`"),
    ("offload_optimizer_state", "TF `offload_weight_update_variables`; PopART `optimizerStateTensorLocationSettings`; PopTorch `TensorLocations.setOptimizerLocation`"),
    ("dtype", "TF `float16` models; PopART fp16 graphs; PopTorch `model.half()`"),
    ("partials_type", "TF `set_matmul_options({'partialsType'})`; PopART `partialsTypeMatMuls`; PopTorch `Precision.setPartialsType`"),
    ("gradient_accumulation_dtype", "TF `gradient_accumulation_dtype`; PopART `accumType`; PopTorch `accum_type`"),
    ("available_memory_proportion", "TF `set_matmul_options({'availableMemoryProportion'})`; PopART `availableMemoryProportion`; PopTorch `setAvailableMemoryProportion`"),
    ("recompute_checkpoints", "TF `recomputation_checkpoint`; PopART `recomputeOutput` checkpoints; PopTorch `recomputationCheckpoint`"),
    ("replicated_tensor_sharding", "TF `replicated_optimizer_state_sharding`; PopART `replicatedTensorSharding`; PopTorch `useReplicatedTensorSharding`"),
    ("no_outlining", "PopART `enableOutlining = false`"),
    ("embedding_serialization", "PopART `serializeMatMul`; PopTorch `embedding_serialization_factor`"),
    ("distributed_batch_norm", "TF `distributed_batch_norm_replica_group_size`"),
    ("offload_activations", "TF `offload_activations`; PopART `activationTensorLocationSettings`; PopTorch `setActivationLocation`"),
    ("offload_gradient_accumulation_buffers", "TF `offload_gradient_accumulation_buffers`; PopART `accumulatorTensorLocationSettings`; PopTorch `setAccumulatorLocation`"),
    ("inference", "TF an inference loop; PopART `InferenceSession`; PopTorch `inferenceModel`"),
    ("recompute", "TF `allow_recompute`; PopART `RecomputationType.Pipeline`"),
    ("pipeline_stages", "TF computational stages; PopART `pipelineStage`; PopTorch `BeginBlock`"),
    ("device_mapping", "TF `device_mapping`; PopART `virtualGraph`; PopTorch `BeginBlock(ipu_id)`"),
    ("layers_per_ipu", "PopTorch (Optimum Graphcore) `layers_per_ipu`"),
    ("mask_tokens", "Graphcore's BERT `mask_tokens`; BERT `max_predictions_per_seq`"),
];

/// The options only an estimate takes (not `train`, `evaluate` or `predict`, which run a
/// model file's training or inference).
pub const ESTIMATE_ONLY: &[&str] = &[
    "system",
    "no_inference_rewrites",
    "inference",
    "recompute",
    "pipeline_stages",
    "device_mapping",
    "pipeline_ipus",
    "layers_per_ipu",
    "input_shapes",
    "no_search",
    "loss",
    "mask_tokens",
];

/// A proportion in (0, 1], as poplin's `availableMemoryProportion` must be.
fn proportion(s: &str) -> Result<f64, String> {
    let p: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    tessera_sim::planner::check_proportion(p).map(|()| p)
}

/// One input's whole shape, `NAME=D0,D1,...`.
fn input_shape(s: &str) -> Result<(String, Vec<usize>), String> {
    let (name, dims) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=D0,D1,..."))?;
    if name.is_empty() {
        return Err(format!("`{s}`: the input's name is missing"));
    }
    let dims = dims
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{s}`: `{d}` is not a size"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), dims))
}

impl Default for EstimateOptions {
    fn default() -> Self {
        EstimateOptions {
            batch_size: None,
            gradient_accumulation_count: None,
            repeat_count: None,
            steps_per_execution: None,
            pipeline_schedule: None,
            no_pipelining: false,
            replicas: None,
            ipu: Preset::Mk2,
            system: None,
            optimizer: None,
            learning_rate: None,
            offload_optimizer_state: None,
            dtype: DType::F32,
            partials_type: None,
            gradient_accumulation_dtype: None,
            available_memory_proportion: Vec::new(),
            recompute_checkpoints: Vec::new(),
            replicated_tensor_sharding: None,
            no_outlining: false,
            embedding_serialization: None,
            distributed_batch_norm: None,
            offload_activations: false,
            offload_gradient_accumulation_buffers: false,
            no_inference_rewrites: false,
            inference: false,
            recompute: false,
            pipeline_stages: Vec::new(),
            device_mapping: Vec::new(),
            pipeline_ipus: None,
            layers_per_ipu: Vec::new(),
            input_shapes: Vec::new(),
            no_search: false,
            loss: None,
            mask_tokens: None,
        }
    }
}

/// A list of numbers, or one number as a list of one.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(f64),
        Many(Vec<f64>),
    }
    match OneOrMany::deserialize(d) {
        Ok(OneOrMany::One(x)) => Ok(vec![x]),
        Ok(OneOrMany::Many(v)) => Ok(v),
        Err(_) => Err(serde::de::Error::custom(
            "expected a number, or an array of numbers (one per pipeline stage)",
        )),
    }
}

/// Names: an array of strings, or one string of comma-separated names (as the command line
/// takes them).
fn names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        One(String),
        Many(Vec<String>),
    }
    match Names::deserialize(d) {
        Ok(Names::One(s)) => Ok(split(&s).map(str::to_string).collect()),
        Ok(Names::Many(v)) => Ok(v),
        Err(_) => Err(serde::de::Error::custom(
            "expected names: an array of strings, or one comma-separated string",
        )),
    }
}

/// Whole numbers: an array, or one string of comma-separated numbers.
fn indices<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<usize>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Indices {
        One(String),
        Many(Vec<usize>),
    }
    let wrong = || {
        serde::de::Error::custom("expected whole numbers: an array, or one comma-separated string")
    };
    match Indices::deserialize(d) {
        Ok(Indices::One(s)) => split(&s)
            .map(|n| n.parse::<usize>().map_err(|_| wrong()))
            .collect(),
        Ok(Indices::Many(v)) => Ok(v),
        Err(_) => Err(wrong()),
    }
}

/// The non-empty, trimmed parts of a comma-separated list.
fn split(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|p| !p.is_empty())
}

impl EstimateOptions {
    /// The options a map of option names to values sets (a sweep configuration, Python's
    /// keyword arguments), checked: an unknown name, or a value of the wrong type, is an
    /// error naming the option.
    pub fn from_map(
        map: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<EstimateOptions, EstimateError> {
        for (k, v) in map {
            Self::value(k, v)?;
        }
        let o: EstimateOptions = serde_json::from_value(serde_json::Value::Object(map.clone()))
            .map_err(|e| EstimateError::Options(e.to_string()))?;
        o.check()?;
        Ok(o)
    }

    /// Every option's name (serde's, the flag's with underscores), sorted.
    pub fn names() -> Vec<String> {
        match serde_json::to_value(EstimateOptions::default()) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// Every option with what it does, in the order `tessera estimate --help` lists them:
    /// the help is the field's doc comment, as the flag's.
    pub fn help() -> Vec<OptionHelp> {
        use clap::Args;
        let cmd = EstimateOptions::augment_args(clap::Command::new("options"));
        cmd.get_arguments()
            .map(|a| OptionHelp {
                name: a.get_id().to_string(),
                flag: a.get_long().unwrap_or(a.get_id().as_str()).to_string(),
                help: a
                    .get_long_help()
                    .or(a.get_help())
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                values: match a.is_hide_possible_values_set() {
                    true => Vec::new(),
                    false => a
                        .get_possible_values()
                        .iter()
                        .map(|v| v.get_name().to_string())
                        .collect(),
                },
                default: match a.get_action() {
                    clap::ArgAction::SetTrue => Some("off".to_string()),
                    _ => a
                        .get_default_values()
                        .first()
                        .map(|d| d.to_string_lossy().into_owned()),
                },
                frameworks: FRAMEWORK_NAMES
                    .iter()
                    .find(|(n, _)| *n == a.get_id().as_str())
                    .map(|(_, f)| *f),
            })
            .collect()
    }

    /// Every option as one row of a Markdown table (the README's): the flag and keyword,
    /// what it does (its help's first sentence, and the names it takes), its default, and
    /// its frameworks' names.
    pub fn markdown_table() -> String {
        let mut t = String::from(
            "| option (keyword) | what it does | default | TensorFlow / PopART / PopTorch |\n|---|---|---|---|\n",
        );
        for h in Self::help() {
            t.push_str(&h.markdown_row());
            t.push('\n');
        }
        t
    }

    /// `message` with each command-line flag of an option (`--batch-size`, `--no-search`)
    /// written as the option's keyword (`batch_size`, `no_search`): how Python and sweep specs
    /// name it. Other `--` words (of other commands) stay as they are.
    pub fn as_keywords(message: &str) -> String {
        let names = Self::names();
        let mut out = String::with_capacity(message.len());
        let mut rest = message;
        while let Some(at) = rest.find("--") {
            out.push_str(&rest[..at]);
            let after = &rest[at + 2..];
            let len = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(after.len());
            let flag = &after[..len];
            let keyword = match flag.replace('-', "_") {
                k if k == "input_shape" => Some("input_shapes".to_string()),
                k if names.contains(&k) => Some(k),
                // `--no-offload-optimizer-state` refuses what `offload_optimizer_state` asks.
                k => k
                    .strip_prefix("no_")
                    .filter(|rest| names.iter().any(|n| n == rest))
                    .map(|rest| format!("{rest}=False")),
            };
            match keyword {
                Some(k) => out.push_str(&k),
                None => {
                    out.push_str("--");
                    out.push_str(flag);
                }
            }
            rest = &after[len..];
        }
        out.push_str(rest);
        out
    }

    /// Value `v` of option `name`, checked on its own (its type and range; what it says
    /// with other options is [`EstimateOptions::check`]'s), in the form the option holds
    /// it: a list given as one comma-separated string is that list. An unknown name, or a
    /// wrong value, is an error naming the option.
    pub fn value(name: &str, v: &serde_json::Value) -> Result<serde_json::Value, EstimateError> {
        let bad = |e: &dyn std::fmt::Display| EstimateError::Options(format!("{name}: {e}"));
        let names = Self::names();
        if !names.iter().any(|n| n == name) && name != "input_shape" {
            return Err(EstimateError::Options(format!(
                "unknown option `{name}`; the options are {}",
                names.join(", ")
            )));
        }
        let one = serde_json::Map::from_iter([(name.to_string(), v.clone())]);
        let o: EstimateOptions =
            serde_json::from_value(serde_json::Value::Object(one)).map_err(|e| bad(&e))?;
        o.check_values()?;
        let held = serde_json::to_value(&o).map_err(|e| bad(&e))?;
        Ok(match (v, held.get(name)) {
            (serde_json::Value::String(_), Some(list @ serde_json::Value::Array(_))) => {
                list.clone()
            }
            _ => v.clone(),
        })
    }

    /// Checks what the options say together, before any work: exclusive options, options
    /// one needs another for, and values out of range. (The command line's parser checks
    /// the same; this is for the other ways in.)
    pub fn check(&self) -> Result<(), EstimateError> {
        self.check_values()?;
        let bad = |m: &str| Err(EstimateError::Options(m.to_string()));
        if self.repeat_count.is_some() && self.steps_per_execution.is_some() {
            return bad("repeat_count and steps_per_execution exclude each other: give one");
        }
        let placements = [
            !self.pipeline_stages.is_empty(),
            self.pipeline_ipus.is_some(),
            !self.layers_per_ipu.is_empty(),
        ];
        if placements.iter().filter(|&&p| p).count() > 1 {
            return bad(
                "pipeline_stages, pipeline_ipus and layers_per_ipu exclude each other: give one",
            );
        }
        if !self.device_mapping.is_empty() && self.pipeline_stages.is_empty() {
            return bad("device_mapping needs pipeline_stages (the stages it maps to IPUs)");
        }
        Ok(())
    }

    /// Checks each option's value on its own: counts at least 1, proportions in (0, 1], the
    /// serialization factor in range.
    fn check_values(&self) -> Result<(), EstimateError> {
        let bad = |m: &str| Err(EstimateError::Options(m.to_string()));
        let counts = [
            ("batch_size", self.batch_size),
            (
                "gradient_accumulation_count",
                self.gradient_accumulation_count,
            ),
            ("repeat_count", self.repeat_count),
            ("steps_per_execution", self.steps_per_execution),
            ("replicas", self.replicas),
            ("pipeline_ipus", self.pipeline_ipus),
            ("mask_tokens", self.mask_tokens),
            (
                "distributed_batch_norm",
                self.distributed_batch_norm.map(|n| n as usize),
            ),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, n)| *n == Some(0)) {
            return bad(&format!("{name}: must be at least 1"));
        }
        for &p in &self.available_memory_proportion {
            tessera_sim::planner::check_proportion(p)
                .map_err(|e| EstimateError::Options(format!("available_memory_proportion: {e}")))?;
        }
        if let Some(n) = self.embedding_serialization {
            serialization::check(n)
                .map_err(|e| EstimateError::Options(format!("embedding_serialization: {e}")))?;
        }
        Ok(())
    }

    /// Whether an option for ONNX models only is set (a model file places its layers with
    /// `stage`).
    pub(crate) fn onnx_only(&self) -> bool {
        !self.pipeline_stages.is_empty()
            || self.pipeline_ipus.is_some()
            || !self.layers_per_ipu.is_empty()
            || !self.input_shapes.is_empty()
            || self.loss.is_some()
            || self.no_search
    }

    /// The options a model file's `[training]` table sets, read as every other way in reads
    /// them (an unknown name, or a wrong value, is an error naming the model and the option).
    pub fn from_model_file(
        t: &TrainingDefaults,
        model: &str,
    ) -> Result<EstimateOptions, EstimateError> {
        Self::from_map(&t.options)
            .map_err(|e| EstimateError::Options(format!("model `{model}`: {e}")))
    }

    /// These options over model `model`'s `[training]` table `t`: see [`EstimateOptions::over`].
    pub fn for_model(
        &self,
        t: &TrainingDefaults,
        model: &str,
    ) -> Result<EstimateOptions, EstimateError> {
        Ok(self.over(&EstimateOptions::from_model_file(t, model)?))
    }

    /// These options over a model's own (`file`, what its `[training]` table or its ONNX
    /// file's batch sets): each option these leave unset takes the file's; a flag either
    /// sets is set. A model's learning rate goes with its optimizer: it stands when these
    /// options ask for no other optimizer. The options a model does not set (`replicas`,
    /// `ipu`, `dtype`) are these'.
    pub fn over(&self, file: &EstimateOptions) -> EstimateOptions {
        // Every field by name, so that a new option does not compile until it is merged.
        let EstimateOptions {
            batch_size,
            gradient_accumulation_count,
            repeat_count,
            steps_per_execution,
            pipeline_schedule,
            no_pipelining,
            replicas,
            ipu,
            system,
            optimizer,
            learning_rate,
            offload_optimizer_state,
            dtype,
            partials_type,
            gradient_accumulation_dtype,
            available_memory_proportion,
            recompute_checkpoints,
            replicated_tensor_sharding,
            no_outlining,
            embedding_serialization,
            distributed_batch_norm,
            offload_activations,
            offload_gradient_accumulation_buffers,
            no_inference_rewrites,
            inference,
            recompute,
            pipeline_stages,
            device_mapping,
            pipeline_ipus,
            layers_per_ipu,
            input_shapes,
            no_search,
            loss,
            mask_tokens,
        } = self.clone();
        fn list<T: Clone>(mine: Vec<T>, theirs: &[T]) -> Vec<T> {
            if mine.is_empty() {
                theirs.to_vec()
            } else {
                mine
            }
        }
        let same_optimizer = file
            .optimizer
            .is_none_or(|f| optimizer.is_none_or(|o| o == f));
        EstimateOptions {
            batch_size: batch_size.or(file.batch_size),
            gradient_accumulation_count: gradient_accumulation_count
                .or(file.gradient_accumulation_count),
            repeat_count: repeat_count.or(file.repeat_count),
            steps_per_execution: steps_per_execution.or(file.steps_per_execution),
            pipeline_schedule: pipeline_schedule.or(file.pipeline_schedule),
            no_pipelining: no_pipelining || file.no_pipelining,
            replicas,
            ipu,
            system,
            optimizer: optimizer.or(file.optimizer),
            learning_rate: learning_rate.or(file.learning_rate.filter(|_| same_optimizer)),
            offload_optimizer_state: offload_optimizer_state.or(file.offload_optimizer_state),
            dtype,
            partials_type: partials_type.or(file.partials_type),
            gradient_accumulation_dtype: gradient_accumulation_dtype
                .or(file.gradient_accumulation_dtype),
            available_memory_proportion: list(
                available_memory_proportion,
                &file.available_memory_proportion,
            ),
            recompute_checkpoints: list(recompute_checkpoints, &file.recompute_checkpoints),
            replicated_tensor_sharding: replicated_tensor_sharding
                .or(file.replicated_tensor_sharding),
            no_outlining: no_outlining || file.no_outlining,
            embedding_serialization: embedding_serialization.or(file.embedding_serialization),
            distributed_batch_norm: distributed_batch_norm.or(file.distributed_batch_norm),
            offload_activations: offload_activations || file.offload_activations,
            offload_gradient_accumulation_buffers: offload_gradient_accumulation_buffers
                || file.offload_gradient_accumulation_buffers,
            no_inference_rewrites: no_inference_rewrites || file.no_inference_rewrites,
            inference: inference || file.inference,
            recompute: recompute || file.recompute,
            pipeline_stages: list(pipeline_stages, &file.pipeline_stages),
            device_mapping: list(device_mapping, &file.device_mapping),
            pipeline_ipus: pipeline_ipus.or(file.pipeline_ipus),
            layers_per_ipu: list(layers_per_ipu, &file.layers_per_ipu),
            input_shapes: list(input_shapes, &file.input_shapes),
            no_search: no_search || file.no_search,
            loss: loss.or(file.loss),
            mask_tokens: mask_tokens.or(file.mask_tokens),
        }
    }

    /// The replicas asked for (1 when left out).
    pub fn replicas(&self) -> usize {
        self.replicas.unwrap_or(1)
    }

    /// The session options of model `model` (with `model_stages` pipeline stages): these
    /// options' (a model's own merged under them by [`EstimateOptions::over`]), else
    /// Tessera's defaults.
    pub fn session_options(
        &self,
        model: &str,
        model_stages: usize,
    ) -> Result<SessionOptions, EstimateError> {
        let schedule = self.pipeline_schedule.unwrap_or(Schedule::Grouped);
        let optimizer = self.optimizer.unwrap_or_default();
        let accumulation = self.gradient_accumulation_count.unwrap_or(1);
        let stages = if self.no_pipelining { 1 } else { model_stages };
        let machine = IpuConfig::preset(self.ipu);
        let offload = self
            .offload_optimizer_state
            .unwrap_or_else(|| offload::default_optimizer_state(stages, accumulation, &machine));
        let embedding_serialization = self.embedding_serialization.unwrap_or(1);
        serialization::check(embedding_serialization).map_err(|e| {
            EstimateError::Options(format!("{model}: embedding_serialization: {e}"))
        })?;
        let distributed_batch_norm =
            usize::try_from(self.distributed_batch_norm.unwrap_or(1)).unwrap_or(usize::MAX);
        distributed_norm::check(distributed_batch_norm, self.replicas())
            .map_err(|e| EstimateError::Options(format!("{model}: distributed_batch_norm: {e}")))?;
        let checkpoints = Checkpoints::from_names(&self.recompute_checkpoints)
            .map_err(|e| EstimateError::Options(format!("--recompute-checkpoints: {e}")))?;
        let techniques = Techniques {
            available_memory_proportion: MemoryProportion::from_values(
                &self.available_memory_proportion,
            ),
            partials: self.partials_type.unwrap_or(PartialsType::Float),
            recompute: Recompute {
                stages: self.recompute,
                checkpoints,
            },
            offload: Offload {
                optimizer_state: offload,
                activations: self.offload_activations,
                gradient_accumulators: self.offload_gradient_accumulation_buffers,
            },
            replicated_tensor_sharding: self
                .replicated_tensor_sharding
                .unwrap_or_else(|| sharding::default_on(offload, self.replicas())),
            outlining: !self.no_outlining,
            embedding_serialization,
            inference_rewrites: !self.no_inference_rewrites,
            distributed_batch_norm,
        };
        Ok(SessionOptions {
            batch_size: self.batch_size.unwrap_or(32),
            gradient_accumulation_count: accumulation,
            repeat_count: self.repeat_count,
            steps_per_execution: self.steps_per_execution,
            schedule,
            replicas: self.replicas(),
            ipu: self.ipu,
            optimizer,
            learning_rate: self
                .learning_rate
                .unwrap_or_else(|| optimizer.default_learning_rate()),
            dtype: self.dtype,
            no_pipelining: self.no_pipelining,
            accumulation_dtype: self.gradient_accumulation_dtype,
            techniques,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_become_keywords() {
        assert_eq!(
            EstimateOptions::as_keywords(
                "--pipeline-stages, --layers-per-ipu and --input-shape apply to ONNX models; try --recompute-checkpoints auto, not --fast"
            ),
            "pipeline_stages, layers_per_ipu and input_shapes apply to ONNX models; try recompute_checkpoints auto, not --fast"
        );
        assert_eq!(
            EstimateOptions::as_keywords("no flags -- here"),
            "no flags -- here"
        );
    }

    #[test]
    fn options_read_from_json_as_the_flags_name_them() {
        let o: EstimateOptions = serde_json::from_str(
            r#"{"batch_size": 8, "dtype": "f16", "pipeline_schedule": "interleaved",
                "offload_optimizer_state": false, "available_memory_proportion": 0.3,
                "loss": "masked-lm", "input_shape": [["input_ids", [1, 384]]]}"#,
        )
        .unwrap();
        assert_eq!(o.batch_size, Some(8));
        assert_eq!(o.dtype, DType::F16);
        assert_eq!(o.pipeline_schedule, Some(Schedule::Interleaved));
        assert_eq!(o.offload_optimizer_state, Some(false));
        assert_eq!(o.available_memory_proportion, vec![0.3]);
        assert_eq!(o.loss, Some(LossKind::MaskedLm));
        assert_eq!(
            o.input_shapes,
            vec![("input_ids".to_string(), vec![1, 384])]
        );
        assert_eq!(o.replicas(), 1);
        assert_eq!(o.ipu, Preset::Mk2);
        // And back: what is written reads as the same options.
        let again: EstimateOptions =
            serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(again, o);
    }

    #[test]
    fn lists_read_from_arrays_or_comma_separated_strings() {
        let o: EstimateOptions = serde_json::from_str(
            r#"{"recompute_checkpoints": "auto", "pipeline_stages": "a, b",
                "layers_per_ipu": "0,4,4,4", "device_mapping": [0, 0]}"#,
        )
        .unwrap();
        assert_eq!(o.recompute_checkpoints, vec!["auto"]);
        assert_eq!(o.pipeline_stages, vec!["a", "b"]);
        assert_eq!(o.layers_per_ipu, vec![0, 4, 4, 4]);
        assert_eq!(o.device_mapping, vec![0, 0]);
        let e =
            serde_json::from_str::<EstimateOptions>(r#"{"layers_per_ipu": "0,x"}"#).unwrap_err();
        assert!(e.to_string().contains("whole numbers"), "{e}");
    }

    #[test]
    fn every_option_is_described_with_its_choices_and_default() {
        let help = EstimateOptions::help();
        let names: Vec<&str> = help.iter().map(|h| h.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, EstimateOptions::names());
        assert!(help.iter().all(|h| !h.help.is_empty()), "{help:?}");
        let dtype = help.iter().find(|h| h.name == "dtype").unwrap();
        assert_eq!(dtype.values, ["f32", "f16"]);
        assert_eq!(dtype.default.as_deref(), Some("f32"));
        let switch = help
            .iter()
            .find(|h| h.name == "offload_optimizer_state")
            .unwrap();
        assert!(switch.values.is_empty() && switch.default.is_none());
    }

    #[test]
    fn unknown_keys_and_names_are_refused_by_name() {
        let e = serde_json::from_str::<EstimateOptions>(r#"{"batch_sise": 8}"#).unwrap_err();
        assert!(e.to_string().contains("batch_sise"), "{e}");
        let e = serde_json::from_str::<EstimateOptions>(r#"{"ipu": "mk3"}"#).unwrap_err();
        assert!(
            e.to_string()
                .contains("`mk3` is not one of mk1, mk2, bow, c600"),
            "{e}"
        );
    }

    #[test]
    fn a_map_names_the_option_at_fault() {
        let map = |j: &str| serde_json::from_str::<serde_json::Map<_, _>>(j).unwrap();
        let e = EstimateOptions::from_map(&map(r#"{"batch_size": 4, "dtype": "f8"}"#))
            .unwrap_err()
            .to_string();
        assert_eq!(e, "dtype: `f8` is not one of f32, f16");
        let e = EstimateOptions::from_map(&map(r#"{"replicas": "two"}"#))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("replicas: invalid type"), "{e}");
        let e =
            EstimateOptions::from_map(&map(r#"{"pipeline_ipus": 2, "layers_per_ipu": [2, 2]}"#))
                .unwrap_err()
                .to_string();
        assert!(e.contains("exclude each other"), "{e}");
        let o = EstimateOptions::from_map(&map(r#"{"batch_size": 4, "ipu": "bow"}"#)).unwrap();
        assert_eq!((o.batch_size, o.ipu), (Some(4), Preset::Bow));
    }

    #[test]
    fn exclusive_options_and_ranges_are_checked() {
        let both = EstimateOptions {
            pipeline_ipus: Some(4),
            layers_per_ipu: vec![0, 4, 4, 4],
            ..EstimateOptions::default()
        };
        assert!(both.check().unwrap_err().to_string().contains("exclude"));
        let mapping = EstimateOptions {
            device_mapping: vec![0, 1],
            ..EstimateOptions::default()
        };
        assert!(mapping.check().is_err());
        let amp = EstimateOptions {
            available_memory_proportion: vec![0.5, 1.5],
            ..EstimateOptions::default()
        };
        assert!(amp
            .check()
            .unwrap_err()
            .to_string()
            .starts_with("available_memory_proportion"));
        let serial = EstimateOptions {
            embedding_serialization: Some(0),
            ..EstimateOptions::default()
        };
        assert!(serial.check().is_err());
        // Resolving checks it by the same rule, for callers that skip `check`.
        let e = serial.session_options("m", 1).unwrap_err().to_string();
        assert_eq!(e, "m: embedding_serialization: 0 is not in 1..=4096");
        assert!(EstimateOptions::default().check().is_ok());
        // Distributed batch norm's groups divide the replicas.
        let groups = |n, replicas| EstimateOptions {
            distributed_batch_norm: Some(n),
            replicas: Some(replicas),
            ..EstimateOptions::default()
        };
        let e = groups(3, 4)
            .session_options("m", 1)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "m: distributed_batch_norm: groups of 3 replicas do not divide the 4 replica(s)"
        );
        assert!(groups(0, 4).check().is_err());
        let pairs = groups(2, 4).session_options("m", 1).unwrap();
        assert_eq!(pairs.techniques.distributed_batch_norm, 2);
    }

    /// A model from the shipped Sequential file with its `[training]` table replaced.
    fn with_training(table: &str) -> crate::model::Model {
        let (_, text) = crate::model::SHIPPED
            .iter()
            .find(|(n, _)| *n == "sequential")
            .unwrap();
        let layers = &text[..text.find("[training]").unwrap()];
        crate::model::Model::from_toml(&format!("{layers}[training]\n{table}"), "m.toml").unwrap()
    }

    #[test]
    fn a_model_files_names_are_read_in_any_case_and_wrong_ones_named() {
        let m = with_training("pipeline_schedule = \"Interleaved\"\noptimizer = \"ADAM\"\n");
        let so = EstimateOptions::default()
            .for_model(&m.training, "m")
            .unwrap()
            .session_options("m", 2)
            .unwrap();
        assert_eq!(so.schedule, Schedule::Interleaved);
        assert_eq!(so.optimizer, OptimizerKind::Adam);
        assert_eq!(
            so.learning_rate,
            OptimizerKind::Adam.default_learning_rate()
        );
        let m = with_training("partials_type = \"quarter\"\n");
        let e = EstimateOptions::default()
            .for_model(&m.training, "m")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "model `m`: partials_type: `quarter` is not one of float, half"
        );
        let m = with_training("available_memory_proportion = [0.2, 1.5]\n");
        let e = EstimateOptions::from_model_file(&m.training, "m").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("model `m`: available_memory_proportion: "),
            "{e}"
        );
    }

    #[test]
    fn a_model_files_table_fills_the_options_under_the_requests() {
        let m = with_training(
            "batch_size = 16\nlearning_rate = 0.05\noptimizer = \"momentum\"\n\
             outlining = false\navailable_memory_proportion = 0.3\n\
             embedding_serialization = 2\nepochs = 5\n",
        );
        assert_eq!(m.training.epochs, Some(5));
        let file = EstimateOptions::from_model_file(&m.training, "m").unwrap();
        assert_eq!(
            file,
            EstimateOptions {
                batch_size: Some(16),
                learning_rate: Some(0.05),
                optimizer: Some(OptimizerKind::Momentum),
                no_outlining: true,
                available_memory_proportion: vec![0.3],
                embedding_serialization: Some(2),
                ..EstimateOptions::default()
            }
        );
        // Unset options take the file's.
        let o = EstimateOptions::default().over(&file);
        assert_eq!(o, file);
        // Set ones stand; the file's rate stands with its own optimizer.
        let mine = EstimateOptions {
            batch_size: Some(4),
            available_memory_proportion: vec![0.5, 0.6],
            optimizer: Some(OptimizerKind::Momentum),
            ..EstimateOptions::default()
        };
        let o = mine.over(&file);
        assert_eq!(o.batch_size, Some(4));
        assert_eq!(o.available_memory_proportion, vec![0.5, 0.6]);
        assert_eq!(o.learning_rate, Some(0.05));
        assert_eq!(o.embedding_serialization, Some(2));
        // Another optimizer leaves the file's rate, and takes its own default.
        let adam = EstimateOptions {
            optimizer: Some(OptimizerKind::Adam),
            ..EstimateOptions::default()
        };
        let o = adam.over(&file);
        assert_eq!(o.learning_rate, None);
        let so = o.session_options("m", 1).unwrap();
        assert_eq!(
            so.learning_rate,
            OptimizerKind::Adam.default_learning_rate()
        );
        assert!(!so.techniques.outlining);
        assert_eq!(so.batch_size, 16);
        // A rate asked for stands whatever the optimizer.
        let rate = EstimateOptions {
            learning_rate: Some(0.2),
            ..adam
        };
        assert_eq!(rate.over(&file).learning_rate, Some(0.2));
    }
}
