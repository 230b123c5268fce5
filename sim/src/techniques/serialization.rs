//! Embedding serialization (PopTorch's `embedding_serialization_factor`, PopART's
//! `serializeMatMul`): the products over the vocabulary (the rows of the largest gathered
//! table: a language model's output projection and its gradients) run in N serial pieces,
//! each bringing and making its share, so their temporary memory is about 1/N. The lowering
//! passes the factor and the vocabulary's length to the planner
//! ([`crate::planner::PlanOptions::serialization`]).

/// The most pieces the vocabulary products may be cut into.
pub const MAX_EMBEDDING_SERIALIZATION: u64 = 4096;

/// Checks a serialization factor: 1 (none) to [`MAX_EMBEDDING_SERIALIZATION`].
///
/// # Errors
///
/// A message naming the value.
pub fn check(factor: u64) -> Result<(), String> {
    if (1..=MAX_EMBEDDING_SERIALIZATION).contains(&factor) {
        Ok(())
    } else {
        Err(format!(
            "{factor} is not in 1..={MAX_EMBEDDING_SERIALIZATION}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_from_one_to_the_most_are_taken() {
        assert!(check(1).is_ok());
        assert!(check(MAX_EMBEDDING_SERIALIZATION).is_ok());
        assert_eq!(check(0).unwrap_err(), "0 is not in 1..=4096");
        assert!(check(MAX_EMBEDDING_SERIALIZATION + 1).is_err());
    }
}
