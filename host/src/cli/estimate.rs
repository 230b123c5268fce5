//! `tessera estimate`: fit, memory and cycles of training (or inference) without running,
//! through the library's one entry ([`tessera_host::estimation::estimate`]).

use std::path::PathBuf;

use tessera_host::estimation::{estimate_with, FewestIpus, ModelSource, Progress};
use tessera_host::report::write_report;

use super::args::EstimateArgs;
use super::options::command_line;
use super::AnyError;

pub fn run(a: EstimateArgs) -> Result<bool, AnyError> {
    // Where the report goes is checked before any work.
    if let Some(d) = &a.report_dir {
        tessera_host::output::check_output_dir(d)?;
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
        print!("{}", e.to_text(a.layers));
        if let Some(files) = &report_files {
            println!("report written: {}", files_list(files));
        }
    }
    if let Some(oom) = e.out_of_memory() {
        eprintln!("error: {} does not fit: {oom}", e.name);
        if let Some(f) = e.onnx.as_ref().and_then(|o| o.fewest_ipus.as_ref()) {
            eprintln!("{}", search_outcome(f));
        }
        return Ok(false);
    }
    Ok(true)
}

/// What the search for the fewest IPUs found, as advice on the command line's options.
fn search_outcome(f: &FewestIpus) -> String {
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
            format!(
                "{why} (try --dtype f16, --offload-optimizer-state, --recompute or a smaller --batch-size)"
            )
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
