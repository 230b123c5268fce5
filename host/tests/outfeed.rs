//! Outfeed queues end to end: the shapes the host gets back in ALL and LAST mode, with and
//! without replicas and maps; a device thread and a host thread sharing one queue; stalls and
//! `Full`; typed errors; and a property test that no interleaving loses or reorders an element.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use tessera_host::outfeed::{
    Dequeued, Element, HostTensor, Layout, OutfeedError, OutfeedMode, OutfeedQueue,
    DEFAULT_BUFFER_DEPTH,
};

/// A tensor of `shape` whose elements are `base, base + 1, ...`.
fn ramp(shape: &[usize], base: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    HostTensor::new(shape.to_vec(), (0..n).map(|i| base + i as f32).collect()).unwrap()
}

fn tensor(shape: &[usize], base: f32) -> Element {
    Element::Tensor(ramp(shape, base))
}

fn grads(base: f32) -> Element {
    let mut m = BTreeMap::new();
    m.insert("Dense_128/bias:0_grad".to_owned(), ramp(&[128], base));
    m.insert("Dense_128/kernel:0_grad".to_owned(), ramp(&[4, 128], base));
    m.insert("loss".to_owned(), ramp(&[], base));
    Element::Map(m)
}

fn shapes(d: &Dequeued) -> BTreeMap<String, Vec<usize>> {
    d.map()
        .unwrap()
        .iter()
        .map(|(k, t)| (k.clone(), t.shape.clone()))
        .collect()
}

fn expect(entries: &[(&str, &[usize])]) -> BTreeMap<String, Vec<usize>> {
    entries
        .iter()
        .map(|(k, s)| ((*k).to_owned(), s.to_vec()))
        .collect()
}

/// Dequeues a queue of tensor elements.
fn drain_all(q: &OutfeedQueue) -> HostTensor {
    q.dequeue().unwrap().into_tensor().unwrap()
}

#[test]
fn all_mode_one_replica_stacks_every_enqueue() {
    // 100 enqueues of a (128,) bias give (100, 128), the way the TensorFlow examples see it.
    let q = OutfeedQueue::new("bias", OutfeedMode::All, 255, 1).unwrap();
    for step in 0..100 {
        let report = q.enqueue(vec![tensor(&[128], step as f32)]).unwrap();
        assert!(!report.stalled);
    }
    let t = drain_all(&q);
    assert_eq!(t.shape, vec![100, 128]);
    for (step, row) in t.data.chunks(128).enumerate() {
        assert_eq!(row, ramp(&[128], step as f32).data);
    }
    assert_eq!(drain_all(&q).shape, vec![0, 128]);
}

#[test]
fn all_mode_two_replicas_adds_the_replica_dimension() {
    let q = OutfeedQueue::new("out", OutfeedMode::All, 20, 2).unwrap();
    for step in 0..20 {
        let s = step as f32 * 100.0;
        q.enqueue(vec![tensor(&[4, 4], s), tensor(&[4, 4], s + 50.0)])
            .unwrap();
    }
    let t = drain_all(&q);
    assert_eq!(t.shape, vec![20, 2, 4, 4]);
    // Element 3, replica 1, position (0, 1).
    assert_eq!(t.data[(3 * 2 + 1) * 16 + 1], 300.0 + 50.0 + 1.0);
}

#[test]
fn all_mode_maps_with_one_and_two_replicas() {
    let q = OutfeedQueue::new("grads", OutfeedMode::All, 10, 1).unwrap();
    for step in 0..10 {
        q.enqueue(vec![grads(step as f32)]).unwrap();
    }
    let d = q.dequeue().unwrap();
    assert_eq!(
        shapes(&d),
        expect(&[
            ("Dense_128/bias:0_grad", &[10, 128]),
            ("Dense_128/kernel:0_grad", &[10, 4, 128]),
            ("loss", &[10]),
        ])
    );
    assert_eq!(
        d.get("loss").unwrap().data,
        (0..10).map(|i| i as f32).collect::<Vec<_>>()
    );

    let q = OutfeedQueue::new("grads", OutfeedMode::All, 40, 2).unwrap();
    for step in 0..40 {
        q.enqueue(vec![grads(step as f32), grads(-(step as f32))])
            .unwrap();
    }
    let d = q.dequeue().unwrap();
    assert_eq!(
        shapes(&d),
        expect(&[
            ("Dense_128/bias:0_grad", &[40, 2, 128]),
            ("Dense_128/kernel:0_grad", &[40, 2, 4, 128]),
            ("loss", &[40, 2]),
        ])
    );
    assert_eq!(&d.get("loss").unwrap().data[..4], &[0.0, 0.0, 1.0, -1.0]);
}

