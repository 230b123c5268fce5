//! The `tessera` command: its arguments parsed, the subcommand run, and the outcome as an exit
//! status. The subcommands are one module each.

pub mod args;
pub mod estimate;
pub mod flags;
pub mod infer;
pub mod onnx;
pub mod op;
pub mod options;
pub mod sweep;
pub mod train;

use clap::error::ErrorKind;
use clap::Parser;
use std::ffi::OsString;

use crate::report::render_report;
use args::{Cli, Command};

/// Runs the `tessera` command with `args` (the first is the program's name, as
/// `std::env::args_os` gives it): help and version on stdout with success; a bad argument as
/// one `error:` line on stderr; else the subcommand, its errors printed as `error: ...` and
/// one `caused by: ...` line per cause, with failure. Returns the exit status: 0 for
/// success, 1 for failure (a model that does not fit included).
pub fn command(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> u8 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return 0;
        }
        Err(e) => {
            eprintln!("error: {}", clap_message(&e.to_string()));
            return 1;
        }
    };
    let result: Result<bool, AnyError> = match cli.command {
        Command::Train(a) => train::run(a),
        Command::Evaluate(a) => infer::run_evaluate(a),
        Command::Predict(a) => infer::run_predict(a),
        Command::Estimate(a) => estimate::run(a),
        Command::Run(a) => onnx::run_model(a),
        Command::EstimateOp(c) => op::run_op(c),
        Command::Calibrate(a) => op::run_calibrate(a),
        Command::DatasetBenchmark(a) => op::run_bench(a),
        Command::Sweep(a) => sweep::run(a),
        Command::Report { dir } => render_report(&dir)
            .map(|r| {
                println!("{}", r.summary);
                true
            })
            .map_err(Into::into),
    };
    match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            let mut cause = e.source();
            while let Some(c) = cause {
                eprintln!("caused by: {}", one_line(&c.to_string()));
                cause = c.source();
            }
            1
        }
    }
}

/// Any error a subcommand returns; [`command`] prints it with its chain of causes.
pub type AnyError = Box<dyn std::error::Error>;

pub use crate::report::format::one_line;

/// clap's message on one line: without its `error:` prefix, usage and help hint.
pub fn clap_message(rendered: &str) -> String {
    let kept: Vec<&str> = rendered
        .lines()
        .filter(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .collect();
    let text = one_line(&kept.join(" "));
    text.strip_prefix("error: ").unwrap_or(&text).to_string()
}
