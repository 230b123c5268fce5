//! Regions of tensors that vertices read and write: strided blocks, and their joining into
//! as few regions as cover the same elements.

use super::TensorId;
/// Elements of program tensor `tensor`: `rows` runs of `len` elements, the first at `start`
/// and each `stride` elements after the one before (a block of a row-major matrix). A
/// contiguous span has `rows == 1` and `stride == 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Region {
    /// The tensor.
    pub tensor: TensorId,
    /// First element.
    pub start: u64,
    /// Elements per run.
    pub len: u64,
    /// Number of runs.
    pub rows: u64,
    /// Distance between runs' starts.
    pub stride: u64,
}

impl Region {
    /// The contiguous elements `[start, start + len)`.
    pub fn span(tensor: TensorId, start: u64, len: u64) -> Self {
        Region {
            tensor,
            start,
            len,
            rows: 1,
            stride: 0,
        }
    }

    /// `rows` runs of `len` elements, `stride` apart (a span when the runs touch).
    pub fn strided(tensor: TensorId, start: u64, len: u64, rows: u64, stride: u64) -> Self {
        if rows <= 1 || stride == len {
            Region::span(tensor, start, len * rows.max(1))
        } else {
            Region {
                tensor,
                start,
                len,
                rows,
                stride,
            }
        }
    }

    /// Elements covered.
    pub fn elements(&self) -> u64 {
        self.rows * self.len
    }

    /// The runs, as (start, len).
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.rows).map(move |r| (self.start + r * self.stride, self.len))
    }
}

/// How many of the next spans of its length a span is tried against as the second row of a
/// run (an estimate: a tile holds a few channel groups of a grouped layout at once, whose rows
/// interleave in element order).
pub(super) const RUN_CANDIDATES: usize = 8;

/// Joins spans of one tensor, fed in increasing order, into strided regions. Touching spans
/// join first; then spans of one length that are rows of one block (equally far apart)
/// become one region, even when the rows of a few blocks held by one tile (channel groups of
/// a grouped layout) interleave in element order: a span starts a run with whichever of the
/// next spans of its length (up to `RUN_CANDIDATES`) gives the longest run (among equals,
/// the stride most spans of that length recur at, then the nearest), and the run takes every
/// later span at that stride.
#[derive(Clone, Debug, Default)]
pub struct SpanJoiner {
    tensor: TensorId,
    /// The last span, which a touching span extends.
    pub(super) pending: Option<(u64, u64)>,
    /// The spans before it while they are one run (start, len, rows, stride).
    pub(super) run: Option<(u64, u64, u64, u64)>,
    /// The spans before it once they are not (touching ones joined).
    pub(super) spans: Vec<(u64, u64)>,
    /// The spans by length, then start, when they are finished (kept, with `spans`, for the
    /// next use of the joiner: one joiner serves each tile's pieces of every read of a
    /// compute set, and lists made afresh each time cost millions of allocations).
    by_len: Vec<(u64, u64)>,
    /// The room of a class's [`Unused`] places, kept for the next class.
    unused: Vec<u32>,
}

impl SpanJoiner {
    /// A joiner for spans of `tensor`.
    pub fn new(tensor: TensorId) -> Self {
        SpanJoiner {
            tensor,
            pending: None,
            run: None,
            spans: Vec::new(),
            by_len: Vec::new(),
            unused: Vec::new(),
        }
    }

    /// Empties the joiner for spans of `tensor` (keeping its lists' room).
    pub fn reset(&mut self, tensor: TensorId) {
        self.tensor = tensor;
        self.pending = None;
        self.run = None;
        self.spans.clear();
    }

    /// Adds the span `[start, start + len)` (after the spans so far).
    pub fn push(&mut self, start: u64, len: u64) {
        match &mut self.pending {
            Some((s, l)) if *s + *l == start => *l += len,
            _ => {
                if let Some((s, l)) = self.pending.replace((start, len)) {
                    self.commit(s, l);
                }
            }
        }
    }

    /// Takes a finished span: into the run while it continues it, else into the list.
    pub(super) fn commit(&mut self, s: u64, l: u64) {
        if !self.spans.is_empty() {
            self.spans.push((s, l));
            return;
        }
        match &mut self.run {
            None => self.run = Some((s, l, 1, 0)),
            Some((rs, rl, rows, stride))
                if *rl == l && s > *rs && (*rows == 1 || s == *rs + *rows * *stride) =>
            {
                if *rows == 1 {
                    *stride = s - *rs;
                }
                *rows += 1;
            }
            Some((rs, rl, rows, stride)) => {
                let (rs, rl, rows, stride) = (*rs, *rl, *rows, *stride);
                self.spans.extend((0..rows).map(|r| (rs + r * stride, rl)));
                self.spans.push((s, l));
                self.run = None;
            }
        }
    }

