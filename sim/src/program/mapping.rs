//! Tile mappings: which tile holds which elements of a tensor, as intervals, with what is
//! derived of them (runs per tile, the by-tile order, per-tile sums) and a locator that finds
//! the intervals holding an element.

use super::{Region, RunBuilder, SpanJoiner, TensorId, TileId};

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
    pub(super) derived: std::sync::Arc<Derived>,
}

/// What a [`Mapping`] computes of its intervals once.
#[derive(Default)]
pub(super) struct Derived {
    /// [`Mapping::elements_per_tile`].
    elements: std::sync::OnceLock<Vec<(TileId, u64)>>,
    /// [`Mapping::digest`].
    digest: std::sync::OnceLock<u128>,
    /// [`Mapping::regions_per_tile`].
    regions: std::sync::OnceLock<Vec<(TileId, u64, u64)>>,
    /// [`Mapping::runs_per_tile`].
    runs: std::sync::OnceLock<Vec<(TileId, Vec<Region>)>>,
    /// [`Mapping::intervals_by_tile`], when that order is not the intervals' own.
    pub(super) by_tile: std::sync::OnceLock<Option<Vec<Interval>>>,
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
pub(super) const LOCATOR_FROM: usize = 256;

/// Intervals a [`Locator`] bucket spans on average: each bucket costs 4 bytes (against 20 of
/// an interval), and the search from a bucket's first interval gallops over a few.
const LOCATOR_INTERVALS_PER_BUCKET: u64 = 4;

/// For a large mapping, the first interval ending after each bucket's first element (buckets
/// of `1 << shift` elements): the interval holding element `x` is at or after
/// `first[x >> shift]`, so a search starts there instead of at the front. A summary looks
/// up the runs of strided reads one by one, and each binary search over millions of
/// intervals missed the cache at nearly every step.
pub(super) struct Locator {
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

    /// [`from_intervals`](Self::from_intervals) for disjoint intervals already in order of
    /// their starts (a layout made in order of its elements), without sorting them again.
    pub(crate) fn from_sorted_intervals(intervals: Vec<Interval>) -> Self {
        debug_assert!(intervals.windows(2).all(|w| w[0].end() <= w[1].start));
        Self::of_sorted(intervals)
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

    /// `tile`'s runs of [`runs_per_tile`](Self::runs_per_tile) (regions of tensor 0; none when
    /// the tile holds nothing).
    pub fn runs_on(&self, tile: TileId) -> &[Region] {
        let all = self.runs_per_tile();
        all.binary_search_by_key(&tile, |(t, _)| *t)
            .map_or(&[], |k| all[k].1.as_slice())
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
    pub(super) fn locator(&self) -> Option<&Locator> {
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
