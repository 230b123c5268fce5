//! Compute sets: a node's vertices appended as a compute set, preceded by the exchange that
//! brings their operands to their tiles (or only its summary, when the lowering keeps costs),
//! and the vertices a family makes per tile of a layout.

use tessera_core::{NodeId, Storage};

use super::{broadcast, Lowering, Runs, REGION_OVERHEAD_CYCLES};
use crate::exchange::{summarize_vertices, PerTile, RunReads, SpreadKey};
use crate::program::{
    compress, compress_from, exchange_for, Codelet, ComputeSet, Interval, Region, Step, TensorId,
    Vertex,
};

/// An element-wise compute set's exchange is kept for others that read alike (see
/// [`SpreadSummaries`]) when the tensors it looks up hold this many intervals or more in all:
/// smaller ones summarise in less time than their key takes. (A choice of speed, never of
/// what is estimated: a kept summary is the one summarising would give.)
const SPREAD_FROM_INTERVALS: usize = 4096;

/// What each vertex of [`Lowering::per_tile_same`] reads and writes besides its tile's
/// elements of the tensor it is spread over.
pub(crate) struct SameElements<'r> {
    /// Tensors whose same elements it reads.
    pub(crate) reads: &'r [TensorId],
    /// Tensors whose same elements it writes.
    pub(crate) writes: &'r [TensorId],
    /// Regions every vertex reads (a counter, a step).
    pub(crate) fixed: &'r [Region],
}

/// The reads of each vertex of [`Lowering::elementwise_by_tile`] besides its tile's runs of
/// the tensors read alike.
struct OtherReads<'b, E> {
    /// Tensors read by broadcast, with how each tile reads them: `extra` appends their
    /// regions joined already. Empty when `extra`'s regions come as they are.
    broadcast: &'b [(TensorId, PerTile)],
    /// Appends the `k`th tile's other reads, given its intervals.
    extra: E,
}

/// What the summary of the exchange before a compute set takes as known of its vertices'
/// reads, so that it need not look them up.
struct ReadHints<'h> {
    /// Tensors the vertices read only on their own tiles.
    local: &'h [TensorId],
    /// The key under which the exchange is kept for compute sets that read alike, with the
    /// tensors read in its order ([`Lowering::spread_key`]).
    spread: Option<(SpreadKey, Vec<TensorId>)>,
    /// Tensors read as [`Runs`] says, and nothing else of them.
    runs: Option<Runs>,
    /// Whether the vertices' distinct reads are disjoint (see [`summarize_vertices`]).
    disjoint: bool,
}

impl<'a, S: Storage> Lowering<'a, S> {
    /// Appends a compute set whose vertices read only what their tiles hold (no exchange).
    pub(crate) fn local_compute(&mut self, node: NodeId, phase: &str, vertices: Vec<Vertex>) {
        if vertices.is_empty() {
            return;
        }
        debug_assert!(
            self.summaries.is_some() || exchange_for(&self.tensors, &vertices).is_empty(),
            "a local compute set reads another tile's data"
        );
        let name = format!("{}/{phase}", self.node(node).name());
        self.push_compute(ComputeSet::new(name, node, vertices));
    }

    /// Appends a compute set (without its vertices when the lowering keeps only costs).
    pub(crate) fn push_compute(&mut self, cs: ComputeSet) {
        self.steps.push(Step::Compute(if self.summaries.is_some() {
            cs.without_vertices()
        } else {
            cs
        }));
    }

    /// Appends a compute set, preceded by the exchange its vertices need.
    pub(crate) fn compute(&mut self, node: NodeId, phase: &str, vertices: Vec<Vertex>) {
        self.compute_reading_locally(node, phase, vertices, &[]);
    }

    /// [`compute`](Self::compute) for vertices that read the tensors `local` only on their
    /// own tiles (the tiles' runs of tensors laid out like what they write), which the
    /// exchange's summary then need not look up.
    fn compute_reading_locally(
        &mut self,
        node: NodeId,
        phase: &str,
        vertices: Vec<Vertex>,
        local: &[TensorId],
    ) {
        let hints = ReadHints {
            local,
            spread: None,
            runs: None,
            disjoint: false,
        };
        self.compute_spread(node, phase, vertices, hints);
    }

