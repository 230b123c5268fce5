//! Infeed queues: a background thread runs a [`Dataset`] pipeline and keeps up to
//! `prefetch_depth` batches ready for the device, as the TensorFlow IPU infeed does.
//!
//! ```no_run
//! # use tessera_host::dataset::Dataset;
//! # use tessera_host::infeed::{feed, InfeedQueue, DEFAULT_PREFETCH_DEPTH};
//! # fn run<S: tessera_core::Storage>(d: Dataset, plan: &tessera_core::Plan<S>, arena: &mut [u8], state: &mut [u8])
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let mut queue = InfeedQueue::new("train", d, DEFAULT_PREFETCH_DEPTH)?;
//! while let Some(batch) = queue.next_batch()? {
//!     feed(plan, arena, &batch)?;
//!     plan.train_step(arena, state)?;
//! }
//! println!("waited {:?} for data", queue.stats().wait_time);
//! # Ok(()) }
//! ```
//!
//! [`dataset_benchmark`] measures how fast a pipeline produces elements, in the shape of the
//! JSON that Graphcore's `dataset_benchmark` prints.

use std::any::Any;
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_core::{Plan, RunError, Storage};

use crate::dataset::{Batch, Dataset, DatasetSpec};

/// The prefetch depth TensorFlow's IPU infeed uses when none is given.
pub const DEFAULT_PREFETCH_DEPTH: usize = 3;

/// The largest prefetch depth an infeed accepts.
pub const MAX_PREFETCH_DEPTH: usize = 255;

/// An infeed queue could not be made or read, or a batch could not be fed. Each variant names
/// the queue or the field at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InfeedError {
    /// A prefetch depth outside `1..=MAX_PREFETCH_DEPTH`.
    #[error(
        "infeed `{queue}`: prefetch depth {depth} is outside 1..={max}",
        max = MAX_PREFETCH_DEPTH
    )]
    BadPrefetchDepth {
        /// The queue.
        queue: String,
        /// The depth asked for.
        depth: usize,
    },
    /// The dataset's elements do not all have the same shape (a `batch(n, false)` leaves a
    /// short last batch); an infeed needs fixed shapes.
    #[error(
        "infeed `{queue}`: field `{field}` has no fixed shape (a last short batch); batch with \
         drop_remainder = true"
    )]
    ShapeNotFixed {
        /// The queue.
        queue: String,
        /// The field whose shape varies (the first field: all share the batch dimension).
        field: String,
    },
    /// The producer thread could not be started.
    #[error("infeed `{queue}`: cannot start the producer thread: {source}")]
    Spawn {
        /// The queue.
        queue: String,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// The producer thread panicked (a `map` function panicked, for example).
    #[error("infeed `{queue}`: the dataset pipeline panicked: {message}")]
    ProducerPanicked {
        /// The queue.
        queue: String,
        /// The panic message.
        message: String,
    },
    /// A batch field could not be written to the plan input of the same name: the plan has no
    /// such input, or its length differs.
    #[error("cannot feed field `{field}`: {source}")]
    Feed {
        /// The batch field.
        field: String,
        /// What the plan reported (boxed: core's errors carry their names inline). The box is
        /// what [`source`](std::error::Error::source) returns.
        #[source]
        source: Box<RunError>,
    },
    /// [`dataset_benchmark`] was given a dataset that repeats forever.
    #[error("dataset_benchmark: the dataset repeats forever; use dataset_benchmark_elements")]
    InfiniteDataset,
}

/// Counters of an infeed queue, from [`InfeedQueue::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InfeedStats {
    /// Batches the producer has made. At most `prefetch_depth` of them wait in the queue, plus
    /// one the producer holds while it waits for room.
    pub batches_produced: u64,
    /// Bytes of those batches (each field in its element type).
    pub bytes_produced: u64,
    /// Time the producer spent running the pipeline (not waiting for room).
    pub produce_time: Duration,
    /// Batches [`InfeedQueue::next_batch`] has returned.
    pub batches_consumed: u64,
    /// Bytes of those batches.
    pub bytes_consumed: u64,
    /// Time [`InfeedQueue::next_batch`] spent waiting for data: how long the consumer was
    /// starved by the pipeline.
    pub wait_time: Duration,
}

