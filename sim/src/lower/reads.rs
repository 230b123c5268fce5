//! The regions vertices read: rectangles and row pieces of row-major matrices, the tiles'
//! runs of a layout, a broadcast operand's spans, and mixed-radix offsets.

use strength_reduce::StrengthReducedU64;

use crate::exchange::PerTile;
use crate::program::{Region, TensorId};

/// Row segments of the rectangle rows `r0..r1` x cols `c0..c1` of a row-major matrix with
/// `cols` columns, as (start, len) element ranges.
pub(crate) fn rect(
    r0: u64,
    r1: u64,
    c0: u64,
    c1: u64,
    cols: u64,
) -> impl Iterator<Item = (u64, u64)> {
    (r0..r1).map(move |r| (r * cols + c0, c1 - c0))
}

/// The elements `start .. start + len` of a row-major matrix with `cols` columns, as
/// (row, first column, end column) pieces, made as they are read (the copies of a dense
/// block's concatenations ask for tens of millions of them, and a list each cost an
/// allocation each).
pub(crate) fn row_segments(
    start: u64,
    len: u64,
    cols: u64,
) -> impl Iterator<Item = (u64, u64, u64)> {
    let end = start + len;
    // The first piece starts where `start` is; every later one at the start of a row.
    let (mut r, mut c0) = if len > 0 {
        (start / cols, start % cols)
    } else {
        (0, 0)
    };
    let mut i = start;
    std::iter::from_fn(move || {
        if i >= end {
            return None;
        }
        let c1 = cols.min(c0 + (end - i));
        let piece = (r, c0, c1);
        i += c1 - c0;
        r += 1;
        c0 = 0;
        Some(piece)
    })
}

/// Tensors that every vertex of a compute set reads the same way from its tile of `over`'s
/// layout (one vertex per tile of the layout, in its order), and reads nothing else of: the
/// tile's runs, or a broadcast operand's elements that the tile's elements read ([`PerTile`]).
/// What each such read adds to the exchange is kept for compute sets that read alike
/// ([`RunReads`]).
pub(crate) struct Runs {
    /// The tensor on whose layout's tiles the vertices are.
    pub(crate) over: TensorId,
    /// The tensors read so, with how each tile reads them.
    pub(crate) tensors: Vec<(TensorId, PerTile)>,
}

impl Runs {
    /// Each of `tensors` read as the tiles' runs of `over`'s layout.
    pub(crate) fn of(over: TensorId, tensors: impl IntoIterator<Item = TensorId>) -> Self {
        Runs {
            over,
            tensors: tensors.into_iter().map(|t| (t, PerTile::Runs)).collect(),
        }
    }
}

/// The regions of a broadcast operand (of shape `from`) that elements of the output (of shape
/// `to`) read, one span per run along the output's last axis, with the operand's strides
/// worked out once for the many intervals of a mapping.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BroadcastReads {
    /// The operand.
    pub(super) t: TensorId,
    /// How the operand's elements are read.
    kind: BroadcastKind,
    /// The output's rank.
    rank: usize,
    /// Operand strides in output coordinates (0 on broadcast axes).
    strides: [u64; tessera_core::MAX_RANK],
    /// Elements along the output's last axis.
    cols: u64,
    /// Rows reading the same element (constant along the last axis): those that differ only
    /// along broadcast axes just above the last.
    same_rows: u64,
    /// The outermost axis above the last along which the operand moves (`rank - 1` when
    /// none does): the axes outside it add nothing to an offset.
    top: usize,
    /// Division by `cols`, by `same_rows` and by each of the output's dims, as
    /// multiplications: a large mapping's intervals each take a few divisions by them, which
    /// were a few percent of a large model's estimate.
    by_cols: StrengthReducedU64,
    by_same_rows: StrengthReducedU64,
    by_dim: [StrengthReducedU64; tessera_core::MAX_RANK],
}

/// How a broadcast operand is read ([`BroadcastReads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BroadcastKind {
    /// The operand has the output's shape.
    Same,
    /// The operand is one element.
    Scalar,
    /// Rows of the output read one element each.
    PerRow,
    /// Rows of the output read a run each.
    Runs,
}

