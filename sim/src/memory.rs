//! Memory per tile, by the categories PopVision shows: always-live tensors, not-always-live
//! tensors (at the tile's peak), vertex code, vertex state, exchange code, exchange buffers,
//! control code and stack.

use std::collections::HashMap;

use std::fmt;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::exchange::{ExchangeSummary, ExchangeTile, Summaries};
use crate::machine::IpuConfig;
use crate::program::{Program, Step, TensorClass, TileId};

/// Control code per program step on each tile taking part in it (a compute set's tiles with
/// vertices, an exchange's senders and receivers, a stream's or copy's tiles). Poplar's own
/// figure: one compute set on all 1,472 tiles of a Mk2 (EfficientNet's `blocks_0/Relu`)
/// has 23,552 B of control code, 16 B a tile (PopLiner `tests/test_profile.py`); 4-tile and
/// 1,280-tile element-wise ops of BERT-Large have 20 B a tile (`test_popart_bert_inf.py`).
pub const CONTROL_BYTES_PER_STEP: u64 = 16;
/// Control code per call of an outlined body, on every tile (estimate: a call and a return
/// instruction; the copies in and out are steps of their own).
pub const CONTROL_BYTES_PER_CALL: u64 = 8;
/// Stack per tile: six worker stacks and the supervisor's (estimate, Poplar's order).
pub const STACK_BYTES: u64 = 1_024;

/// The memory of a part of a program (`account_part`): a pipeline stage that shares its
/// IPU with other stages, as PopLiner attributes a profiled program to layer ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartMemory {
    /// Bytes over the IPU's tiles by category.
    pub categories: TileMemory,
    /// Bytes used (the sum of the tiles' peaks over the part's steps).
    pub bytes_used: u64,
    /// The fullest tile's bytes.
    pub max_tile_bytes: u64,
}

/// One tile's memory at its peak, by category.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileMemory {
    /// The tile.
    pub tile: TileId,
    /// Weights, optimizer state, constants.
    pub always_live: u64,
    /// Activations, gradients, inputs and temporaries live at the peak step.
    pub not_always_live: u64,
    /// Code of the codelets the tile runs.
    pub vertex_code: u64,
    /// Vertex state and descriptors.
    pub vertex_state: u64,
    /// Exchange code.
    pub exchange_code: u64,
    /// Receive buffers live at the peak step.
    pub exchange_buffers: u64,
    /// Control code.
    pub control_code: u64,
    /// Stack.
    pub stack: u64,
    /// Pipeline stash: activations kept for later micro-batches' backward passes.
    pub stash: u64,
    /// Unused memory below the tile's interleaved data: data that must be interleaved (the
    /// AMP's partial sums) sits in the interleaved region at the top of the tile, so the tile
    /// is used up to it even when its other data does not reach it. PopVision counts it in a
    /// tile's total "including gaps"; the tile fits only if this total does
    /// ([`TileMemory::settle_gaps`]).
    #[serde(default)]
    pub gaps: u64,
    /// The most bytes of data that must be interleaved live at once on the tile (at any step,
    /// not only the peak's; informative, as it is counted in `not_always_live` when live then).
    #[serde(default)]
    pub interleaved: u64,
    /// Program step of the peak.
    pub peak_step: usize,
}

/// A memory category, as PopVision's memory report names them. Every estimate, summary and
/// report lists categories through [`MemoryCategory::ALL`], in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryCategory {
    /// Weights, optimizer state, constants.
    AlwaysLive,
    /// Activations, gradients, inputs and temporaries live at the peak step.
    NotAlwaysLive,
    /// Pipeline stash: activations kept for later micro-batches' backward passes.
    Stash,
    /// Code of the codelets the tile runs.
    VertexCode,
    /// Vertex state and descriptors.
    VertexState,
    /// Exchange code.
    ExchangeCode,
    /// Receive buffers live at the peak step.
    ExchangeBuffers,
    /// Control code.
    ControlCode,
    /// Stack.
    Stack,
    /// Unused memory below interleaved data (see [`TileMemory::gaps`]).
    Gaps,
}

impl MemoryCategory {
    /// Every category, in report order.
    pub const ALL: [MemoryCategory; 10] = [
        MemoryCategory::AlwaysLive,
        MemoryCategory::NotAlwaysLive,
        MemoryCategory::Stash,
        MemoryCategory::VertexCode,
        MemoryCategory::VertexState,
        MemoryCategory::ExchangeCode,
        MemoryCategory::ExchangeBuffers,
        MemoryCategory::ControlCode,
        MemoryCategory::Stack,
        MemoryCategory::Gaps,
    ];

