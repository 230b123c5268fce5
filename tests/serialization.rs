//! Embedding serialization (`LowerOptions::embedding_serialization`, PopTorch's
//! `embedding_serialization_factor`): the products over the vocabulary run in serial pieces,
//! each bringing and making its share, so their temporary bytes divide.

use tessera::core::{DType, Graph, Plan};
use tessera::sim::lower::{lower, LowerOptions};
use tessera::sim::program::{Program, Step};
use tessera::sim::{Heap, IpuConfig, Preset};

const VOCABULARY: usize = 8192;

/// A language-model head: token embeddings, and logits over the vocabulary by the table
/// transposed (tied weights, as BERT's masked-LM head).
fn head(g: &mut Graph<Heap>) {
    let tokens = g.input("tokens", &[16, 32], DType::I32).unwrap();
    let h = g
        .embedding("words", tokens, VOCABULARY, 256, DType::F16)
        .unwrap();
    let table = g.find("words/embeddings:0").unwrap();
    g.matmul_t("decoder", h, table, false, true).unwrap();
}

/// The lowered program and the most bytes of the embedding table one tile receives in one of
/// the decoder's exchanges.
fn decoder_exchange(serialization: u64) -> (Program, u64) {
    let mut g: Graph<Heap> = Graph::new();
    head(&mut g);
    let plan = Plan::new(&g).unwrap();
    let cfg = IpuConfig::preset(Preset::Mk2);
    let opts = LowerOptions {
        embedding_serialization: serialization,
        ..LowerOptions::default()
    };
    let program = lower(&plan, &cfg, opts);
    let i = program
        .node_names
        .iter()
        .position(|n| n == "decoder")
        .unwrap();
    let (a, b) = program.node_steps[i];
    let table = program
        .node_names
        .iter()
        .position(|n| n == "words/embeddings:0")
        .unwrap();
    let mut most = 0;
    for step in &program.steps[a..b] {
        if let Step::Exchange { transfers, .. } = step {
            let mut received = vec![0u64; cfg.tiles as usize];
            for t in transfers
                .iter()
                .filter(|t| t.region.tensor.index() == table)
            {
                let tensor = &program.tensors[t.region.tensor.index()];
                received[t.to.index()] += t.region.elements() * tensor.elem_bytes();
            }
            most = most.max(received.into_iter().max().unwrap_or(0));
        }
    }
    (program, most)
}

#[test]
fn serialization_divides_the_vocabulary_products_temporary_bytes() {
    let (_, whole) = decoder_exchange(1);
    let (program, serialized) = decoder_exchange(4);
    assert!(whole > 0);
    // Each of the four pieces brings its share of the table's columns (the other operand,
    // the hidden states, comes whole to every piece, as to every piece of PopART's serialized
    // matmul). Steps over the columns need the reduction unsplit across tiles, so the
    // serialized plan's grid is narrower than the whole product's, which split it: the bytes
    // at once fall by less than four, here by about two.
    assert!(
        serialized * 3 <= whole * 2,
        "a tile receives {serialized} B of the table at once serialized, {whole} B whole"
    );
    // Four serial pieces: at least four exchanges for the decoder.
    let i = program
        .node_names
        .iter()
        .position(|n| n == "decoder")
        .unwrap();
    let (a, b) = program.node_steps[i];
    let exchanges = program.steps[a..b]
        .iter()
        .filter(|s| matches!(s, Step::Exchange { .. }))
        .count();
    assert!(exchanges >= 4, "{exchanges} exchanges");
}

#[test]
fn serialization_leaves_other_products_alone() {
    // Without a gathered table nothing is over a vocabulary: the same program.
    let build = |serialization| {
        let mut g: Graph<Heap> = Graph::new();
        let x = g.input("x", &[64, 256], DType::F16).unwrap();
        let w = g
            .variable("w", &[256, 512], DType::F16, tessera::core::Init::Zeros)
            .unwrap();
        g.matmul("y", x, w).unwrap();
        let plan = Plan::new(&g).unwrap();
        let opts = LowerOptions {
            embedding_serialization: serialization,
            ..LowerOptions::default()
        };
        lower(&plan, &IpuConfig::preset(Preset::Mk2), opts).steps
    };
    assert_eq!(build(1), build(4));
}
