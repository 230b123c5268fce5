//! Data movement on tiles: views cost nothing (they read their root's tensor), taps are
//! copies laid out like their operand, transposes, concatenations and slices are copies that
//! keep every element on its tile, and pads are copies into a linear layout, receiving what
//! each tile's part needs.
//!
//! PopART grows a transpose, a concatenation or a slice as a view of its operands (a
//! `dimShuffle`, `concat` or `slice` of Poplar tensors) copied into a clone of that view
//! (`cloneNcopy`, willow/src/popx/op/transposex.cpp, concatx.cpp, slicex.cpp): a clone keeps
//! each element's tile, so the copy is on-tile and exchanges nothing; the op's readers then
//! find each element where its producer left it. The TensorFlow backend's transposes are
//! `dimShuffle` views. [`image_mapping`] is that layout.

use tessera_core::ops::layout::Layout;
use tessera_core::{NodeId, Shape, Storage};

use super::{row_segments, Lowering, Placement};
use crate::cost::UnaryKind;
use crate::program::{Codelet, Interval, Mapping, Region, TensorId};

pub(super) fn placement(op: &Layout) -> Placement {
    match *op {
        Layout::Reshape { .. } => Placement::Nothing,
        Layout::Tap { x } => Placement::Like(x),
        Layout::Transpose { .. } | Layout::Concat { .. } | Layout::Slice { .. } => Placement::Image,
        Layout::Pad { .. } => Placement::Rows(1),
    }
}

/// A transpose of `x` (shape `sx`) into shape `so`, row by row: output row `row` (every axis
/// but the last) reads `x` from [`offset`](Self::offset), [`stride`](Self::stride) apart.
struct Transposed {
    so: Shape,
    /// `x`'s stride for each output axis.
    ps: Vec<u64>,
}

impl Transposed {
    fn new(sx: Shape, so: Shape, perm: &[u8]) -> Self {
        let r = so.rank();
        let mut st = vec![0u64; r];
        let mut acc = 1u64;
        for a in (0..r).rev() {
            st[a] = acc;
            acc *= sx.dim(a) as u64;
        }
        let ps = (0..r).map(|a| st[perm[a] as usize]).collect();
        Transposed { so, ps }
    }

    /// Where output row `row` starts in `x`.
    fn offset(&self, row: u64) -> u64 {
        let r = self.so.rank();
        let (mut rem, mut off) = (row, 0);
        for a in (0..r - 1).rev() {
            let d = self.so.dim(a) as u64;
            off += (rem % d) * self.ps[a];
            rem /= d;
        }
        off
    }

    /// The distance in `x` between neighbours along the output's last axis.
    fn stride(&self) -> u64 {
        self.ps[self.so.rank() - 1]
    }
}

/// A run of the elements an output copies, in output order: `count` elements of `tensor`
/// from `start`, `stride` apart.
#[derive(Clone, Copy)]
struct Source {
    tensor: TensorId,
    start: u64,
    count: u64,
    stride: u64,
}

/// The elements node `i`'s output copies, in output order, as runs.
fn sources<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &Layout) -> Vec<Source> {
    let so = l.node(i).shape();
    let span = |tensor, start, count| Source {
        tensor,
        start,
        count,
        stride: 1,
    };
    match *op {
        Layout::Transpose { x, perm } if so.rank() > 1 => {
            let (xt, tr) = (l.t(x), Transposed::new(l.node(x).shape(), so, &perm));
            let cols = so.last() as u64;
            let rows = so.elements() as u64 / cols.max(1);
            (0..rows)
                .map(|row| Source {
                    tensor: xt,
                    start: tr.offset(row),
                    count: cols,
                    stride: tr.stride(),
                })
                .collect()
        }
        Layout::Transpose { x, .. } => vec![span(l.t(x), 0, so.elements() as u64)],
        Layout::Concat { a, b, axis } => {
            let (ta, tb) = (l.t(a), l.t(b));
            let ca = chunks(l.node(a).shape(), axis).1;
            let cb = chunks(l.node(b).shape(), axis).1;
            let outer = chunks(so, axis).0;
            (0..outer)
                .flat_map(|r| [span(ta, r * ca, ca), span(tb, r * cb, cb)])
                .filter(|s| s.count > 0)
                .collect()
        }
        Layout::Slice { x, axis, start } => {
            let sx = l.node(x).shape();
            let cx = chunks(sx, axis).1;
            let (outer, c) = chunks(so, axis);
            let at = u64::from(start) * (cx / sx.dim(axis as usize) as u64);
            (0..outer).map(|r| span(l.t(x), r * cx + at, c)).collect()
        }
        Layout::Reshape { .. } | Layout::Tap { .. } | Layout::Pad { .. } => Vec::new(),
    }
}

