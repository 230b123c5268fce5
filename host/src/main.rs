//! The `tessera` command: train and estimate models on a simulated IPU system, estimate single
//! ops, benchmark the input pipeline, and render reports.
//!
//! Every error is one line on stderr (`error: ...`) and a non-zero exit status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tessera_core::DType;
use tessera_host::dataset::Dataset;
use tessera_host::idx::load_mnist;
use tessera_host::infeed::dataset_benchmark;
use tessera_host::inspect::{epoch_report, parse_filters, GradientOutfeedMode};
use tessera_host::model::{shipped, Model, DEFAULT_MODEL, SHIPPED};
use tessera_host::report::{render_report, write_report, Report};
use tessera_host::session::{
    compile, parse_schedule, train, EstimateSummary, OptimizerKind, SessionOptions, TrainEvent,
    TrainOptions,
};
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::ops::{fully_connected, matmul, FcPass};

/// The digits bundled with Tessera.
const BUNDLED_DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist-binarized-10k");

/// Train and estimate neural networks on a simulated IPU system.
#[derive(Parser, Debug)]
#[command(name = "tessera", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a model on MNIST-format digits, with outfeeds of activations and gradients and
    /// their statistics per epoch.
    Train(TrainArgs),
    /// Estimate memory and cycles of training a model, without running it.
    Estimate(EstimateArgs),
    /// Estimate one op (matmul or fully-connected layer) on one IPU.
    #[command(name = "estimate-op", subcommand)]
    EstimateOp(OpCommand),
    /// Measure the input pipeline alone, as Graphcore's dataset_benchmark does (JSON).
    #[command(name = "dataset-benchmark")]
    DatasetBenchmark(BenchArgs),
    /// Render a report directory written by `--report-dir` (trace, pictures, HTML page).
    Report {
        /// The report directory.
        dir: PathBuf,
    },
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum IpuArg {
    Mk1,
    Mk2,
    Bow,
}

