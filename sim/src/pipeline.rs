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

/// Steps of a timeline that were not run one by one: in the steady state of a long pipeline
/// every period of steps is the same (Grouped: one step, every slot busy; Interleaved: two;
/// Sequential: one micro-batch's slots), so the middle periods are counted, not listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElidedSteps {
    /// The first step not listed in [`Timeline::runs`].
    pub first_step: usize,
    /// Steps not listed.
    pub steps: usize,
    /// The cycle they start at.
    pub start: u64,
    /// Their cycles, syncs included.
    pub cycles: u64,
}

/// Steady-state periods kept in [`Timeline::runs`] on each side of the elided middle.
pub const KEPT_PERIODS: usize = 8;

/// The timeline of one weight update's micro-batches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// Total cycles, syncs included (saturating at `u64::MAX`).
    pub cycles: u64,
    /// Per IPU.
    pub ipus: Vec<IpuTime>,
    /// Highest stash occupancy observed per stage while running (see
    /// [`Pipeline::stash_occupancy`]).
    pub stash_observed: Vec<usize>,
    /// Every slot run, but for the steady-state steps of [`Timeline::elided`].
    pub runs: Vec<SlotRun>,
    /// Identical steady-state steps counted but not listed in `runs` (only when more than
    /// `2 * KEPT_PERIODS` periods are identical).
    pub elided: Option<ElidedSteps>,
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
///
/// Time and memory are O(stages x slots), whatever the accumulation count: in the steady
/// state (every step from the last slot's first run to the first slot's last) the steps
/// repeat with the schedule's period, so beyond [`KEPT_PERIODS`] periods on each side the
/// middle is counted as a whole ([`Timeline::elided`]). Cycle counts saturate at `u64::MAX`.
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
    let mut stashes = Stashes {
        queues: vec![Default::default(); pipeline.stages()],
        observed: vec![0usize; pipeline.stages()],
    };
    let mut runs = Vec::new();
    let mut clock = 0u64;
    let mut busy = vec![0u64; ipus];
    let slots = pipeline.slots();
    let steps = pipeline.steps();
    // Steps between a micro-batch's slot and the next micro-batch's same slot.
    let period = pipeline.step_of(1, pipeline.slot(0)) - pipeline.step_of(0, pipeline.slot(0));
    // The steady state: steps `slots - 1 ..= period * (M - 1)` run every slot of their phase.
    let steady_first = slots - 1;
    let steady_last = period * (pipeline.accumulation() - 1);
    let periods = if steady_last >= steady_first {
        (steady_last - steady_first + 1) / period
    } else {
        0
    };
    let skipped_periods = periods.saturating_sub(2 * KEPT_PERIODS);
    let gap_start = steady_first + KEPT_PERIODS * period;
    // One steady period's cycles and per-IPU busy and idle cycles (the one before the gap).
    let mut period_clock = 0u64;
    let mut period_busy = vec![0u64; ipus];
    let mut period_idle = vec![0u64; ipus];
    let mut elided = None;
    let mut active: Vec<(Slot, usize)> = Vec::with_capacity(slots);
    let mut t = 0;
    while t < steps {
        if skipped_periods > 0 && t == gap_start {
            let n = skipped_periods as u64;
            let cycles = period_clock.saturating_mul(n);
            for (d, tm) in time.iter_mut().enumerate() {
                tm.busy = tm.busy.saturating_add(period_busy[d].saturating_mul(n));
                tm.idle = tm.idle.saturating_add(period_idle[d].saturating_mul(n));
            }
            // Every slot ran once per period: the stashed micro-batches move on as many.
            for q in &mut stashes.queues {
                q.iter_mut().for_each(|b| *b += skipped_periods);
            }
            elided = Some(ElidedSteps {
                first_step: t,
                steps: skipped_periods * period,
                start: clock,
                cycles,
            });
            clock = clock.saturating_add(cycles);
            t += skipped_periods * period;
            continue;
        }
        active_slots(pipeline, t, &mut active);
        busy.iter_mut().for_each(|x| *x = 0);
        let at = (t, clock);
        run_slots(
            pipeline,
            placements,
            at,
            &active,
            &mut busy,
            &mut runs,
            &mut stashes,
        );
        let step = busy.iter().copied().max().unwrap_or(0);
        let in_period = skipped_periods > 0 && t + period >= gap_start && t < gap_start;
        for (d, tm) in time.iter_mut().enumerate() {
            tm.busy = tm.busy.saturating_add(busy[d]);
            tm.idle = tm.idle.saturating_add(step - busy[d]);
            if in_period {
                period_busy[d] += busy[d];
                period_idle[d] += step - busy[d];
            }
        }
        let advance = step.saturating_add(sync);
        if in_period {
            period_clock = period_clock.saturating_add(advance);
        }
        clock = clock.saturating_add(advance);
        t += 1;
    }
    Timeline {
        cycles: clock,
        ipus: time,
        stash_observed: stashes.observed,
        runs,
        elided,
    }
}

