//! Recomputation: the backward pass recomputes forward activations instead of keeping them.
//!
//! - Of whole stages ([`Recompute::stages`]; TensorFlow's `RecomputationMode`, PopART's
//!   `RecomputationType::Pipeline`): each pipeline stage's forward pass runs again before its
//!   backward pass, so a stage stashes only its inputs (see `crate::system`'s stash).
//! - From checkpoints ([`Recompute::checkpoints`]; PopART's recomputation with checkpoints,
//!   TensorFlow's `recomputation_checkpoint`, PopTorch's `recomputationCheckpoint`): only the
//!   checkpoints are kept for the backward pass, and the rest recomputed from them segment by
//!   segment. This is a change of the training graph, made when it is differentiated
//!   (`tessera_core::Graph::differentiate_recomputing`); the plan the system estimates
//!   already holds it.

/// Which recomputation an estimate applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recompute {
    /// Each pipeline stage's forward pass recomputed before its backward pass.
    pub stages: bool,
    /// Recomputation from checkpoints (training), if asked.
    pub checkpoints: Option<Checkpoints>,
}

/// Recomputation checkpoints: which forward activations the backward pass keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checkpoints {
    /// At the output of each repeated block (`tessera_core::Graph::auto_checkpoints`), as
    /// PopTorch's `recompute_checkpoint_every_layer` does for a transformer's layers.
    Auto,
    /// The named nodes (graph nodes, or ONNX nodes: the last node of each).
    Named(Vec<String>),
}

impl Checkpoints {
    /// The checkpoints a user's list of names stands for: none, `auto` alone, or node names.
    ///
    /// # Errors
    ///
    /// `auto` among names.
    pub fn from_names(names: &[String]) -> Result<Option<Checkpoints>, String> {
        match names {
            [] => Ok(None),
            [one] if one == "auto" => Ok(Some(Checkpoints::Auto)),
            names if names.iter().any(|n| n == "auto") => {
                Err("`auto` stands alone (or name the checkpoints)".into())
            }
            names => Ok(Some(Checkpoints::Named(names.to_vec()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_none_auto_or_the_named_nodes() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(Checkpoints::from_names(&[]), Ok(None));
        assert_eq!(
            Checkpoints::from_names(&names(&["auto"])),
            Ok(Some(Checkpoints::Auto))
        );
        assert_eq!(
            Checkpoints::from_names(&names(&["a", "b"])),
            Ok(Some(Checkpoints::Named(names(&["a", "b"]))))
        );
        assert!(Checkpoints::from_names(&names(&["a", "auto"])).is_err());
    }
}