#[test]
fn last_mode_returns_the_newest_element() {
    let q = OutfeedQueue::new("last", OutfeedMode::Last, 1, 1).unwrap();
    for step in 0..20 {
        q.enqueue(vec![tensor(&[4, 4], step as f32)]).unwrap();
    }
    assert_eq!(drain_all(&q), ramp(&[4, 4], 19.0));

    let q = OutfeedQueue::new("last", OutfeedMode::Last, 3, 2).unwrap();
    for step in 0..20 {
        let s = step as f32;
        q.enqueue(vec![tensor(&[4, 4], s), tensor(&[4, 4], -s)])
            .unwrap();
    }
    let t = drain_all(&q);
    assert_eq!(t.shape, vec![2, 4, 4]);
    assert_eq!((t.data[0], t.data[16]), (19.0, -19.0));

    let q = OutfeedQueue::new("last", OutfeedMode::Last, 3, 8).unwrap();
    for step in 0..40 {
        q.enqueue((0..8).map(|r| grads((step * 8 + r) as f32)).collect())
            .unwrap();
    }
    let d = q.dequeue().unwrap();
    assert_eq!(
        shapes(&d),
        expect(&[
            ("Dense_128/bias:0_grad", &[8, 128]),
            ("Dense_128/kernel:0_grad", &[8, 4, 128]),
            ("loss", &[8]),
        ])
    );
    assert_eq!(
        d.get("loss").unwrap().data,
        (312..320).map(|i| i as f32).collect::<Vec<_>>()
    );
    assert_eq!(q.stall_count(), 0);
}

#[test]
fn last_mode_before_any_enqueue_is_a_typed_error() {
    let q = OutfeedQueue::new("probe", OutfeedMode::Last, 3, 1).unwrap();
    let err = q.dequeue().unwrap_err();
    assert_eq!(
        err,
        OutfeedError::NothingEnqueued {
            queue: "probe".into()
        }
    );
    assert!(err.to_string().contains("'probe'"));
}

#[test]
fn all_mode_before_and_after_enqueues_is_empty() {
    let q = OutfeedQueue::with_defaults("acts");
    assert_eq!(q.buffer_depth(), DEFAULT_BUFFER_DEPTH);
    assert_eq!(q.dequeue().unwrap(), Dequeued::Empty);
    q.enqueue(vec![grads(0.0)]).unwrap();
    q.dequeue().unwrap();
    let d = q.dequeue().unwrap();
    assert_eq!(
        shapes(&d),
        expect(&[
            ("Dense_128/bias:0_grad", &[0, 128]),
            ("Dense_128/kernel:0_grad", &[0, 4, 128]),
            ("loss", &[0]),
        ])
    );
}

