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
//! jit-compiled update of the same model with the same M, per micro-batch), started once and
//! asked for one timed run of 250 updates after each session, so that both see the machine in
//! the same state (a shared machine's speed drifts by tens of percent over a minute). It prints
//! both medians and the median of the paired ratios (each session against the JAX run right
//! after it); without JAX the peer is skipped. `PYTHON` names the interpreter (default
//! `python3`).
// Run errors carry node names inline (see the core); closures returning them are fine here.
#![allow(clippy::result_large_err)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tessera::host::compile::{compile, SessionOptions};
use tessera::host::estimation::EstimateOptions;
use tessera::host::idx::{load_mnist, Mnist};
use tessera::host::inspect::epoch_report;
use tessera::host::model::{shipped, Model};
use tessera::host::session::{prepare, TrainEvent, TrainOptions};

/// The session options `tessera train` derives from the model file's `[training]` table
/// (with no options on the command line).
fn options(model: &Model) -> SessionOptions {
    EstimateOptions::default()
        .for_model(&model.training, &model.name)
        .and_then(|o| o.session_options(&model.name, model.stage_count()))
        .expect("a shipped model's [training] table reads")
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

/// The JAX peer, serving timed runs (`--serve`).
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// Reads the peer's standard error as it comes (an unread pipe would block the peer once
    /// full) and returns its last line when the peer ends.
    errors: Option<JoinHandle<String>>,
}

impl Peer {
    /// Starts the peer and waits until it has compiled and warmed up; why not, otherwise.
    fn start() -> Result<Self, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/jax_mlp_step.py");
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
        let mut child = Command::new(&python)
            .arg(&script)
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{python} could not be started ({e})"))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err("no pipes to the peer".into());
        };
        let errors = std::thread::spawn(move || {
            BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
                .last()
                .unwrap_or_default()
        });
        let mut peer = Peer {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            errors: Some(errors),
        };
        let ready = peer.line()?;
        if ready["ready"].as_bool() != Some(true) {
            return Err(format!("not ready: {ready}"));
        }
        Ok(peer)
    }

    /// The next JSON line from the peer; its last error line if it has ended.
    fn line(&mut self) -> Result<serde_json::Value, String> {
        let mut line = String::new();
        let read = self
            .stdout
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if read == 0 {
            drop(self.stdin.take());
            let _ = self.child.wait();
            let last = self.errors.take().and_then(|h| h.join().ok());
            return Err(last
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| "the peer ended".to_string()));
        }
        serde_json::from_str(line.trim()).map_err(|e| format!("unreadable output ({e}): {line}"))
    }

    /// Seconds per step of one timed run.
    fn run(&mut self) -> Result<f64, String> {
        let stdin = self.stdin.as_mut().ok_or("the peer's input is closed")?;
        writeln!(stdin, "run")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("the peer went away ({e})"))?;
        let v = self.line()?;
        v["seconds_per_step"]
            .as_f64()
            .ok_or_else(|| format!("no seconds_per_step in {v}"))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Closing its input ends the peer.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
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
    // The peer starts with the first session, so not at all when a filter leaves the session
    // out; once it fails it is not asked again.
    let mut peer: Option<Result<Peer, String>> = None;
    let timed = Mutex::new(Vec::<(Timed, Option<f64>)>::new());
    let mut group = c.benchmark_group("session");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(steps));
    group.bench_function("tessera train (README's main command)", |b| {
        b.iter_custom(|iters| {
            let peer = peer.get_or_insert_with(Peer::start);
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = session(&model, &opts, &data);
                total += t.run;
                let jax = match peer {
                    Ok(p) => match p.run() {
                        Ok(s) => Some(s),
                        Err(e) => {
                            *peer = Err(e);
                            None
                        }
                    },
                    Err(_) => None,
                };
                timed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((t, jax));
            }
            total
        })
    });
    group.finish();
    let Some(peer) = peer else {
        return;
    };
    let timed = timed.into_inner().unwrap_or_else(|e| e.into_inner());
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let per_step = |t: &Timed| t.run.as_secs_f64() / t.steps.max(1) as f64;
    let tessera = median(timed.iter().map(|(t, _)| per_step(t)).collect());
    let prepare = median(timed.iter().map(|(t, _)| t.prepare.as_secs_f64()).collect());
    let (Some(tessera), Some(prepare)) = (tessera, prepare) else {
        return;
    };
    println!(
        "session: tessera {} per step (median of {} sessions of {steps} micro-batches of {}); \
         before them, compile and estimates {} per session",
        ms(tessera),
        timed.len(),
        opts.batch_size,
        ms(prepare)
    );
    let paired: Vec<(f64, f64)> = timed
        .iter()
        .filter_map(|(t, jax)| jax.map(|j| (per_step(t), j)))
        .collect();
    let jax = median(paired.iter().map(|p| p.1).collect());
    let ratio = median(paired.iter().map(|(t, j)| t / j).collect());
    match (peer, jax, ratio) {
        (Ok(_), Some(jax), Some(ratio)) => println!(
            "session: jax {} per step (median of {} runs, each right after a session); \
             tessera / jax = {ratio:.2} (median of the paired ratios; target at most 1.00), \
             ratio of the medians {:.2}",
            ms(jax),
            paired.len(),
            tessera / jax
        ),
        (Err(e), ..) => println!("session: the JAX peer was skipped: {e}"),
        _ => println!("session: the JAX peer gave no runs"),
    }
}

criterion_group!(benches, train_session);
criterion_main!(benches);