impl IpuArg {
    fn preset(self) -> Preset {
        match self {
            IpuArg::Mk1 => Preset::Mk1,
            IpuArg::Mk2 => Preset::Mk2,
            IpuArg::Bow => Preset::Bow,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum DTypeArg {
    F32,
    F16,
}

/// Options that say how a model is compiled and placed.
#[derive(Args, Debug)]
struct ModelArgs {
    /// A shipped model (pipelined_sequential, pipelined_model, sequential, model) or a model
    /// file (TOML).
    #[arg(default_value = DEFAULT_MODEL)]
    model: String,
    /// Samples per micro-batch [default: the model file's, else 32].
    #[arg(long)]
    batch_size: Option<usize>,
    /// Micro-batches per weight update, M [default: the model file's, else 1].
    #[arg(long)]
    gradient_accumulation_count: Option<usize>,
    /// Weight updates per execution of the on-device loop, R [default: one execution per
    /// epoch].
    #[arg(long, conflicts_with = "steps_per_execution")]
    repeat_count: Option<usize>,
    /// Micro-batches per execution, K (Keras' steps_per_execution; a multiple of M).
    #[arg(long)]
    steps_per_execution: Option<usize>,
    /// Pipeline schedule: grouped, interleaved or sequential [default: the model file's,
    /// else grouped].
    #[arg(long)]
    pipeline_schedule: Option<String>,
    /// Put every layer on one IPU (ignore the model's pipeline stages).
    #[arg(long)]
    no_pipelining: bool,
    /// Replicas of the whole model, each with its own data.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// IPU generation.
    #[arg(long, value_enum, default_value = "mk2")]
    ipu: IpuArg,
    /// Optimizer: sgd, momentum (0.9) or adam [default: the model file's, else sgd].
    #[arg(long)]
    optimizer: Option<String>,
    /// Learning rate [default: the model file's for its optimizer, else 0.1 for sgd, 0.01 for
    /// momentum, 0.001 for adam].
    #[arg(long)]
    learning_rate: Option<f32>,
    /// Keep optimizer state in streaming memory (remote buffers), loaded for each update.
    #[arg(long)]
    offload_optimizer_state: bool,
    /// Element type of weights and activations.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeArg,
}

#[derive(Args, Debug)]
struct TrainArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Passes over the data [default: the model file's, else 3].
    #[arg(long)]
    epochs: Option<usize>,
    /// Run one execution of the on-device loop only.
    #[arg(long)]
    run_single_step: bool,
    /// Outfeed each micro-batch's gradients (AFTER_COMPUTE) instead of the accumulated ones
    /// just before they are applied (BEFORE_APPLY).
    #[arg(long)]
    outfeed_pre_accumulated_gradients: bool,
    /// Substrings selecting the gradients to outfeed; `none` keeps all.
    #[arg(long, num_args = 0.., default_values_t = ["Dense_128".to_string()])]
    gradients_filters: Vec<String>,
    /// Substrings selecting the MaybeOutfeed activations to outfeed; `none` keeps all.
    #[arg(long, num_args = 0.., default_values_t = ["none".to_string()])]
    activations_filters: Vec<String>,
    /// Seed of weight initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Batches the infeed prefetches (1..=255).
    #[arg(long, default_value_t = 3)]
    prefetch_depth: usize,
    /// Elements an outfeed holds before the device stalls (1..=255).
    #[arg(long, default_value_t = 3)]
    buffer_depth: usize,
    /// Directory with the four MNIST IDX files (raw or gzip) [default: the bundled digits].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Write the estimate, trace, pictures and an HTML page here.
    #[arg(long)]
    report_dir: Option<PathBuf>,
    /// Save the final weights here (safetensors).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct EstimateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Write the estimate, trace, pictures and an HTML page here.
    #[arg(long)]
    report_dir: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum DataTypeArg {
    Half,
    Float,
}

impl DataTypeArg {
    fn dtype(self) -> DType {
        match self {
            DataTypeArg::Half => DType::F16,
            DataTypeArg::Float => DType::F32,
        }
    }
}

#[derive(Args, Debug)]
struct OpCommon {
    /// Element type, as poplibs' tools name it.
    #[arg(long, value_enum, default_value = "half")]
    data_type: DataTypeArg,
    /// IPU generation.
    #[arg(long, value_enum, default_value = "mk2")]
    ipu: IpuArg,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum OpCommand {
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
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Directory with the four MNIST IDX files (raw or gzip) [default: the bundled digits].
    #[arg(long)]
    data: Option<PathBuf>,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Epochs to measure.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

type AnyError = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(a) => run_train(a),
        Command::Estimate(a) => run_estimate(a),
        Command::EstimateOp(c) => run_op(c),
        Command::DatasetBenchmark(a) => run_bench(a),
        Command::Report { dir } => render_report(&dir)
            .map(|r| {
                println!("{}", r.summary);
                true
            })
            .map_err(Into::into),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn load_model(name: &str) -> Result<Model, AnyError> {
    if let Some(m) = shipped(name) {
        return Ok(m?);
    }
    let path = Path::new(name);
    if !path.exists() {
        let names: Vec<&str> = SHIPPED.iter().map(|(n, _)| *n).collect();
        return Err(format!(
            "model `{name}` is neither a shipped model ({}) nor a file",
            names.join(", ")
        )
        .into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Model::from_toml(&text, &path.display().to_string())?)
}

fn session_options(a: &ModelArgs, model: &Model) -> Result<SessionOptions, AnyError> {
    let t = &model.training;
    let schedule_name = a
        .pipeline_schedule
        .clone()
        .or_else(|| t.pipeline_schedule.clone())
        .unwrap_or_else(|| "grouped".into());
    let schedule = parse_schedule(&schedule_name).ok_or_else(|| {
        format!("--pipeline-schedule: unknown schedule `{schedule_name}`; use grouped, interleaved or sequential")
    })?;
    let opt_name = a
        .optimizer
        .clone()
        .or_else(|| t.optimizer.clone())
        .unwrap_or_else(|| "sgd".into());
    let optimizer = OptimizerKind::parse(&opt_name).ok_or_else(|| {
        format!("--optimizer: unknown optimizer `{opt_name}`; use sgd, momentum or adam")
    })?;
    Ok(SessionOptions {
        batch_size: a.batch_size.or(t.batch_size).unwrap_or(32),
        gradient_accumulation_count: a
            .gradient_accumulation_count
            .or(t.gradient_accumulation_count)
            .unwrap_or(1),
        repeat_count: a.repeat_count,
        steps_per_execution: a.steps_per_execution,
        schedule,
        replicas: a.replicas,
        ipu: a.ipu.preset(),
        optimizer,
        // The file's rate goes with the file's optimizer; another optimizer gets its own default.
        learning_rate: a.learning_rate.unwrap_or_else(|| {
            let file_opt = t.optimizer.as_deref().and_then(OptimizerKind::parse);
            match t.learning_rate {
                Some(lr) if file_opt.is_none_or(|o| o == optimizer) => lr,
                _ => optimizer.default_learning_rate(),
            }
        }),
        offload_optimizer_state: a.offload_optimizer_state,
        dtype: match a.dtype {
            DTypeArg::F32 => DType::F32,
            DTypeArg::F16 => DType::F16,
        },
        no_pipelining: a.no_pipelining,
    })
}

fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "tessera".into();
    }
    args.join(" ")
}

fn run_estimate(a: EstimateArgs) -> Result<bool, AnyError> {
    let model = load_model(&a.model.model)?;
    let opts = session_options(&a.model, &model)?;
    let compiled = compile(&model, &opts)?;
    let e = compiled.estimate()?;
    let summary = EstimateSummary::new(&compiled.model.name, opts.ipu, &compiled.machine, &e);
    if let Some(dir) = &a.report_dir {
        let files = write_report(
            dir,
            &make_report(
                &compiled.model.name,
                &opts,
                &compiled.machine,
                e.clone(),
                None,
            ),
        )?;
        if !a.json {
            println!("report written: {}", files_list(&files));
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", compiled.model.summary());
        print!("{}", summary.to_text());
    }
    if let Some(oom) = &e.out_of_memory {
        eprintln!(
            "error: {} does not fit: {}",
            compiled.model.name,
            one_line(&oom.to_string())
        );
        return Ok(false);
    }
    Ok(true)
}

fn make_report(
    name: &str,
    opts: &SessionOptions,
    machine: &IpuConfig,
    estimate: tessera_sim::system::SystemEstimate,
    training: Option<serde_json::Value>,
) -> Report {
    Report {
        title: format!(
            "{name}: {} x {}, {}, M = {}, batch {}",
            estimate.ipus.len(),
            opts.ipu.name(),
            estimate.schedule,
            estimate.accumulation,
            opts.batch_size
        ),
        command: command_line(),
        machine_name: opts.ipu.name().to_string(),
        machine: machine.clone(),
        estimate,
        training,
    }
}

fn files_list(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn run_train(a: TrainArgs) -> Result<bool, AnyError> {
    let model = load_model(&a.model.model)?;
    let opts = session_options(&a.model, &model)?;
    let data_dir = a
        .data
        .clone()
        .unwrap_or_else(|| PathBuf::from(BUNDLED_DATA));
    let data = load_mnist(&data_dir)?;
    let compiled = compile(&model, &opts)?;
    let machine = compiled.machine.clone();
    let name = compiled.model.name.clone();
    let quiet = a.json;
    if !quiet {
        print!("{}", compiled.model.summary());
        println!(
            "data: {} training and {} test digits from {}",
            data.train_images.count,
            data.test_images.count,
            data_dir
                .canonicalize()
                .unwrap_or_else(|_| data_dir.clone())
                .display()
        );
        println!(
            "{} IPU(s) of {} per replica, {} replica(s), {} schedule, batch {}, M = {}, {} at learning rate {}",
            compiled.model.ipus(),
            opts.ipu.name(),
            opts.replicas,
            compiled.options.schedule.name(),
            opts.batch_size,
            opts.gradient_accumulation_count,
            format!("{:?}", opts.optimizer).to_lowercase(),
            opts.learning_rate
        );
    }
    let t = &compiled.model.training;
    let options = TrainOptions {
        epochs: a.epochs.or(t.epochs).unwrap_or(3),
        run_single_step: a.run_single_step,
        gradient_outfeed_mode: if a.outfeed_pre_accumulated_gradients {
            GradientOutfeedMode::AfterCompute
        } else {
            GradientOutfeedMode::BeforeApply
        },
        gradients_filters: parse_filters(&a.gradients_filters),
        activations_filters: parse_filters(&a.activations_filters),
        seed: a.seed,
        prefetch_depth: a.prefetch_depth,
        buffer_depth: a.buffer_depth,
        checkpoint: a.checkpoint.clone(),
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} micro-batches ({per_sec}, eta {eta})",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    let (mut per_epoch, mut epochs_total) = (1u64, options.epochs);
    let report = train(compiled, &data, &options, |ev| match ev {
        TrainEvent::Start {
            total_steps,
            steps_per_epoch,
        } => {
            per_epoch = steps_per_epoch.max(1);
            epochs_total = (total_steps / per_epoch) as usize;
            bar.set_length(per_epoch);
            bar.set_message(format!("Epoch 1/{epochs_total}"));
        }
        TrainEvent::Progress { steps } => {
            let e = (steps.saturating_sub(1)) / per_epoch;
            bar.set_message(format!("Epoch {}/{epochs_total}", e + 1));
            bar.set_position(steps - e * per_epoch);
        }
        TrainEvent::Epoch {
            epoch,
            loss,
            outfeeds,
        } => {
            bar.suspend(|| {
                if !quiet {
                    println!(
                        "Epoch {epoch}/{epochs_total}: loss {loss:.4} ({per_epoch} micro-batches)"
                    );
                    for (cb, data) in &outfeeds {
                        println!("{}", epoch_report(cb, epoch, data));
                    }
                    println!();
                }
            });
            bar.reset();
        }
    });
    bar.finish_and_clear();
    let report = report?;
    let estimate = report.estimate.clone();
    if !quiet {
        println!(
            "test accuracy: {:.2}% on {} digits; final loss {:.4}",
            report.test_accuracy * 100.0,
            data.test_images.count,
            report.final_loss
        );
        println!(
            "{} micro-batches, {} weight updates in {} execution(s) of R = {} updates (K = {} micro-batches); {:.1} s",
            report.steps,
            report.weight_updates,
            report.executions,
            report.repeat_count,
            report.steps_per_execution,
            report.wall_seconds
        );
        for o in &report.outfeeds {
            if o.enqueued > 0 {
                println!(
                    "outfeed {}: {} elements, {} enqueues stalled waiting for the host ({:.3} s)",
                    o.queue, o.enqueued, o.stalled_enqueues, o.stall_seconds
                );
            }
        }
        println!("estimate:");
        print!(
            "{}",
            EstimateSummary::new(&name, opts.ipu, &machine, &estimate).to_text()
        );
        if let Some(c) = &options.checkpoint {
            println!("weights saved to {}", c.display());
        }
    }
    if let Some(dir) = &a.report_dir {
        let training = serde_json::to_value(&report)?;
        let files = write_report(
            dir,
            &make_report(&name, &opts, &machine, estimate, Some(training)),
        )?;
        if !quiet {
            println!("report written: {}", files_list(&files));
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(true)
}

fn run_op(c: OpCommand) -> Result<bool, AnyError> {
    let (common, results) = match c {
        OpCommand::Matmul {
            m,
            k,
            n,
            transpose_a,
            transpose_b,
            common,
        } => {
            let cfg = IpuConfig::preset(common.ipu.preset());
            let r = matmul(
                &cfg,
                m,
                k,
                n,
                common.data_type.dtype(),
                transpose_a,
                transpose_b,
            )?;
            (common, vec![r])
        }
        OpCommand::Fc {
            batch_size,
            input_size,
            output_size,
            num_groups,
            inference_only,
            common,
        } => {
            let cfg = IpuConfig::preset(common.ipu.preset());
            let passes: &[FcPass] = if inference_only {
                &[FcPass::Forward]
            } else {
                &[FcPass::Forward, FcPass::Backward, FcPass::WeightUpdate]
            };
            let mut rs = Vec::new();
            for &p in passes {
                rs.push(fully_connected(
                    &cfg,
                    batch_size,
                    input_size,
                    output_size,
                    num_groups,
                    common.data_type.dtype(),
                    p,
                )?);
            }
            (common, rs)
        }
    };
    let cycles: u64 = results.iter().map(|r| r.cycles).sum();
    let total_memory: u64 = results
        .iter()
        .map(|r| r.total_memory_bytes)
        .max()
        .unwrap_or(0);
    let max_tile: u64 = results.iter().map(|r| r.max_tile_bytes).max().unwrap_or(0);
    let fits = results.iter().all(|r| r.fits);
    if common.json {
        let passes: BTreeMap<String, &tessera_sim::ops::OpEstimate> =
            results.iter().map(|r| (r.name.clone(), r)).collect();
        let v = serde_json::json!({
            "cycles": cycles,
            "total_memory_bytes": total_memory,
            "max_tile_bytes": max_tile,
            "fits": fits,
            "passes": passes,
        });
        println!("{v}");
    } else {
        for r in &results {
            println!(
                "{}: {} cycles (compute {}, exchange {}), {} flops, memory {} bytes, fullest tile {} bytes on {} tiles{}",
                r.name,
                r.cycles,
                r.compute_cycles,
                r.exchange_cycles,
                r.flops,
                r.total_memory_bytes,
                r.max_tile_bytes,
                r.tiles_used,
                if r.fits { "" } else { " (DOES NOT FIT)" }
            );
        }
        println!("total: {cycles} cycles");
    }
    Ok(fits)
}

fn run_bench(a: BenchArgs) -> Result<bool, AnyError> {
    if a.batch_size == 0 {
        return Err("--batch-size: must be at least 1".into());
    }
    let dir = a
        .data
        .clone()
        .unwrap_or_else(|| PathBuf::from(BUNDLED_DATA));
    let data = load_mnist(&dir)?;
    let ds = Dataset::from_mnist_split(&data.train_images, &data.train_labels)?
        .map("images", |x| x / 255.0)?
        .shuffle(a.seed)?
        .batch(a.batch_size, true)?;
    let report = dataset_benchmark(&ds, a.epochs)?;
    println!("{}", report.to_json());
    Ok(true)
}
