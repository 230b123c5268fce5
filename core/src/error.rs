//! Errors: one small type per failure kind, each naming the node at fault.

use crate::{DType, Shape, ShapeError};
use core::fmt;

/// The longest name a user may give a node. Autodiff derives longer names from it (suffixes
/// such as `_grad/2`), up to [`NAME_CAPACITY`].
pub const USER_NAME_MAX: usize = 80;

/// The longest node name a graph stores.
pub const NAME_CAPACITY: usize = 96;

/// A node name (fixed capacity, no heap).
pub type Name = heapless::String<NAME_CAPACITY>;

/// Makes a [`Name`] from `s`, cutting it at the capacity (for use in error messages).
pub fn name_lossy(s: &str) -> Name {
    let mut n = Name::new();
    for c in s.chars() {
        if n.push(c).is_err() {
            break;
        }
    }
    n
}

/// `<base><suffix>` as a node name (an error naming `base` when it does not fit).
pub(crate) fn derived(base: &str, suffix: fmt::Arguments<'_>) -> Result<Name, GraphError> {
    use fmt::Write;
    let mut n = Name::new();
    n.push_str(base).map_err(|_| GraphError::BadName {
        name: name_lossy(base),
    })?;
    n.write_fmt(suffix).map_err(|_| GraphError::BadName {
        name: name_lossy(base),
    })?;
    Ok(n)
}

/// A graph could not be built or differentiated. Each variant names the node at fault by the
/// name its user gave it.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum GraphError {
    /// Two nodes with the same name.
    DuplicateName {
        /// The name used twice.
        name: Name,
    },
    /// A reference to a name no node has.
    UnknownName {
        /// The name asked for.
        name: Name,
    },
    /// A node id that does not belong to this graph.
    UnknownNode {
        /// The id's index.
        index: usize,
    },
    /// A name longer than [`USER_NAME_MAX`] bytes, or empty.
    BadName {
        /// The name (cut at the capacity).
        name: Name,
    },
    /// The graph holds as many nodes as its capacity allows.
    CapacityExceeded {
        /// The node that did not fit.
        node: Name,
        /// The graph's capacity.
        capacity: usize,
    },
    /// A node's dimensions are not a valid shape.
    BadShape {
        /// The node.
        node: Name,
        /// What is wrong with the dimensions.
        reason: ShapeError,
    },
    /// Operand shapes that the op cannot combine.
    ShapeMismatch {
        /// The node.
        node: Name,
        /// The op.
        op: &'static str,
        /// What the op requires.
        rule: &'static str,
        /// First operand's shape.
        left: Shape,
        /// Second operand's shape.
        right: Shape,
    },
    /// An operand of the wrong element type.
    DTypeMismatch {
        /// The node.
        node: Name,
        /// The op.
        op: &'static str,
        /// What it needs.
        expected: &'static str,
        /// What it got.
        found: DType,
    },
    /// An axis outside the operand's rank.
    BadAxis {
        /// The node.
        node: Name,
        /// The axis asked for (negative counts from the end).
        axis: isize,
        /// The operand's rank.
        rank: usize,
    },
    /// An attribute the op cannot take (a bad permutation, a zero stride, a kernel larger
    /// than its padded input, ...).
    BadAttribute {
        /// The node.
        node: Name,
        /// The op.
        op: &'static str,
        /// What is wrong.
        rule: &'static str,
    },
    /// A reshape that changes the element count.
    ReshapeSize {
        /// The node.
        node: Name,
        /// The operand's shape.
        from: Shape,
        /// The requested shape.
        to: Shape,
    },
    /// The loss given to autodiff is not a scalar of a float type.
    BadLoss {
        /// The node.
        node: Name,
        /// Its shape.
        shape: Shape,
    },
    /// Autodiff reached an op that has no gradient rule.
    NotDifferentiable {
        /// The node.
        node: Name,
        /// The op.
        op: &'static str,
    },
    /// The loss does not depend on any trainable variable.
    NothingToTrain {
        /// The loss node.
        loss: Name,
    },
    /// The graph was already differentiated.
    AlreadyTraining,
    /// A recomputation checkpoint that is not a forward activation the loss depends on.
    BadCheckpoint {
        /// The node.
        node: Name,
    },
    /// A pipeline stage number above 255.
    BadStage {
        /// The stage asked for.
        stage: usize,
    },
    /// An optimizer hyper-parameter out of range.
    BadHyperParameter {
        /// Which parameter.
        name: &'static str,
        /// Its value.
        value: f32,
    },
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphError::DuplicateName { name } => {
                write!(f, "a node named `{name}` already exists")
            }
            GraphError::UnknownName { name } => write!(f, "no node is named `{name}`"),
            GraphError::UnknownNode { index } => {
                write!(f, "node id {index} does not belong to this graph")
            }
            GraphError::BadName { name } => write!(
                f,
                "node name `{name}` is empty or longer than {USER_NAME_MAX} bytes"
            ),
            GraphError::CapacityExceeded { node, capacity } => write!(
                f,
                "`{node}`: the graph is full ({capacity} nodes); build it with a larger capacity"
            ),
            GraphError::BadShape { node, reason } => write!(f, "`{node}`: bad shape: {reason}"),
            GraphError::ShapeMismatch {
                node,
                op,
                rule,
                left,
                right,
            } => {
                write!(f, "`{node}` ({op}): {rule}, got {left} and {right}")
            }
            GraphError::DTypeMismatch {
                node,
                op,
                expected,
                found,
            } => {
                write!(f, "`{node}` ({op}): expected {expected}, found {found}")
            }
            GraphError::BadAxis { node, axis, rank } => {
                write!(f, "`{node}`: axis {axis} is out of range for rank {rank}")
            }
            GraphError::BadAttribute { node, op, rule } => write!(f, "`{node}` ({op}): {rule}"),
            GraphError::ReshapeSize { node, from, to } => write!(
                f,
                "`{node}`: cannot reshape {from} ({} elements) to {to} ({} elements)",
                from.elements(),
                to.elements()
            ),
            GraphError::BadLoss { node, shape } => {
                write!(
                    f,
                    "`{node}`: a loss must be a float scalar, found shape {shape}"
                )
            }
            GraphError::NotDifferentiable { node, op } => {
                write!(f, "`{node}`: no gradient is defined for {op}")
            }
            GraphError::NothingToTrain { loss } => {
                write!(f, "loss `{loss}` does not depend on any trainable variable")
            }
            GraphError::BadStage { stage } => {
                write!(f, "pipeline stage {stage} is out of range (at most 255)")
            }
            GraphError::AlreadyTraining => f.write_str("the graph already has a backward pass"),
            GraphError::BadCheckpoint { node } => write!(
                f,
                "recomputation checkpoint `{node}` is not a forward activation on the path to the loss"
            ),
            GraphError::BadHyperParameter { name, value } => {
                write!(f, "optimizer parameter {name} = {value} is out of range")
            }
        }
    }
}

