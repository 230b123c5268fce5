//! Tensor inspection, as Graphcore's "inspecting tensors using outfeed queues" example does it:
//! a [`MaybeOutfeedQueue`] that keeps only the keys a filter selects, the gradient outfeed
//! modes of its outfeed optimizer wrapper, and a [`Collector`] that stacks what a host thread
//! drains until an epoch-end callback prints it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::outfeed::{Dequeued, Element, EnqueueReport, HostTensor, OutfeedError, OutfeedQueue};
use crate::stats::{format_keys, format_table, NO_DATA};

/// When the outfeed optimizer wrapper enqueues gradients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GradientOutfeedMode {
    /// The accumulated gradients, once per weight update, just before they are applied (the
    /// seeds' default).
    #[default]
    BeforeApply,
    /// Every micro-batch's gradients as they are computed (before accumulation); the seeds'
    /// `--outfeed-pre-accumulated-gradients`.
    AfterCompute,
}

impl fmt::Display for GradientOutfeedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GradientOutfeedMode::BeforeApply => "BEFORE_APPLY",
            GradientOutfeedMode::AfterCompute => "AFTER_COMPUTE",
        })
    }
}

/// Filters as the seeds' command line gives them: a single `none` (any case) means no filter
/// (keep every key); otherwise the strings themselves. An empty list keeps nothing.
pub fn parse_filters(args: &[String]) -> Option<Vec<String>> {
    if args.len() == 1 && args[0].eq_ignore_ascii_case("none") {
        None
    } else {
        Some(args.to_vec())
    }
}

/// An outfeed queue wrapped so that key-value pairs are added to a map only when a filter
/// string is a substring of the key, and the map is enqueued only when it holds something.
///
/// `filters: None` keeps every key; `Some(vec![])` keeps none.
///
/// ```
/// use std::collections::BTreeMap;
/// use tessera_host::inspect::MaybeOutfeedQueue;
/// use tessera_host::outfeed::{HostTensor, OutfeedQueue};
///
/// let q = MaybeOutfeedQueue::new(OutfeedQueue::with_defaults("grads"), Some(vec!["Dense_128".into()]));
/// let mut map = BTreeMap::new();
/// q.maybe_outfeed(&mut map, "Dense_128/bias:0_grad", || HostTensor::scalar(1.0));
/// q.maybe_outfeed(&mut map, "Dense_10/bias:0_grad", || HostTensor::scalar(2.0));
/// assert_eq!(map.len(), 1);
/// assert!(q.maybe_enqueue(vec![map]).unwrap().is_some());
/// ```
#[derive(Debug, Clone)]
pub struct MaybeOutfeedQueue {
    queue: Arc<OutfeedQueue>,
    filters: Option<Vec<String>>,
}

impl MaybeOutfeedQueue {
    /// Wraps `queue`.
    pub fn new(queue: OutfeedQueue, filters: Option<Vec<String>>) -> Self {
        MaybeOutfeedQueue {
            queue: Arc::new(queue),
            filters,
        }
    }

    /// The wrapped queue (share it with a host thread that dequeues).
    pub fn queue(&self) -> &Arc<OutfeedQueue> {
        &self.queue
    }

    /// The filters.
    pub fn filters(&self) -> Option<&[String]> {
        self.filters.as_deref()
    }

    /// Whether `key` passes the filters.
    pub fn keeps(&self, key: &str) -> bool {
        self.filters
            .as_ref()
            .is_none_or(|f| f.iter().any(|s| key.contains(s.as_str())))
    }

    /// Adds `key` to `map` if it passes the filters; `value` is only computed then.
    pub fn maybe_outfeed(
        &self,
        map: &mut BTreeMap<String, HostTensor>,
        key: &str,
        value: impl FnOnce() -> HostTensor,
    ) {
        if self.keeps(key) {
            map.insert(key.to_string(), value());
        }
    }

    /// Enqueues one map per replica unless the maps are empty (then nothing is enqueued and
    /// the result is `None`). Blocks while the queue is full, as a device stalls.
    ///
    /// # Errors
    ///
    /// The queue's [`OutfeedError`] (wrong replica count, changed structure).
    pub fn maybe_enqueue(
        &self,
        per_replica: Vec<BTreeMap<String, HostTensor>>,
    ) -> Result<Option<EnqueueReport>, OutfeedError> {
        if per_replica.iter().all(BTreeMap::is_empty) {
            return Ok(None);
        }
        self.queue
            .enqueue(per_replica.into_iter().map(Element::Map).collect())
            .map(Some)
    }
}

/// Stacks what is dequeued from a map-carrying ALL-mode queue, chunk after chunk, into one
/// tensor per key: `[n, ...]` with `n` the elements over all chunks, oldest first.
///
/// A key's buffer starts as large as the key's last [`Collector::take`] needed, so that an
/// epoch like the one before it stacks its data without growing (and copying) the buffer.
#[derive(Debug, Default, Clone)]
pub struct Collector {
    keys: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// Values per key at the last `take`.
    last: BTreeMap<String, usize>,
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Self {
        Collector::default()
    }

