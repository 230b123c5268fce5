//! An embedding's gradient, the scatter-add of its looked-up rows' gradients into a table of
//! zeros, planned and laid out as poplibs plans `popops::multiUpdateAdd` for PopART's
//! `GatherGradOpx` (`popops::embedding::plan` with `usedForUpdate`, the ADD operation and the
//! indices taken as uniform; `lib/popops/DynamicSlice.cpp`, `constructModel` and
//! `generatePlannedMultiUpdateOp`).
//!
//! A plan splits the table's `E` rows into `S` groups, its row of `D` elements into `U`
//! groups of whole grains (8 bytes), and the `L` lookups into `LP` groups, on `U x S x LP`
//! tiles. The tile of lookup group `lp`, row group `s` and column group `u` adds the
//! gradients of its lookups' columns `u` that fall in rows `s`: it receives every lookup of
//! its group (the indices are data, unknown until run time; with `S > 1` each row group's
//! tiles receive all of them and skip those outside their rows). With `LP = 1` the tiles add
//! into the table itself; with `LP > 1` each lookup group adds into its own zeroed partial
//! copy of the block, and the `LP` partials are reduced and added into the table. The table
//! is laid out by the plan: block `(s, u)` cut into `LP` pieces, one on each of its tiles.
//!
//! The plan is the cheapest by poplibs' model of the update's cycles, among those whose
//! temporary bytes per tile stay within [`TEMPORARY_PROPORTION`] of the tile (poplibs'
//! default available memory proportion of a slice plan): so a table of two rows (BERT's
//! token types) splits its columns and its lookups, and a table of thousands its rows and
//! columns. Tessera lays tensors out as intervals, and a plan cutting each of `E` rows into
//! `U` pieces takes `E x U` of them; plans over [`MAX_LAYOUT_INTERVALS`] are left out (a
//! limit of the simulator's layouts, not of poplibs: it narrows the column split of tables of
//! tens of thousands of rows).

use std::collections::HashMap;
use std::sync::Mutex;

use tessera_core::{DType, NodeId, Storage};

use super::Lowering;
use crate::cost::{self, UnaryKind};
use crate::machine::IpuConfig;
use crate::program::{
    Codelet, Interval, Mapping, Region, TensorId, TileId, Vertex, VertexType, REDUCE_ADD,
    SCATTER_ADD_ROWS,
};

/// The proportion of a tile's memory a plan's temporaries may take (poplibs' default
/// `availableMemoryProportion` of a slice plan, 0.6, `lib/popops/DynamicSlice.cpp`).
pub const TEMPORARY_PROPORTION: f64 = 0.6;

/// Bytes of a grain of a row: a split of the row's columns keeps whole grains (poplibs'
/// `minGrainSizeBytes`, the data path's 8 bytes).
pub const GRAIN_BYTES: u64 = 8;

/// The most intervals a plan's layouts (the table's and its partials') may take in Tessera
/// (a limit of the simulator: `E x U` intervals for a table cut into `U` column groups).
pub const MAX_LAYOUT_INTERVALS: u64 = 1 << 20;

/// Bytes of an index (poplibs' indices are 32-bit unsigned integers).
const INDEX_BYTES: u64 = 4;

/// A plan of an embedding's gradient (see the module's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UpdatePlan {
    /// Table rows `E`.
    pub entries: u64,
    /// Elements of a row `D`.
    pub row: u64,
    /// Lookups `L`.
    pub lookups: u64,
    /// Elements of a grain.
    pub grain: u64,
    /// Column groups `U`.
    pub u: u64,
    /// Row groups `S`.
    pub s: u64,
    /// Lookup groups `LP`.
    pub lp: u64,
}

impl UpdatePlan {
    /// Columns of each column group (the last may hold fewer).
    pub fn cols(&self) -> u64 {
        self.row.div_ceil(self.grain).div_ceil(self.u) * self.grain
    }

    /// Rows of each row group (the last may hold fewer).
    pub fn rows(&self) -> u64 {
        self.entries.div_ceil(self.s)
    }

