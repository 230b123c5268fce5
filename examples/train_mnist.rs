//! Trains the MNIST classifier (Flatten -> Dense 256 relu -> Dense 128 relu -> Dense 10
//! softmax) with SGD on the bundled digits, using only the no_std core, and reports loss per
//! epoch and accuracy on the held-out split.
//!
//! ```sh
//! cargo run --release --example train_mnist
//! ```
//!
//! With `--export-firmware DIR` it also writes the trained weights and a few test digits in the
//! layout the Cortex-M firmware example embeds.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use tessera::core::models::{mnist_cnn, mnist_mlp, MnistMlp};
use tessera::core::rng::SplitMix64;
use tessera::core::{DType, Fixed, Graph, Optimizer, Plan};
use tessera::idx::{load_mnist, Images, Labels};

/// Train the MNIST classifier on the core alone.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory holding the four MNIST IDX files (raw or gzip).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/data/mnist-binarized-10k"))]
    data: PathBuf,
    /// Passes over the training split.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Micro-batch size.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// The classifier: the MLP (trained with SGD) or the CNN of `mnist_cnn.toml` (Adam).
    #[arg(long, default_value = "mlp", value_parser = ["mlp", "cnn"])]
    model: String,
    /// Learning rate (default 0.1 for the MLP's SGD, 0.001 for the CNN's Adam).
    #[arg(long)]
    learning_rate: Option<f32>,
    /// Seed of weight initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Element type of weights and activations (f32 or f16).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    dtype: String,
    /// Write `weights.bin`, `digits.bin` and `labels.bin` for the firmware example here.
    #[arg(long)]
    export_firmware: Option<PathBuf>,
}

/// Graph capacity: the training graphs have about 50 (MLP) and 100 (CNN) nodes.
const NODES: usize = 192;
/// Digits bundled with the firmware.
const FIRMWARE_DIGITS: usize = 8;

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn fill_batch(
    plan: &Plan<Fixed<NODES>>,
    arena: &mut [u8],
    images: &Images,
    labels: Option<&Labels>,
    indices: &[usize],
) -> Result<(), Box<dyn std::error::Error>> {
    let px = images.pixels_per_image();
    plan.fill_input("images", arena, indices.len() * px, |i| {
        f32::from(images.image(indices[i / px])[i % px]) / 255.0
    })?;
    if let Some(labels) = labels {
        plan.fill_input("labels", arena, indices.len(), |i| {
            f32::from(labels.labels[indices[i]])
        })?;
    }
    Ok(())
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let start = Instant::now();
    let avx2 = tessera::sim::use_fast_kernels();
    let dtype = if args.dtype == "f16" {
        DType::F16
    } else {
        DType::F32
    };
    let data = load_mnist(&args.data)?;
    let (train_n, test_n) = (data.train_images.count, data.test_images.count);
    println!(
        "data: {} training and {} test digits from {}; matmul kernel: {}",
        train_n,
        test_n,
        args.data.display(),
        if avx2 {
            "AVX2 / AVX-512 with FMA"
        } else {
            "portable"
        }
    );

    // Training graph.
    let batch = args.batch_size;
    let mut g: Graph<Fixed<NODES>> = Graph::new();
    let cnn = args.model == "cnn";
    let model = classifier(&mut g, cnn, batch, dtype)?;
    let labels = g.input("labels", &[batch], DType::I32)?;
    let loss = g.sparse_categorical_crossentropy("loss", model.probabilities, labels, false)?;
    let optimizer = if cnn {
        Optimizer::adam(args.learning_rate.unwrap_or(1e-3))
    } else {
        Optimizer::sgd(args.learning_rate.unwrap_or(0.1))
    };
    g.differentiate(loss, optimizer)?;
    let train = Plan::new(&g)?;
    let mut arena = vec![0u8; train.arena_bytes()];
    let mut state = vec![0u8; train.state_bytes()];
    train.init_state(&mut state, args.seed)?;
    println!(
        "training plan: {} nodes, arena {} bytes (peak live {}), state {} bytes",
        g.len(),
        train.arena_bytes(),
        train.peak_live_bytes(),
        train.state_bytes()
    );

    // Inference graph for evaluation: the same variables by name.
    let eval_batch = (1..=100).rev().find(|b| test_n % b == 0).unwrap_or(1);
    let mut ig: Graph<Fixed<NODES>> = Graph::new();
    let eval_model = classifier(&mut ig, cnn, eval_batch, dtype)?;
    let infer = Plan::new(&ig)?;
    let mut eval_arena = vec![0u8; infer.arena_bytes()];
    let mut eval_state = vec![0u8; infer.state_bytes()];
    println!(
        "inference plan (batch {eval_batch}): arena {} bytes, state {} bytes",
        infer.arena_bytes(),
        infer.state_bytes()
    );

    let mut order: Vec<usize> = (0..train_n).collect();
    let mut rng = SplitMix64::new(args.seed);
    let steps = train_n / batch; // drop the remainder
    for epoch in 1..=args.epochs {
        let t = Instant::now();
        rng.shuffle(&mut order);
        let mut total = 0f64;
        for s in 0..steps {
            let idx = &order[s * batch..(s + 1) * batch];
            fill_batch(
                &train,
                &mut arena,
                &data.train_images,
                Some(&data.train_labels),
                idx,
            )?;
            train.train_step(&mut arena, &mut state)?;
            total += f64::from(train.tensor(loss, &arena, &state)?.get(0));
        }
        infer.copy_state_from(&mut eval_state, &train, &state)?;
        let acc = accuracy(
            &infer,
            eval_model.logits,
            &mut eval_arena,
            &eval_state,
            &data.test_images,
            &data.test_labels,
        )?;
        println!(
            "epoch {epoch}: loss {:.4}, test accuracy {:.2}% ({:.1} s)",
            total / steps as f64,
            acc * 100.0,
            t.elapsed().as_secs_f64()
        );
    }
    infer.copy_state_from(&mut eval_state, &train, &state)?;
    let acc = accuracy(
        &infer,
        eval_model.logits,
        &mut eval_arena,
        &eval_state,
        &data.test_images,
        &data.test_labels,
    )?;
    println!(
        "final test accuracy {:.2}% on {} held-out digits; total time {:.1} s",
        acc * 100.0,
        test_n,
        start.elapsed().as_secs_f64()
    );

    if let Some(dir) = args.export_firmware {
        export_firmware(
            &dir,
            &train,
            &state,
            &data.test_images,
            &data.test_labels,
            (cnn, dtype),
        )?;
    }
    Ok(())
}

