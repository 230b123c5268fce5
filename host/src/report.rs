//! Reports: a directory that explains one system estimate.
//!
//! [`write_report`] saves a [`Report`] as `estimate.json` and renders the rest from it;
//! [`render_report`] re-renders a directory from its `estimate.json` alone:
//!
//! - `trace.json`: one weight update in Chrome's trace-event format (open it at
//!   <https://ui.perfetto.dev> or in `chrome://tracing`). One process per IPU; thread
//!   "pipeline stages" has a slice per stage run (then the all-reduce and the weight update),
//!   thread "BSP phases" the compute / exchange / sync / host / remote-buffer phases of every
//!   superstep of those runs, thread "weight update" the supersteps of the update. Timestamps
//!   are IPU cycles: one trace microsecond is one cycle (`otherData.clock_hz` converts).
//! - `memory.svg`: per IPU, every tile's memory at its peak stacked by category, against the
//!   tile's SRAM.
//! - `timeline.svg`: the pipeline's stage runs over one weight update, with the update itself.
//! - `index.html`: a self-contained page with the figures' numbers in tables, the two pictures
//!   and a link to the trace.
//!
//! Every file is a pure function of `estimate.json`: rendering twice gives the same bytes.

use std::fmt::{self, Write as _};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tessera_sim::estimate::{Phase, TraceEvent};
use tessera_sim::machine::IpuConfig;
use tessera_sim::memory::TileMemory;
use tessera_sim::pipeline::SlotRun;
use tessera_sim::system::{StageRow, SystemEstimate};

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

/// At most this many BSP-phase slices go into a trace (stage slices are always all there).
/// Runs are detailed in timeline order until the next one would pass the limit.
pub const MAX_PHASE_SLICES: usize = 200_000;

/// Everything a report directory is made from; saved as `estimate.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// What was estimated, e.g. `pipelined_sequential: 2 x mk2, Grouped, M = 4`.
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
}

/// Why a report could not be written or rendered.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReportError {
    /// A file or directory could not be read, written or created.
    Io {
        /// What was being done: `read`, `write`, `create the directory`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// `estimate.json` is not JSON, or not a report.
    Malformed {
        /// The file.
        path: PathBuf,
        /// Line of the problem (1-based).
        line: usize,
        /// Column of the problem (1-based).
        column: usize,
        /// What is wrong there.
        message: String,
    },
    /// The report could not be encoded as JSON.
    Encode {
        /// The file being written.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::Io {
                action,
                path,
                source,
            } => {
                write!(f, "cannot {action} {}: {source}", path.display())?;
                if source.kind() == io::ErrorKind::NotFound && path.ends_with(ESTIMATE_FILE) {
                    f.write_str(
                        " (a report directory holds the estimate.json that `write_report` saved)",
                    )?;
                }
                Ok(())
            }
            ReportError::Malformed {
                path,
                line,
                column,
                message,
            } => write!(
                f,
                "{}: not a valid report at line {line}, column {column}: {message}",
                path.display()
            ),
            ReportError::Encode { path, source } => {
                write!(f, "cannot encode {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for ReportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReportError::Io { source, .. } => Some(source),
            ReportError::Encode { source, .. } => Some(source),
            ReportError::Malformed { .. } => None,
        }
    }
}

/// What [`render_report`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendered {
    /// The files written, in order: trace, memory picture, timeline picture, page.
    pub files: Vec<PathBuf>,
    /// A few lines for a terminal: whether it fits, cycles per weight update, samples/s,
    /// memory per IPU and the files written (no trailing newline).
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
    let mut text = serde_json::to_string_pretty(report).map_err(|source| ReportError::Encode {
        path: path.clone(),
        source,
    })?;
    text.push('\n');
    write_file(&path, text.as_bytes())?;
    // Render from the saved file, so writing and re-rendering give the same bytes.
    let rendered = render_report(dir)?;
    let mut files = vec![path];
    files.extend(rendered.files);
    Ok(files)
}

/// Reads `dir/estimate.json` and (re)writes `trace.json`, `memory.svg`, `timeline.svg` and
/// `index.html` beside it.
pub fn render_report(dir: &Path) -> Result<Rendered, ReportError> {
    let path = dir.join(ESTIMATE_FILE);
    let text = fs::read_to_string(&path).map_err(|source| ReportError::Io {
        action: "read",
        path: path.clone(),
        source,
    })?;
    let report: Report = serde_json::from_str(&text).map_err(|e| malformed(&path, &e))?;

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
    let mut summary = summary(&report);
    summary.push_str("\nwrote:");
    for f in &files {
        let _ = write!(summary, "\n  {}", f.display());
    }
    Ok(Rendered { files, summary })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    fs::write(path, bytes).map_err(|source| ReportError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    })
}

fn malformed(path: &Path, e: &serde_json::Error) -> ReportError {
    let (line, column) = (e.line(), e.column());
    let full = e.to_string();
    let suffix = format!(" at line {line} column {column}");
    let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    ReportError::Malformed {
        path: path.to_path_buf(),
        line,
        column,
        message,
    }
}

