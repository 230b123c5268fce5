//! BERT-Large at sequence length 384 as Graphcore pre-trained it (phase 2 on a Bow Pod16): it
//! fits, and IPU 0 (the embeddings, their gradients and the first layers) holds no more at
//! length 384 than at 128 with as many tokens a micro-batch: each table's gradient is planned
//! as poplibs plans `multiUpdateAdd`, so no tile receives every lookup of a row.

use std::path::PathBuf;

use tessera_host::estimation::{estimate, EstimateOptions, ModelSource};
use tessera_host::whole_models::WholeModels;

fn model(file: &str) -> ModelSource {
    ModelSource::OnnxFile(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../data/onnx")
            .join(file),
    )
}

/// The options of the calibration's run of Graphcore's configuration
/// (`data/calibration/whole_models.toml`), at micro-batch `mb`.
fn phase2(mb: usize) -> EstimateOptions {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("data/calibration/whole_models.toml"))
        .expect("the calibration's runs");
    let runs = WholeModels::parse(&text).expect("they parse");
    let run = runs
        .run
        .iter()
        .find(|r| r.name == "BERT-Large phase 2 SL384, Bow Pod16")
        .expect("the run");
    let mut o = run.config().estimate_options(true).expect("options");
    o.batch_size = Some(mb);
    o.no_search = true;
    o
}

#[test]
fn ipu_0_holds_no_more_at_length_384_than_at_128_with_as_many_tokens() {
    let long = estimate(&model("bert_large_qkv_384.stripped.onnx"), &phase2(2)).expect("estimates");
    let short = estimate(&model("bert_large_qkv.stripped.onnx"), &phase2(6)).expect("estimates");
    assert!(long.summary.fits, "{:?}", long.summary.out_of_memory);
    assert_eq!(long.summary.ipus.len(), 4);
    let (l0, s0) = (&long.summary.ipus[0], &short.summary.ipus[0]);
    assert!(
        l0.max_tile_bytes <= s0.max_tile_bytes,
        "IPU 0's fullest tile: {} bytes at 384 x 2, {} at 128 x 6",
        l0.max_tile_bytes,
        s0.max_tile_bytes
    );
    // Within 10% of the published 1,470 sequences/s.
    let ratio = long.summary.samples_per_second / 1470.0;
    assert!((0.9..=1.1).contains(&ratio), "{ratio}");
}
