//! Host tensors: the dense `f32` tensors that outfeed queues carry and the tensor-inspection
//! statistics summarise, and how their shapes are written (as Python tuples, `(5,)`).
//!
//! This module depends on nothing else in the crate, so that [`crate::outfeed`] and
//! [`crate::stats`] can both build on it.
//!
//! ```
//! use tessera_host::tensor::{format_shape, HostTensor};
//!
//! let t = HostTensor::new(vec![2, 3], vec![0.0; 6]).unwrap();
//! assert_eq!(t.elements(), 6);
//! assert_eq!(format_shape(&t.shape), "(2, 3)");
//! assert!(HostTensor::new(vec![2], vec![1.0]).is_err());
//! ```

/// A dense `f32` tensor on the host, row-major.
///
/// The fields are public for convenience; [`HostTensor::new`] checks that
/// `data.len()` equals the product of `shape`, and the queue re-checks every tensor it is given,
/// so an inconsistent tensor is an error, never a panic.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostTensor {
    /// Dimension sizes, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// The elements, row-major; `data.len()` is the product of `shape`.
    pub data: Vec<f32>,
}

/// Product of `shape`, or `None` if it overflows `usize`. A zero dimension makes it zero however
/// large the other dimensions are.
fn checked_elements(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl HostTensor {
    /// A tensor of `shape` holding `data` (row-major), checking that the lengths agree.
    ///
    /// # Errors
    ///
    /// [`TensorError::LengthMismatch`] if `data.len()` is not the product of `shape`,
    /// [`TensorError::TooLarge`] if that product overflows `usize`.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Result<Self, TensorError> {
        let tensor = HostTensor { shape, data };
        tensor.check()?;
        Ok(tensor)
    }

    /// A rank-0 tensor holding `value`.
    #[must_use]
    pub fn scalar(value: f32) -> Self {
        HostTensor {
            shape: Vec::new(),
            data: vec![value],
        }
    }

    /// A tensor of `shape` with every element equal to `value`.
    ///
    /// # Errors
    ///
    /// [`TensorError::TooLarge`] if the product of `shape` overflows `usize`.
    pub fn filled(shape: Vec<usize>, value: f32) -> Result<Self, TensorError> {
        let n = checked_elements(&shape).ok_or_else(|| TensorError::TooLarge {
            shape: shape.clone(),
        })?;
        Ok(HostTensor {
            shape,
            data: vec![value; n],
        })
    }

    /// Number of elements the shape describes (the product of `shape`, 1 for a scalar),
    /// saturating at `usize::MAX` for a shape too large to exist.
    #[must_use]
    pub fn elements(&self) -> usize {
        checked_elements(&self.shape).unwrap_or(usize::MAX)
    }

    /// Number of dimensions.
    #[must_use]
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Checks the invariant `data.len() == product(shape)` (the fields are public, so a tensor
    /// built by hand may break it).
    ///
    /// # Errors
    ///
    /// As for [`HostTensor::new`].
    pub fn check(&self) -> Result<(), TensorError> {
        match checked_elements(&self.shape) {
            None => Err(TensorError::TooLarge {
                shape: self.shape.clone(),
            }),
            Some(expected) if expected != self.data.len() => Err(TensorError::LengthMismatch {
                shape: self.shape.clone(),
                expected,
                found: self.data.len(),
            }),
            Some(_) => Ok(()),
        }
    }
}

/// What is wrong with a [`HostTensor`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// `data.len()` is not the product of `shape`.
    #[error(
        "a tensor of shape {} needs {expected} elements, found {found}",
        format_shape(.shape)
    )]
    LengthMismatch {
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Elements the shape describes.
        expected: usize,
        /// Elements actually present.
        found: usize,
    },
    /// The product of `shape` overflows `usize`.
    #[error(
        "a tensor of shape {} has more elements than fit in memory",
        format_shape(.shape)
    )]
    TooLarge {
        /// The tensor's shape.
        shape: Vec<usize>,
    },
}

/// A shape written as a Python tuple: `()`, `(5,)`, `(125, 128)`.
#[must_use]
pub fn format_shape(shape: &[usize]) -> String {
    match shape {
        [] => "()".to_owned(),
        [d] => format!("({d},)"),
        dims => {
            let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
            format!("({})", dims.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], data: &[f32]) -> HostTensor {
        HostTensor::new(shape.to_vec(), data.to_vec()).unwrap()
    }

    #[test]
    fn shapes_print_as_python_tuples() {
        assert_eq!(format_shape(&[]), "()");
        assert_eq!(format_shape(&[5]), "(5,)");
        assert_eq!(format_shape(&[125, 128]), "(125, 128)");
        assert_eq!(format_shape(&[2, 3, 4]), "(2, 3, 4)");
    }

    #[test]
    fn host_tensor_checks_its_length() {
        assert_eq!(t(&[2, 3], &[0.0; 6]).elements(), 6);
        assert_eq!(HostTensor::scalar(1.5).elements(), 1);
        assert_eq!(HostTensor::scalar(1.5).rank(), 0);
        assert_eq!(
            HostTensor::new(vec![2, 3], vec![0.0; 5]),
            Err(TensorError::LengthMismatch {
                shape: vec![2, 3],
                expected: 6,
                found: 5
            })
        );
        let huge = vec![usize::MAX, 2];
        assert!(matches!(
            HostTensor::new(huge.clone(), vec![]),
            Err(TensorError::TooLarge { .. })
        ));
        assert_eq!(HostTensor::filled(vec![2, 2], 7.0).unwrap().data, [7.0; 4]);
        assert!(HostTensor::filled(huge, 0.0).is_err());
        // A zero dimension makes the tensor empty however large the others are.
        assert_eq!(t(&[usize::MAX, usize::MAX, 0], &[]).elements(), 0);
        assert_eq!(
            TensorError::LengthMismatch {
                shape: vec![5],
                expected: 5,
                found: 4
            }
            .to_string(),
            "a tensor of shape (5,) needs 5 elements, found 4"
        );
    }

    #[test]
    fn too_large_names_the_shape() {
        let e = HostTensor::filled(vec![usize::MAX, 2], 0.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "a tensor of shape ({}, 2) has more elements than fit in memory",
                usize::MAX
            )
        );
        assert!(std::error::Error::source(&e).is_none());
    }
}
