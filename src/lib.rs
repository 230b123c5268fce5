//! Tessera: know, before any hardware is touched, how a neural network runs on a tile-based,
//! SRAM-only, bulk-synchronous accelerator - and run the same static graphs on a microcontroller.
//!
//! This umbrella package re-exports the workspace crates (`core`, `sim`, `host`) and owns the
//! end-to-end tests and benchmarks.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub use tessera_core as core;
pub use tessera_host as host;
pub use tessera_sim as sim;

pub use tessera_host::idx;
