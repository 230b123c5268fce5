//! A lowered program: tensors mapped onto tiles, and a sequence of steps (exchanges, compute
//! sets of vertices, host streams) that run as BSP supersteps.

use std::fmt;

use tessera_core::{DType, NodeId};

/// A tile of one IPU (its index, `0..tiles`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct TileId(pub u32);

impl TileId {
    /// The tile's index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The `k`-th tile counting from tile 0 and wrapping around `tiles` tiles.
    pub fn wrapping(k: u64, tiles: u32) -> TileId {
        TileId((k % u64::from(tiles.max(1))) as u32)
    }
}

impl fmt::Display for TileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A tensor of a [`Program`]: an index into [`Program::tensors`]. Graph tensors come first, at
/// their node's index; the lowering's temporaries follow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    /// The index into [`Program::tensors`].
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The graph tensor of node `node`.
    pub fn of(node: NodeId) -> TensorId {
        TensorId(node.index() as u32)
    }
}

/// Elements `[start, start + len)` of a tensor's flattened data, held by `tile`.
///
/// Packed to 4-byte alignment: 20 bytes rather than 24 with the padding after the tile. A
/// large model's mappings hold tens of millions of intervals (a concatenation's layout is
/// cut finely), and their memory, zeroed by the kernel when first touched, was a large part
/// of an estimate's time. Fields are read by value (a packed field cannot be borrowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C, packed(4))]
pub struct Interval {
    /// The tile holding them.
    pub tile: TileId,
    /// First element.
    pub start: u64,
    /// Number of elements.
    pub len: u64,
}

impl Interval {
    /// One past the last element.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// Where every element of a tensor lives: intervals sorted by `start`, disjoint, covering
/// `0..elements`.
///
/// Copies share the intervals: identical layers' tensors, optimizer state and accumulators
/// are laid out like another tensor, and a large model's mappings would otherwise be most of
/// an estimate's memory.
///
/// The intervals are kept in the vector they were made in (shared through an `Arc`), not
/// copied into a slice of their own: a large mapping's copy came as new pages that the kernel
/// zeroed, and the vector it was copied from was given back, so every large mapping cost its
/// memory twice over.
#[derive(Clone, Default)]
pub struct Mapping {
    intervals: std::sync::Arc<Vec<Interval>>,
    /// What is computed of the intervals, made once and shared by the copies.
    derived: std::sync::Arc<Derived>,
}

/// What a [`Mapping`] computes of its intervals once.
#[derive(Default)]
struct Derived {
    /// [`Mapping::elements_per_tile`].
    elements: std::sync::OnceLock<Vec<(TileId, u64)>>,
    /// [`Mapping::digest`].
    digest: std::sync::OnceLock<u128>,
    /// [`Mapping::regions_per_tile`].
    regions: std::sync::OnceLock<Vec<(TileId, u64, u64)>>,
    /// [`Mapping::runs_per_tile`].
    runs: std::sync::OnceLock<Vec<(TileId, Vec<Region>)>>,
    /// [`Mapping::intervals_by_tile`], when that order is not the intervals' own.
    by_tile: std::sync::OnceLock<Option<Vec<Interval>>>,
    /// [`Mapping::blocks_on`], for every tile.
    blocks: std::sync::OnceLock<TileBlocks>,
    /// Where to start looking for the interval holding an element ([`Locator`]).
    locator: std::sync::OnceLock<Option<Locator>>,
}

/// Every tile's [`Mapping::blocks_on`], with each tile's first block: a tile's blocks are
/// found in this short list of tiles, not by a search over all the blocks (which missed the
/// cache at nearly every step for a large layout).
struct TileBlocks {
    /// Sorted by tile, then start.
    blocks: Vec<(TileId, Region)>,
    /// Each tile holding blocks with the index of its first, sorted by tile.
    first: Vec<(TileId, u32)>,
}

/// Mappings with fewer intervals than this are searched without a [`Locator`]: a binary
/// search over a few hundred intervals stays in the cache.
const LOCATOR_FROM: usize = 256;

/// Intervals a [`Locator`] bucket spans on average: each bucket costs 4 bytes (against 20 of
/// an interval), and the search from a bucket's first interval gallops over a few.
const LOCATOR_INTERVALS_PER_BUCKET: u64 = 4;

/// For a large mapping, the first interval ending after each bucket's first element (buckets
/// of `1 << shift` elements): the interval holding element `x` is at or after
/// `first[x >> shift]`, so a search starts there instead of at the front. A summary looks
/// up the runs of strided reads one by one, and each binary search over millions of
/// intervals missed the cache at nearly every step.
struct Locator {
    /// log2 of the elements of a bucket.
    shift: u32,
    /// By bucket, the index of the first interval ending after the bucket's first element.
    first: Vec<u32>,
}

impl Locator {
    /// The locator of `ivs` (sorted by start, disjoint), if they are many enough to need one.
    fn of(ivs: &[Interval]) -> Option<Locator> {
        if ivs.len() < LOCATOR_FROM || ivs.len() > u32::MAX as usize {
            return None;
        }
        let elements = ivs.last().map_or(0, Interval::end);
        let per_bucket = (elements * LOCATOR_INTERVALS_PER_BUCKET / ivs.len() as u64).max(1);
        let shift = per_bucket.ilog2();
        let buckets = (elements >> shift) as usize + 1;
        let mut first = Vec::with_capacity(buckets);
        let mut k = 0usize;
        for b in 0..buckets as u64 {
            let x = b << shift;
            while k < ivs.len() && ivs[k].end() <= x {
                k += 1;
            }
            first.push(k as u32);
        }
        Some(Locator { shift, first })
    }

    /// An index at or before that of the first interval ending after `x`.
    fn at_or_before(&self, x: u64) -> usize {
        let b = ((x >> self.shift) as usize).min(self.first.len() - 1);
        self.first[b] as usize
    }
}

impl PartialEq for Mapping {
    fn eq(&self, other: &Self) -> bool {
        self.intervals == other.intervals
    }
}

impl Eq for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("intervals", &self.intervals)
            .finish()
    }
}

impl Mapping {
    /// A mapping from intervals; sorts them. The caller guarantees they are disjoint and cover
    /// the tensor (the checker verifies it).
    pub fn from_intervals(mut intervals: Vec<Interval>) -> Self {
        intervals.sort_by_key(|i| i.start);
        Self::of_sorted(intervals)
    }

    /// A mapping from intervals in order of start, kept in their vector (its spare capacity
    /// given back: shrinking a large block in place does not copy it).
    fn of_sorted(mut intervals: Vec<Interval>) -> Self {
        intervals.shrink_to_fit();
        Mapping {
            intervals: std::sync::Arc::new(intervals),
            derived: Default::default(),
        }
    }

