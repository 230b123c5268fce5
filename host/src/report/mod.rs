//! Reports: a directory that explains one system estimate.
//!
//! [`write_report`] saves a [`Report`] as `estimate.json` and renders the rest from it;
//! [`render_report`] re-renders a directory from its `estimate.json` alone:
//!
//! - `trace.json`: one weight update in Chrome's trace-event format (open it at
//!   <https://ui.perfetto.dev> or in `chrome://tracing`); see [`trace`].
//! - `memory.svg`: per IPU, every tile's memory at its peak stacked by category, against the
//!   tile's SRAM.
//! - `timeline.svg`: the pipeline's stage runs over one weight update, with the update itself.
//! - `index.html`: a self-contained page with the figures' numbers in tables, the two pictures
//!   and a link to the trace.
//!
//! Every file is a pure function of `estimate.json`: rendering twice gives the same bytes.
//! Numbers everywhere (and in [`EstimateSummary::to_text`]) are written by [`format`](mod@format).

pub mod format;
mod html;
mod memory;
mod svg;
pub mod sweep;
mod timeline;
pub mod trace;

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_sim::machine::IpuConfig;
use tessera_sim::system::SystemEstimate;

use crate::summary::EstimateSummary;

pub use html::{html_fragment, html_page};
pub use memory::{memory_svg, memory_svg_grouped};
pub use timeline::timeline_svg;
pub use trace::{chrome_trace, chrome_trace_with_limit, Trace, MAX_PHASE_SLICES};

/// The saved report: everything else is rendered from it.
pub const ESTIMATE_FILE: &str = "estimate.json";
/// The Chrome trace of one weight update.
pub const TRACE_FILE: &str = "trace.json";
/// Per-tile memory of every IPU.
pub const MEMORY_FILE: &str = "memory.svg";
/// The pipeline timeline.
pub const TIMELINE_FILE: &str = "timeline.svg";
/// The page tying the others together.
pub const INDEX_FILE: &str = "index.html";

/// Everything a report directory is made from; saved as `estimate.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// What was estimated, e.g. `mnist: 2 x mk2, Grouped, M = 4, batch 32`: the model's name,
    /// a colon, then the setting.
    pub title: String,
    /// The command line that produced it.
    pub command: String,
    /// The machine's name (`mk2`, or a custom machine's).
    pub machine_name: String,
    /// The machine.
    pub machine: IpuConfig,
    /// The estimate.
    pub estimate: SystemEstimate,
    /// Training results (accuracy, loss, ...) when a training run wrote the report.
    #[serde(default)]
    pub training: Option<Value>,
    /// Per-layer rows (ONNX nodes) when the model was imported.
    #[serde(default)]
    pub layers: Vec<crate::summary::LayerRow>,
}

impl Report {
    /// The model's name: the title up to its first `: ` (all of it when it has none).
    pub fn model(&self) -> &str {
        self.title
            .split_once(": ")
            .map_or(self.title.as_str(), |(model, _)| model)
    }

    /// The estimate as `tessera estimate` prints it.
    pub fn summary(&self) -> EstimateSummary {
        EstimateSummary::for_machine(
            self.model(),
            &self.machine_name,
            &self.machine,
            &self.estimate,
        )
    }
}

/// Why a report could not be written or rendered. Each names its file and keeps the
/// underlying error as its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// A file or directory could not be read, written or created.
    #[error("cannot {action} {}{}", path.display(), missing_estimate_hint(path, source))]
    Io {
        /// What was being done: `read`, `write`, `create the directory`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// `estimate.json` is not JSON, or not a report.
    #[error("{}: not a valid report at line {line}, column {column}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Line of the problem (1-based).
        line: usize,
        /// Column of the problem (1-based).
        column: usize,
        /// What is wrong there.
        #[source]
        source: serde_json::Error,
    },
    /// The report or its trace could not be encoded as JSON.
    #[error("cannot encode {}", path.display())]
    Encode {
        /// The file being written.
        path: PathBuf,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

fn missing_estimate_hint(path: &Path, e: &io::Error) -> &'static str {
    if e.kind() == io::ErrorKind::NotFound && path.ends_with(ESTIMATE_FILE) {
        " (a report directory holds the estimate.json that `write_report` saved)"
    } else {
        ""
    }
}