    /// [`compute_reading_locally`](Self::compute_reading_locally) for vertices that read each
    /// tensor of `runs` as [`Runs`] says, and nothing else of it.
    pub(crate) fn compute_reading_runs(
        &mut self,
        node: NodeId,
        phase: &str,
        vertices: Vec<Vertex>,
        local: &[TensorId],
        runs: Runs,
    ) {
        let hints = ReadHints {
            local,
            spread: None,
            runs: Some(runs),
            disjoint: false,
        };
        self.compute_spread(node, phase, vertices, hints);
    }

    /// [`compute`](Self::compute) for vertices whose distinct reads are disjoint (no two
    /// share an element; see [`summarize_vertices`]).
    pub(crate) fn compute_disjoint(&mut self, node: NodeId, phase: &str, vertices: Vec<Vertex>) {
        let hints = ReadHints {
            local: &[],
            spread: None,
            runs: None,
            disjoint: true,
        };
        self.compute_spread(node, phase, vertices, hints);
    }

    /// [`compute_reading_locally`](Self::compute_reading_locally) with the tensors read
    /// locally in `hints`, and the summary taken from (or kept in) the lowering's
    /// element-wise summaries under the hints' spread key when it is given (the key, and the
    /// tensors read in its order), and what the reads of the hints' runs add taken from (or
    /// kept in) them too.
    fn compute_spread(
        &mut self,
        node: NodeId,
        phase: &str,
        vertices: Vec<Vertex>,
        hints: ReadHints<'_>,
    ) {
        let ReadHints {
            local,
            spread,
            runs,
            disjoint,
        } = hints;
        if vertices.is_empty() {
            return;
        }
        if let Some(summaries) = &mut self.summaries {
            let (tiles, tensors, locality) = (self.cfg.tiles, &self.tensors, &mut self.locality);
            let kept = &self.spread;
            let mut summarize = || {
                let runs = runs.as_ref().map(|r| RunReads {
                    over: tensors[r.over.index()].mapping.digest(),
                    tensors: &r.tensors,
                    kept,
                });
                summarize_vertices(tiles, tensors, &vertices, locality, local, disjoint, runs)
            };
            let s = match spread {
                Some((key, reads)) => self.spread.get_or_summarize(key, &reads, summarize),
                None => summarize(),
            };
            if let Some(s) = s {
                summaries.push(self.steps.len(), s);
                self.steps.push(Step::Exchange {
                    node,
                    transfers: Vec::new(),
                });
            }
        } else {
            let transfers = exchange_for(&self.tensors, &vertices);
            // What the summaries take on trust: nothing of a tensor read locally moves (the
            // unit tests compare both lowerings, so a wrong hint fails them).
            debug_assert!(
                transfers.iter().all(|t| !local.contains(&t.region.tensor)),
                "a tensor said to be read locally moves in {}",
                self.node(node).name()
            );
            if !transfers.is_empty() {
                self.steps.push(Step::Exchange { node, transfers });
            }
        }
        let name = format!("{}/{phase}", self.node(node).name());
        let cs = ComputeSet::new(name, node, vertices);
        // Estimates need only the costs: without the vertices, a large model's program
        // takes a fraction of the memory.
        self.steps.push(Step::Compute(if self.summaries.is_some() {
            cs.without_vertices()
        } else {
            cs
        }));
    }

    /// One vertex per tile of `over`'s mapping, covering all the tile's intervals (in order
    /// of their start): `regions(intervals)` gives the vertex's reads and writes, and the vertex
    /// costs `cycles(elements)` plus [`REGION_OVERHEAD_CYCLES`] per region written beyond the
    /// first. Gives the vertices; the caller appends their compute set.
    fn per_tile_groups(
        &self,
        over: TensorId,
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        mut regions: impl FnMut(&[Interval]) -> (Vec<Region>, Vec<Region>),
    ) -> Vec<Vertex> {
        let mapping = self.tensors[over.index()].mapping.clone();
        let ivs = mapping.intervals_by_tile();
        ivs.chunk_by(|a, b| a.tile == b.tile)
            .map(|group| {
                let (reads, writes) = regions(group);
                let elements: u64 = group.iter().map(|iv| iv.len).sum();
                // Per region written beyond the first, after joining: a run of rows of one
                // channel group is one region, as it is contiguous in Poplar's grouped layout.
                let extra = REGION_OVERHEAD_CYCLES * (writes.len() as u64).saturating_sub(1);
                Vertex {
                    tile: group[0].tile,
                    codelet,
                    cycles: cycles(elements) + extra,
                    reads,
                    writes,
                }
            })
            .collect()
    }

