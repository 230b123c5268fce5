//! Keras' evaluate() and predict() on the simulated device: for every shipped model,
//! pipelined and not, replicated or not, the device's numbers equal the core's inference
//! plan run batch by batch; checkpoints round-trip; bad execution sizes are typed errors.

use std::path::Path;

use tessera_core::{DType, Graph, Plan};
use tessera_host::compile::{compile, Heap, SessionError, SessionOptions};
use tessera_host::idx::{load_mnist, Mnist};
use tessera_host::model::{shipped, Model, SHIPPED};
use tessera_host::session::{evaluate, predict, train, EvaluateOptions, TrainOptions, Weights};

const BUNDLED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist-binarized-10k");

fn data() -> Mnist {
    load_mnist(Path::new(BUNDLED)).unwrap()
}

/// Test digits each shipped model's device run is compared on: 32 micro-batches of 16, whole
/// executions for every inference schedule and for two replicas (the equality holds sample by
/// sample, so the first digits show it as well as the whole split; the whole split runs in
/// the checkpoint test).
const COMPARED: usize = 512;

/// The bundled digits with the test split cut to its first `samples`.
fn first_test_digits(samples: usize) -> Mnist {
    let mut d = data();
    let px = d.test_images.pixels_per_image();
    d.test_images.count = samples;
    d.test_images.pixels.truncate(samples * px);
    d.test_labels.labels.truncate(samples);
    d
}

/// The core alone: (mean loss over micro-batches, outputs per sample) on the first
/// `samples` test digits, weights initialised from `seed`.
fn core_inference(
    model: &Model,
    b: usize,
    seed: u64,
    d: &Mnist,
    samples: usize,
) -> (f64, Vec<f32>) {
    let mut g: Graph<Heap> = Graph::new();
    let built = model.build(&mut g, b, DType::F32, false).unwrap();
    let labels = g.input("labels", &[b], DType::I32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", built.output, labels, !built.softmax_output)
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, seed).unwrap();
    let px = d.test_images.rows * d.test_images.cols;
    let (mut loss_sum, mut outputs) = (0f64, Vec::new());
    for start in (0..samples).step_by(b) {
        let pixels = &d.test_images.pixels[start * px..(start + b) * px];
        plan.fill_input(model.input_name.as_str(), &mut arena, pixels.len(), |i| {
            f32::from(pixels[i]) / 255.0
        })
        .unwrap();
        let l = &d.test_labels.labels[start..start + b];
        plan.fill_input("labels", &mut arena, b, |i| f32::from(l[i]))
            .unwrap();
        plan.infer(&mut arena, &state).unwrap();
        loss_sum += f64::from(plan.tensor(loss, &arena, &state).unwrap().get(0));
        outputs.extend(plan.tensor(built.output, &arena, &state).unwrap().iter());
    }
    (loss_sum / (samples / b) as f64, outputs)
}

/// One test per shipped model (they run in parallel), and a check that none is missed.
macro_rules! evaluation_tests {
    ($($test:ident: $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                evaluates_and_predicts_as_the_core_does($name);
            }
        )*

        #[test]
        fn every_shipped_model_has_an_evaluation_test() {
            let tested = [$($name),*];
            for (name, _) in SHIPPED {
                assert!(tested.contains(&name), "`{name}` has no evaluation test");
            }
        }
    };
}

evaluation_tests! {
    pipelined_sequential_evaluates_as_the_core_does: "pipelined_sequential",
    pipelined_model_evaluates_as_the_core_does: "pipelined_model",
    sequential_evaluates_as_the_core_does: "sequential",
    model_evaluates_as_the_core_does: "model",
    mnist_cnn_evaluates_as_the_core_does: "mnist_cnn",
    residual_cnn_evaluates_as_the_core_does: "residual_cnn",
    transformer_encoder_evaluates_as_the_core_does: "transformer_encoder",
}

