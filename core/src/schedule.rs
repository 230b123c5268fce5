//! Pipeline schedules as pure functions of (stages, accumulation count): which stage runs
//! which micro-batch at which step, as Graphcore's TensorFlow pipelining defines them.
//!
//! A pipeline of `S` stages has slots `F0 .. F(S-1)` (forward) and, when training, `B(S-1) ..
//! B0` (backward, each on its forward stage's IPU): slot `j < S` is `F_j`, slot `j >= S` is
//! `B_(2S-1-j)`. Micro-batch `b` runs slot `j` at step
//!
//! | schedule | step | overlap length `L` (training / inference) |
//! |---|---|---|
//! | Grouped | `b + j` | `2S` / `S` |
//! | Interleaved | `2b + j` | `S` |
//! | Sequential | `b * slots + j` | `1` |
//!
//! The accumulation count `M` (micro-batches per weight update) must be a multiple of `L` and
//! at least `L`. Forward stage `k` stashes activations for its backward: `2(S-1-k)`
//! micro-batches deep (Grouped), `S-1-k` (Interleaved) or none (Sequential).
//!
//! ```
//! use tessera_core::schedule::{Pipeline, Schedule, Slot};
//! let p = Pipeline::new(2, 4, Schedule::Grouped, true)?;
//! // Micro-batch 1's backward of stage 0 (the last slot) runs at step 1 + 3.
//! assert_eq!(p.step_of(1, Slot::Backward(0)), 4);
//! assert_eq!(p.stash_depth(0), 2);
//! assert_eq!(p.steps(), 4 + 3);
//! # Ok::<(), tessera_core::schedule::ScheduleError>(())
//! ```

use core::fmt;

/// How the stages of a pipeline overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Schedule {
    /// All forward and backward stages run every step, on successive micro-batches.
    Grouped,
    /// Forward and backward stages alternate: each IPU runs one stage per step.
    Interleaved,
    /// One stage at a time in the whole system (no overlap).
    Sequential,
}

impl Schedule {
    /// The name Graphcore's API uses.
    pub const fn name(self) -> &'static str {
        match self {
            Schedule::Grouped => "Grouped",
            Schedule::Interleaved => "Interleaved",
            Schedule::Sequential => "Sequential",
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whose rule the accumulation count of a pipeline must meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum AccumulationRule {
    /// TensorFlow's pipeline visitor: a multiple of the overlap length `L`, and at least `L`
    /// (`VerifyPipelineArgumentsFixed`, `pipeline_visitor.cc`; `L` counts every forward and
    /// backward stage of the Grouped schedule).
    #[default]
    TensorFlow,
    /// PopART's, which PopTorch shares: at least the pipeline's stages as PopART counts them
    /// (`transforms/pipeline.cpp`: forward and backward stages, the last forward and first
    /// backward merged, `2S - 1` training and `S` inference), with no multiple required: its
    /// fill, main and flush phases run any count (`PipelineInfo`). PopART has no Interleaved
    /// schedule; that one keeps TensorFlow's rule.
    PopArt,
}

/// A stage's forward or backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Slot {
    /// Forward pass of stage k.
    Forward(usize),
    /// Backward pass of stage k.
    Backward(usize),
}

impl Slot {
    /// The stage.
    pub const fn stage(self) -> usize {
        match self {
            Slot::Forward(k) | Slot::Backward(k) => k,
        }
    }
}

/// A pipeline configuration that cannot run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ScheduleError {
    /// No stages.
    NoStages,
    /// The accumulation count is not a positive multiple of the overlap length.
    BadAccumulation {
        /// The schedule.
        schedule: Schedule,
        /// Stages.
        stages: usize,
        /// The accumulation count given.
        accumulation: usize,
        /// The overlap length it must be a multiple of (and at least).
        overlap: usize,
    },
    /// Fewer micro-batches than PopART's pipeline needs to fill ([`AccumulationRule::PopArt`]).
    TooFewMicroBatches {
        /// Stages.
        stages: usize,
        /// The accumulation count given.
        accumulation: usize,
        /// The least it may be.
        least: usize,
    },
    /// A device mapping whose length is not the number of stages.
    MappingLength {
        /// Stages.
        stages: usize,
        /// Entries in the mapping.
        entries: usize,
    },
    /// Interleaved training with two stages on one IPU.
    InterleavedSharedIpu {
        /// The IPU.
        ipu: usize,
        /// The first stage on it.
        first: usize,
        /// The second stage on it.
        second: usize,
    },
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ScheduleError::NoStages => f.write_str("a pipeline needs at least one stage"),
            ScheduleError::BadAccumulation { schedule, stages, accumulation, overlap } => write!(
                f,
                "gradient accumulation count {accumulation} must be a multiple of {overlap} and at least {overlap} for the {schedule} schedule with {stages} stage{}",
                if stages == 1 { "" } else { "s" }
            ),
            ScheduleError::TooFewMicroBatches { stages, accumulation, least } => write!(
                f,
                "gradient accumulation count {accumulation} must be at least {least} to fill a pipeline of {stages} stage{} (PopART's rule)",
                if stages == 1 { "" } else { "s" }
            ),
            ScheduleError::MappingLength { stages, entries } => write!(
                f,
                "device mapping has {entries} entries for {stages} pipeline stages"
            ),
            ScheduleError::InterleavedSharedIpu { ipu, first, second } => write!(
                f,
                "the Interleaved schedule cannot train with stages {first} and {second} both on IPU {ipu}"
            ),
        }
    }
}

