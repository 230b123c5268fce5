//! The memory techniques an estimate applies: what Poplar, PopART, PopTorch and TensorFlow's
//! IPU pipelining let a user trade for memory or time. [`Techniques`] holds one field per
//! technique; each technique's meaning, default rule and checks are in its module here, and
//! what one IPU's lowering reads of them is [`Techniques::lower_options`].
//!
//! | technique | field | module | where it acts |
//! |---|---|---|---|
//! | `availableMemoryProportion` | [`Techniques::available_memory_proportion`] | [`proportion`] | the planner (`crate::planner`) |
//! | `partialsType` | [`Techniques::partials`] | [`crate::planner`] | the planner |
//! | recomputation | [`Techniques::recompute`] | [`recompute`] | the stash (`crate::system`), the graph (core's autodiff) |
//! | offloading to streaming memory | [`Techniques::offload`] | [`offload`] | the lowering's state, the stash |
//! | replicated tensor sharding | [`Techniques::replicated_tensor_sharding`] | [`sharding`] | the update's lowering, the all-reduce |
//! | outlining | [`Techniques::outlining`] | `crate::lower` (`outline`) | the program's code |
//! | embedding serialization | [`Techniques::embedding_serialization`] | [`serialization`] | the planner |
//! | inference rewrites | [`Techniques::inference_rewrites`] | host's ONNX import (`rewrite`) | the inference graph |
//! | distributed batch norm | [`Techniques::distributed_batch_norm`] | [`distributed_norm`] | the norms' lowering (`crate::lower`) |

pub mod distributed_norm;
pub mod offload;
pub mod proportion;
pub mod recompute;
pub mod serialization;
pub mod sharding;

use crate::lower::LowerOptions;
use crate::planner::{PartialsType, PlanOptions};

pub use offload::Offload;
pub use proportion::MemoryProportion;
pub use recompute::{Checkpoints, Recompute};

/// Every memory technique of an estimate, one field each, resolved: defaults applied, values
/// checked by their modules.
#[derive(Clone, Debug, PartialEq)]
pub struct Techniques {
    /// poplin's `availableMemoryProportion`, for every stage or one per stage.
    pub available_memory_proportion: MemoryProportion,
    /// poplin's `partialsType` for matmuls and convolutions.
    pub partials: PartialsType,
    /// Recomputation: of each stage's forward pass, or from checkpoints.
    pub recompute: Recompute,
    /// What is kept in streaming memory (remote buffers) instead of on the tiles.
    pub offload: Offload,
    /// Replicated tensor sharding of the optimizer state and its update over the replicas
    /// (see [`sharding`]).
    pub replicated_tensor_sharding: bool,
    /// Outlining (code reuse, Poplar functions; PopART's `enableOutlining`, on by default):
    /// identical nodes share one copy of their code and each call copies its tensors in and
    /// out.
    pub outlining: bool,
    /// Embedding serialization: the products over the vocabulary in this many serial pieces
    /// (see [`serialization`]; 1: none).
    pub embedding_serialization: u64,
    /// The graph rewrites inference compilers make (PopRT's and onnxruntime's graph
    /// optimisers; on by default): a batch norm folded into the convolution before it. The
    /// ONNX import applies them to inference graphs.
    pub inference_rewrites: bool,
    /// Distributed batch norm: the replicas in each group whose batch norms sum their
    /// statistics (see [`distributed_norm`]; 1: none).
    pub distributed_batch_norm: usize,
}

impl Default for Techniques {
    /// None of them but outlining, which Poplar, PopART and TensorFlow turn on by default,
    /// and the inference rewrites, which inference compilers make by default.
    fn default() -> Self {
        Techniques {
            available_memory_proportion: MemoryProportion::default(),
            partials: PartialsType::Float,
            recompute: Recompute::default(),
            offload: Offload::default(),
            replicated_tensor_sharding: false,
            outlining: true,
            embedding_serialization: 1,
            inference_rewrites: true,
            distributed_batch_norm: 1,
        }
    }
}

impl Techniques {
    /// What a lowering reads of these techniques on a system of `replicas` replicas (of one IPU
    /// each: a system of several IPUs a replica sets [`LowerOptions::partition_ipus`] itself),
    /// for products planned with available memory proportion `proportion`.
    pub fn lower_options(&self, replicas: usize, proportion: f64) -> LowerOptions {
        LowerOptions {
            offload_optimizer_state: self.offload.optimizer_state,
            plan: PlanOptions {
                available_memory_proportion: proportion,
                partials: self.partials,
                ..PlanOptions::default()
            },
            replicated_tensor_sharding: sharding::shards(self.replicated_tensor_sharding, replicas),
            outlining: self.outlining,
            embedding_serialization: self.embedding_serialization,
            offload_accumulators: self.offload.gradient_accumulators,
            distributed_batch_norm: self.distributed_batch_norm as u32,
            partition_ipus: replicas as u32,
            ..LowerOptions::default()
        }
    }

    /// The techniques of an inference run: it keeps no optimizer state and stashes nothing,
    /// so neither is offloaded.
    pub fn for_inference(&self) -> Techniques {
        Techniques {
            offload: Offload {
                optimizer_state: false,
                activations: false,
                ..self.offload
            },
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowering_reads_each_technique() {
        let t = Techniques {
            partials: PartialsType::Half,
            offload: Offload {
                optimizer_state: true,
                activations: true,
                gradient_accumulators: true,
            },
            replicated_tensor_sharding: true,
            outlining: false,
            embedding_serialization: 4,
            distributed_batch_norm: 2,
            ..Techniques::default()
        };
        let l = t.lower_options(8, 0.3);
        assert_eq!((l.distributed_batch_norm, l.partition_ipus), (2, 8));
        assert_eq!(l.plan.available_memory_proportion, 0.3);
        assert_eq!(l.plan.partials, PartialsType::Half);
        assert!(l.offload_optimizer_state && l.offload_accumulators);
        assert_eq!(l.replicated_tensor_sharding, 8);
        assert!(!l.outlining);
        assert_eq!(l.embedding_serialization, 4);
        assert_eq!(l.min_chunk_bytes, LowerOptions::default().min_chunk_bytes);
    }

    #[test]
    fn inference_offloads_neither_state_nor_stash() {
        let t = Techniques {
            offload: Offload {
                optimizer_state: true,
                activations: true,
                gradient_accumulators: true,
            },
            ..Techniques::default()
        };
        let i = t.for_inference();
        assert!(!i.offload.optimizer_state && !i.offload.activations);
        assert!(i.offload.gradient_accumulators);
        assert_eq!(
            Techniques {
                offload: i.offload,
                ..t
            },
            i
        );
    }
}
