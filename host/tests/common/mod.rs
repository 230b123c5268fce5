//! Running the `tessera` binary under a ceiling, for the property tests that feed it
//! arbitrary options or files.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The ceiling on a run's address space (`prlimit --as`): an allocation beyond it aborts.
pub const CEILING_BYTES: u64 = 1 << 30;
/// The longest a run may take before it counts as a runaway: a guard against hangs, far above
/// any run's real time (debug builds on a loaded machine included), not a speed target.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Runs `tessera ARGS` in `dir` under [`CEILING_BYTES`] (where `prlimit` exists):
/// `(status code, stderr)`, or why it is not acceptable (still running after [`LIMIT`]).
pub fn run_capped(args: &[String], dir: &Path) -> Result<(Option<i32>, String), String> {
    let bin = env!("CARGO_BIN_EXE_tessera");
    let ceiling = Command::new("prlimit")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let mut cmd = if ceiling {
        let mut c = Command::new("prlimit");
        c.arg(format!("--as={CEILING_BYTES}")).arg("--").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    let mut child = cmd
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    Ok((status.code(), err))
}