impl InfeedStats {
    /// The consumed batches as one benchmark epoch that took `elapsed`.
    #[must_use]
    pub fn epoch_stats(&self, elapsed: Duration) -> EpochStats {
        EpochStats::new(self.batches_consumed, self.bytes_consumed, elapsed)
    }
}

/// State shared with the producer thread.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    produced: AtomicU64,
    bytes: AtomicU64,
    produce_nanos: AtomicU64,
}

/// Whether the queue can still deliver batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Finished,
}

/// A queue of batches made by a background thread from a [`Dataset`].
///
/// The thread runs the pipeline (epoch 0; use [`Dataset::repeat`] for more) and sends batches
/// through a bounded channel of `prefetch_depth` slots, so it works at most that far ahead.
/// Dropping the queue stops the thread and joins it.
pub struct InfeedQueue {
    name: String,
    prefetch_depth: usize,
    spec: DatasetSpec,
    epoch_len: Option<usize>,
    receiver: Option<Receiver<Batch>>,
    worker: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
    consumed: u64,
    bytes_consumed: u64,
    wait: Duration,
    state: State,
}

impl fmt::Debug for InfeedQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InfeedQueue")
            .field("name", &self.name)
            .field("prefetch_depth", &self.prefetch_depth)
            .field("spec", &self.spec)
            .field("state", &self.state)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The message of a panic payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// Nanoseconds of `d`, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl InfeedQueue {
    /// Starts a queue named `name` over `dataset`, keeping up to `prefetch_depth` batches ready
    /// ([`DEFAULT_PREFETCH_DEPTH`] is TensorFlow's default).
    ///
    /// # Errors
    ///
    /// [`InfeedError::BadPrefetchDepth`] for a depth outside `1..=255`,
    /// [`InfeedError::ShapeNotFixed`] if the dataset may yield a short batch, and
    /// [`InfeedError::Spawn`] if the thread cannot be started.
    pub fn new(name: &str, dataset: Dataset, prefetch_depth: usize) -> Result<Self, InfeedError> {
        if !(1..=MAX_PREFETCH_DEPTH).contains(&prefetch_depth) {
            return Err(InfeedError::BadPrefetchDepth {
                queue: name.to_owned(),
                depth: prefetch_depth,
            });
        }
        let spec = dataset.spec().clone();
        if !dataset.has_fixed_shape() {
            return Err(InfeedError::ShapeNotFixed {
                queue: name.to_owned(),
                field: spec
                    .fields
                    .first()
                    .map_or_else(String::new, |f| f.name.clone()),
            });
        }
        let epoch_len = dataset.epoch_len();
        let shared = Arc::new(Shared::default());
        let (sender, receiver) = sync_channel::<Batch>(prefetch_depth);
        let thread_shared = Arc::clone(&shared);
        let producer = move || {
            let mut batches = dataset.iter();
            while !thread_shared.stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let Some(batch) = batches.next() else { return };
                thread_shared
                    .produce_nanos
                    .fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
                thread_shared
                    .bytes
                    .fetch_add(batch.bytes() as u64, Ordering::Relaxed);
                thread_shared.produced.fetch_add(1, Ordering::Release);
                // Blocks while the queue is full; fails once the queue is dropped.
                if sender.send(batch).is_err() {
                    return;
                }
            }
        };
        // Thread names may not hold NUL bytes.
        let thread_name = format!("infeed {}", name.replace('\0', " "));
        let worker = thread::Builder::new()
            .name(thread_name)
            .spawn(producer)
            .map_err(|source| InfeedError::Spawn {
                queue: name.to_owned(),
                source,
            })?;
        Ok(InfeedQueue {
            name: name.to_owned(),
            prefetch_depth,
            spec,
            epoch_len,
            receiver: Some(receiver),
            worker: Some(worker),
            shared,
            consumed: 0,
            bytes_consumed: 0,
            wait: Duration::ZERO,
            state: State::Running,
        })
    }

    /// The next batch, waiting for the producer if none is ready; `Ok(None)` once a finite
    /// dataset is exhausted (and on every call after that).
    ///
    /// # Errors
    ///
    /// [`InfeedError::ProducerPanicked`] if the pipeline panicked; the queue is finished after
    /// reporting it.
    pub fn next_batch(&mut self) -> Result<Option<Batch>, InfeedError> {
        if self.state == State::Finished {
            return Ok(None);
        }
        let Some(receiver) = &self.receiver else {
            return Ok(None);
        };
        let start = Instant::now();
        let received = receiver.recv();
        self.wait += start.elapsed();
        if let Ok(batch) = received {
            self.consumed += 1;
            self.bytes_consumed += batch.bytes() as u64;
            return Ok(Some(batch));
        }
        // The producer has hung up: it either finished the dataset or panicked.
        self.state = State::Finished;
        if let Some(Err(payload)) = self.worker.take().map(JoinHandle::join) {
            return Err(InfeedError::ProducerPanicked {
                queue: self.name.clone(),
                message: panic_message(payload.as_ref()),
            });
        }
        Ok(None)
    }

    /// The queue's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many batches the producer may keep ready.
    #[must_use]
    pub fn prefetch_depth(&self) -> usize {
        self.prefetch_depth
    }

    /// The fields of every batch (shapes include the batch dimension).
    #[must_use]
    pub fn spec(&self) -> &DatasetSpec {
        &self.spec
    }

    /// Batches the queue yields in all, or `None` if the dataset repeats forever.
    #[must_use]
    pub fn epoch_len(&self) -> Option<usize> {
        self.epoch_len
    }

    /// The queue's counters so far.
    #[must_use]
    pub fn stats(&self) -> InfeedStats {
        InfeedStats {
            batches_produced: self.shared.produced.load(Ordering::Acquire),
            bytes_produced: self.shared.bytes.load(Ordering::Relaxed),
            produce_time: Duration::from_nanos(self.shared.produce_nanos.load(Ordering::Relaxed)),
            batches_consumed: self.consumed,
            bytes_consumed: self.bytes_consumed,
            wait_time: self.wait,
        }
    }
}