    /// [`from_intervals`](Self::from_intervals) for intervals with distinct starts (disjoint
    /// and non-empty), where an unstable sort gives the same order, faster.
    pub(crate) fn from_disjoint_intervals(mut intervals: Vec<Interval>) -> Self {
        intervals.sort_unstable_by_key(|i| i.start);
        debug_assert!(intervals.windows(2).all(|w| w[0].start < w[1].start));
        Self::of_sorted(intervals)
    }

    /// Whether `other` lays its tensor out as this one does (a copy of it, or equal
    /// intervals).
    pub(crate) fn same_layout(&self, other: &Mapping) -> bool {
        std::sync::Arc::ptr_eq(&self.intervals, &other.intervals) || self == other
    }

    /// A 128-bit hash of the intervals (XXH3): equal mappings have equal digests, and
    /// different ones differ but with negligible chance.
    pub fn digest(&self) -> u128 {
        *self.derived.digest.get_or_init(|| self.hash())
    }

    /// Each tile's elements and regions (its intervals joined as [`SpanJoiner`] joins them),
    /// as (tile, elements, regions), sorted by tile.
    pub fn regions_per_tile(&self) -> &[(TileId, u64, u64)] {
        self.derived.regions.get_or_init(|| {
            self.runs_per_tile()
                .iter()
                .zip(self.intervals_by_tile().chunk_by(|a, b| a.tile == b.tile))
                .map(|((tile, runs), group)| {
                    let elements = group.iter().map(|g| g.len).sum();
                    (*tile, elements, runs.len() as u64)
                })
                .collect()
        })
    }

    /// The intervals ordered by tile, then start (a counting sort by tile of the intervals,
    /// which are in order of start); made once and shared by the copies.
    pub fn intervals_by_tile(&self) -> &[Interval] {
        self.derived
            .by_tile
            .get_or_init(|| self.sort_by_tile())
            .as_deref()
            .unwrap_or(&self.intervals)
    }

    /// [`intervals_by_tile`](Self::intervals_by_tile), computed; `None` when the intervals
    /// are in order of tile already (a stable sort by tile would leave them as they are, and
    /// a copy of a large layout's intervals is hundreds of megabytes of fresh pages).
    fn sort_by_tile(&self) -> Option<Vec<Interval>> {
        let ivs = &self.intervals;
        if ivs.windows(2).all(|w| w[0].tile <= w[1].tile) {
            return None;
        }
        let tiles = ivs.iter().map(|i| i.tile.0 as usize + 1).max().unwrap_or(0);
        let mut first = vec![0usize; tiles + 1];
        for iv in ivs.iter() {
            first[iv.tile.0 as usize + 1] += 1;
        }
        for t in 0..tiles {
            first[t + 1] += first[t];
        }
        let mut out = vec![
            Interval {
                tile: TileId(0),
                start: 0,
                len: 0
            };
            ivs.len()
        ];
        for iv in ivs.iter() {
            let k = &mut first[iv.tile.0 as usize];
            out[*k] = *iv;
            *k += 1;
        }
        Some(out)
    }

    /// Each tile's intervals joined as [`SpanJoiner`] joins them (regions of tensor 0, sorted),
    /// by tile; made once and shared by the copies.
    pub fn runs_per_tile(&self) -> &[(TileId, Vec<Region>)] {
        self.derived.runs.get_or_init(|| {
            // One joiner for every tile (its lists' room kept from one to the next).
            let mut j = SpanJoiner::new(TensorId(0));
            self.intervals_by_tile()
                .chunk_by(|a, b| a.tile == b.tile)
                .map(|group| {
                    j.reset(TensorId(0));
                    for iv in group {
                        j.push(iv.start, iv.len);
                    }
                    let mut runs = Vec::new();
                    j.finish(&mut runs);
                    runs.sort_unstable();
                    runs.shrink_to_fit();
                    (group[0].tile, runs)
                })
                .collect()
        })
    }

    /// The blocks `tile` holds: its intervals joined into strided blocks (spans of one length
    /// at one distance, as a [`RunBuilder`] joins the tile's intervals in order of start;
    /// regions of tensor 0), in order of start. Which tile holds which region, for exchange
    /// summaries; made once for all tiles and shared by the copies.
    pub(crate) fn blocks_on(&self, tile: TileId) -> &[(TileId, Region)] {
        let tb = self.tile_blocks();
        match tb.first.binary_search_by_key(&tile, |f| f.0) {
            Ok(k) => {
                let end = tb
                    .first
                    .get(k + 1)
                    .map_or(tb.blocks.len(), |f| f.1 as usize);
                &tb.blocks[tb.first[k].1 as usize..end]
            }
            Err(_) => &[],
        }
    }

    /// Every tile's blocks ([`blocks_on`](Self::blocks_on)) with each tile's first, made once.
    fn tile_blocks(&self) -> &TileBlocks {
        self.derived.blocks.get_or_init(|| {
            let mut blocks = Vec::new();
            let mut first = Vec::new();
            for group in self.intervals_by_tile().chunk_by(|a, b| a.tile == b.tile) {
                let tile = group[0].tile;
                first.push((tile, blocks.len() as u32));
                let mut b = RunBuilder::new(TensorId(0));
                for iv in group {
                    if let Some(done) = b.push(iv.start, iv.len) {
                        blocks.push((tile, done));
                    }
                }
                if let Some(done) = b.finish() {
                    blocks.push((tile, done));
                }
            }
            // Kept for as long as the layout: without the room grown for pushes.
            blocks.shrink_to_fit();
            first.shrink_to_fit();
            TileBlocks { blocks, first }
        })
    }

    /// [`digest`](Self::digest), computed: XXH3-128 of each interval's tile, start and length
    /// (little-endian, 20 bytes an interval), streamed through a small buffer. (Written out
    /// whole first, a large mapping's bytes came as new pages that the kernel zeroed, most of
    /// the time of hashing them.)
    fn hash(&self) -> u128 {
        const PER_CHUNK: usize = 256;
        let mut hasher = xxhash_rust::xxh3::Xxh3Default::new();
        let mut bytes = [0u8; PER_CHUNK * 20];
        for chunk in self.intervals.chunks(PER_CHUNK) {
            for (iv, out) in chunk.iter().zip(bytes.chunks_exact_mut(20)) {
                out[..4].copy_from_slice(&iv.tile.0.to_le_bytes());
                out[4..12].copy_from_slice(&iv.start.to_le_bytes());
                out[12..].copy_from_slice(&iv.len.to_le_bytes());
            }
            hasher.update(&bytes[..chunk.len() * 20]);
        }
        hasher.digest128()
    }

    /// The whole tensor on one tile.
    pub fn single(elements: u64, tile: TileId) -> Self {
        Self::of_sorted(vec![Interval {
            tile,
            start: 0,
            len: elements,
        }])
    }