    /// Lookups of each lookup group (the last may hold fewer).
    pub fn lookups_per_group(&self) -> u64 {
        self.lookups.div_ceil(self.lp)
    }

    /// Tiles the plan uses.
    pub fn tiles(&self) -> u64 {
        self.u * self.s * self.lp
    }

    /// The range `[start, end)` of group `k` of `size` out of `total`.
    fn range(k: u64, size: u64, total: u64) -> (u64, u64) {
        ((k * size).min(total), ((k + 1) * size).min(total))
    }

    /// Rows `[r0, r1)` of row group `s`.
    pub fn row_range(&self, s: u64) -> (u64, u64) {
        Self::range(s, self.rows(), self.entries)
    }

    /// Columns `[c0, c1)` of column group `u`.
    pub fn col_range(&self, u: u64) -> (u64, u64) {
        Self::range(u, self.cols(), self.row)
    }

    /// Lookups `[j0, j1)` of lookup group `lp`.
    pub fn lookup_range(&self, lp: u64) -> (u64, u64) {
        Self::range(lp, self.lookups_per_group(), self.lookups)
    }

    /// Intervals the plan's layouts take in Tessera: the table's blocks (a row's piece each,
    /// whole blocks when `U = 1`) cut into `LP` pieces, and with `LP > 1` the partials.
    pub fn layout_intervals(&self) -> u64 {
        let blocks = self.u * self.s;
        let (table, partials) = if self.u == 1 {
            (blocks * self.lp, blocks * self.lp)
        } else {
            (
                self.entries * self.u + blocks * self.lp,
                self.entries * self.u * self.lp,
            )
        };
        table + if self.lp > 1 { partials } else { 0 }
    }
}

/// The cycles and temporary bytes per tile poplibs' model gives a plan's update.
fn modelled(cfg: &IpuConfig, dt: DType, p: &UpdatePlan) -> (u64, u64) {
    let es = dt.size() as u64;
    let tiles = u64::from(cfg.tiles.max(1));
    let (cols, rows, lpt) = (p.cols(), p.rows(), p.lookups_per_group());
    let grains = p.row.div_ceil(p.grain);
    let exchange = |bytes: u64| cost::exchange_cycles(cfg, bytes, false);
    // The table's block against an even spread: rearranged there and back.
    let block_bytes = rows * cols * es;
    let even = (p.entries * grains).div_ceil(tiles) * p.grain * es;
    let rearranged = block_bytes.saturating_sub(even);
    let multicast = if p.s > 1 { lpt * cols * es } else { 0 };
    let partial_elems = rows * cols;
    let split = p.lp > 1;
    let partials = if split { partial_elems * es } else { 0 };
    let mut cycles = 2 * exchange(rearranged) + exchange(multicast);
    let in_range =
        (lpt * rows.div_ceil(u64::from(cfg.worker_contexts.max(1)))).div_ceil(p.entries.max(1));
    cycles += cost::multi_update_add_cycles(cfg, dt, cols, lpt, in_range);
    if split {
        // Zeroed float partials, reduced over the lookup groups, added into the table
        // (`modelContiguousFill`, `modelBalancedIntertileReduction`, `modelContiguousScaledAdd`).
        let out = partial_elems.div_ceil(p.lp);
        cycles += UnaryKind::Copy.cycles(cfg, partial_elems, DType::F32)
            + exchange(out * p.lp * 4)
            + cost::reduce_cycles(cfg, out, p.lp, DType::F32)
            + cost::scaled_add_cycles(
                cfg,
                (rows * grains.div_ceil(p.u)).div_ceil(p.lp) * p.grain,
                DType::F32,
            );
    }
    let temp = rearranged
        + multicast
            .max(multicast + partials + lpt * INDEX_BYTES)
            .max(2 * partials);
    (cycles, temp)
}

/// The distinct values of `ceil(n / k)` for `k` in `1..=n`, each with the least `k` giving it.
fn splits(n: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut k = 1;
    while k <= n {
        out.push(k);
        let per = n.div_ceil(k);
        if per <= 1 {
            break;
        }
        // The least k' with ceil(n / k') < per.
        k = n.div_ceil(per - 1).max(k + 1);
    }
    out
}

