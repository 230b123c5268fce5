//! The pipeline timeline: stashes observed while simulating stay within their stated depth
//! and reach it; for equal-cost stages, Grouped's idle fraction is (S-1)/(M+S-1); Interleaved
//! runs one stage per IPU per step, Sequential one in the whole system; counting the steady
//! state's identical steps changes nothing; past the fill, each micro-batch adds the steady
//! state's cycles.

use proptest::prelude::*;
use tessera::core::schedule::Slot;
use tessera::core::schedule::{overlap_length, Pipeline, Schedule};
use tessera::sim::pipeline::{
    steady_cycles_per_micro_batch, steady_micro_batches, timeline, StageCost, KEPT_PERIODS,
};

fn schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        Just(Schedule::Grouped),
        Just(Schedule::Interleaved),
        Just(Schedule::Sequential)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn stash_observed_reaches_the_stated_depth(s in 1usize..=4, sch in schedule(), times in 1usize..=3, costs in prop::collection::vec((1u64..1000, 1u64..1000), 4)) {
        let m = overlap_length(sch, s, true) * times;
        let p = Pipeline::new(s, m, sch, true).unwrap();
        let mapping: Vec<usize> = (0..s).collect();
        let c: Vec<StageCost> = costs[..s].iter().map(|&(f, b)| StageCost { forward: f, backward: b }).collect();
        let t = timeline(&p, &mapping, &c, 10);
        for k in 0..s {
            prop_assert_eq!(t.stash_observed[k], p.stash_depth(k), "stage {}", k);
        }
        // Every slot ran once per micro-batch (listed or elided), and work is conserved.
        let elided = t.elided.map_or(0, |e| e.steps);
        prop_assert!(t.runs.len() <= 2 * s * m);
        prop_assert_eq!(t.runs.len() == 2 * s * m, elided == 0);
        let work: u64 = c.iter().map(|x| (x.forward + x.backward) * m as u64).sum();
        prop_assert_eq!(t.ipus.iter().map(|i| i.busy).sum::<u64>(), work);
    }

    #[test]
    fn each_micro_batch_past_the_fill_adds_the_steady_cycles(s in 1usize..=4, sch in schedule(), training: bool, extra in 0usize..=40, costs in prop::collection::vec((1u64..1000, 1u64..1000), 4), sync in 0u64..100) {
        let base = overlap_length(sch, s, training);
        let p = Pipeline::new(s, base, sch, training).unwrap();
        let placements: Vec<Vec<(usize, usize, StageCost)>> = (0..s)
            .map(|k| vec![(k, k, StageCost { forward: costs[k].0, backward: costs[k].1 })])
            .collect();
        let steady = steady_cycles_per_micro_batch(&p, &placements, sync);
        prop_assert!(steady > 0.0);
        // Two counts past the fill, multiples of the schedule's own: their timelines differ
        // by the steady cycles of each micro-batch between them.
        let times = steady_micro_batches(&p).div_ceil(base);
        let short = p.repeated(times).unwrap();
        let long = p.repeated(times + 1 + extra).unwrap();
        let run = |q: &Pipeline| timeline_of(q, &placements, sync);
        let added = (long.accumulation() - short.accumulation()) as f64;
        prop_assert_eq!((run(&long) - run(&short)) as f64, steady * added);
        // A weight update of any M takes at least M - 1 steady micro-batches (the last one's
        // period may end early: Interleaved's idle step after it is not run), and the steady
        // state is no slower than a micro-batch through every stage.
        prop_assert!(run(&p) as f64 >= steady * (base - 1) as f64);
        let through: u64 = costs[..s].iter().map(|&(f, b)| f + if training { b } else { 0 }).sum();
        prop_assert!(steady <= (through + 2 * s as u64 * (sync + 1)) as f64);
    }

    #[test]
    fn grouped_idle_fraction_for_equal_stages(s in 1usize..=4, times in 1usize..=8) {
        let m = 2 * s * times;
        let p = Pipeline::new(s, m, Schedule::Grouped, true).unwrap();
        let mapping: Vec<usize> = (0..s).collect();
        let c = vec![StageCost { forward: 1000, backward: 1000 }; s];
        let t = timeline(&p, &mapping, &c, 0);
        let expected = (s - 1) as f64 / (m + s - 1) as f64;
        for ipu in &t.ipus {
            prop_assert!((ipu.idle_fraction() - expected).abs() <= 0.02, "IPU {}: {} vs {}", ipu.ipu, ipu.idle_fraction(), expected);
        }
    }
}

/// The cycles of `p`'s timeline with each stage on its own IPU.
fn timeline_of(p: &Pipeline, placements: &[Vec<(usize, usize, StageCost)>], sync: u64) -> u64 {
    tessera::sim::pipeline::timeline_concurrent(p, placements, sync).cycles
}

