//! What a dataset's elements hold: its fields and their specs, and one element.

use tessera_core::DType;

#[cfg(doc)]
use super::Dataset;
use super::DatasetError;

/// One named field of a dataset element: its shape, element type and, for class labels, the
/// number of classes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FieldSpec {
    /// The field's name; [`crate::infeed::feed`] writes it to the plan input of the same name.
    pub name: String,
    /// The field's shape (`[]` for a scalar). After [`Dataset::batch`] the first dimension is
    /// the batch dimension.
    pub shape: Vec<usize>,
    /// The element type the feeder writes: `F32` or `F16` (see [`Dataset::cast`]).
    pub dtype: DType,
    /// For a field of class labels, the number of classes: values are integers in
    /// `0..classes`. [`Dataset::synthetic`] draws such fields uniformly from that range, and
    /// [`Dataset::from_fields`] checks them.
    pub classes: Option<usize>,
}

impl FieldSpec {
    /// An `f32` field of the given shape.
    #[must_use]
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        FieldSpec {
            name: name.into(),
            shape: shape.to_vec(),
            dtype: DType::F32,
            classes: None,
        }
    }

    /// A scalar class label (shape `[]`) with values in `0..classes`.
    #[must_use]
    pub fn class_label(name: impl Into<String>, classes: usize) -> Self {
        FieldSpec::new(name, &[]).with_classes(classes)
    }

    /// This field, as class labels with values in `0..classes`.
    #[must_use]
    pub fn with_classes(mut self, classes: usize) -> Self {
        self.classes = Some(classes);
        self
    }

    /// This field, with element type `dtype` (`F32` or `F16`; sources reject other types).
    #[must_use]
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// Number of values in one element of this field (the product of its shape; `1` for a
    /// scalar). Saturates at `usize::MAX`; sources reject shapes that overflow.
    #[must_use]
    pub fn elements(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Bytes of one element of this field in its element type (saturating).
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.elements().saturating_mul(self.dtype.size())
    }

    /// The product of the shape, or `None` if it overflows `usize`.
    pub(super) fn checked_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }
}

/// The fields of a dataset element, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatasetSpec {
    /// The fields, in the order batches list them.
    pub fields: Vec<FieldSpec>,
}

impl DatasetSpec {
    /// A spec from its fields.
    #[must_use]
    pub fn new(fields: Vec<FieldSpec>) -> Self {
        DatasetSpec { fields }
    }

    /// The field named `name`, if there is one.
    #[must_use]
    pub fn field(&self, name: &str) -> Option<&FieldSpec> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// Bytes of one element (all fields, each in its element type; saturating).
    #[must_use]
    pub fn element_bytes(&self) -> usize {
        self.fields
            .iter()
            .fold(0usize, |a, f| a.saturating_add(f.bytes()))
    }

    pub(super) fn index(&self, name: &str) -> Result<usize, DatasetError> {
        self.fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| DatasetError::UnknownField {
                field: name.to_owned(),
                known: self.fields.iter().map(|f| f.name.clone()).collect(),
            })
    }
}

impl From<Vec<FieldSpec>> for DatasetSpec {
    fn from(fields: Vec<FieldSpec>) -> Self {
        DatasetSpec::new(fields)
    }
}

/// One element of a dataset, usually a batch: every field's name, shape (including the batch
/// dimension once batched) and values.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// `(name, shape, values)` for each field, in the dataset's field order;
    /// `values.len()` is the product of `shape`.
    pub fields: Vec<(String, Vec<usize>, Vec<f32>)>,
    /// The element type of each field (`dtypes[i]` belongs to `fields[i]`). Values of an `F16`
    /// field are exactly representable in binary16.
    pub dtypes: Vec<DType>,
}

impl Batch {
    /// The shape and values of the field named `name`.
    #[must_use]
    pub fn field(&self, name: &str) -> Option<(&[usize], &[f32])> {
        self.fields
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, shape, values)| (shape.as_slice(), values.as_slice()))
    }

    /// The element type of the field named `name`.
    #[must_use]
    pub fn dtype(&self, name: &str) -> Option<DType> {
        self.fields
            .iter()
            .position(|(n, _, _)| n == name)
            .and_then(|i| self.dtypes.get(i).copied())
    }

    /// Bytes of this batch with every field in its element type (what an infeed moves to the
    /// device).
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.fields
            .iter()
            .enumerate()
            .map(|(i, (_, _, v))| {
                let size = self.dtypes.get(i).map_or(4, |d| d.size());
                v.len().saturating_mul(size)
            })
            .fold(0usize, usize::saturating_add)
    }
}
