//! Replicated tensor sharding (TensorFlow's `replicated_optimizer_state_sharding`, PopART's
//! `replicatedTensorSharding`): each replica keeps, loads, stores and updates `1 / r` of the
//! optimizer state of every variable of at least [`RTS_MIN_ELEMENTS`] elements, offloaded or
//! on the tiles; the gradients' all-reduce becomes a reduce-scatter and an all-gather of the
//! weights.

/// The fewest elements of a variable whose optimizer state replicated tensor sharding shards:
/// PopART's `minElementsForReplicatedTensorSharding` default (`SessionOptions`, 8192).
pub const RTS_MIN_ELEMENTS: u64 = 8192;

/// TensorFlow's default for `replicated_optimizer_state_sharding`: the offload setting
/// (`create_resource_update` in `tensorflow/python/ipu/ops/op_util.py` takes the offload
/// three-state as its default), so offloaded state is sharded over the replicas
/// (`VariablesOffloadAndPartition`, over the local replicas: all of them in one process).
/// One replica has nothing to shard over.
pub fn default_on(offload_optimizer_state: bool, replicas: usize) -> bool {
    offload_optimizer_state && replicas > 1
}

/// The replicas the state is sharded over: all `replicas` when sharding is `on`, else 1.
pub fn shards(on: bool, replicas: usize) -> u32 {
    if on {
        u32::try_from(replicas).unwrap_or(u32::MAX)
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offloaded_state_is_sharded_over_several_replicas_by_default() {
        assert!(default_on(true, 4));
        assert!(!default_on(true, 1));
        assert!(!default_on(false, 4));
        assert_eq!(
            (shards(true, 4), shards(false, 4), shards(true, 1)),
            (4, 1, 1)
        );
    }
}