    /// Spread over `tiles` consecutive tiles from `first_tile` (wrapping at `tile_count`), in
    /// chunks that are multiples of `grain` elements: the fewest tiles that keep every chunk
    /// at least `min_chunk` elements.
    pub fn linear(
        elements: u64,
        grain: u64,
        min_chunk: u64,
        first_tile: TileId,
        tiles: u32,
        tile_count: u32,
    ) -> Self {
        let grain = grain.max(1);
        let per = elements
            .div_ceil(u64::from(tiles.max(1)))
            .max(min_chunk.max(1));
        let per = per.div_ceil(grain) * grain;
        let mut intervals = Vec::with_capacity(elements.div_ceil(per) as usize);
        let mut start = 0;
        let mut k: u64 = 0;
        while start < elements {
            let len = per.min(elements - start);
            let tile = TileId::wrapping(u64::from(first_tile.0) + k, tile_count);
            intervals.push(Interval { tile, start, len });
            start += len;
            k += 1;
        }
        Self::of_sorted(intervals)
    }

    /// The intervals, sorted by start.
    pub fn intervals(&self) -> &[Interval] {
        &self.intervals
    }

    /// Calls `f(tile, start, len)` for every part of `[start, start + len)`, in order.
    pub fn for_each_piece(&self, start: u64, len: u64, mut f: impl FnMut(TileId, u64, u64)) {
        let end = start + len;
        let mut i = self.first_ending_after(self.locator(), 0, start);
        while i < self.intervals.len() && self.intervals[i].start < end {
            let iv = self.intervals[i];
            let s = iv.start.max(start);
            let e = iv.end().min(end);
            if e > s {
                f(iv.tile, s, e - s);
            }
            i += 1;
        }
    }

    /// Calls `f(row_start, tile, start, len)` for every part of every run of `region`, in
    /// order. Successive runs are found by galloping forward from the previous one (or from
    /// where a large mapping's locator places them), so a strided region costs little
    /// more than its pieces.
    pub fn for_each_piece_of(&self, region: &Region, mut f: impl FnMut(u64, TileId, u64, u64)) {
        let ivs = &self.intervals;
        let locator = self.locator();
        let mut i = 0usize;
        for (start, len) in region.runs() {
            i = self.first_ending_after(locator, i, start);
            let end = start + len;
            let mut j = i;
            while j < ivs.len() && ivs[j].start < end {
                let iv = ivs[j];
                let (s, e) = (iv.start.max(start), iv.end().min(end));
                if e > s {
                    f(start, iv.tile, s, e - s);
                }
                j += 1;
            }
        }
    }

    /// The index of the first interval ending after `x`, found by galloping forward from
    /// `from` (at or before it), or from where `locator` places it if that is further on.
    fn first_ending_after(&self, locator: Option<&Locator>, from: usize, x: u64) -> usize {
        let ivs = &self.intervals;
        let mut i = match locator {
            Some(l) => from.max(l.at_or_before(x)),
            None => from,
        };
        let mut step = 1;
        let mut hi = i;
        while hi < ivs.len() && ivs[hi].end() <= x {
            i = hi + 1;
            hi = i + step;
            step *= 2;
        }
        let hi = hi.min(ivs.len());
        i + ivs[i.min(hi)..hi].partition_point(|iv| iv.end() <= x)
    }

    /// The mapping's [`Locator`], made once and shared by the copies (none for a small one).
    fn locator(&self) -> Option<&Locator> {
        self.derived
            .locator
            .get_or_init(|| Locator::of(&self.intervals))
            .as_ref()
    }

    /// Elements held by each tile, as (tile, elements), sorted by tile.
    pub fn elements_per_tile(&self) -> Vec<(TileId, u64)> {
        self.tile_sums().to_vec()
    }

    /// [`elements_per_tile`](Self::elements_per_tile), made once and shared by the copies.
    pub(crate) fn tile_sums(&self) -> &[(TileId, u64)] {
        self.derived.elements.get_or_init(|| self.sum_per_tile())
    }

    /// Elements held by `tile` (from [`elements_per_tile`](Self::elements_per_tile)'s
    /// sums, made once and shared by the copies).
    pub fn elements_on(&self, tile: TileId) -> u64 {
        let sums = self.tile_sums();
        sums.binary_search_by_key(&tile, |s| s.0)
            .map_or(0, |k| sums[k].1)
    }

    /// [`elements_per_tile`](Self::elements_per_tile), summed.
    fn sum_per_tile(&self) -> Vec<(TileId, u64)> {
        // Many intervals on few tiles (a product's output holds a row of a block per
        // interval): sum them by tile in a table rather than sorting them.
        let most = self.intervals.iter().map(|i| i.tile.0).max().unwrap_or(0) as usize;
        if self.intervals.len() > 64 && self.intervals.len() > most / 4 {
            let mut sums: Vec<Option<u64>> = vec![None; most + 1];
            for i in self.intervals.iter() {
                *sums[i.tile.index()].get_or_insert(0) += i.len;
            }
            return sums
                .iter()
                .enumerate()
                .filter_map(|(t, n)| n.map(|n| (TileId(t as u32), n)))
                .collect();
        }
        let mut v: Vec<(TileId, u64)> = self.intervals.iter().map(|i| (i.tile, i.len)).collect();
        v.sort_unstable();
        let mut out: Vec<(TileId, u64)> = Vec::with_capacity(v.len());
        for (t, n) in v {
            match out.last_mut() {
                Some((lt, ln)) if *lt == t => *ln += n,
                _ => out.push((t, n)),
            }
        }
        out
    }

    /// Number of distinct tiles.
    pub fn tile_count(&self) -> usize {
        self.elements_per_tile().len()
    }
}

/// What a program tensor is, for memory reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorClass {
    /// A graph tensor live for the whole program (variables, optimizer state, constants).
    AlwaysLive,
    /// A graph tensor with a live range (inputs, activations, gradients).
    NotAlwaysLive,
    /// A temporary the lowering made (partial sums, gathered operands).
    Temporary,
}

/// A tensor of the program: a graph node's output or a temporary of the lowering.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgTensor {
    /// A name for reports (the node's name, or `<node>/partials`).
    pub name: String,
    /// The graph node it belongs to.
    pub node: NodeId,
    /// Element type.
    pub dtype: DType,
    /// Element count.
    pub elements: u64,
    /// Where its elements live.
    pub mapping: Mapping,
    /// Memory class.
    pub class: TensorClass,
    /// First and last program step at which it holds live data (inclusive).
    pub live: (usize, usize),
    /// Whether it must live in the tiles' interleaved memory: the AMP writes it (partial
    /// sums, or a product's output written straight from the AMP).
    pub interleaved: bool,
}

