//! Replicated tensor sharding of optimizer state kept on the tiles (PopART's
//! `replicatedTensorSharding` with the state on chip, as Graphcore's BERT SQuAD fine-tuning
//! ran Adam): each replica holds a quarter of the state of 4 replicas.

use std::path::PathBuf;

use tessera_host::estimation::{estimate, EstimateOptions, ModelSource};

fn options(sharded: bool) -> EstimateOptions {
    let mut o: EstimateOptions = toml::from_str(
        r#"
        replicas = 4
        optimizer = "adam"
        offload_optimizer_state = false
        no_search = true
        "#,
    )
    .expect("options");
    o.replicated_tensor_sharding = Some(sharded);
    o
}

#[test]
fn sharded_state_on_the_tiles_takes_a_replicas_share_of_the_state() {
    let bert = ModelSource::OnnxFile(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/onnx/bert_tiny.stripped.onnx"),
    );
    let whole = estimate(&bert, &options(false)).expect("estimates");
    let sharded = estimate(&bert, &options(true)).expect("estimates");
    assert!(whole.summary.fits && sharded.summary.fits);
    let live =
        |e: &tessera_host::estimation::Estimation| e.summary.ipus[0].categories["always_live"];
    // Adam's two fp32 moments of every parameter; the shard keeps a quarter of those of the
    // variables of 8,192 elements or more (nearly all of BERT's parameters), rounded up on
    // each tile.
    let state = 2 * 4 * whole.onnx.as_ref().expect("an ONNX file").parameters;
    let saved = live(&whole) - live(&sharded);
    let share = saved as f64 / state as f64;
    assert!(
        (0.70..=0.76).contains(&share),
        "saved {saved} of {state} bytes of state"
    );
}
