//! Training sessions end to end on the bundled digits: gradient outfeed shapes in both modes
//! (and that the accumulated gradients are the sums of the micro-batch gradients, in order),
//! activation filters, replicas, NaN/inf detection, determinism and typed errors.

use std::collections::BTreeMap;
use std::path::Path;

use tessera_core::schedule::Schedule;
use tessera_host::compile::{compile, SessionError, SessionOptions};
use tessera_host::idx::{load_mnist, Mnist};
use tessera_host::infeed::InfeedError;
use tessera_host::inspect::GradientOutfeedMode;
use tessera_host::model::shipped;
use tessera_host::outfeed::{HostTensor, OutfeedError, OutfeedMode, OutfeedQueue};
use tessera_host::session::{train, TrainEvent, TrainOptions, TrainReport};
use tessera_host::stats::TensorStats;
use tessera_sim::system::SystemError;

const BUNDLED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist-binarized-10k");

type Outfeeds = Vec<(String, BTreeMap<String, HostTensor>)>;

fn data() -> Mnist {
    load_mnist(Path::new(BUNDLED)).unwrap()
}

/// Trains `model` and returns the report and every epoch's callback data.
fn run(
    model: &str,
    so: &SessionOptions,
    to: &TrainOptions,
    data: &Mnist,
) -> Result<(TrainReport, Vec<Outfeeds>), SessionError> {
    let m = shipped(model).unwrap().unwrap();
    let compiled = compile(&m, so)?;
    let mut epochs = Vec::new();
    let report = train(compiled, data, to, |ev| {
        if let TrainEvent::Epoch { outfeeds, .. } = ev {
            epochs.push(outfeeds);
        }
    })?;
    Ok((report, epochs))
}

fn callback<'a>(epoch: &'a Outfeeds, name: &str) -> &'a BTreeMap<String, HostTensor> {
    &epoch.iter().find(|(n, _)| n == name).unwrap().1
}

#[test]
fn gradient_outfeed_shapes_and_sums_with_m16_r100() {
    let d = data();
    let so = SessionOptions {
        batch_size: 1,
        gradient_accumulation_count: 16,
        repeat_count: Some(100),
        ..SessionOptions::default()
    };
    let mut to = TrainOptions {
        run_single_step: true,
        gradients_filters: Some(vec!["Dense_128/bias".into()]),
        ..TrainOptions::default()
    };
    let (r, before) = run("sequential", &so, &to, &d).unwrap();
    assert_eq!(r.weight_updates, 100);
    assert_eq!(r.steps, 1600);
    let before = callback(&before[0], "Gradients callback")["Dense_128/bias:0_grad"].clone();
    assert_eq!(before.shape, vec![100, 128]);

    to.gradient_outfeed_mode = GradientOutfeedMode::AfterCompute;
    let (_, after) = run("sequential", &so, &to, &d).unwrap();
    let g = callback(&after[0], "Gradients callback");
    assert_eq!(g.keys().collect::<Vec<_>>(), vec!["Dense_128/bias:0_grad"]);
    let after = &g["Dense_128/bias:0_grad"];
    assert_eq!(after.shape, vec![1600, 128]);

    // Each weight update's accumulated gradient is the sum of its 16 micro-batch gradients,
    // in the order they were enqueued (SUM accumulation, same seed, same data order).
    for u in 0..100 {
        for j in 0..128 {
            let sum: f32 = (0..16).map(|k| after.data[(u * 16 + k) * 128 + j]).sum();
            let acc = before.data[u * 128 + j];
            assert!(
                (sum - acc).abs() <= 1e-5 * (1.0 + acc.abs()),
                "update {u} element {j}: sum {sum} accumulated {acc}"
            );
        }
    }
}