impl ProgTensor {
    /// Bytes per element.
    pub fn elem_bytes(&self) -> u64 {
        self.dtype.size() as u64
    }
}

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
const RUN_CANDIDATES: usize = 8;

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
    pending: Option<(u64, u64)>,
    /// The spans before it while they are one run (start, len, rows, stride).
    run: Option<(u64, u64, u64, u64)>,
    /// The spans before it once they are not (touching ones joined).
    spans: Vec<(u64, u64)>,
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
    fn commit(&mut self, s: u64, l: u64) {
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
struct Unused<'a> {
    next: &'a mut Vec<u32>,
}

impl<'a> Unused<'a> {
    /// Places `0..n`, all unused, in `room` (emptied first).
    fn new(room: &'a mut Vec<u32>, n: usize) -> Self {
        room.clear();
        room.extend(0..=n as u32);
        Unused { next: room }
    }

    /// Marks place `i` used.
    fn take(&mut self, i: usize) {
        self.next[i] = i as u32 + 1;
    }

    /// Whether place `i` is used.
    fn is_taken(&self, i: usize) -> bool {
        self.next[i] as usize != i
    }

    /// The first unused place at or after `i` (`n` when there is none).
    fn first_from(&mut self, mut i: usize) -> usize {
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

/// The codelet a vertex runs (decides its code size). A tile holds the code of each distinct
/// vertex type it runs once, and a vertex type is a codelet with its template parameters:
/// `popops::BinaryOp1D<ADD, half>` and `popops::BinaryOp1D<MULTIPLY, half>` are two types
/// with two copies of code, as PopVision lists them and PopLiner sums them (vertex code by
/// `vertex.type.name`, `popliner/stage.py`). So the element-wise codelets carry their
/// function and element types ([`VertexType`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Codelet {
    /// Element-wise binary op of one function and element type.
    Binary(VertexType),
    /// Element-wise unary op of one function and element type.
    Unary(VertexType),
    /// Copy.
    Copy,
    /// Cast from one element type to another.
    Cast(VertexType),
    /// Matrix-multiply partial on the AMP.
    MatMulPartial,
    /// Reduction (of partial sums or along an axis) of one operation ([`REDUCE_ADD`],
    /// [`REDUCE_MAX`], [`REDUCE_SQUARE_ADD`], [`REDUCE_OTHER`]) and element types: popops'
    /// `Reduce` vertices are templated on both.
    Reduce(VertexType),
    /// Row-wise softmax or its gradient.
    Softmax,
    /// Cross-entropy or its gradient.
    CrossEntropy,
    /// Weight update (scaled add and optimizer variants).
    Update,
    /// Broadcast along an axis.
    Broadcast,
    /// Rows of a table by index, their gradients added back by index, or one-hot encodings:
    /// popops' `MultiSlice`, `MultiUpdateAdd` and `EncodeOneHot`, one vertex type each
    /// ([`GATHER_ROWS`], [`SCATTER_ADD_ROWS`], [`ONE_HOT`] with the element type).
    Gather(VertexType),
}

/// [`Codelet::Reduce`]'s operation: a sum (poplibs' `ReduceAdd`).
pub const REDUCE_ADD: u8 = 1;
/// [`Codelet::Reduce`]'s operation: a maximum (`ReduceMax`).
pub const REDUCE_MAX: u8 = 2;
/// [`Codelet::Reduce`]'s operation: a sum and a sum of squares (a norm's statistics,
/// `ReduceSquareAdd` beside `ReduceAdd`).
pub const REDUCE_SQUARE_ADD: u8 = 3;
/// [`Codelet::Reduce`]'s operation: a reduction with its own expression (pooling windows, a
/// loss's rows, an optimizer's norms).
pub const REDUCE_OTHER: u8 = 4;

/// [`Codelet::Gather`]'s function: rows by index (`MultiSlice`).
pub const GATHER_ROWS: u8 = 1;
/// [`Codelet::Gather`]'s function: gradient rows added by index (`MultiUpdateAdd`).
pub const SCATTER_ADD_ROWS: u8 = 2;
/// [`Codelet::Gather`]'s function: one-hot encoding (`EncodeOneHot`).
pub const ONE_HOT: u8 = 3;

impl Codelet {
    /// Bytes of code the codelet occupies on every tile that runs it (estimates, the order of
    /// the poplibs codelets' sizes).
    pub const fn code_bytes(self) -> u64 {
        match self {
            Codelet::Binary(_) | Codelet::Unary(_) | Codelet::Cast(_) | Codelet::Gather(_) => 320,
            Codelet::Copy | Codelet::Broadcast => 160,
            Codelet::MatMulPartial => 1_536,
            Codelet::Reduce(_) => 480,
            Codelet::Softmax | Codelet::CrossEntropy => 640,
            Codelet::Update => 384,
        }
    }
}

/// The template parameters that make a codelet a distinct vertex type: an index of its
/// function (the lowering's own numbering of binary and unary functions; 0 for a cast) and
/// its element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VertexType {
    /// The function, numbered by the lowering that makes the vertex.
    pub function: u8,
    /// The element type read.
    pub input: u8,
    /// The element type written.
    pub output: u8,
}

impl VertexType {
    /// Function `function` reading and writing `dtype`.
    pub fn of(function: u8, dtype: tessera_core::DType) -> Self {
        VertexType {
            function,
            input: dtype_index(dtype),
            output: dtype_index(dtype),
        }
    }

    /// A cast from `from` to `to`.
    pub fn cast(from: tessera_core::DType, to: tessera_core::DType) -> Self {
        VertexType {
            function: 0,
            input: dtype_index(from),
            output: dtype_index(to),
        }
    }
}

fn dtype_index(d: tessera_core::DType) -> u8 {
    match d {
        tessera_core::DType::F32 => 0,
        tessera_core::DType::F16 => 1,
        tessera_core::DType::I32 => 2,
        tessera_core::DType::U8 => 3,
    }
}

/// One vertex: a codelet instance on a tile, with the data it reads and writes.
#[derive(Clone, Debug, PartialEq)]
pub struct Vertex {
    /// The tile it runs on.
    pub tile: TileId,
    /// What it runs.
    pub codelet: Codelet,
    /// Its cost in tile cycles.
    pub cycles: u64,
    /// Data it reads (must be on its tile when the compute set runs).
    pub reads: Vec<Region>,
    /// Data it writes (on its tile).
    pub writes: Vec<Region>,
}

