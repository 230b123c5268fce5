//! Mutated ONNX files (truncations, flipped bytes, and decoded-then-edited models: tensor and
//! input dims set to 0 or 2^40, node inputs renamed to missing or other tensors, nodes
//! dropped, op types swapped) never make `tessera estimate` panic, abort, hang or allocate
//! without bound: it gives an estimate or a one-line error. Each run has a 1 GiB ceiling on
//! its address space (`prlimit --as`) and a runaway guard of 60 seconds.

use std::path::{Path, PathBuf};

use proptest::prelude::*;

use crate::{common, mutate};
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
        // The allocator's error when the ceiling is reached: a clean exit, but these small
        // models must not need a gigabyte (the estimator's memory is bounded).
        Some(1) if err.contains("error: out of memory: an allocation of") => {
            Err(format!("allocated past the ceiling: {err}"))
        }
        Some(1) if !err.contains("panicked") && err.contains("error: ") => Ok(()),
        other => Err(format!("exit {other:?} (a crash or an abort): {err}")),
    }
}

/// The same 64 cases on every run (a fixed seed), so that the suite cannot fail by chance.
/// With `PROPTEST_CASES` or `PROPTEST_RNG_SEED` set, proptest's own configuration: that many
/// cases, from that seed or a random one (`PROPTEST_CASES=2000` for a wide random run;
/// `benches/onnx_mutations.rs` runs 100,000 in process).
fn config() -> ProptestConfig {
    let given = ProptestConfig::default();
    let wide = ["PROPTEST_CASES", "PROPTEST_RNG_SEED"]
        .iter()
        .any(|name| std::env::var_os(name).is_some());
    if wide {
        return ProptestConfig {
            failure_persistence: None,
            ..given
        };
    }
    ProptestConfig {
        cases: 64,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x7e55_e2a0),
        failure_persistence: None,
        ..given
    }
}

proptest! {
    #![proptest_config(config())]

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

/// `activations.onnx` with byte 1308 xor 3: a pad of 196,608 rows along the first axis, whose
/// padded output is then concatenated along its last axis in 4 million short rows. Laid out
/// row by row, that image alone took half a gigabyte of the estimator's memory and aborted
/// under the ceiling; it is now laid out linearly and estimated.
#[test]
fn a_pad_of_millions_of_rows_is_estimated_under_the_ceiling() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut bytes = std::fs::read(root.join("tests/fixtures/onnx/activations.onnx")).unwrap();
    bytes[1308] ^= 3;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mutated.onnx");
    std::fs::write(&file, &bytes).unwrap();
    for training in [false, true] {
        acceptable(&file, training).unwrap();
    }
}