impl BroadcastReads {
    /// The reads of operand `t` of shape `from` broadcast to `to`.
    pub(crate) fn new(t: TensorId, from: tessera_core::Shape, to: tessera_core::Shape) -> Self {
        let rank = to.rank();
        let mut dims = [0u64; tessera_core::MAX_RANK];
        let mut strides = [0u64; tessera_core::MAX_RANK];
        for (i, d) in dims.iter_mut().enumerate().take(rank) {
            *d = to.dim(i) as u64;
        }
        let kind = if from == to {
            BroadcastKind::Same
        } else if from.elements() == 1 {
            BroadcastKind::Scalar
        } else {
            let pad = rank - from.rank();
            let mut s = 1u64;
            for i in (0..rank).rev() {
                let d = if i >= pad { from.dim(i - pad) } else { 1 } as u64;
                strides[i] = if d == 1 && dims[i] != 1 { 0 } else { s };
                s *= d;
            }
            if strides[rank - 1] == 0 {
                BroadcastKind::PerRow
            } else {
                BroadcastKind::Runs
            }
        };
        let same_rows: u64 = (0..rank.saturating_sub(1))
            .rev()
            .take_while(|&i| strides[i] == 0 || dims[i] == 1)
            .map(|i| dims[i])
            .product();
        let top = (0..rank.saturating_sub(1))
            .find(|&i| strides[i] != 0)
            .unwrap_or(rank.saturating_sub(1));
        let cols = if rank == 0 { 1 } else { dims[rank - 1] };
        // (A dim of 0 leaves nothing to read: its divisor is never used.)
        let reduced = |d: u64| StrengthReducedU64::new(d.max(1));
        BroadcastReads {
            t,
            kind,
            rank,
            strides,
            cols,
            same_rows: same_rows.max(1),
            top,
            by_cols: reduced(cols),
            by_same_rows: reduced(same_rows),
            by_dim: dims.map(reduced),
        }
    }

    /// The operand offset of (row, c0): the row's index along each axis from the last but one
    /// out to [`top`](Self::top), times the operand's stride there (axes it is broadcast
    /// along only divide the row), the divisions reduced.
    fn offset(&self, row: u64, c0: u64) -> u64 {
        let (top, last) = (self.top, self.rank - 1);
        c0 * self.strides[last]
            + weighted_digits(row, &self.by_dim[top..last], &self.strides[top..last])
    }

    /// Appends the reads of output elements `start .. start + len` to `out` (a region equal
    /// to the last one there is not repeated).
    pub(crate) fn push(&self, start: u64, len: u64, out: &mut Vec<Region>) {
        let t = self.t;
        let mut push = |r: Region| {
            if out.last() != Some(&r) {
                out.push(r);
            }
        };
        match self.kind {
            BroadcastKind::Same => return push(Region::span(t, start, len)),
            BroadcastKind::Scalar => return push(Region::span(t, 0, 1)),
            _ => {}
        }
        let cols = self.cols;
        if len == 0 || cols == 0 {
            return;
        }
        if self.kind == BroadcastKind::PerRow {
            // Each row reads one element; rows that differ only along broadcast axes just
            // above the last (a channel's positions) read the same one: step over them.
            let same_rows = self.same_rows;
            let (first, last) = (start / self.by_cols, (start + len - 1) / self.by_cols);
            let mut row = first;
            while row <= last {
                push(Region::span(t, self.offset(row, 0), 1));
                row = (row / self.by_same_rows + 1) * same_rows;
            }
            return;
        }
        for (row, c0, c1) in row_segments(start, len, cols) {
            push(Region::span(t, self.offset(row, c0), c1 - c0));
        }
    }
}

/// The sum of `value`'s digits in the mixed radix `radices` (outermost first) times
/// `weights`: a row's offset in a tensor of those dims and strides, or an element's group. A
/// digit of weight 0 only divides, and the outermost is not divided out.
/// The radices may be plain `u64`s or divisors made once (`StrengthReducedU64`).
pub(crate) fn weighted_digits<R>(mut value: u64, radices: &[R], weights: &[u64]) -> u64
where
    R: Copy,
    u64: std::ops::Rem<R, Output = u64> + std::ops::Div<R, Output = u64>,
{
    let mut sum = 0;
    for (k, (&r, &w)) in radices.iter().zip(weights).enumerate().rev() {
        if w != 0 {
            sum += (value % r) * w;
        }
        if k > 0 {
            value = value / r;
        }
    }
    sum
}