impl Iterator for InfeedQueue {
    type Item = Result<Batch, InfeedError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().transpose()
    }
}

impl Drop for InfeedQueue {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Dropping the receiver wakes a producer blocked on a full queue: its send fails.
        drop(self.receiver.take());
        if let Some(worker) = self.worker.take() {
            // A panic in the producer has nowhere to go from here.
            let _ = worker.join();
        }
    }
}

/// Writes every field of `batch` to the plan input of the same name, converting to the
/// input's element type.
///
/// # Errors
///
/// [`InfeedError::Feed`] naming the field, wrapping the plan's [`RunError`]: the plan has no
/// tensor of that name (`UnknownTensor`), it is not an input (`WrongKind`), its length differs
/// (`WrongLength`), or the arena is too small.
pub fn feed<S: Storage>(
    plan: &Plan<S>,
    arena: &mut [u8],
    batch: &Batch,
) -> Result<(), InfeedError> {
    for (name, _, values) in &batch.fields {
        plan.fill_input(name.as_str(), arena, values.len(), |i| values[i])
            .map_err(|source| InfeedError::Feed {
                field: name.clone(),
                source: Box::new(source),
            })?;
    }
    Ok(())
}

/// One epoch of a [`dataset_benchmark`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochStats {
    /// Elements (batches, once batched) the pipeline yielded.
    pub elements_processed: u64,
    /// Bytes of those elements, each field in its element type.
    pub total_bytes_processed: u64,
    /// Wall-clock seconds the epoch took.
    pub time_elapsed: f64,
    /// `elements_processed / time_elapsed` (0 if no time elapsed).
    pub elements_per_second: f64,
    /// `total_bytes_processed / time_elapsed`, in bytes per second (0 if no time elapsed).
    pub bandwidth: f64,
}