/// What a plan depends on: the machine's tiles and their memory, the element type, the
/// table's rows and row length, and the lookups.
type PlanKey = (u32, u64, DType, u64, u64, u64);

/// Plans made so far in this process.
static PLANS: Mutex<Option<HashMap<PlanKey, UpdatePlan>>> = Mutex::new(None);

/// The plan of the gradient of a table of `entries` rows of `row` elements of type `dt`
/// from `lookups` lookups, on `cfg`'s tiles.
pub fn plan_update(cfg: &IpuConfig, dt: DType, entries: u64, row: u64, lookups: u64) -> UpdatePlan {
    let key = (
        cfg.tiles,
        cfg.sram_bytes_per_tile,
        dt,
        entries,
        row,
        lookups,
    );
    if let Some(p) = PLANS
        .lock()
        .ok()
        .and_then(|m| m.as_ref()?.get(&key).copied())
    {
        return p;
    }
    let p = search(cfg, dt, entries.max(1), row.max(1), lookups.max(1));
    if let Ok(mut m) = PLANS.lock() {
        m.get_or_insert_with(HashMap::new).insert(key, p);
    }
    p
}

/// The cheapest plan within the temporary memory, or the cheapest of all when none is.
fn search(cfg: &IpuConfig, dt: DType, entries: u64, row: u64, lookups: u64) -> UpdatePlan {
    let es = dt.size() as u64;
    let tiles = u64::from(cfg.tiles.max(1));
    let grain = GRAIN_BYTES.div_ceil(es).max(1).min(row);
    let grains = row.div_ceil(grain);
    let cap = (cfg.sram_bytes_per_tile as f64 * TEMPORARY_PROPORTION) as u64;
    let mut best: Option<(bool, u64, u64, UpdatePlan)> = None;
    // At least two rows a row group (poplibs: fewer cost more than they save).
    let ss: Vec<u64> = splits(entries)
        .into_iter()
        .filter(|&s| s <= entries.div_ceil(2))
        .collect();
    let (us, lps) = (splits(grains), splits(lookups));
    for &u in &us {
        for &s in ss.iter().take_while(|&&s| u * s <= tiles) {
            for &lp in lps.iter().take_while(|&&lp| u * s * lp <= tiles) {
                let p = UpdatePlan {
                    entries,
                    row,
                    lookups,
                    grain,
                    u,
                    s,
                    lp,
                };
                if p.layout_intervals() > MAX_LAYOUT_INTERVALS && !(u == 1 && s == 1 && lp == 1) {
                    continue;
                }
                let (cycles, temp) = modelled(cfg, dt, &p);
                // Within the memory first, then the fewest cycles, then the fewest tiles.
                let rank = (temp > cap, cycles, p.tiles(), p);
                if best
                    .as_ref()
                    .is_none_or(|b| (rank.0, rank.1, rank.2) < (b.0, b.1, b.2))
                {
                    best = Some(rank);
                }
            }
        }
    }
    best.map_or(
        UpdatePlan {
            entries,
            row,
            lookups,
            grain,
            u: 1,
            s: 1,
            lp: 1,
        },
        |b| b.3,
    )
}

/// Where a plan's blocks sit: from `start`, lookup group by lookup group, row group by row
/// group, column group by column group (poplibs' `linearizeSliceIndices`, from the tile its
/// plan's hash picks).
#[derive(Clone, Copy)]
struct Tiles {
    start: u64,
    count: u64,
}

impl Tiles {
    fn of(&self, p: &UpdatePlan, lp: u64, s: u64, u: u64) -> TileId {
        TileId(((self.start + (lp * p.s + s) * p.u + u) % self.count.max(1)) as u32)
    }
}

/// Appends `[start, start + len)` on `tile`, joined to the last interval when they touch on
/// one tile.
fn push(out: &mut Vec<Interval>, tile: TileId, start: u64, len: u64) {
    if len == 0 {
        return;
    }
    if let Some(last) = out.last_mut() {
        if last.tile == tile && last.start + last.len == start {
            last.len += len;
            return;
        }
    }
    out.push(Interval { tile, start, len });
}

