//! Report directories from a real estimate: the MNIST classifier pipelined over two Mk2 IPUs
//! (stages [0, 0, 1, 1], M = 4, Grouped schedule).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::OnceLock;

use resvg::tiny_skia;
use resvg::usvg;
use serde_json::{json, Value};
use tessera_core::models::mnist_mlp_pipelined;
use tessera_core::schedule::Schedule;
use tessera_core::{Accumulation, AccumulationMethod, DType, Fixed, Graph, Optimizer, Plan};
use tessera_host::report::{
    html_page, memory_svg, render_report, timeline_svg, write_report, Report, ReportError,
};
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::system::{estimate_system, SystemOptions};

const FILES: [&str; 5] = [
    "estimate.json",
    "trace.json",
    "memory.svg",
    "timeline.svg",
    "index.html",
];

fn build() -> Report {
    build_with(4, Schedule::Grouped)
}

fn build_with(m: u32, schedule: Schedule) -> Report {
    let mut g: Box<Graph<Fixed<256>>> = Box::new(Graph::new());
    let model = mnist_mlp_pipelined(&mut g, 32, DType::F32, [0, 0, 1, 1]).unwrap();
    let labels = g.input("labels", &[32], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", model.probabilities, labels, false)
        .unwrap();
    g.differentiate_accumulating(
        loss,
        Optimizer::sgd(0.1),
        Accumulation {
            count: m,
            method: AccumulationMethod::Sum,
            dtype: None,
        },
    )
    .unwrap();
    let plan = Box::new(Plan::new(&g).unwrap());
    let machine = IpuConfig::preset(Preset::Mk2);
    let estimate = estimate_system(
        &plan,
        &machine,
        &SystemOptions {
            micro_batch: 32,
            schedule,
            ..Default::default()
        },
    )
    .unwrap();
    Report {
        title: format!("pipelined classifier: 2 x mk2, {schedule}, M = {m}"),
        command: "tessera estimate --stages 0,0,1,1 --accumulation 4".into(),
        machine_name: "mk2".into(),
        machine,
        estimate,
        training: Some(json!({ "accuracy": 0.9125, "loss": 0.31, "epochs": 2, "history": [1, 2] })),
        layers: Vec::new(),
    }
}

/// The estimate, built once (on a thread with room for the graph).
fn report() -> Report {
    static REPORT: OnceLock<Report> = OnceLock::new();
    REPORT
        .get_or_init(|| {
            std::thread::Builder::new()
                .stack_size(64 << 20)
                .spawn(build)
                .unwrap()
                .join()
                .unwrap()
        })
        .clone()
}

fn read_trace(dir: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap()
}

/// The trace of `r` as JSON, as `trace.json` holds it.
fn chrome_trace(r: &Report) -> Value {
    serde_json::to_value(tessera_host::report::chrome_trace(r)).unwrap()
}

fn chrome_trace_with_limit(r: &Report, limit: usize) -> Value {
    serde_json::to_value(tessera_host::report::chrome_trace_with_limit(r, limit)).unwrap()
}

fn x_events(trace: &Value) -> Vec<&Value> {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect()
}

#[test]
fn write_report_writes_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested").join("report");
    let files = write_report(&out, &report()).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, FILES);
    for f in &files {
        assert!(f.starts_with(&out));
        assert!(
            fs::metadata(f).unwrap().len() > 0,
            "{} is empty",
            f.display()
        );
    }
    // The saved estimate reads back as the same report.
    let saved: Report =
        serde_json::from_str(&fs::read_to_string(out.join("estimate.json")).unwrap()).unwrap();
    assert_eq!(saved.estimate, report().estimate);
    assert_eq!(saved.training, report().training);
}

#[test]
fn trace_has_processes_and_threads() {
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), &report()).unwrap();
    let trace = read_trace(dir.path());
    assert_eq!(trace["displayTimeUnit"], "ns");
    assert!(trace["otherData"]["clock_hz"].as_f64().unwrap() > 1e9);
    assert!(trace["otherData"]["time_unit"]
        .as_str()
        .unwrap()
        .contains("1 cycle"));
    let events = trace["traceEvents"].as_array().unwrap();

    // Process and thread names.
    for (pid, name) in [(1, "IPU 0"), (2, "IPU 1")] {
        assert!(
            events.iter().any(|e| e["ph"] == "M"
                && e["name"] == "process_name"
                && e["pid"] == pid
                && e["args"]["name"] == name),
            "no process_name {name}"
        );
        for thread in ["pipeline stages", "BSP phases", "weight update"] {
            assert!(events.iter().any(|e| e["ph"] == "M"
                && e["name"] == "thread_name"
                && e["pid"] == pid
                && e["args"]["name"] == thread));
        }
    }
}