    /// Puts the joined regions into `out` and empties the joiner.
    pub fn finish(&mut self, out: &mut Vec<Region>) {
        if let Some((s, l)) = self.pending.take() {
            self.commit(s, l);
        }
        let t = self.tensor;
        if let Some((s, l, rows, stride)) = self.run.take() {
            // One run: one region.
            out.push(Region::strided(t, s, l, rows, stride));
            return;
        }
        if self.spans.is_empty() {
            return;
        }
        // By length, then start.
        let by_len = &mut self.by_len;
        by_len.clear();
        by_len.extend(self.spans.drain(..).map(|(s, l)| (l, s)));
        by_len.sort_unstable();
        for class in by_len.chunk_by(|a, b| a.0 == b.0) {
            let len = class[0].0;
            if class.len() == 1 {
                out.push(Region::span(t, class[0].1, len));
                continue;
            }
            join_class(t, len, class, &mut self.unused, out);
        }
    }
}

/// The index of the first of `class[from..]` (sorted by start) starting at or after `x`,
/// found by galloping from `from`: the next row of a run is mostly near the last.
fn seek(class: &[(u64, u64)], from: usize, x: u64) -> usize {
    let mut step = 1;
    let mut lo = from;
    let mut hi = from;
    while hi < class.len() && class[hi].1 < x {
        lo = hi + 1;
        hi += step;
        step *= 2;
    }
    let hi = hi.min(class.len());
    lo + class[lo..hi].partition_point(|c| c.1 < x)
}

/// How many spans of `class` (sorted by start) have a span of the class starting `d` after
/// them: one pass of two cursors.
fn support_at(class: &[(u64, u64)], d: u64) -> usize {
    let mut k = 0;
    class
        .iter()
        .filter(|&&(_, x)| {
            while k < class.len() && class[k].1 < x + d {
                k += 1;
            }
            k < class.len() && class[k].1 == x + d
        })
        .count()
}

/// [`SpanJoiner::finish`] for the spans of one length `len` (`class`, (len, start) sorted by
/// start, at least two).
fn join_class(
    t: TensorId,
    len: u64,
    class: &[(u64, u64)],
    unused: &mut Vec<u32>,
    out: &mut Vec<Region>,
) {
    let n = class.len();
    // A span fed twice (a region read twice) starts two spans at one place: then a start is
    // looked up in the whole class, which of the two it finds as the first joiner found it.
    let repeats = class.windows(2).any(|w| w[0].1 == w[1].1);
    if !repeats && join_blocks(t, len, class, out) {
        return;
    }
    let at_from = |from: usize, x: u64| {
        if repeats {
            return class.binary_search_by_key(&x, |c| c.1).ok();
        }
        let k = seek(class, from, x);
        (k < n && class[k].1 == x).then_some(k)
    };
    let mut supports: Option<std::collections::HashMap<u64, usize>> = None;
    // The spans no run took, found without walking over the taken ones (runs take spans far
    // ahead, so a scan from each start would walk over the same taken spans again and again).
    let mut free = Unused::new(unused, n);
    for i in 0..n {
        if free.is_taken(i) {
            continue;
        }
        free.take(i);
        let a = class[i].1;
        // (A repeated span, at distance 0, starts no run.)
        let mut next = [0usize; RUN_CANDIDATES];
        let mut found = 0;
        let mut j = free.first_from(i + 1);
        while j < n && found < RUN_CANDIDATES {
            if class[j].1 > a {
                next[found] = j;
                found += 1;
            }
            j = free.first_from(j + 1);
        }
        // Rows a run from `a` with stride `d` would take.
        let rows_at = |free: &Unused<'_>, d: u64| {
            let (mut k, mut rows) = (i, 0usize);
            while rows < n {
                match at_from(k, a + (rows as u64 + 1) * d) {
                    Some(m) if !free.is_taken(m) => {
                        k = m;
                        rows += 1;
                    }
                    _ => break,
                }
            }
            rows
        };
        // Only the longest runs matter (and, among equals, which): a stride whose run cannot
        // reach the longest so far (its row there is missing or taken) is not walked.
        let mut rows = [(0usize, 0usize); RUN_CANDIDATES];
        let mut longest = 0usize;
        for (r, &j) in rows.iter_mut().zip(&next[..found]) {
            let d = class[j].1 - a;
            let reaches = longest == 0
                || a.checked_add((longest as u64).saturating_mul(d))
                    .and_then(|x| at_from(i, x))
                    .is_some_and(|m| !free.is_taken(m));
            let got = if reaches { rows_at(&free, d) } else { 0 };
            longest = longest.max(got);
            *r = (got, j);
        }
        let rows = &rows[..found];
        let Some(most) = rows.iter().map(|r| r.0).max() else {
            out.push(Region::span(t, a, len));
            continue;
        };
        // Among strides giving as many rows, the one most spans of this length have a
        // partner at (the rows of a block are all that far apart; a stride that strings rows
        // of different blocks together rarely recurs), the nearest among equals.
        // (A distance's support depends on the class alone: counted once.)
        let tied = rows.iter().filter(|r| r.0 == most).count();
        let j = if tied == 1 {
            rows.iter().find(|r| r.0 == most).expect("one is tied").1
        } else {
            let supports = supports.get_or_insert_with(Default::default);
            rows.iter()
                .filter(|r| r.0 == most)
                .map(|r| r.1)
                .max_by_key(|&j| {
                    let d = class[j].1 - a;
                    let support = *supports.entry(d).or_insert_with(|| support_at(class, d));
                    (support, std::cmp::Reverse(j))
                })
                .expect("a tie has members")
        };
        let d = class[j].1 - a;
        let (mut k, mut rows) = (i, 1);
        while let Some(m) = at_from(k, a + rows * d).filter(|&m| !free.is_taken(m)) {
            free.take(m);
            k = m;
            rows += 1;
        }
        out.push(Region::strided(t, a, len, rows, d));
    }
}