/// The table's layout: block `(s, u)`'s elements, row by row, cut into `LP` pieces of whole
/// grains, piece `lp` on the tile of `(lp, s, u)` (poplibs' planned `createSliceableTensor`).
/// The intervals come in order of their starts, row by row.
fn table_mapping(p: &UpdatePlan, at: Tiles) -> Mapping {
    let mut out = Vec::new();
    for r in 0..p.entries {
        let s = r / p.rows();
        let (r0, r1) = p.row_range(s);
        for u in 0..p.u {
            let (c0, c1) = p.col_range(u);
            let width = c1 - c0;
            if width == 0 {
                continue;
            }
            let piece = ((r1 - r0) * width).div_ceil(p.grain).div_ceil(p.lp) * p.grain;
            let mut offset = (r - r0) * width;
            let (mut start, end) = (r * p.row + c0, r * p.row + c1);
            while start < end {
                let k = offset / piece;
                let take = (end - start).min((k + 1) * piece - offset);
                push(&mut out, at.of(p, k, s, u), start, take);
                start += take;
                offset += take;
            }
        }
    }
    Mapping::from_sorted_intervals(out)
}

/// The partials' layout (`[LP, E, D]`): lookup group `lp`'s copy of block `(s, u)` on the
/// tile of `(lp, s, u)`, in order of the intervals' starts.
fn partials_mapping(p: &UpdatePlan, at: Tiles) -> Mapping {
    let mut out = Vec::new();
    let table = p.entries * p.row;
    for lp in 0..p.lp {
        for r in 0..p.entries {
            let s = r / p.rows();
            for u in 0..p.u {
                let (c0, c1) = p.col_range(u);
                push(
                    &mut out,
                    at.of(p, lp, s, u),
                    lp * table + r * p.row + c0,
                    c1 - c0,
                );
            }
        }
    }
    Mapping::from_sorted_intervals(out)
}

/// The plan of scatter-add node `i` (rows by its output, lookups by its indices), and where
/// its tiles start.
fn plan_of<S: Storage>(l: &Lowering<'_, S>, i: NodeId, indices: NodeId) -> (UpdatePlan, Tiles) {
    let node = l.node(i);
    let shape = node.shape();
    let entries = shape.dim(0) as u64;
    let row = (shape.elements() as u64) / entries.max(1);
    let lookups = l.node(indices).shape().elements() as u64;
    let p = plan_update(l.cfg, node.dtype(), entries, row, lookups);
    let start = l.start_tile(xxhash_rust::xxh3::xxh3_128(
        format!("embedding|{p:?}|{:?}", node.dtype()).as_bytes(),
    ));
    let at = Tiles {
        start: u64::from(start),
        count: u64::from(l.tile_count()),
    };
    (p, at)
}

/// The layout of scatter-add node `i`'s output, the table's gradient.
pub(super) fn output_mapping<S: Storage>(
    l: &Lowering<'_, S>,
    i: NodeId,
    indices: NodeId,
) -> Mapping {
    let (p, at) = plan_of(l, i, indices);
    table_mapping(&p, at)
}