/// What [`render_report`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The files written, in order: trace, memory picture, timeline picture, page.
    pub files: Vec<PathBuf>,
    /// The estimate as [`EstimateSummary::to_text`] gives it, then the files written (no
    /// trailing newline).
    pub summary: String,
}

/// Creates `dir` (and its parents), saves `report` as `estimate.json` and renders the other
/// files from what was saved (as [`render_report`] does). Returns every file written,
/// `estimate.json` first.
pub fn write_report(dir: &Path, report: &Report) -> Result<Vec<PathBuf>, ReportError> {
    fs::create_dir_all(dir).map_err(|source| ReportError::Io {
        action: "create the directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join(ESTIMATE_FILE);
    let mut text = serde_json::to_vec_pretty(report).map_err(|source| ReportError::Encode {
        path: path.clone(),
        source,
    })?;
    text.push(b'\n');
    write_file(&path, &text)?;
    // Render from the saved file, so writing and re-rendering give the same bytes.
    let rendered = render_report(dir)?;
    let mut files = vec![path];
    files.extend(rendered.files);
    Ok(files)
}

/// Reads `dir/estimate.json` and (re)writes `trace.json`, `memory.svg`, `timeline.svg` and
/// `index.html` beside it.
pub fn render_report(dir: &Path) -> Result<Rendered, ReportError> {
    let report = read_report(&dir.join(ESTIMATE_FILE))?;
    let trace_path = dir.join(TRACE_FILE);
    let mut trace =
        serde_json::to_vec(&chrome_trace(&report)).map_err(|source| ReportError::Encode {
            path: trace_path.clone(),
            source,
        })?;
    trace.push(b'\n');
    let outputs: [(PathBuf, Vec<u8>); 4] = [
        (trace_path, trace),
        (dir.join(MEMORY_FILE), memory_svg(&report).into_bytes()),
        (dir.join(TIMELINE_FILE), timeline_svg(&report).into_bytes()),
        (dir.join(INDEX_FILE), html_page(&report).into_bytes()),
    ];
    let mut files = Vec::with_capacity(outputs.len());
    for (path, bytes) in outputs {
        write_file(&path, &bytes)?;
        files.push(path);
    }
    let mut summary = report.summary().to_text();
    summary.push_str("wrote:");
    for f in &files {
        let _ = write!(summary, "\n  {}", f.display());
    }
    Ok(Rendered { files, summary })
}

fn read_report(path: &Path) -> Result<Report, ReportError> {
    let text = fs::read_to_string(path).map_err(|source| ReportError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ReportError::Malformed {
        path: path.to_path_buf(),
        line: source.line(),
        column: source.column(),
        source,
    })
}

/// Writes a report file whole or not at all (`crate::output::write_atomically`).
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    crate::output::write_bytes_atomically(path, bytes).map_err(|source| ReportError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn errors_name_the_file_and_keep_their_source() {
        let dir = Path::new("/nonexistent/tessera-report");
        let err = render_report(dir).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("cannot read /nonexistent/tessera-report/estimate.json"));
        assert!(msg.contains("write_report"), "{msg}");
        let source = err.source().expect("an io::Error");
        assert!(source.downcast_ref::<io::Error>().is_some());
        // The wrapper does not repeat its source's text.
        assert!(!msg.contains(&source.to_string()), "{msg}");

        let path = Path::new("estimate.json");
        let source = serde_json::from_str::<Report>("{\n  \"title\": 7\n}").unwrap_err();
        let err = ReportError::Malformed {
            path: path.into(),
            line: source.line(),
            column: source.column(),
            source,
        };
        assert!(err
            .to_string()
            .starts_with("estimate.json: not a valid report at line 2"));
        assert!(err.source().unwrap().is::<serde_json::Error>());
    }
}
