//! Whole-model estimates through the library's one entry
//! (`tessera_host::estimation::estimate`), as `tessera estimate MODEL OPTIONS --no-search`
//! makes them: import, compile (the backward pass for training), lower every IPU program and
//! cost it.
//!
//! The models are the slowest of the bundled ONNX set: the ONNX Model Zoo's DenseNet-121 in
//! its weight-free light form (opset 9; its concatenations fragment every layout, the worst
//! case for the lowering's mappings) for training at batch 8 and 1 and for inference at batch
//! 8, BERT-Base split automatically over 4 IPUs at batch 8 (the profile, the split's
//! attempts and the estimate of the split), and BERT-Large's phase 2 pre-training at sequence
//! length 384 as Graphcore ran it on a Bow Pod16 (its tables' gradients are the largest
//! planned layouts: tens of thousands of rows cut into column groups).
//!
//! Each estimate starts from nothing, as the first of a process does: the lowerings this
//! process recorded before are dropped first (they would otherwise be replayed). One more
//! case times DenseNet-121's training at batch 8 estimated again in the same process, as a
//! sweep or the fewest-IPUs search does.
//!
//! `cargo bench --bench estimate [-- FILTER]`; each sample is one whole estimate, so the
//! group takes 10 samples.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tessera::host::estimation::{estimate, EstimateOptions, ModelSource};
use tessera::host::whole_models::WholeModels;
use tessera::sim::lower::clear_shared_records;

/// The `tessera` command's allocator, so that the bench times what the command does.
#[global_allocator]
static ALLOCATOR: tessera::host::allocator::Allocator = tessera::host::allocator::ALLOCATOR;

fn model(path: &str) -> ModelSource {
    ModelSource::OnnxFile(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path))
}

fn estimates(c: &mut Criterion) {
    let densenet = model("data/onnx/zoo_light/light_densenet121.onnx");
    let bert = model("data/onnx/bert_base.stripped.onnx");
    let bert_large = model("data/onnx/bert_large_qkv_384.stripped.onnx");
    // The calibration's run of Graphcore's configuration (`data/calibration/whole_models.toml`).
    let runs = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/calibration/whole_models.toml"),
    )
    .expect("the calibration's runs");
    let runs = WholeModels::parse(&runs).expect("they parse");
    let run = runs
        .run
        .iter()
        .find(|r| r.name == "BERT-Large phase 2 SL384, Bow Pod16")
        .expect("the run");
    let mut phase2 = run
        .config()
        .estimate_options(true)
        .expect("the options parse");
    phase2.no_search = true;
    let cases: [(&str, &ModelSource, EstimateOptions); 5] = [
        (
            "densenet121 training b8",
            &densenet,
            EstimateOptions {
                batch_size: Some(8),
                no_search: true,
                ..EstimateOptions::default()
            },
        ),
        (
            "densenet121 training b1",
            &densenet,
            EstimateOptions {
                batch_size: Some(1),
                no_search: true,
                ..EstimateOptions::default()
            },
        ),
        (
            "densenet121 inference b8",
            &densenet,
            EstimateOptions {
                batch_size: Some(8),
                inference: true,
                no_search: true,
                ..EstimateOptions::default()
            },
        ),
        (
            "bert-base training b8, 4 IPUs split automatically",
            &bert,
            EstimateOptions {
                batch_size: Some(8),
                pipeline_ipus: Some(4),
                no_search: true,
                ..EstimateOptions::default()
            },
        ),
        (
            "bert-large phase 2 at length 384, Bow Pod16",
            &bert_large,
            phase2,
        ),
    ];
    let mut group = c.benchmark_group("estimate");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(60));
    for (name, source, options) in &cases {
        group.bench_function(*name, |b| {
            b.iter_batched(
                clear_shared_records,
                |()| {
                    let e = estimate(source, options).expect("the bundled model estimates");
                    std::hint::black_box(e.summary.cycles_per_step)
                },
                BatchSize::PerIteration,
            )
        });
    }
    // The first case (DenseNet-121 training b8), its records kept from one sample to the
    // next.
    let (name, source, options) = &cases[0];
    group.bench_function(format!("{name}, again in the same process"), |b| {
        b.iter(|| {
            let e = estimate(source, options).expect("the bundled model estimates");
            std::hint::black_box(e.summary.cycles_per_step)
        })
    });
    group.finish();
}

criterion_group!(benches, estimates);
criterion_main!(benches);
