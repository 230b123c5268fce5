//! Tessera: know, before any hardware is touched, how a neural network runs on a tile-based,
//! SRAM-only, bulk-synchronous accelerator - and run the same static graphs on a microcontroller.
//!
//! This umbrella package re-exports the workspace crates and holds the file formats that the
//! examples need until the host crate takes them over.
#![deny(unsafe_code)]
#![deny(missing_docs)]

pub use tessera_core as core;
pub use tessera_sim as sim;

pub mod idx;