    /// The tensors among `ts` laid out like `over`, leaving out those `except` names (regions
    /// read besides the runs): a vertex reading its tile's runs of `over`'s mapping in them
    /// reads only its own tile.
    pub(super) fn laid_out_like(
        &self,
        over: TensorId,
        ts: &[TensorId],
        except: &[Region],
    ) -> Vec<TensorId> {
        let m = &self.tensors[over.index()].mapping;
        ts.iter()
            .copied()
            .filter(|&t| {
                self.tensors[t.index()].mapping.same_layout(m)
                    && !except.iter().any(|r| r.tensor == t)
            })
            .collect()
    }

    /// One vertex per tile of `over`'s mapping, covering all the tile's intervals and writing
    /// them: `reads(interval, out)` appends each interval's reads to `out`, and the vertex
    /// costs `cycles(elements)` plus [`REGION_OVERHEAD_CYCLES`] per region written beyond the
    /// first. The writes are the tile's intervals joined into runs (made once per mapping),
    /// the regions joining each interval's span of `over` gives.
    pub(crate) fn per_tile(
        &mut self,
        node: NodeId,
        phase: &str,
        over: TensorId,
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        mut reads: impl FnMut(&Interval, &mut Vec<Region>),
    ) {
        let mapping = self.tensors[over.index()].mapping.clone();
        let mut tiles = mapping.runs_per_tile().iter();
        // Each tile's reads, before they are joined (the buffer is reused from tile to tile).
        let mut buf: Vec<Region> = Vec::new();
        let vertices = self.per_tile_groups(over, codelet, cycles, |group| {
            // The groups come in the order of the tiles.
            let (tile, runs) = tiles.next().expect("a group per tile");
            debug_assert_eq!(*tile, group[0].tile);
            for iv in group {
                reads(iv, &mut buf);
            }
            let writes = runs.iter().map(|r| Region { tensor: over, ..*r }).collect();
            (compress_from(&mut buf), writes)
        });
        self.compute(node, phase, vertices);
    }

    /// [`per_tile`](Self::per_tile) for the common case of vertices reading and writing the
    /// same elements of several tensors (each interval of `over`'s mapping in each of `same`'s
    /// reads and writes) plus `same`'s fixed regions (a counter, a step). Gives exactly the
    /// vertices `per_tile` gives, without making a region per interval and tensor and joining
    /// them again: each tile's intervals are joined into strided runs once, and every tensor
    /// reads those runs.
    pub(crate) fn per_tile_same(
        &mut self,
        node: NodeId,
        phase: &str,
        over: TensorId,
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        same: SameElements<'_>,
    ) {
        let SameElements {
            reads,
            writes,
            fixed,
        } = same;
        let once = |ts: &[TensorId]| {
            let mut ts = ts.to_vec();
            ts.sort_unstable();
            ts.dedup();
            ts
        };
        let (reads, writes) = (once(reads), once(writes));
        // Shards of optimizer state (replicated tensor sharding on the tiles) hold fewer
        // elements than `over`: each vertex reads and writes its own tile's shard instead.
        let total = self.tensors[over.index()].elements;
        let sharded = |t: &TensorId| self.tensors[t.index()].elements != total;
        let (shard_reads, reads): (Vec<TensorId>, Vec<TensorId>) =
            reads.into_iter().partition(sharded);
        let (shard_writes, writes): (Vec<TensorId>, Vec<TensorId>) =
            writes.into_iter().partition(sharded);
        // The regions of `runs` in each of `ts`, `fixed`, and the tile's runs of each of
        // `shards`, sorted.
        let on = |ts: &[TensorId], runs: &[Region], fixed: &[Region], shards: &[TensorId], tile| {
            let mut out: Vec<Region> = Vec::with_capacity(ts.len() * runs.len() + fixed.len());
            for &t in ts {
                out.extend(runs.iter().map(|r| Region { tensor: t, ..*r }));
            }
            out.extend_from_slice(fixed);
            for &t in shards {
                let own = self.tensors[t.index()].mapping.runs_on(tile);
                out.extend(own.iter().map(|r| Region { tensor: t, ..*r }));
            }
            out.sort_unstable();
            out.dedup();
            out
        };
        let mapping = self.tensors[over.index()].mapping.clone();
        let mut tiles = mapping.runs_per_tile().iter();
        let vertices = self.per_tile_groups(over, codelet, cycles, |group| {
            // The groups come in the order of the tiles.
            let (tile, runs) = tiles.next().expect("a group per tile");
            debug_assert_eq!(*tile, group[0].tile);
            (
                on(&reads, runs, fixed, &shard_reads, *tile),
                on(&writes, runs, &[], &shard_writes, *tile),
            )
        });
        let local = self.laid_out_like(over, &reads, fixed);
        let spread = if fixed.is_empty() && shard_reads.is_empty() {
            self.spread_key(over, &reads, &local)
        } else {
            None
        };
        // (A tensor `fixed` reads too is read otherwise than by runs.)
        let runs = Runs::of(
            over,
            reads
                .iter()
                .copied()
                .filter(|&t| fixed.iter().all(|f| f.tensor != t)),
        );
        let hints = ReadHints {
            local: &local,
            spread,
            runs: Some(runs),
            disjoint: false,
        };
        self.compute_spread(node, phase, vertices, hints);
    }