    /// The key in JSON outputs (`always_live`, ...).
    pub fn key(self) -> &'static str {
        match self {
            MemoryCategory::AlwaysLive => "always_live",
            MemoryCategory::NotAlwaysLive => "not_always_live",
            MemoryCategory::Stash => "stash",
            MemoryCategory::VertexCode => "vertex_code",
            MemoryCategory::VertexState => "vertex_state",
            MemoryCategory::ExchangeCode => "exchange_code",
            MemoryCategory::ExchangeBuffers => "exchange_buffers",
            MemoryCategory::ControlCode => "control_code",
            MemoryCategory::Stack => "stack",
            MemoryCategory::Gaps => "gaps",
        }
    }

    /// The name people read (`always-live`, ...).
    pub fn label(self) -> &'static str {
        match self {
            MemoryCategory::AlwaysLive => "always-live",
            MemoryCategory::NotAlwaysLive => "not-always-live",
            MemoryCategory::Stash => "stash",
            MemoryCategory::VertexCode => "vertex code",
            MemoryCategory::VertexState => "vertex state",
            MemoryCategory::ExchangeCode => "exchange code",
            MemoryCategory::ExchangeBuffers => "exchange buffers",
            MemoryCategory::ControlCode => "control code",
            MemoryCategory::Stack => "stack",
            MemoryCategory::Gaps => "gaps below interleaved data",
        }
    }
}

impl fmt::Display for MemoryCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl TileMemory {
    /// Bytes of one category.
    pub fn get(&self, c: MemoryCategory) -> u64 {
        match c {
            MemoryCategory::AlwaysLive => self.always_live,
            MemoryCategory::NotAlwaysLive => self.not_always_live,
            MemoryCategory::Stash => self.stash,
            MemoryCategory::VertexCode => self.vertex_code,
            MemoryCategory::VertexState => self.vertex_state,
            MemoryCategory::ExchangeCode => self.exchange_code,
            MemoryCategory::ExchangeBuffers => self.exchange_buffers,
            MemoryCategory::ControlCode => self.control_code,
            MemoryCategory::Stack => self.stack,
            MemoryCategory::Gaps => self.gaps,
        }
    }

    /// The bytes of one category, to change.
    pub fn get_mut(&mut self, c: MemoryCategory) -> &mut u64 {
        match c {
            MemoryCategory::AlwaysLive => &mut self.always_live,
            MemoryCategory::NotAlwaysLive => &mut self.not_always_live,
            MemoryCategory::Stash => &mut self.stash,
            MemoryCategory::VertexCode => &mut self.vertex_code,
            MemoryCategory::VertexState => &mut self.vertex_state,
            MemoryCategory::ExchangeCode => &mut self.exchange_code,
            MemoryCategory::ExchangeBuffers => &mut self.exchange_buffers,
            MemoryCategory::ControlCode => &mut self.control_code,
            MemoryCategory::Stack => &mut self.stack,
            MemoryCategory::Gaps => &mut self.gaps,
        }
    }

    /// Every category with its bytes, in report order.
    pub fn categories(&self) -> impl Iterator<Item = (MemoryCategory, u64)> + '_ {
        MemoryCategory::ALL.into_iter().map(|c| (c, self.get(c)))
    }

    /// Every category summed over `tiles` (the result's `tile` and `peak_step` are 0).
    pub fn sum<'a>(tiles: impl IntoIterator<Item = &'a TileMemory>) -> TileMemory {
        let mut t = TileMemory::default();
        for m in tiles {
            for c in MemoryCategory::ALL {
                *t.get_mut(c) += m.get(c);
            }
        }
        t
    }

    /// Bytes in all categories: the tile's memory including gaps, which must fit its SRAM.
    pub fn total(&self) -> u64 {
        MemoryCategory::ALL.into_iter().map(|c| self.get(c)).sum()
    }

    /// Bytes of data, code and buffers: [`TileMemory::total`] without the gaps.
    pub fn data_bytes(&self) -> u64 {
        self.total() - self.gaps
    }

    /// Sets [`TileMemory::gaps`] for an interleaved region starting `interleaved_start` bytes
    /// up. Interleaved data fills the region from its start; other data fills the tile from the
    /// bottom, then the region above the interleaved data. At a step with `i > 0` interleaved
    /// bytes and `d` bytes in all, the tile is used up to `max(d, interleaved_start + i)`; over
    /// the program that is `max(data peak, interleaved_start + interleaved peak)`, and the gaps
    /// are what that adds to the data peak.
    pub fn settle_gaps(&mut self, interleaved_start: u64) {
        self.gaps = 0;
        if self.interleaved == 0 {
            return;
        }
        self.gaps = (interleaved_start + self.interleaved).saturating_sub(self.data_bytes());
    }
}

