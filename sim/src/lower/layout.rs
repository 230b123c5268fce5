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

/// The most runs an image is made of ([`sources`]): 2^20, 32 MiB of runs and as many
/// intervals at most. An estimate, far above the runs of the largest layouts of the shipped
/// models (a dense block's concatenation has one per sample; a transpose of BERT-Large's
/// attention at length 384, one per row: 49,152 at batch 8), set so that the estimator's own
/// memory does not grow with a tensor's element count: a pad or concatenation along the last
/// axis of a tensor of millions of short rows would need one run per row. Such an output is
/// laid out as a fresh tensor is (linearly over the tiles), and its copy exchanges what that
/// layout needs.
pub const MAX_IMAGE_RUNS: u64 = 1 << 20;

/// The elements node `i`'s output copies, in output order, as runs; none when they would be
/// more than [`MAX_IMAGE_RUNS`].
fn sources<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &Layout) -> Vec<Source> {
    let so = l.node(i).shape();
    let runs = match *op {
        Layout::Transpose { .. } if so.rank() > 1 => so.elements() as u64 / so.last().max(1) as u64,
        Layout::Concat { axis, .. } => chunks(so, axis).0.saturating_mul(2),
        Layout::Slice { axis, .. } => chunks(so, axis).0,
        _ => 1,
    };
    if runs > MAX_IMAGE_RUNS {
        return Vec::new();
    }
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

/// Images of at least this many intervals whose sources are all runs are made on the rayon
/// pool's threads ([`image_of_runs`]). An estimate: below it, handing out the work costs more
/// than it saves. (A dense block's concatenations hold up to hundreds of thousands, and most
/// of the time of making one is the kernel's first touch of its new pages.)
const PARALLEL_IMAGE_FROM: usize = 1 << 16;

/// [`image_mapping`], made.
fn make_image<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &Layout) -> Mapping {
    let sources = sources(l, i, op);
    let mapping = |t: TensorId| l.tensors[t.index()].mapping.intervals();
    if sources.iter().all(|src| src.stride == 1) {
        if let Some(parts) = run_parts(&sources, mapping) {
            if parts.last().map_or(0, |p| p.from + p.count()) >= PARALLEL_IMAGE_FROM {
                return Mapping::from_disjoint_intervals(image_of_runs(&parts));
            }
        }
    }
    image_walk(&sources, mapping).map_or_else(Mapping::default, Mapping::from_disjoint_intervals)
}

/// The intervals of the image of `sources` (their operands' intervals given by `mapping`),
/// walked source by source; `None` when an operand is not laid out as far as a source reads.
fn image_walk<'a>(
    sources: &[Source],
    mapping: impl Fn(TensorId) -> &'a [Interval],
) -> Option<Vec<Interval>> {
    // Sized up front: a concatenation's image holds every interval of its operands, hundreds
    // of thousands for a dense block's, and growing it copied them several times over. A run
    // of a source (stride 1) has at most one interval per operand interval it meets; a
    // strided one (a transpose's column) is left to grow.
    let bound: usize = sources
        .iter()
        .filter(|src| src.stride == 1 && src.count > 0)
        .map(|src| {
            let ivs = mapping(src.tensor);
            let first = ivs.partition_point(|iv| iv.end() <= src.start);
            let end = ivs.partition_point(|iv| iv.start < src.start + src.count);
            end.saturating_sub(first)
        })
        .sum();
    let mut out: Vec<Interval> = Vec::with_capacity(bound);
    let mut at = 0u64;
    for src in sources {
        let ivs = mapping(src.tensor);
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
            // Not laid out (the operand has no tensor here): no image.
            let iv = ivs.get(k)?;
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
    Some(out)
}

/// A run of an image's sources (stride 1, not empty): the intervals of its operand it meets,
/// `ivs[first..end]`, and where its intervals go in the image.
struct RunPart<'a> {
    ivs: &'a [Interval],
    first: usize,
    end: usize,
    /// The run's first element in its operand, and one past its last.
    start: u64,
    stop: u64,
    /// The image's element where the run goes.
    at: u64,
    /// The index of its first interval among the image's (before neighbours are joined).
    from: usize,
}

impl RunPart<'_> {
    /// The intervals it gives the image (before neighbours are joined).
    fn count(&self) -> usize {
        self.end - self.first
    }

    /// Its `j`-th interval: the elements of the run in its operand's interval `first + j`,
    /// and those of any gap before that interval (as [`make_image`]'s walk gives them).
    fn interval(&self, j: usize) -> Interval {
        let k = self.first + j;
        let iv = self.ivs[k];
        let from = if j == 0 {
            self.start
        } else {
            self.ivs[k - 1].end().max(self.start)
        };
        Interval {
            tile: iv.tile,
            start: self.at + (from - self.start),
            len: iv.end().min(self.stop) - from,
        }
    }
}

