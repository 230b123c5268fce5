//! The simulator's speed: a simulated training step of the MNIST classifier against the same
//! step run by the core alone (`sim_step`), and the lowering and estimate-only path on a graph
//! of more than 100,000 vertices (`lower`, reported as vertices per second), and how that
//! time grows when the layers double (`lower_doubling`).
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tessera::core::models::{mnist_mlp, mnist_mlp_pipelined};
use tessera::core::schedule::Schedule;
use tessera::core::{Accumulation, Activation, DType, Fixed, Graph, Optimizer, Plan};
use tessera::sim::lower::clear_shared_records;
use tessera::sim::runner::PipelineRunner;
use tessera::sim::{estimate, estimate_only, Heap, IpuConfig, IpuEstimateOptions, Preset};

fn classifier() -> Plan<Fixed<96>> {
    let mut g: Graph<Fixed<96>> = Graph::new();
    let m = mnist_mlp(&mut g, 32, DType::F32).unwrap();
    let labels = g.input("labels", &[32], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
        .unwrap();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    Plan::new(&g).unwrap()
}

fn sim_step(c: &mut Criterion) {
    // Both sides use the same kernels: AVX2 / AVX-512 with FMA when the CPU has them.
    tessera::sim::use_fast_kernels();
    let plan = classifier();
    let img = |i: usize| ((i * 7919) % 255) as f32 / 255.0;
    let lab = |i: usize| (i % 10) as f32;
    let mut group = c.benchmark_group("sim_step");

    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 1).unwrap();
    plan.fill_input("images", &mut arena, 32 * 784, img)
        .unwrap();
    plan.fill_input("labels", &mut arena, 32, lab).unwrap();
    group.bench_function("core", |b| {
        b.iter(|| plan.train_step(&mut arena, &mut state).unwrap())
    });

    // The one-stage runner: what the simulated machine adds around the core's step.
    let mut runner = PipelineRunner::new(plan.clone(), Schedule::Sequential, 1).unwrap();
    runner.init_state(1).unwrap();
    group.bench_function("runner one stage", |b| {
        b.iter(|| {
            runner
                .run_update(|_, _, plan, arena| {
                    plan.fill_input("images", arena, 32 * 784, img)?;
                    plan.fill_input("labels", arena, 32, lab)
                })
                .unwrap()
        })
    });
    group.finish();
}

/// One weight update of the pipelined classifier (two stages, M = 4 micro-batches of 32,
/// Grouped): what `tessera train` runs per update, outfeeds aside. Compare with four core
/// steps (`sim_step/core`).
fn runner_update(c: &mut Criterion) {
    tessera::sim::use_fast_kernels();
    let mut g: Graph<Fixed<160>> = Graph::new();
    let m = mnist_mlp_pipelined(&mut g, 32, DType::F32, [0, 0, 1, 1]).unwrap();
    let labels = g.input("labels", &[32], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
        .unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(4))
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let mut runner = PipelineRunner::new(plan, Schedule::Grouped, 1).unwrap();
    runner.init_state(1).unwrap();
    let img = |i: usize| ((i * 7919) % 255) as f32 / 255.0;
    let lab = |i: usize| (i % 10) as f32;
    let mut group = c.benchmark_group("runner");
    group.throughput(Throughput::Elements(4));
    group.bench_function("pipelined classifier update, M = 4", |b| {
        b.iter(|| {
            runner
                .run_update(|_, _, plan, arena| {
                    plan.fill_input("images", arena, 32 * 784, img)?;
                    plan.fill_input("labels", arena, 32, lab)
                })
                .unwrap()
        })
    });
    group.finish();
}