/// A few lines for a terminal: whether it fits, cycles per weight update, samples/s and each
/// IPU's memory (no trailing newline).
pub fn summary(report: &Report) -> String {
    let e = &report.estimate;
    let sram = report.machine.sram_bytes_per_tile;
    let mut s = String::new();
    let _ = writeln!(s, "{}", report.title);
    match (&e.out_of_memory, e.fits) {
        (_, true) => {
            let max = e.ipus.iter().map(|r| r.max_tile_bytes).max().unwrap_or(0);
            let _ = write!(
                s,
                "fits: yes (fullest tile {} of {})",
                bytes(max),
                bytes(sram)
            );
        }
        (Some(o), false) => {
            let _ = write!(
                s,
                "fits: NO (tile {} needs {} of {}; {} tile(s) over)",
                o.tile,
                bytes(o.needed),
                bytes(o.available),
                o.tiles_over
            );
        }
        (None, false) => s.push_str("fits: NO"),
    }
    let _ = write!(
        s,
        "\ncycles per weight update: {} (pipeline {}, all-reduce {}, weight update {}), {} per update",
        group(e.cycles_per_weight_update),
        group(e.pipeline_cycles),
        group(e.all_reduce_cycles),
        group(e.weight_update_cycles),
        seconds(e.seconds_per_weight_update)
    );
    let _ = write!(
        s,
        "\nsamples/s: {} ({} samples per weight update)",
        float1(e.samples_per_second),
        group(e.samples_per_weight_update)
    );
    for r in &e.ipus {
        let _ = write!(
            s,
            "\nIPU {}: {} used, fullest tile {} of {}, {} tiles used, idle {}",
            r.ipu,
            bytes(r.bytes_used),
            bytes(r.max_tile_bytes),
            bytes(sram),
            group(r.tiles_used as u64),
            percent(r.idle_fraction)
        );
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Chrome trace

const TID_STAGES: u64 = 1;
const TID_PHASES: u64 = 2;
const TID_UPDATE: u64 = 3;

/// The Chrome trace (JSON object form) of one weight update: see the module documentation.
pub fn chrome_trace(report: &Report) -> Value {
    chrome_trace_with_limit(report, MAX_PHASE_SLICES)
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Compute => "compute",
        Phase::Exchange => "exchange",
        Phase::Sync => "sync",
        Phase::HostToDevice | Phase::DeviceToHost => "host",
        Phase::RemoteBuffer => "remote buffer",
    }
}

/// IPUs of one replica: rows, runs and stages all counted.
fn ipu_count(e: &SystemEstimate) -> usize {
    let rows = e.ipus.iter().map(|r| r.ipu + 1).max().unwrap_or(0);
    let runs = e.runs.iter().map(|r| r.ipu + 1).max().unwrap_or(0);
    let stages = e.stages.iter().map(|s| s.ipu + 1).max().unwrap_or(0);
    rows.max(runs).max(stages).max(e.ipus.len())
}

fn stage_row(e: &SystemEstimate, stage: usize) -> Option<&StageRow> {
    match e.stages.get(stage) {
        Some(s) if s.stage == stage => Some(s),
        _ => e.stages.iter().find(|s| s.stage == stage),
    }
}

/// The superstep events of one run, with starts from the run's start and whether each is a
/// recomputed forward. A recomputing backward (its cycles are its phases' plus the forward's)
/// replays the forward first.
fn run_events<'a>(stage: &'a StageRow, run: &SlotRun) -> Vec<(u64, &'a TraceEvent, bool)> {
    if !run.backward {
        return stage.forward_trace.iter().map(|e| (0, e, false)).collect();
    }
    let own = stage.backward_phases.total();
    let recompute = stage.forward_cycles > 0
        && !stage.forward_trace.is_empty()
        && stage.backward_cycles.checked_sub(own) == Some(stage.forward_cycles);
    let mut v = Vec::new();
    let mut offset = 0;
    if recompute {
        v.extend(stage.forward_trace.iter().map(|e| (0, e, true)));
        offset = stage.forward_cycles;
    }
    v.extend(stage.backward_trace.iter().map(|e| (offset, e, false)));
    v
}

fn phase_slice(ev: &TraceEvent, at: u64, pid: usize, tid: u64, extra: &[(&str, Value)]) -> Value {
    let mut args = serde_json::Map::new();
    args.insert("op".into(), json!(ev.op));
    args.insert("superstep".into(), json!(ev.superstep));
    args.insert(
        "tiles".into(),
        json!(format!("{}-{}", ev.tiles.0, ev.tiles.1)),
    );
    args.insert("cycles".into(), json!(ev.cycles));
    match ev.phase {
        Phase::HostToDevice => {
            args.insert("direction".into(), json!("host to device"));
        }
        Phase::DeviceToHost => {
            args.insert("direction".into(), json!("device to host"));
        }
        _ => {}
    }
    for (k, v) in extra {
        args.insert((*k).to_string(), v.clone());
    }
    json!({
        "name": phase_name(ev.phase),
        "cat": "phase",
        "ph": "X",
        "ts": at.saturating_add(ev.start),
        "dur": ev.cycles,
        "pid": pid,
        "tid": tid,
        "args": Value::Object(args),
    })
}

fn metadata(name: &str, pid: usize, tid: u64, args: Value) -> Value {
    json!({ "name": name, "ph": "M", "pid": pid, "tid": tid, "args": args })
}

