//! Datasets and infeed queues end to end: the bundled MNIST subset through shuffle, map, cast
//! and batch; the background producer's prefetching and shutdown; feeding a real plan; and
//! the dataset benchmark report.

use std::path::Path;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use tessera_core::f16::{f16_to_f32, f32_to_f16};
use tessera_core::models::mnist_mlp;
use tessera_core::{DType, Fixed, Graph, Optimizer, Plan, RunError};
use tessera_host::dataset::{Batch, Dataset, DatasetError, DatasetSpec, FieldSpec};
use tessera_host::idx::{self, Mnist};
use tessera_host::infeed::{
    dataset_benchmark, feed, InfeedError, InfeedQueue, DEFAULT_PREFETCH_DEPTH,
};

/// Bytes of one MNIST batch of 32 with f32 images and labels.
const BATCH_BYTES: usize = 32 * 28 * 28 * 4 + 32 * 4;

fn mnist() -> Mnist {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist-binarized-10k");
    idx::load_mnist(&dir).unwrap_or_else(|e| panic!("{e}"))
}

/// The 8,000 training samples, pixels scaled to [0, 1].
fn train(m: &Mnist) -> Dataset {
    Dataset::from_mnist_split(&m.train_images, &m.train_labels)
        .unwrap()
        .map("images", |x| x / 255.0)
        .unwrap()
}

/// Every sample of a sequence of batches as (pixels, label), in order.
fn samples(batches: &[Batch]) -> Vec<(Vec<u8>, u8)> {
    let mut out = Vec::new();
    for b in batches {
        let (_, images) = b.field("images").unwrap();
        let (_, labels) = b.field("labels").unwrap();
        for (image, &label) in images.chunks(784).zip(labels) {
            let pixels = image.iter().map(|&p| (p * 255.0) as u8).collect();
            out.push((pixels, label as u8));
        }
    }
    out
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v
}

/// Polls `cond` until it holds or `limit` passes.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(2));
    }
    cond()
}

#[test]
fn mnist_batches_have_fixed_shapes_and_250_per_epoch() {
    let m = mnist();
    let d = train(&m).batch(32, true).unwrap();
    assert_eq!(d.epoch_len(), Some(250));
    assert!(d.has_fixed_shape());
    assert_eq!(d.spec().field("images").unwrap().shape, vec![32, 28, 28]);
    assert_eq!(d.spec().field("labels").unwrap().shape, vec![32]);

    let mut q = InfeedQueue::new("train", d, DEFAULT_PREFETCH_DEPTH).unwrap();
    let mut batches = Vec::new();
    while let Some(b) = q.next_batch().unwrap() {
        assert_eq!(b.field("images").unwrap().0, &[32, 28, 28]);
        assert_eq!(b.field("labels").unwrap().0, &[32]);
        assert_eq!(b.dtype("images"), Some(DType::F32));
        assert_eq!(b.bytes(), BATCH_BYTES);
        assert!(b
            .field("images")
            .unwrap()
            .1
            .iter()
            .all(|&p| p == 0.0 || p == 1.0));
        batches.push(b);
    }
    assert_eq!(batches.len(), 250);
    // Unshuffled, the batches are the file in order.
    let got = samples(&batches);
    assert_eq!(got.len(), 8000);
    for (i, (pixels, label)) in got.iter().enumerate() {
        assert_eq!(pixels.as_slice(), m.train_images.image(i));
        assert_eq!(*label, m.train_labels.labels[i]);
    }
    let s = q.stats();
    assert_eq!((s.batches_produced, s.batches_consumed), (250, 250));
    assert_eq!(s.bytes_consumed, 250 * BATCH_BYTES as u64);
}