/// Memory of every tile, and what is on the fullest ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// SRAM per tile.
    pub sram_bytes_per_tile: u64,
    /// Where each tile's interleaved region starts ([`IpuConfig::interleaved_region_start_bytes`]).
    #[serde(default)]
    pub interleaved_region_start_bytes: u64,
    /// Every tile, by index.
    pub tiles: Vec<TileMemory>,
}

impl MemoryReport {
    /// Tiles ordered fullest first.
    pub fn fullest(&self, n: usize) -> Vec<&TileMemory> {
        let mut v: Vec<&TileMemory> = self.tiles.iter().collect();
        v.sort_by(|a, b| b.total().cmp(&a.total()).then(a.tile.cmp(&b.tile)));
        v.truncate(n);
        v
    }

    /// Sum over tiles of each tile's peak, gaps not counted (as liveness totals are).
    pub fn total_bytes(&self) -> u64 {
        self.tiles.iter().map(TileMemory::data_bytes).sum()
    }

    /// Recomputes every tile's gaps after categories were added to (the pipeline stash).
    pub fn settle_gaps(&mut self) {
        let start = self.interleaved_region_start_bytes;
        for t in &mut self.tiles {
            t.settle_gaps(start);
        }
    }

    /// Tiles that hold anything beyond the fixed control code and stack.
    pub fn tiles_used(&self) -> usize {
        self.tiles
            .iter()
            .filter(|t| t.always_live + t.not_always_live + t.vertex_state > 0)
            .count()
    }

    /// The first tile over its SRAM, fullest first.
    pub fn over_limit(&self) -> Option<&TileMemory> {
        self.fullest(1)
            .into_iter()
            .find(|t| t.total() > self.sram_bytes_per_tile)
    }
}

/// A tile needs more SRAM than it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfMemory {
    /// The fullest tile.
    pub tile: TileId,
    /// Bytes it needs at its peak.
    pub needed: u64,
    /// Its SRAM.
    pub available: u64,
    /// Tiles over the limit.
    pub tiles_over: usize,
    /// The largest tensors on it at its peak, with their bytes on that tile.
    pub largest_tensors: Vec<(String, u64)>,
    /// The compute sets with the most vertex state on it.
    pub largest_vertices: Vec<(String, u64)>,
    /// The exchanges whose receive buffers are live on it at its peak (by the node they
    /// serve), with the bytes it receives in each: its exchange buffers.
    #[serde(default)]
    pub receiving: Vec<(String, u64)>,
    /// Its memory by category.
    pub memory: TileMemory,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory: tile {} needs {} bytes but has {} ({} bytes over; {} tile{} over the limit)",
            self.tile,
            self.needed,
            self.available,
            self.needed - self.available,
            self.tiles_over,
            if self.tiles_over == 1 { " is" } else { "s are" }
        )?;
        f.write_str("; at its peak:")?;
        for (i, (c, b)) in self.memory.categories().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{c} {b} B")?;
        }
        for (label, list) in [
            ("largest tensors there", &self.largest_tensors),
            ("largest vertex state", &self.largest_vertices),
            ("exchange buffers for", &self.receiving),
        ] {
            if list.is_empty() {
                continue;
            }
            write!(f, "; {label}: ")?;
            for (i, (n, b)) in list.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "`{n}` {b} B")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for OutOfMemory {}

/// The code a graph node's steps add, summed over the tiles of its IPU: what PopVision's
/// program tree shows per program (vertex state, exchange code, control code), the
/// compute sets and exchanges behind it, and the messages its exchanges send (the
/// sent regions, each one send instruction whatever the number of receivers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCode {
    /// Bytes of vertex state of its compute sets.
    pub vertex_state: u64,
    /// Bytes of exchange code of its exchanges.
    pub exchange_code: u64,
    /// Bytes of control code for its steps, on the tiles taking part in each.
    pub control_code: u64,
    /// Vertices of its compute sets.
    pub vertices: u64,
    /// Its steps (compute sets, exchanges, host and link transfers).
    pub steps: u64,
    /// Regions its exchanges send (one send instruction each).
    pub sends: u64,
    /// Regions its exchanges' tiles receive.
    pub receives: u64,
}

impl NodeCode {
    /// Adds `other`'s bytes and counts.
    pub fn add(&mut self, other: &NodeCode) {
        self.vertex_state += other.vertex_state;
        self.exchange_code += other.exchange_code;
        self.control_code += other.control_code;
        self.vertices += other.vertices;
        self.steps += other.steps;
        self.sends += other.sends;
        self.receives += other.receives;
    }
}