/// The step-by-step timeline, every step run: the reference for the steady-state form.
/// Returns (cycles, per-IPU (busy, idle), every run as (step, ipu, stage, backward,
/// micro-batch, start, cycles)).
#[allow(clippy::type_complexity)]
fn step_by_step(
    p: &Pipeline,
    costs: &[StageCost],
    sync: u64,
) -> (
    u64,
    Vec<(u64, u64)>,
    Vec<(usize, usize, usize, bool, usize, u64, u64)>,
) {
    let s = p.stages();
    let mut by_step: Vec<Vec<(Slot, usize)>> = vec![Vec::new(); p.steps()];
    for (t, slot, b) in p.events() {
        by_step[t].push((slot, b));
    }
    for slots in &mut by_step {
        slots.sort_by_key(|(slot, _)| !matches!(slot, Slot::Backward(_)));
    }
    let mut clock = 0;
    let mut time = vec![(0u64, 0u64); s];
    let mut runs = Vec::new();
    for (t, slots) in by_step.iter().enumerate() {
        let mut busy = vec![0u64; s];
        for &(slot, b) in slots {
            let k = slot.stage();
            let (c, back) = match slot {
                Slot::Forward(_) => (costs[k].forward, false),
                Slot::Backward(_) => (costs[k].backward, true),
            };
            runs.push((t, k, k, back, b, clock + busy[k], c));
            busy[k] += c;
        }
        let step = busy.iter().copied().max().unwrap_or(0);
        for d in 0..s {
            time[d].0 += busy[d];
            time[d].1 += step - busy[d];
        }
        clock += step + sync;
    }
    (clock, time, runs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Counting the steady state's identical periods instead of running them changes
    /// nothing: the same cycles, busy and idle per IPU and stash depths as running every
    /// step, and the listed runs are the step-by-step runs outside the elided steps.
    #[test]
    fn the_steady_state_form_equals_running_every_step(
        s in 1usize..=4,
        sch in schedule(),
        training in any::<bool>(),
        extra in 0usize..=10,
        sync in 0u64..50,
        costs in prop::collection::vec((1u64..1000, 1u64..1000), 4),
    ) {
        let m = overlap_length(sch, s, training) * (2 * KEPT_PERIODS + 4 + extra);
        let p = Pipeline::new(s, m, sch, training).unwrap();
        let mapping: Vec<usize> = (0..s).collect();
        let c: Vec<StageCost> = costs[..s]
            .iter()
            .map(|&(f, b)| StageCost { forward: f, backward: if training { b } else { 0 } })
            .collect();
        let t = timeline(&p, &mapping, &c, sync);
        let (cycles, time, all_runs) = step_by_step(&p, &c, sync);
        prop_assert_eq!(t.cycles, cycles);
        for (d, ipu) in t.ipus.iter().enumerate() {
            prop_assert_eq!((ipu.busy, ipu.idle), time[d], "IPU {}", d);
        }
        for k in 0..s {
            prop_assert_eq!(t.stash_observed[k], p.stash_depth(k), "stage {}", k);
        }
        let e = t.elided.expect("long enough to elide");
        let listed: Vec<_> = all_runs
            .into_iter()
            .filter(|r| r.0 < e.first_step || r.0 >= e.first_step + e.steps)
            .collect();
        let got: Vec<_> = t
            .runs
            .iter()
            .map(|r| (r.step, r.ipu, r.stage, r.backward, r.micro_batch, r.start, r.cycles))
            .collect();
        prop_assert_eq!(got, listed);
    }
}

/// An accumulation count of Poplar's largest repeat count takes no more time or memory than
/// a short one: the timeline lists O(stages) periods.
#[test]
fn a_four_billion_micro_batch_timeline_is_counted_not_listed() {
    let m = u32::MAX as usize - (u32::MAX as usize % 8);
    let p = Pipeline::new(4, m, Schedule::Grouped, true).unwrap();
    let c = vec![
        StageCost {
            forward: 1000,
            backward: 2000
        };
        4
    ];
    let t = timeline(&p, &[0, 1, 2, 3], &c, 10);
    assert!(t.runs.len() < 1000, "{}", t.runs.len());
    assert_eq!(t.ipus[0].busy, 3000 * m as u64);
    // Each further micro-batch adds one steady step: every IPU busy 3000 cycles, then a sync.
    let short = timeline(
        &Pipeline::new(4, 64, Schedule::Grouped, true).unwrap(),
        &[0, 1, 2, 3],
        &c,
        10,
    );
    assert_eq!(t.cycles, short.cycles + (m as u64 - 64) * 3010);
}
