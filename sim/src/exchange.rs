//! What the estimate needs of an exchange, without its transfers: bytes each tile receives and
//! sends, its exchange code, the tiles taking part and the tensors moved.
//!
//! An exchange's transfers are the set of (sender, region, receiver) triples that
//! [`exchange_for`](crate::program::exchange_for) makes. Large programs have millions of them
//! (every row of a block read from another tile is one), and most are repeats: a block a
//! matmul reads is sent to every tile of its row of the grid. [`summarize_vertices`] computes
//! the summary from the distinct regions the vertices read (each region's pieces are found
//! once) and the tiles that read each, without listing the transfers; [`summarize`] computes
//! it from a list of transfers. Both give the same summary.
//!
//! Two tiles share an exchange bus (a "supertile": tiles `2j` and `2j + 1`), and data sent to
//! both tiles of a pair is received by both in the same cycles (ARCH.md; poplin's
//! `ExchangeEstimator` prices a broadcast to a pair at twice the rate,
//! `Target::getTilesPerSharedExchangeBus`). A summary counts, per tile, the bytes it receives
//! that its pair partner also receives from the same sender in the same exchange; those take
//! half the time.
//!
//! The summaries kept for reuse (by what an exchange depends on, and by program step) are in
//! `kept`.

use crate::program::{
    ProgTensor, Region, SpanJoiner, TensorClass, TensorId, TileId, Transfer, Vertex,
};

mod kept;

use kept::{RunKey, SpreadRead};
pub(crate) use kept::{SpreadKey, SpreadSummaries, Summaries};

/// Exchange code per exchange a tile takes part in (estimate).
pub const EXCHANGE_CODE_BYTES: u64 = 16;
/// Exchange code per region a tile sends, once however many tiles receive it (estimate: a
/// send instruction with its address and length).
pub const EXCHANGE_CODE_PER_SEND_BYTES: u64 = 8;
/// Exchange code per region a tile receives (estimate: a receive-address update).
pub const EXCHANGE_CODE_PER_RECEIVE_BYTES: u64 = 4;

/// A hasher for regions and other small keys of integers (multiply and rotate, as rustc's
/// FxHash): the default SipHash costs more than the work it indexes here.
#[derive(Clone, Copy, Default)]
pub(crate) struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// Builds [`FastHasher`]s.
pub(crate) type FastHash = std::hash::BuildHasherDefault<FastHasher>;

/// One tile taking part in an exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExchangeTile {
    /// The tile.
    pub tile: TileId,
    /// Whether it receives anything.
    pub receives: bool,
    /// Bytes it receives.
    pub received: u64,
    /// Of those, the bytes its pair partner (the other tile of its exchange bus) receives too,
    /// from the same sender: they arrive at twice the rate.
    pub paired: u64,
    /// Bytes of exchange code it needs for this exchange.
    pub code: u64,
    /// Regions it sends (one send each, however many tiles receive it).
    pub sends: u64,
    /// Regions it receives.
    pub receive_count: u64,
    /// Of the regions it sends, those of always-live tensors (weights, optimizer state):
    /// their addresses differ from one layer's exchange to the next identical one, so its
    /// code for the exchange is its own ([`crate::memory`] shares the rest).
    pub state_sends: u64,
}

/// An exchange as the estimate sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ExchangeSummary {
    /// Bytes moved between tiles (a region sent to several tiles counted once).
    pub bytes: u64,
    /// The busiest tile's larger direction, in bytes at one tile's rate: the bytes it sends,
    /// or the bytes it receives with those its pair partner receives too counted half.
    pub busiest: u64,
    /// The lowest and highest tile taking part.
    pub tiles_range: (u32, u32),
    /// Every tile taking part, by tile: shared by the copies (a summary is kept by the
    /// lowering's records and copied into every program that replays them, and a large
    /// exchange has a row for each of an IPU's 1,472 tiles).
    pub tiles: std::sync::Arc<[ExchangeTile]>,
    /// The tensors moved, sorted.
    pub tensors: Vec<TensorId>,
}

/// Per-tile tallies of one exchange.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    received: u64,
    paired: u64,
    receives: u64,
    sent: u64,
    sends: u64,
    state_sends: u64,
}

impl Tally {
    /// Adds `o`'s counts.
    fn add(&mut self, o: &Tally) {
        self.received += o.received;
        self.paired += o.paired;
        self.receives += o.receives;
        self.sent += o.sent;
        self.sends += o.sends;
        self.state_sends += o.state_sends;
    }
}

/// An exchange's tallies so far: what each tile sends and receives (sized for the IPU's
/// tiles on first use), the bytes moved and the tensors moved. Reads of different tensors
/// add up: each distinct region read adds its own counts, and a group is sent for two reads
/// only when they are of one tensor.
struct Tallied {
    tiles: u32,
    tally: Vec<Tally>,
    bytes: u64,
    moved: Vec<TensorId>,
}

impl Tallied {
    fn new(tiles: u32) -> Self {
        Tallied {
            tiles,
            tally: Vec::new(),
            bytes: 0,
            moved: Vec::new(),
        }
    }

    /// The tiles' tallies.
    fn rows(&mut self) -> &mut [Tally] {
        if self.tally.is_empty() {
            self.tally = vec![Tally::default(); self.tiles as usize];
        }
        &mut self.tally
    }

    /// The summary, or `None` when nothing moves.
    fn finish(mut self) -> Option<ExchangeSummary> {
        if self.moved.is_empty() {
            return None;
        }
        self.moved.sort_unstable();
        self.moved.dedup();
        Some(finish(&self.tally, self.bytes, self.moved))
    }
}

/// What reading one tensor adds to an exchange's tallies ([`Tallied`]): the rows of the tiles
/// it adds to, the bytes, and whether it moves at all.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Contribution {
    rows: Vec<(TileId, Tally)>,
    bytes: u64,
    moved: bool,
}

impl Contribution {
    /// The reads of one tensor, tallied alone.
    fn of(t: Tallied) -> Self {
        let rows = t
            .tally
            .iter()
            .enumerate()
            .filter(|(_, r)| **r != Tally::default())
            .map(|(k, r)| (TileId(k as u32), *r))
            .collect();
        Contribution {
            rows,
            bytes: t.bytes,
            moved: !t.moved.is_empty(),
        }
    }

    /// Adds it to `into`, for tensor `t`.
    fn add_to(&self, into: &mut Tallied, t: TensorId) {
        if !self.moved {
            return;
        }
        let rows = into.rows();
        for (tile, r) in &self.rows {
            rows[tile.index()].add(r);
        }
        into.bytes += self.bytes;
        into.moved.push(t);
    }
}

