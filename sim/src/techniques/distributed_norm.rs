//! Distributed batch norm (TensorFlow's `IPUConfig.norms.experimental.
//! distributed_batch_norm_replica_group_size`; the `BN_span` of Graphcore's MLPerf ResNet-50):
//! each batch norm's statistics, and in the backward pass their gradients, are summed over
//! groups of consecutive replicas, so a norm sees the batch of the whole group. TensorFlow's
//! norms do it with `popnn::bn::distributedBatchNormStatistics` and
//! `distributedBatchNormGradients`, whose reduce callback is a GCL all-reduce over
//! `CommGroupType::CONSECUTIVE` groups (graphcore/tensorflow `popnn/norm.cc`,
//! `GetDistributedNormReduceCallback`). The lowering adds that all-reduce after each batch
//! statistics' reduction ([`crate::collective::group_all_reduce_cycles`]).

/// Checks a group size against the replicas: at least 1 (1: each replica alone), and a divisor
/// of the replicas, as the groups are consecutive replicas.
///
/// # Errors
///
/// A message naming the value and the replicas.
pub fn check(group: usize, replicas: usize) -> Result<(), String> {
    if group == 0 {
        return Err("0 replicas in a group; it must be at least 1".to_string());
    }
    if replicas % group != 0 {
        return Err(format!(
            "groups of {group} replicas do not divide the {replicas} replica(s)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_divide_the_replicas() {
        assert!(check(1, 1).is_ok());
        assert!(check(2, 16).is_ok());
        assert_eq!(
            check(3, 16).unwrap_err(),
            "groups of 3 replicas do not divide the 16 replica(s)"
        );
        assert!(check(0, 4).unwrap_err().contains("at least 1"));
        assert!(check(4, 2).is_err());
    }
}
