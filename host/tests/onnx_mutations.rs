//! Mutated ONNX files (truncations, flipped bytes, and decoded-then-edited models: tensor and
//! input dims set to 0 or 2^40, node inputs renamed to missing or other tensors, nodes
//! dropped, op types swapped) never make `tessera estimate` panic, abort, hang or allocate
//! without bound: it gives an estimate or a one-line error. Each run has a 1 GiB ceiling on
//! its address space (`prlimit --as`) and 10 seconds.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

mod common;
mod mutate;
use common::run_capped;
use mutate::{models, mutate, mutation};

/// Runs `tessera estimate FILE` under the ceiling: an estimate (exit 0, or 1 when it does not
/// fit) or a one-line error (exit 1).
fn acceptable(file: &Path, training: bool) -> Result<(), String> {
    let mut args: Vec<String> = ["estimate", &file.to_string_lossy(), "--no-search"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--batch-size".into(), "2".into()]);
    if !training {
        args.push("--inference".into());
    }
    let dir = file.parent().unwrap_or(Path::new("."));
    let (code, err) = run_capped(&args, dir)?;
    match code {
        Some(0) => Ok(()),
        Some(1) if !err.contains("panicked") && err.contains("error: ") => Ok(()),
        other => Err(format!("exit {other:?} (a crash or an abort): {err}")),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_models_give_an_estimate_or_an_error(
        model in any::<prop::sample::Index>(),
        m in mutation(),
        training in any::<bool>(),
    ) {
        let all = models(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
        let path = &all[model.index(all.len())];
        let bytes = std::fs::read(path).unwrap();
        let mutated = mutate(&bytes, &m);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mutated.onnx");
        std::fs::write(&file, &mutated).unwrap();
        if let Err(e) = acceptable(&file, training) {
            prop_assert!(false, "{} with {:?}: {}", path.display(), m, e);
        }
    }
}