/// Exchange code that identical exchanges share. A tile's exchange code is a block of
/// instructions in its own memory with the addresses it sends from and receives into and the
/// cycles it waits; two exchanges that move the same regions at the same addresses need the
/// same block, and Poplar keeps one. Poplar's profile of BERT-Large shows it: with outlining
/// blocked, layer 0 has 3.66 MB of exchange code and each identical layer after it about
/// 1.01 MB, while their vertex state and control code are the same as layer 0's (PopLiner
/// `tests/test_popart_bert_inf.py`). So the exchanges of a node lowered like an earlier one
/// ([`Program::exchange_keys`]: a repeated layer's, a recomputed copy's) add code only on
/// the tiles that send always-live data (a layer's own weights, at their own addresses), or
/// when the always-live tensors they move differ from every earlier exchange of the key.
/// Activations and temporaries of identical layers are taken to be at the same addresses,
/// as the allocator places what identical live ranges need alike (inferred from that
/// profile; not documented).
struct SharedExchangeCode<'p> {
    /// [`Program::exchange_keys`], by step.
    keys: &'p [(usize, u128)],
    /// Per key, the digests of the always-live tensors its exchanges moved so far.
    seen: HashMap<u128, Vec<u64>>,
}

impl<'p> SharedExchangeCode<'p> {
    fn new(program: &'p Program) -> Self {
        SharedExchangeCode {
            keys: &program.exchange_keys,
            seen: HashMap::new(),
        }
    }

    /// Calls `pay(tile, code)` for each tile of exchange step `s` whose code no earlier
    /// identical exchange holds.
    fn each_paid(
        &mut self,
        s: usize,
        summary: &ExchangeSummary,
        tensors: &[crate::program::ProgTensor],
        mut pay: impl FnMut(&ExchangeTile),
    ) {
        let Ok(at) = self.keys.binary_search_by_key(&s, |&(step, _)| step) else {
            summary.tiles.iter().for_each(pay);
            return;
        };
        let key = self.keys[at].1;
        let state = summary
            .tensors
            .iter()
            .filter(|t| tensors[t.index()].class == TensorClass::AlwaysLive)
            .fold(0xcbf2_9ce4_8422_2325u64, |h, t| {
                (h ^ u64::from(t.0)).wrapping_mul(0x0100_0000_01b3)
            });
        let seen = self.seen.entry(key).or_default();
        let (first, state_new) = (seen.is_empty(), !seen.contains(&state));
        if state_new {
            seen.push(state);
        }
        for x in summary.tiles.iter() {
            if first || (x.state_sends > 0 && state_new) {
                pay(x);
            }
        }
    }
}

/// Per step: whether its code is an outlined body's that an earlier step holds
/// ([`Program::shared_steps`]).
fn shared_steps(program: &Program) -> Vec<bool> {
    let mut shared = vec![false; program.steps.len()];
    for &(a, b) in &program.shared_steps {
        shared[a..b].iter_mut().for_each(|x| *x = true);
    }
    shared
}

/// Calls `f` once for each tile taking part in step `s`.
fn step_tiles(
    program: &Program,
    summaries: &Summaries,
    s: usize,
    seen: &mut [usize],
    mut f: impl FnMut(usize),
) {
    let mut once = |t: usize| {
        if seen[t] != s {
            seen[t] = s;
            f(t);
        }
    };
    match &program.steps[s] {
        Step::Compute(cs) => cs.costs.iter().for_each(|v| once(v.tile.index())),
        Step::Exchange { transfers, .. } => summaries
            .of(s, program.tiles, &program.tensors, transfers)
            .tiles
            .iter()
            .for_each(|x| once(x.tile.index())),
        Step::HostToDevice { tensor, .. }
        | Step::DeviceToHost { tensor, .. }
        | Step::LinkReceive { tensor, .. }
        | Step::Collective { tensor, .. }
        | Step::RemoteBuffer { tensor, .. } => program.tensors[tensor.index()]
            .mapping
            .tile_sums()
            .iter()
            .for_each(|(t, _)| once(t.index())),
    }
}

/// Whether step `s` is in `part` (every step is in the whole program, `None`).
fn step_in(part: Option<&[bool]>, s: usize) -> bool {
    part.is_none_or(|p| p.get(s).copied().unwrap_or(false))
}

/// Control code per tile: [`CONTROL_BYTES_PER_STEP`] for each step it takes part in that no
/// outlined body holds, and [`CONTROL_BYTES_PER_CALL`] on every tile for each call of one.
fn control_code_per_tile(
    program: &Program,
    summaries: &Summaries,
    shared: &[bool],
    part: Option<&[bool]>,
) -> Vec<u64> {
    let tiles = program.tiles as usize;
    // A part's calls are not told apart from the program's: a part carries them all.
    let mut control = vec![program.calls as u64 * CONTROL_BYTES_PER_CALL; tiles];
    let mut seen = vec![usize::MAX; tiles];
    for s in (0..program.steps.len()).filter(|&s| !shared[s] && step_in(part, s)) {
        step_tiles(program, summaries, s, &mut seen, |t| {
            control[t] += CONTROL_BYTES_PER_STEP
        });
    }
    control
}