    /// Appends a dequeued chunk. Tensor elements go under the key `""`.
    ///
    /// # Errors
    ///
    /// When the host cannot allocate room for a key's data: the key and the bytes asked for
    /// (the chunk is dropped, what was collected before stays).
    pub fn push(&mut self, d: Dequeued) -> Result<(), (String, u64)> {
        let map = match d {
            Dequeued::Empty => return Ok(()),
            Dequeued::Tensor(t) => BTreeMap::from([(String::new(), t)]),
            Dequeued::Map(m) => m,
        };
        for (k, t) in map {
            let reserve = self.last.get(&k).copied().unwrap_or(0).max(t.data.len());
            let e = self.keys.entry(k.clone()).or_default();
            let room = if e.1.capacity() == 0 {
                reserve
            } else {
                t.data.len()
            };
            if crate::allocator::fallibly(|| e.1.try_reserve(room)).is_err() {
                let bytes = (e.1.len().saturating_add(room) * std::mem::size_of::<f32>()) as u64;
                return Err((k, bytes));
            }
            if e.1.is_empty() {
                e.0 = t.shape.clone();
            } else if let Some(n) = t.shape.first() {
                e.0[0] += n;
            }
            e.1.extend_from_slice(&t.data);
        }
        Ok(())
    }

    /// Whether nothing was collected.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Takes everything collected so far.
    pub fn take(&mut self) -> BTreeMap<String, HostTensor> {
        std::mem::take(&mut self.keys)
            .into_iter()
            .map(|(k, (shape, data))| {
                self.last.insert(k.clone(), data.len());
                (k, HostTensor { shape, data })
            })
            .collect()
    }
}

/// What the seeds' `OutfeedCallback` prints at the end of an epoch: its name, then each key
/// and shape and the `Epoch N - Summary Stats` table, or `No data enqueued`.
pub fn epoch_report(name: &str, epoch: usize, data: &BTreeMap<String, HostTensor>) -> String {
    if data.is_empty() {
        return format!("\n{name}\n{NO_DATA}");
    }
    format!(
        "\n{name}\n{}\nEpoch {epoch} - Summary Stats\n{}",
        format_keys(data),
        format_table(data)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outfeed::{OutfeedMode, OutfeedQueue};

    #[test]
    fn filters_parse_like_the_seeds() {
        assert_eq!(parse_filters(&["none".into()]), None);
        assert_eq!(parse_filters(&["NONE".into()]), None);
        assert_eq!(parse_filters(&[]), Some(vec![]));
        assert_eq!(
            parse_filters(&["Dense_128".into(), "none".into()]),
            Some(vec!["Dense_128".to_string(), "none".to_string()])
        );
    }

    #[test]
    fn collector_stacks_chunks() {
        let q = OutfeedQueue::new("q", OutfeedMode::All, 8, 1).unwrap();
        let mut c = Collector::new();
        for i in 0..5 {
            let m = BTreeMap::from([(
                "a".to_string(),
                HostTensor::new(vec![2], vec![i as f32, 0.0]).unwrap(),
            )]);
            q.enqueue(vec![Element::Map(m)]).unwrap();
            if i % 2 == 0 {
                c.push(q.dequeue().unwrap()).unwrap();
            }
        }
        c.push(q.dequeue().unwrap()).unwrap();
        let m = c.take();
        assert_eq!(m["a"].shape, vec![5, 2]);
        assert_eq!(
            m["a"].data.iter().step_by(2).copied().collect::<Vec<_>>(),
            vec![0.0, 1.0, 2.0, 3.0, 4.0]
        );
        assert!(c.is_empty());
    }

    #[test]
    fn collector_sizes_an_epoch_like_the_last_one_at_once() {
        let chunk = |i: usize| {
            Dequeued::Map(BTreeMap::from([(
                "a".to_string(),
                HostTensor::new(vec![1, 3], vec![i as f32; 3]).unwrap(),
            )]))
        };
        let mut c = Collector::new();
        for i in 0..10 {
            c.push(chunk(i)).unwrap();
        }
        let first = c.take();
        assert_eq!(first["a"].shape, vec![10, 3]);
        c.push(chunk(10)).unwrap();
        c.push(chunk(11)).unwrap();
        let second = c.take();
        assert_eq!(second["a"].shape, vec![2, 3]);
        assert_eq!(second["a"].data, [10.0, 10.0, 10.0, 11.0, 11.0, 11.0]);
        assert!(
            second["a"].data.capacity() >= 30,
            "reserved as the first epoch needed"
        );
    }

    #[test]
    fn epoch_report_without_data_says_so() {
        assert!(epoch_report("Gradients callback", 1, &BTreeMap::new()).ends_with(NO_DATA));
    }
}
