//! The automatic pipeline split's partition is optimal: on small random cases it equals an
//! exhaustive search over every contiguous split (the largest stage cost, each stage under
//! its memory cap, stages starting only where cuts are allowed), and its cuts are what it
//! claims. The profile it balances on, read from an estimate the user's command made, is the
//! one it would make itself.

use std::path::PathBuf;

use proptest::prelude::*;
use tessera_host::compile::onnx::{compile_imported, import_options, OnnxOptions};
use tessera_host::compile::SessionOptions;
use tessera_host::estimation::split::{is_profile_estimate, partition, profile, profile_of};
use tessera_host::onnx::{OnnxGraph, OnnxModel, Stages};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/onnx")
        .join(name)
}

/// A file without stage attributes compiles to one stage under the default options (the
/// file's attributes), and the estimate of it is the profile the search reads instead of
/// making its own; a file's two stages are not.
#[test]
fn a_one_stage_estimate_of_a_file_is_the_profile() {
    let m = OnnxModel::load(&fixture("cnn.onnx")).expect("loads");
    let so = SessionOptions {
        batch_size: 4,
        ..SessionOptions::default()
    };
    let oo = OnnxOptions::default();
    assert!(matches!(oo.stages, Stages::Attributes));
    let og = OnnxGraph::import(&m, &import_options(&so, &oo)).expect("imports");
    let c = compile_imported(&og, &so, &oo).expect("compiles");
    let e = c.target.estimate().expect("estimates");
    assert!(is_profile_estimate(&so, &oo, &c));
    assert_eq!(
        profile_of(&c, &e),
        profile(&og, &so, &oo).expect("profiles")
    );

    let names = m.node_names();
    let two = OnnxOptions {
        stages: Stages::After(vec![names[names.len() / 2].clone()]),
        ..OnnxOptions::default()
    };
    let so2 = SessionOptions {
        gradient_accumulation_count: 4,
        ..so.clone()
    };
    let c2 = compile_imported(&og, &so2, &two).expect("compiles in two stages");
    assert!(!is_profile_estimate(&so2, &two, &c2));
    let replicated = SessionOptions {
        replicas: 2,
        ..so.clone()
    };
    assert!(!is_profile_estimate(&replicated, &oo, &c));
}

/// Every way to cut `costs` into `caps.len()` non-empty contiguous parts, part `k` under
/// `caps[k]` and starting where `cuttable` allows (empty: anywhere): the best largest cost,
/// if any split keeps under the caps.
fn exhaustive(costs: &[u64], mems: &[u64], caps: &[u64], cuttable: &[bool]) -> Option<u64> {
    fn go(
        costs: &[u64],
        mems: &[u64],
        caps: &[u64],
        cuttable: &[bool],
        start: usize,
    ) -> Option<u64> {
        let l = costs.len();
        let n = caps.len();
        if start > 0 && !cuttable.is_empty() && !cuttable[start] {
            return None;
        }
        if n == 1 {
            let m: u64 = mems[start..].iter().sum();
            return (start < l && m <= caps[0]).then(|| costs[start..].iter().sum());
        }
        let mut best: Option<u64> = None;
        for end in start + 1..=l.saturating_sub(n - 1) {
            let m: u64 = mems[start..end].iter().sum();
            if m > caps[0] {
                break;
            }
            let c: u64 = costs[start..end].iter().sum();
            if let Some(rest) = go(costs, mems, &caps[1..], cuttable, end) {
                let v = c.max(rest);
                best = Some(best.map_or(v, |b| b.min(v)));
            }
        }
        best
    }
    if caps.is_empty() || costs.len() < caps.len() {
        return None;
    }
    go(costs, mems, caps, cuttable, 0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn partition_equals_exhaustive_search(
        items in prop::collection::vec((0u64..1000, 0u64..50, any::<bool>()), 1..11),
        caps in prop::collection::vec(10u64..300, 1..5),
        anywhere in any::<bool>(),
    ) {
        let costs: Vec<u64> = items.iter().map(|x| x.0).collect();
        let mems: Vec<u64> = items.iter().map(|x| x.1).collect();
        let cuttable: Vec<bool> = if anywhere {
            Vec::new()
        } else {
            items.iter().enumerate().map(|(i, x)| i == 0 || x.2).collect()
        };
        let n = caps.len();
        let got = partition(&costs, &mems, &caps, &cuttable);
        let want = exhaustive(&costs, &mems, &caps, &cuttable);
        prop_assert_eq!(got.as_ref().map(|p| p.max_cost), want);
        if let Some(p) = got {
            // The cuts are increasing and allowed, every part non-empty and under its cap,
            // and the claimed cost is the largest part's.
            prop_assert_eq!(p.starts.len(), n);
            prop_assert_eq!(p.starts[0], 0);
            let mut largest = 0;
            for (s, &cap) in caps.iter().enumerate() {
                let (a, b) = (p.starts[s], p.starts.get(s + 1).copied().unwrap_or(costs.len()));
                prop_assert!(a < b);
                prop_assert!(cuttable.is_empty() || cuttable[a]);
                prop_assert!(mems[a..b].iter().sum::<u64>() <= cap);
                largest = largest.max(costs[a..b].iter().sum::<u64>());
            }
            prop_assert_eq!(largest, p.max_cost);
        }
    }
}