/// Each graph node's [`NodeCode`] in `program` (nodes without steps have zeros; steps whose
/// code an outlined body holds add none).
pub(crate) fn node_code(program: &Program, summaries: &Summaries) -> Vec<NodeCode> {
    let shared = shared_steps(program);
    let mut exchange_code = SharedExchangeCode::new(program);
    let mut seen = vec![usize::MAX; program.tiles as usize];
    program
        .node_steps
        .iter()
        .map(|&(a, b)| {
            let mut c = NodeCode {
                steps: (b - a) as u64,
                ..NodeCode::default()
            };
            for s in (a..b).filter(|&s| !shared[s]) {
                step_tiles(program, summaries, s, &mut seen, |_| {
                    c.control_code += CONTROL_BYTES_PER_STEP;
                });
                match &program.steps[s] {
                    Step::Compute(cs) => {
                        c.vertices += cs.costs.len() as u64;
                        c.vertex_state += cs.costs.iter().map(|v| v.state_bytes).sum::<u64>();
                    }
                    Step::Exchange { transfers, .. } => {
                        let x = summaries.of(s, program.tiles, &program.tensors, transfers);
                        for t in x.tiles.iter() {
                            c.sends += t.sends;
                            c.receives += t.receive_count;
                        }
                        exchange_code.each_paid(s, &x, &program.tensors, |t| {
                            c.exchange_code += t.code;
                        });
                    }
                    _ => {}
                }
            }
            c
        })
        .collect()
}

/// Computes every tile's peak memory over the program on IPUs of `cfg`.
pub fn account(program: &Program, cfg: &IpuConfig) -> MemoryReport {
    account_with(program, &Summaries::default(), cfg)
}

/// [`account`] of a program whose exchanges may be kept as summaries.
pub(crate) fn account_with(
    program: &Program,
    summaries: &Summaries,
    cfg: &IpuConfig,
) -> MemoryReport {
    account_part(program, summaries, cfg, None)
}

/// The memory of a part of a program: `part` marks its steps (all of them when `None`). Its
/// code is that of its steps (exchange code shared with an earlier step of the program, in or
/// out of the part, is not paid again), its vertex code that of the codelets its steps run,
/// its always-live data the variables its steps touch, and each tile's peak is the highest
/// over its steps. This is how PopLiner attributes a profiled program's memory to a range of
/// layers (`popliner/stage.py`: a stage's programs, the variables its ops use, the peak over
/// its steps), and how the stages that share an IPU are reported one by one.
pub(crate) fn account_part(
    program: &Program,
    summaries: &Summaries,
    cfg: &IpuConfig,
    part: Option<&[bool]>,
) -> MemoryReport {
    let sram_bytes_per_tile = cfg.sram_bytes_per_tile;
    let interleaved_start = cfg.interleaved_region_start_bytes;
    let tiles = program.tiles as usize;
    let mut tm: Vec<TileMemory> = (0..tiles)
        .map(|t| TileMemory {
            tile: TileId(t as u32),
            ..Default::default()
        })
        .collect();
    // Each tensor's bytes per tile are read below, one tensor after another: they are summed
    // on all the pool's threads first (a large model's mappings hold tens of millions of
    // intervals). The control code needs its own walk over the steps, beside the one below.
    program.tensors.par_iter().for_each(|t| {
        if t.elements > 0 {
            t.mapping.tile_sums();
        }
    });
    let mut changes = live_changes(program);
    let shared = shared_steps(program);
    let (walk, control) = rayon::join(
        || walk_steps(program, summaries, part, &shared, &mut tm, &mut changes),
        || control_code_per_tile(program, summaries, &shared, part),
    );
    for (t, _) in program
        .tensors
        .iter()
        .zip(&walk.used)
        .filter(|&(t, &u)| u && t.class == TensorClass::AlwaysLive)
    {
        let eb = t.elem_bytes();
        for &(tile, n) in t.mapping.tile_sums() {
            tm[tile.index()].always_live += n * eb;
        }
    }
    // Each run of a part's steps looks at every tile when it starts: a tile's data may have
    // arrived before the part and not changed in it.
    if let Some(p) = part {
        for s in (0..p.len()).filter(|&s| p[s] && (s == 0 || !p[s - 1])) {
            changes.push((s, Change::Probe));
        }
    }
    changes.sort_by_key(|c| c.0);
    let (best, peak_il) = peaks(program, &changes, &walk.buffers, part);
    for (t, mem) in tm.iter_mut().enumerate() {
        mem.vertex_code = walk.codelets.code_bytes(t);
        mem.control_code = control[t];
        mem.stack = STACK_BYTES;
        let (_, best_live, best_buf, best_step) = best[t];
        mem.not_always_live = best_live.max(0) as u64;
        mem.exchange_buffers = best_buf.max(0) as u64;
        mem.interleaved = peak_il[t].max(0) as u64;
        mem.peak_step = best_step;
        mem.settle_gaps(interleaved_start);
    }
    MemoryReport {
        sram_bytes_per_tile,
        interleaved_region_start_bytes: interleaved_start,
        tiles: tm,
    }
}