fn finish(tally: &[Tally], bytes: u64, tensors: Vec<TensorId>) -> ExchangeSummary {
    let tiles: std::sync::Arc<[ExchangeTile]> = tally
        .iter()
        .enumerate()
        .filter(|(_, t)| t.receives > 0 || t.sends > 0)
        .map(|(tile, t)| ExchangeTile {
            tile: TileId(tile as u32),
            receives: t.receives > 0,
            received: t.received,
            paired: t.paired,
            code: EXCHANGE_CODE_BYTES
                + EXCHANGE_CODE_PER_RECEIVE_BYTES * t.receives
                + EXCHANGE_CODE_PER_SEND_BYTES * t.sends,
            sends: t.sends,
            receive_count: t.receives,
            state_sends: t.state_sends,
        })
        .collect();
    let busiest = tally
        .iter()
        .map(|t| (t.received - t.paired / 2).max(t.sent))
        .max()
        .unwrap_or(0);
    let tiles_range = tiles.iter().fold((u32::MAX, 0), |(l, h), t| {
        (l.min(t.tile.0), h.max(t.tile.0))
    });
    ExchangeSummary {
        bytes,
        busiest,
        tiles_range,
        tiles,
        tensors,
    }
}

/// The summary of an exchange given as its transfers (sorted and without duplicates, as
/// [`exchange_for`](crate::program::exchange_for) makes them).
pub(crate) fn summarize(
    tiles: u32,
    tensors: &[ProgTensor],
    transfers: &[Transfer],
) -> ExchangeSummary {
    let mut tally = vec![Tally::default(); tiles as usize];
    let mut bytes = 0;
    let mut moved: Vec<TensorId> = Vec::new();
    // The transfers of one (sender, region) are together: one send to all their receivers.
    for same in transfers.chunk_by(|a, b| (a.from, a.region) == (b.from, b.region)) {
        let (from, region) = (same[0].from, same[0].region);
        let b = region.elements() * tensors[region.tensor.index()].elem_bytes();
        for tr in same {
            let to = &mut tally[tr.to.index()];
            to.received += b;
            to.receives += 1;
            if same.iter().any(|o| o.to == partner(tr.to)) {
                to.paired += b;
            }
        }
        let f = &mut tally[from.index()];
        f.sent += b;
        f.sends += 1;
        if tensors[region.tensor.index()].class == TensorClass::AlwaysLive {
            f.state_sends += 1;
        }
        bytes += b;
        moved.push(region.tensor);
    }
    moved.sort_unstable();
    moved.dedup();
    finish(&tally, bytes, moved)
}

/// The other tile of `t`'s exchange bus.
fn partner(t: TileId) -> TileId {
    TileId(t.0 ^ 1)
}

/// Whether `p`, the partner of the `k`-th tile of `sorted` (distinct tiles, in order), is in
/// `sorted`: partners are neighbours in tile order, so it can only be next to that tile.
fn beside(sorted: &[TileId], k: usize, p: TileId) -> bool {
    (k > 0 && sorted[k - 1] == p) || sorted.get(k + 1) == Some(&p)
}

/// A distinct region the vertices read: its pieces on each tile, joined as
/// [`exchange_for`](crate::program::exchange_for) joins them, and the tiles reading it (ranges
/// of flat lists shared by all the reads of a compute set).
struct Read {
    /// (sender, region) of every piece group, sorted, without duplicates.
    groups: std::ops::Range<usize>,
    /// Per sending tile: (tile, bytes, regions), sorted by tile.
    per_tile: std::ops::Range<usize>,
    bytes: u64,
    count: u64,
    /// Distinct tiles reading it (in the (region, tile) pairs).
    readers: std::ops::Range<usize>,
}

/// Flat lists of a compute set's reads.
#[derive(Default)]
struct Lists {
    pieces: Vec<(TileId, u64, u64)>,
    joined: Vec<Region>,
    groups: Vec<(TileId, Region)>,
    per_tile: Vec<(TileId, u64, u64)>,
    /// Joins each tile's pieces of a read (when they come out of order).
    joiner: SpanJoiner,
    /// Joins each tile's pieces of a read as they come (in order).
    tiles: TileJoiners,
}

/// A joiner for each tile a read's pieces lie on, fed as the pieces come, instead of
/// gathering the pieces and sorting them by tile first (that sort was most of the cost of
/// finding a read's groups). The joiners and the table are kept from one read to the next.
#[derive(Default)]
struct TileJoiners {
    /// By tile: the index in `used` of the tile's joiner, or `u32::MAX` for none.
    slot_of: Vec<u32>,
    /// The tiles of the read so far, with their joiners' indices, in order of first piece.
    used: Vec<(TileId, u32)>,
    /// The joiners (as many as the most tiles one read has met).
    joiners: Vec<SpanJoiner>,
}

impl TileJoiners {
    /// The index of `tile`'s joiner for this read (a new one, emptied for `tensor`, the first
    /// time the read meets the tile).
    fn joiner_of(&mut self, tile: TileId, tensor: TensorId) -> usize {
        let i = tile.index();
        if i >= self.slot_of.len() {
            self.slot_of.resize(i + 1, u32::MAX);
        }
        match self.slot_of[i] {
            u32::MAX => {
                let k = self.used.len();
                if k == self.joiners.len() {
                    self.joiners.push(SpanJoiner::new(tensor));
                } else {
                    self.joiners[k].reset(tensor);
                }
                self.used.push((tile, k as u32));
                self.slot_of[i] = k as u32;
                k
            }
            k => k as usize,
        }
    }

    /// Forgets the read's tiles (their joiners are reset when next used).
    fn clear(&mut self) {
        for &(tile, _) in &self.used {
            self.slot_of[tile.index()] = u32::MAX;
        }
        self.used.clear();
    }
}

/// Joins the pieces of `r` (of tensor `t`) tile by tile as they come, when they come in
/// increasing start, appending each tile's groups (sorted) to `groups`, tiles in order: what
/// ordering the pieces by tile and joining each tile's gives. `false`, with nothing appended,
/// when some piece starts at or before the one before it.
fn join_by_tile(
    t: &ProgTensor,
    r: &Region,
    tiles: &mut TileJoiners,
    joined: &mut Vec<Region>,
    groups: &mut Vec<(TileId, Region)>,
) -> bool {
    let mut increasing = true;
    let mut last_start: Option<u64> = None;
    // The tile of the last piece and its joiner: pieces mostly come several to a tile.
    let mut last = (TileId(u32::MAX), 0usize);
    t.mapping.for_each_piece_of(r, |_, tile, s, l| {
        if !increasing {
            return;
        }
        if last_start.is_some_and(|p| p >= s) {
            increasing = false;
            return;
        }
        last_start = Some(s);
        if tile != last.0 {
            last = (tile, tiles.joiner_of(tile, r.tensor));
        }
        tiles.joiners[last.1].push(s, l);
    });
    if increasing {
        tiles.used.sort_unstable();
        for &(tile, k) in &tiles.used {
            joined.clear();
            tiles.joiners[k as usize].finish(joined);
            joined.sort_unstable();
            groups.extend(joined.iter().map(|&g| (tile, g)));
        }
    }
    tiles.clear();
    increasing
}

/// Tensors that every vertex reads the same way from its tile of one layout, and no vertex
/// reads otherwise: the `k`th vertex, on the `k`th tile of the layout (by
/// [`runs_per_tile`](crate::program::Mapping::runs_per_tile)), reads the tile's runs of each
/// ([`PerTile::Runs`]), or the operand's elements that the tile's elements read by broadcast
/// ([`PerTile::Broadcast`]). What such a read adds to an exchange depends only on the two
/// layouts, how the tiles read, and the tensor's element size and class: it is kept in `kept`
/// for the next compute set that reads alike (a batch norm's gradient reads `dy` on the tiles
/// of `x` for its statistics and again for its element-wise pass; its normalisation, the
/// normalisation again and the gradient read the statistics alike).
pub(crate) struct RunReads<'a> {
    /// The digest of the layout whose tiles the vertices are on.
    pub over: u128,
    /// The tensors read so, with how each tile reads them.
    pub tensors: &'a [(TensorId, PerTile)],
    /// What each such read adds, kept.
    pub kept: &'a SpreadSummaries,
}