/// Lowers scatter-add node `i` (`dy`'s rows added into a zeroed table at `indices`) by its
/// plan: the table zeroed, each tile's lookups added into its block (or, with `LP > 1`, into
/// its zeroed partials, which are then reduced and added into the table).
pub(super) fn lower_scatter_add<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    dy: NodeId,
    indices: NodeId,
) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let (p, at) = plan_of(l, i, indices);
    let (out, gt, it) = (l.t(i), l.t(dy), l.t(indices));
    zero(l, i, "zero", out, dt);
    let target = if p.lp > 1 {
        let m = partials_mapping(&p, at);
        let partials = l.temporary(i, "partials", dt, p.lp * p.entries * p.row, m);
        zero(l, i, "zero partials", partials, dt);
        partials
    } else {
        out
    };
    let table = p.entries * p.row;
    let workers = u64::from(cfg.worker_contexts.max(1));
    let mut vertices = Vec::with_capacity(p.tiles() as usize);
    for lp in 0..p.lp {
        let (j0, j1) = p.lookup_range(lp);
        for s in 0..p.s {
            let (r0, r1) = p.row_range(s);
            let in_range = ((j1 - j0) * (r1 - r0).div_ceil(workers)).div_ceil(p.entries.max(1));
            for u in 0..p.u {
                let (c0, c1) = p.col_range(u);
                if j0 >= j1 || r0 >= r1 || c0 >= c1 {
                    continue;
                }
                let base = if p.lp > 1 { lp * table } else { 0 };
                vertices.push(Vertex {
                    tile: at.of(&p, lp, s, u),
                    codelet: Codelet::Gather(VertexType::of(SCATTER_ADD_ROWS, dt)),
                    cycles: cost::multi_update_add_cycles(cfg, dt, c1 - c0, j1 - j0, in_range),
                    reads: vec![
                        Region::span(it, j0, j1 - j0),
                        Region::strided(gt, j0 * p.row + c0, c1 - c0, j1 - j0, p.row),
                    ],
                    writes: vec![Region::strided(
                        target,
                        base + r0 * p.row + c0,
                        c1 - c0,
                        r1 - r0,
                        p.row,
                    )],
                });
            }
        }
    }
    l.compute(i, "update", vertices);
    if p.lp > 1 {
        reduce_partials(l, i, &p, target, out, dt);
    }
}

/// Zeroes `t` where it lies (popops' `zero`, a fill at the copy's rate).
fn zero<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, phase: &str, t: TensorId, dt: DType) {
    let cfg = l.cfg;
    l.per_tile_same(
        i,
        phase,
        t,
        Codelet::Copy,
        move |n| UnaryKind::Copy.cycles(cfg, n, dt),
        super::compute::SameElements {
            reads: &[],
            writes: &[t],
            fixed: &[],
        },
    );
}