impl EpochStats {
    /// The stats of `elements` elements holding `bytes` bytes made in `elapsed`.
    #[must_use]
    pub fn new(elements: u64, bytes: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        let rate = |x: u64| {
            if seconds > 0.0 {
                x as f64 / seconds
            } else {
                0.0
            }
        };
        EpochStats {
            elements_processed: elements,
            total_bytes_processed: bytes,
            time_elapsed: seconds,
            elements_per_second: rate(elements),
            bandwidth: rate(bytes),
        }
    }
}

/// What [`dataset_benchmark`] measured, one entry per epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct BenchmarkReport {
    /// The epochs, in order.
    pub epochs: Vec<EpochStats>,
}

impl BenchmarkReport {
    /// The report as compact JSON (serde_json), with the keys of Graphcore's
    /// `dataset_benchmark`: `{"epochs":[{"elements_processed":..,"total_bytes_processed":..,
    /// "time_elapsed":..,"elements_per_second":..,"bandwidth":..}]}`. A non-finite number is
    /// written as `null`.
    #[must_use]
    pub fn to_json(&self) -> String {
        // Only integers, floats and a list: serializing cannot fail.
        serde_json::to_string(self).expect("a benchmark report always serializes")
    }
}

/// Runs `epochs` epochs of `dataset` on the calling thread (epoch `e` is
/// [`Dataset::iter_epoch`]`(e)`, so shuffles differ between epochs) and measures each: how many
/// elements it yields, their bytes, and how long that takes. This measures the host pipeline
/// alone, with no device, like Graphcore's `dataset_benchmark`.
///
/// # Errors
///
/// [`InfeedError::InfiniteDataset`] if the dataset repeats forever; use
/// [`dataset_benchmark_elements`] for such a dataset.
pub fn dataset_benchmark(dataset: &Dataset, epochs: usize) -> Result<BenchmarkReport, InfeedError> {
    let per_epoch = dataset.epoch_len().ok_or(InfeedError::InfiniteDataset)?;
    Ok(dataset_benchmark_elements(dataset, epochs, per_epoch))
}