#[test]
fn shuffle_is_deterministic_differs_between_epochs_and_seeds_and_permutes() {
    let m = mnist();
    let in_order = samples(
        &train(&m)
            .batch(32, true)
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
    );
    let everything = sorted(&in_order);

    // Two epochs through an infeed queue: shuffle before repeat reshuffles each epoch.
    let pipeline = |seed| {
        train(&m)
            .shuffle(seed)
            .unwrap()
            .batch(32, true)
            .unwrap()
            .repeat(Some(2))
            .unwrap()
    };
    let run = |seed| {
        let mut q = InfeedQueue::new("train", pipeline(seed), 4).unwrap();
        let mut batches = Vec::new();
        while let Some(b) = q.next_batch().unwrap() {
            batches.push(b);
        }
        batches
    };
    let a = run(7);
    assert_eq!(a.len(), 500);
    let (epoch0, epoch1) = (samples(&a[..250]), samples(&a[250..]));
    assert_ne!(epoch0, in_order);
    assert_ne!(epoch0, epoch1, "each epoch draws a fresh permutation");
    assert_eq!(
        sorted(&epoch0),
        everything,
        "epoch 0 holds every sample once"
    );
    assert_eq!(
        sorted(&epoch1),
        everything,
        "epoch 1 holds every sample once"
    );

    assert_eq!(run(7), a, "the same seed gives the same batches");
    let b = samples(&run(8)[..250]);
    assert_ne!(b, epoch0, "another seed gives another order");
    assert_eq!(sorted(&b), everything);

    // Iterating the dataset directly agrees with the queue.
    let direct: Vec<Batch> = pipeline(7).iter().take(3).collect();
    assert_eq!(direct[..], a[..3]);
}

#[test]
fn a_short_last_batch_is_shape_not_fixed() {
    let m = mnist();
    // 8,000 = 166 x 48 + 32: the last batch would be short.
    let d = train(&m).batch(48, false).unwrap();
    assert!(!d.has_fixed_shape());
    assert_eq!(d.epoch_len(), Some(167));
    let e = InfeedQueue::new("train", d, 3).unwrap_err();
    assert!(
        matches!(e, InfeedError::ShapeNotFixed { ref queue, ref field } if queue == "train" && field == "images"),
        "{e:?}"
    );
    let message = e.to_string();
    assert!(message.contains("`train`") && message.contains("`images`") && !message.contains('\n'));

    // drop_remainder, or a batch size that divides the dataset, keeps the shape fixed.
    assert!(InfeedQueue::new("train", train(&m).batch(48, true).unwrap(), 3).is_ok());
    assert!(InfeedQueue::new("train", train(&m).batch(32, false).unwrap(), 3).is_ok());
}

#[test]
fn prefetch_depths_0_and_256_are_typed_errors() {
    let m = mnist();
    let d = train(&m).batch(32, true).unwrap();
    for depth in [0, 256] {
        let e = InfeedQueue::new("feed", d.clone(), depth).unwrap_err();
        assert!(
            matches!(e, InfeedError::BadPrefetchDepth { depth: got, .. } if got == depth),
            "{e:?}"
        );
    }
    for depth in [1, 255] {
        assert_eq!(
            InfeedQueue::new("feed", d.clone(), depth)
                .unwrap()
                .prefetch_depth(),
            depth
        );
    }
}

#[test]
fn the_background_thread_prefetches_depth_batches_ahead() {
    let m = mnist();
    let depth = 3;
    let d = train(&m).batch(32, true).unwrap();
    let mut q = InfeedQueue::new("train", d, depth).unwrap();

    // Without consuming anything the producer fills the queue's `depth` slots and makes one more
    // batch, which it holds while it blocks waiting for room. Wait for that state; the bounded
    // channel then keeps the count exactly there (no sleep needed to show it stops): a further
    // batch needs a slot, and only a consumer frees one.
    let ahead = depth as u64 + 1;
    let filled = wait_until(Duration::from_secs(20), || {
        q.stats().batches_produced >= ahead
    });
    assert!(
        filled,
        "the producer did not fill the queue: {:?}",
        q.stats()
    );
    let s = q.stats();
    assert_eq!(
        s.batches_produced, ahead,
        "the producer ran past the queue: {s:?}"
    );
    assert_eq!(s.bytes_produced, ahead * BATCH_BYTES as u64);
    assert_eq!(s.batches_consumed, 0);
    assert!(s.produce_time > Duration::ZERO);

    // Consuming a batch makes room for exactly one more.
    for consumed in 1..=2u64 {
        q.next_batch().unwrap().unwrap();
        assert!(wait_until(Duration::from_secs(20), || {
            q.stats().batches_produced >= ahead + consumed
        }));
        assert_eq!(q.stats().batches_produced, ahead + consumed);
    }
    // The batches were ready, so the consumer hardly waited.
    assert!(q.stats().wait_time < Duration::from_secs(1));
}

