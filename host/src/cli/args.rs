//! The command line: subcommands and their options (clap).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tessera_core::schedule::Schedule;
use tessera_core::DType;
use tessera_host::compile::onnx::LossKind;
use tessera_host::compile::OptimizerKind;
use tessera_host::model::DEFAULT_MODEL;
use tessera_sim::machine::Preset;
use tessera_sim::planner::PartialsType;

use super::named::named;

/// Train and estimate neural networks on a simulated IPU system.
#[derive(Parser, Debug)]
#[command(name = "tessera", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model on MNIST-format digits, with outfeeds of activations and gradients and
    /// their statistics per epoch; then evaluate it on the test split on the device.
    Train(TrainArgs),
    /// Loss and accuracy on the test split, on the simulated device (Keras' evaluate()).
    Evaluate(EvaluateArgs),
    /// The model's outputs for the test split, outfed to the host and written as .npy or CSV
    /// (Keras' predict()).
    Predict(PredictArgs),
    /// Estimate memory and cycles of training a model (or of inference), without running it.
    Estimate(EstimateArgs),
    /// Run an ONNX model's forward pass on inputs from .npy files with the reference kernels
    /// (the model's weights are needed) and write each output as NAME.npy.
    Run(RunArgs),
    /// Estimate one op (matmul or fully-connected layer) on one IPU.
    #[command(name = "estimate-op", subcommand)]
    EstimateOp(OpCommand),
    /// Estimate every row of a calibration set of Graphcore's IPU Model figures for single
    /// ops (the bundled poplibs set by default) and print the error table and its medians.
    Calibrate(CalibrateArgs),
    /// Measure the input pipeline alone, as Graphcore's dataset_benchmark does (JSON).
    #[command(name = "dataset-benchmark")]
    DatasetBenchmark(BenchArgs),
    /// Estimate many configurations from a TOML spec, in parallel: results as CSV and JSON
    /// lines (resumable), the best configuration, and a Pareto picture and page; `submit`
    /// runs it as a Slurm job array, `merge` joins the shards.
    Sweep(SweepArgs),
    /// Render a report directory written by `--report-dir` (trace, pictures, HTML page).
    Report {
        /// The report directory.
        dir: PathBuf,
    },
}

/// A proportion in (0, 1], as poplin's `availableMemoryProportion` must be.
fn proportion(s: &str) -> Result<f64, String> {
    let p: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    tessera_sim::planner::check_proportion(p).map(|()| p)
}