/// [`join_class`] for a class (distinct starts) whose spans are blocks of rows one after
/// another, as a tile's share of a layout cut by channel groups holds them: each block's rows
/// equally far apart, a block's run not reaching past it and no other candidate stride
/// reaching as many rows. Then the search takes each block as one region, which is what
/// this makes, a block at a time, from a few lookups per block instead of the search's walk
/// of every candidate. Returns false, with `out` as it was, when a block does not show that
/// (the search decides then).
///
/// Why it is the search's answer: when the search comes to a block's first span, every
/// earlier span is taken (by the earlier blocks' regions) and none after it. Its first
/// candidate is the block's second span, at the block's distance `d`; that run takes the
/// block's `rows` further spans and stops, as the span after the block is not at `d`. Every
/// other candidate's run misses a row at or before `rows` (found here, where the search's
/// walk would find it), so it is shorter: the block's run is the longest, untied, and it
/// takes exactly the block.
fn join_blocks(t: TensorId, len: u64, class: &[(u64, u64)], out: &mut Vec<Region>) -> bool {
    let n = class.len();
    let before = out.len();
    let last = class[n - 1].1;
    let mut i = 0;
    while i < n {
        let a = class[i].1;
        if i + 1 == n {
            // The last span alone: no candidate.
            out.push(Region::span(t, a, len));
            return true;
        }
        let d = class[i + 1].1 - a;
        let mut e = i + 1;
        while e + 1 < n && class[e + 1].1 - class[e].1 == d {
            e += 1;
        }
        let rows = (e - i) as u64;
        // Whether the element `a + r * step` starts a span after the block (every one asked
        // about lies after it); `None` when it cannot be said (past `u64`).
        let after = |r: u64, step: u64| -> Option<bool> {
            let x = a.checked_add(r.checked_mul(step)?)?;
            if x > last {
                return Some(false);
            }
            let k = seek(class, e + 1, x);
            Some(k < n && class[k].1 == x)
        };
        // The block's run stops at its end.
        if after(rows + 1, d) != Some(false) {
            out.truncate(before);
            return false;
        }
        let others = &class[i + 2..(i + 1 + RUN_CANDIDATES).min(n)];
        for (j, &(_, b)) in (i + 2..).zip(others) {
            let dj = b - a;
            // Rows of the candidate's run known to be there: those inside the block (a
            // multiple of `d`), or its first (a span after the block).
            let known = if j <= e { rows / (j - i) as u64 } else { 1 };
            // Shorter when the row after those, or the row `rows`, is missing.
            let shorter = known < rows
                && (after(known + 1, dj) == Some(false) || after(rows, dj) == Some(false));
            if !shorter {
                out.truncate(before);
                return false;
            }
        }
        out.push(Region::strided(t, a, len, rows + 1, d));
        i = e + 1;
    }
    true
}