/// [`chrome_trace`] with at most `limit` BSP-phase slices (pipeline runs are detailed in
/// timeline order, then the weight updates, until the next would pass the limit); every stage
/// slice is kept. `otherData` says how many phase slices were left out.
pub fn chrome_trace_with_limit(report: &Report, limit: usize) -> Value {
    let e = &report.estimate;
    let mut events: Vec<Value> = Vec::new();
    for d in 0..ipu_count(e) {
        let pid = d + 1;
        events.push(metadata(
            "process_name",
            pid,
            0,
            json!({ "name": format!("IPU {d}") }),
        ));
        events.push(metadata(
            "process_sort_index",
            pid,
            0,
            json!({ "sort_index": d }),
        ));
        for (tid, name) in [
            (TID_STAGES, "pipeline stages"),
            (TID_PHASES, "BSP phases"),
            (TID_UPDATE, "weight update"),
        ] {
            events.push(metadata("thread_name", pid, tid, json!({ "name": name })));
            events.push(metadata(
                "thread_sort_index",
                pid,
                tid,
                json!({ "sort_index": tid }),
            ));
        }
    }

    // Stage slices: always every run.
    for r in &e.runs {
        let direction = if r.backward { "backward" } else { "forward" };
        events.push(json!({
            "name": format!("stage {} {direction} mb {}", r.stage, r.micro_batch),
            "cat": "stage",
            "ph": "X",
            "ts": r.start,
            "dur": r.cycles,
            "pid": r.ipu + 1,
            "tid": TID_STAGES,
            "args": {
                "stage": r.stage,
                "micro_batch": r.micro_batch,
                "step": r.step,
                "cycles": r.cycles,
                "direction": direction,
            },
        }));
    }

    // Phase slices of each run, in timeline order, while the budget lasts.
    let mut budget = limit;
    let mut phase_slices = 0usize;
    let mut omitted = 0usize;
    let mut runs_detailed = 0usize;
    let mut exhausted = false;
    for r in &e.runs {
        let Some(stage) = stage_row(e, r.stage) else {
            continue;
        };
        let evs = run_events(stage, r);
        if exhausted || evs.len() > budget {
            exhausted = true;
            omitted += evs.len();
            continue;
        }
        budget -= evs.len();
        phase_slices += evs.len();
        runs_detailed += 1;
        for (offset, ev, recomputed) in evs {
            let mut extra = vec![
                ("stage", json!(r.stage)),
                ("micro_batch", json!(r.micro_batch)),
                (
                    "pass",
                    json!(if r.backward { "backward" } else { "forward" }),
                ),
            ];
            if recomputed {
                extra.push(("recomputed", json!(true)));
            }
            events.push(phase_slice(
                ev,
                r.start.saturating_add(offset),
                r.ipu + 1,
                TID_PHASES,
                &extra,
            ));
        }
    }

    // After the pipeline: the replicas' all-reduce, then every IPU's weight update.
    let update_start = e.pipeline_cycles.saturating_add(e.all_reduce_cycles);
    for row in &e.ipus {
        let pid = row.ipu + 1;
        if e.all_reduce_cycles > 0 {
            events.push(json!({
                "name": "all-reduce",
                "cat": "all-reduce",
                "ph": "X",
                "ts": e.pipeline_cycles,
                "dur": e.all_reduce_cycles,
                "pid": pid,
                "tid": TID_STAGES,
                "args": { "cycles": e.all_reduce_cycles, "replicas": e.replicas },
            }));
        }
        let trained = e.weight_update_cycles > 0 || !row.update_trace.is_empty();
        if !trained {
            continue;
        }
        events.push(json!({
            "name": "weight update",
            "cat": "update",
            "ph": "X",
            "ts": update_start,
            "dur": row.weight_update_cycles,
            "pid": pid,
            "tid": TID_STAGES,
            "args": {
                "cycles": row.weight_update_cycles,
                "slowest_ipu_cycles_with_sync": e.weight_update_cycles,
            },
        }));
        if row.update_trace.len() > budget || exhausted {
            exhausted = true;
            omitted += row.update_trace.len();
            continue;
        }
        budget -= row.update_trace.len();
        phase_slices += row.update_trace.len();
        for ev in &row.update_trace {
            events.push(phase_slice(ev, update_start, pid, TID_UPDATE, &[]));
        }
    }

    json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "title": report.title,
            "command": report.command,
            "machine": report.machine_name,
            "time_unit": "ts and dur are IPU cycles: 1 trace microsecond = 1 cycle; seconds = cycles / clock_hz",
            "clock_hz": report.machine.clock_hz,
            "schedule": e.schedule,
            "micro_batches_per_weight_update": e.accumulation,
            "replicas": e.replicas,
            "cycles_per_weight_update": e.cycles_per_weight_update,
            "pipeline_cycles": e.pipeline_cycles,
            "all_reduce_cycles": e.all_reduce_cycles,
            "weight_update_cycles": e.weight_update_cycles,
            "runs": e.runs.len(),
            "runs_with_phases": runs_detailed,
            "phase_slices": phase_slices,
            "phase_slices_omitted": omitted,
            "phase_slice_limit": limit,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Text helpers

/// Escapes text for HTML and XML (element content and quoted attributes).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // XML 1.0 forbids most control characters even as references.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// `1234567` as `1,234,567`.
fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A float with one decimal and grouped thousands; `n/a` when not finite.
fn float1(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let neg = x < 0.0;
    let tenths = (x.abs() * 10.0).round();
    if tenths >= 1e18 {
        return format!("{x:.3e}");
    }
    let tenths = tenths as u64;
    format!(
        "{}{}.{}",
        if neg && tenths > 0 { "-" } else { "" },
        group(tenths / 10),
        tenths % 10
    )
}

/// [`float1`] without a trailing `.0`.
fn short_float(x: f64) -> String {
    let s = float1(x);
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
}

/// Bytes in binary units: `512 B`, `13.9 KiB`, `13.42 MiB`.
fn bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    let x = n as f64;
    if n < 1024 {
        format!("{n} B")
    } else if x < KIB * KIB {
        format!("{:.1} KiB", x / KIB)
    } else if x < KIB * KIB * KIB {
        format!("{:.2} MiB", x / (KIB * KIB))
    } else {
        format!("{:.2} GiB", x / (KIB * KIB * KIB))
    }
}

fn percent(f: f64) -> String {
    if f.is_finite() {
        format!("{:.1}%", f * 100.0)
    } else {
        "n/a".into()
    }
}

/// Seconds with a readable unit: `70.8 µs`, `1.23 ms`, `2.50 s`.
fn seconds(s: f64) -> String {
    if !s.is_finite() {
        "n/a".into()
    } else if s == 0.0 {
        "0 s".into()
    } else if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

/// A pixel coordinate: at most two decimals, no trailing zeros.
fn px(v: f64) -> String {
    if !v.is_finite() {
        return "0".into();
    }
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" || s.is_empty() {
        "0".into()
    } else {
        s.to_string()
    }
}

/// A step of 1, 2 or 5 times a power of ten near `raw` (at least `raw`); 1 for nonsense.
fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return 1.0;
    }
    let base = 10f64.powf(raw.log10().floor());
    let f = raw / base;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * base
}

/// Axis ticks from 0 to at least `max` with about `target` intervals: (ticks, axis top). The
/// top is the last tick, so the axis ends on a label; of the steps 1, 2 or 5 times a power of
/// ten giving between 2/3 and 5/3 of `target` intervals, the one with the lowest top wins (then
/// the one nearest `target`). `min_step` keeps integer axes integral.
fn axis_ticks(max: f64, target: usize, min_step: f64) -> (Vec<f64>, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        min_step.max(1.0)
    };
    let target = target.max(1);
    let intervals = |step: f64| (max / step - 1e-9).ceil().max(1.0) as usize;
    let (lo, hi) = ((target * 2).div_ceil(3), target * 5 / 3 + 1);
    let base = nice_step(max / target as f64);
    let power = 10f64.powf((max / target as f64).log10().floor());
    let mut best: Option<(f64, usize, f64)> = None; // (top, distance from target, step)
    for scale in [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0] {
        let step = power * scale;
        if step < min_step {
            continue;
        }
        let n = intervals(step);
        if n < lo || n > hi {
            continue;
        }
        let candidate = (n as f64 * step, n.abs_diff(target), step);
        let better = best.is_none_or(|(top, dist, _)| {
            candidate.0 < top - 1e-9 * top
                || (candidate.0 <= top + 1e-9 * top && candidate.1 < dist)
        });
        if better {
            best = Some(candidate);
        }
    }
    let step = best.map_or(base.max(min_step), |(_, _, step)| step);
    let n = intervals(step);
    let ticks: Vec<f64> = (0..=n).map(|i| i as f64 * step).collect();
    (ticks, n as f64 * step)
}

/// A tick label: grouped integer, or up to two decimals.
fn tick_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 && v.abs() < 1e18 {
        let r = v.round();
        if r < 0.0 {
            format!("-{}", group((-r) as u64))
        } else {
            group(r as u64)
        }
    } else {
        px(v)
    }
}

/// Rough width of `text` at `size` px in a sans-serif font (for layout only).
fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.58
}

/// [`text_width`] for bold text.
fn bold_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.7
}

// ---------------------------------------------------------------------------------------------
// SVG helpers

const FONT: &str = "DejaVu Sans, Verdana, Arial, Helvetica, sans-serif";
const WIDTH: f64 = 1400.0;
const INK: &str = "#222222";
const MUTED: &str = "#666666";
const GRID: &str = "#e6e6e6";
const LIMIT: &str = "#d62728";

fn svg_open(out: &mut String, width: f64, height: f64) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"{FONT}\">\n\
         <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>\n",
        w = px(width),
        h = px(height)
    );
}