    /// A vertex per tile of `out`'s mapping, reading the same elements of the operands in
    /// `same` and the regions `extra(start, len, out)` appends to `out` for each interval.
    pub(crate) fn elementwise(
        &mut self,
        node: NodeId,
        out: TensorId,
        same: &[TensorId],
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        mut extra: impl FnMut(u64, u64, &mut Vec<Region>),
    ) {
        let others = OtherReads {
            broadcast: &[],
            extra: |_: usize, group: &[Interval], others: &mut Vec<Region>| {
                for iv in group {
                    extra(iv.start, iv.len, others);
                }
            },
        };
        self.elementwise_by_tile(node, out, same, codelet, cycles, others);
    }

    /// [`elementwise`](Self::elementwise) whose other operands are read by broadcast
    /// (`broadcast`): each tile's reads of them, joined, are made once per layout of `out`
    /// and kind of broadcast ([`broadcast::per_tile`]) and shared by every compute set that
    /// reads alike (a batch norm's normalisation, its recomputation and its gradient, its
    /// scale and its shift).
    pub(crate) fn elementwise_broadcast(
        &mut self,
        node: NodeId,
        out: TensorId,
        same: &[TensorId],
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        broadcast: &[broadcast::Broadcast],
    ) {
        let Some(operands) = broadcast::distinct(same, broadcast) else {
            // An operand read both ways, or broadcast two ways: its regions are joined
            // together, interval by interval.
            let mut tmp = Vec::new();
            return self.elementwise(node, out, same, codelet, cycles, |s, len, reads| {
                for b in broadcast {
                    b.push(s, len, reads, &mut tmp);
                }
            });
        };
        let mapping = self.tensors[out.index()].mapping.clone();
        let lists: Vec<(TensorId, broadcast::TileReads)> = operands
            .iter()
            .map(|b| (b.tensor(), broadcast::per_tile(&mapping, b)))
            .collect();
        let how: Vec<(TensorId, PerTile)> = operands
            .iter()
            .map(|b| (b.tensor(), b.per_tile()))
            .collect();
        let others = OtherReads {
            broadcast: &how,
            extra: |k: usize, _: &[Interval], others: &mut Vec<Region>| {
                for (t, list) in &lists {
                    others.extend(list.tile(k).iter().map(|r| Region { tensor: *t, ..*r }));
                }
            },
        };
        self.elementwise_by_tile(node, out, same, codelet, cycles, others);
    }

