//! `index.html`: a self-contained page with the estimate's numbers in tables, both pictures and
//! a link to the trace. Written with maud, which escapes every value.

use maud::{html, Markup, PreEscaped, Render, DOCTYPE};
use serde_json::Value;
use tessera_sim::system::SystemEstimate;

use super::format::{bytes, count, decimal, percent, seconds, short_decimal};
use super::{Report, ESTIMATE_FILE, MEMORY_FILE, TIMELINE_FILE, TRACE_FILE};

/// The pages' style sheet (this page's and the sweep page's).
pub(super) const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:2em auto;max-width:1440px;padding:0 1em;color:#222;line-height:1.4}\n\
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
.hint{color:#666}\n\
.top{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}\n\
.top>div{flex:1 1 420px;min-width:0}\n\
summary{cursor:pointer;font-weight:bold;font-size:1.15em;margin-top:1.8em}\n\
table.sortable th{cursor:pointer}\n";

/// The script that sorts a `table.sortable` by the column whose heading is clicked (again:
/// the other way): numbers (thousands separators and byte units read) by value, text
/// alphabetically.
const SORT_SCRIPT: &str = "document.querySelectorAll('table.sortable').forEach(t=>{const hs=[...t.rows[0].cells];hs.forEach((th,i)=>th.addEventListener('click',()=>{const rows=[...t.rows].slice(1);const u={B:1,KiB:1024,MiB:1048576,GiB:1073741824};const v=r=>{const s=r.cells[i].textContent.trim();const m=s.match(/^(-?[0-9][0-9,.]*)\\s*(B|KiB|MiB|GiB)?$/);return m?parseFloat(m[1].replace(/,/g,''))*(u[m[2]]||1):s};const d=th.dataset.d=th.dataset.d==='1'?'-1':'1';rows.sort((a,b)=>{const x=v(a),y=v(b);return(typeof x==='number'&&typeof y==='number'?x-y:String(x).localeCompare(String(y)))*d});rows.forEach(r=>r.parentNode.appendChild(r))}))});";

/// The page: title, command, the summary beside the memory picture, tables, the timeline, a
/// link to the trace and the layers folded away.
pub fn html_page(report: &Report) -> String {
    let e = &report.estimate;
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (report.title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                h1 { (report.title) }
                p { "Command: " code { (report.command) } }
                @if let Some(o) = &e.out_of_memory {
                    div.warn { p { b { "Out of memory." } " " (o) } }
                }
                // The summary and where memory goes, side by side: the first screen.
                div.top {
                    div { h2 { "Summary" } (summary_table(report)) }
                    div {
                        h2 { "Memory per tile" }
                        p { img src=(MEMORY_FILE) alt="memory of every tile of every IPU, by category"; }
                    }
                }
                h2 { "IPUs" }
                (ipu_table(e))
                h2 { "Pipeline stages" }
                (stage_table(e))
                @if let Some(t) = &report.training {
                    h2 { "Training" }
                    (training(t))
                }
                (figures())
                @if !report.layers.is_empty() {
                    details {
                        summary { "Layers (ONNX nodes), by cycles: " (costed_layers(&report.layers).len()) " rows (click a heading to sort)" }
                        (layer_table(&report.layers))
                    }
                    script { (PreEscaped(SORT_SCRIPT)) }
                }
            }
        }
    };
    let mut page = page.into_string();
    page.push('\n');
    page
}

/// The layers a notebook's summary lists: the ones with the most cycles.
const NOTEBOOK_LAYERS: usize = 12;

/// The bars the notebook's memory picture draws over all its IPUs, at most: a notebook keeps
/// the view in its document, so it stays small. Each bar is the fullest of its neighbouring
/// tiles (92 bars of 16 tiles an IPU for four Mk2 IPUs).
const NOTEBOOK_BARS: usize = 384;