#[allow(clippy::too_many_arguments)]
fn text(
    out: &mut String,
    x: f64,
    y: f64,
    size: f64,
    anchor: &str,
    fill: &str,
    weight: &str,
    s: &str,
) {
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" font-size=\"{}\" text-anchor=\"{anchor}\" fill=\"{fill}\"{}>{}</text>",
        px(x),
        px(y),
        px(size),
        if weight.is_empty() {
            String::new()
        } else {
            format!(" font-weight=\"{weight}\"")
        },
        escape(s)
    );
}

fn line(out: &mut String, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, extra: &str) {
    let _ = writeln!(
        out,
        "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{stroke}\"{extra}/>",
        px(x1),
        px(y1),
        px(x2),
        px(y2)
    );
}

fn rect(out: &mut String, x: f64, y: f64, w: f64, h: f64, fill: &str, extra: &str) {
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{fill}\"{extra}/>",
        px(x),
        px(y),
        px(w.max(0.0)),
        px(h.max(0.0))
    );
}

/// Swatches with labels, wrapped to `width`; returns the height used.
fn legend(out: &mut String, x0: f64, y0: f64, width: f64, items: &[(&str, &str, bool)]) -> f64 {
    let (mut x, mut y) = (x0, y0);
    const ROW: f64 = 20.0;
    for &(colour, label, dashed) in items {
        let w = 18.0 + text_width(label, 12.0) + 18.0;
        if x > x0 && x + w > x0 + width {
            x = x0;
            y += ROW;
        }
        if dashed {
            line(
                out,
                x,
                y + 6.0,
                x + 13.0,
                y + 6.0,
                colour,
                " stroke-width=\"2\" stroke-dasharray=\"4 2\"",
            );
        } else {
            rect(out, x, y, 12.0, 12.0, colour, "");
        }
        text(out, x + 18.0, y + 10.5, 12.0, "start", INK, "", label);
        x += w;
    }
    y + ROW - y0
}

// ---------------------------------------------------------------------------------------------
// Memory picture

/// Memory categories bottom to top, with their colours and legend names.
const CATEGORIES: [(&str, &str); 9] = [
    ("always-live", "#4e79a7"),
    ("not-always-live", "#59a14f"),
    ("stash", "#b07aa1"),
    ("vertex code", "#f28e2b"),
    ("vertex state", "#edc948"),
    ("exchange code", "#76b7b2"),
    ("exchange buffers", "#9c755f"),
    ("control code", "#bab0ac"),
    ("stack", "#ff9da7"),
];

fn category_bytes(t: &TileMemory) -> [u64; 9] {
    [
        t.always_live,
        t.not_always_live,
        t.stash,
        t.vertex_code,
        t.vertex_state,
        t.exchange_code,
        t.exchange_buffers,
        t.control_code,
        t.stack,
    ]
}

const MEM_LEFT: f64 = 78.0;
const MEM_RIGHT: f64 = 24.0;
const MEM_PANEL: f64 = 330.0;
const MEM_PLOT: f64 = 240.0;

/// Per IPU, every tile's memory stacked by category, with the SRAM limit.
pub fn memory_svg(report: &Report) -> String {
    let e = &report.estimate;
    let sram = report.machine.sram_bytes_per_tile;
    let mut body = String::new();
    let title = format!("Memory per tile: {}", report.title);
    text(&mut body, 20.0, 30.0, 18.0, "start", INK, "bold", &title);
    let sub = format!(
        "{} ({} tiles, {} SRAM per tile); each tile's memory at its peak, stacked by category",
        report.machine_name,
        group(u64::from(report.machine.tiles)),
        bytes(sram)
    );
    text(&mut body, 20.0, 50.0, 12.0, "start", MUTED, "", &sub);
    let mut items: Vec<(&str, &str, bool)> =
        CATEGORIES.iter().map(|&(n, c)| (c, n, false)).collect();
    items.push((LIMIT, "SRAM limit", true));
    let legend_h = legend(&mut body, 20.0, 62.0, WIDTH - 40.0, &items);
    let mut top = 62.0 + legend_h + 8.0;
    if e.ipus.is_empty() {
        text(
            &mut body,
            WIDTH / 2.0,
            top + 40.0,
            14.0,
            "middle",
            MUTED,
            "",
            "no IPUs in this estimate",
        );
        top += 70.0;
    }
    for row in &e.ipus {
        memory_panel(&mut body, top, row.ipu, &row.tiles, &row.stages, sram);
        top += MEM_PANEL;
    }
    let mut out = String::new();
    svg_open(&mut out, WIDTH, top + 6.0);
    out.push_str(&body);
    out.push_str("</svg>\n");
    out
}