/// What changes a tile's not-always-live bytes at a step: a tensor (its bytes on each tile)
/// or an exchange's receive buffers (each receiving tile's bytes) arriving (+1) or leaving
/// (-1), by index.
#[derive(Clone, Copy)]
enum Change {
    Tensor(u32, i64),
    Buffer(u32, i64),
    /// A call's clone of a tensor (`Program::call_clones`): the tensor's bytes again.
    Clone(u32, i64),
    /// Every tile looked at (the start of a run of a part's steps).
    Probe,
}

/// The steps where each not-always-live tensor and call clone arrives and leaves.
fn live_changes(program: &Program) -> Vec<(usize, Change)> {
    let mut changes: Vec<(usize, Change)> = Vec::new();
    for (i, t) in program.tensors.iter().enumerate() {
        if t.class == TensorClass::AlwaysLive {
            continue;
        }
        if t.elements > 0 {
            changes.push((t.live.0, Change::Tensor(i as u32, 1)));
            changes.push((t.live.1 + 1, Change::Tensor(i as u32, -1)));
        }
    }
    for (k, &(_, first, last)) in program.call_clones.iter().enumerate() {
        changes.push((first, Change::Clone(k as u32, 1)));
        changes.push((last + 1, Change::Clone(k as u32, -1)));
    }
    changes
}

/// The codelets each tile runs: the distinct codelets numbered as they are first met, and
/// each tile's set of numbers as bits. (A set of codelets per tile cost a tree insertion per
/// vertex, a third of accounting a large program's memory; a program has a few hundred
/// distinct codelets.)
#[derive(Default)]
struct TileCodelets {
    numbers: HashMap<crate::program::Codelet, u32>,
    codelets: Vec<crate::program::Codelet>,
    /// The codelet numbered last, with its number: vertices after one another mostly run
    /// the same codelet, and it is tried before the map.
    last: Option<(crate::program::Codelet, u32)>,
    /// Per tile, bit `k` of word `k / 64`: whether it runs codelet `k`.
    bits: Vec<Vec<u64>>,
}

impl TileCodelets {
    fn new(tiles: usize) -> Self {
        TileCodelets {
            bits: vec![Vec::new(); tiles],
            ..Default::default()
        }
    }

    /// The number of `codelet`, numbering it when it is new.
    fn number(&mut self, codelet: crate::program::Codelet) -> u32 {
        if let Some((_, k)) = self.last.filter(|&(c, _)| c == codelet) {
            return k;
        }
        let k = *self.numbers.entry(codelet).or_insert_with(|| {
            self.codelets.push(codelet);
            self.codelets.len() as u32 - 1
        });
        self.last = Some((codelet, k));
        k
    }

    /// Tile `tile` runs codelet number `k`.
    fn insert(&mut self, tile: usize, k: u32) {
        let words = &mut self.bits[tile];
        let (w, b) = (k as usize / 64, k % 64);
        if words.len() <= w {
            words.resize(w + 1, 0);
        }
        words[w] |= 1 << b;
    }

    /// The code of the codelets tile `tile` runs, each once.
    fn code_bytes(&self, tile: usize) -> u64 {
        let mut bytes = 0;
        for (w, &word) in self.bits[tile].iter().enumerate() {
            let mut rest = word;
            while rest != 0 {
                let b = rest.trailing_zeros() as usize;
                bytes += self.codelets[w * 64 + b].code_bytes();
                rest &= rest - 1;
            }
        }
        bytes
    }
}

/// What a walk over a program's steps found.
struct StepWalk {
    /// The codelets each tile runs (in the part's steps).
    codelets: TileCodelets,
    /// Each exchange's tiles (its summary's rows): those receiving, and the bytes each receives.
    buffers: Vec<std::sync::Arc<[ExchangeTile]>>,
    /// The tensors the (part's) steps touch: a part holds only those of its variables.
    used: Vec<bool>,
}