#[test]
fn trace_has_stage_phase_and_update_slices() {
    let trace = chrome_trace(&report());
    let xs = x_events(&trace);
    // A stage slice for every stage, direction and micro-batch, on the stage's IPU.
    for stage in 0..2u64 {
        for direction in ["forward", "backward"] {
            for mb in 0..4u64 {
                let name = format!("stage {stage} {direction} mb {mb}");
                let found: Vec<_> = xs.iter().filter(|e| e["name"] == name.as_str()).collect();
                assert_eq!(found.len(), 1, "{name}");
                let e = found[0];
                assert_eq!(e["pid"], stage + 1);
                assert_eq!(e["args"]["stage"], stage);
                assert_eq!(e["args"]["micro_batch"], mb);
                assert!(e["args"]["step"].is_u64());
                assert!(e["dur"].as_u64().unwrap() > 0);
                assert_eq!(e["args"]["cycles"], e["dur"]);
            }
        }
    }
    assert_eq!(
        xs.iter()
            .filter(|e| e["name"].as_str().unwrap().starts_with("stage "))
            .count(),
        16
    );
    // Phase slices.
    for phase in ["compute", "exchange", "sync"] {
        let n = xs.iter().filter(|e| e["name"] == phase).count();
        assert!(n > 0, "no {phase} slices");
    }
    let phase = xs.iter().find(|e| e["name"] == "compute").unwrap();
    assert!(phase["args"]["op"].is_string());
    assert!(phase["args"]["superstep"].is_u64());
    assert!(phase["args"]["tiles"].is_string());
    // The weight update follows the pipeline on both IPUs.
    let e = &report().estimate;
    for pid in [1u64, 2] {
        let u: Vec<_> = xs
            .iter()
            .filter(|x| x["name"] == "weight update" && x["pid"] == pid)
            .collect();
        assert_eq!(u.len(), 1);
        assert_eq!(u[0]["ts"], e.pipeline_cycles + e.all_reduce_cycles);
        assert!(xs.iter().any(|x| x["pid"] == pid && x["tid"] == 3));
    }
    // Every phase of a run lies inside the run.
    for run in xs.iter().filter(|x| x["cat"] == "stage") {
        let (start, end) = span(run);
        let inside = xs
            .iter()
            .filter(|x| x["cat"] == "phase" && x["pid"] == run["pid"] && x["tid"] == 2)
            .filter(|x| span(x).0 >= start && span(x).0 < end)
            .all(|x| span(x).1 <= end);
        assert!(inside, "a phase leaves {}", run["name"]);
    }
}

#[test]
fn phase_slices_are_capped_but_stages_kept() {
    let r = report();
    let full = chrome_trace(&r);
    let phases = |t: &Value| x_events(t).iter().filter(|e| e["cat"] == "phase").count();
    let stages = |t: &Value| x_events(t).iter().filter(|e| e["cat"] == "stage").count();
    let all = phases(&full);
    assert_eq!(full["otherData"]["phase_slices"], all);
    assert_eq!(full["otherData"]["phase_slices_omitted"], 0);
    for limit in [0, 1, 40, all / 2, all - 1] {
        let t = chrome_trace_with_limit(&r, limit);
        let n = phases(&t);
        assert!(n <= limit, "{n} > {limit}");
        assert_eq!(stages(&t), 16);
        assert_eq!(t["otherData"]["phase_slices"], n);
        assert_eq!(t["otherData"]["phase_slices_omitted"], all - n);
    }
    assert_eq!(phases(&chrome_trace_with_limit(&r, all)), all);
}

fn span(e: &Value) -> (u64, u64) {
    let ts = e["ts"].as_u64().expect("integer ts");
    let dur = e["dur"].as_u64().expect("integer dur");
    (ts, ts + dur)
}

#[test]
fn trace_slices_are_well_formed_and_do_not_overlap() {
    let trace = chrome_trace(&report());
    let mut threads: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
    for e in x_events(&trace) {
        // `as_u64` fails on negatives and fractions: timestamps are whole, non-negative cycles.
        let (start, end) = span(e);
        let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        threads.entry(key).or_default().push((start, end));
    }
    assert_eq!(
        threads.keys().copied().collect::<Vec<_>>(),
        [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]
    );
    for (key, mut spans) in threads {
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "slices {:?} and {:?} overlap on pid/tid {key:?}",
                w[0],
                w[1]
            );
        }
    }
}

fn render_svg(svg: &str) -> tiny_skia::Pixmap {
    let tree = usvg::Tree::from_str(svg, &usvg::Options::default()).expect("valid SVG");
    let size = tree.size().to_int_size();
    assert!(size.width() >= 1000 && size.height() >= 100, "{size:?}");
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap
}

