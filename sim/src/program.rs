//! A lowered program: tensors mapped onto tiles, and a sequence of steps (exchanges, compute
//! sets of vertices, host streams) that run as BSP supersteps.
//!
//! The tensors, steps and program are here; tile mappings are in `mapping`, the regions
//! vertices read and write (and their joining) in `region`, and vertices and compute sets in
//! `vertex`, all re-exported here.

use std::fmt;

use tessera_core::{DType, NodeId};

mod mapping;
mod region;
mod vertex;

pub use mapping::{Interval, Mapping};
pub use region::{compress, compress_from, Region, RunBuilder, SpanJoiner};
pub use vertex::{
    Codelet, ComputeSet, Vertex, VertexCost, VertexType, AMP_VERTEX_STATE_BYTES, GATHER_ROWS,
    ONE_HOT, REDUCE_ADD, REDUCE_MAX, REDUCE_OTHER, REDUCE_SQUARE_ADD, SCATTER_ADD_ROWS,
    VERTEX_STATE_PER_READ_BYTES, VERTEX_STATE_PER_WRITE_BYTES,
};

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
    /// A collective over replicas: `bytes` of a tensor summed within groups of `group`
    /// consecutive replicas (distributed batch norm's statistics), each step of its ring a sync
    /// of the partition's `partition_ipus` IPUs ([`crate::collective::group_all_reduce_cycles`]).
    Collective {
        /// The tensor reduced in place.
        tensor: TensorId,
        /// Bytes each replica holds of it.
        bytes: u64,
        /// Replicas in a group.
        group: u32,
        /// IPUs of the whole partition.
        partition_ipus: u32,
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

    use super::mapping::LOCATOR_FROM;
    use super::region::{Unused, RUN_CANDIDATES};
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
        let mut free = Unused::new(&mut room, 10);
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
