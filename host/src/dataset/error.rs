//! Why a dataset cannot be made or transformed.

use tessera_core::DType;

#[cfg(doc)]
use super::Dataset;
#[cfg(doc)]
use crate::idx::Images;

/// A dataset could not be made, or a transformation does not apply. Each variant names the
/// field (or the stage) at fault.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DatasetError {
    /// The spec has no fields.
    #[error("a dataset needs at least one field")]
    NoFields,
    /// A field with an empty name.
    #[error("a dataset field has an empty name")]
    EmptyFieldName,
    /// Two fields with the same name.
    #[error("two dataset fields are named `{field}`")]
    DuplicateField {
        /// The name used twice.
        field: String,
    },
    /// A field whose shape has a zero dimension (its elements hold no values).
    #[error(
        "field `{field}`: shape {shape:?} has a zero dimension, so its elements hold no values"
    )]
    ZeroSizedField {
        /// The field.
        field: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A field (or a batch of it) too large to address.
    #[error("field `{field}`: shape {shape:?} is too large to address")]
    FieldTooLarge {
        /// The field.
        field: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// An element type a dataset cannot hold (only `F32` and `F16`), in a spec or a cast.
    #[error("field `{field}`: a dataset holds f32 or f16 values, not {dtype}")]
    UnsupportedDType {
        /// The field.
        field: String,
        /// The type asked for.
        dtype: DType,
    },
    /// A class-label field with zero classes.
    #[error("field `{field}`: a class label needs at least one class")]
    ZeroClasses {
        /// The field.
        field: String,
    },
    /// [`Dataset::from_fields`] got a different number of value vectors than the spec has fields.
    #[error("the spec has {expected} fields but {found} value vectors were given")]
    FieldCount {
        /// Fields in the spec.
        expected: usize,
        /// Value vectors given.
        found: usize,
    },
    /// A field's values are not a whole number of elements.
    #[error(
        "field `{field}`: {values} values are not a whole number of {per_sample}-value samples"
    )]
    RaggedField {
        /// The field.
        field: String,
        /// Values given.
        values: usize,
        /// Values in one element of the field.
        per_sample: usize,
    },
    /// Fields (or MNIST images and labels) that hold different numbers of samples.
    #[error("field `{field}` holds {count} samples but the first field holds {expected}")]
    CountMismatch {
        /// The field that disagrees with the first.
        field: String,
        /// Samples it holds.
        count: usize,
        /// Samples the first field holds.
        expected: usize,
    },
    /// A class label that is not an integer in `0..classes`.
    #[error("field `{field}`: label {value} of sample {sample} is not an integer in 0..{classes}")]
    LabelOutOfRange {
        /// The field.
        field: String,
        /// The sample holding it.
        sample: usize,
        /// The value found.
        value: f32,
        /// The number of classes.
        classes: usize,
    },
    /// An [`Images`] value whose pixel buffer does not match its dimensions.
    #[error(
        "images: {count} images of {rows}x{cols} pixels do not match the {pixels} pixels present"
    )]
    BadImages {
        /// Number of images it claims.
        count: usize,
        /// Rows per image.
        rows: usize,
        /// Columns per image.
        cols: usize,
        /// Pixels actually present.
        pixels: usize,
    },
    /// A transformation named a field the dataset does not have.
    #[error("no dataset field is named `{field}` (fields: {})", .known.join(", "))]
    UnknownField {
        /// The name asked for.
        field: String,
        /// The fields the dataset has.
        known: Vec<String>,
    },
    /// `batch(0, ..)`.
    #[error("batch size 0: a batch needs at least one element")]
    ZeroBatchSize,
    /// Batching elements that do not all have the same shape (an earlier `batch` left a short
    /// last batch).
    #[error("field `{field}`: cannot batch elements of different shapes; use drop_remainder = true in the earlier batch")]
    RaggedBatch {
        /// The first field (all fields share the short batch dimension).
        field: String,
    },
    /// `shuffle` after `repeat(None)`: an infinite stream has no pass to permute.
    #[error("cannot shuffle an infinite dataset; shuffle before repeat(None)")]
    ShuffleInfinite,
    /// `repeat(Some(n))` makes more elements than `usize` counts.
    #[error("repeat({count}): the number of elements overflows usize")]
    CardinalityOverflow {
        /// The repeat count.
        count: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_one_line() {
        let errors = [
            DatasetError::NoFields,
            DatasetError::UnknownField {
                field: "x".into(),
                known: vec!["a".into(), "b".into()],
            },
            DatasetError::RaggedBatch { field: "a".into() },
            DatasetError::ShuffleInfinite,
            DatasetError::LabelOutOfRange {
                field: "y".into(),
                sample: 3,
                value: 11.0,
                classes: 10,
            },
        ];
        for e in errors {
            let s = e.to_string();
            assert!(!s.is_empty() && !s.contains('\n'), "{s}");
        }
    }

    #[test]
    fn messages_name_the_field_and_values() {
        let cases = [
            (
                DatasetError::UnknownField {
                    field: "x".into(),
                    known: vec!["a".into(), "b".into()],
                },
                "no dataset field is named `x` (fields: a, b)",
            ),
            (
                DatasetError::ZeroSizedField {
                    field: "x".into(),
                    shape: vec![2, 0],
                },
                "field `x`: shape [2, 0] has a zero dimension, so its elements hold no values",
            ),
            (
                DatasetError::LabelOutOfRange {
                    field: "y".into(),
                    sample: 3,
                    value: 11.0,
                    classes: 10,
                },
                "field `y`: label 11 of sample 3 is not an integer in 0..10",
            ),
            (
                DatasetError::UnsupportedDType {
                    field: "x".into(),
                    dtype: DType::I32,
                },
                &format!(
                    "field `x`: a dataset holds f32 or f16 values, not {}",
                    DType::I32
                ),
            ),
        ];
        for (e, message) in cases {
            assert_eq!(e.to_string(), message);
            assert!(std::error::Error::source(&e).is_none());
        }
    }
}
