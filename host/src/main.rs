//! The `tessera` command: train, evaluate, predict and estimate models on a simulated IPU
//! system, estimate single ops, benchmark the input pipeline, and render reports.
//!
//! An error is printed as `error: ...` on stderr, then one `caused by: ...` line per
//! underlying cause, with a non-zero exit status; a bad option is one line and nothing else.

mod cli;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use tessera_host::report::render_report;

use cli::args::{Cli, Command};
use cli::{clap_message, one_line, AnyError};

/// jemalloc, large blocks on transparent huge pages (see [`tessera_host::allocator`]).
#[global_allocator]
static ALLOCATOR: tessera_host::allocator::Allocator = tessera_host::allocator::ALLOCATOR;

fn main() -> ExitCode {
    // A closed pipe downstream (`tessera ... | head`) ends the process as it ends other
    // command-line tools, instead of a panic in `println!`.
    sigpipe::reset();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {}", clap_message(&e.to_string()));
            return ExitCode::FAILURE;
        }
    };
    let result: Result<bool, AnyError> = match cli.command {
        Command::Train(a) => cli::train::run(a),
        Command::Evaluate(a) => cli::infer::run_evaluate(a),
        Command::Predict(a) => cli::infer::run_predict(a),
        Command::Estimate(a) => cli::estimate::run(a),
        Command::Run(a) => cli::onnx::run_model(a),
        Command::EstimateOp(c) => cli::op::run_op(c),
        Command::Calibrate(a) => cli::op::run_calibrate(a),
        Command::DatasetBenchmark(a) => cli::op::run_bench(a),
        Command::Sweep(a) => cli::sweep::run(a),
        Command::Report { dir } => render_report(&dir)
            .map(|r| {
                println!("{}", r.summary);
                true
            })
            .map_err(Into::into),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", one_line(&e.to_string()));
            let mut cause = e.source();
            while let Some(c) = cause {
                eprintln!("caused by: {}", one_line(&c.to_string()));
                cause = c.source();
            }
            ExitCode::FAILURE
        }
    }
}