impl core::error::Error for ScheduleError {}

/// A checked pipeline: `stages` stages, `accumulation` micro-batches per weight update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Pipeline {
    stages: usize,
    accumulation: usize,
    schedule: Schedule,
    training: bool,
}

impl Pipeline {
    /// Checks and makes a pipeline under TensorFlow's rule for the accumulation count.
    pub fn new(
        stages: usize,
        accumulation: usize,
        schedule: Schedule,
        training: bool,
    ) -> Result<Self, ScheduleError> {
        Self::with_rule(
            stages,
            accumulation,
            schedule,
            training,
            AccumulationRule::TensorFlow,
        )
    }

    /// Checks and makes a pipeline under `rule` for the accumulation count.
    pub fn with_rule(
        stages: usize,
        accumulation: usize,
        schedule: Schedule,
        training: bool,
        rule: AccumulationRule,
    ) -> Result<Self, ScheduleError> {
        if stages == 0 {
            return Err(ScheduleError::NoStages);
        }
        if rule == AccumulationRule::PopArt && schedule == Schedule::Grouped {
            let least = least_accumulation(rule, schedule, stages, training);
            if accumulation < least {
                return Err(ScheduleError::TooFewMicroBatches {
                    stages,
                    accumulation,
                    least,
                });
            }
            return Ok(Pipeline {
                stages,
                accumulation,
                schedule,
                training,
            });
        }
        let overlap = overlap_length(schedule, stages, training);
        if accumulation < overlap || accumulation % overlap != 0 {
            return Err(ScheduleError::BadAccumulation {
                schedule,
                stages,
                accumulation,
                overlap,
            });
        }
        Ok(Pipeline {
            stages,
            accumulation,
            schedule,
            training,
        })
    }

    /// Checks a device mapping (stage -> IPU) against the schedule: its length, and that
    /// Interleaved training has one stage per IPU.
    pub fn check_mapping(&self, mapping: &[usize]) -> Result<(), ScheduleError> {
        if mapping.len() != self.stages {
            return Err(ScheduleError::MappingLength {
                stages: self.stages,
                entries: mapping.len(),
            });
        }
        if self.schedule == Schedule::Interleaved && self.training {
            for (second, &ipu) in mapping.iter().enumerate() {
                if let Some(first) = mapping[..second].iter().position(|&i| i == ipu) {
                    return Err(ScheduleError::InterleavedSharedIpu { ipu, first, second });
                }
            }
        }
        Ok(())
    }

