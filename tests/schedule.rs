//! Pipeline schedules, by property: every stage runs M times; forward stages run in order and
//! backward stages in reverse, each after its forward; each IPU runs only its own stages, with
//! the overlap each schedule allows; stashes stay within their stated depth and reach it; bad
//! configurations are typed errors.

use proptest::prelude::*;
use tessera::core::schedule::{overlap_length, Pipeline, Schedule, ScheduleError, Slot};

fn schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        Just(Schedule::Grouped),
        Just(Schedule::Interleaved),
        Just(Schedule::Sequential)
    ]
}

/// A valid pipeline: S in 1..=4, M a multiple of L (1..=4 times), training or not.
fn pipeline() -> impl Strategy<Value = Pipeline> {
    (1usize..=4, schedule(), 1usize..=4, any::<bool>()).prop_map(|(s, sch, times, training)| {
        let m = overlap_length(sch, s, training) * times;
        Pipeline::new(s, m, sch, training).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn every_slot_runs_each_micro_batch_once(p in pipeline()) {
        let mut count = vec![0usize; p.slots()];
        let mut seen = std::collections::HashSet::new();
        for (_, slot, b) in p.events() {
            count[p.slot_index(slot)] += 1;
            prop_assert!(seen.insert((slot, b)), "{:?} ran micro-batch {} twice", slot, b);
        }
        prop_assert!(count.iter().all(|&c| c == p.accumulation()), "{:?}", count);
    }

    #[test]
    fn dependencies_hold(p in pipeline()) {
        let s = p.stages();
        for b in 0..p.accumulation() {
            for k in 0..s {
                if k + 1 < s {
                    prop_assert!(p.step_of(b, Slot::Forward(k)) < p.step_of(b, Slot::Forward(k + 1)));
                }
                if p.training() {
                    prop_assert!(p.step_of(b, Slot::Forward(k)) < p.step_of(b, Slot::Backward(k)));
                    if k + 1 < s {
                        prop_assert!(p.step_of(b, Slot::Backward(k + 1)) < p.step_of(b, Slot::Backward(k)));
                    }
                }
            }
        }
    }

    #[test]
    fn each_ipu_runs_what_its_schedule_allows(p in pipeline()) {
        // Default device mapping: stage k on IPU k.
        let mut per_step: std::collections::BTreeMap<usize, Vec<Slot>> = Default::default();
        for (t, slot, _) in p.events() {
            per_step.entry(t).or_default().push(slot);
        }
        for (t, slots) in per_step {
            match p.schedule() {
                Schedule::Sequential => prop_assert_eq!(slots.len(), 1, "step {}: {:?}", t, slots),
                _ => {
                    for ipu in 0..p.stages() {
                        let mine: Vec<&Slot> = slots.iter().filter(|s| s.stage() == ipu).collect();
                        let allowed = if p.schedule() == Schedule::Grouped { 2 } else { 1 };
                        prop_assert!(mine.len() <= allowed, "step {}: IPU {} runs {:?}", t, ipu, mine);
                        if mine.len() == 2 {
                            prop_assert!(matches!((mine[0], mine[1]), (Slot::Forward(_), Slot::Backward(_)) | (Slot::Backward(_), Slot::Forward(_))));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn stash_occupancy_reaches_but_never_exceeds_its_depth(p in pipeline()) {
        for k in 0..p.stages() {
            let max = (0..p.steps()).map(|t| p.stash_occupancy(k, t)).max().unwrap_or(0);
            prop_assert_eq!(max, p.stash_depth(k), "stage {}", k);
        }
    }

    #[test]
    fn bad_configurations_are_typed_errors(s in 0usize..6, m in 0usize..40, sch in schedule(), training in any::<bool>()) {
        match Pipeline::new(s, m, sch, training) {
            Ok(p) => {
                let l = overlap_length(sch, s, training);
                prop_assert!(m >= l && m % l == 0);
                prop_assert_eq!(p.overlap(), l);
            }
            Err(ScheduleError::NoStages) => prop_assert_eq!(s, 0),
            Err(ScheduleError::BadAccumulation { overlap, accumulation, .. }) => {
                prop_assert_eq!(accumulation, m);
                prop_assert!(m < overlap || m % overlap != 0);
            }
            Err(e) => prop_assert!(false, "unexpected {}", e),
        }
    }
}