/// The lookup groups' partials summed where the table lies (`opUpdates`, laid out like it)
/// and added into it (poplibs' `reduceWithOutput` and `scaledAddTo`).
fn reduce_partials<S: Storage>(
    l: &mut Lowering<'_, S>,
    i: NodeId,
    p: &UpdatePlan,
    partials: TensorId,
    out: TensorId,
    dt: DType,
) {
    let cfg = l.cfg;
    let mapping = l.tensors[out.index()].mapping.clone();
    let sums = l.temporary(i, "updates", dt, p.entries * p.row, mapping);
    let (lp, table) = (p.lp, p.entries * p.row);
    l.per_tile(
        i,
        "reduce",
        sums,
        Codelet::Reduce(VertexType::of(REDUCE_ADD, dt)),
        move |n| cost::reduce_cycles(cfg, n, lp, dt),
        |iv, reads| reads.push(Region::strided(partials, iv.start, iv.len, lp, table)),
    );
    l.per_tile_same(
        i,
        "add",
        out,
        Codelet::Update,
        move |n| cost::scaled_add_cycles(cfg, n, dt),
        super::compute::SameElements {
            reads: &[out, sums],
            writes: &[out],
            fixed: &[],
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Preset;
    use proptest::prelude::*;

    fn bow() -> IpuConfig {
        IpuConfig::preset(Preset::Bow)
    }

    #[test]
    fn a_table_of_two_rows_splits_its_columns_and_lookups_not_its_rows() {
        // BERT's token-type table at sequence length 384: 2 rows cannot be split (poplibs
        // leaves at least two rows a tile), so the lookups are, into small partials.
        let cfg = bow();
        for lookups in [384, 768] {
            let p = plan_update(&cfg, DType::F16, 2, 1024, lookups);
            assert_eq!(p.s, 1, "{p:?}");
            assert!(p.u > 1 && p.lp > 1, "{p:?}");
            assert!(p.tiles() <= u64::from(cfg.tiles), "{p:?}");
            let (_, temp) = modelled(&cfg, DType::F16, &p);
            assert!(temp < 4096, "{p:?}: {temp} temporary bytes a tile");
        }
    }

    #[test]
    fn a_large_table_splits_its_rows_and_columns_and_keeps_the_lookups_whole() {
        // One of five serialised pieces of BERT's vocabulary, 768 lookups: partials per
        // lookup group would be a copy of the table's block each.
        let cfg = bow();
        let p = plan_update(&cfg, DType::F16, 6105, 1024, 768);
        assert_eq!(p.lp, 1, "{p:?}");
        assert!(p.s > 1 && p.u > 1, "{p:?}");
        let (_, temp) = modelled(&cfg, DType::F16, &p);
        assert!(
            (temp as f64) <= cfg.sram_bytes_per_tile as f64 * TEMPORARY_PROPORTION,
            "{p:?}: {temp}"
        );
    }

    #[test]
    fn the_update_costs_what_poplibs_estimates() {
        // getMultiUpdateOpCycleEstimate, half, scaled ADD, 28 elements a row (14 atoms), 10
        // indices of which 1 is in the worker's range: (3 + 30 + 4 + (12 + 1 + 13 x 3) + 9 x
        // 5) x 6 workers.
        let cfg = bow();
        assert_eq!(
            cost::multi_update_add_cycles(&cfg, DType::F16, 28, 10, 1),
            (3 + 30 + 4 + (13 + 13 * 3) + 9 * 5) * 6
        );
        // The 64-bit path: rows of 4 halves, 9 cycles an index, a cycle less of set-up.
        assert_eq!(
            cost::multi_update_add_cycles(&cfg, DType::F16, 4, 2, 2),
            (3 + 30 + 4 - 1 + 2 * 9) * 6
        );
        // Floats, 3 elements a row: 3 atoms, (3 + 29 + 6 + (11 + 2 x 3)) x 6.
        assert_eq!(
            cost::multi_update_add_cycles(&cfg, DType::F32, 3, 1, 1),
            (3 + 29 + 6 + 11 + 2 * 3) * 6
        );
    }

    proptest! {
        #[test]
        fn splits_are_the_distinct_shares_each_at_its_least_count(n in 1u64..3000) {
            let ks = splits(n);
            let shares: Vec<u64> = ks.iter().map(|&k| n.div_ceil(k)).collect();
            prop_assert!(shares.windows(2).all(|w| w[0] > w[1]));
            let mut all: Vec<u64> = (1..=n).map(|k| n.div_ceil(k)).collect();
            all.dedup();
            prop_assert_eq!(&shares, &all);
            for (&k, &share) in ks.iter().zip(&shares) {
                prop_assert!(k == 1 || n.div_ceil(k - 1) != share);
            }
        }

        #[test]
        fn each_element_lies_once_and_each_block_on_its_tiles(
            entries in 1u64..40, row in 1u64..70, lookups in 1u64..50,
            u in 1u64..9, s in 1u64..9, lp in 1u64..6, start in 0u64..64,
        ) {
            let grain = 4.min(row);
            let u = u.min(row.div_ceil(grain));
            let s = s.min(entries.div_ceil(2)).max(1);
            let p = UpdatePlan { entries, row, lookups, grain, u, s, lp };
            let at = Tiles { start, count: 64 };
            let table = table_mapping(&p, at);
            let mut seen = vec![0u32; (entries * row) as usize];
            for iv in table.intervals() {
                for e in iv.start..iv.end() {
                    seen[e as usize] += 1;
                    // The element's block (s, u) holds it on one of its LP tiles.
                    let (r, c) = (e / row, e % row);
                    let (bs, bu) = (r / p.rows(), c / p.cols());
                    prop_assert!((0..lp).any(|k| at.of(&p, k, bs, bu) == iv.tile));
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
            let partials = partials_mapping(&p, at);
            let mut seen = vec![0u32; (lp * entries * row) as usize];
            for iv in partials.intervals() {
                for e in iv.start..iv.end() {
                    seen[e as usize] += 1;
                    let (k, r, c) = (e / (entries * row), e / row % entries, e % row);
                    prop_assert_eq!(iv.tile, at.of(&p, k, r / p.rows(), c / p.cols()));
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
        }
    }
}
