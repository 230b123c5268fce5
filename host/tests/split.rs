//! The automatic pipeline split's partition is optimal: on small random cases it equals an
//! exhaustive search over every contiguous split (the largest stage cost, every stage under
//! the memory cap), and its cuts are what it claims.

use proptest::prelude::*;
use tessera_host::session::split::partition;

/// Every way to cut `l` items into `n` non-empty contiguous parts: the best largest cost
/// under the cap, if any split keeps under it.
fn exhaustive(costs: &[u64], mems: &[u64], n: usize, cap: u64) -> Option<u64> {
    fn go(costs: &[u64], mems: &[u64], n: usize, cap: u64, start: usize) -> Option<u64> {
        let l = costs.len();
        if n == 1 {
            let m: u64 = mems[start..].iter().sum();
            return (start < l && m <= cap).then(|| costs[start..].iter().sum());
        }
        let mut best: Option<u64> = None;
        for end in start + 1..=l.saturating_sub(n - 1) {
            let m: u64 = mems[start..end].iter().sum();
            if m > cap {
                break;
            }
            let c: u64 = costs[start..end].iter().sum();
            if let Some(rest) = go(costs, mems, n - 1, cap, end) {
                let v = c.max(rest);
                best = Some(best.map_or(v, |b| b.min(v)));
            }
        }
        best
    }
    if n == 0 || costs.len() < n {
        return None;
    }
    go(costs, mems, n, cap, 0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn partition_equals_exhaustive_search(
        items in prop::collection::vec((0u64..1000, 0u64..50), 1..11),
        n in 1usize..5,
        cap in 10u64..300,
    ) {
        let costs: Vec<u64> = items.iter().map(|x| x.0).collect();
        let mems: Vec<u64> = items.iter().map(|x| x.1).collect();
        let got = partition(&costs, &mems, n, cap);
        let want = exhaustive(&costs, &mems, n, cap);
        prop_assert_eq!(got.as_ref().map(|p| p.max_cost), want);
        if let Some(p) = got {
            // The cuts are increasing, every part non-empty and under the cap, and the claimed
            // cost is the largest part's.
            prop_assert_eq!(p.starts.len(), n);
            prop_assert_eq!(p.starts[0], 0);
            let mut largest = 0;
            for s in 0..n {
                let (a, b) = (p.starts[s], p.starts.get(s + 1).copied().unwrap_or(costs.len()));
                prop_assert!(a < b);
                prop_assert!(mems[a..b].iter().sum::<u64>() <= cap);
                largest = largest.max(costs[a..b].iter().sum::<u64>());
            }
            prop_assert_eq!(largest, p.max_cost);
        }
    }
}
