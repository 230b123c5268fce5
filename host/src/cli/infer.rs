//! `tessera evaluate` and `tessera predict` (Keras' evaluate() and predict()) on the simulated
//! device, and the prediction files (.npy or CSV).

use npyz::WriterBuilder as _;
use std::path::Path;

use crate::compile::SessionOptions;
use crate::idx::Mnist;
use crate::outfeed::HostTensor;
use crate::output::{check_output_file, write_atomically};
use crate::session::{EstimateSummary, EvaluateOptions, EvaluateReport, Evaluation, Weights};
use tessera_sim::machine::IpuConfig;

use super::args::{EvaluateArgs, InferenceArgs, PredictArgs};
use super::options::{data_dir, load_data, load_model, session_options};
use super::AnyError;
use crate::estimation::inference_line;

/// Prediction files this command writes, by extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutputFormat {
    Npy,
    Csv,
}

fn output_format(path: &Path) -> Result<OutputFormat, AnyError> {
    match path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("npy") => Ok(OutputFormat::Npy),
        Some("csv") => Ok(OutputFormat::Csv),
        _ => Err(format!("--output: `{}` must end in .npy or .csv", path.display()).into()),
    }
}

/// Runs the test split through the device; every check comes before any output.
fn infer(
    a: &InferenceArgs,
    with_labels: bool,
) -> Result<(EvaluateReport, SessionOptions, Mnist), AnyError> {
    let model = load_model(&a.model.model)?;
    let so = session_options(&a.model, &model)?;
    let data = load_data(&data_dir(a.data.as_deref()))?;
    let opts = EvaluateOptions {
        steps_per_execution: a.model.options.0.steps_per_execution,
        prefetch_depth: None,
    };
    let evaluation = Evaluation::new(&model, &so, &data, &opts, with_labels)?;
    let weights = match &a.weights {
        Some(p) => Weights::Checkpoint(p),
        None => Weights::Seed(a.seed),
    };
    let report = evaluation.run(&model, &so, weights, &data, &opts)?;
    Ok((report, so, data))
}

fn print_report(r: &EvaluateReport, so: &SessionOptions, weights: &InferenceArgs) {
    let source = weights.weights.as_ref().map_or_else(
        || format!("untrained weights (seed {})", weights.seed),
        |p| format!("weights from {}", p.display()),
    );
    println!(
        "{}: {} of {} test digits on the device with {source}",
        r.model, r.samples, r.split_samples
    );
    if !r.loss.is_nan() {
        println!("loss: {:.4}", r.loss);
    }
    println!("accuracy: {:.2}%", r.accuracy * 100.0);
    println!(
        "{} execution(s) of K = {} micro-batches per replica",
        r.executions, r.steps_per_execution
    );
    println!("{}", inference_line(&r.estimate));
    let machine = IpuConfig::preset(so.ipu);
    print!(
        "{}",
        EstimateSummary::new(&r.model, so.ipu, &machine, &r.estimate).to_text()
    );
}

pub fn run_evaluate(a: EvaluateArgs) -> Result<bool, AnyError> {
    let (r, so, _) = infer(&a.common, true)?;
    if a.common.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print_report(&r, &so, &a.common);
    }
    Ok(true)
}

pub fn run_predict(a: PredictArgs) -> Result<bool, AnyError> {
    let format = output_format(&a.output)?;
    // Where the predictions go is checked before the run.
    check_output_file(&a.output)?;
    let (r, so, data) = infer(&a.common, false)?;
    let p = r
        .predictions
        .as_ref()
        .ok_or("the device returned no predictions")?;
    let labels = &data.test_labels.labels[..p.shape[0]];
    match format {
        OutputFormat::Npy => write_npy(&a.output, p)?,
        OutputFormat::Csv => write_csv(&a.output, p, labels)?,
    }
    if a.common.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        print_report(&r, &so, &a.common);
        println!(
            "predictions: {} x {} written to {}",
            p.shape[0],
            p.shape[1],
            a.output.display()
        );
    }
    Ok(true)
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> AnyError {
    format!("{}: {e}", path.display()).into()
}

/// float32 `[samples, outputs]` in NumPy's format.
fn write_npy(path: &Path, p: &HostTensor) -> Result<(), AnyError> {
    let shape: Vec<u64> = p.shape.iter().map(|&d| d as u64).collect();
    write_atomically(path, |out| {
        let mut w = npyz::WriteOptions::<f32>::new()
            .default_dtype()
            .shape(&shape)
            .writer(out)
            .begin_nd()?;
        w.extend(p.data.iter().copied())?;
        w.finish()
    })
    .map_err(|e| io_err(path, e))?;
    Ok(())
}

/// A header, then `index,label,output_0,...` per sample.
fn write_csv(path: &Path, p: &HostTensor, labels: &[u8]) -> Result<(), AnyError> {
    let width = p.shape[1];
    write_atomically(path, |w| {
        let header: Vec<String> = (0..width).map(|c| format!("output_{c}")).collect();
        writeln!(w, "index,label,{}", header.join(","))?;
        for (s, row) in p.data.chunks(width.max(1)).enumerate() {
            let values: Vec<String> = row.iter().map(|v| v.to_string()).collect();
            writeln!(w, "{s},{},{}", labels[s], values.join(","))?;
        }
        Ok(())
    })
    .map_err(|e| io_err(path, e))?;
    Ok(())
}