/// The unused places `0..n` of a list, as a union-find over "the next unused place at or
/// after": each place taken points past itself, and lookups halve their paths.
/// Its list is a joiner's, lent for one class (made afresh for each, it cost an allocation
/// per class of every joined tile).
pub(super) struct Unused<'a> {
    next: &'a mut Vec<u32>,
}

impl<'a> Unused<'a> {
    /// Places `0..n`, all unused, in `room` (emptied first).
    pub(super) fn new(room: &'a mut Vec<u32>, n: usize) -> Self {
        room.clear();
        room.extend(0..=n as u32);
        Unused { next: room }
    }

    /// Marks place `i` used.
    pub(super) fn take(&mut self, i: usize) {
        self.next[i] = i as u32 + 1;
    }

    /// Whether place `i` is used.
    pub(super) fn is_taken(&self, i: usize) -> bool {
        self.next[i] as usize != i
    }

    /// The first unused place at or after `i` (`n` when there is none).
    pub(super) fn first_from(&mut self, mut i: usize) -> usize {
        while self.next[i] as usize != i {
            let up = self.next[i] as usize;
            self.next[i] = self.next[up];
            i = up;
        }
        i
    }
}

/// Joins spans into strided regions: spans of equal length at a constant distance become one
/// region. Feed spans of one tensor in increasing order.
#[derive(Clone, Copy, Debug)]
pub struct RunBuilder {
    tensor: TensorId,
    run: Option<(u64, u64, u64, u64)>,
}

impl RunBuilder {
    /// A builder for spans of `tensor`.
    pub fn new(tensor: TensorId) -> Self {
        RunBuilder { tensor, run: None }
    }

    /// Adds the span `[start, start + len)`; returns a finished region when the span does not
    /// continue the current one.
    pub fn push(&mut self, start: u64, len: u64) -> Option<Region> {
        match &mut self.run {
            Some((s, l, rows, stride)) if *l == len => {
                if *rows == 1 && start > *s {
                    *stride = start - *s;
                    *rows = 2;
                    return None;
                }
                if *rows > 1 && start == *s + *rows * *stride {
                    *rows += 1;
                    return None;
                }
            }
            _ => {}
        }
        let done = self.finish();
        self.run = Some((start, len, 1, 0));
        done
    }

    /// The region being built, if any.
    pub fn finish(&mut self) -> Option<Region> {
        self.run
            .take()
            .map(|(s, l, rows, stride)| Region::strided(self.tensor, s, l, rows, stride))
    }
}

/// Joins the spans among `regions` into strided regions, tensor by tensor; keeps strided
/// regions as they are. The result is sorted.
pub fn compress(mut regions: Vec<Region>) -> Vec<Region> {
    compress_from(&mut regions)
}

/// [`compress`], leaving `regions` empty (its capacity kept for reuse).
pub fn compress_from(regions: &mut Vec<Region>) -> Vec<Region> {
    thread_local! {
        /// The joiner this thread's calls reuse (with its lists' room): vertices' regions are
        /// compressed millions of times in a large model's lowering.
        static JOINER: std::cell::RefCell<SpanJoiner> = std::cell::RefCell::default();
    }
    // A vertex's reads mostly come as a few ascending runs (a broadcast operand's channels,
    // read again for each interval of its tile), which the stable sort finds and merges,
    // twice as fast as sorting them afresh. Equal regions are identical, so the order is the
    // one an unstable sort gives.
    regions.sort();
    regions.dedup();
    let mut out = Vec::with_capacity(regions.len());
    JOINER.with_borrow_mut(|j| {
        let mut open = false;
        for r in regions.drain(..) {
            if r.rows > 1 {
                out.push(r);
                continue;
            }
            if !open || j.tensor != r.tensor {
                if open {
                    j.finish(&mut out);
                }
                j.reset(r.tensor);
                open = true;
            }
            j.push(r.start, r.len);
        }
        if open {
            j.finish(&mut out);
        }
    });
    out.sort_unstable();
    out
}
