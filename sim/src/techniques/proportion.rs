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