/// The MLP or the CNN.
fn classifier(
    g: &mut Graph<Fixed<NODES>>,
    cnn: bool,
    batch: usize,
    dtype: DType,
) -> Result<MnistMlp, Box<dyn std::error::Error>> {
    Ok(if cnn {
        mnist_cnn(g, batch, dtype)?
    } else {
        mnist_mlp(g, batch, dtype)?
    })
}

fn accuracy(
    plan: &Plan<Fixed<NODES>>,
    logits: tessera::core::NodeId,
    arena: &mut [u8],
    state: &[u8],
    images: &Images,
    labels: &Labels,
) -> Result<f64, Box<dyn std::error::Error>> {
    let batch = plan.graph().node(logits).shape().dim(0);
    let mut correct = 0usize;
    for b in 0..images.count / batch {
        let idx: Vec<usize> = (b * batch..(b + 1) * batch).collect();
        fill_batch(plan, arena, images, None, &idx)?;
        plan.infer(arena, state)?;
        let out = plan.tensor(logits, arena, state)?;
        for (r, &i) in idx.iter().enumerate() {
            let row: Vec<f32> = (0..10).map(|c| out.get(r * 10 + c)).collect();
            if argmax(&row) == usize::from(labels.labels[i]) {
                correct += 1;
            }
        }
    }
    Ok(correct as f64 / (images.count / batch * batch) as f64)
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

fn export_firmware(
    dir: &std::path::Path,
    train: &Plan<Fixed<NODES>>,
    state: &[u8],
    images: &Images,
    labels: &Labels,
    (cnn, dtype): (bool, DType),
) -> Result<(), Box<dyn std::error::Error>> {
    // The firmware builds the batch-1 inference graph with the same builder (and no
    // workspaces), so its state layout is this plan's.
    let mut g: Graph<Fixed<NODES>> = Graph::new();
    classifier(&mut g, cnn, 1, dtype)?;
    let plan = Plan::with_workspaces(&g, false)?;
    let mut weights = vec![0u8; plan.state_bytes()];
    plan.copy_state_from(&mut weights, train, state)?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("weights.bin"), &weights)?;
    let n = FIRMWARE_DIGITS.min(images.count);
    let digits: Vec<u8> = (0..n)
        .flat_map(|i| images.image(i).iter().copied())
        .collect();
    std::fs::write(dir.join("digits.bin"), digits)?;
    std::fs::write(dir.join("labels.bin"), &labels.labels[..n])?;
    println!(
        "firmware data written to {}: weights {} bytes, {} digits",
        dir.display(),
        weights.len(),
        n
    );
    Ok(())
}
