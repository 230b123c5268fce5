//! The span (SQuAD) loss of ONNX BERT exports: two logits a position, the start's and the
//! end's cross-entropy over the sequence.

use std::path::PathBuf;

use tessera_host::estimation::{estimate, EstimateOptions, ModelSource};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn a_span_head_trains_a_bert_export_for_squad() {
    use tessera_host::compile::onnx::LossKind;
    let o = EstimateOptions {
        loss: Some(LossKind::Span),
        ..EstimateOptions::default()
    };
    let bert = root().join("data/onnx/bert_tiny.stripped.onnx");
    let e = estimate(&ModelSource::OnnxFile(bert), &o).expect("estimates");
    assert!(e.summary.fits && e.summary.cycles_per_step > 0);
    // Two logits a position, in place of the masked-LM head's projection onto the vocabulary.
    let mlm = EstimateOptions::default();
    let bert = root().join("data/onnx/bert_tiny.stripped.onnx");
    let with_mlm = estimate(&ModelSource::OnnxFile(bert), &mlm).expect("estimates");
    assert!(e.summary.cycles_per_step < with_mlm.summary.cycles_per_step);
    // A span needs positions: an output of [batch, classes] is refused, naming the output.
    let cnn = root().join("tests/fixtures/onnx/cnn.onnx");
    let err = estimate(&ModelSource::OnnxFile(cnn), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("span head needs a [batch, seq, hidden] output"),
        "{err}"
    );
    assert!(err.contains("`logits`"), "{err}");
}