/// Walks the steps: the vertex state and exchange code of the part's steps into `tm` (code
/// an earlier exchange paid, in the part or before it, is not paid again; a shared step's is
/// paid once), each exchange's receive buffers into `changes` (they live through the exchange
/// and the compute set after it), and the codelets and tensors the part's steps use.
fn walk_steps(
    program: &Program,
    summaries: &Summaries,
    part: Option<&[bool]>,
    shared: &[bool],
    tm: &mut [TileMemory],
    changes: &mut Vec<(usize, Change)>,
) -> StepWalk {
    let in_part = |s: usize| step_in(part, s);
    let tiles = program.tiles as usize;
    let mut codelets = TileCodelets::new(tiles);
    let mut buffers: Vec<std::sync::Arc<[ExchangeTile]>> = Vec::new();
    let mut exchange_code = SharedExchangeCode::new(program);
    let mut used = vec![part.is_none(); program.tensors.len()];
    for (s, step) in program.steps.iter().enumerate() {
        match step {
            Step::Compute(cs) => {
                if !in_part(s) {
                    continue;
                }
                cs.touched.iter().for_each(|t| used[t.index()] = true);
                for v in cs.costs.iter() {
                    let t = v.tile.index();
                    let k = codelets.number(v.codelet);
                    codelets.insert(t, k);
                    if !shared[s] {
                        tm[t].vertex_state += v.state_bytes;
                    }
                }
            }
            Step::Exchange { transfers, .. } => {
                let summary = summaries.of(s, program.tiles, &program.tensors, transfers);
                if in_part(s) {
                    summary.tensors.iter().for_each(|t| used[t.index()] = true);
                }
                if !shared[s] {
                    let paid = in_part(s);
                    exchange_code.each_paid(s, &summary, &program.tensors, |x| {
                        if paid {
                            tm[x.tile.index()].exchange_code += x.code;
                        }
                    });
                }
                let b = buffers.len() as u32;
                changes.push((s, Change::Buffer(b, 1)));
                changes.push((s + 2, Change::Buffer(b, -1)));
                // The summary's rows, shared (the receiving tiles are picked out where the
                // buffers are counted): a copy of each exchange's rows cost as much as the
                // rest of the walk.
                buffers.push(std::sync::Arc::clone(&summary.tiles));
            }
            Step::HostToDevice { tensor, .. }
            | Step::DeviceToHost { tensor, .. }
            | Step::LinkReceive { tensor, .. }
            | Step::Collective { tensor, .. }
            | Step::RemoteBuffer { tensor, .. } => {
                if in_part(s) {
                    used[tensor.index()] = true;
                }
            }
        }
    }
    StepWalk {
        codelets,
        buffers,
        used,
    }
}

/// Each tile's peak of not-always-live data and buffers over the part's steps, from the
/// `changes` sorted by step: (live + buffers, live, buffers, step) at the peak, and the peak
/// of interleaved data. The steps are swept in order with each tile's running total, and a
/// tile's peak is looked at after all of a step's changes to it: no per-tile lists of events
/// are kept.
#[allow(clippy::type_complexity)]
fn peaks(
    program: &Program,
    changes: &[(usize, Change)],
    buffers: &[std::sync::Arc<[ExchangeTile]>],
    part: Option<&[bool]>,
) -> (Vec<(i64, i64, i64, usize)>, Vec<i64>) {
    let tiles = program.tiles as usize;
    let (mut live, mut buf, mut il) = (vec![0i64; tiles], vec![0i64; tiles], vec![0i64; tiles]);
    let mut peak_il = vec![0i64; tiles];
    let mut best = vec![(0i64, 0i64, 0i64, 0usize); tiles];
    let mut touched = vec![false; tiles];
    let mut touched_list: Vec<usize> = Vec::new();
    for same in changes.chunk_by(|a, b| a.0 == b.0) {
        let step = same[0].0;
        for &(_, what) in same {
            let mut touch = |k: usize| {
                if !touched[k] {
                    touched[k] = true;
                    touched_list.push(k);
                }
            };
            match what {
                Change::Tensor(i, sign) => {
                    // Each tile's bytes, from the mapping's sums (made once, shared).
                    let t = &program.tensors[i as usize];
                    let eb = t.elem_bytes() as i64;
                    for &(tile, n) in t.mapping.tile_sums() {
                        let (k, bytes) = (tile.index(), n as i64 * eb);
                        live[k] += sign * bytes;
                        if t.interleaved {
                            il[k] += sign * bytes;
                        }
                        touch(k);
                    }
                }
                Change::Buffer(b, sign) => {
                    for x in buffers[b as usize].iter().filter(|x| x.receives) {
                        let k = x.tile.index();
                        buf[k] += sign * x.received as i64;
                        touch(k);
                    }
                }
                Change::Clone(c, sign) => {
                    let t = &program.tensors[program.call_clones[c as usize].0.index()];
                    let eb = t.elem_bytes() as i64;
                    for &(tile, n) in t.mapping.tile_sums() {
                        live[tile.index()] += sign * n as i64 * eb;
                        touch(tile.index());
                    }
                }
                Change::Probe => (0..tiles).for_each(&mut touch),
            }
        }
        let looked_at = step_in(part, step);
        for k in touched_list.drain(..) {
            touched[k] = false;
            if !looked_at {
                continue;
            }
            peak_il[k] = peak_il[k].max(il[k]);
            if live[k] + buf[k] > best[k].0 {
                best[k] = (live[k] + buf[k], live[k], buf[k], step);
            }
        }
    }
    (best, peak_il)
}

