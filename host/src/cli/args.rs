//! The command line: subcommands and their options (clap).

use std::path::PathBuf;

use crate::model::DEFAULT_MODEL;
use crate::names::parser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use tessera_core::DType;
use tessera_sim::machine::Preset;

use super::flags::{EstimateFlags, ModelFlags};

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

/// A model and the options that say how it is compiled and placed.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// A shipped model (pipelined_sequential, pipelined_model, sequential, model) or a model
    /// file (TOML).
    #[arg(default_value = DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub options: ModelFlags,
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
    /// A shipped model (pipelined_sequential, pipelined_model, sequential, model), a model
    /// file (TOML) or an ONNX file.
    #[arg(default_value = DEFAULT_MODEL)]
    pub model: String,
    #[command(flatten)]
    pub options: EstimateFlags,
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
    #[arg(long, value_parser = parser::<Preset>(), default_value = "mk2")]
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