fn lower(c: &mut Criterion) {
    // Eight dense layers of 1024 on a batch of 512, trained with Adam: well over 100,000
    // vertices on a Mk2.
    let plan = mlp_plan(8);
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let opts = IpuEstimateOptions {
        batch_size: 512,
        allow_out_of_memory: true,
        ..Default::default()
    };
    let (program, est) = estimate(&plan, &mk2, &opts).unwrap();
    let vertices = program.vertex_count() as u64;
    eprintln!(
        "lower: {} nodes, {vertices} vertices, {} compute sets, {} cycles per step, fits: {}",
        plan.graph().len(),
        est.compute_sets,
        est.cycles_per_step,
        est.fits
    );
    assert!(vertices >= 100_000, "{vertices} vertices");
    let mut group = c.benchmark_group("lower");
    group.throughput(Throughput::Elements(vertices));
    group.sample_size(10);
    group.bench_function("estimate-only, 8x1024 MLP batch 512", |b| {
        b.iter(|| estimate(&plan, &mk2, &opts).unwrap())
    });
    let unchecked = IpuEstimateOptions {
        verify: false,
        ..opts
    };
    group.bench_function("estimate-only without the checker", |b| {
        b.iter(|| estimate(&plan, &mk2, &unchecked).unwrap())
    });
    // Exchanges kept as summaries, no transfers: the lowering `tessera estimate` uses (through
    // the system estimate) and estimate-op uses (through estimate_only).
    // Each run from nothing, as a process's first estimate: the records kept from earlier
    // lowerings are dropped before it.
    group.bench_function("summaries (estimate_only)", |b| {
        b.iter_batched(
            clear_shared_records,
            |()| estimate_only(&plan, &mk2, &unchecked).unwrap(),
            BatchSize::PerIteration,
        )
    });
    // Again after an estimate of the same model: a split's retries, a search and a sweep
    // estimate the same layers many times and replay the records kept.
    group.bench_function("summaries, records kept from an earlier estimate", |b| {
        b.iter(|| estimate_only(&plan, &mk2, &unchecked).unwrap())
    });
    group.finish();
}

/// `layers` dense layers of 1024 and a 1000-way classifier on a batch of 512 (f16, Adam).
fn mlp_plan(layers: usize) -> Plan<Heap> {
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[512, 1024], DType::F16).unwrap();
    let labels = g.input("labels", &[512], DType::I32).unwrap();
    let mut h = x;
    for l in 0..layers {
        h = g
            .dense(&format!("Dense_{l}"), h, 1024, Activation::Relu, DType::F16)
            .unwrap();
    }
    let logits = g
        .dense("logits", h, 1000, Activation::Linear, DType::F16)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", logits, labels, true)
        .unwrap();
    g.differentiate(loss, Optimizer::adam(1e-3)).unwrap();
    Plan::new(&g).unwrap()
}

/// How the estimate's time grows with the model: the same MLP with 8 and with 16 layers
/// (the target: doubling the layers at most doubles the time, give or take 5%). Prints the
/// ratio of one timed run of each before criterion's figures.
fn lower_doubling(c: &mut Criterion) {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let opts = IpuEstimateOptions {
        batch_size: 512,
        allow_out_of_memory: true,
        verify: false,
        ..Default::default()
    };
    let plans = [(8, mlp_plan(8)), (16, mlp_plan(16))];
    let mut seconds = Vec::new();
    for (layers, plan) in &plans {
        estimate_only(plan, &mk2, &opts).unwrap();
        let t = std::time::Instant::now();
        for _ in 0..3 {
            clear_shared_records();
            estimate_only(plan, &mk2, &opts).unwrap();
        }
        seconds.push(t.elapsed().as_secs_f64() / 3.0);
        eprintln!(
            "lower_doubling: {layers} layers, {} nodes, {:.3} s per estimate",
            plan.graph().len(),
            seconds[seconds.len() - 1]
        );
    }
    eprintln!(
        "lower_doubling: 16 layers / 8 layers = {:.2}x",
        seconds[1] / seconds[0]
    );
    let mut group = c.benchmark_group("lower_doubling");
    group.sample_size(10);
    for (layers, plan) in &plans {
        group.bench_function(format!("summaries, {layers}x1024 MLP batch 512"), |b| {
            b.iter_batched(
                clear_shared_records,
                |()| estimate_only(plan, &mk2, &opts).unwrap(),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, sim_step, runner_update, lower, lower_doubling);
criterion_main!(benches);