    /// Stages.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// The same pipeline with `times` times the micro-batches per weight update (at least
    /// once). A multiple of a count either accumulation rule accepts is accepted by it too
    /// (TensorFlow's: a multiple of the overlap; PopART's: at least its least), so the result
    /// needs no check. `None` when the count overflows.
    pub fn repeated(&self, times: usize) -> Option<Self> {
        Some(Pipeline {
            accumulation: self.accumulation.checked_mul(times.max(1))?,
            ..*self
        })
    }

    /// Micro-batches per weight update.
    pub fn accumulation(&self) -> usize {
        self.accumulation
    }

    /// The schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// Whether backward slots run.
    pub fn training(&self) -> bool {
        self.training
    }

    /// Slots per micro-batch: `2S` training, `S` inference.
    pub fn slots(&self) -> usize {
        if self.training {
            2 * self.stages
        } else {
            self.stages
        }
    }

    /// The overlap length `L`.
    pub fn overlap(&self) -> usize {
        overlap_length(self.schedule, self.stages, self.training)
    }

    /// Slot `j` (0-based, forward slots first).
    pub fn slot(&self, j: usize) -> Slot {
        if j < self.stages {
            Slot::Forward(j)
        } else {
            Slot::Backward(2 * self.stages - 1 - j)
        }
    }

    /// The index of a slot.
    pub fn slot_index(&self, slot: Slot) -> usize {
        match slot {
            Slot::Forward(k) => k,
            Slot::Backward(k) => 2 * self.stages - 1 - k,
        }
    }

    /// The step at which micro-batch `b` runs `slot`.
    pub fn step_of(&self, b: usize, slot: Slot) -> usize {
        let j = self.slot_index(slot);
        match self.schedule {
            Schedule::Grouped => b + j,
            Schedule::Interleaved => 2 * b + j,
            Schedule::Sequential => b * self.slots() + j,
        }
    }

    /// Steps from the first slot of micro-batch 0 to the last slot of micro-batch `M - 1`.
    pub fn steps(&self) -> usize {
        self.step_of(self.accumulation - 1, self.slot(self.slots() - 1)) + 1
    }

    /// The micro-batch that runs `slot` at `step`, if any.
    pub fn micro_batch_at(&self, step: usize, slot: Slot) -> Option<usize> {
        let j = self.slot_index(slot);
        let b = match self.schedule {
            Schedule::Grouped => step.checked_sub(j)?,
            Schedule::Interleaved => {
                let d = step.checked_sub(j)?;
                if d % 2 != 0 {
                    return None;
                }
                d / 2
            }
            Schedule::Sequential => {
                let d = step.checked_sub(j)?;
                if d % self.slots() != 0 {
                    return None;
                }
                d / self.slots()
            }
        };
        (b < self.accumulation).then_some(b)
    }

    /// Every (step, slot, micro-batch) of one weight update, by step then slot.
    pub fn events(&self) -> impl Iterator<Item = (usize, Slot, usize)> + '_ {
        (0..self.steps()).flat_map(move |t| {
            (0..self.slots()).filter_map(move |j| {
                let s = self.slot(j);
                self.micro_batch_at(t, s).map(|b| (t, s, b))
            })
        })
    }

    /// Stash depth of forward stage `k`: micro-batches whose activations wait for their
    /// backward.
    pub fn stash_depth(&self, k: usize) -> usize {
        if !self.training {
            return 0;
        }
        let rest = self.stages - 1 - k.min(self.stages - 1);
        match self.schedule {
            Schedule::Grouped => 2 * rest,
            Schedule::Interleaved => rest,
            Schedule::Sequential => 0,
        }
    }

    /// The stash of forward stage `k` during `step`: micro-batches older than the newest one
    /// whose forward of stage `k` has run, still waiting for their backward. (The newest
    /// micro-batch's activations are the stage's working buffer, not the stash: a schedule
    /// needs a FIFO only when a stage runs ahead of its own backward.)
    pub fn stash_occupancy(&self, k: usize, step: usize) -> usize {
        if !self.training {
            return 0;
        }
        let newest = (0..self.accumulation)
            .rev()
            .find(|&b| self.step_of(b, Slot::Forward(k)) <= step);
        let Some(newest) = newest else { return 0 };
        (0..newest)
            .filter(|&b| self.step_of(b, Slot::Backward(k)) > step)
            .count()
    }
}

