//! The one library entry for estimates: [`estimate`] a [`ModelSource`] with
//! [`EstimateOptions`], get an [`Estimation`].
//!
//! `tessera estimate`, `tessera sweep`, `tessera calibrate`'s whole-model rows and the Python
//! package all come through here, so that one set of options means one estimate wherever it
//! is asked for:
//!
//! ```no_run
//! use tessera_host::estimation::{estimate, EstimateOptions, ModelSource};
//!
//! let options = EstimateOptions {
//!     batch_size: Some(8),
//!     pipeline_ipus: Some(4),
//!     ..EstimateOptions::default()
//! };
//! let e = estimate(&ModelSource::from_arg("data/onnx/bert_base.stripped.onnx"), &options)?;
//! println!("{} samples/s, fits: {}", e.summary.samples_per_second, e.summary.fits);
//! # Ok::<(), tessera_host::estimation::EstimateError>(())
//! ```

mod onnx;
mod options;
pub mod split;
pub mod system;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use tessera_sim::machine::IpuConfig;
use tessera_sim::system::SystemEstimate;

use crate::compile::onnx::LayerRow;
use crate::compile::{compile, inference_estimate, SessionError, SessionOptions};
use crate::model::{shipped, Model, ModelError, SHIPPED};
use crate::onnx::OnnxError;
use crate::report::{Report, ReportError};
use crate::summary::EstimateSummary;

pub use onnx::{FewestIpus, OnnxFacts};
pub use options::{
    EstimateOptions, OptionHelp, ESTIMATE_ONLY, FRAMEWORK_NAMES, MAX_EMBEDDING_SERIALIZATION,
};
pub use system::System;
/// Reuse of lowered IPU programs across estimates in this process (sweeps).
pub use tessera_sim::cache::{lowering_cache_stats, set_lowering_cache};

/// The model an estimate is of.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ModelSource {
    /// A shipped model, by name (see [`SHIPPED`]).
    Shipped(String),
    /// A model file (TOML).
    ModelFile(PathBuf),
    /// A model already read.
    Model(Box<Model>),
    /// An ONNX file.
    OnnxFile(PathBuf),
    /// An ONNX model's bytes, with a name for messages (a file name, say).
    OnnxBytes {
        /// What the model is called in messages and the estimate.
        name: String,
        /// The serialized `ModelProto`.
        bytes: Vec<u8>,
    },
}

impl ModelSource {
    /// The source a command-line argument names: a `.onnx` path, a shipped model's name, or
    /// a model file's path.
    pub fn from_arg(arg: &str) -> ModelSource {
        if is_onnx(arg) {
            ModelSource::OnnxFile(PathBuf::from(arg))
        } else if SHIPPED.iter().any(|(n, _)| *n == arg) {
            ModelSource::Shipped(arg.to_string())
        } else {
            ModelSource::ModelFile(PathBuf::from(arg))
        }
    }

    /// Whether the model is an ONNX model.
    pub fn is_onnx(&self) -> bool {
        matches!(
            self,
            ModelSource::OnnxFile(_) | ModelSource::OnnxBytes { .. }
        )
    }

    /// The model, for a source that is not ONNX.
    pub fn load_model(&self) -> Result<Model, EstimateError> {
        match self {
            ModelSource::Shipped(name) => match shipped(name) {
                Some(m) => Ok(m?),
                None => Err(EstimateError::NoSuchModel(name.clone())),
            },
            ModelSource::ModelFile(path) => {
                if !path.exists() {
                    return Err(EstimateError::NoSuchModel(path.display().to_string()));
                }
                Ok(Model::from_file(path)?)
            }
            ModelSource::Model(m) => Ok((**m).clone()),
            ModelSource::OnnxFile(path) => Err(EstimateError::Options(format!(
                "{}: an ONNX model, not a model file",
                path.display()
            ))),
            ModelSource::OnnxBytes { name, .. } => Err(EstimateError::Options(format!(
                "{name}: an ONNX model, not a model file"
            ))),
        }
    }
}

