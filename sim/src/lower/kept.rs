//! Layouts this process keeps for later lowerings: a layout that depends only on what it is
//! made of (a product's plan, a view's operands, a normalised tensor's layout) is made once
//! for every repeated layer, pipeline stage, split retry and sweep configuration.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{LazyLock, Mutex};

/// Values made so far in this process, by what they are made of, at most `kept` of them:
/// past it, the kept ones are dropped (a sweep over many models keeps making without
/// growing). A poisoned lock only loses what is kept: the value is made again.
pub(super) struct Kept<K, V> {
    values: LazyLock<Mutex<HashMap<K, V>>>,
    kept: usize,
}

impl<K: Hash + Eq, V: Clone> Kept<K, V> {
    /// Keeps at most `kept` values.
    pub(super) const fn new(kept: usize) -> Self {
        Kept {
            values: LazyLock::new(Default::default),
            kept,
        }
    }

    /// The value of `key`, made by `make` (outside the lock) when this process has not made
    /// it yet.
    pub(super) fn get_or_make(&self, key: K, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.values.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return v;
        }
        let v = make();
        if let Ok(mut c) = self.values.lock() {
            if c.len() >= self.kept {
                c.clear();
            }
            c.insert(key, v.clone());
        }
        v
    }

    /// Drops what is kept (freed after the lock is released).
    pub(super) fn clear(&self) {
        let dropped = self.values.lock().map(|mut c| std::mem::take(&mut *c));
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::Kept;

    /// A value is made once while kept; past the limit everything kept is dropped and made
    /// again; clearing drops it too.
    #[test]
    fn values_are_made_once_while_kept() {
        static KEPT: Kept<u32, u32> = Kept::new(2);
        let made = std::cell::Cell::new(0);
        let get = |k: u32| {
            KEPT.get_or_make(k, || {
                made.set(made.get() + 1);
                k * 10
            })
        };
        assert_eq!((get(1), get(1), get(2)), (10, 10, 20));
        assert_eq!(made.get(), 2);
        // A third key drops the two kept before it is kept.
        assert_eq!(get(3), 30);
        assert_eq!(get(1), 10);
        assert_eq!(made.get(), 4);
        KEPT.clear();
        assert_eq!(get(3), 30);
        assert_eq!(made.get(), 5);
    }
}
