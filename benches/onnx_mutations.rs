//! The long run of the ONNX robustness property (`host/tests/onnx_mutations.rs` runs 64 cases
//! in CI): mutated files - truncations, flipped bytes, edited dims (0, 2^32 - 1, 2^40), edges
//! renamed to missing or other tensors, nodes dropped, op types swapped - of the ONNX fixtures
//! and the shipped BERT-Tiny go through the protobuf decoder and the importer (the graph
//! built, checked and planned, for training or inference at batch 2), in process. Each must
//! give a model or a typed error: a panic, a case over `CASE_SECONDS`, or an allocation past
//! `CASE_BYTES` above what the run held before the case is a failure, named with its case and
//! mutation. (An allocation past the ceiling fails in the allocator, which aborts the run: the
//! progress line before it gives the case's range; rerun from it with
//! `TESSERA_MUTATIONS_FROM`.)
//!
//! Not a timing: it counts. `cargo bench --bench onnx_mutations` runs 100,000 cases (set
//! `TESSERA_MUTATIONS` for another count) from a fixed seed, so a run is repeatable case by
//! case, and prints how many decoded, imported, were refused with a typed error, and failed;
//! it exits non-zero on a failure.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cap::Cap;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use tessera::host::compile::onnx::{compile_onnx, OnnxOptions};
use tessera::host::compile::SessionOptions;
use tessera::host::onnx::OnnxModel;

#[path = "../host/tests/mutate/mod.rs"]
mod mutate;

/// The allocator, counting what is held so that a case's allocations can be bounded.
#[global_allocator]
static ALLOCATOR: Cap<std::alloc::System> = Cap::new(std::alloc::System, usize::MAX);

/// What one case may allocate beyond what the run held before it (the property test's
/// ceiling on a whole process).
const CASE_BYTES: usize = 1 << 30;

/// How long one case may take (the property test's limit on a whole process).
const CASE_SECONDS: u64 = 10;

/// The seed of the cases.
const SEED: [u8; 32] = *b"tessera onnx mutations, seed 1.0";

/// How a case went.
enum Outcome {
    /// Decoding refused the bytes with a typed error.
    DecodeError,
    /// Decoded; the import (or the graph built from it) refused it with a typed error.
    ImportError,
    /// Decoded and imported.
    Imported,
}

fn run_case(bytes: &[u8], training: bool) -> Outcome {
    let model = match OnnxModel::from_bytes(bytes, Path::new("mutated.onnx")) {
        Ok(m) => m,
        Err(_) => return Outcome::DecodeError,
    };
    let so = SessionOptions {
        batch_size: 2,
        ..SessionOptions::default()
    };
    let oo = OnnxOptions {
        inference: !training,
        ..OnnxOptions::default()
    };
    match compile_onnx(&model, &so, &oo) {
        Ok(_) => Outcome::Imported,
        Err(_) => Outcome::ImportError,
    }
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter naming another bench skips this one.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args
        .iter()
        .any(|a| !a.starts_with('-') && !"onnx_mutations".contains(a.as_str()))
    {
        return;
    }
    let total = env_count("TESSERA_MUTATIONS", 100_000);
    let from = env_count("TESSERA_MUTATIONS_FROM", 0);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let models = mutate::models(&root);
    let originals: Vec<Vec<u8>> = models
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    let strategy = (
        proptest::prelude::any::<proptest::sample::Index>(),
        mutate::mutation(),
        proptest::prelude::any::<bool>(),
    );
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &SEED),
    );
    // Panics are counted, and listed with their message and place at the end.
    std::panic::set_hook(Box::new(|info| {
        if let Some(at) = info.location() {
            eprintln!("panic at {at}");
        }
    }));
    let (mut decode_errors, mut import_errors, mut imported) = (0usize, 0usize, 0usize);
    let mut failures: Vec<String> = Vec::new();
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    for k in 0..total {
        let (model, m, training) = strategy
            .new_tree(&mut runner)
            .expect("the strategies always give a case")
            .current();
        if k < from {
            continue;
        }
        let which = model.index(models.len());
        let bytes = mutate::mutate(&originals[which], &m);
        let before = ALLOCATOR.allocated();
        ALLOCATOR
            .set_limit(before.saturating_add(CASE_BYTES))
            .expect("the limit is above what is held");
        let t0 = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run_case(&bytes, training)));
        let took = t0.elapsed();
        ALLOCATOR
            .set_limit(usize::MAX)
            .expect("no limit is below what is held");
        slowest = slowest.max(took);
        let name = models[which]
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match outcome {
            Ok(_) if took > Duration::from_secs(CASE_SECONDS) => failures.push(format!(
                "case {k}: {name} with {m:?} (training {training}) took {took:?}"
            )),
            Ok(Outcome::DecodeError) => decode_errors += 1,
            Ok(Outcome::ImportError) => import_errors += 1,
            Ok(Outcome::Imported) => imported += 1,
            Err(payload) => {
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!(
                    "case {k}: {name} with {m:?} (training {training}) panicked: {message}"
                ))
            }
        }
        if (k + 1) % 5_000 == 0 || k + 1 == total {
            eprintln!(
                "{} / {total} cases, {} failures, {:.0?}",
                k + 1,
                failures.len(),
                start.elapsed()
            );
        }
    }
    let run = total.saturating_sub(from);
    println!(
        "onnx_mutations: {run} mutated files from seed {:?}: {imported} imported, {import_errors} \
         refused by the importer with a typed error, {decode_errors} refused by the decoder \
         with a typed error, {} failures (panics, cases over {CASE_SECONDS} s); slowest case \
         {slowest:.1?}, {:.1?} in all",
        String::from_utf8_lossy(&SEED),
        failures.len(),
        start.elapsed()
    );
    for f in &failures {
        println!("  {f}");
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
}