/// The shipped model `name`, pipelined and not, replicated or not, evaluates and predicts
/// as the core's inference plan does.
fn evaluates_and_predicts_as_the_core_does(name: &str) {
    // Sessions run the fast kernels where the CPU has them (the switch is process-wide): the
    // core's reference below runs them too, whatever test of this binary runs first.
    tessera_sim::use_fast_kernels();
    let d = first_test_digits(COMPARED);
    let model = shipped(name).unwrap().unwrap();
    for (no_pipelining, replicas) in [(false, 1), (true, 1), (false, 2)] {
        let so = SessionOptions {
            batch_size: 16,
            no_pipelining,
            replicas,
            ..SessionOptions::default()
        };
        let opts = EvaluateOptions::default();
        let e = evaluate(&model, &so, Weights::Seed(3), &d, &opts).unwrap();
        let p = predict(&model, &so, Weights::Seed(3), &d, &opts).unwrap();
        assert_eq!(e.samples, p.samples);
        assert!(
            e.samples > COMPARED - 64 && e.samples <= COMPARED,
            "{name}: {}",
            e.samples
        );
        let (loss, outputs) = core_inference(&model, 16, 3, &d, e.samples);
        let what = format!("{name}, no_pipelining {no_pipelining}, replicas {replicas}");
        assert!(
            (e.loss - loss).abs() <= 1e-9 * loss.abs(),
            "{what}: {} vs {loss}",
            e.loss
        );
        let preds = p.predictions.as_ref().unwrap();
        assert_eq!(preds.shape, vec![e.samples, 10], "{what}");
        assert_eq!(
            preds.data, outputs,
            "{what}: predictions differ from the core's"
        );
        assert_eq!(e.accuracy, p.accuracy, "{what}");
        // The inference estimate uses the inference schedule: no stash, forward only.
        let stages = if no_pipelining {
            1
        } else {
            model.stage_count()
        };
        assert_eq!(e.estimate.stages.len(), stages, "{what}");
        assert!(e
            .estimate
            .stages
            .iter()
            .all(|s| s.stash_depth == 0 && s.backward_cycles == 0));
        assert_eq!(e.steps_per_execution % e.overlap, 0, "{what}");
    }
}

#[test]
fn a_checkpoint_evaluates_to_the_training_runs_test_accuracy() {
    let d = data();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("w.safetensors");
    let model = shipped("pipelined_sequential").unwrap().unwrap();
    let so = SessionOptions::default();
    let to = TrainOptions {
        run_single_step: true,
        checkpoint: Some(ckpt.clone()),
        ..TrainOptions::default()
    };
    let r = train(compile(&model, &so).unwrap(), &d, &to, |_| {}).unwrap();
    let e = evaluate(
        &model,
        &so,
        Weights::Checkpoint(&ckpt),
        &d,
        &EvaluateOptions::default(),
    )
    .unwrap();
    assert_eq!(e.accuracy, r.test_accuracy);
    assert_eq!(e.loss, r.test_loss);
    assert!(e.accuracy > 0.8, "{}", e.accuracy);
    // A checkpoint that is not one is a typed error naming the file.
    std::fs::write(&ckpt, b"not safetensors").unwrap();
    let err = evaluate(
        &model,
        &so,
        Weights::Checkpoint(&ckpt),
        &d,
        &EvaluateOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, SessionError::Checkpoint { .. }), "{err}");
    assert!(err.to_string().contains("w.safetensors"), "{err}");
}

#[test]
fn steps_per_execution_must_suit_the_inference_schedule() {
    let d = data();
    let model = shipped("pipelined_sequential").unwrap().unwrap();
    let so = SessionOptions::default();
    for k in [0, 3, 1000] {
        let opts = EvaluateOptions {
            steps_per_execution: Some(k),
            prefetch_depth: None,
        };
        let err = evaluate(&model, &so, Weights::Seed(0), &d, &opts).unwrap_err();
        assert!(
            matches!(
                err,
                SessionError::Option {
                    option: "--steps-per-execution",
                    ..
                }
            ),
            "{k}: {err}"
        );
    }
    // K = 4: 15 executions of 4 micro-batches of 32 (1,920 samples).
    let opts = EvaluateOptions {
        steps_per_execution: Some(4),
        prefetch_depth: None,
    };
    let e = evaluate(&model, &so, Weights::Seed(0), &d, &opts).unwrap();
    assert_eq!(
        (e.executions, e.steps_per_execution, e.samples),
        (15, 4, 1920)
    );
}
