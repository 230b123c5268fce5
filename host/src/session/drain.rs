//! The host side of training: one thread that blocks on the device's messages and on every
//! outfeed queue at once (`crossbeam_channel::select!`), drains each queue as its elements
//! arrive (so a small `buffer_depth` stalls the device only as long as the host is slow), and
//! at each reporting point, while the device waits, hands the caller the loss and everything
//! the outfeeds carried.

use crossbeam_channel::{select, Receiver, Sender};

use super::device::DeviceMsg;
use super::run::TrainEvent;
use super::taps::{Queue, Taps};
use crate::inspect::Collector;

/// The host's subscriptions to the outfeed queues, in [`Queue::ALL`] order: taken before the
/// device starts, so that no enqueue goes unnoticed.
pub(super) fn subscribe(taps: &Taps) -> Vec<Receiver<()>> {
    Queue::ALL
        .iter()
        .map(|&q| taps.queue(q).subscribe())
        .collect()
}

/// Drains the outfeeds and forwards the device's progress until the device is done.
/// Returns the loss of every reporting point.
pub(super) fn host_loop(
    taps: &Taps,
    subscriptions: &[Receiver<()>],
    from_device: &Receiver<DeviceMsg>,
    acks: &Sender<()>,
    on_event: &mut impl FnMut(TrainEvent),
) -> Vec<f64> {
    let mut collectors: [Collector; 3] = Default::default();
    let drain = |q: Queue, collectors: &mut [Collector; 3]| {
        let queue = taps.queue(q);
        if queue.pending() > 0 {
            if let Ok(d) = queue.dequeue() {
                collectors[q as usize].push(d);
            }
        }
    };
    let mut losses = Vec::new();
    loop {
        select! {
            recv(from_device) -> msg => match msg {
                Ok(DeviceMsg::Progress(steps)) => on_event(TrainEvent::Progress { steps }),
                Ok(DeviceMsg::Report { index, epochs_seen, loss }) => {
                    // The device is waiting: everything it enqueued is in the queues.
                    let mut outfeeds = Vec::new();
                    for q in Queue::ALL {
                        drain(q, &mut collectors);
                        let data = collectors[q as usize].take();
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
            recv(subscriptions[0]) -> _ => drain(Queue::Gradients, &mut collectors),
            recv(subscriptions[1]) -> _ => drain(Queue::Plain, &mut collectors),
            recv(subscriptions[2]) -> _ => drain(Queue::Maybe, &mut collectors),
        }
    }
    losses
}