/// [`dataset_benchmark`] with at most `elements_per_epoch` elements in each epoch (fewer if
/// the dataset ends first); works for infinite datasets.
#[must_use]
pub fn dataset_benchmark_elements(
    dataset: &Dataset,
    epochs: usize,
    elements_per_epoch: usize,
) -> BenchmarkReport {
    let epochs = (0..epochs as u64)
        .map(|epoch| {
            let start = Instant::now();
            let (mut elements, mut bytes) = (0u64, 0u64);
            for batch in dataset.iter_epoch(epoch).take(elements_per_epoch) {
                elements += 1;
                bytes += batch.bytes() as u64;
                std::hint::black_box(&batch);
            }
            EpochStats::new(elements, bytes, start.elapsed())
        })
        .collect();
    BenchmarkReport { epochs }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{DatasetSpec, FieldSpec};

    fn small(n: usize, batch: usize) -> Dataset {
        let spec = DatasetSpec::new(vec![
            FieldSpec::new("x", &[3]),
            FieldSpec::class_label("y", 5),
        ]);
        Dataset::synthetic(spec, n, 1)
            .unwrap()
            .batch(batch, true)
            .unwrap()
    }

    #[test]
    fn is_send() {
        fn check<T: Send>() {}
        check::<InfeedQueue>();
        fn serialize<T: Serialize>() {}
        serialize::<BenchmarkReport>();
    }

    #[test]
    fn prefetch_depth_is_checked() {
        for depth in [0, MAX_PREFETCH_DEPTH + 1] {
            let e = InfeedQueue::new("q", small(8, 2), depth).unwrap_err();
            assert!(
                matches!(e, InfeedError::BadPrefetchDepth { ref queue, depth: d } if queue == "q" && d == depth),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!("infeed `q`: prefetch depth {depth} is outside 1..=255")
            );
        }
        for depth in [1, DEFAULT_PREFETCH_DEPTH, MAX_PREFETCH_DEPTH] {
            InfeedQueue::new("q", small(8, 2), depth).unwrap();
        }
    }

    #[test]
    fn short_batches_are_rejected() {
        let d = small(9, 1).batch(2, false).unwrap();
        let e = InfeedQueue::new("train", d, 2).unwrap_err();
        assert!(
            matches!(e, InfeedError::ShapeNotFixed { ref queue, ref field } if queue == "train" && field == "x")
        );
    }

    #[test]
    fn delivers_the_dataset_in_order_then_none() {
        let d = small(10, 2);
        let expected: Vec<Batch> = d.iter().collect();
        let mut q = InfeedQueue::new("q", d, 2).unwrap();
        assert_eq!(q.epoch_len(), Some(5));
        let mut got = Vec::new();
        while let Some(b) = q.next_batch().unwrap() {
            got.push(b);
        }
        assert_eq!(got, expected);
        assert!(q.next_batch().unwrap().is_none());
        assert!(q.next_batch().unwrap().is_none());
        let s = q.stats();
        assert_eq!((s.batches_produced, s.batches_consumed), (5, 5));
        let bytes = 5 * (2 * 3 * 4 + 2 * 4);
        assert_eq!((s.bytes_produced, s.bytes_consumed), (bytes, bytes));
    }

    #[test]
    fn a_panicking_pipeline_is_an_error() {
        let d = small(10, 1)
            .map("y", |y| if y >= 0.0 { panic!("bad label {y}") } else { y })
            .unwrap();
        let mut q = InfeedQueue::new("q", d, 1).unwrap();
        let e = q.next_batch().unwrap_err();
        assert!(
            matches!(e, InfeedError::ProducerPanicked { ref message, .. } if message.starts_with("bad label")),
            "{e:?}"
        );
        assert!(q.next_batch().unwrap().is_none());
        let mut it = InfeedQueue::new("q", small(4, 2), 1).unwrap();
        assert_eq!(it.by_ref().filter_map(Result::ok).count(), 2);
        assert!(it.next().is_none());
    }

    #[test]
    fn benchmark_json_has_the_graphcore_keys() {
        let report = BenchmarkReport {
            epochs: vec![
                EpochStats::new(10, 400, Duration::from_millis(500)),
                EpochStats::new(0, 0, Duration::ZERO),
            ],
        };
        assert_eq!(report.epochs[0].elements_per_second, 20.0);
        assert_eq!(report.epochs[0].bandwidth, 800.0);
        assert_eq!(
            report.to_json(),
            "{\"epochs\":[{\"elements_processed\":10,\"total_bytes_processed\":400,\
             \"time_elapsed\":0.5,\"elements_per_second\":20.0,\"bandwidth\":800.0},\
             {\"elements_processed\":0,\"total_bytes_processed\":0,\"time_elapsed\":0.0,\
             \"elements_per_second\":0.0,\"bandwidth\":0.0}]}"
        );
        let odd = BenchmarkReport {
            epochs: vec![EpochStats {
                elements_processed: 1,
                total_bytes_processed: 2,
                time_elapsed: f64::NAN,
                elements_per_second: f64::INFINITY,
                bandwidth: -0.25,
            }],
        };
        let parsed: serde_json::Value = serde_json::from_str(&odd.to_json()).unwrap();
        let epoch = &parsed["epochs"][0];
        assert!(epoch["time_elapsed"].is_null() && epoch["elements_per_second"].is_null());
        assert_eq!(epoch["bandwidth"], -0.25);
        assert_eq!(epoch["total_bytes_processed"], 2);
        assert!(matches!(
            dataset_benchmark(&small(4, 2).repeat(None).unwrap(), 1),
            Err(InfeedError::InfiniteDataset)
        ));
        let r = dataset_benchmark_elements(&small(4, 2).repeat(None).unwrap(), 2, 7);
        assert_eq!(r.epochs.len(), 2);
        assert!(r.epochs.iter().all(|e| e.elements_processed == 7));
    }
}
