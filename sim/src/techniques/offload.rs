//! Offloading to streaming memory (remote buffers): TensorFlow's pipelining options
//! `offload_weight_update_variables`, `offload_activations` and
//! `offload_gradient_accumulation_buffers`, PopART's `optimizerStateTensorLocationSettings`.
//! An offloaded tensor holds streaming memory instead of tile memory, and costs the
//! remote-buffer copies that bring it onto its tiles and store it back.

use crate::machine::IpuConfig;

/// What is kept in streaming memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offload {
    /// Optimizer state (momentum, Adam's moments): loaded onto its tiles for the weight
    /// update and stored back after it.
    pub optimizer_state: bool,
    /// The pipeline stash: each stashed activation is stored after its forward pass and
    /// loaded before its backward pass, and holds no tile memory in between.
    pub activations: bool,
    /// The gradient accumulators: each op that reads one loads it before and stores it after,
    /// and it holds tile memory only while its accumulation runs (not sharded by replicated
    /// tensor sharding).
    pub gradient_accumulators: bool,
}

/// TensorFlow's default for `offload_weight_update_variables`: on for pipelined models
/// (`stages > 1`) and for gradient accumulation (`accumulation > 1`), when the machine has
/// remote buffers (streaming memory).
pub fn default_optimizer_state(stages: usize, accumulation: usize, machine: &IpuConfig) -> bool {
    (stages > 1 || accumulation > 1) && machine.streaming_memory_bytes > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Preset;

    #[test]
    fn pipelines_and_accumulation_offload_where_there_is_streaming_memory() {
        let mk2 = IpuConfig::preset(Preset::Mk2);
        assert!(default_optimizer_state(2, 1, &mk2));
        assert!(default_optimizer_state(1, 4, &mk2));
        assert!(!default_optimizer_state(1, 1, &mk2));
        let none = IpuConfig {
            streaming_memory_bytes: 0,
            ..mk2
        };
        assert!(!default_optimizer_state(2, 4, &none));
    }
}
