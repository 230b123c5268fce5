//! The `tessera` command's subcommands, one module each.

pub mod args;
pub mod estimate;
pub mod infer;
pub mod onnx;
pub mod op;
pub mod options;
pub mod sweep;
pub mod train;

/// Any error a subcommand returns; `main` prints it with its chain of causes.
pub type AnyError = Box<dyn std::error::Error>;

/// Collapses whitespace so that every message is one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
