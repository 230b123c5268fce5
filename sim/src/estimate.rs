//! The estimate of a lowered program: memory per tile and category, cycles per step by phase,
//! time and throughput, and a trace of every superstep for the host to draw.

use serde::{Deserialize, Serialize};
use tessera_core::{Plan, Storage};

use crate::check::{check, CheckError};
use crate::cost;
use crate::exchange::Summaries;
use crate::lower::{lower, LowerOptions};
use crate::machine::{IpuConfig, MachineError};
use crate::memory::{account_with, check_fits_with, MemoryReport, OutOfMemory, TileMemory};
use crate::program::{Program, Step};

/// Cycles of one step, by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cycles {
    /// Compute phases: each the slowest tile's vertices plus supervisor overhead.
    pub compute: u64,
    /// Exchange phases: each the busiest tile's received bytes at the exchange rate, plus the
    /// fixed overhead.
    pub exchange: u64,
    /// Syncs, one per superstep.
    pub sync: u64,
    /// Host streams (infeeds and outfeeds) at the host link's bandwidth.
    pub host_streams: u64,
    /// Remote-buffer copies to and from streaming memory.
    pub remote_buffers: u64,
}

impl Cycles {
    /// All phases.
    pub fn total(&self) -> u64 {
        self.compute + self.exchange + self.sync + self.host_streams + self.remote_buffers
    }
}

/// The kind of a trace event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// A compute phase.
    Compute,
    /// An exchange phase.
    Exchange,
    /// A sync.
    Sync,
    /// Data from the host.
    HostToDevice,
    /// Data to the host.
    DeviceToHost,
    /// A remote-buffer copy.
    RemoteBuffer,
}

/// One phase of one superstep, for a timeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// Superstep index within the step.
    pub superstep: usize,
    /// The phase.
    pub phase: Phase,
    /// The IPU.
    pub ipu: usize,
    /// First and last tile taking part.
    pub tiles: (u32, u32),
    /// Cycle at which it starts, from the start of the step.
    pub start: u64,
    /// Its length in cycles.
    pub cycles: u64,
    /// The op (graph node) that caused it.
    pub op: String,
}

/// One IPU's memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpuMemory {
    /// The IPU.
    pub ipu: usize,
    /// Bytes used: the sum of every tile's peak.
    pub bytes_used: u64,
    /// SRAM of the whole IPU.
    pub bytes_available: u64,
    /// The fullest tile's peak.
    pub max_tile_bytes: u64,
    /// Tiles holding any tensor or vertex.
    pub tiles_used: usize,
    /// Totals by category (sums over tiles of each tile's peak; `tile` and `peak_step` are 0).
    pub categories: TileMemory,
    /// The ten fullest tiles, fullest first.
    pub fullest_tiles: Vec<TileMemory>,
    /// Every tile.
    pub tiles: Vec<TileMemory>,
}

/// The estimate of one step of a program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The machine.
    pub machine: IpuConfig,
    /// Whether every tile fits in its SRAM.
    pub fits: bool,
    /// The out-of-memory explanation, when it does not fit.
    pub out_of_memory: Option<OutOfMemory>,
    /// Cycles per step by phase.
    pub cycles: Cycles,
    /// Total cycles per step.
    pub cycles_per_step: u64,
    /// Bytes moved between tiles per step (a broadcast counted once).
    pub exchanged_bytes: u64,
    /// Seconds per step at the clock.
    pub seconds_per_step: f64,
    /// Samples per step.
    pub batch_size: u64,
    /// Samples per second.
    pub samples_per_second: f64,
    /// Vertices in the program.
    pub vertices: usize,
    /// Compute sets in the program.
    pub compute_sets: usize,
    /// Memory per IPU.
    pub ipus: Vec<IpuMemory>,
    /// Every phase of every superstep.
    pub trace: Vec<TraceEvent>,
}

