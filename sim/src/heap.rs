//! Heap storage for the core's graphs and plans on a host: lists grow as nodes are added, so a
//! BERT-Large training graph of many thousand nodes never sits on a stack.

use std::ops::{Deref, DerefMut};

use tessera_core::{Buffer, Storage};

/// The most elements a heap list holds (and so the most nodes a host graph has): far beyond
/// any model's graph, and still a typed error rather than memory exhaustion when exceeded.
pub const HEAP_CAPACITY: usize = 1 << 22;

/// [`Storage`] on the heap, up to [`HEAP_CAPACITY`] elements per list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Heap;

/// A heap list (a `Vec` with a capacity limit).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct HeapVec<T>(Vec<T>);

impl<T> Deref for HeapVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> DerefMut for HeapVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.0
    }
}

impl<T: Clone + std::fmt::Debug> Buffer<T> for HeapVec<T> {
    fn capacity(&self) -> usize {
        HEAP_CAPACITY
    }
    fn push(&mut self, value: T) -> Result<(), T> {
        if self.0.len() >= HEAP_CAPACITY {
            return Err(value);
        }
        self.0.push(value);
        Ok(())
    }
    fn truncate(&mut self, len: usize) {
        self.0.truncate(len)
    }
}

impl Storage for Heap {
    type Vec<T: Clone + std::fmt::Debug> = HeapVec<T>;

    fn vec<T: Clone + std::fmt::Debug>() -> HeapVec<T> {
        HeapVec(Vec::new())
    }

    fn filled<T: Clone + std::fmt::Debug>(len: usize, value: T) -> Option<HeapVec<T>> {
        (len <= HEAP_CAPACITY).then(|| HeapVec(vec![value; len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::{DType, Graph, Plan};

    #[test]
    fn a_large_graph_builds_and_plans_on_the_heap() {
        let mut g: Graph<Heap> = Graph::new();
        let mut x = g.input("x", &[4, 8], DType::F32).unwrap();
        for i in 0..20_000 {
            x = g.relu(&format!("relu{i}"), x).unwrap();
        }
        g.mark_output(x).unwrap();
        let plan = Plan::new(&g).unwrap();
        assert_eq!(plan.graph().len(), 20_001);
        // The input stays live (it is fed before the run); two buffers alternate down the
        // chain.
        assert_eq!(plan.arena_bytes(), 3 * 4 * 8 * 4);
    }
}