#[test]
fn consumer_thread_receives_every_element_in_order_while_the_producer_stalls() {
    const N: usize = 1000;
    let q = Arc::new(OutfeedQueue::new("stream", OutfeedMode::All, 3, 1).unwrap());
    let producer = {
        let q = Arc::clone(&q);
        thread::spawn(move || {
            let mut stalls = 0;
            for i in 0..N {
                let v = i as f32;
                let report = q
                    .enqueue(vec![Element::Tensor(
                        HostTensor::new(vec![2], vec![v, -v]).unwrap(),
                    )])
                    .unwrap();
                stalls += usize::from(report.stalled);
            }
            stalls
        })
    };
    // Let the device fill the queue and block once before draining starts, so at least one
    // stall is certain; after that, drain as fast as elements arrive.
    let start = Instant::now();
    while q.waiting_enqueues() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the device never stalled"
        );
        thread::sleep(Duration::from_millis(1));
    }
    let consumer = {
        let q = Arc::clone(&q);
        thread::spawn(move || {
            let mut received: Vec<f32> = Vec::with_capacity(2 * N);
            let mut max_batch = 0;
            while received.len() < 2 * N {
                let _ = q.wait_for_elements(Duration::from_millis(100));
                let t = q.dequeue().unwrap().into_tensor().unwrap();
                assert_eq!(t.shape[1..], [2]);
                max_batch = max_batch.max(t.shape[0]);
                received.extend(t.data);
            }
            (received, max_batch)
        })
    };
    let stalls = producer.join().unwrap();
    let (received, max_batch) = consumer.join().unwrap();
    assert_eq!(received.len(), 2 * N);
    for (i, pair) in received.chunks(2).enumerate() {
        assert_eq!(pair, [i as f32, -(i as f32)]);
    }
    assert!(max_batch <= 3, "never more than the buffer depth undrained");
    assert!(stalls >= 1);
    assert_eq!(q.stalled_enqueues(), stalls as u64);
    assert_eq!(q.stall_count(), stalls as u64);
    assert!(q.stall_time() > Duration::ZERO);
    assert_eq!((q.enqueued(), q.dequeued()), (N as u64, N as u64));
    assert_eq!(q.pending(), 0);
}

#[test]
fn try_enqueue_returns_full_at_the_buffer_depth() {
    let q = OutfeedQueue::new("q", OutfeedMode::All, 3, 1).unwrap();
    for i in 0..3 {
        let r = q.try_enqueue(vec![tensor(&[2], i as f32)]).unwrap();
        assert_eq!(r.pending, i + 1);
        assert!(!r.stalled);
    }
    let err = q.try_enqueue(vec![tensor(&[2], 3.0)]).unwrap_err();
    assert!(matches!(
        &err,
        OutfeedError::Full { queue, depth: 3, .. } if queue == "q"
    ));
    assert_eq!(q.stall_count(), 1);
    assert_eq!(q.pending(), 3);
    let back = err.into_rejected().unwrap();
    assert_eq!(drain_all(&q).shape, vec![3, 2]);
    q.try_enqueue(back).unwrap();
    assert_eq!(drain_all(&q), ramp(&[1, 2], 3.0));
}

#[test]
fn invalid_buffer_depths_and_replica_counts_are_typed_errors() {
    for depth in [0, 256] {
        for mode in [OutfeedMode::All, OutfeedMode::Last] {
            let err = OutfeedQueue::new("feed", mode, depth, 1).unwrap_err();
            assert_eq!(
                err,
                OutfeedError::InvalidBufferDepth {
                    queue: "feed".into(),
                    depth
                }
            );
            assert_eq!(
                err.to_string(),
                format!("outfeed 'feed': buffer depth {depth} is outside 1..=255")
            );
        }
    }
    assert!(matches!(
        OutfeedQueue::new("feed", OutfeedMode::All, 3, 0),
        Err(OutfeedError::NoReplicas { .. })
    ));
}

#[test]
fn mismatched_replica_elements_are_typed_errors_naming_the_key() {
    let q = OutfeedQueue::new("grads", OutfeedMode::All, 3, 2).unwrap();
    let mut other = BTreeMap::new();
    other.insert("Dense_128/bias:0_grad".to_owned(), ramp(&[64], 0.0));
    other.insert("Dense_128/kernel:0_grad".to_owned(), ramp(&[4, 128], 0.0));
    other.insert("loss".to_owned(), ramp(&[], 0.0));
    let err = q
        .enqueue(vec![grads(0.0), Element::Map(other)])
        .unwrap_err();
    assert_eq!(
        err,
        OutfeedError::ReplicaMismatch {
            queue: "grads".into(),
            replica: 1,
            key: Some("Dense_128/bias:0_grad".into()),
            expected: Layout::Tensor(vec![128]),
            found: Layout::Tensor(vec![64]),
        }
    );
    assert_eq!(
        err.to_string(),
        "outfeed 'grads': replica 1 key 'Dense_128/bias:0_grad' has shape (64,), but replica 0 \
         has shape (128,)"
    );
    let err = q
        .enqueue(vec![tensor(&[3], 0.0), tensor(&[1, 3], 0.0)])
        .unwrap_err();
    assert!(matches!(
        err,
        OutfeedError::ReplicaMismatch {
            replica: 1,
            key: None,
            ..
        }
    ));
    assert!(matches!(
        q.enqueue(vec![tensor(&[3], 0.0)]),
        Err(OutfeedError::WrongReplicaCount {
            expected: 2,
            found: 1,
            ..
        })
    ));
    assert_eq!(q.enqueued(), 0);
    assert_eq!(q.dequeue().unwrap(), Dequeued::Empty);
}