/// Why a graph cannot be estimated or run on a machine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The machine description is invalid.
    #[error("invalid machine")]
    Machine(#[source] MachineError),
    /// The lowered program failed the checker (a bug in the lowering, reported not hidden).
    #[error("invalid program (a bug in the lowering)")]
    Check(#[source] CheckError),
    /// The program does not fit.
    #[error(transparent)]
    OutOfMemory(Box<OutOfMemory>),
    /// The core refused to run the plan.
    #[error("run failed")]
    Run(#[source] tessera_core::RunError),
}

/// What to estimate of one plan on one IPU (the system estimate across IPUs takes
/// [`crate::system::SystemOptions`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpuEstimateOptions {
    /// Samples per step (for samples per second).
    pub batch_size: u64,
    /// Only the forward pass (an inference step of a training plan).
    pub inference: bool,
    /// Produce the estimate even when it does not fit (as the IPU Model does), instead of the
    /// out-of-memory error.
    pub allow_out_of_memory: bool,
    /// Run the checker on the lowered program (on by default). The lowering's programs pass it
    /// by construction (the property tests say so); sweeps over many configurations may turn
    /// it off for speed.
    pub verify: bool,
    /// Lowering knobs.
    pub lower: LowerOptions,
}

impl Default for IpuEstimateOptions {
    fn default() -> Self {
        IpuEstimateOptions {
            batch_size: 1,
            inference: false,
            allow_out_of_memory: false,
            verify: true,
            lower: LowerOptions::default(),
        }
    }
}

/// Cycles of the steps `steps` of `program`, the bytes their exchanges move between tiles
/// (a broadcast counted once), and a trace.
pub fn cost_steps(
    program: &Program,
    cfg: &IpuConfig,
    steps: std::ops::Range<usize>,
) -> (Cycles, u64, Vec<TraceEvent>) {
    cost_steps_with(program, &Summaries::default(), cfg, steps)
}

/// [`cost_steps`] of a program whose exchanges may be kept as summaries.
pub(crate) fn cost_steps_with(
    program: &Program,
    summaries: &Summaries,
    cfg: &IpuConfig,
    steps: std::ops::Range<usize>,
) -> (Cycles, u64, Vec<TraceEvent>) {
    let mut c = Cycles::default();
    let mut tr = Tracer::default();
    let host_bytes_per_cycle = cfg.host_link_bytes_per_second_per_direction / cfg.clock_hz;
    let mut per_tile = vec![0u64; program.tiles as usize];
    let mut c_bytes = 0u64;
    let first = steps.start;
    for (index, step) in program.steps[steps].iter().enumerate() {
        match step {
            Step::Exchange { node, transfers } => {
                // Each tile receives, and sends, at the exchange rate: the phase lasts as long
                // as the busiest tile's larger direction. A region sent to several tiles is a
                // broadcast, sent once.
                let s = summaries.of(first + index, program.tiles, &program.tensors, transfers);
                c_bytes += s.bytes;
                let x = cost::exchange_cycles(cfg, s.busiest, false);
                c.exchange += x;
                let op = &program.node_names[node.index()];
                tr.push(Phase::Exchange, s.tiles_range, x, op);
            }
            Step::Compute(cs) => {
                per_tile.iter_mut().for_each(|x| *x = 0);
                let (mut lo, mut hi) = (u32::MAX, 0);
                for v in cs.costs.iter() {
                    per_tile[v.tile.index()] += v.cycles;
                    lo = lo.min(v.tile.0);
                    hi = hi.max(v.tile.0);
                }
                let slowest = per_tile.iter().copied().max().unwrap_or(0)
                    + cost::compute_set_overhead_cycles(cfg);
                let op = &program.node_names[cs.node.index()];
                let all = (0, program.tiles - 1);
                tr.push(Phase::Sync, all, cfg.sync_cycles, op);
                tr.push(Phase::Compute, (lo, hi), slowest, op);
                c.sync += cfg.sync_cycles;
                c.compute += slowest;
                tr.superstep += 1;
            }
            Step::LinkReceive { tensor, bytes } | Step::RemoteBuffer { tensor, bytes, .. } => {
                let remote = matches!(step, Step::RemoteBuffer { .. });
                let per_cycle = if remote {
                    cfg.streaming_memory_bytes_per_cycle()
                } else {
                    cfg.neighbour_link_bytes_per_cycle()
                };
                let x = (*bytes as f64 / per_cycle).ceil() as u64 + cfg.exchange_overhead_cycles;
                let t = &program.tensors[tensor.index()];
                if remote {
                    c.remote_buffers += x;
                    tr.push(Phase::RemoteBuffer, tile_span(t), x, &t.name);
                } else {
                    c.exchange += x;
                    tr.push(Phase::Exchange, tile_span(t), x, &t.name);
                }
            }
            Step::Collective {
                tensor,
                bytes,
                group,
                partition_ipus,
            } => {
                let (group, ipus) = (*group as usize, *partition_ipus as usize);
                let (moving, sync) =
                    crate::collective::group_all_reduce_parts(cfg, *bytes, group, ipus);
                let t = &program.tensors[tensor.index()];
                c.exchange += moving;
                c.sync += sync;
                tr.push(Phase::Sync, tile_span(t), sync, &t.name);
                tr.push(Phase::Exchange, tile_span(t), moving, &t.name);
            }
            Step::HostToDevice { tensor, bytes } | Step::DeviceToHost { tensor, bytes } => {
                let x = (*bytes as f64 / host_bytes_per_cycle).ceil() as u64 + cfg.sync_cycles;
                c.host_streams += x;
                let phase = if matches!(step, Step::HostToDevice { .. }) {
                    Phase::HostToDevice
                } else {
                    Phase::DeviceToHost
                };
                let t = &program.tensors[tensor.index()];
                tr.push(phase, tile_span(t), x, &t.name);
            }
        }
    }
    (c, c_bytes, tr.trace)
}

/// The first and last tiles a tensor is mapped to.
fn tile_span(t: &crate::program::ProgTensor) -> (u32, u32) {
    t.mapping
        .intervals()
        .iter()
        .fold((u32::MAX, 0), |(l, h), iv| {
            (l.min(iv.tile.0), h.max(iv.tile.0))
        })
}

/// A trace being written: the phases one after another on one clock, each in the superstep
/// it belongs to.
#[derive(Default)]
struct Tracer {
    trace: Vec<TraceEvent>,
    clock: u64,
    superstep: usize,
}

impl Tracer {
    /// A phase of `cycles` on `tiles`, for op `op`, starting where the last ended.
    fn push(&mut self, phase: Phase, tiles: (u32, u32), cycles: u64, op: &str) {
        self.trace.push(TraceEvent {
            superstep: self.superstep,
            phase,
            ipu: 0,
            tiles,
            start: self.clock,
            cycles,
            op: op.to_string(),
        });
        self.clock += cycles;
    }
}

fn ipu_memory(report: &MemoryReport, cfg: &IpuConfig) -> IpuMemory {
    let cat = TileMemory::sum(&report.tiles);
    IpuMemory {
        ipu: 0,
        bytes_used: report.total_bytes(),
        bytes_available: cfg.total_sram_bytes(),
        max_tile_bytes: report
            .tiles
            .iter()
            .map(TileMemory::total)
            .max()
            .unwrap_or(0),
        tiles_used: report.tiles_used(),
        categories: cat,
        fullest_tiles: report.fullest(10).into_iter().cloned().collect(),
        tiles: report.tiles.clone(),
    }
}

/// Estimates a lowered program.
pub fn estimate_program(
    program: &Program,
    cfg: &IpuConfig,
    opts: &IpuEstimateOptions,
) -> Result<Estimate, SimError> {
    estimate_program_with(program, &Summaries::default(), cfg, opts)
}

/// [`estimate_program`] of a program whose exchanges may be kept as summaries.
fn estimate_program_with(
    program: &Program,
    summaries: &Summaries,
    cfg: &IpuConfig,
    opts: &IpuEstimateOptions,
) -> Result<Estimate, SimError> {
    let report = account_with(program, summaries, cfg);
    let oom = check_fits_with(program, summaries, &report).err();
    if let (Some(e), false) = (&oom, opts.allow_out_of_memory) {
        return Err(SimError::OutOfMemory(e.clone()));
    }
    let end = if opts.inference {
        program
            .node_steps
            .get(program.forward_nodes.saturating_sub(1))
            .map_or(0, |r| r.1)
    } else {
        program.steps.len()
    };
    let (cycles, exchanged_bytes, trace) = cost_steps_with(program, summaries, cfg, 0..end);
    let total = cycles.total();
    let seconds = cfg.cycles_to_seconds(total);
    Ok(Estimate {
        machine: cfg.clone(),
        fits: oom.is_none(),
        out_of_memory: oom.map(|b| *b),
        cycles,
        cycles_per_step: total,
        exchanged_bytes,
        seconds_per_step: seconds,
        batch_size: opts.batch_size,
        samples_per_second: if seconds > 0.0 {
            opts.batch_size as f64 / seconds
        } else {
            0.0
        },
        vertices: program.vertex_count(),
        compute_sets: program
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Compute(_)))
            .count(),
        ipus: vec![ipu_memory(&report, cfg)],
        trace,
    })
}

