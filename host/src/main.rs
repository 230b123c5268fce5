//! The `tessera` command: train, evaluate, predict and estimate models on a simulated IPU
//! system, estimate single ops, benchmark the input pipeline, and render reports.
//!
//! An error is printed as `error: ...` on stderr, then one `caused by: ...` line per
//! underlying cause, with a non-zero exit status; a bad option is one line and nothing else.

use std::process::ExitCode;

/// mimalloc, large blocks on transparent huge pages (see [`tessera_host::allocator`]).
#[global_allocator]
static ALLOCATOR: tessera_host::allocator::Allocator = tessera_host::allocator::ALLOCATOR;

fn main() -> ExitCode {
    // A closed pipe downstream (`tessera ... | head`) ends the process as it ends other
    // command-line tools, instead of a panic in `println!`.
    sigpipe::reset();
    ExitCode::from(tessera_host::command(std::env::args_os()))
}
