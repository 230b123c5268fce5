//! Where graphs and plans keep their nodes: storage chosen by the caller.
//!
//! The core never allocates. A [`Graph`](crate::Graph) and a [`Plan`](crate::Plan) take a
//! [`Storage`] that makes every growable list they need:
//!
//! - [`Fixed<N>`]: at most `N` elements per list, held in place (`heapless::Vec`): what a
//!   microcontroller uses, with the capacity fixed at compile time;
//! - a host's heap: the simulator crate provides one (`tessera_sim::Heap`), so graphs of many
//!   thousands of nodes never sit on a stack.
//!
//! Running out of capacity is an error ([`crate::GraphError::CapacityExceeded`]), never a
//! panic.

use core::fmt::Debug;
use core::ops::{Deref, DerefMut};

/// A growable list with a capacity: the one thing a [`Storage`] makes.
pub trait Buffer<T>: Deref<Target = [T]> + DerefMut + Clone + Debug {
    /// How many elements it can hold.
    fn capacity(&self) -> usize;
    /// Appends `value`, or gives it back when the list is full.
    fn push(&mut self, value: T) -> Result<(), T>;
    /// Keeps the first `len` elements.
    fn truncate(&mut self, len: usize);
}

/// A family of lists: one [`Buffer`] type for any element type.
pub trait Storage: Sized + 'static {
    /// The list of `T`s.
    type Vec<T: Clone + Debug>: Buffer<T>;

    /// An empty list.
    fn vec<T: Clone + Debug>() -> Self::Vec<T>;

    /// A list of `len` copies of `value`, or `None` when `len` exceeds the capacity.
    fn filled<T: Clone + Debug>(len: usize, value: T) -> Option<Self::Vec<T>> {
        let mut v = Self::vec();
        for _ in 0..len {
            v.push(value.clone()).ok()?;
        }
        Some(v)
    }
}

/// Storage of at most `N` elements per list, in place: no heap, the capacity a const generic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Fixed<const N: usize>;

impl<T: Clone + Debug, const N: usize> Buffer<T> for heapless::Vec<T, N> {
    fn capacity(&self) -> usize {
        N
    }
    fn push(&mut self, value: T) -> Result<(), T> {
        heapless::Vec::push(self, value)
    }
    fn truncate(&mut self, len: usize) {
        heapless::Vec::truncate(self, len)
    }
}

impl<const N: usize> Storage for Fixed<N> {
    type Vec<T: Clone + Debug> = heapless::Vec<T, N>;

    fn vec<T: Clone + Debug>() -> Self::Vec<T> {
        heapless::Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_lists_stop_at_capacity() {
        let mut v = Fixed::<2>::vec::<u32>();
        assert_eq!(v.push(1), Ok(()));
        assert_eq!(v.push(2), Ok(()));
        assert_eq!(v.push(3), Err(3));
        assert_eq!(&v[..], &[1, 2]);
        v.truncate(1);
        assert_eq!(&v[..], &[1]);
        assert!(Fixed::<2>::filled(3, 0u8).is_none());
        assert_eq!(&Fixed::<4>::filled(3, 7u8).unwrap()[..], &[7, 7, 7]);
    }
}
