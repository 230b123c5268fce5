//! The end-to-end and property tests, one module a file, linked into one test binary.
//! This root is not named `main.rs`: proptest keeps a test file's failing cases beside it
//! (`FILE.proptest-regressions`) only when no `main.rs` or `lib.rs` sits in its folder.
//! One file's tests run with `cargo test --test host FILE::` (e.g. `cli::`).

mod common;
mod mutate;

mod cli;
mod evaluate;
mod idx;
mod infeed;
mod inspect;
mod layer_rows;
mod long_sequences;
mod onnx_import;
mod onnx_mutations;
mod onnx_node_tests;
mod onnx_numerics;
mod option_limits;
mod outfeed;
mod python;
mod readme;
mod report;
mod sharded_state;
mod span_loss;
mod split;
mod stats;
mod sweep;
mod systems;
mod training;
