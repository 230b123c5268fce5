//! The whole training session of the README's main command, `tessera train`: the pipelined
//! Sequential MNIST model (two simulated Mk2 IPUs, Grouped schedule, M = 4, batch 32, SGD 0.1)
//! on the bundled digits with its default outfeeds (the `Dense_128` gradients before they are
//! applied, every MaybeOutfeed activation) and the per-epoch statistics tables, then the test
//! evaluation: three epochs, 744 micro-batches.
//!
//! The figure is the time per step: one micro-batch of 32 through the forward and the backward
//! pass, the weight update amortised over M. It is the time the command reports for training
//! (`Prepared::run`: the device, the outfeeds, the host's callbacks with their statistics
//! formatted as the command prints them, the evaluation) divided by the micro-batches. The
//! ahead-of-time work before it - building and planning the graph, the estimates, the fit
//! checks - is timed apart and printed per session, as a JAX step leaves out its compilation.
//!
//! When Python with JAX is present, the bench also runs its peer, `benches/jax_mlp_step.py` (a
//! jit-compiled update of the same model with the same M, per micro-batch), before and after
//! measuring the session, and prints both figures and their ratio; without it the peer is
//! skipped. `PYTHON` names the interpreter (default `python3`).
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tessera::host::idx::{load_mnist, Mnist};
use tessera::host::inspect::epoch_report;
use tessera::host::model::{shipped, Model};
use tessera::host::session::{
    compile, default_offload, prepare, OptimizerKind, SessionOptions, TrainEvent, TrainOptions,
};
use tessera::sim::machine::IpuConfig;
use tessera::sim::Preset;

/// The session options `tessera train` derives from the model file's `[training]` table.
fn options(model: &Model) -> SessionOptions {
    let t = &model.training;
    assert_eq!(t.optimizer.as_deref(), Some("sgd"), "the bench assumes SGD");
    assert_eq!(t.pipeline_schedule.as_deref(), Some("grouped"));
    let accumulation = t.gradient_accumulation_count.unwrap_or(1);
    let optimizer = OptimizerKind::Sgd;
    SessionOptions {
        batch_size: t.batch_size.unwrap_or(32),
        gradient_accumulation_count: accumulation,
        learning_rate: t.learning_rate.unwrap_or(optimizer.default_learning_rate()),
        optimizer,
        offload_optimizer_state: default_offload(
            model.stage_count(),
            accumulation,
            &IpuConfig::preset(Preset::Mk2),
        ),
        ..SessionOptions::default()
    }
}

/// What one session took.
struct Timed {
    /// Compile and prepare: the graph, the plan, the estimates and the checks.
    prepare: Duration,
    /// Training and evaluation (`Prepared::run`).
    run: Duration,
    /// Micro-batches trained.
    steps: u64,
}

/// One session as the command runs it; the reports' length goes to `black_box` so that
/// nothing is optimised away.
fn session(model: &Model, opts: &SessionOptions, data: &Mnist) -> Timed {
    let train = TrainOptions {
        epochs: model.training.epochs.unwrap_or(3),
        ..TrainOptions::default()
    };
    let start = Instant::now();
    let compiled = compile(model, opts).expect("the model compiles");
    let prepared = prepare(compiled, data, &train).expect("the run is valid");
    let prepare = start.elapsed();
    let start = Instant::now();
    let mut printed = 0usize;
    let report = prepared
        .run(data, |ev| {
            if let TrainEvent::Epoch {
                epoch, outfeeds, ..
            } = ev
            {
                for (cb, d) in &outfeeds {
                    printed += epoch_report(cb, epoch, d).len();
                }
            }
        })
        .expect("training runs");
    let run = start.elapsed();
    std::hint::black_box(printed);
    Timed {
        prepare,
        run,
        steps: report.steps,
    }
}

/// Seconds per step of the JAX peer, or why it was skipped.
fn jax_peer() -> Result<f64, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/jax_mlp_step.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        .arg(&script)
        .output()
        .map_err(|e| format!("{python} could not be started ({e})"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(err.lines().last().unwrap_or("no message").to_string());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("unreadable output ({e}): {line}"))?;
    v["seconds_per_step"]
        .as_f64()
        .ok_or_else(|| format!("no seconds_per_step in {line}"))
}

fn ms(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1e3)
}

fn train_session(c: &mut Criterion) {
    let model = shipped("pipelined_sequential")
        .expect("a shipped model")
        .expect("the shipped model parses");
    let opts = options(&model);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist-binarized-10k");
    let data = load_mnist(&dir).expect("the bundled digits");

    // The micro-batches of a session, from its plan (without training).
    let steps = {
        let compiled = compile(&model, &opts).expect("the model compiles");
        let train = TrainOptions {
            epochs: model.training.epochs.unwrap_or(3),
            ..TrainOptions::default()
        };
        let x = prepare(compiled, &data, &train)
            .expect("the run is valid")
            .executions();
        (x.executions * x.steps_per_execution()) as u64
    };
    // The peer runs just before the first session, so not at all when a filter leaves the
    // session out.
    let mut before = None;
    let timed = Mutex::new(Vec::<Timed>::new());
    let mut group = c.benchmark_group("session");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(steps));
    group.bench_function("tessera train (README's main command)", |b| {
        b.iter_custom(|iters| {
            before.get_or_insert_with(jax_peer);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = session(&model, &opts, &data);
                total += t.run;
                timed.lock().unwrap_or_else(|e| e.into_inner()).push(t);
            }
            total
        })
    });
    group.finish();
    let Some(before) = before else {
        return;
    };
    let after = jax_peer();

    let timed = timed.into_inner().unwrap_or_else(|e| e.into_inner());
    let median = |f: &dyn Fn(&Timed) -> f64| {
        let mut v: Vec<f64> = timed.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let per_step = median(&|t| t.run.as_secs_f64() / t.steps.max(1) as f64);
    let prepare = median(&|t| t.prepare.as_secs_f64());
    let (Some(per_step), Some(prepare)) = (per_step, prepare) else {
        return;
    };
    println!(
        "session: tessera {} per step (median of {} sessions of {steps} micro-batches of {}); \
         before them, compile and estimates {} per session",
        ms(per_step),
        timed.len(),
        opts.batch_size,
        ms(prepare)
    );
    match (before, after) {
        (Ok(b), Ok(a)) => {
            let jax = (a + b) / 2.0;
            println!(
                "session: jax {} per step (peer before {}, after {}); tessera / jax = {:.2} (target 1.25)",
                ms(jax),
                ms(b),
                ms(a),
                per_step / jax
            );
        }
        (Err(e), _) | (_, Err(e)) => println!("session: the JAX peer was skipped: {e}"),
    }
}

criterion_group!(benches, train_session);
criterion_main!(benches);
