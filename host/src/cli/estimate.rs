//! `tessera estimate`: fit, memory and cycles of training (or inference) without running,
//! through the library's one entry ([`crate::estimation::estimate`]).

use std::path::PathBuf;

use crate::estimation::{estimate_with, FewestIpus, ModelSource, Progress};
use crate::report::write_report;

use super::args::EstimateArgs;
use super::options::command_line;
use super::AnyError;

pub fn run(a: EstimateArgs) -> Result<bool, AnyError> {
    // Where the report goes is checked before any work.
    if let Some(d) = &a.report_dir {
        crate::output::check_output_dir(d)?;
    }
    let source = ModelSource::from_arg(&a.model);
    let json = a.json;
    let e = estimate_with(&source, &a.options.0, &mut |p| {
        match p {
        Progress::Searching { model, limit } if !json => eprintln!(
            "{model} does not fit; searching for the fewest IPUs an automatic split fits on (up to {limit})..."
        ),
        _ => {}
    }
    })?;
    let report_files = match &a.report_dir {
        Some(dir) => Some(write_report(dir, &e.report(&command_line()))?),
        None => None,
    };
    if a.json {
        println!("{}", e.to_json()?);
    } else {
        // The out-of-memory paragraph goes to stderr once, as the error line (below).
        print!("{}", e.text_without_out_of_memory(a.layers));
        if let Some(files) = &report_files {
            println!("report written: {}", files_list(files));
        }
    }
    if let Some(oom) = e.out_of_memory() {
        eprintln!("error: {} does not fit: {oom}", e.name);
        if let Some(f) = e.onnx.as_ref().and_then(|o| o.fewest_ipus.as_ref()) {
            let memory = e.estimate.out_of_memory.as_ref().map(|o| o.memory.clone());
            let try_ = suggestions(&e.session, &memory.unwrap_or_default(), e.inference);
            let mut advice = search_outcome(f, &try_);
            if f.ipus.is_none() {
                if let Some(checked) = try_first(&source, &a.options.0, &try_, json) {
                    advice.push_str(&format!("; {checked}"));
                }
            }
            eprintln!("{advice}");
        }
        return Ok(false);
    }
    Ok(true)
}

/// `options` with `suggestion` (one of [`suggestions`]' options) taken, if it is one option
/// that can be taken as it is (not "a smaller --batch-size").
fn with_suggestion(
    options: &crate::estimation::EstimateOptions,
    suggestion: &str,
) -> Option<crate::estimation::EstimateOptions> {
    let mut o = options.clone();
    match suggestion {
        "--recompute-checkpoints auto" => o.recompute_checkpoints = vec!["auto".to_string()],
        "--offload-activations" => o.offload_activations = true,
        "--offload-optimizer-state" => o.offload_optimizer_state = Some(true),
        "--replicated-tensor-sharding" => o.replicated_tensor_sharding = Some(true),
        "--dtype f16" => o.dtype = tessera_core::DType::F16,
        _ => return None,
    }
    Some(o)
}

/// The first of the suggestions `try_`, checked by estimating the model with it (and, when it
/// does not fit as placed, searching for the fewest IPUs an automatic split fits on): what
/// it gives, in words. `None` when the first suggestion cannot be taken as it is, or its
/// estimate fails.
fn try_first(
    source: &ModelSource,
    options: &crate::estimation::EstimateOptions,
    try_: &[String],
    quiet: bool,
) -> Option<String> {
    let first = try_.first()?;
    let o = with_suggestion(options, first)?;
    if !quiet {
        eprintln!("checking {first}...");
    }
    let e = estimate_with(source, &o, &mut |_| {}).ok()?;
    let fullest = e.summary.ipus.iter().map(|i| i.max_tile_bytes).max()?;
    let sram = e.machine.sram_bytes_per_tile;
    let fewest = e.onnx.as_ref().and_then(|x| x.fewest_ipus.as_ref());
    Some(match (e.summary.fits, fewest.and_then(|f| f.ipus)) {
        (true, _) => format!(
            "with {first} it fits (fullest tile {} of {})",
            crate::report::format::bytes(fullest),
            crate::report::format::bytes(sram)
        ),
        (false, Some(n)) => {
            format!("with {first} an automatic split fits on {n} IPUs (--pipeline-ipus {n})")
        }
        (false, None) => format!(
            "checked: with {first} alone it does not fit either (fullest tile {} of {})",
            crate::report::format::bytes(fullest),
            crate::report::format::bytes(sram)
        ),
    })
}