fn memory_panel(
    out: &mut String,
    top: f64,
    ipu: usize,
    tiles: &[TileMemory],
    stages: &[usize],
    sram: u64,
) {
    let plot_w = WIDTH - MEM_LEFT - MEM_RIGHT;
    let plot_top = top + 44.0;
    let plot_bottom = plot_top + MEM_PLOT;
    let used: u64 = tiles.iter().map(TileMemory::total).sum();
    // The fullest tile, lowest index on ties.
    let fullest = tiles
        .iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.total().cmp(&b.total()).then(j.cmp(i)));
    let max = fullest.map_or(0, |(_, t)| t.total());
    let heading = match fullest {
        Some((i, t)) => format!(
            "IPU {ipu}: {} used, fullest tile {} {} of {}",
            bytes(used),
            tile_id(i, t),
            bytes(max),
            bytes(sram)
        ),
        None => format!("IPU {ipu}: no tiles"),
    };
    let over = tiles.iter().filter(|t| t.total() > sram).count();
    let note = if over > 0 {
        format!(
            "<tspan fill=\"{LIMIT}\">  ({} tile{} over the limit)</tspan>",
            group(over as u64),
            if over == 1 { "" } else { "s" }
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "<text x=\"20\" y=\"{}\" font-size=\"15\" fill=\"{INK}\" font-weight=\"bold\" xml:space=\"preserve\">{}{note}</text>",
        px(top + 20.0),
        escape(&heading)
    );
    let stage_list: Vec<String> = stages.iter().map(usize::to_string).collect();
    let holding = tiles
        .iter()
        .filter(|t| t.always_live + t.not_always_live + t.vertex_state > 0)
        .count();
    let right = format!(
        "stage{} {}; {} of {} tiles hold tensors or vertices",
        if stages.len() == 1 { "" } else { "s" },
        if stage_list.is_empty() {
            "none".to_string()
        } else {
            stage_list.join(", ")
        },
        group(holding as u64),
        group(tiles.len() as u64)
    );
    text(
        out,
        WIDTH - MEM_RIGHT,
        top + 20.0,
        12.0,
        "end",
        MUTED,
        "",
        &right,
    );

    // Scale: include the SRAM limit unless the data is far below it.
    let limit_on_scale = sram > 0 && (max == 0 || max.saturating_mul(4) >= sram);
    let kib = 1024.0;
    let data_top = if limit_on_scale {
        sram.max(max) as f64 / kib * 1.06
    } else {
        max as f64 / kib * 1.08
    };
    let (ticks, axis_top) = axis_ticks(data_top, 6, 0.0);
    let y_of = |b: f64| plot_bottom - (b / kib) / axis_top * MEM_PLOT;

    // Grid and y axis.
    for &t in &ticks {
        let y = plot_bottom - t / axis_top * MEM_PLOT;
        if t > 0.0 {
            line(out, MEM_LEFT, y, MEM_LEFT + plot_w, y, GRID, "");
        }
        line(out, MEM_LEFT - 5.0, y, MEM_LEFT, y, INK, "");
        text(
            out,
            MEM_LEFT - 8.0,
            y + 4.0,
            11.0,
            "end",
            INK,
            "",
            &tick_label(t),
        );
    }
    let mid = (plot_top + plot_bottom) / 2.0;
    let _ = writeln!(
        out,
        "<text x=\"22\" y=\"{y}\" font-size=\"12\" text-anchor=\"middle\" fill=\"{INK}\" transform=\"rotate(-90 22 {y})\">KiB</text>",
        y = px(mid)
    );

    if tiles.is_empty() {
        text(
            out,
            MEM_LEFT + plot_w / 2.0,
            mid,
            14.0,
            "middle",
            MUTED,
            "",
            "no tile memory in this estimate",
        );
    } else {
        let per_tile = plot_w / tiles.len() as f64;
        // One path per category; runs of neighbouring tiles with the same segment merge.
        let stacks: Vec<[u64; 9]> = tiles.iter().map(category_bytes).collect();
        for (c, &(name, colour)) in CATEGORIES.iter().enumerate() {
            let mut d = String::new();
            let mut t = 0;
            while t < stacks.len() {
                let low: u64 = stacks[t][..c].iter().sum();
                let high = low + stacks[t][c];
                let mut end = t + 1;
                while end < stacks.len() && stacks[end][c] == stacks[t][c] && {
                    let l: u64 = stacks[end][..c].iter().sum();
                    l == low
                } {
                    end += 1;
                }
                if high > low {
                    let _ = write!(
                        d,
                        "M{} {}H{}V{}H{}Z",
                        px(MEM_LEFT + t as f64 * per_tile),
                        px(y_of(high as f64)),
                        px(MEM_LEFT + end as f64 * per_tile),
                        px(y_of(low as f64)),
                        px(MEM_LEFT + t as f64 * per_tile)
                    );
                }
                t = end;
            }
            if !d.is_empty() {
                let _ = writeln!(
                    out,
                    "<path d=\"{d}\" fill=\"{colour}\" shape-rendering=\"crispEdges\"><title>{}</title></path>",
                    escape(name)
                );
            }
        }
        // The fullest tile: a marker above its bar.
        if let Some((i, t)) = fullest.filter(|_| max > 0) {
            let x = MEM_LEFT + (i as f64 + 0.5) * per_tile;
            let y = y_of(max as f64) - 3.0;
            let _ = writeln!(
                out,
                "<path d=\"M{} {}L{} {}L{} {}Z\" fill=\"{INK}\"/>",
                px(x),
                px(y),
                px(x - 5.0),
                px(y - 8.0),
                px(x + 5.0),
                px(y - 8.0)
            );
            let label = format!("fullest: tile {} ({})", tile_id(i, t), bytes(max));
            let w = text_width(&label, 11.0);
            let (lx, anchor) = if x + 8.0 + w < MEM_LEFT + plot_w {
                (x + 8.0, "start")
            } else {
                (x - 8.0, "end")
            };
            text(out, lx, y - 1.0, 11.0, anchor, INK, "", &label);
        }
    }

    // The SRAM limit.
    if limit_on_scale {
        let y = y_of(sram as f64);
        line(
            out,
            MEM_LEFT,
            y,
            MEM_LEFT + plot_w,
            y,
            LIMIT,
            " stroke-width=\"1.5\" stroke-dasharray=\"6 3\"",
        );
        let label = format!("SRAM limit {}", bytes(sram));
        text(
            out,
            MEM_LEFT + plot_w - 4.0,
            y - 5.0,
            11.0,
            "end",
            LIMIT,
            "bold",
            &label,
        );
    } else if sram > 0 {
        let label = format!(
            "SRAM limit {} is off this scale: the fullest tile uses {} of it",
            bytes(sram),
            percent(max as f64 / sram as f64)
        );
        let x = MEM_LEFT + plot_w - 4.0;
        text(out, x, plot_top + 12.0, 11.0, "end", LIMIT, "bold", &label);
    }

    // Plot frame and x axis.
    line(out, MEM_LEFT, plot_top, MEM_LEFT, plot_bottom, INK, "");
    line(
        out,
        MEM_LEFT,
        plot_bottom,
        MEM_LEFT + plot_w,
        plot_bottom,
        INK,
        "",
    );
    if !tiles.is_empty() {
        let per_tile = plot_w / tiles.len() as f64;
        let (xt, _) = axis_ticks(tiles.len() as f64, 12, 1.0);
        for &t in xt.iter().filter(|&&t| t < tiles.len() as f64) {
            let x = MEM_LEFT + (t + 0.5) * per_tile;
            line(out, x, plot_bottom, x, plot_bottom + 4.0, INK, "");
            text(
                out,
                x,
                plot_bottom + 16.0,
                11.0,
                "middle",
                INK,
                "",
                &tick_label(t),
            );
        }
    }
    text(
        out,
        MEM_LEFT + plot_w / 2.0,
        plot_bottom + 33.0,
        12.0,
        "middle",
        INK,
        "",
        "tile",
    );
}

fn tile_id(index: usize, t: &TileMemory) -> String {
    // Tiles carry their own id; fall back on the index when a file has none.
    if t.tile == 0 && index != 0 {
        index.to_string()
    } else {
        t.tile.to_string()
    }
}

// ---------------------------------------------------------------------------------------------
// Timeline picture

const FORWARD: &str = "#4e79a7";
const BACKWARD: &str = "#f28e2b";
const UPDATE: &str = "#59a14f";
const ALL_REDUCE: &str = "#9c755f";
const TL_LEFT: f64 = 140.0;
const TL_RIGHT: f64 = 30.0;
const TL_ROW: f64 = 46.0;
const TL_BAR: f64 = 32.0;