impl core::error::Error for GraphError {}

/// A plan could not be made from a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum PlanError {
    /// A tensor's byte size or an offset does not fit in `usize` on this target.
    TooLarge {
        /// The node whose tensor overflowed.
        node: Name,
    },
    /// The plan's lists do not fit in the storage's capacity.
    Capacity,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::TooLarge { node } => {
                write!(
                    f,
                    "`{node}`: the memory plan does not fit in this target's address space"
                )
            }
            PlanError::Capacity => {
                f.write_str("the plan does not fit in the storage's capacity; use a larger one")
            }
        }
    }
}

impl core::error::Error for PlanError {}

/// Running a plan failed. Nothing here is a bug in the plan: every case is about what the
/// caller supplied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum RunError {
    /// The arena slice is smaller than [`crate::Plan::arena_bytes`].
    ArenaTooSmall {
        /// Bytes the plan needs.
        needed: usize,
        /// Bytes supplied.
        supplied: usize,
    },
    /// The state slice is smaller than [`crate::Plan::state_bytes`].
    StateTooSmall {
        /// Bytes the plan needs.
        needed: usize,
        /// Bytes supplied.
        supplied: usize,
    },
    /// A name or id that is not in the plan's graph.
    UnknownTensor {
        /// The name asked for.
        name: Name,
    },
    /// Data of the wrong length for a tensor.
    WrongLength {
        /// The tensor.
        tensor: Name,
        /// Elements it holds.
        expected: usize,
        /// Elements supplied.
        supplied: usize,
    },
    /// The tensor is not of the kind the call needs (for example, writing an input that is not
    /// an input).
    WrongKind {
        /// The tensor.
        tensor: Name,
        /// What the call needs.
        expected: &'static str,
    },
    /// A class label outside `0..classes` reached a cross-entropy.
    LabelOutOfRange {
        /// The cross-entropy node.
        node: Name,
        /// Row of the batch.
        row: usize,
        /// The label found.
        label: i64,
        /// Number of classes.
        classes: usize,
    },
    /// `train_step` on a plan with no backward pass.
    NotATrainingPlan,
    /// An index outside its table reached a gather or a scatter.
    IndexOutOfRange {
        /// The node.
        node: Name,
        /// Position in the indices.
        position: usize,
        /// The index found.
        index: i64,
        /// Rows of the table.
        len: usize,
    },
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::ArenaTooSmall { needed, supplied } => {
                write!(
                    f,
                    "arena of {supplied} bytes is smaller than the plan's {needed}"
                )
            }
            RunError::StateTooSmall { needed, supplied } => {
                write!(
                    f,
                    "state of {supplied} bytes is smaller than the plan's {needed}"
                )
            }
            RunError::UnknownTensor { name } => write!(f, "no tensor is named `{name}`"),
            RunError::WrongLength {
                tensor,
                expected,
                supplied,
            } => write!(
                f,
                "`{tensor}` holds {expected} elements, {supplied} were supplied"
            ),
            RunError::WrongKind { tensor, expected } => {
                write!(f, "`{tensor}` is not {expected}")
            }
            RunError::LabelOutOfRange {
                node,
                row,
                label,
                classes,
            } => write!(
                f,
                "`{node}`: label {label} in row {row} is outside 0..{classes}"
            ),
            RunError::IndexOutOfRange {
                node,
                position,
                index,
                len,
            } => write!(
                f,
                "`{node}`: index {index} at position {position} is outside 0..{len}"
            ),
            RunError::NotATrainingPlan => {
                f.write_str("this plan has no backward pass; differentiate the graph first")
            }
        }
    }
}

impl core::error::Error for RunError {}
