//! `tessera._native`: the Python package's way into `tessera-host`'s library entry, the same
//! one the `tessera` command calls ([`tessera_host::estimation::estimate`]), its sweeps and
//! its calibration. The Python layer (`python/tessera/`) shapes what this returns into typed
//! results, DataFrames and exceptions.
//!
//! Every call that estimates releases the GIL while it runs, so Python threads (a sweep's
//! workers, a notebook's UI) carry on. Errors are `tessera._native.Error(kind, message)`, the
//! message holding the Rust cause chain, one `caused by:` line per cause; `kind` is
//! `option`, `model`, `estimate` or `io`, which the Python layer maps onto its exception types.
#![deny(missing_docs)]

use std::path::PathBuf;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tessera_host::estimation::{EstimateError, EstimateOptions, Estimation, ModelSource};
use tessera_host::report::{html_fragment, write_report};
use tessera_host::session::SessionError;
use tessera_host::sweep::{csv_header, csv_record, estimate_row, Row, Spec};

/// The extension's own allocations (an estimate's mappings and records) come from the
/// `tessera` command's allocator: mimalloc, built with local-dynamic thread-local storage
/// as a loaded library must be (see `Cargo.toml`), large blocks on transparent huge pages
/// (see [`tessera_host::allocator`]).
#[global_allocator]
static ALLOCATOR: tessera_host::allocator::Allocator = tessera_host::allocator::ALLOCATOR;

pyo3::create_exception!(
    _native,
    Error,
    PyException,
    "A Tessera error: args are (kind, message)."
);

/// `e` and its causes as one message, one `caused by:` line per cause (as the command prints
/// them).
fn message(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str("\ncaused by: ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// A Python error of `kind` for `e`, naming options by their keywords (`batch_size`), not the
/// command's flags (`--batch-size`).
fn error(kind: &str, e: &dyn std::error::Error) -> PyErr {
    Error::new_err((kind.to_string(), EstimateOptions::as_keywords(&message(e))))
}

/// What kind of error an estimate's is: a bad option, a bad model, or a failure of the
/// estimate itself.
fn kind_of(e: &EstimateError) -> &'static str {
    match e {
        EstimateError::Options(_) => "option",
        EstimateError::NoSuchModel(_) | EstimateError::Model(_) | EstimateError::Onnx(_) => "model",
        EstimateError::Session(SessionError::Option { .. }) => "option",
        EstimateError::Session(
            SessionError::Model(_) | SessionError::Onnx(_) | SessionError::Graph(_),
        ) => "model",
        EstimateError::Report(_) => "io",
        _ => "estimate",
    }
}

/// Options from their JSON text (an object of option names to values).
fn options(json: &str) -> PyResult<EstimateOptions> {
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(json).map_err(|e| error("option", &e))?;
    EstimateOptions::from_map(&map).map_err(|e| error("option", &e))
}

/// An estimate made ([`Estimation`]).
#[pyclass(frozen, module = "tessera._native", name = "Estimate")]
struct NativeEstimate {
    inner: Estimation,
}

#[pymethods]
impl NativeEstimate {
    /// The estimate as the command's `--json` prints it.
    fn json(&self) -> PyResult<String> {
        self.inner.to_json().map_err(|e| error("estimate", &e))
    }

    /// The estimate as the command prints it (every layer, or the 12 with the most cycles).
    #[pyo3(signature = (all_layers = false))]
    fn text(&self, all_layers: bool) -> String {
        self.inner.to_text(all_layers)
    }

    /// Why the model does not fit, as JSON (the fullest tile, its bytes, the largest tensors
    /// there, and `categories`: its memory at its peak by category), or None.
    fn out_of_memory(&self) -> PyResult<Option<String>> {
        let Some(o) = &self.inner.estimate.out_of_memory else {
            return Ok(None);
        };
        let mut json = serde_json::to_value(o).map_err(|e| error("estimate", &e))?;
        let categories: serde_json::Map<String, serde_json::Value> = o
            .memory
            .categories()
            .map(|(k, b)| (k.key().to_string(), b.into()))
            .collect();
        json["categories"] = categories.into();
        Ok(Some(json.to_string()))
    }

    /// The report as an HTML fragment for a notebook: tables and both pictures inline.
    fn html(&self, command: &str) -> String {
        html_fragment(&self.inner.report(command))
    }

    /// Writes the report (estimate.json, trace.json, memory.svg, timeline.svg, index.html)
    /// into `dir`; returns the files written.
    fn save_report(&self, py: Python<'_>, dir: PathBuf, command: &str) -> PyResult<Vec<String>> {
        let report = self.inner.report(command);
        py.detach(|| write_report(&dir, &report))
            .map(|files| files.iter().map(|f| f.display().to_string()).collect())
            .map_err(|e| error("io", &e))
    }
}

/// Estimates `model` (a path or a shipped model's name; or an ONNX model's bytes, called
/// `name`) with `options` (JSON: option names to values).
#[pyfunction]
#[pyo3(signature = (model, options, name = None))]
fn estimate(
    py: Python<'_>,
    model: &Bound<'_, PyAny>,
    options: &str,
    name: Option<String>,
) -> PyResult<NativeEstimate> {
    let source = match model.extract::<String>() {
        Ok(arg) => ModelSource::from_arg(&arg),
        Err(_) => ModelSource::OnnxBytes {
            name: name.unwrap_or_else(|| "model.onnx".into()),
            bytes: model.extract::<Vec<u8>>()?,
        },
    };
    let options = self::options(options)?;
    py.detach(|| tessera_host::estimation::estimate(&source, &options))
        .map(|inner| NativeEstimate { inner })
        .map_err(|e| error(kind_of(&e), &e))
}

/// The options `options` (JSON) stand for, checked, as JSON with every option written out.
#[pyfunction]
fn check_options(options: &str) -> PyResult<String> {
    let o = self::options(options)?;
    serde_json::to_string(&o).map_err(|e| error("option", &e))
}

/// A sweep spec ([`Spec`]): its configurations, estimated one row at a time.
#[pyclass(frozen, module = "tessera._native", name = "Sweep")]
struct NativeSweep {
    spec: Spec,
}

#[pymethods]
impl NativeSweep {
    /// The spec in a TOML file.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<NativeSweep> {
        let spec = Spec::load(&path).map_err(|e| error("option", &e))?;
        NativeSweep::checked(spec)
    }

    /// The spec from its tables as JSON (a Python dict); relative model paths are taken
    /// from the working directory.
    #[staticmethod]
    fn from_json(json: &str, name: &str) -> PyResult<NativeSweep> {
        let doc: toml::Table = serde_json::from_str(json).map_err(|e| error("option", &e))?;
        let spec = Spec::from_table(&doc, std::path::Path::new("<dict>"), name)
            .map_err(|e| error("option", &e))?;
        NativeSweep::checked(spec)
    }

    /// The sweep's name.
    #[getter]
    fn name(&self) -> String {
        self.spec.name.clone()
    }

    /// The option names the configurations set, sorted.
    #[getter]
    fn keys(&self) -> Vec<String> {
        self.spec.keys.clone()
    }

    fn __len__(&self) -> usize {
        self.spec.configs.len()
    }

    /// Configuration `index`'s row as JSON: its estimate, or why there is none.
    fn row(&self, py: Python<'_>, index: usize) -> PyResult<String> {
        let row = py
            .detach(|| estimate_row(&self.spec, index))
            .ok_or_else(|| {
                pyo3::exceptions::PyIndexError::new_err(format!(
                    "configuration {index}: the sweep has {}",
                    self.spec.configs.len()
                ))
            })?;
        serde_json::to_string(&row).map_err(|e| error("estimate", &e))
    }

    /// The CSV columns of the rows.
    fn csv_header(&self) -> Vec<String> {
        csv_header(&self.spec.keys)
    }

    /// A row (JSON, as [`row`](Self::row) gives it) as CSV fields.
    fn csv_record(&self, row: &str) -> PyResult<Vec<String>> {
        let row: Row = serde_json::from_str(row).map_err(|e| error("estimate", &e))?;
        Ok(csv_record(&self.spec.keys, &row))
    }
}