/// Lowers, checks and estimates `plan` on one IPU, without computing any numerics (the path
/// for models too big to execute here).
pub fn estimate<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &IpuEstimateOptions,
) -> Result<(Program, Estimate), SimError>
where
    Plan<S>: Sync,
    tessera_core::Graph<S>: Sync,
{
    cfg.validate().map_err(SimError::Machine)?;
    let program = lower(plan, cfg, opts.lower);
    if opts.verify {
        check(&program).map_err(SimError::Check)?;
    }
    let e = estimate_program(&program, cfg, opts)?;
    Ok((program, e))
}

/// The estimate of `plan` on one IPU without the program: lowering keeps only the summaries of
/// its exchanges (what the estimate needs), not their transfers, and the program is not
/// checked (`opts.verify` is ignored). Equal to [`estimate`]'s estimate; the path for sweeps.
///
/// # Errors
///
/// As [`estimate`], less [`SimError::Check`].
pub fn estimate_only<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &IpuEstimateOptions,
) -> Result<Estimate, SimError>
where
    Plan<S>: Sync,
    tessera_core::Graph<S>: Sync,
{
    cfg.validate().map_err(SimError::Machine)?;
    let (program, summaries) =
        crate::lower::lower_with(plan, cfg, opts.lower, &|_| true, true, None);
    estimate_program_with(&program, &summaries, cfg, opts)
}
