//! tessera-sim: the machine.
//!
//! This crate models Graphcore IPU hardware so that a compiled Tessera graph can be checked
//! and costed before any hardware is involved: how many tiles and how much SRAM a chip has,
//! how fast it is clocked, how long a bulk-synchronous superstep (compute, sync, exchange)
//! takes, and what each vertex costs in tile cycles.
//!
//! The principle: the sim is pure machinery. It never parses files, never prints and never
//! talks to a user; the `host` crate owns formats and terminals. Everything here is a value
//! (a machine description) or a pure function of values (a cost), so the same inputs always
//! give the same cycle counts.
//!
//! Every hardware figure is a published Graphcore figure, arithmetic on one, or a documented
//! estimate; see [`machine::IpuConfig::preset`].
//!
//! ```
//! use tessera_sim::machine::{IpuConfig, Preset};
//!
//! let mk2 = IpuConfig::preset(Preset::Mk2);
//! mk2.validate().unwrap();
//! // tiles x clock x AMP MACs x 2 reproduces the vendor's 250 TFLOP/s fp16 peak.
//! assert!((mk2.peak_flops_fp16() / 250e12 - 1.0).abs() < 0.01);
//! ```

// Unsafe code is denied except for switching the core's matmul to AVX2 or AVX-512 and FMA
// after detecting them (`use_fast_kernels`).
#![deny(unsafe_code)]
#![deny(missing_docs)]
// The core's run errors carry the offending node's name inline (it has no heap to box it in),
// which makes them larger than clippy's default threshold; they are off the hot path.
#![allow(clippy::result_large_err)]

pub mod cache;
pub mod check;
pub mod collective;
pub mod cost;
pub mod estimate;
mod exchange;
pub mod heap;
pub mod lower;
pub mod machine;
pub mod memory;
pub mod op_estimates;
pub mod pipeline;
pub mod planner;
pub mod pod;
pub mod program;
pub mod runner;
pub mod system;
pub mod techniques;
pub mod threads;

pub use cost::{Codelets, UnaryKind};
pub use estimate::{estimate, estimate_only, Estimate, IpuEstimateOptions, SimError};
pub use heap::{Heap, HEAP_CAPACITY};
pub use machine::{IpuConfig, MachineError, Preset, SystemConfig, UnknownPreset};

/// Lets the core's `f32` matmul use AVX-512 or AVX2 vectors and fused multiply-adds when this
/// CPU has them (detected here, at run time); returns whether it does. Steps run 2-4x faster.
/// Results are the same bit for bit on every CPU that takes the fast path, however many
/// threads run it; they differ in the last bits from the portable kernels' (a fused
/// multiply-add rounds once where a multiply and an add round twice; see
/// `tessera_core::kernels::wide`). The switch is process-wide and stays on: products computed
/// before the first call ran the portable kernels.
pub fn use_fast_kernels() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if !std::is_x86_feature_detected!("fma") {
            return false;
        }
        if std::is_x86_feature_detected!("avx512f") {
            #[allow(unsafe_code)]
            // SAFETY: AVX-512F and FMA were just detected on this CPU.
            unsafe {
                tessera_core::kernels::wide::use_avx512();
            }
            return true;
        }
        if std::is_x86_feature_detected!("avx2") {
            // Measured need: the classifier's training step runs 2-3x faster.
            #[allow(unsafe_code)]
            // SAFETY: AVX2 and FMA were just detected on this CPU.
            unsafe {
                tessera_core::kernels::wide::use_avx2();
            }
            return true;
        }
    }
    false
}