#[test]
fn dropping_the_queue_stops_the_thread() {
    let m = mnist();
    // A sentinel owned by the pipeline: it is released only when the producer thread has ended
    // and dropped its copy of the dataset.
    let sentinel = Arc::new(());
    let held = Arc::clone(&sentinel);
    let d = train(&m)
        .map("labels", move |x| {
            let _ = &held;
            x
        })
        .unwrap()
        .batch(32, true)
        .unwrap()
        .repeat(None)
        .unwrap();
    assert_eq!(d.epoch_len(), None);
    let mut q = InfeedQueue::new("forever", d, 2).unwrap();
    for _ in 0..10 {
        q.next_batch().unwrap().unwrap();
    }
    // 10 consumed, 2 in the queue and 1 held by the blocked producer; the bound keeps it there.
    assert!(wait_until(Duration::from_secs(20), || {
        q.stats().batches_produced >= 13
    }));
    assert_eq!(q.stats().batches_produced, 13);
    assert!(Arc::strong_count(&sentinel) > 1);

    // The producer is blocked on a full queue; dropping must wake and join it.
    let (done, dropped) = mpsc::channel();
    thread::spawn(move || {
        drop(q);
        done.send(()).unwrap();
    });
    dropped
        .recv_timeout(Duration::from_secs(20))
        .expect("dropping the queue did not stop its thread");
    assert_eq!(Arc::strong_count(&sentinel), 1);

    // Dropping a queue that has not started delivering, or has finished, is fine too.
    drop(InfeedQueue::new("unused", train(&m).batch(32, true).unwrap(), 3).unwrap());
    let mut tiny = InfeedQueue::new("tiny", train(&m).batch(4000, true).unwrap(), 1).unwrap();
    while tiny.next_batch().unwrap().is_some() {}
    drop(tiny);
}

#[test]
fn f16_cast_values_are_exactly_representable() {
    let spec = DatasetSpec::new(vec![
        FieldSpec::new("x", &[16]),
        FieldSpec::class_label("y", 10),
    ]);
    let raw = Dataset::synthetic(spec, 256, 3)
        .unwrap()
        .map("x", |v| v * 3.7 - 1.1)
        .unwrap();
    let half = raw
        .clone()
        .cast("x", DType::F16)
        .unwrap()
        .map("x", |v| v * 0.3 + 0.01)
        .unwrap()
        .batch(32, true)
        .unwrap();
    assert_eq!(half.spec().field("x").unwrap().dtype, DType::F16);
    let mut q = InfeedQueue::new("half", half, 2).unwrap();
    let mut rounded = 0;
    let mut compared = 0;
    let reference: Vec<Batch> = raw.batch(32, true).unwrap().iter().collect();
    while let Some(b) = q.next_batch().unwrap() {
        assert_eq!(b.dtype("x"), Some(DType::F16));
        assert_eq!(b.dtype("y"), Some(DType::F32));
        assert_eq!(b.bytes(), 32 * 16 * 2 + 32 * 4);
        let r = &reference[compared];
        for (&v, &f) in b.field("x").unwrap().1.iter().zip(r.field("x").unwrap().1) {
            assert_eq!(f16_to_f32(f32_to_f16(v)).to_bits(), v.to_bits(), "{v}");
            let once = f16_to_f32(f32_to_f16(f));
            let expected = f16_to_f32(f32_to_f16(once * 0.3 + 0.01));
            assert_eq!(v.to_bits(), expected.to_bits());
            if (f * 0.3 + 0.01) != v {
                rounded += 1;
            }
        }
        // Labels are untouched.
        assert_eq!(b.field("y").unwrap().1, r.field("y").unwrap().1);
        compared += 1;
    }
    assert_eq!(compared, 8);
    assert!(rounded > 1000, "the cast rounded only {rounded} values");

    // MNIST in f16: binarized pixels survive exactly.
    let m = mnist();
    let d = train(&m).cast("images", DType::F16).unwrap();
    let b = d.batch(32, true).unwrap().iter().next().unwrap();
    assert_eq!(b.bytes(), 32 * 784 * 2 + 32 * 4);
    assert!(b
        .field("images")
        .unwrap()
        .1
        .iter()
        .all(|&p| p == 0.0 || p == 1.0));
    assert!(matches!(
        train(&m).cast("images", DType::I32).unwrap_err(),
        DatasetError::UnsupportedDType { .. }
    ));
}