/// The pipeline: one row per stage, each run a block, then the all-reduce and weight update.
pub fn timeline_svg(report: &Report) -> String {
    let e = &report.estimate;
    let mut body = String::new();
    let title = format!(
        "Pipeline timeline: {} schedule, M = {}, {} cycles per weight update ({})",
        e.schedule,
        e.accumulation,
        group(e.cycles_per_weight_update),
        seconds(e.seconds_per_weight_update)
    );
    text(&mut body, 20.0, 30.0, 18.0, "start", INK, "bold", &title);
    text(
        &mut body,
        20.0,
        50.0,
        12.0,
        "start",
        MUTED,
        "",
        &format!("{} on {}", report.title, report.machine_name),
    );
    let mut items: Vec<(&str, &str, bool)> = vec![
        (FORWARD, "forward (F = micro-batch)", false),
        (BACKWARD, "backward (B = micro-batch)", false),
    ];
    if e.all_reduce_cycles > 0 {
        items.push((ALL_REDUCE, "all-reduce", false));
    }
    if e.weight_update_cycles > 0 {
        items.push((UPDATE, "weight update", false));
    }
    items.push(("#999999", "pipeline step boundary", true));
    let legend_h = legend(&mut body, 20.0, 62.0, WIDTH - 40.0, &items);
    let plot_top = 62.0 + legend_h + 22.0;
    let plot_w = WIDTH - TL_LEFT - TL_RIGHT;

    // Rows: every stage the estimate or its runs know, in order.
    let mut rows: Vec<(usize, usize)> = e.stages.iter().map(|s| (s.stage, s.ipu)).collect();
    for r in &e.runs {
        if !rows.iter().any(|&(k, _)| k == r.stage) {
            rows.push((r.stage, r.ipu));
        }
    }
    rows.sort_unstable();
    rows.dedup_by_key(|r| r.0);

    let update_start = e.pipeline_cycles.saturating_add(e.all_reduce_cycles);
    let update_of = |ipu: usize| {
        e.ipus
            .iter()
            .find(|r| r.ipu == ipu)
            .map_or(0, |r| r.weight_update_cycles)
    };
    let run_end = e
        .runs
        .iter()
        .map(|r| r.start.saturating_add(r.cycles))
        .max()
        .unwrap_or(0);
    let update_end = e
        .ipus
        .iter()
        .map(|r| update_start.saturating_add(r.weight_update_cycles))
        .max()
        .unwrap_or(0);
    let total = e
        .cycles_per_weight_update
        .max(run_end)
        .max(e.pipeline_cycles)
        .max(update_end);

    let rows_h = TL_ROW * rows.len().max(1) as f64;
    let plot_bottom = plot_top + rows_h;
    let height = plot_bottom + 60.0;

    if total == 0 || rows.is_empty() {
        text(
            &mut body,
            TL_LEFT + plot_w / 2.0,
            plot_top + rows_h / 2.0 + 5.0,
            14.0,
            "middle",
            MUTED,
            "",
            "no stage runs in this estimate",
        );
        return close_timeline(body, plot_top, plot_bottom, plot_w, height);
    }

    let (ticks, axis_top) = axis_ticks(total as f64, 10, 1.0);
    let x_of = |c: u64| TL_LEFT + c as f64 / axis_top * plot_w;

    // Row bands and labels.
    for (i, &(stage, ipu)) in rows.iter().enumerate() {
        let y = plot_top + i as f64 * TL_ROW;
        if i % 2 == 1 {
            rect(&mut body, TL_LEFT, y, plot_w, TL_ROW, "#f6f6f6", "");
        }
        text(
            &mut body,
            TL_LEFT - 10.0,
            y + TL_ROW / 2.0 + 4.5,
            13.0,
            "end",
            INK,
            "",
            &format!("stage {stage} (IPU {ipu})"),
        );
    }
    // Grid: cycle ticks.
    for &t in &ticks {
        let x = TL_LEFT + t / axis_top * plot_w;
        if t > 0.0 {
            line(&mut body, x, plot_top, x, plot_bottom, GRID, "");
        }
        line(&mut body, x, plot_bottom, x, plot_bottom + 5.0, INK, "");
        text(
            &mut body,
            x,
            plot_bottom + 18.0,
            11.0,
            "middle",
            INK,
            "",
            &tick_label(t),
        );
    }
    let mhz = report.machine.clock_hz / 1e6;
    let axis_title = if mhz.is_finite() && mhz > 0.0 {
        let mhz = short_float(mhz);
        format!("cycles (1 µs = {mhz} cycles at {mhz} MHz)")
    } else {
        "cycles".to_string()
    };
    text(
        &mut body,
        TL_LEFT + plot_w / 2.0,
        plot_bottom + 38.0,
        12.0,
        "middle",
        INK,
        "",
        &axis_title,
    );

    // Step boundaries: where each step's first run starts.
    let mut step_starts: Vec<(usize, u64)> = Vec::new();
    for r in &e.runs {
        match step_starts.iter_mut().find(|(s, _)| *s == r.step) {
            Some((_, at)) => *at = (*at).min(r.start),
            None => step_starts.push((r.step, r.start)),
        }
    }
    step_starts.sort_unstable();
    // Label the steps only when no two labels would collide (the update's label included).
    let mut marks: Vec<u64> = step_starts.iter().map(|&(_, at)| at).collect();
    marks.push(e.pipeline_cycles);
    let label_steps = marks.windows(2).all(|w| x_of(w[1]) - x_of(w[0]) >= 44.0);
    for &(step, at) in &step_starts {
        let x = x_of(at);
        line(
            &mut body,
            x,
            plot_top - 14.0,
            x,
            plot_bottom,
            "#999999",
            " stroke-dasharray=\"3 3\"",
        );
        if label_steps {
            text(
                &mut body,
                x + 3.0,
                plot_top - 5.0,
                10.0,
                "start",
                MUTED,
                "",
                &format!("step {step}"),
            );
        }
    }
    if e.pipeline_cycles > 0 {
        let x = x_of(e.pipeline_cycles);
        line(
            &mut body,
            x,
            plot_top - 14.0,
            x,
            plot_bottom,
            "#999999",
            " stroke-dasharray=\"3 3\"",
        );
        let label = if e.all_reduce_cycles > 0 {
            "all-reduce, update"
        } else {
            "update"
        };
        if e.weight_update_cycles > 0 || e.all_reduce_cycles > 0 {
            text(
                &mut body,
                x + 3.0,
                plot_top - 5.0,
                10.0,
                "start",
                MUTED,
                "",
                label,
            );
        }
    }

    // Runs.
    let row_of = |stage: usize| rows.iter().position(|&(k, _)| k == stage).unwrap_or(0);
    for r in &e.runs {
        let y = plot_top + row_of(r.stage) as f64 * TL_ROW + (TL_ROW - TL_BAR) / 2.0;
        let (colour, letter, direction) = if r.backward {
            (BACKWARD, 'B', "backward")
        } else {
            (FORWARD, 'F', "forward")
        };
        let x0 = x_of(r.start);
        let w = x_of(r.start.saturating_add(r.cycles)) - x0;
        let tip = format!(
            "stage {} {direction} micro-batch {}: {} cycles from {} (step {})",
            r.stage,
            r.micro_batch,
            group(r.cycles),
            group(r.start),
            r.step
        );
        block(
            &mut body,
            x0,
            y,
            w,
            colour,
            &format!("{letter}{}", r.micro_batch),
            &tip,
        );
    }
    // All-reduce and weight update, on every row of each IPU.
    for (i, &(_, ipu)) in rows.iter().enumerate() {
        let y = plot_top + i as f64 * TL_ROW + (TL_ROW - TL_BAR) / 2.0;
        if e.all_reduce_cycles > 0 {
            let x0 = x_of(e.pipeline_cycles);
            let w = x_of(update_start) - x0;
            let tip = format!("all-reduce: {} cycles", group(e.all_reduce_cycles));
            block(&mut body, x0, y, w, ALL_REDUCE, "all-reduce", &tip);
        }
        let u = update_of(ipu);
        if u > 0 {
            let x0 = x_of(update_start);
            let w = x_of(update_start.saturating_add(u)) - x0;
            let tip = format!("IPU {ipu} weight update: {} cycles", group(u));
            block(&mut body, x0, y, w, UPDATE, "update", &tip);
        }
    }
    close_timeline(body, plot_top, plot_bottom, plot_w, height)
}