/// How each tile of a layout reads a tensor ([`RunReads`]): what it reads depends only on the
/// layout and this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PerTile {
    /// Its runs of the layout.
    Runs,
    /// The elements of an operand of shape `from`, `values` elements each, that its elements
    /// of the output (of shape `to`) read by broadcast, joined as
    /// [`compress`](crate::program::compress) joins them.
    Broadcast {
        from: tessera_core::Shape,
        to: tessera_core::Shape,
        values: u64,
    },
}

/// The summary of the exchange that `vertices` need (the one
/// [`exchange_for`](crate::program::exchange_for) makes), or `None` when nothing moves.
/// `local_reads` are tensors that every vertex reads only on its own tile (the caller knows:
/// its vertices read their tiles' own runs of tensors laid out alike); their reads are not
/// looked up. Such a read never moves anything, looked up or not, so the summary is the same.
/// `disjoint` says that no two of the distinct regions the vertices read share an element (the
/// caller knows, as an intermediate reduction stage does, whose vertices read disjoint columns
/// of disjoint blocks): then no group can be sent for two reads, and none is looked for; the
/// summary is the same, found without the index of groups that the regions' interleaved hulls
/// would otherwise call for. What the reads of `runs`' tensors add is taken from (or kept in)
/// its kept contributions: the summary is the same.
pub(crate) fn summarize_vertices(
    tiles: u32,
    tensors: &[ProgTensor],
    vertices: &[Vertex],
    local: &mut Locality,
    local_reads: &[TensorId],
    disjoint: bool,
    runs: Option<RunReads<'_>>,
) -> Option<ExchangeSummary> {
    // The lists are kept from one compute set to the next: a large reduction's lists hold
    // hundreds of thousands of pieces, and growing them afresh each time cost more than
    // filling them.
    let lists = &mut local.scratch;
    let looked_up: Vec<(TensorId, PerTile)> = runs.as_ref().map_or(Vec::new(), |r| {
        r.tensors
            .iter()
            .copied()
            .filter(|(t, _)| !local_reads.contains(t))
            .collect()
    });
    let apart: Vec<TensorId> = looked_up.iter().map(|r| r.0).collect();
    let mut out = Tallied::new(tiles);
    let rest = Looked {
        local: local_reads,
        runs: &apart,
        only: None,
    };
    tally_into(tensors, vertices, rest, disjoint, lists, &mut out);
    if let Some(runs) = runs {
        for &(t, how) in &looked_up {
            let pt = &tensors[t.index()];
            let key = RunKey {
                tiles,
                over: runs.over,
                how,
                read: SpreadRead {
                    layout: pt.mapping.digest(),
                    elem_bytes: pt.elem_bytes(),
                    state: pt.class == TensorClass::AlwaysLive,
                    local: false,
                },
            };
            let c = runs.kept.contribution(key, || {
                let mut alone = Tallied::new(tiles);
                let only = Looked {
                    local: local_reads,
                    runs: &[],
                    only: Some(t),
                };
                tally_into(tensors, vertices, only, disjoint, lists, &mut alone);
                Contribution::of(alone)
            });
            c.add_to(&mut out, t);
        }
    }
    out.finish()
}

/// Which reads [`tally_into`] looks up: those of `only` when given, else those of every
/// tensor but `local`'s (read where they are) and `runs`' (tallied apart).
#[derive(Clone, Copy)]
struct Looked<'a> {
    local: &'a [TensorId],
    runs: &'a [TensorId],
    only: Option<TensorId>,
}

impl Looked<'_> {
    fn looks_up(&self, t: TensorId) -> bool {
        match self.only {
            Some(o) => t == o,
            None => !self.local.contains(&t) && !self.runs.contains(&t),
        }
    }
}

/// The reads of `vertices` from elsewhere: (region, reader), the tensors of `local_reads`
/// and regions the reader holds whole left out.
fn remote_reads<'v>(
    tensors: &[ProgTensor],
    vertices: &'v [Vertex],
    looked: Looked<'_>,
) -> Vec<(&'v Region, TileId)> {
    let mut remote: Vec<(&Region, TileId)> = Vec::new();
    for v in vertices {
        // The blocks of the tensor last looked up on this vertex's tile.
        let mut on_tile = None;
        for r in &v.reads {
            if !looked.looks_up(r.tensor) || holds(tensors, v.tile, r, &mut on_tile) {
                continue;
            }
            remote.push((r, v.tile));
        }
    }
    remote
}

/// Adds the reads of `vertices` that `looked` looks up to `out`'s tallies (see
/// [`summarize_vertices`] for `disjoint`).
fn tally_into(
    tensors: &[ProgTensor],
    vertices: &[Vertex],
    looked: Looked<'_>,
    disjoint: bool,
    lists: &mut Lists,
    out: &mut Tallied,
) {
    lists.pieces.clear();
    lists.groups.clear();
    lists.per_tile.clear();
    // Distinct regions read from elsewhere, and (region, reader) pairs. A tile holding all
    // of a region it reads receives nothing for it, and every piece of it comes from that
    // tile, so whether others read it decides what it sends: such reads are left out.
    // The reads from elsewhere first, so that the index is sized for them up front (growing
    // it rehashed it many times over; sizing it for every read, most of them local, cost
    // more than filling it).
    let remote = remote_reads(tensors, vertices, looked);
    if remote.is_empty() {
        return;
    }
    let (regions, readers) = distinct_regions(remote);
    let readers = group_readers(readers, regions.len());
    let reads = reads_of(tensors, &regions, &readers, lists);
    let reader_tiles: Vec<TileId> = readers.iter().map(|p| p.1).collect();
    // Only a group of a region that overlaps another region can be sent for two reads: the
    // others skip the (sender, group) index, which is most of the work for big reductions.
    let overlapping = if disjoint {
        debug_assert!(
            pairwise_disjoint(&regions),
            "regions said to be disjoint overlap"
        );
        vec![false; regions.len()]
    } else {
        overlapping_regions(&regions)
    };
    let tally = out.rows();
    let mut bytes = 0u64;
    let mut moved: Vec<TensorId> = Vec::new();
    let mut sent_twice = SentTwice::new(&reads, &overlapping);
    for (k, rd) in reads.iter().enumerate() {
        if rd.count == 0 {
            continue;
        }
        let per_tile = &lists.per_tile[rd.per_tile.clone()];
        let tiles_reading = &reader_tiles[rd.readers.clone()];
        if !tally_receptions(rd, per_tile, tiles_reading, tally) {
            continue;
        }
        let groups = &lists.groups[rd.groups.clone()];
        moved.push(groups[0].1.tensor);
        let state = tensors[groups[0].1.tensor.index()].class == TensorClass::AlwaysLive;
        let (n, first) = (rd.readers.len(), readers[rd.readers.start].1);
        bytes += tally_sends(per_tile, n > 1, first, state, tally);
        if overlapping[k] {
            sent_twice.note(&lists.groups, rd, k as u32);
        }
    }
    if moved.is_empty() {
        return;
    }
    // A region sent by a tile for two different reads (overlapping reads) is one transfer per
    // receiver and one send: take back what was counted twice.
    bytes -= take_back_shared(
        &mut sent_twice.shared,
        tensors,
        &reads,
        &reader_tiles,
        tally,
    );
    out.bytes += bytes;
    out.moved.append(&mut moved);
}