    /// [`elementwise`](Self::elementwise) with the other reads of the `k`th tile (of `out`'s
    /// mapping, by tile) appended by `others.extra(k, intervals, out)`: joined already when
    /// they are `others.broadcast`'s (each tensor's as [`compress`] joins them, each tile
    /// reading a tensor as its [`PerTile`] says, and no tensor of `same`), else as they come,
    /// and joined here.
    fn elementwise_by_tile(
        &mut self,
        node: NodeId,
        out: TensorId,
        same: &[TensorId],
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        others: OtherReads<'_, impl FnMut(usize, &[Interval], &mut Vec<Region>)>,
    ) {
        let OtherReads {
            broadcast,
            mut extra,
        } = others;
        let joined = !broadcast.is_empty();
        // The vertices `per_tile` gives with each interval's spans of `same` and `extra`'s
        // regions as reads and its span of `out` as the write, computed with less work: a
        // tile's intervals are joined into runs once, and every tensor of `same` reads those
        // runs (joining each tensor's spans is separate from joining another's).
        let mut once = same.to_vec();
        once.sort_unstable();
        once.dedup();
        let mapping = self.tensors[out.index()].mapping.clone();
        let mut tiles = mapping.runs_per_tile().iter().enumerate();
        let mut runs: Vec<Region> = Vec::new();
        let mut others: Vec<Region> = Vec::new();
        // Whether some tile's `extra` reads a tensor of `same` (its reads are then joined
        // with the others), and whether it reads anything.
        let mut mixed = false;
        let mut any_extra = false;
        let vertices = self.per_tile_groups(out, codelet, cycles, |group| {
            // The groups come in the order of the tiles.
            let (k, (tile, joined_runs)) = tiles.next().expect("a group per tile");
            debug_assert_eq!(*tile, group[0].tile);
            runs.clear();
            runs.extend(joined_runs.iter().map(|r| Region { tensor: out, ..*r }));
            others.clear();
            extra(k, group, &mut others);
            any_extra |= !others.is_empty();
            let reads = if others.iter().any(|r| once.binary_search(&r.tensor).is_ok()) {
                // `extra` reads a tensor of `same` too: join their regions together.
                debug_assert!(!joined, "joined reads of a tensor read alike");
                mixed = true;
                let mut reads: Vec<Region> = group
                    .iter()
                    .flat_map(|iv| same.iter().map(|&t| Region::span(t, iv.start, iv.len)))
                    .collect();
                reads.append(&mut others);
                compress(reads)
            } else {
                // Joining each tensor's regions is separate from joining another's, and the
                // regions are sorted at the end: regions joined already are taken as they are.
                let mut reads = if joined {
                    let mut r = Vec::with_capacity(others.len() + once.len() * runs.len());
                    r.append(&mut others);
                    r
                } else {
                    compress_from(&mut others)
                };
                for &t in &once {
                    reads.extend(runs.iter().map(|r| Region { tensor: t, ..*r }));
                }
                reads.sort_unstable();
                reads
            };
            // (The runs are sorted.)
            (reads, runs.clone())
        });
        let local = if mixed {
            Vec::new()
        } else {
            self.laid_out_like(out, &once, &[])
        };
        let spread = if any_extra {
            None
        } else {
            self.spread_key(out, &once, &local)
        };
        // (Mixed, some tensor of `same` is also read otherwise.)
        let runs = (!mixed).then(|| {
            let mut runs = Runs::of(out, once);
            runs.tensors.extend_from_slice(broadcast);
            runs
        });
        let hints = ReadHints {
            local: &local,
            spread,
            runs,
            disjoint: false,
        };
        self.compute_spread(node, "op", vertices, hints);
    }

    /// The key under which the exchange of vertices that read, on each tile of `over`'s
    /// layout, its runs of each of `reads` (distinct) and nothing else is kept for other
    /// compute sets that read alike (see [`SpreadSummaries`]), with `reads` in its order;
    /// `None` when exchanges are not summarised or the tensors looked up are small.
    fn spread_key(
        &self,
        over: TensorId,
        reads: &[TensorId],
        local: &[TensorId],
    ) -> Option<(SpreadKey, Vec<TensorId>)> {
        let looked_up: usize = reads
            .iter()
            .filter(|t| !local.contains(t))
            .map(|t| self.tensors[t.index()].mapping.intervals().len())
            .sum();
        (self.summaries.is_some() && looked_up >= SPREAD_FROM_INTERVALS)
            .then(|| SpreadKey::new(self.cfg.tiles, &self.tensors, over, reads, local))
    }
}