/// Draws the timeline's frame (left and bottom axes) and wraps `body` in the SVG element.
fn close_timeline(mut body: String, top: f64, bottom: f64, width: f64, height: f64) -> String {
    line(&mut body, TL_LEFT, top, TL_LEFT, bottom, INK, "");
    line(&mut body, TL_LEFT, bottom, TL_LEFT + width, bottom, INK, "");
    let mut out = String::new();
    svg_open(&mut out, WIDTH, height);
    out.push_str(&body);
    out.push_str("</svg>\n");
    out
}

/// A labelled block of the timeline; the label only when it fits.
fn block(out: &mut String, x: f64, y: f64, w: f64, colour: &str, label: &str, tip: &str) {
    if w <= 0.0 {
        return;
    }
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{colour}\" stroke=\"#ffffff\" stroke-width=\"0.75\"><title>{}</title></rect>",
        px(x),
        px(y),
        px(w),
        px(TL_BAR),
        escape(tip)
    );
    if let Some(size) = [12.0, 10.0]
        .into_iter()
        .find(|&size| bold_width(label, size) + 4.0 <= w)
    {
        text(
            out,
            x + w / 2.0,
            y + TL_BAR / 2.0 + size * 0.38,
            size,
            "middle",
            "#ffffff",
            "bold",
            label,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// HTML page

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:2em auto;max-width:1440px;padding:0 1em;color:#222;line-height:1.4}\n\
h1{font-size:1.5em;margin-bottom:.2em}\n\
h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}\n\
code{background:#f3f3f3;padding:.1em .3em;border-radius:3px;word-break:break-all}\n\
table{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums}\n\
th,td{border:1px solid #ddd;padding:.25em .7em;text-align:right}\n\
th{background:#f6f6f6}\n\
td.k,th.k{text-align:left}\n\
.fits{color:#1a7f37;font-weight:bold}\n\
.oom{color:#c62828;font-weight:bold}\n\
.warn{border-left:4px solid #c62828;background:#fff4f4;padding:.5em 1em}\n\
img{max-width:100%;height:auto;border:1px solid #eee}\n\
.hint{color:#666}\n";

fn row(out: &mut String, key: &str, value: &str) {
    let _ = writeln!(
        out,
        "<tr><th class=\"k\">{}</th><td>{}</td></tr>",
        escape(key),
        value
    );
}

/// The page: title, command, tables, both pictures and a link to the trace.
pub fn html_page(report: &Report) -> String {
    let e = &report.estimate;
    let m = &report.machine;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n",
        escape(&report.title)
    );
    let _ = writeln!(h, "<h1>{}</h1>", escape(&report.title));
    let _ = writeln!(
        h,
        "<p>Command: <code>{}</code></p>",
        escape(&report.command)
    );

    // Summary.
    h.push_str("<h2>Summary</h2>\n<table>\n");
    let fits = if e.fits {
        "<span class=\"fits\">yes</span>".to_string()
    } else {
        match &e.out_of_memory {
            Some(o) => format!(
                "<span class=\"oom\">no</span>: tile {} needs {} of {}",
                o.tile,
                escape(&bytes(o.needed)),
                escape(&bytes(o.available))
            ),
            None => "<span class=\"oom\">no</span>".to_string(),
        }
    };
    row(&mut h, "fits", &fits);
    row(
        &mut h,
        "machine",
        &escape(&format!(
            "{}: {} tiles, {} SRAM per tile, {} MHz",
            report.machine_name,
            group(u64::from(m.tiles)),
            bytes(m.sram_bytes_per_tile),
            short_float(m.clock_hz / 1e6)
        )),
    );
    row(
        &mut h,
        "IPUs",
        &format!(
            "{} per replica, {} in all",
            e.ipus.len(),
            group(e.ipus_total as u64)
        ),
    );
    row(&mut h, "replicas", &group(e.replicas as u64));
    row(&mut h, "schedule", &escape(&e.schedule));
    row(&mut h, "pipeline stages", &group(e.stages_count as u64));
    row(
        &mut h,
        "micro-batches per weight update (M)",
        &group(e.accumulation as u64),
    );
    row(
        &mut h,
        "samples per weight update",
        &group(e.samples_per_weight_update),
    );
    row(
        &mut h,
        "cycles per weight update",
        &format!("<b>{}</b>", group(e.cycles_per_weight_update)),
    );
    row(&mut h, "pipeline cycles", &group(e.pipeline_cycles));
    row(&mut h, "all-reduce cycles", &group(e.all_reduce_cycles));
    row(
        &mut h,
        "weight-update cycles",
        &group(e.weight_update_cycles),
    );
    row(
        &mut h,
        "time per weight update",
        &escape(&seconds(e.seconds_per_weight_update)),
    );
    row(
        &mut h,
        "samples/s",
        &format!("<b>{}</b>", float1(e.samples_per_second)),
    );
    row(
        &mut h,
        "weight updates per execution (R)",
        &group(e.repeat_count as u64),
    );
    row(
        &mut h,
        "cycles per execution",
        &group(e.cycles_per_execution),
    );
    h.push_str("</table>\n");

    if let Some(o) = &e.out_of_memory {
        let _ = writeln!(
            h,
            "<div class=\"warn\"><p><b>Out of memory.</b> {}</p></div>",
            escape(&o.to_string())
        );
    }

    // Per IPU.
    h.push_str("<h2>IPUs</h2>\n<table>\n<tr><th>IPU</th><th class=\"k\">stages</th><th>bytes used</th><th>fullest tile</th><th>tiles used</th><th>stash</th><th>streaming memory</th><th>busy cycles</th><th>idle cycles</th><th>idle</th><th>weight-update cycles</th></tr>\n");
    for r in &e.ipus {
        let stages: Vec<String> = r.stages.iter().map(usize::to_string).collect();
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"k\">{}</td><td title=\"{} bytes\">{}</td><td title=\"{} bytes\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.ipu,
            escape(&stages.join(", ")),
            group(r.bytes_used),
            escape(&bytes(r.bytes_used)),
            group(r.max_tile_bytes),
            escape(&bytes(r.max_tile_bytes)),
            group(r.tiles_used as u64),
            escape(&bytes(r.stash_bytes)),
            escape(&bytes(r.streaming_memory_bytes)),
            group(r.busy_cycles),
            group(r.idle_cycles),
            percent(r.idle_fraction),
            group(r.weight_update_cycles)
        );
    }
    h.push_str("</table>\n");

    // Per stage.
    h.push_str("<h2>Pipeline stages</h2>\n<table>\n<tr><th>stage</th><th>position</th><th>IPU</th><th>forward cycles</th><th>backward cycles</th><th>stash depth</th><th>stash entry</th><th>idle (its IPU)</th></tr>\n");
    for s in &e.stages {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            s.stage,
            s.position,
            s.ipu,
            group(s.forward_cycles),
            group(s.backward_cycles),
            s.stash_depth,
            escape(&bytes(s.stash_entry_bytes)),
            percent(s.idle_fraction)
        );
    }
    h.push_str("</table>\n");

    // Training results.
    if let Some(t) = &report.training {
        h.push_str("<h2>Training</h2>\n");
        training_table(&mut h, t);
    }

    h.push_str("<h2>Memory per tile</h2>\n");
    let _ = writeln!(
        h,
        "<p><img src=\"{MEMORY_FILE}\" alt=\"memory of every tile of every IPU, by category\"></p>"
    );
    h.push_str("<h2>Pipeline timeline</h2>\n");
    let _ = writeln!(
        h,
        "<p><img src=\"{TIMELINE_FILE}\" alt=\"pipeline stage runs over one weight update\"></p>"
    );
    h.push_str("<h2>Trace</h2>\n");
    let _ = writeln!(
        h,
        "<p><a href=\"{TRACE_FILE}\">{TRACE_FILE}</a>: every superstep of one weight update. <span class=\"hint\">Open it at <a href=\"https://ui.perfetto.dev\">ui.perfetto.dev</a> (Open trace file) or in chrome://tracing; one trace microsecond is one IPU cycle.</span></p>"
    );
    let _ = writeln!(
        h,
        "<p class=\"hint\">Rendered from <a href=\"{ESTIMATE_FILE}\">{ESTIMATE_FILE}</a>.</p>"
    );
    h.push_str("</body>\n</html>\n");
    h
}

/// Top-level scalar fields of a JSON object as a table; other values summarised.
fn training_table(h: &mut String, t: &Value) {
    let scalar = |v: &Value| match v {
        Value::Null => Some("null".to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    };
    match t {
        Value::Object(map) => {
            h.push_str("<table>\n");
            let mut nested = Vec::new();
            for (k, v) in map {
                match scalar(v) {
                    Some(s) => row(h, k, &escape(&s)),
                    None => nested.push(k.as_str()),
                }
            }
            h.push_str("</table>\n");
            if !nested.is_empty() {
                let _ = writeln!(
                    h,
                    "<p class=\"hint\">Also in {ESTIMATE_FILE}: {}.</p>",
                    escape(&nested.join(", "))
                );
            }
        }
        other => match scalar(other) {
            Some(s) => {
                let _ = writeln!(h, "<p>{}</p>", escape(&s));
            }
            None => {
                let _ = writeln!(
                    h,
                    "<p class=\"hint\">The training results are in {ESTIMATE_FILE}.</p>"
                );
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(escape("a<b & c>\"d'"), "a&lt;b &amp; c&gt;&quot;d&#39;");
        assert_eq!(escape("plain"), "plain");
        assert_eq!(escape("bell\u{7}"), "bell\u{FFFD}");
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(93_809), "93,809");
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(float1(45_210.26), "45,210.3");
        assert_eq!(float1(f64::NAN), "n/a");
    }

    #[test]
    fn formats_bytes_and_seconds() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(14_244), "13.9 KiB");
        assert_eq!(bytes(638_976), "624.0 KiB");
        assert_eq!(bytes(14_069_352), "13.42 MiB");
        assert_eq!(seconds(7.08e-5), "70.8 µs");
        assert_eq!(seconds(0.0123), "12.30 ms");
        assert_eq!(seconds(0.0), "0 s");
    }

    #[test]
    fn pixel_numbers_are_short_and_stable() {
        assert_eq!(px(1.0), "1");
        assert_eq!(px(1.5), "1.5");
        assert_eq!(px(1.234_567), "1.23");
        assert_eq!(px(-0.001), "0");
        assert_eq!(px(f64::NAN), "0");
    }

    #[test]
    fn nice_axis_ticks() {
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(nice_step(13.0), 20.0);
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(100.0), 100.0);
        let (t, top) = axis_ticks(661.4, 6, 0.0);
        assert_eq!(
            t,
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0]
        );
        assert_eq!(top, 700.0);
        let (t, top) = axis_ticks(15.0, 6, 0.0);
        assert_eq!(top, 16.0);
        assert_eq!(t.len(), 9);
        let (t, top) = axis_ticks(93_809.0, 10, 1.0);
        assert_eq!(t.first(), Some(&0.0));
        assert_eq!(top, 100_000.0);
        assert_eq!(t.len(), 11);
        // Small integer axes stay integral; nonsense gives one interval.
        let (t, _) = axis_ticks(3.0, 12, 1.0);
        assert_eq!(t, vec![0.0, 1.0, 2.0, 3.0]);
        let (t, top) = axis_ticks(1472.0, 12, 1.0);
        assert_eq!((t[1], top), (100.0, 1500.0));
        let (t, top) = axis_ticks(f64::NAN, 5, 0.0);
        assert_eq!((t.len(), top), (6, 1.0));
        assert_eq!(tick_label(20_000.0), "20,000");
        assert_eq!(tick_label(2.5), "2.5");
    }

    #[test]
    fn legend_wraps() {
        let mut s = String::new();
        let items = [("#000", "a long legend entry", false); 10];
        let h = legend(&mut s, 0.0, 0.0, 400.0, &items);
        assert!(h >= 60.0, "{h}");
    }
}