/// The distinct regions of `remote`'s reads, in the order first read, and for each read its
/// region's place among them and its reader.
fn distinct_regions(remote: Vec<(&Region, TileId)>) -> (Vec<Region>, Vec<(u32, TileId)>) {
    // The index holds each region's place in `regions` (4 bytes an entry, where the regions
    // themselves are 40: an index of the regions spread a large compute set's lookups over
    // megabytes, missing the cache at nearly every one).
    use std::hash::BuildHasher as _;
    let hash = FastHash::default();
    let mut index: hashbrown::HashTable<u32> = hashbrown::HashTable::with_capacity(remote.len());
    let mut regions: Vec<Region> = Vec::with_capacity(remote.len());
    let mut readers: Vec<(u32, TileId)> = Vec::with_capacity(remote.len());
    // Reads of one region often come one after another (the tiles reading a broadcast
    // operand's block): the last one found is tried before the index.
    let mut last: Option<(&Region, u32)> = None;
    for (r, tile) in remote {
        let k = match last {
            Some((lr, lk)) if lr == r => lk,
            _ => {
                let k = match index.entry(
                    hash.hash_one(r),
                    |&k| regions[k as usize] == *r,
                    |&k| hash.hash_one(regions[k as usize]),
                ) {
                    hashbrown::hash_table::Entry::Occupied(e) => *e.get(),
                    hashbrown::hash_table::Entry::Vacant(e) => {
                        regions.push(*r);
                        let k = regions.len() as u32 - 1;
                        e.insert(k);
                        k
                    }
                };
                last = Some((r, k));
                k
            }
        };
        readers.push((k, tile));
    }
    (regions, readers)
}

/// The read of each of `regions`: its pieces (kept in `lists`) and its readers' range of
/// `readers` (grouped by region, in the regions' order).
fn reads_of(
    tensors: &[ProgTensor],
    regions: &[Region],
    readers: &[(u32, TileId)],
    lists: &mut Lists,
) -> Vec<Read> {
    let mut reads: Vec<Read> = Vec::with_capacity(regions.len());
    let mut at = 0;
    for group in readers.chunk_by(|a, b| a.0 == b.0) {
        let mut rd = pieces_of(tensors, &regions[group[0].0 as usize], lists);
        rd.readers = at..at + group.len();
        at += group.len();
        reads.push(rd);
    }
    reads
}

/// Adds to `tally` what each tile of `tiles_reading` receives of `rd` (all of it but what the
/// tile holds, `per_tile` giving what each tile holds); whether any tile receives anything.
fn tally_receptions(
    rd: &Read,
    per_tile: &[(TileId, u64, u64)],
    tiles_reading: &[TileId],
    tally: &mut [Tally],
) -> bool {
    let mut any = false;
    for (k, &t) in tiles_reading.iter().enumerate() {
        let (fb, fc) = from_tile(per_tile, t);
        if rd.count > fc {
            let e = &mut tally[t.index()];
            e.received += rd.bytes - fb;
            e.receives += rd.count - fc;
            // What neither it nor its partner holds goes to both when both read it.
            let p = partner(t);
            if beside(tiles_reading, k, p) {
                e.paired += (rd.bytes - fb).saturating_sub(from_tile(per_tile, p).0);
            }
            any = true;
        }
    }
    any
}

/// Adds to `tally` what each tile of `per_tile` ((tile, bytes, regions) it holds of a read)
/// sends for it: every tile but the only reader (`first`, unless `several` tiles read it)
/// sends what it holds, counted as state sends too when the tensor is `state`. The bytes sent.
fn tally_sends(
    per_tile: &[(TileId, u64, u64)],
    several: bool,
    first: TileId,
    state: bool,
    tally: &mut [Tally],
) -> u64 {
    let mut bytes = 0;
    for &(f, b, c) in per_tile {
        if several || first != f {
            let e = &mut tally[f.index()];
            e.sent += b;
            e.sends += c;
            if state {
                e.state_sends += c;
            }
            bytes += b;
        }
    }
    bytes
}

/// The groups a tile sends for more than one read (overlapping reads), found as the reads of
/// overlapping regions are tallied.
struct SentTwice {
    /// (the group's place in `lists.groups`, the first read it was sent for, or `u32::MAX`
    /// once it is in `shared`): 8 bytes an entry, the group itself read from its list.
    seen: hashbrown::HashTable<(u32, u32)>,
    /// (sender, group, read) of every group sent for more than one read, once per read.
    shared: Vec<(TileId, Region, u32)>,
}

impl SentTwice {
    /// Sized for the groups of the `reads` that are `overlapping`: sized for every group, a
    /// large reduction's index spread its few entries over pages never used again.
    fn new(reads: &[Read], overlapping: &[bool]) -> Self {
        let overlapping_groups = reads
            .iter()
            .zip(overlapping)
            .filter(|(_, &o)| o)
            .map(|(rd, _)| rd.groups.len())
            .sum();
        SentTwice {
            seen: hashbrown::HashTable::with_capacity(overlapping_groups),
            shared: Vec::new(),
        }
    }

    /// Notes the groups of read `k` (`rd`, its groups in `all`), adding those sent for an
    /// earlier read too to `shared`.
    fn note(&mut self, all: &[(TileId, Region)], rd: &Read, k: u32) {
        use std::hash::BuildHasher as _;
        let hash = FastHash::default();
        let groups = &all[rd.groups.clone()];
        for (at, &(f, g)) in rd.groups.clone().zip(groups) {
            match self.seen.entry(
                hash.hash_one((f, g)),
                |&(s, _)| all[s as usize] == (f, g),
                |&(s, _)| hash.hash_one(all[s as usize]),
            ) {
                hashbrown::hash_table::Entry::Vacant(e) => {
                    e.insert((at as u32, k));
                }
                hashbrown::hash_table::Entry::Occupied(mut e) => {
                    let first = &mut e.get_mut().1;
                    if *first != u32::MAX {
                        self.shared.push((f, g, *first));
                        *first = u32::MAX;
                    }
                    self.shared.push((f, g, k));
                }
            }
        }
    }
}