/// Whether `path` names an ONNX file (by its extension).
pub fn is_onnx(path: &str) -> bool {
    Path::new(path)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Why an estimate could not be made. (A model that does not fit is not an error: its
/// [`Estimation`] says so.)
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EstimateError {
    /// An option, or a model file's default, is invalid or conflicts with another.
    #[error("{0}")]
    Options(String),
    /// The model is neither a shipped model nor a file that is there.
    #[error("model `{0}` is neither a shipped model ({names}) nor a file", names = shipped_names())]
    NoSuchModel(String),
    /// The model file is invalid.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The ONNX model cannot be read or imported.
    #[error(transparent)]
    Onnx(#[from] OnnxError),
    /// The session (compile, split, estimate) failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The report could not be written.
    #[error(transparent)]
    Report(#[from] ReportError),
}

/// The shipped models' names, comma-separated.
fn shipped_names() -> String {
    SHIPPED
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What happens during a long estimate, for a progress display.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Progress {
    /// The model does not fit; the search for the fewest IPUs an automatic split fits on
    /// starts, trying up to `limit` IPUs.
    Searching {
        /// The model.
        model: String,
        /// The most IPUs the search tries.
        limit: usize,
    },
}

/// An estimate with everything a caller shows of it.
#[derive(Clone, Debug)]
pub struct Estimation {
    /// The model's name.
    pub name: String,
    /// The summary (what `--json` prints for a model file).
    pub summary: EstimateSummary,
    /// The whole system estimate.
    pub estimate: SystemEstimate,
    /// The session options the estimate was made with (defaults resolved).
    pub session: SessionOptions,
    /// The machine.
    pub machine: IpuConfig,
    /// Inference (not training).
    pub inference: bool,
    /// An ONNX model's import, split and search facts, with its per-layer rows.
    pub onnx: Option<OnnxFacts>,
    /// A model file's description (its layers), as text.
    pub model_summary: Option<String>,
}

/// What `--json` prints of an ONNX model: the summary and the import's facts.
#[derive(Serialize)]
struct OnnxJson<'a> {
    #[serde(flatten)]
    summary: &'a EstimateSummary,
    onnx: &'a OnnxFacts,
}

impl Estimation {
    /// Per-layer rows (ONNX models; empty for model files).
    pub fn layers(&self) -> &[LayerRow] {
        self.onnx.as_ref().map_or(&[], |o| o.layers.as_slice())
    }

    /// The stage boundaries of an automatic split, if the estimate is of one.
    pub fn boundaries(&self) -> Option<&[String]> {
        self.onnx
            .as_ref()
            .and_then(|o| o.split.as_ref())
            .map(|s| s.boundaries.as_slice())
    }

    /// Why the model does not fit, on one line, if it does not.
    pub fn out_of_memory(&self) -> Option<String> {
        self.estimate
            .out_of_memory
            .as_ref()
            .map(|o| crate::report::format::one_line(&o.to_string()))
    }

    /// The estimate as one line of JSON: the summary, and for an ONNX model its facts under
    /// `onnx`.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        match &self.onnx {
            Some(facts) => serde_json::to_string(&OnnxJson {
                summary: &self.summary,
                onnx: facts,
            }),
            None => serde_json::to_string(&self.summary),
        }
    }

    /// The estimate as text: the model (an ONNX model's import facts and layer table, all
    /// layers or the 12 with the most cycles), the inference schedule when inference, and
    /// the summary.
    pub fn to_text(&self, all_layers: bool) -> String {
        let mut s = self.head_text(all_layers);
        s.push_str(&self.summary.to_text());
        s
    }

    /// [`Self::to_text`] without the out-of-memory paragraph (the command prints it once, as
    /// its error).
    pub fn text_without_out_of_memory(&self, all_layers: bool) -> String {
        let mut s = self.head_text(all_layers);
        s.push_str(&self.summary.text_without_out_of_memory());
        s
    }

    /// What the text says before the summary: the model and, for inference, its schedule.
    fn head_text(&self, all_layers: bool) -> String {
        let mut s = match (&self.onnx, &self.model_summary) {
            (Some(f), _) => f.to_text(all_layers),
            (None, Some(m)) => m.clone(),
            (None, None) => String::new(),
        };
        if self.inference {
            s.push_str(&inference_line(&self.estimate));
            s.push('\n');
        }
        s
    }

    /// The report of this estimate (for [`crate::report::write_report`]); `command` is what
    /// the report says made it.
    pub fn report(&self, command: &str) -> Report {
        Report {
            layers: self.layers().to_vec(),
            ..report(
                &self.name,
                &self.session,
                &self.machine,
                self.estimate.clone(),
                None,
                command,
            )
        }
    }
}

/// Estimates `source` with `options`.
pub fn estimate(
    source: &ModelSource,
    options: &EstimateOptions,
) -> Result<Estimation, EstimateError> {
    estimate_with(source, options, &mut |_| {})
}

/// [`estimate`], telling `progress` what a long estimate is doing.
pub fn estimate_with(
    source: &ModelSource,
    options: &EstimateOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Estimation, EstimateError> {
    options.check()?;
    let start = Instant::now();
    let on_system;
    let options = match options.system {
        Some(system) => {
            on_system = system::options_for(options, system)?;
            &on_system
        }
        None => options,
    };
    match source {
        ModelSource::OnnxFile(path) => {
            let model = crate::onnx::OnnxModel::load(path)?;
            onnx::estimate(&model, path, options, start, progress)
        }
        ModelSource::OnnxBytes { name, bytes } => {
            let path = Path::new(name);
            let model = crate::onnx::OnnxModel::from_bytes(bytes, path)?;
            onnx::estimate(&model, path, options, start, progress)
        }
        _ => {
            if options.onnx_only() {
                return Err(EstimateError::Options("--pipeline-stages, --pipeline-ipus, --layers-per-ipu, --input-shape, --loss and --no-search apply to ONNX models; a model file places its layers with `stage`".into()));
            }
            match source {
                // A model already read is estimated as it is, not copied.
                ModelSource::Model(m) => model_estimate(m, options),
                _ => model_estimate(&source.load_model()?, options),
            }
        }
    }
}

/// A model file's estimate: on a system, with as many replicas of the file's placement as it
/// holds unless the replicas are given.
fn model_estimate(model: &Model, o: &EstimateOptions) -> Result<Estimation, EstimateError> {
    let Some(system) = o.system else {
        return placed_model_estimate(model, o);
    };
    if let Some(r) = o.replicas {
        system.ipus_per_replica(r)?;
        let e = placed_model_estimate(model, o)?;
        system.check_within(e.summary.ipus_total, r)?;
        return Ok(e);
    }
    let one = EstimateOptions {
        replicas: Some(1),
        ..o.clone()
    };
    let used = placed_model_estimate(model, &one)?.summary.ipus_total;
    system.check_within(used, 1)?;
    let replicas = system.ipus / used;
    placed_model_estimate(
        model,
        &EstimateOptions {
            replicas: Some(replicas),
            ..o.clone()
        },
    )
}

/// A model file's estimate with the replicas given.
fn placed_model_estimate(model: &Model, o: &EstimateOptions) -> Result<Estimation, EstimateError> {
    let session = o
        .for_model(&model.training, &model.name)?
        .session_options(&model.name, model.stage_count())?;
    let e = if o.inference {
        inference_estimate(model, &session)?
    } else {
        compile(model, &session)?.target.estimate()?
    };
    let machine = IpuConfig::preset(session.ipu);
    Ok(Estimation {
        name: model.name.clone(),
        summary: EstimateSummary::new(&model.name, session.ipu, &machine, &e),
        estimate: e,
        session,
        machine,
        inference: o.inference,
        onnx: None,
        model_summary: Some(model.summary()),
    })
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

/// The report of an estimate of model `name` with session options `opts` (and a training
/// run's results, when one wrote it), made by `command`.
pub fn report(
    name: &str,
    opts: &SessionOptions,
    machine: &IpuConfig,
    estimate: SystemEstimate,
    training: Option<serde_json::Value>,
    command: &str,
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
        command: command.to_string(),
        machine_name: opts.ipu.name().to_string(),
        machine: machine.clone(),
        estimate,
        training,
        layers: Vec::new(),
    }
}