#[test]
fn activation_filters_substring_none_and_empty() {
    let d = data();
    let so = SessionOptions::default();
    let go = |filters: Option<Vec<String>>| {
        let to = TrainOptions {
            run_single_step: true,
            activations_filters: filters,
            buffer_depth: 1,
            ..TrainOptions::default()
        };
        let (r, e) = run("pipelined_sequential", &so, &to, &d).unwrap();
        let acts = callback(&e[0], "Multi-layer activations callback").clone();
        let enqueued = r
            .outfeeds
            .iter()
            .find(|o| o.queue == "multi_activations_outfeed")
            .unwrap()
            .enqueued;
        (acts, enqueued)
    };
    // No filter: both taps, one element per micro-batch, every one received with a buffer
    // depth of 1 (the device stalls until the host thread drains).
    let (all, n) = go(None);
    assert_eq!(n, 248);
    assert_eq!(all["Dense_128_acts"].shape, vec![248, 32, 128]);
    assert_eq!(all["Dense_10_acts"].shape, vec![248, 32, 10]);
    // Softmax outputs: every row of every micro-batch sums to 1.
    for row in all["Dense_10_acts"].data.chunks(10) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    }
    let (some, _) = go(Some(vec!["_10".into()]));
    assert_eq!(some.keys().collect::<Vec<_>>(), vec!["Dense_10_acts"]);
    assert_eq!(some["Dense_10_acts"].data, all["Dense_10_acts"].data);
    let (none, n) = go(Some(vec![]));
    assert!(none.is_empty());
    assert_eq!(n, 0);
}

#[test]
fn replicas_add_a_dimension_and_stay_in_step() {
    let d = data();
    let so = SessionOptions {
        replicas: 2,
        ..SessionOptions::default()
    };
    let to = TrainOptions {
        run_single_step: true,
        ..TrainOptions::default()
    };
    let (r, e) = run("pipelined_sequential", &so, &to, &d).unwrap();
    let g = &callback(&e[0], "Gradients callback")["Dense_128/bias:0_grad"];
    // 250 micro-batches of 32 per epoch, 2 replicas x M = 4 per update: 31 updates.
    assert_eq!(g.shape, vec![31, 2, 128]);
    // After the all-reduce both replicas hold the same accumulated gradient.
    for u in 0..31 {
        let a = &g.data[(u * 2) * 128..(u * 2 + 1) * 128];
        let b = &g.data[(u * 2 + 1) * 128..(u * 2 + 2) * 128];
        assert_eq!(a, b);
    }
    let acts = &callback(&e[0], "Multi-layer activations callback")["Dense_128_acts"];
    assert_eq!(acts.shape, vec![124, 2, 32, 128]);
    assert!(r.test_accuracy > 0.5);
}

#[test]
fn nan_and_inf_are_reported() {
    let d = data();
    let so = SessionOptions {
        learning_rate: 1e30,
        ..SessionOptions::default()
    };
    let to = TrainOptions {
        run_single_step: true,
        gradients_filters: None,
        ..TrainOptions::default()
    };
    let (_, e) = run("pipelined_sequential", &so, &to, &d).unwrap();
    let stats: Vec<TensorStats> = e[0]
        .iter()
        .flat_map(|(_, m)| m.values().map(TensorStats::of))
        .collect();
    assert!(
        stats.iter().any(|s| s.has_nan),
        "an exploding run yields NaN"
    );
    assert!(
        stats.iter().any(|s| s.has_inf),
        "an exploding run yields inf"
    );
    let text: String = e[0]
        .iter()
        .map(|(n, m)| tessera_host::inspect::epoch_report(n, 1, m))
        .collect();
    assert!(text.contains("True"), "{text}");
}