/// For each group a tile sends for several overlapping reads (`shared`: (sender, group,
/// read)), what was counted more than once: each receiver's extra receptions, the pairing
/// counted for each read, the sender's extra sends. Takes them back from `tally`; the bytes
/// counted twice in all.
fn take_back_shared(
    shared: &mut [(TileId, Region, u32)],
    tensors: &[ProgTensor],
    reads: &[Read],
    reader_tiles: &[TileId],
    tally: &mut [Tally],
) -> u64 {
    let who = |rd: &Read| &reader_tiles[rd.readers.clone()];
    let mut bytes = 0u64;
    // Per receiver of a group and read: (receiver, whether that read counted it as paired:
    // its partner, not the sender, read it too). A read's tiles are sorted and distinct, so
    // the partner can only be beside the receiver.
    let mut received: Vec<(TileId, bool)> = Vec::new();
    let mut receivers: Vec<TileId> = Vec::new();
    shared.sort_unstable();
    for same in shared.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
        let (f, g) = (same[0].0, same[0].1);
        let b = g.elements() * tensors[g.tensor.index()].elem_bytes();
        received.clear();
        for &(_, _, k) in same {
            let tiles = who(&reads[k as usize]);
            for (i, &t) in tiles.iter().enumerate() {
                if t != f {
                    let p = partner(t);
                    received.push((t, p != f && beside(tiles, i, p)));
                }
            }
        }
        received.sort_unstable_by_key(|e| e.0);
        receivers.clear();
        receivers.extend(received.chunk_by(|a, b| a.0 == b.0).map(|run| run[0].0));
        for (i, run) in received.chunk_by(|a, b| a.0 == b.0).enumerate() {
            let t = run[0].0;
            let e = &mut tally[t.index()];
            // Received once, counted once per read.
            let extra = run.len() as u64 - 1;
            e.received -= extra * b;
            e.receives -= extra;
            // Each read counted the group as paired for a receiver whose partner read it too
            // (and neither is its sender); it is paired once when the partner receives it
            // at all.
            let counted = run.iter().filter(|x| x.1).count() as u64;
            let once = u64::from(beside(&receivers, i, partner(t)));
            e.paired = e.paired + once * b - counted * b;
        }
        let senders = same
            .iter()
            .filter(|&&(_, _, k)| who(&reads[k as usize]).iter().any(|&t| t != f))
            .count() as u64;
        if senders > 1 {
            let e = &mut tally[f.index()];
            e.sent -= (senders - 1) * b;
            e.sends -= senders - 1;
            if tensors[g.tensor.index()].class == TensorClass::AlwaysLive {
                e.state_sends -= senders - 1;
            }
            bytes += (senders - 1) * b;
        }
    }
    bytes
}

/// `readers` (key, tile) sorted and without repeats, for keys below `regions` (the regions a
/// compute set reads, the grains of a statistics tensor): a counting sort on the key (the
/// bulk of the work, in linear time), then each key's tiles sorted (they mostly come in tile
/// order already) and deduplicated.
pub(crate) fn group_readers(readers: Vec<(u32, TileId)>, regions: usize) -> Vec<(u32, TileId)> {
    let mut at = vec![0usize; regions + 1];
    for &(k, _) in &readers {
        at[k as usize + 1] += 1;
    }
    for k in 0..regions {
        at[k + 1] += at[k];
    }
    let mut tiles = vec![TileId(0); readers.len()];
    let mut next = at.clone();
    for &(k, t) in &readers {
        tiles[next[k as usize]] = t;
        next[k as usize] += 1;
    }
    let mut out = Vec::with_capacity(readers.len());
    for k in 0..regions {
        let group = &mut tiles[at[k]..at[k + 1]];
        if !group.is_sorted() {
            group.sort_unstable();
        }
        let first = out.len();
        for &t in group.iter() {
            if out.len() == first || out.last() != Some(&(k as u32, t)) {
                out.push((k as u32, t));
            }
        }
    }
    out
}

/// For each region, whether it may share an element with another region of the same tensor:
/// false means no element of it is in another region. Regions of one tensor that are blocks
/// of a row-major matrix with one row length (the same stride, no run wrapping past a row) are
/// compared as rectangles, so column blocks of the same rows are told apart; other regions are
/// compared by their hulls (first to last element), which may mark a region needlessly but
/// never misses one.
fn overlapping_regions(regions: &[Region]) -> Vec<bool> {
    let mut order: Vec<(TensorId, u32)> = regions
        .iter()
        .enumerate()
        .filter(|(_, r)| r.rows > 0 && r.len > 0)
        .map(|(k, r)| (r.tensor, k as u32))
        .collect();
    order.sort_unstable();
    let mut out = vec![false; regions.len()];
    let mut rects = Vec::new();
    for same in order.chunk_by(|a, b| a.0 == b.0) {
        if !mark_rectangles(regions, same, &mut rects, &mut out) {
            mark_hulls(regions, same, &mut out);
        }
    }
    out
}

/// Whether no two of `regions` (distinct) share an element, run by run (for checks: it sorts
/// every run).
fn pairwise_disjoint(regions: &[Region]) -> bool {
    let mut runs: Vec<(TensorId, u64, u64, usize)> = regions
        .iter()
        .enumerate()
        .flat_map(|(k, r)| r.runs().map(move |(s, l)| (r.tensor, s, s + l, k)))
        .filter(|run| run.2 > run.1)
        .collect();
    runs.sort_unstable();
    runs.windows(2)
        .all(|w| w[0].0 != w[1].0 || w[1].1 >= w[0].2 || w[0].3 == w[1].3)
}

/// Marks the regions `same` (one tensor's) whose hulls meet another's.
fn mark_hulls(regions: &[Region], same: &[(TensorId, u32)], out: &mut [bool]) {
    let mut hulls: Vec<(u64, u64, u32)> = same
        .iter()
        .map(|&(_, k)| {
            let r = &regions[k as usize];
            let end = r.start + (r.rows - 1) * r.stride + r.len;
            (r.start, end, k)
        })
        .collect();
    hulls.sort_unstable();
    // Sorted by start: a hull meets a later one exactly when the next one starts before it
    // ends, and an earlier one when the furthest end so far is past its start.
    let mut furthest = 0u64;
    for (i, &(start, end, k)) in hulls.iter().enumerate() {
        let before = i > 0 && furthest > start;
        let after = hulls.get(i + 1).is_some_and(|n| n.0 < end);
        out[k as usize] = before || after;
        furthest = furthest.max(end);
    }
}

/// Marks the regions `same` (one tensor's) that meet another as rectangles of a row-major
/// matrix, when they all are blocks of one row length; false (nothing marked) when they are
/// not, or when comparing them would take more than a few comparisons per region.
fn mark_rectangles(
    regions: &[Region],
    same: &[(TensorId, u32)],
    rects: &mut Vec<(u64, u64, u64, u64, u32)>,
    out: &mut [bool],
) -> bool {
    let mut row = None;
    for &(_, k) in same {
        let r = &regions[k as usize];
        if r.rows > 1 {
            match row {
                None => row = Some(r.stride),
                Some(s) if s == r.stride => {}
                Some(_) => return false,
            }
        }
    }
    let Some(w) = row.filter(|&w| w > 0) else {
        return false;
    };
    // (first column, end column, first row, end row) of each region; a span that wraps past
    // a row is taken as whole rows (a larger rectangle: never misses an overlap).
    rects.clear();
    for &(_, k) in same {
        let r = &regions[k as usize];
        let (r0, c0) = (r.start / w, r.start % w);
        if c0 + r.len <= w {
            rects.push((c0, c0 + r.len, r0, r0 + r.rows, k));
        } else if r.rows == 1 {
            rects.push((0, w, r0, (r.start + r.len - 1) / w + 1, k));
        } else {
            return false;
        }
    }
    rects.sort_unstable();
    // Sweep over columns; compare rows with the rectangles whose columns are still open.
    let budget = 8 * rects.len() + 64;
    let mut compared = 0;
    let mut open: Vec<usize> = Vec::new();
    let mut marks: Vec<u32> = Vec::new();
    for i in 0..rects.len() {
        let (c0, _, r0, r1, k) = rects[i];
        open.retain(|&j| rects[j].1 > c0);
        for &j in &open {
            compared += 1;
            if compared > budget {
                return false;
            }
            let o = rects[j];
            if o.2 < r1 && r0 < o.3 {
                marks.push(k);
                marks.push(o.4);
            }
        }
        open.push(i);
    }
    for k in marks {
        out[k as usize] = true;
    }
    true
}