impl Vertex {
    /// Bytes of vertex state, field by field as poplibs' codelets lay them out: a pointer
    /// ([`VERTEX_STATE_PER_READ_BYTES`], `ONE_PTR`) for each region read and a pointer with
    /// its count ([`VERTEX_STATE_PER_WRITE_BYTES`], `SPAN`) for each region written, a region
    /// both read and written (in place) once, as a `SPAN`. An AMP vertex's is its struct
    /// ([`AMP_VERTEX_STATE_BYTES`]).
    pub fn state_bytes(&self) -> u64 {
        if self.codelet == Codelet::MatMulPartial {
            // The AMP vertex's state is its struct, whatever regions it covers: their
            // pointers are the contents of its vectors (vertex field data).
            return AMP_VERTEX_STATE_BYTES;
        }
        let in_place = if self.writes.len() <= 8 {
            self.reads
                .iter()
                .filter(|r| self.writes.contains(r))
                .count()
        } else if self.reads.is_sorted() && self.writes.is_sorted() {
            // Both sorted (as joined regions are): one walk over the two.
            let mut w = self.writes.iter().peekable();
            self.reads
                .iter()
                .filter(|r| {
                    while w.next_if(|x| x < r).is_some() {}
                    w.peek() == Some(r)
                })
                .count()
        } else {
            let mut w = self.writes.clone();
            w.sort_unstable();
            self.reads
                .iter()
                .filter(|r| w.binary_search(r).is_ok())
                .count()
        } as u64;
        VERTEX_STATE_PER_READ_BYTES * (self.reads.len() as u64 - in_place)
            + VERTEX_STATE_PER_WRITE_BYTES * self.writes.len() as u64
    }
}

/// Vertex state of an AMP vertex (poplin's `ConvPartial1x1Out`,
/// `lib/poplin/codelets/ConvPartial1x1Out.cpp`): its `in`, `weights` and `out` vectors and its
/// `worklists` are one 4-byte pointer each, and its eight counts and strides
/// (`numConvGroupsM1`, `numOutGroupsM1`, `numInGroups`, `transformedInStride`,
/// `outChansPerGroup`, `transformedOutStride`, `inChansPerGroup` and the limited version's
/// 16-bit types) two bytes each: 32 bytes.
pub const AMP_VERTEX_STATE_BYTES: u64 = 4 * 4 + 8 * 2;

/// Vertex state per region a vertex reads: an input pointer without a count (`ONE_PTR`; poplibs'
/// `binaryOps1D.S`: `VERTEX_IN1_PTR_OFFSET 0`, `VERTEX_IN2_PTR_OFFSET 4`).
pub const VERTEX_STATE_PER_READ_BYTES: u64 = 4;
/// Vertex state per region a vertex writes: a pointer and its element count (`SPAN`; poplibs'
/// `binaryOps1D.S`: `VERTEX_OUT_PTR_OFFSET 8`, `VERTEX_OUT_COUNT_OFFSET 12`). A 1-D binary op
/// is then 16 bytes and a unary op 12, as poplibs' `BinaryOp1D` and `UnaryOp1D` are.
pub const VERTEX_STATE_PER_WRITE_BYTES: u64 = 8;

/// What estimates need of a vertex: where it runs, its codelet, its cycles and its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VertexCost {
    /// The tile it runs on.
    pub tile: TileId,
    /// Its codelet.
    pub codelet: Codelet,
    /// Worker cycles.
    pub cycles: u64,
    /// Bytes of vertex state ([`Vertex::state_bytes`]).
    pub state_bytes: u64,
}

impl From<&Vertex> for VertexCost {
    fn from(v: &Vertex) -> Self {
        VertexCost {
            tile: v.tile,
            codelet: v.codelet,
            cycles: v.cycles,
            state_bytes: v.state_bytes(),
        }
    }
}

/// A set of vertices that run in parallel in one compute phase.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputeSet {
    /// Name for reports (`<node>/<phase>`).
    pub name: String,
    /// The graph node it implements.
    pub node: NodeId,
    /// Its vertices: empty when the lowering kept only what estimates need (`costs` and
    /// `touched`), as estimates of large models do.
    pub vertices: Vec<Vertex>,
    /// What estimates need of each vertex (made from `vertices` by [`ComputeSet::new`]),
    /// shared by the copies: a node's lowering reused by identical nodes keeps its costs once.
    pub costs: std::sync::Arc<[VertexCost]>,
    /// The tensors its vertices read or write, sorted, each once.
    pub touched: Vec<TensorId>,
}

impl ComputeSet {
    /// A compute set of `vertices`, with their costs and the tensors they touch.
    pub fn new(name: String, node: NodeId, vertices: Vec<Vertex>) -> Self {
        let costs = vertices.iter().map(VertexCost::from).collect();
        // A vertex's regions come by tensor: a tensor is listed once for each run of its
        // regions (not once per region) before sorting, which a large compute set's millions
        // of regions made most of the work.
        let mut touched: Vec<TensorId> = Vec::new();
        for r in vertices
            .iter()
            .flat_map(|v| v.reads.iter().chain(&v.writes))
        {
            if touched.last() != Some(&r.tensor) {
                touched.push(r.tensor);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        ComputeSet {
            name,
            node,
            vertices,
            costs,
            touched,
        }
    }

    /// The compute set without its vertices (what estimates need is kept).
    pub fn without_vertices(mut self) -> Self {
        self.vertices = Vec::new();
        self
    }
}

/// One transfer of an exchange: elements of a tensor copied from one tile to another.
/// Transfers sort by sender first, so a region sent to several tiles (a broadcast) is adjacent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Transfer {
    /// Sending tile.
    pub from: TileId,
    /// The data (elements of a program tensor).
    pub region: Region,
    /// Receiving tile.
    pub to: TileId,
}

/// A step of the program.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Moves operands to the tiles of the compute set that follows.
    Exchange {
        /// The graph node whose compute set needs them.
        node: NodeId,
        /// Every transfer, sorted.
        transfers: Vec<Transfer>,
    },
    /// A compute phase.
    Compute(ComputeSet),
    /// Data from the host (an infeed) into a tensor's tiles.
    HostToDevice {
        /// The tensor.
        tensor: TensorId,
        /// Bytes moved.
        bytes: u64,
    },
    /// Data from a tensor's tiles to the host (an outfeed, a tap or a loss).
    DeviceToHost {
        /// The tensor.
        tensor: TensorId,
        /// Bytes moved.
        bytes: u64,
    },
    /// A tensor made on another IPU arrives over the IPU-Links into its copy here.
    LinkReceive {
        /// The copy (a tensor of this program).
        tensor: TensorId,
        /// Bytes moved.
        bytes: u64,
    },
    /// A copy between a tensor's tiles and streaming memory (a remote buffer).
    RemoteBuffer {
        /// The tensor.
        tensor: TensorId,
        /// Bytes moved.
        bytes: u64,
        /// Towards the tiles (true) or towards streaming memory.
        load: bool,
    },
}

