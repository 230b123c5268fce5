//! Fixed tensor shapes.

use core::fmt;

/// The largest rank a [`Shape`] can hold.
pub const MAX_RANK: usize = 6;

/// A fixed tensor shape: rank 0 (a scalar) up to [`MAX_RANK`], every dimension at least 1.
///
/// A shape is checked when it is made, so a `Shape` in a graph always has a valid, non-zero
/// element count that fits in `u32`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Shape {
    dims: [u32; MAX_RANK],
    rank: u8,
}

/// Why a list of dimensions is not a valid [`Shape`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ShapeError {
    /// More dimensions than [`MAX_RANK`].
    RankTooLarge {
        /// The rank asked for.
        rank: usize,
    },
    /// A dimension of zero (tensors here always hold data).
    ZeroDimension {
        /// Which axis.
        axis: usize,
    },
    /// The element count does not fit in `u32`.
    TooManyElements {
        /// The axis that takes the count past `u32::MAX`.
        axis: usize,
        /// Its size.
        size: usize,
    },
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::RankTooLarge { rank } => {
                write!(f, "rank {rank} is larger than the maximum {MAX_RANK}")
            }
            ShapeError::ZeroDimension { axis } => write!(f, "axis {axis} has size 0"),
            ShapeError::TooManyElements { axis, size } => write!(
                f,
                "axis {axis} of size {size} takes the element count past 32 bits ({})",
                u32::MAX
            ),
        }
    }
}

impl core::error::Error for ShapeError {}

impl Shape {
    /// The shape of a scalar (rank 0, one element).
    pub const fn scalar() -> Self {
        Shape {
            dims: [1; MAX_RANK],
            rank: 0,
        }
    }

    /// A shape from its dimensions, outermost first.
    pub fn new(dims: &[usize]) -> Result<Self, ShapeError> {
        if dims.len() > MAX_RANK {
            return Err(ShapeError::RankTooLarge { rank: dims.len() });
        }
        let mut out = [1u32; MAX_RANK];
        let mut count: u32 = 1;
        for (axis, &d) in dims.iter().enumerate() {
            if d == 0 {
                return Err(ShapeError::ZeroDimension { axis });
            }
            let too_many = ShapeError::TooManyElements { axis, size: d };
            let d = u32::try_from(d).map_err(|_| too_many)?;
            count = count.checked_mul(d).ok_or(too_many)?;
            out[axis] = d;
        }
        Ok(Shape {
            dims: out,
            rank: dims.len() as u8,
        })
    }

    /// The rank (number of dimensions).
    pub const fn rank(&self) -> usize {
        self.rank as usize
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[u32] {
        &self.dims[..self.rank as usize]
    }

    /// The size of one axis.
    pub fn dim(&self, axis: usize) -> usize {
        self.dims()[axis] as usize
    }

    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.dims().iter().map(|&d| d as usize).product()
    }

    /// The innermost dimension (1 for a scalar).
    pub fn last(&self) -> usize {
        if self.rank == 0 {
            1
        } else {
            self.dims[self.rank as usize - 1] as usize
        }
    }

    /// Elements divided by the innermost dimension: the number of "rows".
    pub fn rows(&self) -> usize {
        self.elements() / self.last()
    }

    /// The shape with `axis` removed (a reduction's output).
    pub fn without_axis(&self, axis: usize) -> Self {
        let mut dims = [1u32; MAX_RANK];
        let mut r = 0;
        for (i, &d) in self.dims().iter().enumerate() {
            if i != axis {
                dims[r] = d;
                r += 1;
            }
        }
        Shape {
            dims,
            rank: r as u8,
        }
    }

    /// (outer, axis length, inner) element counts around `axis`.
    pub fn split_at_axis(&self, axis: usize) -> (usize, usize, usize) {
        let d = self.dims();
        let outer = d[..axis].iter().map(|&x| x as usize).product();
        let inner = d[axis + 1..].iter().map(|&x| x as usize).product();
        (outer, d[axis] as usize, inner)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        if self.rank == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_and_counts() {
        let s = Shape::new(&[32, 28, 28]).unwrap();
        assert_eq!(s.rank(), 3);
        assert_eq!(s.elements(), 32 * 784);
        assert_eq!(s.last(), 28);
        assert_eq!(s.rows(), 32 * 28);
        assert_eq!(s.without_axis(0), Shape::new(&[28, 28]).unwrap());
        assert_eq!(s.split_at_axis(1), (32, 28, 28));
        assert_eq!(Shape::scalar().elements(), 1);
    }

    #[test]
    fn rejects_bad_dims() {
        assert_eq!(
            Shape::new(&[1, 2, 3, 4, 5, 6, 7]),
            Err(ShapeError::RankTooLarge { rank: 7 })
        );
        assert_eq!(
            Shape::new(&[3, 0]),
            Err(ShapeError::ZeroDimension { axis: 1 })
        );
        assert_eq!(
            Shape::new(&[1 << 20, 1 << 20]),
            Err(ShapeError::TooManyElements {
                axis: 1,
                size: 1 << 20
            })
        );
    }
}
