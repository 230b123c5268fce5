//! Pipelined execution across IPUs: the schedule's timeline with each stage's costs, as
//! bulk-synchronous pipeline steps. Every step, each IPU runs the slots the schedule gives it
//! one after another; the step ends when the slowest IPU is done and all IPUs sync.

use serde::{Deserialize, Serialize};
use tessera_core::schedule::{Pipeline, Slot};

/// Cycles of one stage's forward and backward pass (for one micro-batch), on its IPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageCost {
    /// Forward cycles.
    pub forward: u64,
    /// Backward cycles (0 for inference).
    pub backward: u64,
}

/// One IPU's share of a timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpuTime {
    /// The IPU.
    pub ipu: usize,
    /// Cycles spent running its slots.
    pub busy: u64,
    /// Cycles waiting for other IPUs within pipeline steps.
    pub idle: u64,
}

impl IpuTime {
    /// Idle cycles as a fraction of the timeline.
    pub fn idle_fraction(&self) -> f64 {
        let total = self.busy + self.idle;
        if total == 0 {
            0.0
        } else {
            self.idle as f64 / total as f64
        }
    }
}

/// One slot run on the timeline, for traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRun {
    /// Pipeline step.
    pub step: usize,
    /// The IPU.
    pub ipu: usize,
    /// Stage.
    pub stage: usize,
    /// Backward (true) or forward.
    pub backward: bool,
    /// Micro-batch.
    pub micro_batch: usize,
    /// Start cycle from the start of the timeline.
    pub start: u64,
    /// Cycles.
    pub cycles: u64,
}

/// The timeline of one weight update's micro-batches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Total cycles, syncs included.
    pub cycles: u64,
    /// Per IPU.
    pub ipus: Vec<IpuTime>,
    /// Highest stash occupancy observed per stage while running (see
    /// [`Pipeline::stash_occupancy`]).
    pub stash_observed: Vec<usize>,
    /// Every slot run.
    pub runs: Vec<SlotRun>,
}

/// Runs `pipeline` with `costs[k]` for stage `k` on IPU `mapping[k]`, `sync` cycles between
/// steps. Tracks each stage's stash as it is pushed (forward) and popped (backward).
pub fn timeline(
    pipeline: &Pipeline,
    mapping: &[usize],
    costs: &[StageCost],
    sync: u64,
) -> Timeline {
    let placements: Vec<Vec<(usize, usize, StageCost)>> = (0..pipeline.stages())
        .map(|k| vec![(k, mapping[k], costs[k])])
        .collect();
    timeline_concurrent(pipeline, &placements, sync)
}

/// [`timeline`] with concurrent stages: `placements[p]` lists the (stage, IPU, cost) of every
/// stage at pipeline position `p`; they run side by side on their IPUs in the position's slots.
/// Stashes are tracked per position.
pub fn timeline_concurrent(
    pipeline: &Pipeline,
    placements: &[Vec<(usize, usize, StageCost)>],
    sync: u64,
) -> Timeline {
    let ipus = placements
        .iter()
        .flatten()
        .map(|&(_, ipu, _)| ipu)
        .max()
        .map_or(1, |m| m + 1);
    let mut time: Vec<IpuTime> = (0..ipus)
        .map(|ipu| IpuTime {
            ipu,
            ..Default::default()
        })
        .collect();
    let mut stash: Vec<std::collections::VecDeque<usize>> =
        vec![Default::default(); pipeline.stages()];
    let mut observed = vec![0usize; pipeline.stages()];
    let mut runs = Vec::new();
    let mut clock = 0u64;
    let mut busy = vec![0u64; ipus];
    let mut by_step: Vec<Vec<(Slot, usize)>> = vec![Vec::new(); pipeline.steps()];
    for (t, slot, b) in pipeline.events() {
        by_step[t].push((slot, b));
    }
    // Within a step an IPU runs its backward slots before its forward ones, so a stash entry is
    // consumed before the next micro-batch's activations are pushed.
    for slots in &mut by_step {
        slots.sort_by_key(|(slot, _)| !matches!(slot, Slot::Backward(_)));
    }
    for (t, slots) in by_step.iter().enumerate() {
        busy.iter_mut().for_each(|x| *x = 0);
        for &(slot, b) in slots {
            let k = slot.stage();
            for &(stage, ipu, cost) in &placements[k] {
                let (cycles, backward) = match slot {
                    Slot::Forward(_) => (cost.forward, false),
                    Slot::Backward(_) => (cost.backward, true),
                };
                runs.push(SlotRun {
                    step: t,
                    ipu,
                    stage,
                    backward,
                    micro_batch: b,
                    start: clock + busy[ipu],
                    cycles,
                });
                busy[ipu] += cycles;
            }
            if pipeline.training() {
                match slot {
                    Slot::Forward(_) => {
                        // Older micro-batches still waiting when this one is pushed.
                        observed[k] = observed[k].max(stash[k].len());
                        stash[k].push_back(b);
                    }
                    Slot::Backward(_) => {
                        // FIFO: the backward consumes the oldest stashed micro-batch.
                        let oldest = stash[k].pop_front();
                        debug_assert_eq!(oldest, Some(b));
                    }
                }
            }
        }
        let step = busy.iter().copied().max().unwrap_or(0);
        for (d, tm) in time.iter_mut().enumerate() {
            tm.busy += busy[d];
            tm.idle += step - busy[d];
        }
        clock += step + sync;
    }
    Timeline {
        cycles: clock,
        ipus: time,
        stash_observed: observed,
        runs,
    }
}