#[test]
fn feeding_batches_into_the_mnist_plan() {
    let m = mnist();
    for dtype in [DType::F32, DType::F16] {
        let mut g: Graph<Fixed<128>> = Graph::new();
        let model = mnist_mlp(&mut g, 32, dtype).unwrap();
        let labels = g.input("labels", &[32], DType::I32).unwrap();
        let loss = g
            .sparse_categorical_crossentropy("loss", model.probabilities, labels, false)
            .unwrap();
        g.differentiate(loss, Optimizer::sgd(0.05)).unwrap();
        let plan = Plan::new(&g).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, 1).unwrap();

        let mut d = train(&m).shuffle(1).unwrap();
        if dtype == DType::F16 {
            d = d.cast("images", DType::F16).unwrap();
        }
        let mut q = InfeedQueue::new("train", d.batch(32, true).unwrap(), 3).unwrap();
        for _ in 0..5 {
            let batch = q.next_batch().unwrap().unwrap();
            feed(&plan, &mut arena, &batch).unwrap();
            let images = plan.tensor(model.images, &arena, &state).unwrap();
            assert!(images
                .iter()
                .zip(batch.field("images").unwrap().1)
                .all(|(a, &b)| a.to_bits() == b.to_bits()));
            let fed: Vec<f32> = plan
                .tensor(labels, &arena, &state)
                .unwrap()
                .iter()
                .collect();
            assert_eq!(fed, batch.field("labels").unwrap().1);
            plan.train_step(&mut arena, &mut state).unwrap();
            assert!(plan
                .tensor(loss, &arena, &state)
                .unwrap()
                .get(0)
                .is_finite());
        }

        // A field the plan has no input for.
        let mut wrong = q.next_batch().unwrap().unwrap();
        wrong.fields[0].0 = "image".to_owned();
        let e = feed(&plan, &mut arena, &wrong).unwrap_err();
        assert!(
            matches!(&e, InfeedError::Feed { field, source } if field == "image"
                && matches!(**source, RunError::UnknownTensor { .. })),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "cannot feed field `image`: no tensor is named `image`"
        );
        assert!(std::error::Error::source(&e).is_some());

        // A field named after a tensor that is not an input.
        wrong.fields[0].0 = "Flatten".to_owned();
        let e = feed(&plan, &mut arena, &wrong).unwrap_err();
        assert!(
            matches!(&e, InfeedError::Feed { field, source } if field == "Flatten"
            && matches!(**source, RunError::WrongKind { .. }))
        );
    }

    // A batch of the wrong size.
    let mut g: Graph<Fixed<128>> = Graph::new();
    mnist_mlp(&mut g, 32, DType::F32).unwrap();
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let batch = train(&m).batch(16, true).unwrap().iter().next().unwrap();
    let e = feed(&plan, &mut arena, &batch).unwrap_err();
    assert!(
        matches!(&e, InfeedError::Feed { field, source } if field == "images"
        && **source == RunError::WrongLength {
            tensor: "images".try_into().unwrap(),
            expected: 32 * 784,
            supplied: 16 * 784,
        }),
        "{e:?}"
    );
}

#[test]
fn dataset_benchmark_reports_graphcores_five_keys_per_epoch() {
    let m = mnist();
    let d = train(&m).shuffle(3).unwrap().batch(32, true).unwrap();
    let report = dataset_benchmark(&d, 2).unwrap();
    assert_eq!(report.epochs.len(), 2);
    for e in &report.epochs {
        assert_eq!(e.elements_processed, 250);
        assert_eq!(e.total_bytes_processed, 250 * BATCH_BYTES as u64);
        assert!(e.time_elapsed > 0.0);
        let eps = e.elements_processed as f64 / e.time_elapsed;
        assert!((e.elements_per_second - eps).abs() <= 1e-9 * eps);
        let bw = e.total_bytes_processed as f64 / e.time_elapsed;
        assert!((e.bandwidth - bw).abs() <= 1e-9 * bw);
    }

    let json = report.to_json();
    assert!(json.starts_with(
        "{\"epochs\":[{\"elements_processed\":250,\"total_bytes_processed\":25120000,\"time_elapsed\":"
    ));
    assert!(json.ends_with("}]}"));
    for key in [
        "elements_processed",
        "total_bytes_processed",
        "time_elapsed",
        "elements_per_second",
        "bandwidth",
    ] {
        assert_eq!(
            json.matches(&format!("\"{key}\":")).count(),
            2,
            "{key}: {json}"
        );
    }
    assert!(!json.contains("null") && !json.contains(' '), "{json}");

    // An infeed's counters give the same shape of report.
    let mut q = InfeedQueue::new("bench", d, 3).unwrap();
    let start = Instant::now();
    while q.next_batch().unwrap().is_some() {}
    let epoch = q.stats().epoch_stats(start.elapsed());
    assert_eq!(epoch.elements_processed, 250);
    assert_eq!(epoch.total_bytes_processed, 250 * BATCH_BYTES as u64);
}