/// Bytes and regions of a read's groups that `tile` holds.
fn from_tile(per_tile: &[(TileId, u64, u64)], tile: TileId) -> (u64, u64) {
    per_tile
        .binary_search_by_key(&tile, |p| p.0)
        .map_or((0, 0), |i| (per_tile[i].1, per_tile[i].2))
}

/// The pieces of `r` on every tile, grouped and joined as
/// [`exchange_for`](crate::program::exchange_for) does for one reading vertex, appended to
/// the lists.
fn pieces_of(tensors: &[ProgTensor], r: &Region, lists: &mut Lists) -> Read {
    let t = &tensors[r.tensor.index()];
    let g0 = lists.groups.len();
    // A region's pieces mostly come in increasing start (its runs do): each tile's are
    // joined as they come.
    if !join_by_tile(t, r, &mut lists.tiles, &mut lists.joined, &mut lists.groups) {
        groups_out_of_order(t, r, lists);
    }
    read_of(t, g0, lists)
}

/// [`pieces_of`]'s groups of `r` (of tensor `t`) when its pieces do not come in increasing
/// start (runs that overlap or repeat): the pieces ordered by tile and start, each tile's
/// joined, and groups that repeat kept once.
fn groups_out_of_order(t: &ProgTensor, r: &Region, lists: &mut Lists) {
    let pieces = &mut lists.pieces;
    pieces.clear();
    t.mapping
        .for_each_piece_of(r, |_, tile, s, l| pieces.push((tile, s, l)));
    pieces.sort_unstable();
    let groups = &mut lists.groups;
    let g0 = groups.len();
    let joined = &mut lists.joined;
    for group in pieces.chunk_by(|a, b| a.0 == b.0) {
        let tile = group[0].0;
        if let [(_, s, len)] = *group {
            // One piece on the tile: one span, as joining it gives.
            groups.push((tile, Region::span(r.tensor, s, len)));
            continue;
        }
        let b = &mut lists.joiner;
        b.reset(r.tensor);
        joined.clear();
        for &(_, s, len) in group {
            b.push(s, len);
        }
        b.finish(joined);
        // The tiles come in order: sorting each tile's groups sorts them all.
        joined.sort_unstable();
        groups.extend(joined.iter().map(|&g| (tile, g)));
    }
    // Pieces of distinct starts join into distinct groups (a group is known by its first
    // piece): only runs that start together (a stride of 0) can repeat one.
    let mut kept = g0;
    for i in g0..groups.len() {
        if kept == g0 || groups[kept - 1] != groups[i] {
            groups[kept] = groups[i];
            kept += 1;
        }
    }
    groups.truncate(kept);
}

/// The read whose groups are `lists.groups[g0..]` (of tensor `t`), with its bytes and groups
/// summed by tile into `lists.per_tile`.
fn read_of(t: &ProgTensor, g0: usize, lists: &mut Lists) -> Read {
    let groups = &lists.groups;
    let eb = t.elem_bytes();
    let p0 = lists.per_tile.len();
    let (mut bytes, mut count) = (0, 0);
    for &(f, g) in &groups[g0..] {
        let b = g.elements() * eb;
        bytes += b;
        count += 1;
        match lists.per_tile[p0..].last_mut() {
            Some(p) if p.0 == f => {
                p.1 += b;
                p.2 += 1;
            }
            _ => lists.per_tile.push((f, b, 1)),
        }
    }
    Read {
        groups: g0..groups.len(),
        per_tile: p0..lists.per_tile.len(),
        bytes,
        count,
        readers: 0..0,
    }
}

/// What a lowering's exchange summaries keep from one compute set to the next: their lists
/// (which tiles hold which regions is derived once per layout, by
/// [`Mapping::blocks_on`](crate::program::Mapping), shared by every tensor and lowering
/// laid out by it).
#[derive(Default)]
pub(crate) struct Locality {
    /// Lists reused by [`summarize_vertices`].
    scratch: Lists,
}

/// The blocks a tile holds of a tensor looked up last by [`holds`]: (tensor index, tile,
/// blocks).
type OnTile<'t> = Option<(usize, TileId, &'t [(TileId, Region)])>;

/// Whether `tile` holds every element of `r` (false when unsure), from the blocks of `r`'s
/// tensor's layout on each tile. `on_tile` keeps the blocks `tile` holds of the tensor
/// looked up last, for the next region of the same tensor on the same tile (a
/// vertex's reads come by tensor).
fn holds<'t>(
    tensors: &'t [ProgTensor],
    tile: TileId,
    r: &Region,
    on_tile: &mut OnTile<'t>,
) -> bool {
    if r.rows == 0 || r.len == 0 {
        return true;
    }
    let t = r.tensor.index();
    let mine = match on_tile {
        Some((rt, rtile, blocks)) if *rt == t && *rtile == tile => *blocks,
        _ => {
            let blocks = tensors[t].mapping.blocks_on(tile);
            *on_tile = Some((t, tile, blocks));
            blocks
        }
    };
    let i = mine.partition_point(|(_, b)| b.start <= r.start);
    i > 0 && contains(&mine[i - 1].1, r)
}