/// A lowered program for one IPU.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// Tiles of the IPU it was lowered for.
    pub tiles: u32,
    /// Graph tensors first (index = node index; update nodes have an empty tensor), then
    /// temporaries.
    pub tensors: Vec<ProgTensor>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// For each graph node, the range of steps that implement it.
    pub node_steps: Vec<(usize, usize)>,
    /// Steps whose code (vertex state, exchange code, control code) an earlier identical
    /// node's outlined body holds: sorted, disjoint ranges (see [`crate::lower::LowerOptions::outlining`]).
    pub shared_steps: Vec<(usize, usize)>,
    /// Exchange steps of nodes that lower alike (the same op, shapes and operand layouts:
    /// a repeated layer's, or a recomputed copy's), each with a key that identical
    /// exchanges share: (step, key), by step. A tile's code for such an exchange is the code
    /// of the first with its key unless it sends always-live data (see [`crate::memory`]).
    pub exchange_keys: Vec<(usize, u128)>,
    /// Calls of outlined bodies.
    pub calls: usize,
    /// The tensors calls copy into their bodies' parameters, with the first and last step
    /// the clone (laid out as the tensor) is live.
    pub call_clones: Vec<(TensorId, usize, usize)>,
    /// Graph node names, for reports.
    pub node_names: Vec<String>,
    /// Nodes an inference run executes (a prefix).
    pub forward_nodes: usize,
}

impl Program {
    /// Number of vertices over all compute sets.
    pub fn vertex_count(&self) -> usize {
        self.steps
            .iter()
            .map(|s| match s {
                Step::Compute(cs) => cs.costs.len(),
                _ => 0,
            })
            .sum()
    }
}