/// Pixels that are neither transparent nor the white background.
fn drawn_pixels(p: &tiny_skia::Pixmap) -> usize {
    p.pixels()
        .iter()
        .filter(|c| c.alpha() > 0 && (c.red() < 250 || c.green() < 250 || c.blue() < 250))
        .count()
}

#[test]
fn pictures_parse_and_draw() {
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), &report()).unwrap();
    for name in ["memory.svg", "timeline.svg"] {
        let svg = fs::read_to_string(dir.path().join(name)).unwrap();
        let p = render_svg(&svg);
        // Bars, not just text (the default options load no fonts).
        assert!(drawn_pixels(&p) > 5_000, "{name} draws too little");
    }
    let memory = fs::read_to_string(dir.path().join("memory.svg")).unwrap();
    assert!(memory.contains("IPU 0: "));
    assert!(memory.contains("IPU 1: "));
    assert!(memory.contains("SRAM limit 624.0 KiB"));
    let timeline = fs::read_to_string(dir.path().join("timeline.svg")).unwrap();
    assert!(timeline.contains("stage 0 (IPU 0)"));
    assert!(timeline.contains("stage 1 (IPU 1)"));
    assert!(timeline.contains(">F3<"));
    assert!(timeline.contains(">B3<"));
    assert!(timeline.contains("Grouped"));
}

#[test]
fn page_links_everything() {
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), &report()).unwrap();
    let html = fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<img src=\"memory.svg\""));
    assert!(html.contains("<img src=\"timeline.svg\""));
    assert!(html.contains("href=\"trace.json\""));
    assert!(html.contains("ui.perfetto.dev"));
    assert!(html.contains("tessera estimate --stages 0,0,1,1"));
    // Training results: scalar fields in a table.
    assert!(html.contains(">accuracy</th><td>0.9125<"));
    assert!(html.contains(">epochs</th><td>2<"));
    // No external resources: nothing loaded but the report's own files.
    assert!(!html.contains("<script"));
    assert!(!html.contains("<link"));
    assert!(!html.contains("src=\"http"));
}

#[test]
fn the_stage_table_gives_what_each_stash_holds() {
    let r = report();
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), &r).unwrap();
    let html = fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(html.contains(">stash entries</th><th>stash bytes<"));
    // Each stage's row: its entries, then the bytes they hold (none for a stage that stashes
    // nothing, whatever one entry would hold).
    for s in &r.estimate.stages {
        let held = tessera_host::report::format::bytes(s.stash_entry_bytes * s.stash_depth as u64);
        let cells = format!("<td>{}</td><td>{held}</td>", s.stash_depth);
        assert!(html.contains(&cells), "{cells}");
    }
}

#[test]
fn missing_estimate_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = render_report(dir.path()).unwrap_err();
    assert!(matches!(err, ReportError::Io { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("estimate.json"), "{msg}");
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn corrupt_estimate_is_an_error_naming_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("estimate.json"),
        "{\n  \"title\": \"x\",\n  \"command\": oops\n}\n",
    )
    .unwrap();
    let err = render_report(dir.path()).unwrap_err();
    match &err {
        ReportError::Malformed { line, column, .. } => {
            assert_eq!(*line, 3);
            assert!(*column > 0);
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("estimate.json"), "{msg}");
    assert!(msg.contains("line 3, column"), "{msg}");

    // Valid JSON that is not a report also names its place.
    fs::write(dir.path().join("estimate.json"), "{\"title\": 7}").unwrap();
    let msg = render_report(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("line 1, column"), "{msg}");
}

#[test]
fn rendering_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_report(dir.path(), &report()).unwrap();
    let first: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    let rendered = render_report(dir.path()).unwrap();
    assert_eq!(rendered.files, files[1..]);
    let second: Vec<Vec<u8>> = files.iter().map(|f| fs::read(f).unwrap()).collect();
    assert_eq!(first, second);
    let again = render_report(dir.path()).unwrap();
    assert_eq!(rendered, again);
    // The summary.
    assert!(
        rendered.summary.contains("fits: yes"),
        "{}",
        rendered.summary
    );
    assert!(rendered.summary.contains("cycles per weight update"));
    assert!(rendered.summary.contains("samples/s"));
    assert!(rendered.summary.contains("IPU 1:"));
    assert!(rendered.summary.contains("index.html"));
}

