//! Element types.

use core::fmt;

/// The element type of a tensor.
///
/// `F16` is storage only: kernels widen to `f32`, compute, and round back to nearest-even.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16 (storage; arithmetic is done in `f32`).
    F16,
    /// Two's-complement 32-bit integer (labels, counters).
    I32,
    /// Unsigned byte (raw pixels).
    U8,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::U8 => 1,
        }
    }

    /// Whether the type is a floating-point type (and so can carry gradients).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }

    /// The short name used in reports and errors (`f32`, `f16`, `i32`, `u8`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::U8 => "u8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
