//! `tessera estimate`: fit, memory and cycles of training (or inference) without running.

use std::path::PathBuf;

use tessera_host::report::{write_report, Report};
use tessera_host::session::{compile, inference_estimate, EstimateSummary, SessionOptions};
use tessera_sim::machine::IpuConfig;
use tessera_sim::system::SystemEstimate;

use super::args::EstimateArgs;
use super::options::{command_line, load_model, session_options};
use super::{one_line, AnyError};

pub fn run(a: EstimateArgs) -> Result<bool, AnyError> {
    // Where the report goes is checked before any work.
    if let Some(d) = &a.report_dir {
        tessera_host::output::check_output_dir(d)?;
    }
    if is_onnx(&a.model.model) {
        return super::onnx::run(a);
    }
    let o = estimate(&a)?;
    if a.json {
        println!("{}", serde_json::to_string(&o.summary)?);
    } else {
        print!("{}", o.model_summary);
        if a.inference {
            println!("{}", inference_line(&o.estimate));
        }
        print!("{}", o.summary.to_text());
        if let Some(files) = &o.report_files {
            println!("report written: {}", files_list(files));
        }
    }
    if let Some(oom) = &o.estimate.out_of_memory {
        eprintln!(
            "error: {} does not fit: {}",
            o.summary.model,
            one_line(&oom.to_string())
        );
        return Ok(false);
    }
    Ok(true)
}

/// A model file's estimate, as `estimate` prints it.
pub struct ModelEstimate {
    /// The summary `--json` prints.
    pub summary: EstimateSummary,
    /// The system estimate.
    pub estimate: SystemEstimate,
    model_summary: String,
    report_files: Option<Vec<PathBuf>>,
}

/// The estimate `run` prints for a model file (not ONNX), without printing it (but with the
/// report written when `--report-dir` asks for one).
pub fn estimate(a: &EstimateArgs) -> Result<ModelEstimate, AnyError> {
    if !a.pipeline_stages.is_empty()
        || a.pipeline_ipus.is_some()
        || !a.layers_per_ipu.is_empty()
        || !a.input_shapes.is_empty()
        || a.loss.is_some()
        || a.no_search
    {
        return Err("--pipeline-stages, --pipeline-ipus, --layers-per-ipu, --input-shape, --loss and --no-search apply to ONNX models; a model file places its layers with `stage`".into());
    }
    let model = load_model(&a.model.model)?;
    let opts = session_options(&a.model, &model)?;
    let name = model.name.clone();
    let e = if a.inference {
        inference_estimate(&model, &opts)?
    } else {
        let mut c = compile(&model, &opts)?;
        c.system.recompute = a.recompute;
        c.estimate()?
    };
    let machine = IpuConfig::preset(opts.ipu);
    let summary = EstimateSummary::new(&name, opts.ipu, &machine, &e);
    let report_files = match &a.report_dir {
        Some(dir) => Some(write_report(
            dir,
            &make_report(&name, &opts, &machine, e.clone(), None),
        )?),
        None => None,
    };
    Ok(ModelEstimate {
        summary,
        estimate: e,
        model_summary: model.summary(),
        report_files,
    })
}

/// Whether the model argument names an ONNX file.
pub fn is_onnx(model: &str) -> bool {
    std::path::Path::new(model)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// What an inference estimate runs: the schedule, its overlap and stash, K.
pub fn inference_line(e: &SystemEstimate) -> String {
    let stash: Vec<String> = e.stages.iter().map(|s| s.stash_depth.to_string()).collect();
    format!(
        "inference: {} schedule over {} stage(s), {} micro-batches per execution, stash depths [{}] (no backward pass to stash for)",
        e.schedule,
        e.stages_count,
        e.accumulation,
        stash.join(", ")
    )
}

pub fn make_report(
    name: &str,
    opts: &SessionOptions,
    machine: &IpuConfig,
    estimate: SystemEstimate,
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
        layers: Vec::new(),
    }
}

pub fn files_list(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