/// Whether block `b` (runs of a mapping: disjoint, increasing) covers every element of `r`
/// (`r` has at least one non-empty run).
fn contains(b: &Region, r: &Region) -> bool {
    if r.start < b.start {
        return false;
    }
    let last_end = r.start + (r.rows - 1) * r.stride + r.len;
    if b.rows <= 1 {
        return last_end <= b.start + b.len;
    }
    let off = r.start - b.start;
    let (row, col) = (off / b.stride, off % b.stride);
    if col + r.len > b.len {
        return false;
    }
    if r.rows == 1 {
        row < b.rows
    } else {
        r.stride == b.stride && row + r.rows <= b.rows
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use tessera_core::{DType, NodeId};

    use super::*;
    use crate::program::{exchange_for, Codelet, Interval, Mapping, TensorClass};

    /// A tensor read by the kept-summary tests, picked as (layout, f16, always live): a
    /// layout past `layouts` is `over`'s own (`over_cuts`).
    fn picked(
        n: u64,
        layouts: &[Vec<(u64, u32)>],
        over_cuts: &[(u64, u32)],
        &(k, half, state): &(usize, bool, bool),
    ) -> ProgTensor {
        let cuts = layouts.get(k).map_or(over_cuts, |c| c.as_slice());
        let mut t = tensor(n, cuts, if half { DType::F16 } else { DType::F32 });
        if state {
            t.class = TensorClass::AlwaysLive;
        }
        t
    }

    /// A tensor of `elements` elements cut at random places onto random tiles.
    fn tensor(elements: u64, cuts: &[(u64, u32)], dtype: DType) -> ProgTensor {
        let mut at: Vec<u64> = cuts.iter().map(|c| c.0 % elements).collect();
        at.push(0);
        at.sort_unstable();
        at.dedup();
        let ivs = at
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let e = at.get(i + 1).copied().unwrap_or(elements);
                Interval {
                    tile: TileId(cuts.get(i).map_or(0, |c| c.1)),
                    start: s,
                    len: e - s,
                }
            })
            .collect();
        ProgTensor {
            name: String::new(),
            node: NodeId::from_index(0),
            dtype,
            elements,
            mapping: Mapping::from_intervals(ivs),
            class: TensorClass::NotAlwaysLive,
            live: (0, 0),
            interleaved: false,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn summaries_from_vertices_equal_summaries_of_their_transfers(
            sizes in prop::collection::vec(1u64..200, 1..4),
            cuts in prop::collection::vec((any::<u64>(), 0u32..6), 0..30),
            reads in prop::collection::vec(
                (0u32..6, any::<usize>(), any::<u64>(), 1u64..20, 1u64..6, 0u64..30),
                0..40,
            ),
            repeat in 0usize..4,
        ) {
            let tiles = 6;
            let tensors: Vec<ProgTensor> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let dt = if i % 2 == 0 { DType::F32 } else { DType::F16 };
                    tensor(n, &cuts[(i * 7).min(cuts.len())..], dt)
                })
                .collect();
            // Random regions inside their tensors, some repeated on other tiles (broadcasts)
            // and some overlapping.
            let mut vertices: Vec<Vertex> = Vec::new();
            for (k, &(tile, t, start, len, rows, stride)) in reads.iter().enumerate() {
                let t = t % tensors.len();
                let n = tensors[t].elements;
                let len = len.min(n);
                // A stride of 0 repeats one run (its pieces come out of order); others keep
                // the runs apart.
                let stride = if stride == 0 { 0 } else { stride.max(len) };
                let rows = (1..=rows).rev().find(|&r| (r - 1) * stride + len <= n).unwrap_or(1);
                let extent = (rows - 1) * stride + len;
                let start = start % (n - extent + 1);
                let r = Region::strided(TensorId(t as u32), start, len, rows, stride);
                let v = Vertex {
                    tile: TileId(tile),
                    codelet: Codelet::Copy,
                    cycles: 1,
                    reads: vec![r],
                    writes: Vec::new(),
                };
                if k % 3 == 0 && !vertices.is_empty() {
                    vertices.last_mut().unwrap().reads.push(r);
                } else {
                    vertices.push(v.clone());
                }
                for j in 0..(k % (repeat + 1)) {
                    let mut w = v.clone();
                    w.tile = TileId((tile + j as u32 + 1) % tiles);
                    vertices.push(w);
                }
            }
            // Reads of what a tile holds (nothing moves), sometimes also read elsewhere.
            for (t, x) in tensors.iter().enumerate().take(repeat) {
                for iv in x.mapping.intervals() {
                    let r = Region::span(TensorId(t as u32), iv.start, iv.len);
                    let v = Vertex {
                        tile: iv.tile,
                        codelet: Codelet::Copy,
                        cycles: 1,
                        reads: vec![r],
                        writes: Vec::new(),
                    };
                    if iv.start % 3 == 1 {
                        let mut w = v.clone();
                        w.tile = TileId((iv.tile.0 + 1) % tiles);
                        vertices.push(w);
                    }
                    vertices.push(v);
                }
            }
            let transfers = exchange_for(&tensors, &vertices);
            let exact = (!transfers.is_empty()).then(|| summarize(tiles, &tensors, &transfers));
            let fast = summarize_vertices(tiles, &tensors, &vertices, &mut Locality::default(), &[], false, None);
            prop_assert_eq!(fast, exact);
        }

        /// A summary kept under an element-wise compute set's key is the one summarising
        /// gives for any compute set under that key: other tensors (at other places in the
        /// program) laid out alike, of the same sizes and classes, read on the tiles of one
        /// layout, some of them laid out like it, some alike among themselves.
        #[test]
        fn a_kept_spread_summary_is_the_one_summarising_gives(
            n in 8u64..120,
            over_cuts in prop::collection::vec((any::<u64>(), 0u32..6), 0..12),
            layouts in prop::collection::vec(
                prop::collection::vec((any::<u64>(), 0u32..6), 0..20),
                1..4,
            ),
            picks in prop::collection::vec((0usize..5, any::<bool>(), any::<bool>()), 1..5),
            filler in 1usize..4,
        ) {
            let tiles = 6;
            let make = |pick: &(usize, bool, bool)| picked(n, &layouts, &over_cuts, pick);
            // Two programs: `over` then the tensors read; filler, the tensors read in reverse,
            // then `over`.
            let mut first = vec![tensor(n, &over_cuts, DType::F32)];
            first.extend(picks.iter().map(make));
            let mut second: Vec<ProgTensor> = (0..filler).map(|_| tensor(n, &[], DType::F32)).collect();
            second.extend(picks.iter().rev().map(make));
            second.push(tensor(n, &over_cuts, DType::F32));
            let lower = |tensors: &[ProgTensor], over: TensorId, reads: Vec<TensorId>| {
                let mut reads = reads;
                reads.sort_unstable();
                reads.dedup();
                let m = &tensors[over.index()].mapping;
                let vertices: Vec<Vertex> = m
                    .runs_per_tile()
                    .iter()
                    .map(|(tile, runs)| Vertex {
                        tile: *tile,
                        codelet: Codelet::Copy,
                        cycles: 1,
                        reads: reads
                            .iter()
                            .flat_map(|&t| runs.iter().map(move |r| Region { tensor: t, ..*r }))
                            .collect(),
                        writes: Vec::new(),
                    })
                    .collect();
                let local: Vec<TensorId> = reads
                    .iter()
                    .copied()
                    .filter(|t| tensors[t.index()].mapping.same_layout(m))
                    .collect();
                let (key, order) = SpreadKey::new(tiles, tensors, over, &reads, &local);
                (vertices, local, key, order)
            };
            let k = picks.len() as u32;
            let (v1, l1, key1, order1) = lower(&first, TensorId(0), (1..=k).map(TensorId).collect());
            let over2 = TensorId(filler as u32 + k);
            let reads2 = (filler as u32..filler as u32 + k).map(TensorId).collect();
            let (v2, l2, key2, order2) = lower(&second, over2, reads2);
            prop_assert_eq!(&key1, &key2);
            let kept = SpreadSummaries::default();
            let made = kept.get_or_summarize(key1, &order1, || {
                summarize_vertices(tiles, &first, &v1, &mut Locality::default(), &l1, false, None)
            });
            prop_assert_eq!(
                made,
                summarize_vertices(tiles, &first, &v1, &mut Locality::default(), &l1, false, None)
            );
            let taken = kept.get_or_summarize(key2, &order2, || unreachable!("kept above"));
            prop_assert_eq!(
                taken,
                summarize_vertices(tiles, &second, &v2, &mut Locality::default(), &l2, false, None)
            );
        }

        /// What the reads of tensors read as the tiles' runs of a layout add, kept and taken
        /// again for another program's tensors laid out alike, gives the summary that
        /// summarising every read does, beside other reads of other tensors.
        #[test]
        fn kept_contributions_of_run_reads_give_the_same_summary(
            n in 8u64..120,
            over_cuts in prop::collection::vec((any::<u64>(), 0u32..6), 0..12),
            layouts in prop::collection::vec(
                prop::collection::vec((any::<u64>(), 0u32..6), 0..20),
                1..4,
            ),
            picks in prop::collection::vec((0usize..5, any::<bool>(), any::<bool>()), 1..5),
            other_cuts in prop::collection::vec((any::<u64>(), 0u32..6), 0..12),
            others in prop::collection::vec((0u64..120, 1u64..30), 0..10),
        ) {
            let tiles = 6;
            let make = |pick: &(usize, bool, bool)| picked(n, &layouts, &over_cuts, pick);
            let k = picks.len() as u32;
            // `over`, the tensors read by runs, then one read otherwise; the second program
            // holds them after a filler tensor, the runs' tensors in reverse.
            let mut first = vec![tensor(n, &over_cuts, DType::F32)];
            first.extend(picks.iter().map(make));
            first.push(tensor(n, &other_cuts, DType::F32));
            let mut second = vec![tensor(n, &[], DType::F32), tensor(n, &over_cuts, DType::F32)];
            second.extend(picks.iter().rev().map(make));
            second.push(tensor(n, &other_cuts, DType::F32));
            let summaries = |tensors: &[ProgTensor], over: TensorId, runs: Vec<TensorId>, other: TensorId, kept: &SpreadSummaries| {
                let m = &tensors[over.index()].mapping;
                let vertices: Vec<Vertex> = m
                    .runs_per_tile()
                    .iter()
                    .enumerate()
                    .map(|(j, (tile, tile_runs))| {
                        let mut reads: Vec<Region> = runs
                            .iter()
                            .flat_map(|&t| tile_runs.iter().map(move |r| Region { tensor: t, ..*r }))
                            .collect();
                        reads.extend(others.iter().skip(j).step_by(2).map(|&(s, l)| {
                            let s = s % n;
                            Region::span(other, s, l.min(n - s))
                        }));
                        reads.sort_unstable();
                        reads.dedup();
                        Vertex { tile: *tile, codelet: Codelet::Copy, cycles: 1, reads, writes: Vec::new() }
                    })
                    .collect();
                let local: Vec<TensorId> = runs
                    .iter()
                    .copied()
                    .filter(|t| tensors[t.index()].mapping.same_layout(m))
                    .collect();
                let how: Vec<(TensorId, PerTile)> = runs.iter().map(|&t| (t, PerTile::Runs)).collect();
                let with = RunReads { over: m.digest(), tensors: &how, kept };
                let mut locality = Locality::default();
                (
                    summarize_vertices(tiles, tensors, &vertices, &mut locality, &local, false, Some(with)),
                    summarize_vertices(tiles, tensors, &vertices, &mut locality, &local, false, None),
                )
            };
            let kept = SpreadSummaries::default();
            let (made, all) = summaries(&first, TensorId(0), (1..=k).map(TensorId).collect(), TensorId(k + 1), &kept);
            prop_assert_eq!(made, all);
            let made = kept.0.runs.lock().unwrap().len();
            let (taken, all) = summaries(&second, TensorId(1), (2..2 + k).rev().map(TensorId).collect(), TensorId(k + 2), &kept);
            prop_assert_eq!(taken, all);
            // The second program's reads were all kept from the first's.
            prop_assert_eq!(kept.0.runs.lock().unwrap().len(), made);
        }

        /// Two regions that share an element are both marked as overlapping.
        #[test]
        fn regions_sharing_an_element_are_marked(
            raw in prop::collection::vec((0u32..2, 0u64..60, 1u64..8, 1u64..4, 0u64..12), 1..12),
            one_row_length in any::<bool>(),
        ) {
            // Either random strides, or blocks of a matrix with rows of 12 (and spans).
            let regions: Vec<Region> = raw
                .iter()
                .map(|&(t, start, len, rows, stride)| {
                    let stride = if one_row_length { 12 } else { stride.max(len) };
                    Region::strided(TensorId(t), start, len, rows, stride)
                })
                .collect();
            let elements = |r: &Region| -> Vec<u64> {
                (0..r.rows)
                    .flat_map(|i| (0..r.len).map(move |j| r.start + i * r.stride + j))
                    .collect()
            };
            let marked = overlapping_regions(&regions);
            for (a, ra) in regions.iter().enumerate() {
                for (b, rb) in regions.iter().enumerate() {
                    let shared = a != b
                        && ra.tensor == rb.tensor
                        && elements(ra).iter().any(|e| elements(rb).contains(e));
                    if shared {
                        prop_assert!(marked[a] && marked[b], "{:?} and {:?}", ra, rb);
                    }
                }
            }
        }
    }

    #[test]
    fn a_broadcast_to_both_tiles_of_a_pair_takes_half_the_time() {
        // 200 f32 elements, half on tile 0 and half on tile 1, read whole by two tiles.
        let t = tensor(200, &[(0, 0), (100, 1)], DType::F32);
        let tensors = [t];
        let read_on = |tiles: [u32; 2]| -> Vec<Vertex> {
            tiles
                .iter()
                .map(|&tile| Vertex {
                    tile: TileId(tile),
                    codelet: Codelet::Copy,
                    cycles: 1,
                    reads: vec![Region::span(TensorId(0), 0, 200)],
                    writes: Vec::new(),
                })
                .collect()
        };
        for (tiles, paired, busiest) in [([2, 3], 800, 400), ([2, 4], 0, 800), ([3, 4], 0, 800)] {
            let vertices = read_on(tiles);
            let s = summarize_vertices(
                4 + 2,
                &tensors,
                &vertices,
                &mut Locality::default(),
                &[],
                false,
                None,
            )
            .expect("moves data");
            let exact = summarize(6, &tensors, &exchange_for(&tensors, &vertices));
            assert_eq!(s, exact);
            for r in s.tiles.iter().filter(|x| x.receives) {
                assert_eq!((r.received, r.paired), (800, paired), "{tiles:?}");
            }
            assert_eq!(s.busiest, busiest, "{tiles:?}");
        }
    }

    #[test]
    fn disjoint_regions_are_not_marked() {
        let t = TensorId(0);
        let regions = [
            Region::span(t, 0, 4),
            Region::span(t, 4, 4),
            Region::span(TensorId(1), 0, 8),
            Region::span(t, 6, 1),
        ];
        assert_eq!(overlapping_regions(&regions), [false, true, false, true]);
        // Column blocks of the same rows of a 8 x 16 matrix, and a block below them.
        let blocks = [
            Region::strided(t, 0, 4, 4, 16),
            Region::strided(t, 4, 4, 4, 16),
            Region::strided(t, 8, 8, 4, 16),
            Region::strided(t, 64, 16, 4, 16),
            Region::strided(t, 6, 1, 2, 16),
        ];
        assert_eq!(
            overlapping_regions(&blocks),
            [false, true, false, false, true]
        );
    }
}
