//! The Python package's pytest suite (`python/tests`), run with the Python of the virtual
//! environment `scripts/install-python` makes (`.venv` at the repository's root; or
//! `TESSERA_PYTHON`), against this build's `tessera` command (`TESSERA_BIN`). Without that
//! environment the test is skipped, saying so, unless `TESSERA_REQUIRE_PYTHON=1` (CI, which
//! makes it first).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The newest modification time of the Rust and Python sources the package is built from.
fn newest_source(dir: &Path, newest: &mut SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            newest_source(&path, newest);
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "py" || e == "toml")
        {
            if let Ok(t) = entry.metadata().and_then(|m| m.modified()) {
                *newest = (*newest).max(t);
            }
        }
    }
}

#[test]
fn the_python_package_passes_its_tests() {
    let root = root();
    let required = std::env::var("TESSERA_REQUIRE_PYTHON").is_ok_and(|v| v == "1");
    let python = std::env::var_os("TESSERA_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let installed = python.is_file()
        && Command::new(&python)
            .args(["-c", "import tessera._native, pytest"])
            .status()
            .is_ok_and(|s| s.success());
    if !installed {
        assert!(
            !required,
            "TESSERA_REQUIRE_PYTHON=1 but {} has no tessera package or no pytest (scripts/install-python)",
            python.display()
        );
        eprintln!(
            "skipped: no Python environment with the tessera package at {} (scripts/install-python makes it)",
            python.display()
        );
        return;
    }
    // An extension built before the sources last changed would test old code.
    let out = Command::new(&python)
        .args(["-c", "import tessera._native as n; print(n.__file__)"])
        .output()
        .expect("the environment's Python runs");
    let module = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let built = std::fs::metadata(&module)
        .and_then(|m| m.modified())
        .expect("the extension module's time");
    let mut newest = SystemTime::UNIX_EPOCH;
    for dir in [
        "core/src",
        "sim/src",
        "host/src",
        "python/src",
        "python/tessera",
    ] {
        newest_source(&root.join(dir), &mut newest);
    }
    assert!(
        built >= newest,
        "the tessera package in {} was built before its sources last changed: rerun scripts/install-python",
        python.display()
    );
    let status = Command::new(&python)
        .args(["-m", "pytest", "-q", "-rs", "python/tests"])
        .env("TESSERA_BIN", env!("CARGO_BIN_EXE_tessera"))
        .current_dir(&root)
        .status()
        .expect("pytest runs");
    assert!(
        status.success(),
        "pytest python/tests failed (output above)"
    );
}
