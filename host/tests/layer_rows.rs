//! Per-layer rows: each backward compute set counts in the row of the layer whose gradient
//! rule made it, so a row's backward is its own gradient's work.

use std::path::PathBuf;

use tessera_host::estimation::{estimate, EstimateOptions, ModelSource};

fn rows(path: PathBuf) -> Vec<tessera_host::summary::LayerRow> {
    let e = estimate(&ModelSource::OnnxFile(path), &EstimateOptions::default()).expect("estimates");
    e.layers().to_vec()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn an_elementwise_layer_s_backward_is_of_its_own_size() {
    let rows = rows(root().join("tests/fixtures/onnx/cnn.onnx"));
    let relus: Vec<_> = rows.iter().filter(|r| r.op == "Relu").collect();
    assert!(!relus.is_empty());
    for r in relus {
        // dx = dy where x > 0: a pass over the layer's own elements. The input gradient of
        // the convolution after it (named after the ReLU's output) is the convolution's.
        assert!(
            r.backward_cycles <= 3 * r.forward_cycles,
            "{}: forward {} backward {}",
            r.name,
            r.forward_cycles,
            r.backward_cycles
        );
    }
    // A sum passes its gradient through: nothing of its own.
    let add = rows.iter().find(|r| r.op == "Add").unwrap();
    assert_eq!(add.backward_cycles, 0, "{}", add.name);
}

#[test]
fn a_shared_weight_s_gradient_counts_where_each_reader_makes_its_share() {
    // The exporter deduplicated the LayerNorms' identical initializers: one bias reads in 22
    // nodes. Each LayerNorm's row holds its own share of that gradient, not the first all of
    // them.
    let rows = rows(root().join("data/onnx/bert_tiny.stripped.onnx"));
    let norms: Vec<u64> = rows
        .iter()
        .filter(|r| r.op == "LayerNormalization")
        .map(|r| r.backward_cycles)
        .collect();
    assert!(norms.len() >= 6, "{norms:?}");
    let (lo, hi) = (norms.iter().min().unwrap(), norms.iter().max().unwrap());
    assert!(*hi <= lo + lo / 2, "{norms:?}");
}

#[test]
fn a_row_s_backward_is_its_gradient_recomputation_exchanges_and_updates() {
    let o = EstimateOptions {
        recompute_checkpoints: vec!["relu1/Relu".into()],
        gradient_accumulation_count: Some(2),
        ..EstimateOptions::default()
    };
    let path = root().join("tests/fixtures/onnx/cnn.onnx");
    let e = estimate(&ModelSource::OnnxFile(path), &o).expect("estimates");
    let rows = e.layers();
    for r in rows {
        let parts = r.backward_gradient_cycles
            + r.backward_recompute_cycles
            + r.backward_exchange_cycles
            + r.backward_update_cycles;
        assert_eq!(parts, r.backward_cycles, "{}", r.name);
    }
    // Something is recomputed, a trained layer accumulates its weights' gradients.
    assert!(rows.iter().any(|r| r.backward_recompute_cycles > 0));
    let conv = rows.iter().find(|r| r.op == "Conv").unwrap();
    assert!(conv.backward_update_cycles > 0, "{}", conv.name);
    assert!(conv.backward_gradient_cycles > 0, "{}", conv.name);
}

#[test]
fn inference_text_speaks_of_steps_and_has_no_backward_columns() {
    let source = ModelSource::OnnxFile(root().join("tests/fixtures/onnx/cnn.onnx"));
    let o = EstimateOptions {
        inference: true,
        ..EstimateOptions::default()
    };
    let header = |t: &str| {
        t.lines()
            .find(|l| l.contains("forward") && l.contains("weights"))
            .map(str::to_string)
            .expect("a layer table")
    };
    let text = estimate(&source, &o).expect("estimates").to_text(false);
    for absent in ["bwd cyc", "weight update", "stash bytes", "all_reduce"] {
        assert!(!text.contains(absent), "`{absent}` in:\n{text}");
    }
    assert!(!header(&text).contains("backward"), "{text}");
    for present in ["cycles per step", "per step,", "samples/s", "fwd cyc"] {
        assert!(text.contains(present), "no `{present}` in:\n{text}");
    }
    // Training keeps them.
    let text = estimate(&source, &EstimateOptions::default())
        .expect("estimates")
        .to_text(false);
    for present in ["bwd cyc", "cycles per weight update"] {
        assert!(text.contains(present), "no `{present}` in:\n{text}");
    }
    assert!(header(&text).contains("backward"), "{text}");
}

/// An `If` decided at run time holds both branches, and its row counts the dearer branch's
/// cycles, which the estimate names; an `If` on a constant is its taken branch, no choice.
#[test]
fn a_run_time_if_counts_its_dearer_branch_and_says_which() {
    let source = ModelSource::OnnxFile(root().join("tests/fixtures/onnx/control_flow.onnx"));
    let o = EstimateOptions {
        inference: true,
        ..EstimateOptions::default()
    };
    let e = estimate(&source, &o).expect("estimates");
    let c = &e.estimate.conditionals;
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].name, "branch/If");
    // Then `x * 2` against else `x - 1`: one element-wise pass each, priced alike or not,
    // the assumed one is the dearer.
    let (then, other) = (c[0].then_cycles, c[0].else_cycles);
    let assumed = then.max(other);
    assert_eq!(c[0].assumed, if then >= other { "then" } else { "else" });
    let row = e.layers().iter().find(|r| r.name == "branch/If").unwrap();
    assert!(row.forward_cycles >= assumed, "{row:?}");
    let text = e.to_text(false);
    assert!(
        text.contains(&format!(
            "`branch/If` is an If decided at run time: memory holds both branches, cycles assume its {} branch",
            c[0].assumed
        )),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&e.to_json().unwrap()).unwrap();
    assert_eq!(json["onnx"]["conditionals"][0]["assumed"], c[0].assumed);
}
