//! The host side of training: one thread that blocks on the device's messages and on every
//! outfeed queue at once (`crossbeam_channel::select!`), drains each queue as its elements
//! arrive (so a small `buffer_depth` stalls the device only as long as the host is slow), and
//! at each reporting point, while the device waits, hands the caller the loss and everything
//! the outfeeds carried.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{select, Receiver, Sender};

use super::device::DeviceMsg;
use super::run::TrainEvent;
use super::taps::{Queue, Taps};
use crate::inspect::Collector;
use crate::outfeed::OutfeedError;

/// The host's subscriptions to the outfeed queues, in [`Queue::ALL`] order: taken before the
/// device starts, so that no enqueue goes unnoticed.
pub(super) fn subscribe(taps: &Taps) -> Vec<Receiver<()>> {
    Queue::ALL
        .iter()
        .map(|&q| taps.queue(q).subscribe())
        .collect()
}

/// Drains the outfeeds and forwards the device's progress until the device is done.
/// Returns the loss of every reporting point, and the first outfeed the host could not hold.
/// From then on the run cannot succeed: it sets `stop`, so the device ends after the weight
/// update in hand, and keeps draining and acknowledging until it does, collecting nothing
/// more.
pub(super) fn host_loop(
    taps: &Taps,
    subscriptions: &[Receiver<()>],
    from_device: &Receiver<DeviceMsg>,
    acks: &Sender<()>,
    stop: &AtomicBool,
    on_event: &mut impl FnMut(TrainEvent),
) -> (Vec<f64>, Result<(), OutfeedError>) {
    let mut held = Held::default();
    let mut losses = Vec::new();
    loop {
        select! {
            recv(from_device) -> msg => match msg {
                Ok(DeviceMsg::Progress(steps)) => on_event(TrainEvent::Progress { steps }),
                Ok(DeviceMsg::Report { index, epochs_seen, loss }) => {
                    // The device is waiting: everything it enqueued is in the queues.
                    let mut outfeeds = Vec::new();
                    for q in Queue::ALL {
                        held.drain(taps, q);
                        let data = held.collectors[q as usize].take();
                        if taps.reports(q) {
                            outfeeds.push((q.callback().to_string(), data));
                        }
                    }
                    losses.push(loss);
                    on_event(TrainEvent::Epoch { epoch: index, epochs_seen, loss, outfeeds });
                    let _ = acks.send(());
                }
                Err(_) => break,
            },
            recv(subscriptions[0]) -> _ => held.drain(taps, Queue::Gradients),
            recv(subscriptions[1]) -> _ => held.drain(taps, Queue::Plain),
            recv(subscriptions[2]) -> _ => held.drain(taps, Queue::Maybe),
        }
        if held.full.is_some() {
            stop.store(true, Ordering::Relaxed);
        }
    }
    (losses, held.full.map_or(Ok(()), Err))
}

/// What the host holds of each queue until the next report, and the first queue it could
/// not hold.
#[derive(Default)]
struct Held {
    collectors: [Collector; 3],
    full: Option<OutfeedError>,
}

impl Held {
    /// Dequeues what queue `q` has pending into its collector; once one could not be held,
    /// drops what is dequeued (and what was held), so the device is never kept waiting.
    fn drain(&mut self, taps: &Taps, q: Queue) {
        let queue = taps.queue(q);
        if queue.pending() == 0 {
            return;
        }
        let Ok(d) = queue.dequeue() else { return };
        if self.full.is_some() {
            return;
        }
        if let Err((key, bytes)) = self.collectors[q as usize].push(d) {
            self.collectors.iter_mut().for_each(|c| drop(c.take()));
            self.full = Some(OutfeedError::HostMemory {
                queue: q.callback().to_string(),
                key,
                bytes,
            });
        }
    }
}