/// Image layouts made so far in this process, by what they are made of (the op, its shapes
/// and its operands' mappings): the same op of every repeated layer, stage, split and sweep
/// configuration is laid out once. At most 1024 are kept (an estimate: a few models' worth of
/// distinct layout ops).
static IMAGES: super::kept::Kept<u128, Mapping> = super::kept::Kept::new(1024);

/// The layout of layout op `i`'s output as PopART's `cloneNcopy` of a view makes it: each
/// element on the tile of the operand element it copies (see the module's text). Empty when
/// the op has no such layout.
pub(super) fn image_mapping<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &Layout) -> Mapping {
    let node = l.node(i);
    let operands = node.op().operands();
    let mut facts = format!(
        "{}|{}|{:?}",
        super::op_by_place(node.op(), operands.as_slice()),
        node.shape(),
        node.dtype()
    );
    for &x in operands.as_slice() {
        let m = &l.tensors[l.t(x).index()].mapping;
        facts.push_str(&format!("|{}|{:x}", l.node(x).shape(), m.digest()));
    }
    let key = xxhash_rust::xxh3::xxh3_128(facts.as_bytes());
    IMAGES.get_or_make(key, || make_image(l, i, op))
}

/// Drops the image layouts this process keeps ([`IMAGES`]).
pub(super) fn clear_images() {
    IMAGES.clear();
}

/// [`image_mapping`], made.
fn make_image<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &Layout) -> Mapping {
    let sources = sources(l, i, op);
    // Sized up front: a concatenation's image holds every interval of its operands, hundreds
    // of thousands for a dense block's, and growing it copied them several times over. A run
    // of a source (stride 1) has at most one interval per operand interval it meets; a
    // strided one (a transpose's column) is left to grow.
    let bound: usize = sources
        .iter()
        .filter(|src| src.stride == 1 && src.count > 0)
        .map(|src| {
            let ivs = l.tensors[src.tensor.index()].mapping.intervals();
            let first = ivs.partition_point(|iv| iv.end() <= src.start);
            let end = ivs.partition_point(|iv| iv.start < src.start + src.count);
            end.saturating_sub(first)
        })
        .sum();
    let mut out: Vec<Interval> = Vec::with_capacity(bound);
    let mut at = 0u64;
    for src in sources {
        let ivs = l.tensors[src.tensor.index()].mapping.intervals();
        let (mut pos, mut left) = (src.start, src.count);
        let mut k = ivs.partition_point(|iv| iv.end() <= pos);
        while left > 0 {
            // The interval holding `pos`: the next one when a run goes on into it (as a
            // concatenation's or a slice's does), else found by galloping on from the last
            // (positions rise within a run).
            if ivs.get(k).is_some_and(|iv| iv.end() <= pos) {
                k += 1;
                if ivs.get(k).is_some_and(|iv| iv.end() <= pos) {
                    let mut step = 1;
                    while k + step < ivs.len() && ivs[k + step].start <= pos {
                        k += step;
                        step *= 2;
                    }
                    let hi = (k + step + 1).min(ivs.len());
                    k += ivs[k..hi].partition_point(|iv| iv.end() <= pos);
                }
            }
            let Some(iv) = ivs.get(k) else {
                // Not laid out (the operand has no tensor here): no image.
                return Mapping::default();
            };
            // The positions of the run left in this interval (no division for a plain run,
            // the common case: one per interval of a large concatenation).
            let n = if src.stride <= 1 {
                iv.end() - pos
            } else {
                (iv.end() - pos - 1) / src.stride + 1
            }
            .min(left);
            match out.last_mut() {
                Some(last) if last.tile == iv.tile && last.end() == at => last.len += n,
                _ => out.push(Interval {
                    tile: iv.tile,
                    start: at,
                    len: n,
                }),
            }
            at += n;
            pos += n * src.stride;
            left -= n;
        }
    }
    Mapping::from_disjoint_intervals(out)
}

