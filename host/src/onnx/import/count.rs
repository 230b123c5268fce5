//! Imports counted per thread: an estimate imports its model once and places stages by
//! copying that import ([`super::staging`]), which tests and benchmarks check by counting.

use std::cell::Cell;

/// The imports one thread has made (see [`import_count`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportCount {
    /// Imports of a model: its nodes converted into a graph.
    pub imports: u64,
    /// Shape passes: a model's nodes converted at the file's own batch, once per import
    /// that rebinds a batch the file fixes, for the shapes written into the file (a
    /// Reshape's target, a Slice's end) that rebinding rescales.
    pub shape_passes: u64,
}

thread_local! {
    static COUNT: Cell<ImportCount> = const {
        Cell::new(ImportCount { imports: 0, shape_passes: 0 })
    };
}

/// The imports and shape passes made on the calling thread so far (an estimate runs on the
/// thread that asks for it): the difference across a call is what the call imported.
pub fn import_count() -> ImportCount {
    COUNT.with(Cell::get)
}

pub(super) fn import() {
    COUNT.with(|c| {
        let mut n = c.get();
        n.imports += 1;
        c.set(n);
    });
}

pub(super) fn shape_pass() {
    COUNT.with(|c| {
        let mut n = c.get();
        n.shape_passes += 1;
        c.set(n);
    });
}