/// The report as an HTML fragment for a notebook cell (Jupyter's `_repr_html_`): the page's
/// tables with its style scoped to the fragment, the layers with the most cycles, and both
/// pictures inline (a notebook has no files beside it), the memory picture with one bar per
/// group of tiles.
pub fn html_fragment(report: &Report) -> String {
    let e = &report.estimate;
    let tiles: usize = e.ipus.iter().map(|r| r.tiles.len()).sum();
    let tiles_per_bar = tiles.div_ceil(NOTEBOOK_BARS).max(1);
    // The page's style, each rule scoped to the fragment so that it leaves the notebook's own.
    let css: String = CSS
        .lines()
        .filter(|l| !l.starts_with("body"))
        .map(|l| format!(".tessera-report {l}\n"))
        .collect();
    let layers = &report.layers;
    let costed = costed_layers(layers).len();
    let shown = costed.min(NOTEBOOK_LAYERS);
    let fragment = html! {
        div.tessera-report {
            style { (PreEscaped(css)) }
            h3 { (report.title) }
            (summary_table(report))
            @if let Some(o) = &e.out_of_memory {
                div.warn { p { b { "Out of memory." } " " (o) } }
            }
            h4 { "IPUs" }
            (ipu_table(e))
            h4 { "Pipeline stages" }
            (stage_table(e))
            @if costed > 0 {
                h4 { "Layers (ONNX nodes): the " (shown) " with the most cycles of " (costed) }
                (layer_table_top(layers, NOTEBOOK_LAYERS, ""))
            }
            h4 { "Memory per tile" }
            div { (PreEscaped(super::memory_svg_grouped(report, tiles_per_bar))) }
            h4 { "Pipeline timeline" }
            div { (PreEscaped(super::timeline_svg(report))) }
        }
    };
    fragment.into_string()
}

/// A row of a two-column table: a key and its value.
fn row(key: &str, value: impl Render) -> Markup {
    html! { tr { th.k { (key) } td { (value) } } }
}

fn summary_table(report: &Report) -> Markup {
    let (e, m) = (&report.estimate, &report.machine);
    let fits = html! {
        @if e.fits {
            span.fits { "yes" }
        } @else {
            span.oom { "no" }
            @if let Some(o) = &e.out_of_memory {
                ": tile " (o.tile) " needs " (bytes(o.needed)) " of " (bytes(o.available))
            }
        }
    };
    let machine = format!(
        "{}: {} tiles, {} SRAM per tile, {} MHz",
        report.machine_name,
        count(u64::from(m.tiles)),
        bytes(m.sram_bytes_per_tile),
        short_decimal(m.clock_hz / 1e6)
    );
    let ipus = format!(
        "{} per replica, {} in all",
        e.ipus.len(),
        count(e.ipus_total as u64)
    );
    html! {
        table {
            (row("fits", fits))
            (row("machine", machine))
            (row("IPUs", ipus))
            (row("replicas", count(e.replicas as u64)))
            (row("schedule", &e.schedule))
            (row("pipeline stages", count(e.stages_count as u64)))
            (row("micro-batches per weight update (M)", count(e.accumulation as u64)))
            (row("samples per weight update", count(e.samples_per_weight_update)))
            (row("cycles per weight update", html! { b { (count(e.cycles_per_weight_update)) } }))
            (row("pipeline cycles", count(e.pipeline_cycles)))
            (row("all-reduce cycles", count(e.all_reduce_cycles)))
            (row("weight-update cycles", count(e.weight_update_cycles)))
            (row("time per weight update", seconds(e.seconds_per_weight_update)))
            (row("samples/s", html! { b { (decimal(e.samples_per_second)) } }))
            @if e.steady_samples_per_second > e.samples_per_second * 1.001 {
                (row("samples/s at steady state (M large)", decimal(e.steady_samples_per_second)))
            }
            (row("weight updates per execution (R)", count(e.repeat_count as u64)))
            (row("cycles per execution", count(e.cycles_per_execution)))
        }
    }
}

fn ipu_table(e: &SystemEstimate) -> Markup {
    let headings = [
        "IPU",
        "stages",
        "bytes used",
        "fullest tile",
        "tiles used",
        "stash",
        "streaming memory",
        "busy cycles",
        "idle cycles",
        "idle",
        "weight-update cycles",
    ];
    html! {
        table {
            tr {
                @for h in headings {
                    @if h == "stages" { th.k { (h) } } @else { th { (h) } }
                }
            }
            @for r in &e.ipus {
                @let stages: Vec<String> = r.stages.iter().map(usize::to_string).collect();
                tr {
                    td { (r.ipu) }
                    td.k { (stages.join(", ")) }
                    td title={ (count(r.bytes_used)) " bytes" } { (bytes(r.bytes_used)) }
                    td title={ (count(r.max_tile_bytes)) " bytes" } { (bytes(r.max_tile_bytes)) }
                    td { (count(r.tiles_used as u64)) }
                    td { (bytes(r.stash_bytes)) }
                    td { (bytes(r.streaming_memory_bytes)) }
                    td { (count(r.busy_cycles)) }
                    td { (count(r.idle_cycles)) }
                    td { (percent(r.idle_fraction)) }
                    td { (count(r.weight_update_cycles)) }
                }
            }
        }
    }
}

