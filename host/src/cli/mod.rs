//! The `tessera` command's subcommands, one module each.

pub mod args;
pub mod estimate;
pub mod flags;
pub mod infer;
pub mod onnx;
pub mod op;
pub mod options;
pub mod sweep;
pub mod train;

/// Any error a subcommand returns; `main` prints it with its chain of causes.
pub type AnyError = Box<dyn std::error::Error>;

pub use tessera_host::report::format::one_line;

/// clap's message on one line: without its `error:` prefix, usage and help hint.
pub fn clap_message(rendered: &str) -> String {
    let kept: Vec<&str> = rendered
        .lines()
        .filter(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .collect();
    let text = one_line(&kept.join(" "));
    text.strip_prefix("error: ").unwrap_or(&text).to_string()
}