/// (outer, elements per outer index) of `s` from `axis` on.
fn chunks(s: Shape, axis: u8) -> (u64, u64) {
    let (outer, len, inner) = s.split_at_axis(axis as usize);
    (outer as u64, (len * inner) as u64)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Layout) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, so) = (node.dtype(), node.shape());
    let out = l.t(i);
    let copy = move |n| UnaryKind::Copy.cycles(cfg, n, dt);
    match *op {
        Layout::Reshape { .. } => {}
        Layout::Tap { x } => {
            let xt = l.t(x);
            l.elementwise(i, out, &[xt], Codelet::Copy, copy, |_, _, _| {});
        }
        Layout::Transpose { x, .. } if so.rank() <= 1 => {
            // Nothing moves: a copy.
            let xt = l.t(x);
            l.elementwise(i, out, &[xt], Codelet::Copy, copy, |_, _, _| {});
        }
        Layout::Transpose { x, perm } => {
            let (xt, tr) = (l.t(x), Transposed::new(l.node(x).shape(), so, &perm));
            let cols = so.last() as u64;
            l.per_tile(i, "transpose", out, Codelet::Copy, copy, |iv, reads| {
                for (row, c0, c1) in row_segments(iv.start, iv.len, cols) {
                    let off = tr.offset(row) + c0 * tr.stride();
                    reads.push(Region::strided(xt, off, 1, c1 - c0, tr.stride()));
                }
            });
        }
        Layout::Concat { a, b, axis } => {
            let (ta, tb) = (l.t(a), l.t(b));
            let ca = chunks(l.node(a).shape(), axis).1;
            let cb = chunks(l.node(b).shape(), axis).1;
            l.per_tile(i, "concat", out, Codelet::Copy, copy, |iv, reads| {
                for (r, c0, c1) in row_segments(iv.start, iv.len, ca + cb) {
                    if c0 < ca {
                        reads.push(Region::span(ta, r * ca + c0, c1.min(ca) - c0));
                    }
                    if c1 > ca {
                        let b0 = c0.max(ca) - ca;
                        reads.push(Region::span(tb, r * cb + b0, c1 - ca - b0));
                    }
                }
            });
        }
        Layout::Slice { x, axis, start } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let cx = chunks(sx, axis).1;
            let c = chunks(so, axis).1;
            let at = u64::from(start) * (cx / sx.dim(axis as usize) as u64);
            l.per_tile(i, "slice", out, Codelet::Copy, copy, |iv, reads| {
                reads.extend(
                    row_segments(iv.start, iv.len, c)
                        .into_iter()
                        .map(|(r, c0, c1)| Region::span(xt, r * cx + at + c0, c1 - c0)),
                );
            });
        }
        Layout::Pad { x, axis, before } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let cx = chunks(sx, axis).1;
            let c = chunks(so, axis).1;
            let at = u64::from(before) * (c / so.dim(axis as usize) as u64);
            l.per_tile(i, "pad", out, Codelet::Copy, copy, |iv, reads| {
                for (r, c0, c1) in row_segments(iv.start, iv.len, c) {
                    let (s, e) = (c0.max(at), c1.min(at + cx));
                    if s < e {
                        reads.push(Region::span(xt, r * cx + s - at, e - s));
                    }
                }
            });
        }
    }
}