/// The exchange a compute set needs: for every region a vertex reads, the parts that live on
/// other tiles, joined into strided regions per sending tile; sorted and without duplicates.
pub fn exchange_for(tensors: &[ProgTensor], vertices: &[Vertex]) -> Vec<Transfer> {
    let mut transfers = Vec::new();
    // Pieces of one region held elsewhere, by sending tile and start: each tile's pieces join
    // into strided transfers (the same piece of every row of a block is one transfer).
    let mut pieces: Vec<(TileId, u64, u64)> = Vec::new();
    let mut joined: Vec<Region> = Vec::new();
    for v in vertices {
        for r in &v.reads {
            let mapping = &tensors[r.tensor.index()].mapping;
            pieces.clear();
            mapping.for_each_piece_of(r, |_, tile, s, l| {
                if tile != v.tile {
                    pieces.push((tile, s, l));
                }
            });
            pieces.sort_unstable();
            for group in pieces.chunk_by(|a, b| a.0 == b.0) {
                let tile = group[0].0;
                let mut b = SpanJoiner::new(r.tensor);
                joined.clear();
                for &(_, s, len) in group {
                    b.push(s, len);
                }
                b.finish(&mut joined);
                transfers.extend(joined.iter().map(|&region| Transfer {
                    from: tile,
                    region,
                    to: v.tile,
                }));
            }
        }
    }
    transfers.sort_unstable();
    transfers.dedup();
    transfers
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A vertex's state follows its codelet's fields: an element-wise vertex a pointer per
    /// region read and a pointer and count per region written; an AMP vertex its struct,
    /// whatever regions it covers.
    #[test]
    fn vertex_state_follows_the_codelets_fields() {
        let vertex = |codelet: Codelet, reads: u64, writes: u64| Vertex {
            tile: TileId(0),
            codelet,
            cycles: 1,
            reads: (0..reads)
                .map(|k| Region::span(TensorId(0), 8 * k, 4))
                .collect(),
            writes: (0..writes)
                .map(|k| Region::span(TensorId(1), 8 * k, 4))
                .collect(),
        };
        let add = Codelet::Binary(VertexType::of(1, tessera_core::DType::F16));
        assert_eq!(vertex(add, 2, 1).state_bytes(), 16);
        assert_eq!(vertex(add, 6, 3).state_bytes(), 48);
        for (reads, writes) in [(2, 1), (12, 4)] {
            assert_eq!(
                vertex(Codelet::MatMulPartial, reads, writes).state_bytes(),
                AMP_VERTEX_STATE_BYTES
            );
        }
    }

    /// The elements of `regions`, sorted.
    fn elements_of(regions: &[Region]) -> Vec<u64> {
        let mut out: Vec<u64> = regions
            .iter()
            .flat_map(|r| r.runs().flat_map(|(s, l)| s..s + l).collect::<Vec<_>>())
            .collect();
        out.sort_unstable();
        out
    }

    /// Intervals of the given (tile, length), one after another from element 0.
    fn back_to_back(pieces: impl IntoIterator<Item = (u32, u64)>) -> Vec<Interval> {
        let mut start = 0;
        pieces
            .into_iter()
            .map(|(tile, len)| {
                let iv = Interval {
                    tile: TileId(tile),
                    start,
                    len,
                };
                start += len;
                iv
            })
            .collect()
    }

    /// The regions a joiner makes of `spans`.
    fn joined(spans: &[(u64, u64)]) -> Vec<Region> {
        let mut j = SpanJoiner::new(TensorId(0));
        for &(s, l) in spans {
            j.push(s, l);
        }
        let mut out = Vec::new();
        j.finish(&mut out);
        out
    }

    /// The regions the joiner made before its search was made faster (kept to check that
    /// the faster one makes the same).
    fn joined_reference(spans: &[(u64, u64)]) -> Vec<Region> {
        let t = TensorId(0);
        let mut j = SpanJoiner::new(t);
        for &(s, l) in spans {
            j.push(s, l);
        }
        let mut out = Vec::new();
        if let Some((s, l)) = j.pending.take() {
            j.commit(s, l);
        }
        if let Some((s, l, rows, stride)) = j.run.take() {
            out.push(Region::strided(t, s, l, rows, stride));
            return out;
        }
        let spans = std::mem::take(&mut j.spans);
        if spans.is_empty() {
            return out;
        }
        // By length, then start.
        let mut by_len: Vec<(u64, u64)> = spans.iter().map(|&(s, l)| (l, s)).collect();
        by_len.sort_unstable();
        for class in by_len.chunk_by(|a, b| a.0 == b.0) {
            let len = class[0].0;
            let starts: Vec<u64> = class.iter().map(|c| c.1).collect();
            let mut used = vec![false; starts.len()];
            let at = |x: u64| starts.binary_search(&x).ok();
            let mut supports: std::collections::HashMap<u64, usize> = Default::default();
            for i in 0..starts.len() {
                if used[i] {
                    continue;
                }
                used[i] = true;
                let a = starts[i];
                // (A repeated span, at distance 0, starts no run.)
                let mut next = [0usize; RUN_CANDIDATES];
                let mut found = 0;
                for j in (i + 1..starts.len()).filter(|&j| !used[j] && starts[j] > a) {
                    next[found] = j;
                    found += 1;
                    if found == RUN_CANDIDATES {
                        break;
                    }
                }
                let next = &next[..found];
                // Rows a run from `a` with stride `d` would take.
                let rows_at = |d: u64| {
                    (1..=starts.len() as u64)
                        .take_while(|&r| at(a + r * d).is_some_and(|k| !used[k]))
                        .count()
                };
                let rows: Vec<(usize, usize)> =
                    next.iter().map(|&j| (rows_at(starts[j] - a), j)).collect();
                let Some(most) = rows.iter().map(|r| r.0).max() else {
                    out.push(Region::span(t, a, len));
                    continue;
                };
                // Among strides giving as many rows, the one most spans of this length have
                // a partner at (the rows of a block are all that far apart; a stride that
                // strings rows of different blocks together rarely recurs), the nearest
                // among equals.
                // (A distance's support depends on the class alone: counted once.)
                let mut support = |d: u64| {
                    *supports
                        .entry(d)
                        .or_insert_with(|| starts.iter().filter(|&&x| at(x + d).is_some()).count())
                };
                let tied: Vec<usize> = rows.iter().filter(|r| r.0 == most).map(|r| r.1).collect();
                let j = if tied.len() == 1 {
                    tied[0]
                } else {
                    tied.iter()
                        .copied()
                        .max_by_key(|&j| (support(starts[j] - a), std::cmp::Reverse(j)))
                        .expect("a tie has members")
                };
                let d = starts[j] - a;
                let mut rows = 1;
                while let Some(k) = at(a + rows * d).filter(|&k| !used[k]) {
                    used[k] = true;
                    rows += 1;
                }
                out.push(Region::strided(t, a, len, rows, d));
            }
        }
        out
    }

    /// Spans (start, len).
    type Spans = Vec<(u64, u64)>;

    /// Column blocks `(gap before, width)` laid side by side in a matrix wider than all of
    /// them, as (start, width), and the spans of each block on each of `rows` rows, in
    /// element order, the `k`-th kept when `keep(k)` (`k` counts the spans kept so far).
    fn block_rows(
        blocks: &[(u64, u64)],
        rows: u64,
        keep: impl Fn(usize) -> bool,
    ) -> (Spans, Spans) {
        let mut cols: Vec<(u64, u64)> = Vec::new();
        let mut c = 0;
        for &(gap, w) in blocks {
            cols.push((c + gap + 1, w));
            c += gap + 1 + w;
        }
        let width = c + 1;
        let mut fed = Vec::new();
        for r in 0..rows {
            for &(c0, w) in &cols {
                if keep(fed.len()) {
                    fed.push((r * width + c0, w));
                }
            }
        }
        (cols, fed)
    }

    /// The first unused place at or after a place skips the taken ones, however they were
    /// taken, and is the end past the last.
    #[test]
    fn unused_places_skip_the_taken_ones() {
        let mut room = Vec::new();
        let mut free = super::Unused::new(&mut room, 10);
        assert_eq!(free.first_from(0), 0);
        for i in [1, 2, 3, 7, 5, 6, 9] {
            free.take(i);
        }
        let firsts: Vec<usize> = (0..=10).map(|i| free.first_from(i)).collect();
        assert_eq!(firsts, [0, 4, 4, 4, 4, 8, 8, 8, 8, 10, 10]);
        let taken: Vec<bool> = (0..10).map(|i| free.is_taken(i)).collect();
        assert_eq!(
            taken,
            [false, true, true, true, false, true, true, true, false, true]
        );
        free.take(4);
        free.take(0);
        assert_eq!(free.first_from(0), 8);
        free.take(8);
        assert_eq!(free.first_from(0), 10);
    }

    /// Spans fed twice (a region read twice) still join, and the joiner ends.
    #[test]
    fn repeated_spans_join_and_end() {
        let spans = [
            (0u64, 4u64),
            (0, 4),
            (10, 4),
            (10, 4),
            (20, 4),
            (7, 1),
            (20, 4),
        ];
        let out = joined(&spans);
        let mut want: Vec<u64> = spans.iter().flat_map(|&(s, l)| s..s + l).collect();
        want.sort_unstable();
        assert_eq!(elements_of(&out), want);
    }

    proptest! {
        /// A vertex's state counts a region both read and written once, whatever the order of
        /// its lists (sorted ones are walked together, others looked up) and however many it
        /// writes.
        #[test]
        fn state_counts_regions_read_and_written_once(
            reads in prop::collection::vec((0u32..3, 0u64..12, 1u64..3), 0..40),
            writes in prop::collection::vec((0u32..3, 0u64..12, 1u64..3), 0..40),
            shift in any::<usize>(),
        ) {
            let region = |&(t, s, l): &(u32, u64, u64)| Region::span(TensorId(t), s, l);
            let reads: Vec<Region> = reads.iter().map(region).collect();
            let writes: Vec<Region> = writes.iter().map(region).collect();
            let vertex = |reads: Vec<Region>, writes: Vec<Region>| Vertex {
                tile: TileId(0),
                codelet: Codelet::Copy,
                cycles: 1,
                reads,
                writes,
            };
            let in_place = reads.iter().filter(|r| writes.contains(r)).count() as u64;
            let want = VERTEX_STATE_PER_READ_BYTES * (reads.len() as u64 - in_place)
                + VERTEX_STATE_PER_WRITE_BYTES * writes.len() as u64;
            let (mut sr, mut sw) = (reads.clone(), writes.clone());
            sr.sort_unstable();
            sw.sort_unstable();
            prop_assert_eq!(vertex(sr.clone(), sw.clone()).state_bytes(), want);
            let (mut rr, mut rw) = (sr, sw);
            if !rr.is_empty() {
                let k = shift % rr.len();
                rr.rotate_left(k);
            }
            if !rw.is_empty() {
                let k = shift % rw.len();
                rw.rotate_left(k);
            }
            prop_assert_eq!(vertex(rr, rw).state_bytes(), want);
        }

        /// A joiner's regions cover exactly the spans fed to it, each element once, in no
        /// more regions than spans; rows of up to `RUN_CANDIDATES` column blocks of a matrix,
        /// interleaved in element order, join into one region per block.
        #[test]
        fn joined_spans_cover_the_spans_and_blocks_join(
            gaps in prop::collection::vec((0u64..6, 1u64..5), 1..60),
            rows in 1u64..20,
            blocks in prop::collection::vec((0u64..8, 1u64..8), 1..=RUN_CANDIDATES),
        ) {
            // Arbitrary increasing spans.
            let (mut at, mut spans) = (0, Vec::new());
            for &(gap, len) in &gaps {
                spans.push((at + gap, len));
                at += gap + len;
            }
            let out = joined(&spans);
            let want: Vec<u64> = spans.iter().flat_map(|&(s, l)| s..s + l).collect();
            prop_assert_eq!(elements_of(&out), want);
            prop_assert!(out.len() <= spans.len());
            // Disjoint column blocks (start, width), each over every row of a matrix whose
            // rows are wider than all of them.
            let (cols, fed) = block_rows(&blocks, rows, |_| true);
            let out = joined(&fed);
            let want: Vec<u64> = fed.iter().flat_map(|&(s, l)| s..s + l).collect();
            prop_assert_eq!(elements_of(&out), want);
            prop_assert!(out.len() <= cols.len(), "{} regions for {} blocks", out.len(), cols.len());
        }

        /// The joiner makes the regions its first, slower search made, for increasing spans
        /// (some fed twice) and for the interleaved rows of column blocks of a matrix.
        #[test]
        fn joined_spans_are_as_the_first_joiner_joined_them(
            gaps in prop::collection::vec((0u64..6, 1u64..4, 0u8..8), 1..80),
            rows in 1u64..12,
            blocks in prop::collection::vec((0u64..5, 1u64..4), 1..12),
            skip in prop::collection::vec(proptest::bool::weighted(0.1), 200),
        ) {
            let (mut at, mut spans) = (0, Vec::new());
            for &(gap, len, twice) in &gaps {
                spans.push((at + gap, len));
                if twice == 0 {
                    spans.push((at + gap, len));
                }
                at += gap + len;
            }
            prop_assert_eq!(joined(&spans), joined_reference(&spans));
            let (_, fed) = block_rows(&blocks, rows, |k| !skip[k % skip.len()]);
            prop_assert_eq!(joined(&fed), joined_reference(&fed));
        }

        /// A region's pieces found from a large mapping's locator are the pieces a scan of
        /// every interval finds, for intervals of very uneven lengths (a locator bucket may
        /// hold many or start inside one) and runs reaching past the tensor.
        #[test]
        fn pieces_found_by_locator_are_the_scanned_pieces(
            lens in prop::collection::vec(prop_oneof![4 => 1u64..8, 1 => 8u64..2000], 200..700),
            regions in prop::collection::vec(
                (0u64..40_000, 1u64..300, 1u64..20, 0u64..3000),
                1..20,
            ),
        ) {
            let intervals = back_to_back((0..).zip(&lens).map(|(k, &len)| (k % 97, len)));
            let start = intervals.last().map_or(0, Interval::end);
            let m = Mapping::from_intervals(intervals.clone());
            prop_assert_eq!(m.locator().is_some(), intervals.len() >= LOCATOR_FROM);
            for &(s, len, rows, stride) in &regions {
                let r = Region::strided(TensorId(0), s % (start + 100), len, rows, stride.max(len));
                let mut got = Vec::new();
                m.for_each_piece_of(&r, |row, t, a, l| got.push((row, t, a, l)));
                let mut want = Vec::new();
                for (rs, rl) in r.runs() {
                    for iv in &intervals {
                        let (a, e) = (iv.start.max(rs), iv.end().min(rs + rl));
                        if e > a {
                            want.push((rs, iv.tile, a, e - a));
                        }
                    }
                }
                prop_assert_eq!(&got, &want);
                let mut first = Vec::new();
                m.for_each_piece(r.start, r.len, |t, a, l| first.push((r.start, t, a, l)));
                let run: Vec<_> = want.iter().copied().filter(|p| p.0 == r.start).collect();
                prop_assert_eq!(first, run);
            }
        }

        /// Blocks of rows one after another (a tile's share of a layout cut by channel
        /// groups), some with spans of another length between them, and blocks whose rows
        /// meet other blocks' strides: the joiner makes the regions its first search made.
        #[test]
        fn blocks_one_after_another_are_joined_as_the_first_joiner_joined_them(
            len in 1u64..4,
            blocks in prop::collection::vec((1u64..20, 0u64..12, 0u64..40, 0u8..4), 1..12),
        ) {
            let (mut at, mut spans) = (0u64, Vec::new());
            for &(rows, extra, gap, other) in &blocks {
                // Rows at least `len + 1` apart, so that they never touch.
                let stride = len + 1 + extra;
                let start = at + gap + 1;
                for r in 0..rows {
                    spans.push((start + r * stride, len));
                }
                at = start + (rows - 1) * stride + len;
                if other == 0 {
                    // A span of another length between blocks.
                    spans.push((at + 1, len + 4));
                    at += len + 5;
                }
            }
            prop_assert_eq!(joined(&spans), joined_reference(&spans));
        }

        /// The intervals by tile are a stable sort of the intervals by tile, whether they
        /// are in order of tile already (then no copy is kept) or not.
        #[test]
        fn intervals_by_tile_are_a_stable_sort_by_tile(
            pieces in prop::collection::vec((0u32..12, 1u64..9), 1..60),
            ascending in proptest::bool::ANY,
        ) {
            let mut pieces = pieces;
            if ascending {
                pieces.sort_by_key(|p| p.0);
            }
            let intervals = back_to_back(pieces);
            let m = Mapping::from_intervals(intervals.clone());
            let mut want = intervals;
            want.sort_by_key(|iv| iv.tile);
            prop_assert_eq!(m.intervals_by_tile(), &want[..]);
            let sorted = m.intervals().windows(2).all(|w| w[0].tile <= w[1].tile);
            prop_assert_eq!(m.derived.by_tile.get().is_some_and(Option::is_none), sorted);
        }

        /// Summing by tile in a table (many intervals) and by sorting (few) agree.
        #[test]
        fn elements_per_tile_sums_each_tiles_intervals(
            ivs in prop::collection::vec((0u32..300, 0u64..50), 0..400),
        ) {
            let intervals = back_to_back(ivs.iter().copied());
            let mut want: Vec<(TileId, u64)> = Vec::new();
            let mut tiles: Vec<u32> = ivs.iter().map(|x| x.0).collect();
            tiles.sort_unstable();
            tiles.dedup();
            for t in tiles {
                let n = ivs.iter().filter(|x| x.0 == t).map(|x| x.1).sum();
                want.push((TileId(t), n));
            }
            prop_assert_eq!(Mapping::from_intervals(intervals).elements_per_tile(), want);
        }

        /// The streamed digest is XXH3-128 of all the intervals' bytes written out whole (the
        /// digest keys kept layouts and records, so it must not change), across chunk edges.
        #[test]
        fn streamed_digest_equals_the_digest_of_the_bytes(
            ivs in prop::collection::vec((0u32..1472, 1u64..1 << 40), 0..700),
        ) {
            let mut start = 0u64;
            let mut bytes = Vec::new();
            let intervals: Vec<Interval> = ivs
                .iter()
                .map(|&(tile, len)| {
                    bytes.extend_from_slice(&tile.to_le_bytes());
                    bytes.extend_from_slice(&start.to_le_bytes());
                    bytes.extend_from_slice(&len.to_le_bytes());
                    let iv = Interval { tile: TileId(tile), start, len };
                    start += len;
                    iv
                })
                .collect();
            prop_assert_eq!(
                Mapping::from_intervals(intervals).digest(),
                xxhash_rust::xxh3::xxh3_128(&bytes)
            );
        }
    }
}