/// The runs of `sources` (all of stride 1) with the intervals of their operands (`mapping`)
/// they meet; `None` when an operand's intervals end before a run does (it is not laid out
/// here: no image, as [`make_image`]'s walk finds).
fn run_parts<'a>(
    sources: &[Source],
    mapping: impl Fn(TensorId) -> &'a [Interval],
) -> Option<Vec<RunPart<'a>>> {
    let (mut at, mut from) = (0u64, 0usize);
    let mut parts = Vec::with_capacity(sources.len());
    for src in sources.iter().filter(|src| src.count > 0) {
        let ivs = mapping(src.tensor);
        let stop = src.start + src.count;
        let first = ivs.partition_point(|iv| iv.end() <= src.start);
        let end = ivs.partition_point(|iv| iv.start < stop);
        if end <= first || ivs[end - 1].end() < stop {
            return None;
        }
        let part = RunPart {
            ivs,
            first,
            end,
            start: src.start,
            stop,
            at,
            from,
        };
        at += src.count;
        from += part.count();
        parts.push(part);
    }
    Some(parts)
}

/// The image of runs of operands' elements (`parts`), made on the rayon pool's threads: each
/// operand interval a run meets gives one interval, found on its own, so the threads write
/// them straight into the image (and take the first touch of its pages between them); then
/// neighbours on one tile are joined, as [`make_image`]'s walk joins them as it goes.
fn image_of_runs(parts: &[RunPart<'_>]) -> Vec<Interval> {
    use rayon::prelude::*;
    let total = parts.last().map_or(0, |p| p.from + p.count());
    let mut out: Vec<Interval> = Vec::with_capacity(total);
    (0..total)
        .into_par_iter()
        .with_min_len(PARALLEL_IMAGE_FROM / 8)
        .map(|g| {
            let p = &parts[parts.partition_point(|p| p.from <= g) - 1];
            p.interval(g - p.from)
        })
        .collect_into_vec(&mut out);
    // Join each interval into the one before it when they are on one tile (they always
    // touch: the image's positions run on). An empty operand interval gives an empty one,
    // which the walk never makes: it goes (the first one, at the same place as the next,
    // taking the next's place).
    out.dedup_by(|b, a| {
        if a.len == 0 {
            *a = *b;
            return true;
        }
        let join = b.len == 0 || a.tile == b.tile;
        if join {
            a.len += b.len;
        }
        join
    });
    out
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{image_of_runs, image_walk, run_parts, Source};
    use crate::program::{Interval, TensorId, TileId};

    /// `elements` elements cut at the given places onto the given tiles (few, so that
    /// neighbours often share one): intervals covering them, in order.
    fn cut(elements: u64, cuts: &[(u64, u32)]) -> Vec<Interval> {
        let mut at: Vec<u64> = cuts.iter().map(|c| c.0 % elements).collect();
        at.push(0);
        at.sort_unstable();
        at.dedup();
        at.iter()
            .enumerate()
            .map(|(i, &s)| Interval {
                tile: TileId(cuts.get(i).map_or(0, |c| c.1)),
                start: s,
                len: at.get(i + 1).copied().unwrap_or(elements) - s,
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// The image made on the pool's threads is the one the walk makes, interval for
        /// interval, and both find an operand not laid out as far as a run reads.
        #[test]
        fn an_image_of_runs_is_the_walks(
            sizes in prop::collection::vec(1u64..400, 1..4),
            cuts in prop::collection::vec(prop::collection::vec((0u64..400, 0u32..3), 0..40), 4),
            runs in prop::collection::vec((0usize..4, 0u64..400, 0u64..200), 1..12),
            short in prop::option::of(0usize..4),
        ) {
            let mut operands: Vec<Vec<Interval>> = sizes
                .iter()
                .zip(&cuts)
                .map(|(&n, c)| cut(n, c))
                .collect();
            // One operand laid out only in part (its last interval gone), sometimes.
            if let Some(k) = short.filter(|&k| k < operands.len() && operands[k].len() > 1) {
                operands[k].pop();
            }
            let sources: Vec<Source> = runs
                .iter()
                .map(|&(k, s, n)| {
                    let k = k % sizes.len();
                    let start = s % sizes[k];
                    Source {
                        tensor: TensorId(k as u32),
                        start,
                        count: n.min(sizes[k] - start),
                        stride: 1,
                    }
                })
                .collect();
            let mapping = |t: TensorId| operands[t.index()].as_slice();
            let walked = image_walk(&sources, mapping);
            let parted = run_parts(&sources, mapping).map(|p| image_of_runs(&p));
            prop_assert_eq!(parted, walked);
        }
    }
}