/// Options that say how a model is compiled and placed.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// A shipped model (pipelined_sequential, pipelined_model, sequential, model) or a model
    /// file (TOML).
    #[arg(default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Samples per micro-batch [default: the model file's, else 32].
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
    #[arg(long, value_parser = named::<Schedule>())]
    pub pipeline_schedule: Option<Schedule>,
    /// Put every layer on one IPU (ignore the model's pipeline stages).
    #[arg(long)]
    pub no_pipelining: bool,
    /// Replicas of the whole model, each with its own data.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// IPU generation.
    #[arg(long, value_parser = named::<Preset>(), default_value = "mk2")]
    pub ipu: Preset,
    /// Optimizer (momentum is 0.9) [default: the model file's, else sgd].
    #[arg(long, value_parser = named::<OptimizerKind>())]
    pub optimizer: Option<OptimizerKind>,
    /// Learning rate [default: the model file's for its optimizer, else 0.1 for sgd, 0.01 for
    /// momentum, 0.001 for adam].
    #[arg(long)]
    pub learning_rate: Option<f32>,
    /// Keep optimizer state in streaming memory (remote buffers), loaded for each update.
    /// On by default (TensorFlow's offload_weight_update_variables) for pipelined models and
    /// gradient accumulation when the machine has remote buffers.
    #[arg(long, conflicts_with = "no_offload_optimizer_state")]
    pub offload_optimizer_state: bool,
    /// Keep optimizer state on the tiles even where offloading is the default.
    #[arg(long)]
    pub no_offload_optimizer_state: bool,
    /// Element type of weights and activations.
    #[arg(long, value_parser = named::<DType>(), default_value = "f32")]
    pub dtype: DType,
    /// Type of matmuls' and convolutions' partial sums: Poplar's `partialsType` (TensorFlow
    /// `set_matmul_options` / `set_convolution_options({'partialsType': 'half'})`, PopART
    /// `partialsTypeMatMuls`, PopTorch `Precision.setPartialsType`) [default: the model
    /// file's, else float]. Half applies to f16 products only.
    #[arg(long, value_parser = named::<PartialsType>())]
    pub partials_type: Option<PartialsType>,
    /// Element type of the gradient accumulators: TensorFlow's `gradient_accumulation_dtype`
    /// (pipelining and `GradientAccumulationOptimizerV2`), PopART's `accumType` [default: the
    /// model file's, else the weights' type, TensorFlow's and PopART SGD's default].
    #[arg(long, value_parser = named::<DType>())]
    pub gradient_accumulation_dtype: Option<DType>,
    /// Share of each tile a matmul's or convolution's temporary memory may take in the
    /// planner's first pass: poplin's `availableMemoryProportion` (TensorFlow
    /// `set_matmul_options` / `set_convolution_options`, PopART per-IPU
    /// `availableMemoryProportion`, PopTorch `setAvailableMemoryProportion`). One value, or one
    /// per pipeline stage `P0,P1,...` [default: the model file's, else 0.6].
    #[arg(long, value_delimiter = ',', value_parser = proportion)]
    pub available_memory_proportion: Vec<f64>,
    /// Training: keep only these forward activations for the backward pass and recompute the
    /// rest from them, segment by segment (PopART's recomputation with checkpoints, TensorFlow
    /// `recomputation_checkpoint`, PopTorch `recomputationCheckpoint`). `auto`: one at the
    /// output of each repeated block (each residual block, each transformer sublayer), as
    /// PopTorch's `recompute_checkpoint_every_layer`; or node names, comma-separated. Works
    /// with one stage on one IPU too.
    #[arg(long, value_delimiter = ',')]
    pub recompute_checkpoints: Vec<String>,
    /// Shard the optimizer state and its update over the replicas (TensorFlow
    /// `replicated_optimizer_state_sharding`, PopART `replicatedTensorSharding`): each replica
    /// loads, stores and updates its share of every variable of 8192 elements or more; the
    /// gradients' all-reduce becomes a reduce-scatter and an all-gather of the weights. Needs
    /// the optimizer state offloaded, as TensorFlow does. On by default wherever the state is
    /// offloaded and there are several replicas: TensorFlow's default for it is the offload
    /// setting.
    #[arg(long, conflicts_with = "no_replicated_tensor_sharding")]
    pub replicated_tensor_sharding: bool,
    /// Keep each replica's optimizer state whole even where sharding it is the default.
    #[arg(long)]
    pub no_replicated_tensor_sharding: bool,
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
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub embedding_serialization: Option<u64>,
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
}

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Passes over the data, rounded to whole executions [default: the model file's, else 3].
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Run one execution of the on-device loop only.
    #[arg(long)]
    pub run_single_step: bool,
    /// Outfeed each micro-batch's gradients (AFTER_COMPUTE) instead of the accumulated ones
    /// just before they are applied (BEFORE_APPLY).
    #[arg(long)]
    pub outfeed_pre_accumulated_gradients: bool,
    /// Substrings selecting the gradients to outfeed; `none` keeps all.
    #[arg(long, num_args = 0.., default_values_t = ["Dense_128".to_string()])]
    pub gradients_filters: Vec<String>,
    /// Substrings selecting the MaybeOutfeed activations to outfeed; `none` keeps all.
    #[arg(long, num_args = 0.., default_values_t = ["none".to_string()])]
    pub activations_filters: Vec<String>,
    /// Seed of weight initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Batches the infeed prefetches (1..=255).
    #[arg(long, default_value_t = 3)]
    pub prefetch_depth: usize,
    /// Elements an outfeed holds before the device stalls (1..=255).
    #[arg(long, default_value_t = 3)]
    pub buffer_depth: usize,
    /// Directory with the four MNIST IDX files (raw or gzip) [default: the bundled digits].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Write the estimate, trace, pictures and an HTML page here.
    #[arg(long)]
    pub report_dir: Option<PathBuf>,
    /// Save the final weights here (safetensors).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

/// Options of `evaluate` and `predict`.
#[derive(Args, Debug)]
pub struct InferenceArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Weights from a checkpoint written by `tessera train --checkpoint` [default: freshly
    /// initialised from --seed, an untrained model].
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Seed of the initial weights when no --weights are given.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Directory with the four MNIST IDX files (raw or gzip) [default: the bundled digits].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct EvaluateArgs {
    #[command(flatten)]
    pub common: InferenceArgs,
}

#[derive(Args, Debug)]
pub struct PredictArgs {
    #[command(flatten)]
    pub common: InferenceArgs,
    /// Where to write the predictions: a .npy file (float32, [samples, outputs]) or a .csv
    /// file (a header, then one row per sample: index, label, outputs).
    #[arg(long, short)]
    pub output: PathBuf,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The ONNX model, with its weights.
    pub model: PathBuf,
    /// An input, as NAME=FILE.npy (float32/64, int32/64, bool or uint8); one per input.
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Where to write the outputs (NAME.npy each).
    #[arg(long, default_value = ".")]
    pub output_dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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
    pub pipeline_stages: Vec<String>,
    /// ONNX models: the IPU of each pipeline stage, comma-separated (TensorFlow's
    /// `device_mapping`, PopART's `virtualGraph`) [default: the file's `ipu` attributes, else
    /// stage k on IPU k]. Stages sharing an IPU run one after another, and the estimate gives
    /// each one's memory on its own: its steps' code, the variables they touch and its tiles'
    /// peak over them, as PopLiner attributes a profiled program to layer ranges.
    #[arg(long, value_delimiter = ',', requires = "pipeline_stages")]
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
    pub layers_per_ipu: Vec<usize>,
    /// ONNX models: the whole shape of a graph input, NAME=D0,D1,... (repeat for several),
    /// as trtexec's `--shapes` and onnxruntime's free-dimension overrides bind them: the
    /// sequence length of a transformer, say. It stands as given, its batch axis included;
    /// `--batch-size` binds the batch of the other inputs.
    #[arg(long = "input-shape", value_name = "NAME=D0,D1,...", value_parser = parse_input_shape)]
    pub input_shapes: Vec<(String, Vec<usize>)>,
    /// ONNX models: when the model does not fit, do not search for the fewest IPUs an
    /// automatic split fits on (the search makes several estimates; sweeps want only this one).
    #[arg(long)]
    pub no_search: bool,
    /// ONNX models: the loss of training [default: auto, by the output's shape].
    #[arg(long, value_parser = named::<LossKind>())]
    pub loss: Option<LossKind>,
    /// ONNX models, masked-LM loss: masked positions per sequence that the head projects
    /// onto the vocabulary (BERT's `max_predictions_per_seq`, Graphcore's `mask_tokens`)
    /// [default: 15% of the sequence, rounded up: 20 for 128 tokens].
    #[arg(long)]
    pub mask_tokens: Option<usize>,
    /// ONNX models: print every layer's row (default: the 12 with the most cycles).
    #[arg(long)]
    pub layers: bool,
    /// Write the estimate, trace, pictures and an HTML page here.
    #[arg(long)]
    pub report_dir: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DataTypeArg {
    Half,
    Float,
}

impl DataTypeArg {
    pub fn dtype(self) -> DType {
        match self {
            DataTypeArg::Half => DType::F16,
            DataTypeArg::Float => DType::F32,
        }
    }
}

#[derive(Args, Debug)]
pub struct OpCommon {
    /// Element type, as poplibs' tools name it.
    #[arg(long, value_enum, default_value = "half")]
    pub data_type: DataTypeArg,
    /// IPU generation.
    #[arg(long, value_parser = named::<Preset>(), default_value = "mk2")]
    pub ipu: Preset,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum OpCommand {
    /// C = op(A) . op(B) + C, as poplibs' general_matrix_multiply.
    Matmul {
        /// Rows of op(A) and C.
        #[arg(long)]
        m: usize,
        /// Columns of op(A), rows of op(B).
        #[arg(long)]
        k: usize,
        /// Columns of op(B) and C.
        #[arg(long)]
        n: usize,
        /// Transpose A.
        #[arg(long)]
        transpose_a: bool,
        /// Transpose B.
        #[arg(long)]
        transpose_b: bool,
        #[command(flatten)]
        common: OpCommon,
    },
    /// A fully-connected layer, as poplibs' fully_connected_layer: forward, backward and
    /// weight-update passes.
    Fc {
        /// Samples.
        #[arg(long)]
        batch_size: usize,
        /// Input width.
        #[arg(long)]
        input_size: usize,
        /// Output width.
        #[arg(long)]
        output_size: usize,
        /// Independent groups.
        #[arg(long, default_value_t = 1)]
        num_groups: usize,
        /// Only the forward pass.
        #[arg(long)]
        inference_only: bool,
        #[command(flatten)]
        common: OpCommon,
    },
    /// A 2-D convolution layer, as poplibs' single_conv_layer: forward, backward and
    /// weight-update passes, NCHW activations. Sizes take poplibs' shape syntax: `{56,56}`,
    /// `56,56`, or one value for every dimension; a one-dimensional `--field` is a field of
    /// height 1.
    Conv {
        /// Input height and width (`{H,W}`), or the length of a 1-D field.
        #[arg(long, value_parser = parse_shape)]
        field: ShapeArg,
        /// Kernel height and width, or one size for both.
        #[arg(long, value_parser = parse_shape, default_value = "1")]
        kernel_size: ShapeArg,
        /// Input channels per group.
        #[arg(long)]
        input_channels: usize,
        /// Output channels per group.
        #[arg(long)]
        output_channels: usize,
        /// Stride, per dimension or one for both.
        #[arg(long, value_parser = parse_shape, default_value = "1")]
        stride: ShapeArg,
        /// Zero padding at both ends of each dimension, or one amount for both.
        #[arg(long, value_parser = parse_shape, default_value = "0")]
        padding: ShapeArg,
        /// Convolution groups.
        #[arg(long, default_value_t = 1)]
        conv_groups: usize,
        /// Images.
        #[arg(long, default_value_t = 1)]
        batch_size: usize,
        /// Add a bias to each output channel (`--bias 0` leaves it out).
        #[arg(long, default_value = "1", value_parser = parse_bool, action = clap::ArgAction::Set)]
        bias: bool,
        /// Only the forward pass.
        #[arg(long)]
        inference_only: bool,
        #[command(flatten)]
        common: OpCommon,
    },
}

/// A size per dimension, as poplibs' tools write it: `{a,b}`, `a,b`, or `a`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeArg(pub Vec<usize>);

/// Parses [`ShapeArg`].
pub fn parse_shape(s: &str) -> Result<ShapeArg, String> {
    let inner = s.trim();
    let inner = inner
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or(inner);
    let dims: Result<Vec<usize>, _> = inner
        .split(',')
        .map(|d| d.trim().parse::<usize>())
        .collect();
    match dims {
        Ok(d) if !d.is_empty() && d.len() <= 2 => Ok(ShapeArg(d)),
        Ok(_) => Err(format!(
            "`{s}`: give one or two sizes (convolutions are 1-D or 2-D)"
        )),
        Err(_) => Err(format!(
            "`{s}`: expected sizes such as `{{56,56}}`, `56,56` or `3`"
        )),
    }
}

/// Parses a boolean as poplibs' tools take one: `1`, `0`, `true`, `false`.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("`{s}`: expected 1 or 0 (true or false)")),
    }
}

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// A calibration CSV (`target,benchmark,cycles,total_memory_bytes,max_tile_bytes`)
    /// [default: the bundled data/calibration/ipu_model_ops.csv].
    pub file: Option<PathBuf>,
    /// Print the rows and the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Exit non-zero unless the median |error| is at most 15% for cycles and total memory and
    /// 25% for the fullest tile, and no row is more than 2x off in cycles (the op table); and,
    /// unless --ops-only, every published run fits and is within 10% of its throughput (1.0x
    /// to 1.1x of a figure that includes the host) and every profile category is within 25% of
    /// Poplar's, its total and fullest tile within 10%.
    #[arg(long)]
    pub check: bool,
    /// Whole models to compare as well: Graphcore's published runs and Poplar's memory
    /// profiles (TOML) [default: the bundled data/calibration/whole_models.toml].
    #[arg(long)]
    pub whole_models: Option<PathBuf>,
    /// Only the op table (no whole-model estimates).
    #[arg(long)]
    pub ops_only: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Directory with the four MNIST IDX files (raw or gzip) [default: the bundled digits].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Epochs to measure.
    #[arg(long, default_value_t = 3)]
    pub epochs: usize,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SweepArgs {
    #[command(subcommand)]
    pub action: Option<SweepCommand>,
    #[command(flatten)]
    pub run: SweepRunArgs,
}

/// A shard: `I/N`, the I-th (from 0) of N.
pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: expected I/N, e.g. 0/4"))?;
    let (i, n): (usize, usize) = (
        i.trim()
            .parse()
            .map_err(|_| format!("`{s}`: I is not a number"))?,
        n.trim()
            .parse()
            .map_err(|_| format!("`{s}`: N is not a number"))?,
    );
    if n == 0 || i >= n {
        return Err(format!("`{s}`: needs 0 <= I < N"));
    }
    Ok((i, n))
}

#[derive(Args, Debug)]
pub struct SweepRunArgs {
    /// The sweep spec (TOML: [base], [grid], [[configs]]; see docs/sweeps.md).
    #[arg(required = true)]
    pub spec: Option<PathBuf>,
    /// Directory for the results (results.jsonl, results.csv, pareto.svg, index.html; a
    /// shard writes shard-I-of-N.jsonl and .csv) [default: SPEC's stem + "-sweep"].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Configurations estimated at once [default: the machine's cores].
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Run only shard I of N (the I-th of N contiguous blocks, I from 0) [default: from
    /// SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT when Slurm sets them].
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
    /// Lowered IPU programs kept for reuse by later configurations that lower the same
    /// program (those differing only in M, schedule or replicas, say); 0 turns reuse off.
    /// Each costs memory: a BERT-Base IPU program is a few hundred MB.
    #[arg(long, default_value_t = 8)]
    pub lowering_cache: usize,
}

#[derive(Subcommand, Debug)]
pub enum SweepCommand {
    /// Write a Slurm job-array script that runs the sweep in shards, and submit it (sbatch).
    Submit(SubmitArgs),
    /// Join the shards' results in the output directory into results.jsonl and .csv, the
    /// Pareto picture and the page.
    Merge(MergeArgs),
}

#[derive(Args, Debug)]
pub struct SubmitArgs {
    /// The sweep spec (TOML).
    pub spec: PathBuf,
    /// Submit to Slurm (the scheduler this command knows).
    #[arg(long, required = true)]
    pub slurm: bool,
    /// Tasks in the job array: the sweep's shards.
    #[arg(long, default_value_t = 4)]
    pub array_size: usize,
    /// Directory for the results, shared by the tasks [default: SPEC's stem + "-sweep"].
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// CPUs per task, each estimating one configuration at a time.
    #[arg(long, default_value_t = 1)]
    pub cpus_per_task: usize,
    /// Memory per task (sbatch --mem, e.g. 4G).
    #[arg(long)]
    pub mem: Option<String>,
    /// Slurm partition [default: the cluster's].
    #[arg(long)]
    pub partition: Option<String>,
    /// Time limit per task (sbatch --time).
    #[arg(long)]
    pub time: Option<String>,
    /// Write the script but do not submit it.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for the job array to finish (sbatch --wait), then merge.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The sweep spec (TOML).
    pub spec: PathBuf,
    /// The directory the shards wrote to [default: SPEC's stem + "-sweep"].
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// `NAME=D0,D1,...` of `--input-shape`.
fn parse_input_shape(s: &str) -> Result<(String, Vec<usize>), String> {
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