/// Sets `active` to step `t`'s active slots, each with its micro-batch. Within a step an IPU
/// runs its backward slots before its forward ones, so a stash entry is consumed before the
/// next micro-batch's activations are pushed.
/// The cycles each micro-batch adds to a weight update's pipeline once it is full: its steady
/// state, where every step runs every slot of its phase. It is measured, not assumed: the
/// timelines of two long runs of `pipeline` (with [`steady_micro_batches`] and twice as many
/// micro-batches) differ by that many steady micro-batches, whatever the schedule's period.
/// A weight update of M micro-batches is M times this plus the pipeline's ramp (its fill and
/// drain, the rest of its timeline).
pub fn steady_cycles_per_micro_batch(
    pipeline: &Pipeline,
    placements: &[Vec<(usize, usize, StageCost)>],
    sync: u64,
) -> f64 {
    let times = steady_micro_batches(pipeline).div_ceil(pipeline.accumulation().max(1));
    let (Some(short), Some(long)) = (pipeline.repeated(times), pipeline.repeated(2 * times)) else {
        return 0.0;
    };
    let a = timeline_concurrent(&short, placements, sync).cycles;
    let b = timeline_concurrent(&long, placements, sync).cycles;
    let added = long.accumulation() - short.accumulation();
    b.saturating_sub(a) as f64 / added as f64
}

/// Micro-batches enough for a run of `pipeline` to reach its steady state: more than its
/// slots (the fill) and its periods (a step of Interleaved's two), with room to spare.
pub fn steady_micro_batches(pipeline: &Pipeline) -> usize {
    4 * pipeline.slots() + 4
}

fn active_slots(pipeline: &Pipeline, t: usize, active: &mut Vec<(Slot, usize)>) {
    active.clear();
    for back in [true, false] {
        for j in 0..pipeline.slots() {
            let slot = pipeline.slot(j);
            if matches!(slot, Slot::Backward(_)) != back {
                continue;
            }
            if let Some(b) = pipeline.micro_batch_at(t, slot) {
                active.push((slot, b));
            }
        }
    }
}

/// Each stage's stashed micro-batches (oldest first) and the most seen waiting.
struct Stashes {
    queues: Vec<std::collections::VecDeque<usize>>,
    observed: Vec<usize>,
}

/// Step `t`'s active slots (slot, micro-batch) starting at `clock`: each placement's run on
/// its IPU after what the IPU ran already in the step (`busy`), and, training, the stash
/// pushed by a forward slot and popped by a backward one.
fn run_slots(
    pipeline: &Pipeline,
    placements: &[Vec<(usize, usize, StageCost)>],
    (t, clock): (usize, u64),
    active: &[(Slot, usize)],
    busy: &mut [u64],
    runs: &mut Vec<SlotRun>,
    stash: &mut Stashes,
) {
    for &(slot, b) in active {
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
                start: clock.saturating_add(busy[ipu]),
                cycles,
            });
            busy[ipu] = busy[ipu].saturating_add(cycles);
        }
        if pipeline.training() {
            match slot {
                Slot::Forward(_) => {
                    // Older micro-batches still waiting when this one is pushed.
                    stash.observed[k] = stash.observed[k].max(stash.queues[k].len());
                    stash.queues[k].push_back(b);
                }
                Slot::Backward(_) => {
                    // FIFO: the backward consumes the oldest stashed micro-batch.
                    let oldest = stash.queues[k].pop_front();
                    debug_assert_eq!(oldest, Some(b));
                }
            }
        }
    }
}