/// The options that may make a model fit, most promising first: ranked by the categories
/// filling the fullest tile (`memory`) that each would shrink, leaving out what the
/// session's options give already. Stashed activations: recomputation from checkpoints, or
/// offloading them; always-live data (weights, optimizer state, accumulators): offloading
/// the state, sharding it over the replicas; temporary data: a lower available memory
/// proportion. Then fp16 and a smaller batch, which shrink them all.
fn suggestions(
    s: &crate::compile::SessionOptions,
    memory: &tessera_sim::memory::TileMemory,
    inference: bool,
) -> Vec<String> {
    let t = &s.techniques;
    let mut ranked: Vec<(u64, Vec<String>)> = Vec::new();
    if !inference {
        let mut stash = Vec::new();
        if t.recompute.checkpoints.is_none() {
            stash.push("--recompute-checkpoints auto".to_string());
        }
        if !t.offload.activations {
            stash.push("--offload-activations".to_string());
        }
        ranked.push((memory.stash, stash));
        let mut state = Vec::new();
        if !t.offload.optimizer_state {
            state.push("--offload-optimizer-state".to_string());
        }
        if s.replicas > 1 && !t.replicated_tensor_sharding {
            state.push("--replicated-tensor-sharding".to_string());
        }
        ranked.push((memory.always_live, state));
    }
    // Data live only part of the step: in training mostly the activations kept for the
    // backward pass (on one IPU they are not stashed), and the products' temporaries.
    let mut temporary = Vec::new();
    if !inference && t.recompute.checkpoints.is_none() {
        temporary.push("--recompute-checkpoints auto".to_string());
    }
    let lowest = match &t.available_memory_proportion {
        tessera_sim::techniques::MemoryProportion::All(p) => *p,
        tessera_sim::techniques::MemoryProportion::PerStage(ps) => {
            ps.iter().copied().fold(1.0, f64::min)
        }
    };
    if lowest > 0.1 {
        temporary.push(format!(
            "a lower --available-memory-proportion (below {lowest})"
        ));
    }
    ranked.push((memory.not_always_live, temporary));
    // Largest category first; ties keep the order above.
    ranked.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut out: Vec<String> = Vec::new();
    for x in ranked
        .into_iter()
        .filter(|(bytes, _)| *bytes > 0)
        .flat_map(|(_, s)| s)
    {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    if s.dtype == tessera_core::DType::F32 {
        out.push("--dtype f16".to_string());
    }
    out.push(format!("a smaller --batch-size (below {})", s.batch_size));
    out
}

/// `items` as a list in words: `a`, `a or b`, `a, b or c`.
fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// What the search for the fewest IPUs found, as advice on the command line's options (with
/// `try`, what else may make it fit, most promising first).
fn search_outcome(f: &FewestIpus, try_: &[String]) -> String {
    match f.ipus {
        Some(n) => format!(
            "an automatic split fits on {n} IPUs: add --pipeline-ipus {n} (stage boundaries after {})",
            f.boundaries.join(", ")
        ),
        None => {
            let why = match (&f.stopped, &f.unrunnable) {
                (Some(why), _) => format!(
                    "no automatic split fits: the search stopped at {} IPUs, as {why}",
                    f.tried_up_to
                ),
                (None, Some(why)) if f.tried_up_to < 2 => format!(
                    "no automatic split can run ({why}: a larger --gradient-accumulation-count lets more IPUs run)"
                ),
                (None, Some(why)) => format!(
                    "no automatic split fits on up to {} IPUs among those that can run ({why}: a larger --gradient-accumulation-count lets more IPUs run)",
                    f.tried_up_to
                ),
                (None, None) => {
                    format!("no automatic split fits on up to {} IPUs", f.tried_up_to)
                }
            };
            format!("{why} (try {})", or_list(try_))
        }
    }
}

pub fn files_list(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::SessionOptions;
    use tessera_sim::memory::TileMemory;
    use tessera_sim::techniques::Checkpoints;

    fn tile(stash: u64, always_live: u64, not_always_live: u64) -> TileMemory {
        TileMemory {
            stash,
            always_live,
            not_always_live,
            ..TileMemory::default()
        }
    }

    #[test]
    fn the_hint_ranks_by_the_fullest_tile_and_leaves_out_what_was_given() {
        // Stashed activations fill the tile: recomputation first, then offloading them.
        let s = SessionOptions {
            dtype: tessera_core::DType::F16,
            replicas: 4,
            ..SessionOptions::default()
        };
        let hint = suggestions(&s, &tile(900, 100, 10), false);
        assert_eq!(
            hint[..2],
            ["--recompute-checkpoints auto", "--offload-activations"]
        );
        assert!(!hint.iter().any(|h| h.contains("--dtype")), "{hint:?}");
        assert!(hint.contains(&"--replicated-tensor-sharding".to_string()));
        assert_eq!(hint.last().unwrap(), "a smaller --batch-size (below 32)");
        // Weights and state fill it: offloading and sharding the state come first.
        let hint = suggestions(&s, &tile(0, 900, 10), false);
        assert_eq!(
            hint[..2],
            ["--offload-optimizer-state", "--replicated-tensor-sharding"]
        );
        // Given recomputation is not suggested again; fp32 suggests fp16.
        let mut given = SessionOptions::default();
        given.techniques.recompute.checkpoints = Some(Checkpoints::Auto);
        let hint = suggestions(&given, &tile(900, 100, 10), false);
        assert!(!hint.iter().any(|h| h.contains("recompute")), "{hint:?}");
        assert!(hint.contains(&"--dtype f16".to_string()));
        // Inference suggests nothing of training's.
        let hint = suggestions(&SessionOptions::default(), &tile(0, 900, 500), true);
        assert!(
            !hint
                .iter()
                .any(|h| h.contains("recompute") || h.contains("optimizer")),
            "{hint:?}"
        );
        assert_eq!(or_list(&["a".into(), "b".into(), "c".into()]), "a, b or c");
    }
}
