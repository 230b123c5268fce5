//! Properties of the ahead-of-time plan on random graphs: tensors live at the same time never
//! share bytes, the arena is at least the peak live bytes and not far above it, and running
//! with the reused arena gives exactly the numbers of a layout that reuses nothing.

#![allow(clippy::result_large_err)] // GraphError carries the node name inline (no heap in core).

use crate::common;

use std::sync::Mutex;

use common::{build, steps};

use proptest::prelude::*;
use tessera::core::{
    models::mnist_mlp, DType, Fixed, Graph, NodeId, Optimizer, Place, Plan, ALIGN,
};

static WORST: Mutex<f64> = Mutex::new(1.0);

fn check_plan(g: &common::RandomGraph) -> Result<(), TestCaseError> {
    let plan = Plan::new(g).unwrap();
    let slots = plan.slots();
    for (i, a) in slots.iter().enumerate() {
        prop_assert_eq!(a.offset % ALIGN, 0);
        if let Some(root) = a.view_of {
            // A view never copies: it is its root's bytes, kept live as long as it is read.
            let r = slots[root.index()];
            prop_assert_eq!(a.bytes, 0);
            prop_assert_eq!((a.place, a.offset), (r.place, r.offset));
            prop_assert!(r.view_of.is_none());
            prop_assert!(r.first <= a.first && a.last <= r.last);
            prop_assert_eq!(g.nodes()[i].bytes(), g.nodes()[root.index()].bytes());
        } else if a.place == Place::Arena {
            prop_assert!(a.offset + a.bytes <= plan.arena_bytes());
            prop_assert!(a.bytes >= g.nodes()[i].bytes());
        }
        for (j, b) in slots.iter().enumerate().skip(i + 1) {
            if a.place == Place::Arena && a.overlaps_in_time(b) {
                prop_assert!(
                    !a.overlaps_in_space(b),
                    "`{}` {:?} and `{}` {:?} are live together and overlap",
                    g.nodes()[i].name(),
                    a,
                    g.nodes()[j].name(),
                    b
                );
            }
            if a.place == Place::State && b.place == Place::State {
                prop_assert!(!a.overlaps_in_space(b));
            }
        }
    }
    prop_assert!(plan.arena_bytes() >= plan.peak_live_bytes());
    if plan.peak_live_bytes() > 0 {
        let ratio = plan.arena_bytes() as f64 / plan.peak_live_bytes() as f64;
        let mut w = WORST.lock().unwrap();
        if ratio > *w {
            *w = ratio;
            eprintln!(
                "worst arena / peak-live ratio so far: {ratio:.3} ({} nodes)",
                g.len()
            );
        }
    }
    Ok(())
}

/// Runs a plan and returns every output's bytes.
fn outputs(g: &common::RandomGraph, train: bool) -> Vec<Vec<u8>> {
    let plan = Plan::new(g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let mut state = vec![0u8; plan.state_bytes()];
    plan.init_state(&mut state, 9).unwrap();
    let n = g.node(g.find("x").unwrap()).shape().elements();
    plan.fill_input("x", &mut arena, n, |i| (i as f32 * 0.37).sin())
        .unwrap();
    if train {
        plan.train_step(&mut arena, &mut state).unwrap();
        plan.train_step(&mut arena, &mut state).unwrap();
    } else {
        plan.infer(&mut arena, &state).unwrap();
    }
    let mut out: Vec<Vec<u8>> = g
        .ids()
        .filter(|&id| {
            g.node(id).roles().contains(tessera::core::Roles::OUTPUT)
                && !g.node(id).op().is_update()
        })
        .map(|id| plan.tensor(id, &arena, &state).unwrap().bytes().to_vec())
        .collect();
    out.push(state[..plan.state_bytes()].to_vec());
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn live_tensors_never_overlap(rows in 1usize..5, cols in 1usize..6, s in steps(), train in any::<bool>()) {
        if let Some(g) = build(rows, cols, &s, train) {
            check_plan(&g)?;
        }
    }

    #[test]
    fn reusing_memory_does_not_change_results(rows in 1usize..4, cols in 1usize..5, s in steps(), train in any::<bool>()) {
        if let Some(g) = build(rows, cols, &s, train) {
            // The same graph with every tensor an output: nothing is reused.
            let mut all = g.clone();
            let ids: Vec<NodeId> = all.ids().collect();
            for id in ids {
                all.mark_output(id).unwrap();
            }
            let reused = outputs(&g, train);
            let spread = Plan::new(&all).unwrap();
            // Longer lifetimes can only raise the peak (a greedy layout's size need not follow).
            prop_assert!(spread.peak_live_bytes() >= Plan::new(&g).unwrap().peak_live_bytes());
            let fresh = outputs(&all, train);
            // Outputs of `g` are a subset of those of `all`, in the same order; compare by name.
            let is_out = |n: &&tessera::core::Node| n.roles().contains(tessera::core::Roles::OUTPUT) && !n.op().is_update();
            let names_g: Vec<&str> = g.nodes().iter().filter(is_out).map(|n| n.name()).collect();
            let names_all: Vec<&str> = all.nodes().iter().filter(is_out).map(|n| n.name()).collect();
            for (k, name) in names_g.iter().enumerate() {
                let j = names_all.iter().position(|n| n == name).unwrap();
                prop_assert_eq!(&reused[k], &fresh[j], "output `{}` differs", name);
            }
            prop_assert_eq!(reused.last(), fresh.last(), "final state differs");
        }
    }
}

#[test]
fn classifier_arenas_are_close_to_peak_live() {
    for dtype in [DType::F32, DType::F16] {
        for train in [false, true] {
            let mut g: Graph<Fixed<160>> = Graph::new();
            let m = mnist_mlp(&mut g, 32, dtype).unwrap();
            if train {
                let labels = g.input("labels", &[32], DType::I32).unwrap();
                let loss = g
                    .sparse_categorical_crossentropy("loss", m.probabilities, labels, false)
                    .unwrap();
                g.differentiate(loss, Optimizer::momentum(0.1, 0.9))
                    .unwrap();
            }
            let plan = Plan::new(&g).unwrap();
            let ratio = plan.arena_bytes() as f64 / plan.peak_live_bytes() as f64;
            eprintln!(
                "classifier {dtype} {}: arena {} bytes, peak live {} bytes, ratio {ratio:.3}",
                if train { "training" } else { "inference" },
                plan.arena_bytes(),
                plan.peak_live_bytes()
            );
            assert!((1.0..=1.25).contains(&ratio), "ratio {ratio}");
        }
    }
}