/// Checks the report against SRAM: the typed error names the fullest tile, how far over it
/// is, and the largest tensors and vertices on it.
pub fn check_fits(program: &Program, report: &MemoryReport) -> Result<(), Box<OutOfMemory>> {
    check_fits_with(program, &Summaries::default(), report)
}

/// [`check_fits`] of a program whose exchanges may be kept as summaries.
pub(crate) fn check_fits_with(
    program: &Program,
    summaries: &Summaries,
    report: &MemoryReport,
) -> Result<(), Box<OutOfMemory>> {
    let Some(worst) = report.over_limit() else {
        return Ok(());
    };
    let tile = worst.tile;
    let step = worst.peak_step;
    let mut tensors: Vec<(String, u64)> = Vec::new();
    for t in &program.tensors {
        let live = t.class == TensorClass::AlwaysLive || (t.live.0 <= step && step <= t.live.1);
        if !live {
            continue;
        }
        let n = t.mapping.elements_on(tile);
        if n > 0 {
            tensors.push((t.name.clone(), n * t.elem_bytes()));
        }
    }
    tensors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    tensors.truncate(5);
    let mut by_cs: HashMap<&str, u64> = HashMap::new();
    for step in &program.steps {
        if let Step::Compute(cs) = step {
            for v in cs.costs.iter().filter(|v| v.tile == tile) {
                *by_cs.entry(cs.name.as_str()).or_default() += v.state_bytes;
            }
        }
    }
    let mut vertices: Vec<(String, u64)> =
        by_cs.into_iter().map(|(n, b)| (n.to_string(), b)).collect();
    vertices.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    vertices.truncate(3);
    // Receive buffers live through their exchange and the compute set after it (`account`).
    let mut receiving: Vec<(String, u64)> = Vec::new();
    for s in step.saturating_sub(1)..=step {
        if let Some(Step::Exchange { node, transfers }) = program.steps.get(s) {
            let summary = summaries.of(s, program.tiles, &program.tensors, transfers);
            if let Some(x) = summary.tiles.iter().find(|x| x.tile == tile && x.receives) {
                receiving.push((program.node_names[node.index()].clone(), x.received));
            }
        }
    }
    receiving.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Err(Box::new(OutOfMemory {
        tile,
        needed: worst.total(),
        available: report.sram_bytes_per_tile,
        tiles_over: report
            .tiles
            .iter()
            .filter(|t| t.total() > report.sram_bytes_per_tile)
            .count(),
        largest_tensors: tensors,
        largest_vertices: vertices,
        receiving,
        memory: worst.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{Codelet, VertexType};
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use tessera_core::DType;

    /// One of 240 distinct codelets (more than three words of bits).
    fn codelet(k: u8) -> Codelet {
        let dtype = [DType::F32, DType::F16][usize::from(k % 2)];
        match k % 3 {
            0 => Codelet::Binary(VertexType::of(k / 6, dtype)),
            1 => Codelet::Unary(VertexType::of(k / 6, dtype)),
            _ => Codelet::Reduce(VertexType::of(k / 6, dtype)),
        }
    }

    proptest! {
        /// Each tile's code is that of the distinct codelets it runs, each counted once, as
        /// a set per tile gives it, whatever the order the vertices come in.
        #[test]
        fn tile_codelets_count_each_codelet_once(
            vertices in proptest::collection::vec((0usize..5, 0u8..240), 0..400)
        ) {
            let mut bits = TileCodelets::new(5);
            let mut sets = vec![BTreeSet::new(); 5];
            for &(tile, k) in &vertices {
                let c = codelet(k);
                let n = bits.number(c);
                bits.insert(tile, n);
                sets[tile].insert(c);
            }
            for (tile, set) in sets.iter().enumerate() {
                let expected: u64 = set.iter().map(|c| c.code_bytes()).sum();
                prop_assert_eq!(bits.code_bytes(tile), expected);
            }
        }
    }
}