impl NativeSweep {
    /// The sweep, once its values and models are checked.
    fn checked(spec: Spec) -> PyResult<NativeSweep> {
        tessera_host::sweep::check(&spec).map_err(|e| error("option", &e))?;
        Ok(NativeSweep { spec })
    }
}

/// Keeps up to `capacity` lowered IPU programs for reuse by later estimates that lower the
/// same program (a sweep's configurations differing in M, schedule or replicas); 0 turns
/// reuse off. Returns the (hits, misses) so far.
#[pyfunction]
fn set_lowering_cache(capacity: usize) -> (u64, u64) {
    let stats = tessera_host::estimation::lowering_cache_stats();
    tessera_host::estimation::set_lowering_cache(capacity);
    stats
}

/// Runs `tessera calibrate`: the op table (`ops`, a CSV; the bundled set by default) and,
/// unless `ops_only`, the whole models (`whole_models`, a TOML; the bundled set by default),
/// as the JSON `tessera calibrate --json` prints.
#[pyfunction]
#[pyo3(signature = (ops = None, whole_models = None, ops_only = false))]
fn calibrate(
    py: Python<'_>,
    ops: Option<PathBuf>,
    whole_models: Option<PathBuf>,
    ops_only: bool,
) -> PyResult<String> {
    let c = py
        .detach(|| {
            tessera_host::calibration::calibrate(ops.as_deref(), whole_models.as_deref(), ops_only)
        })
        .map_err(|e| error("option", &e))?;
    serde_json::to_string(&c).map_err(|e| error("estimate", &e))
}

/// One option's help: (name, help, choices, default or None, the frameworks' names or None).
type OptionRow = (String, String, Vec<String>, Option<String>, Option<String>);

/// Every option with what it does, in the order `tessera estimate --help` lists them
/// ([`EstimateOptions::help`]).
#[pyfunction]
fn options_help() -> Vec<OptionRow> {
    EstimateOptions::help()
        .into_iter()
        .map(|h| {
            let frameworks = h.frameworks.map(str::to_string);
            (h.name, h.help, h.values, h.default, frameworks)
        })
        .collect()
}

/// Runs the `tessera` command with `args` (the program's name first), as the package's
/// `tessera` script does, and returns its exit status. Its output goes to the process's
/// standard output and error, as the command's does.
#[pyfunction]
fn command(py: Python<'_>, args: Vec<String>) -> u8 {
    py.detach(|| tessera_host::command(args))
}

/// `message` with the command's flags named as Python's keywords
/// ([`EstimateOptions::as_keywords`]).
#[pyfunction]
fn as_keywords(message: &str) -> String {
    EstimateOptions::as_keywords(message)
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add_class::<NativeEstimate>()?;
    m.add_class::<NativeSweep>()?;
    m.add_function(wrap_pyfunction!(estimate, m)?)?;
    m.add_function(wrap_pyfunction!(check_options, m)?)?;
    m.add_function(wrap_pyfunction!(set_lowering_cache, m)?)?;
    m.add_function(wrap_pyfunction!(calibrate, m)?)?;
    m.add_function(wrap_pyfunction!(options_help, m)?)?;
    m.add_function(wrap_pyfunction!(command, m)?)?;
    m.add_function(wrap_pyfunction!(as_keywords, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
