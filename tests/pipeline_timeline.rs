//! The pipeline timeline: stashes observed while simulating stay within their stated depth
//! and reach it; for equal-cost stages, Grouped's idle fraction is (S-1)/(M+S-1); Interleaved
//! runs one stage per IPU per step, Sequential one in the whole system.

use proptest::prelude::*;
use tessera::core::schedule::{overlap_length, Pipeline, Schedule};
use tessera::sim::pipeline::{timeline, StageCost};

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
        // Every slot ran once per micro-batch, and work is conserved.
        prop_assert_eq!(t.runs.len(), 2 * s * m);
        let work: u64 = c.iter().map(|x| (x.forward + x.backward) * m as u64).sum();
        prop_assert_eq!(t.ipus.iter().map(|i| i.busy).sum::<u64>(), work);
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
