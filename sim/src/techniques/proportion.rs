//! poplin's `availableMemoryProportion`: the share of each tile that a matmul's or
//! convolution's temporary memory (operand copies, partial sums, serial accumulators) may
//! take in the planner's first pass. TensorFlow sets it per stage (`set_matmul_options` /
//! `set_convolution_options` in each stage's scope), PopART per IPU
//! (`availableMemoryProportion` in its session options), PopTorch per IPU
//! (`setAvailableMemoryProportion`): each IPU's products are planned with the proportion of
//! the first stage on it.

use crate::planner::{check_proportion, AVAILABLE_MEMORY_PROPORTION};

/// The proportion of every pipeline stage.
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryProportion {
    /// One proportion for every stage.
    All(f64),
    /// One proportion per pipeline stage, in stage order.
    PerStage(Vec<f64>),
}

impl Default for MemoryProportion {
    /// Poplar's default for every stage ([`AVAILABLE_MEMORY_PROPORTION`]).
    fn default() -> Self {
        MemoryProportion::All(AVAILABLE_MEMORY_PROPORTION)
    }
}

impl MemoryProportion {
    /// The proportion a user's list of values stands for: none is Poplar's default, one is
    /// every stage's, more are one per stage.
    pub fn from_values(values: &[f64]) -> MemoryProportion {
        match values {
            [] => MemoryProportion::default(),
            [one] => MemoryProportion::All(*one),
            many => MemoryProportion::PerStage(many.to_vec()),
        }
    }

    /// Whether one proportion holds for every stage.
    pub fn is_uniform(&self) -> bool {
        matches!(self, MemoryProportion::All(_))
    }

    /// The smallest proportion of any stage: the tightest bound, whose plans are the slowest
    /// (what a profile of a model not yet split into stages plans with).
    pub fn least(&self) -> f64 {
        match self {
            MemoryProportion::All(p) => *p,
            MemoryProportion::PerStage(v) => v.iter().copied().fold(f64::INFINITY, f64::min),
        }
    }

    /// How many stages the proportions are given for (`None`: one for every stage).
    pub fn stages(&self) -> Option<usize> {
        match self {
            MemoryProportion::All(_) => None,
            MemoryProportion::PerStage(v) => Some(v.len()),
        }
    }

    /// The proportions with one more stage, planned with stage `like`'s proportion (a stage
    /// the compiler adds, such as a tied output head beside its embedding).
    pub fn with_stage_like(&self, like: usize) -> MemoryProportion {
        match self {
            MemoryProportion::All(p) => MemoryProportion::All(*p),
            MemoryProportion::PerStage(v) => {
                let mut v = v.clone();
                if let Some(&p) = v.get(like) {
                    v.push(p);
                }
                MemoryProportion::PerStage(v)
            }
        }
    }

    /// Each IPU's proportion: that of the first stage on it, for `mapping` (stage -> IPU) onto
    /// `ipus` IPUs. An IPU without a stage takes Poplar's default.
    ///
    /// # Errors
    ///
    /// A message naming the value at fault: a proportion outside `(0, 1]` (poplin refuses
    /// values outside `[0, 1]`, and 0 leaves no plan), or a count of per-stage values other
    /// than the stages'.
    pub fn per_ipu(&self, mapping: &[usize], ipus: usize) -> Result<Vec<f64>, String> {
        let check = |p: f64| {
            check_proportion(p).map_err(|e| {
                format!("available memory proportion {e}: it is the share of each tile a product's temporary memory may take")
            })
        };
        match self {
            MemoryProportion::All(p) => {
                check(*p)?;
                Ok(vec![*p; ipus])
            }
            MemoryProportion::PerStage(v) => {
                if v.len() != mapping.len() {
                    return Err(format!(
                        "{} values given for {} pipeline stages (give one, or one per stage)",
                        v.len(),
                        mapping.len()
                    ));
                }
                let mut out: Vec<Option<f64>> = vec![None; ipus];
                for (stage, (&d, &p)) in mapping.iter().zip(v).enumerate() {
                    check(p).map_err(|e| format!("stage {stage}: {e}"))?;
                    out[d].get_or_insert(p);
                }
                Ok(out
                    .into_iter()
                    .map(|p| p.unwrap_or(AVAILABLE_MEMORY_PROPORTION))
                    .collect())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn values_read_as_none_one_or_one_per_stage() {
        assert_eq!(
            MemoryProportion::from_values(&[]),
            MemoryProportion::All(AVAILABLE_MEMORY_PROPORTION)
        );
        assert_eq!(
            MemoryProportion::from_values(&[0.3]),
            MemoryProportion::All(0.3)
        );
        let per = MemoryProportion::from_values(&[0.3, 0.5]);
        assert_eq!(per, MemoryProportion::PerStage(vec![0.3, 0.5]));
        assert_eq!(
            (per.stages(), per.least(), per.is_uniform()),
            (Some(2), 0.3, false)
        );
    }

    #[test]
    fn bad_values_and_counts_are_named() {
        let e = MemoryProportion::All(1.5).per_ipu(&[0], 1).unwrap_err();
        assert!(
            e.starts_with("available memory proportion 1.5 is not in (0, 1]"),
            "{e}"
        );
        let e = MemoryProportion::PerStage(vec![0.5, 0.0])
            .per_ipu(&[0, 1], 2)
            .unwrap_err();
        assert!(
            e.starts_with("stage 1: available memory proportion 0"),
            "{e}"
        );
        let e = MemoryProportion::PerStage(vec![0.5])
            .per_ipu(&[0, 1], 2)
            .unwrap_err();
        assert_eq!(
            e,
            "1 values given for 2 pipeline stages (give one, or one per stage)"
        );
    }

    #[test]
    fn an_added_stage_takes_its_neighbours_proportion() {
        let per = MemoryProportion::PerStage(vec![0.2, 0.4]);
        assert_eq!(
            per.with_stage_like(0),
            MemoryProportion::PerStage(vec![0.2, 0.4, 0.2])
        );
        let all = MemoryProportion::All(0.3);
        assert_eq!(all.with_stage_like(0), all);
    }

    proptest! {
        /// Each IPU plans with the proportion of the first stage on it; one proportion for all
        /// stages is every IPU's.
        #[test]
        fn each_ipu_takes_its_first_stages_proportion(
            stages in proptest::collection::vec((0usize..4, 1u32..=100), 1..8),
        ) {
            let mapping: Vec<usize> = stages.iter().map(|s| s.0).collect();
            let values: Vec<f64> = stages.iter().map(|s| f64::from(s.1) / 100.0).collect();
            let ipus = 4;
            let got = MemoryProportion::PerStage(values.clone()).per_ipu(&mapping, ipus).unwrap();
            prop_assert_eq!(got.len(), ipus);
            for (d, &p) in got.iter().enumerate() {
                let first = mapping.iter().position(|&m| m == d);
                prop_assert_eq!(p, first.map_or(AVAILABLE_MEMORY_PROPORTION, |k| values[k]));
            }
            let uniform = MemoryProportion::All(values[0]).per_ipu(&mapping, ipus).unwrap();
            prop_assert!(uniform.iter().all(|&p| p == values[0]));
        }
    }
}
