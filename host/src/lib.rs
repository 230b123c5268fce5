//! tessera-host: everything that talks to a user or a file.
//!
//! Datasets (IDX files, synthetic data) flow through an infeed queue that prefetches batches on
//! a background thread; outfeed queues carry tapped tensors and gradients back, drained by the
//! host (from another thread if it likes) and summarised by the tensor-inspection statistics.
//! The sim never parses files or prints; this crate does both.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod allocator;
pub mod calibration;
mod cli;
pub mod compile;
pub mod dataset;
pub mod estimation;
pub mod idx;
pub mod infeed;
pub mod inspect;
pub mod model;
pub mod names;
pub mod onnx;
pub mod outfeed;
pub mod output;
pub mod report;
pub mod session;
pub mod stats;
pub mod summary;
pub mod sweep;
pub mod tensor;
pub mod whole_models;

pub use cli::command;