/// The overlap length `L` of a schedule.
pub fn overlap_length(schedule: Schedule, stages: usize, training: bool) -> usize {
    match schedule {
        Schedule::Grouped if training => 2 * stages,
        Schedule::Grouped | Schedule::Interleaved => stages,
        Schedule::Sequential => 1,
    }
}

/// The least accumulation count a pipeline of `stages` stages takes under `rule`: PopART's
/// `2S - 1` (`S` inference) for the Grouped schedule, else the overlap length.
pub fn least_accumulation(
    rule: AccumulationRule,
    schedule: Schedule,
    stages: usize,
    training: bool,
) -> usize {
    match (rule, schedule) {
        (AccumulationRule::PopArt, Schedule::Grouped) if training => (2 * stages).max(2) - 1,
        (AccumulationRule::PopArt, Schedule::Grouped) => stages.max(1),
        _ => overlap_length(schedule, stages, training).max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_is_wrong() {
        let e = Pipeline::new(2, 6, Schedule::Grouped, true).unwrap_err();
        assert_eq!(
            e,
            ScheduleError::BadAccumulation {
                schedule: Schedule::Grouped,
                stages: 2,
                accumulation: 6,
                overlap: 4
            }
        );
        let mut s = heapless::String::<160>::new();
        core::fmt::write(&mut s, format_args!("{e}")).unwrap();
        assert_eq!(s, "gradient accumulation count 6 must be a multiple of 4 and at least 4 for the Grouped schedule with 2 stages");
        assert_eq!(
            Pipeline::new(0, 4, Schedule::Grouped, true),
            Err(ScheduleError::NoStages)
        );
        assert!(Pipeline::new(2, 2, Schedule::Interleaved, true).is_ok());
        assert!(Pipeline::new(2, 0, Schedule::Sequential, true).is_err());
        let p = Pipeline::new(2, 2, Schedule::Interleaved, true).unwrap();
        assert_eq!(
            p.check_mapping(&[0, 0]),
            Err(ScheduleError::InterleavedSharedIpu {
                ipu: 0,
                first: 0,
                second: 1
            })
        );
        assert_eq!(
            p.check_mapping(&[0]),
            Err(ScheduleError::MappingLength {
                stages: 2,
                entries: 1
            })
        );
        assert!(Pipeline::new(2, 4, Schedule::Grouped, true)
            .unwrap()
            .check_mapping(&[0, 0])
            .is_ok());
    }

    #[test]
    fn two_stage_grouped_timeline() {
        let p = Pipeline::new(2, 4, Schedule::Grouped, true).unwrap();
        // Slots F0 F1 B1 B0 at steps b, b+1, b+2, b+3.
        assert_eq!(p.micro_batch_at(3, Slot::Forward(0)), Some(3));
        assert_eq!(p.micro_batch_at(3, Slot::Backward(0)), Some(0));
        assert_eq!(p.micro_batch_at(3, Slot::Backward(1)), Some(1));
        assert_eq!(p.events().count(), 4 * 4);
        assert_eq!(p.stash_depth(0), 2);
        assert_eq!(p.stash_depth(1), 0);
        assert_eq!(
            (0..p.steps()).map(|t| p.stash_occupancy(0, t)).max(),
            Some(2)
        );
    }
}
