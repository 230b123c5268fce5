//! Exchange summaries kept: those of element-wise compute sets by what they depend on, shared
//! by a lowering's workers, what a tensor's runs add to an exchange, and a program's summaries
//! by step.

use std::collections::HashMap;

use super::{summarize, Contribution, ExchangeSummary, PerTile};
use crate::program::{ProgTensor, TensorClass, TensorId, Transfer};

/// What the exchange of an element-wise compute set depends on, when its vertices read, on
/// each tile of one layout, that tile's runs of every tensor they read, and nothing else (see
/// [`SpreadSummaries`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SpreadKey {
    /// Tiles of the IPU.
    tiles: u32,
    /// The digest of the layout whose tiles' runs the vertices read.
    over: u128,
    /// The tensors read, sorted.
    reads: Vec<SpreadRead>,
}

/// What a summary sees of a tensor an element-wise compute set reads: its layout's digest,
/// its element size, whether it is always live (its sends count as state sends), and whether
/// it is read locally (laid out like the vertices, so not looked up).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SpreadRead {
    pub(super) layout: u128,
    pub(super) elem_bytes: u64,
    pub(super) state: bool,
    pub(super) local: bool,
}

impl SpreadKey {
    /// The key of vertices that read, on each tile of `over`'s layout, its runs of each of
    /// `reads` (distinct tensors), with `local` those laid out like `over`. Also gives `reads`
    /// in the key's order.
    pub(crate) fn new(
        tiles: u32,
        tensors: &[ProgTensor],
        over: TensorId,
        reads: &[TensorId],
        local: &[TensorId],
    ) -> (SpreadKey, Vec<TensorId>) {
        let mut keyed: Vec<(SpreadRead, TensorId)> = reads
            .iter()
            .map(|&t| {
                let pt = &tensors[t.index()];
                let read = SpreadRead {
                    layout: pt.mapping.digest(),
                    elem_bytes: pt.elem_bytes(),
                    state: pt.class == TensorClass::AlwaysLive,
                    local: local.contains(&t),
                };
                (read, t)
            })
            .collect();
        keyed.sort_unstable();
        let key = SpreadKey {
            tiles,
            over: tensors[over.index()].mapping.digest(),
            reads: keyed.iter().map(|k| k.0).collect(),
        };
        (key, keyed.into_iter().map(|k| k.1).collect())
    }
}

/// A summary kept by [`SpreadSummaries`], with the tensors it moved given by their place in
/// the key's reads.
type Spread = Option<(ExchangeSummary, Vec<bool>)>;

/// The summaries of element-wise exchanges, by what they depend on ([`SpreadKey`]), shared by
/// the workers of one lowering. A summary depends on the tensors read only through their
/// layouts, element sizes, classes and whether they are read locally, never through their
/// names: two element-wise ops that read tensors laid out alike, on the tiles of one layout,
/// exchange alike (a ReLU's gradient and the batch-norm scale gradient after it both read a
/// concatenation's layout on the tiles of the gradient's). The second takes the first's
/// summary, with its own tensors.
#[derive(Clone, Default)]
pub(crate) struct SpreadSummaries(pub(super) std::sync::Arc<SpreadKept>);

/// What [`SpreadSummaries`] keep.
#[derive(Default)]
pub(super) struct SpreadKept {
    /// Whole summaries.
    summaries: std::sync::Mutex<HashMap<SpreadKey, Spread>>,
    /// What one tensor's reads add ([`RunReads`]).
    pub(super) runs: std::sync::Mutex<HashMap<RunKey, std::sync::Arc<Contribution>>>,
}

/// What the reads of one tensor, each tile reading its runs of a layout, depend on
/// ([`RunReads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct RunKey {
    /// Tiles of the IPU.
    pub(super) tiles: u32,
    /// The digest of the layout whose tiles read.
    pub(super) over: u128,
    /// How they read.
    pub(super) how: PerTile,
    /// The tensor read.
    pub(super) read: SpreadRead,
}

impl SpreadSummaries {
    /// The summary of the exchange under `key` whose reads (in the key's order) are `reads`,
    /// made by `summarize` when no summary under `key` is kept.
    pub(crate) fn get_or_summarize(
        &self,
        key: SpreadKey,
        reads: &[TensorId],
        summarize: impl FnOnce() -> Option<ExchangeSummary>,
    ) -> Option<ExchangeSummary> {
        let kept = self
            .0
            .summaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(kept) = kept {
            return kept.map(|(mut s, moved)| {
                s.tensors = reads
                    .iter()
                    .zip(&moved)
                    .filter(|(_, &m)| m)
                    .map(|(&t, _)| t)
                    .collect();
                s.tensors.sort_unstable();
                s
            });
        }
        // Made outside the lock: another worker asking for the same key meanwhile makes the
        // same summary.
        let s = summarize();
        let kept = s.as_ref().map(|s| {
            let moved = reads.iter().map(|t| s.tensors.contains(t)).collect();
            (
                ExchangeSummary {
                    tensors: Vec::new(),
                    ..s.clone()
                },
                moved,
            )
        });
        self.0
            .summaries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, kept);
        s
    }

    /// What the reads under `key` add to an exchange, made by `tally` when none is kept.
    pub(super) fn contribution(
        &self,
        key: RunKey,
        tally: impl FnOnce() -> Contribution,
    ) -> std::sync::Arc<Contribution> {
        let kept = self
            .0
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(kept) = kept {
            return kept;
        }
        // Made outside the lock, as the summaries are.
        let c = std::sync::Arc::new(tally());
        self.0
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, std::sync::Arc::clone(&c));
        c
    }
}

/// The summaries of a program's exchanges whose transfers were not kept, by step.
#[derive(Clone, Debug, Default)]
pub(crate) struct Summaries {
    by_step: Vec<(usize, ExchangeSummary)>,
    /// Node lowerings reused from an identical node's (see `lower::memo`).
    pub(crate) reused: usize,
    /// Node lowerings made and recorded afresh (no record held them yet).
    pub(crate) lowered: usize,
}
impl Summaries {
    /// Records the summary of the exchange at `step` (steps in increasing order).
    pub(crate) fn push(&mut self, step: usize, summary: ExchangeSummary) {
        debug_assert!(self.by_step.last().is_none_or(|l| l.0 < step));
        self.by_step.push((step, summary));
    }

    /// The summary of the exchange at `step`, if it was recorded.
    pub(crate) fn get(&self, step: usize) -> Option<&ExchangeSummary> {
        self.by_step
            .binary_search_by_key(&step, |s| s.0)
            .ok()
            .map(|i| &self.by_step[i].1)
    }

    /// The summary of the exchange `transfers` at `step` of a program with `tiles` tiles: the
    /// recorded one, or one made from the transfers.
    pub(crate) fn of<'a>(
        &'a self,
        step: usize,
        tiles: u32,
        tensors: &[ProgTensor],
        transfers: &[Transfer],
    ) -> std::borrow::Cow<'a, ExchangeSummary> {
        match self.get(step) {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(summarize(tiles, tensors, transfers)),
        }
    }
}
