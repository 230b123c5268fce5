//! The device side of training: executions of R weight updates each, over the repeated
//! dataset, in pipeline-schedule order on every replica; after each reporting point it tells
//! the host and waits while the host runs its callbacks, as Keras runs `on_epoch_end`.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::{Receiver, Sender};
use tessera_sim::runner::PipelineRunner;

use super::run::Executions;
use super::taps::Taps;
use crate::compile::{Heap, SessionError};
use crate::dataset::Batch;
use crate::infeed::InfeedQueue;

/// What the device tells the host.
pub(super) enum DeviceMsg {
    /// Micro-batches done so far (per replica).
    Progress(u64),
    /// A reporting point: the device waits for an acknowledgement.
    Report {
        /// 1-based reporting point.
        index: usize,
        /// Passes over the training data so far (samples seen / dataset size).
        epochs_seen: f64,
        /// Mean loss since the last reporting point.
        loss: f64,
    },
}

/// What the device needs besides the runner.
pub(super) struct Device<'a> {
    pub(super) infeed: InfeedQueue,
    pub(super) taps: &'a Taps,
    pub(super) plan: Executions,
    pub(super) input_name: String,
    pub(super) to_host: Sender<DeviceMsg>,
    pub(super) acks: Receiver<()>,
    /// Set by the host when the run can no longer succeed (an outfeed it could not hold):
    /// the device stops after the weight update in hand.
    pub(super) stop: &'a AtomicBool,
}

impl Device<'_> {
    /// Runs every execution; stops early if the host goes away or asks it to stop.
    pub(super) fn run(mut self, runner: &mut PipelineRunner<Heap>) -> Result<(), SessionError> {
        let x = self.plan;
        let (mut loss_sum, mut loss_n, mut done) = (0f64, 0u64, 0u64);
        let mut report = 0usize;
        for e in 1..=x.executions {
            for _ in 0..x.repeat {
                let (s, n) = self.update(runner)?;
                loss_sum += s;
                loss_n += n;
                done += x.micro_batches_per_update as u64;
                let _ = self.to_host.send(DeviceMsg::Progress(done));
                if self.stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            if e % x.executions_per_report != 0 && e != x.executions {
                continue;
            }
            report += 1;
            let loss = if loss_n > 0 {
                loss_sum / loss_n as f64
            } else {
                f64::NAN
            };
            (loss_sum, loss_n) = (0.0, 0);
            let msg = DeviceMsg::Report {
                index: report,
                epochs_seen: x.epochs_after(e),
                loss,
            };
            // The host runs its callbacks while the device waits.
            if self.to_host.send(msg).is_err() || self.acks.recv().is_err() {
                break;
            }
        }
        Ok(())
    }

    /// One weight update: M micro-batches per replica from the infeed, taps enqueued as they
    /// complete. Returns the summed loss and how many losses were summed.
    fn update(&mut self, runner: &mut PipelineRunner<Heap>) -> Result<(f64, u64), SessionError> {
        let replicas = self.plan.replicas;
        let batches = (0..self.plan.micro_batches_per_update * replicas)
            .map(|_| {
                self.infeed
                    .next_batch()?
                    .ok_or_else(|| SessionError::Data("the infeed ran dry".into()))
            })
            .collect::<Result<Vec<Batch>, SessionError>>()?;
        let mut taps = self.taps.update();
        let input = self.input_name.as_str();
        runner.run_update_observed(
            |r, mb, plan, arena| feed(plan, arena, &batches[mb * replicas + r], input),
            |point, plan, arena, state| taps.observe(point, plan, arena, state),
        )?;
        Ok((taps.loss_sum, taps.loss_n))
    }
}

/// Writes a batch into a micro-batch's arena: `images` goes to the model's input, every other
/// field to the input of its own name; fields the graph has no input for (the labels of an
/// inference graph that computes no loss) are not fed.
pub(super) fn feed(
    plan: &tessera_core::Plan<Heap>,
    arena: &mut [u8],
    batch: &Batch,
    input_name: &str,
) -> Result<(), SessionError> {
    for (name, _, values) in &batch.fields {
        let target = if name == "images" {
            input_name
        } else {
            name.as_str()
        };
        if plan.graph().find(target).is_ok() {
            plan.fill_input(target, arena, values.len(), |i| values[i])?;
        }
    }
    Ok(())
}