#[derive(Clone, Debug)]
enum Op {
    /// The device tries to enqueue its next element.
    Enqueue,
    /// The host drains.
    Dequeue,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![3 => Just(Op::Enqueue), 1 => Just(Op::Dequeue)]
}

proptest! {
    /// Whatever the interleaving, the host receives exactly the elements the device produced,
    /// in order; `try_enqueue` is `Full` exactly when `depth` elements are undrained.
    #[test]
    fn no_interleaving_loses_or_reorders(
        depth in 1usize..=5,
        replicas in 1usize..=3,
        use_map in any::<bool>(),
        ops in proptest::collection::vec(op(), 0..200),
    ) {
        let q = OutfeedQueue::new("prop", OutfeedMode::All, depth, replicas).unwrap();
        let element = |i: usize, r: usize| {
            let v = (i * replicas + r) as f32;
            let t = HostTensor::new(vec![2], vec![v, -v]).unwrap();
            if use_map {
                let mut m = BTreeMap::new();
                m.insert("a".to_owned(), t);
                m.insert("b".to_owned(), HostTensor::scalar(v));
                Element::Map(m)
            } else {
                Element::Tensor(t)
            }
        };
        let mut held: Option<Vec<Element>> = None;
        let mut produced = 0usize;
        let mut undrained = 0usize;
        let mut fulls = 0u64;
        let mut received: Vec<f32> = Vec::new();
        let take = |d: Dequeued| -> (usize, Vec<f32>) {
            let t = if use_map { d.get("a").unwrap().clone() } else { d.into_tensor().unwrap() };
            (t.shape[0], t.data)
        };
        for op in ops {
            match op {
                Op::Enqueue => {
                    let next = held.take().unwrap_or_else(|| {
                        produced += 1;
                        (0..replicas).map(|r| element(produced - 1, r)).collect()
                    });
                    match q.try_enqueue(next) {
                        Ok(report) => {
                            prop_assert!(undrained < depth);
                            undrained += 1;
                            prop_assert_eq!(report.pending, undrained);
                        }
                        Err(err) => {
                            prop_assert_eq!(undrained, depth);
                            fulls += 1;
                            held = Some(err.into_rejected().unwrap());
                        }
                    }
                }
                Op::Dequeue => {
                    let d = q.dequeue().unwrap();
                    if produced == 0 && held.is_none() {
                        prop_assert_eq!(d, Dequeued::Empty);
                        continue;
                    }
                    let (n, data) = take(d);
                    prop_assert_eq!(n, undrained);
                    undrained = 0;
                    received.extend(data);
                }
            }
        }
        if let Some(next) = held.take() {
            if undrained == depth {
                let (_, data) = take(q.dequeue().unwrap());
                received.extend(data);
            }
            q.try_enqueue(next).unwrap();
        }
        if produced > 0 {
            let (_, data) = take(q.dequeue().unwrap());
            received.extend(data);
        }
        let expected: Vec<f32> = (0..produced * replicas)
            .flat_map(|v| [v as f32, -(v as f32)])
            .collect();
        prop_assert_eq!(received, expected);
        prop_assert_eq!(q.full_rejections(), fulls);
        prop_assert_eq!(q.stall_count(), fulls);
        prop_assert_eq!(q.pending(), 0);
    }
}