#[test]
fn markup_in_names_is_escaped() {
    let mut r = report();
    r.title = "mlp<script>&\"x\": 2 x mk2, Grouped, M = 4".into();
    r.command = "tessera --name '<&>'".into();
    r.machine_name = "mk2<&>".into();
    r.training = Some(json!({ "<&>": "<b>&</b>" }));
    r.estimate.stages[0].forward_trace[0].op = "op<&>".into();
    assert_eq!(r.model(), "mlp<script>&\"x\"");
    let html = html_page(&r);
    assert!(html.contains("<h1>mlp&lt;script&gt;&amp;&quot;x&quot;: 2 x mk2"));
    assert!(html.contains("<title>mlp&lt;script&gt;&amp;&quot;x&quot;"));
    assert!(html.contains("&lt;b&gt;&amp;&lt;/b&gt;"));
    assert!(html.contains("mk2&lt;&amp;&gt;"));
    assert!(html.contains("<code>tessera --name '&lt;&amp;&gt;'</code>"));
    assert!(!html.contains("<script"));
    assert!(!html.contains("<&>"));
    assert!(!html.contains("<b>&"));
    for svg in [memory_svg(&r), timeline_svg(&r)] {
        assert!(svg.contains("mlp&lt;script&gt;&amp;&quot;x&quot;"));
        assert!(!svg.contains("<script"));
        assert!(!svg.contains("<&>"));
        usvg::Tree::from_str(&svg, &usvg::Options::default()).expect("still valid SVG");
    }
    // JSON needs no escaping, but the names survive.
    let trace = serde_json::to_string(&chrome_trace(&r)).unwrap();
    assert!(trace.contains("op<&>"));
    assert!(trace.contains("mlp<script>&\\\"x\\\""));
    // The text summary is plain text: the name as it is.
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), &r).unwrap();
    let rendered = render_report(dir.path()).unwrap();
    assert!(rendered
        .summary
        .starts_with("mlp<script>&\"x\": 2 x mk2<&> per replica"));
}

#[test]
fn odd_estimates_do_not_panic() {
    let mut r = report();
    let e = &mut r.estimate;
    e.runs.clear();
    e.stages.clear();
    for ipu in &mut e.ipus {
        ipu.tiles.clear();
        ipu.update_trace.clear();
        ipu.weight_update_cycles = 0;
    }
    e.pipeline_cycles = 0;
    e.cycles_per_weight_update = 0;
    e.weight_update_cycles = 0;
    e.seconds_per_weight_update = 0.0;
    e.samples_per_second = f64::NAN;
    r.training = Some(json!([1, 2, 3]));
    for svg in [memory_svg(&r), timeline_svg(&r)] {
        render_svg(&svg);
    }
    html_page(&r);
    let trace = chrome_trace(&r);
    assert!(x_events(&trace).is_empty());

    // No IPUs at all, zero SRAM, every tile empty.
    r.estimate.ipus.clear();
    r.machine.sram_bytes_per_tile = 0;
    render_svg(&memory_svg(&r));
    let mut r = report();
    for ipu in &mut r.estimate.ipus {
        for t in &mut ipu.tiles {
            *t = Default::default();
        }
    }
    render_svg(&memory_svg(&r));
}

#[test]
fn an_out_of_memory_estimate_still_renders() {
    let mut r = report();
    r.machine.sram_bytes_per_tile = 12 * 1024;
    r.estimate.fits = false;
    let dir = tempfile::tempdir().unwrap();
    write_report(dir.path(), &r).unwrap();
    let memory = fs::read_to_string(dir.path().join("memory.svg")).unwrap();
    // The limit is on the scale now.
    assert!(memory.contains("SRAM limit 12.0 KiB"));
    assert!(!memory.contains("off this scale"));
    let html = fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(html.contains("class=\"oom\""));
}

/// Writes PNGs of both pictures (with system fonts) when `TESSERA_REPORT_PNG` names a
/// directory: for looking at them.
#[test]
fn pictures_as_png_on_request() {
    let Some(out) = std::env::var_os("TESSERA_REPORT_PNG") else {
        return;
    };
    let out = Path::new(&out);
    fs::create_dir_all(out).unwrap();
    let mut opts = usvg::Options::default();
    opts.fontdb_mut().load_system_fonts();
    let r = report();
    write_report(&out.join("report"), &r).unwrap();
    let mut tight = report();
    tight.machine.sram_bytes_per_tile = 12 * 1024;
    let many = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| build_with(16, Schedule::Interleaved))
        .unwrap()
        .join()
        .unwrap();
    let mut odd = report();
    odd.estimate.runs.clear();
    odd.estimate.ipus[1].tiles.clear();
    for (name, svg) in [
        ("memory", memory_svg(&r)),
        ("timeline", timeline_svg(&r)),
        ("memory_tight", memory_svg(&tight)),
        ("memory_odd", memory_svg(&odd)),
        ("timeline_odd", timeline_svg(&odd)),
        ("timeline_many", timeline_svg(&many)),
    ] {
        let tree = usvg::Tree::from_str(&svg, &opts).unwrap();
        let size = tree.size().to_int_size();
        let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
        resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
        pixmap.save_png(out.join(format!("{name}.png"))).unwrap();
    }
}