fn stage_table(e: &SystemEstimate) -> Markup {
    let headings = [
        "stage",
        "position",
        "IPU",
        "forward cycles",
        "backward cycles",
        "stash entries",
        "stash bytes",
        "idle (its IPU)",
    ];
    html! {
        table {
            tr { @for h in headings { th { (h) } } }
            @for s in &e.stages {
                tr {
                    td { (s.stage) }
                    td { (s.position) }
                    td { (s.ipu) }
                    td { (count(s.forward_cycles)) }
                    td { (count(s.backward_cycles)) }
                    td { (s.stash_depth) }
                    // What the stage holds: its entries' bytes (an entry's size alone beside a
                    // depth of 0 would read as memory held).
                    td { (bytes(s.stash_entry_bytes.saturating_mul(s.stash_depth as u64))) }
                    td { (percent(s.idle_fraction)) }
                }
            }
        }
    }
}

/// Every layer with cycles or memory, the most cycles first: where time and memory go (a
/// table the page's script sorts by any column).
fn layer_table(layers: &[crate::summary::LayerRow]) -> Markup {
    layer_table_top(layers, usize::MAX, "sortable")
}

/// The layers with cycles or memory, the most cycles first.
fn costed_layers(layers: &[crate::summary::LayerRow]) -> Vec<&crate::summary::LayerRow> {
    let mut rows: Vec<_> = layers
        .iter()
        .filter(|r| r.forward_cycles + r.backward_cycles + r.weight_bytes + r.activation_bytes > 0)
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.forward_cycles + r.backward_cycles));
    rows
}

/// [`layer_table`] of the `top` layers with the most cycles.
fn layer_table_top(layers: &[crate::summary::LayerRow], top: usize, class: &str) -> Markup {
    let mut rows = costed_layers(layers);
    rows.truncate(top);
    let headings = [
        "node",
        "op",
        "stage",
        "forward cycles",
        "backward cycles",
        "of which gradient",
        "recompute",
        "exchange",
        "update",
        "weights",
        "activations",
    ];
    html! {
        table class=(class) {
            tr { @for h in headings { th { (h) } } }
            @for r in rows {
                tr {
                    td { code { (r.name) } }
                    td { (r.op) }
                    td { (r.stage) }
                    td { (count(r.forward_cycles)) }
                    td { (count(r.backward_cycles)) }
                    td { (count(r.backward_gradient_cycles)) }
                    td { (count(r.backward_recompute_cycles)) }
                    td { (count(r.backward_exchange_cycles)) }
                    td { (count(r.backward_update_cycles)) }
                    td { (bytes(r.weight_bytes)) }
                    td { (bytes(r.activation_bytes)) }
                }
            }
        }
    }
}

/// Training results: an object's scalar fields in a table (the others named), a scalar as it
/// is, anything else left to `estimate.json`.
fn training(t: &Value) -> Markup {
    let scalar = |v: &Value| match v {
        Value::Null => Some("null".to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Array(_) | Value::Object(_) => None,
    };
    match t {
        Value::Object(map) => {
            let nested: Vec<&str> = map
                .iter()
                .filter(|(_, v)| scalar(v).is_none())
                .map(|(k, _)| k.as_str())
                .collect();
            html! {
                table {
                    @for (k, v) in map {
                        @if let Some(s) = scalar(v) { (row(k, s)) }
                    }
                }
                @if !nested.is_empty() {
                    p.hint { "Also in " (ESTIMATE_FILE) ": " (nested.join(", ")) "." }
                }
            }
        }
        other => match scalar(other) {
            Some(s) => html! { p { (s) } },
            None => html! { p.hint { "The training results are in " (ESTIMATE_FILE) "." } },
        },
    }
}

/// The timeline picture, the trace and where the page came from.
fn figures() -> Markup {
    html! {
        h2 { "Pipeline timeline" }
        p { img src=(TIMELINE_FILE) alt="pipeline stage runs over one weight update"; }
        h2 { "Trace" }
        p {
            a href=(TRACE_FILE) { (TRACE_FILE) }
            ": every superstep of one weight update. "
            span.hint {
                "Open it at " a href="https://ui.perfetto.dev" { "ui.perfetto.dev" }
                " (Open trace file) or in chrome://tracing; one trace microsecond is one IPU cycle."
            }
        }
        p.hint { "Rendered from " a href=(ESTIMATE_FILE) { (ESTIMATE_FILE) } "." }
    }
}
