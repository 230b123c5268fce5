//! The end-to-end and property tests, one module a file, linked into one test binary.
//! This root is not named `main.rs`: proptest keeps a test file's failing cases beside it
//! (`FILE.proptest-regressions`) only when no `main.rs` or `lib.rs` sits in its folder.
//! One file's tests run with `cargo test --test integration FILE::` (e.g. `accumulation::`).

mod common;

mod accumulation;
mod autodiff;
mod bert;
mod build_errors;
mod concurrent_stages;
mod distributed_norm;
mod docs;
mod f16;
mod firmware;
mod gradients;
mod kernel_paths;
mod kernels;
mod lowering_cache;
mod offload;
mod op_fixtures;
mod optimizers;
mod outlining;
mod pipeline_numerics;
mod pipeline_timeline;
mod pipelined_classifier;
mod plan;
mod pod_network;
mod recompute;
mod schedule;
mod serialization;
mod sim_classifier;
mod sim_costs;
mod sim_props;
mod stage_memory;
mod threads;