#[test]
fn same_seed_same_bits_other_seed_other_bits() {
    let d = data();
    let so = SessionOptions {
        schedule: Schedule::Interleaved,
        ..SessionOptions::default()
    };
    let to = TrainOptions {
        run_single_step: true,
        ..TrainOptions::default()
    };
    let (a, ea) = run("pipelined_model", &so, &to, &d).unwrap();
    let (b, eb) = run("pipelined_model", &so, &to, &d).unwrap();
    assert_eq!(a.epoch_losses, b.epoch_losses);
    assert_eq!(a.test_accuracy, b.test_accuracy);
    assert_eq!(ea, eb);
    let to2 = TrainOptions { seed: 1, ..to };
    let (c, _) = run("pipelined_model", &so, &to2, &d).unwrap();
    assert_ne!(a.epoch_losses, c.epoch_losses);
}

#[test]
fn invalid_depths_are_typed_errors() {
    let d = data();
    let so = SessionOptions::default();
    let bad_buffer = TrainOptions {
        buffer_depth: 0,
        ..TrainOptions::default()
    };
    match run("pipelined_sequential", &so, &bad_buffer, &d) {
        Err(SessionError::Outfeed(OutfeedError::InvalidBufferDepth { depth: 0, .. })) => {}
        other => panic!("expected InvalidBufferDepth, got {:?}", other.map(|r| r.0)),
    }
    let bad_prefetch = TrainOptions {
        prefetch_depth: 0,
        ..TrainOptions::default()
    };
    match run("pipelined_sequential", &so, &bad_prefetch, &d) {
        Err(SessionError::Infeed(e @ InfeedError::BadPrefetchDepth { .. })) => {
            assert!(e.to_string().contains("prefetch depth 0"));
        }
        other => panic!("expected BadPrefetchDepth, got {:?}", other.map(|r| r.0)),
    }
    // LAST mode before anything was enqueued.
    let q = OutfeedQueue::new("last", OutfeedMode::Last, 3, 1).unwrap();
    assert!(matches!(
        q.dequeue(),
        Err(OutfeedError::NothingEnqueued { .. })
    ));
}

#[test]
fn executions_longer_than_an_epoch_run_over_the_repeated_dataset() {
    let d = data();
    // R = 100 updates of 4 x 32 samples: 12,800 samples, 1.6 passes over the 8,000 digits.
    // Three passes round to two executions; each spans more than a pass, so the callbacks
    // run after each.
    let so = SessionOptions {
        repeat_count: Some(100),
        ..SessionOptions::default()
    };
    let to = TrainOptions {
        gradients_filters: Some(vec![]),
        activations_filters: Some(vec![]),
        ..TrainOptions::default()
    };
    let mut seen = Vec::new();
    let m = shipped("pipelined_sequential").unwrap().unwrap();
    let r = train(compile(&m, &so).unwrap(), &d, &to, |ev| {
        if let TrainEvent::Epoch { epochs_seen, .. } = ev {
            seen.push(epochs_seen);
        }
    })
    .unwrap();
    assert_eq!((r.executions, r.weight_updates, r.steps), (2, 200, 800));
    assert_eq!(seen, vec![1.6, 3.2]);
    assert_eq!(r.epochs_seen, 3.2);
    assert_eq!(r.epoch_losses.len(), 2);
    assert!(
        r.epoch_losses[1] < r.epoch_losses[0],
        "{:?}",
        r.epoch_losses
    );
}

#[test]
fn execution_sizes_are_checked() {
    let d = data();
    let to = TrainOptions::default();
    let so = SessionOptions {
        repeat_count: Some(0),
        ..SessionOptions::default()
    };
    let e = run("pipelined_sequential", &so, &to, &d).err().unwrap();
    assert!(
        matches!(&e, SessionError::System(s) if matches!(**s, SystemError::StepsPerExecution { .. })),
        "{e}"
    );
    let so = SessionOptions {
        steps_per_execution: Some(8),
        ..SessionOptions::default()
    };
    let (r, _) = run(
        "pipelined_sequential",
        &so,
        &TrainOptions {
            run_single_step: true,
            ..to
        },
        &d,
    )
    .unwrap();
    assert_eq!((r.repeat_count, r.steps), (2, 8));
}
