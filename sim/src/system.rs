//! Training and inference across IPUs: pipeline stages on their IPUs (sharding is a pipeline
//! run with the Sequential schedule), gradient accumulation, replication with a ring
//! all-reduce of gradients over the IPU-Links, optimizer-state offload, recomputation.
//!
//! Each IPU's share of the graph is lowered on its own (tensors crossing IPUs arrive over the
//! links); a stage's forward and backward cycles come from its IPU's program; the schedule's
//! timeline runs the M micro-batches of one weight update; the update itself runs on every
//! IPU at once, after the replicas' all-reduce.

mod conditional;
mod phases;
mod rows;
mod stash;
mod topology;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tessera_core::schedule::{AccumulationRule, Schedule, ScheduleError};
use tessera_core::{Plan, Storage};

use crate::estimate::{Cycles, SimError, TraceEvent};
use crate::lower::LowerOptions;
use crate::machine::IpuConfig;
use crate::memory::{OutOfMemory, PartMemory, TileMemory};
use crate::pipeline::{
    steady_cycles_per_micro_batch, timeline_concurrent, ElidedSteps, SlotRun, StageCost,
};
use crate::techniques::Techniques;
pub use conditional::{Conditional, ConditionalCost};
use phases::{all_reduce_cycles, cost_stages, lower_ipus, memory_reports, Run};
use rows::{ipu_rows, stage_rows};
use stash::stash;
pub use stash::stash_entries;
use topology::topology;
pub use topology::{loop_repeat, stage_positions};

/// The most IPUs one system holds: Graphcore's largest IPU-POD systems (the Bow Pod1024 of
/// 1,024 Bow IPUs; the GC200's largest was the IPU-POD256). Replicas times the IPUs of one
/// replica, and every IPU a device mapping names, must stay within it.
pub const MAX_SYSTEM_IPUS: usize = 1024;

/// The most times an on-device loop runs: Poplar's `program::Repeat` takes an `unsigned`
/// (32-bit) count, and the accumulation loop of a weight update and the repeat loop of an
/// execution are such loops.
pub const MAX_LOOP_COUNT: usize = u32::MAX as usize;

/// How a graph runs across IPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct SystemOptions {
    /// The pipeline schedule (with one stage, any schedule is plain training).
    pub schedule: Schedule,
    /// Stage -> IPU; `None` maps stage k to IPU k.
    pub device_mapping: Option<Vec<usize>>,
    /// Whose rule the accumulation count must meet: TensorFlow's (Keras-like models, the
    /// default) or PopART's (ONNX models, which PopART and PopTorch compile).
    pub accumulation_rule: AccumulationRule,
    /// Stage -> pipeline position; stages sharing a position are concurrent (they run side
    /// by side on different IPUs in the same slots). `None`: stage k at position k.
    pub stage_positions: Option<Vec<usize>>,
    /// Replicas of the whole pipeline, each with its own data.
    pub replicas: usize,
    /// Samples per micro-batch (per replica).
    pub micro_batch: u64,
    /// Micro-batches per weight update for inference pipelines (training uses the graph's
    /// accumulation count).
    pub inference_micro_batches: usize,
    /// The memory techniques (recomputation, offloading, the planner's options, replicated
    /// tensor sharding, outlining, serialization): see [`crate::techniques`].
    pub techniques: Techniques,
    /// The smallest chunk of a tensor a tile gets when the lowering spreads a tensor.
    pub min_chunk_bytes: u64,
    /// Produce the estimate even when a tile overflows.
    pub allow_out_of_memory: bool,
    /// Micro-batches per execution (Keras' `steps_per_execution`): a multiple of the
    /// accumulation count. Exclusive with `repeat_count`.
    pub steps_per_execution: Option<usize>,
    /// Weight updates per execution (the on-device loop's repeat count R).
    pub repeat_count: Option<usize>,
    /// Account every tile's memory (the fit, the categories, the stash). Without, the
    /// estimate is of cycles only: the IPU rows' memory figures are zero and `fits` is true
    /// (the cycle profile the automatic pipeline split balances on needs no more).
    pub memory: bool,
    /// Conditionals decided at run time (an ONNX `If`): memory holds both branches, cycles
    /// assume the dearer (see [`Conditional`]).
    pub conditionals: Vec<Conditional>,
}

impl Default for SystemOptions {
    fn default() -> Self {
        SystemOptions {
            schedule: Schedule::Grouped,
            device_mapping: None,
            stage_positions: None,
            accumulation_rule: AccumulationRule::TensorFlow,
            replicas: 1,
            micro_batch: 1,
            inference_micro_batches: 1,
            techniques: Techniques::default(),
            min_chunk_bytes: LowerOptions::default().min_chunk_bytes,
            allow_out_of_memory: false,
            steps_per_execution: None,
            repeat_count: None,
            memory: true,
            conditionals: Vec::new(),
        }
    }
}

/// Why a system configuration cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SystemError {
    /// The schedule, accumulation count and mapping do not fit together.
    #[error(transparent)]
    Schedule(ScheduleError),
    /// Two stages on different IPUs use the same variable.
    #[error("variable `{variable}` is used by stages {first} and {second}, which are on different IPUs; stages sharing a variable must share an IPU")]
    SharedVariable {
        /// The variable.
        variable: String,
        /// One stage using it.
        first: usize,
        /// Another stage, on another IPU.
        second: usize,
    },
    /// No replicas.
    #[error("the replica count must be at least 1")]
    NoReplicas,
    /// More IPUs than the largest system has.
    #[error("{replicas} replica(s) of {per_replica} IPU(s) need {} IPUs; the largest IPU-POD system has {MAX_SYSTEM_IPUS}", .replicas.saturating_mul(*.per_replica))]
    TooManyIpus {
        /// Replicas.
        replicas: usize,
        /// IPUs of one replica (a power of two, as IPUs are allocated).
        per_replica: usize,
    },
    /// A device mapping names an IPU beyond the largest system.
    #[error("the device mapping puts stage {stage} on IPU {ipu}; the largest IPU-POD system has IPUs 0 to {}", MAX_SYSTEM_IPUS - 1)]
    IpuOutOfRange {
        /// The stage.
        stage: usize,
        /// The IPU it names.
        ipu: usize,
    },
    /// An on-device loop longer than Poplar's repeat count holds.
    #[error("{what} {count} is more than an on-device loop runs (Poplar's repeat count is 32-bit: at most {MAX_LOOP_COUNT})")]
    LoopTooLong {
        /// Which loop (`gradient accumulation count`, `repeat count`, ...).
        what: &'static str,
        /// The count asked.
        count: usize,
    },
    /// A cycle or sample count beyond 64 bits.
    #[error("{what} overflows a 64-bit count")]
    Overflow {
        /// The count.
        what: &'static str,
    },
    /// Stage positions that leave a position empty, put concurrent stages on one IPU, or do not
    /// name every stage.
    #[error("pipeline stage positions: {detail}")]
    Positions {
        /// What is wrong.
        detail: String,
    },
    /// Pipelined or replicated training needs the weight update as its own phase.
    #[error("pipelined or replicated training needs gradient accumulation (differentiate_accumulating, any count)")]
    NotAccumulating,
    /// A node's stage comes before the stage of a node earlier in the graph: pipeline stages
    /// must follow the layers' order.
    #[error("`{node}` is in pipeline stage {stage} but follows nodes of stage {after}; stages must follow the order of the layers")]
    StagesOutOfOrder {
        /// The node.
        node: String,
        /// Its stage.
        stage: usize,
        /// The stage of the nodes before it.
        after: usize,
    },
    /// Per-stage options that do not fit the pipeline.
    #[error("{option}: {detail}")]
    StageOption {
        /// The option.
        option: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// Estimation failed.
    #[error(transparent)]
    Sim(SimError),
    /// `steps_per_execution` is not a positive multiple of the accumulation count, or disagrees
    /// with `repeat_count`.
    #[error("{}", steps_message(*steps, *accumulation, *repeat_count))]
    StepsPerExecution {
        /// Micro-batches per execution asked for.
        steps: usize,
        /// Micro-batches per weight update.
        accumulation: usize,
        /// The repeat count also given, if any.
        repeat_count: Option<usize>,
    },
}

fn steps_message(steps: usize, accumulation: usize, repeat_count: Option<usize>) -> String {
    match repeat_count {
        None => format!(
            "steps_per_execution {steps} must be a positive multiple of the gradient accumulation count {accumulation}"
        ),
        Some(r) => format!(
            "steps_per_execution {steps} disagrees with repeat count {r} x gradient accumulation count {accumulation}"
        ),
    }
}

/// One pipeline stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageRow {
    /// The stage.
    pub stage: usize,
    /// Its pipeline position (concurrent stages share one).
    pub position: usize,
    /// Its IPU.
    pub ipu: usize,
    /// Forward cycles per micro-batch.
    pub forward_cycles: u64,
    /// Backward cycles per micro-batch (recomputation included).
    pub backward_cycles: u64,
    /// Stash entries (micro-batches) the stage holds: the schedule's depth, one more under
    /// PopART's rule ([`stash_entries`]).
    pub stash_depth: usize,
    /// Bytes one stash entry holds.
    pub stash_entry_bytes: u64,
    /// Idle fraction of its IPU over the pipeline.
    pub idle_fraction: f64,
    /// Forward cycles per micro-batch by phase.
    pub forward_phases: Cycles,
    /// Backward cycles per micro-batch by phase (without recomputation).
    pub backward_phases: Cycles,
    /// The supersteps of one forward slot, starts from the slot's start.
    pub forward_trace: Vec<TraceEvent>,
    /// The supersteps of one backward slot, starts from the slot's start.
    pub backward_trace: Vec<TraceEvent>,
    /// Its own memory, when its IPU holds other stages too (TensorFlow's `device_mapping`):
    /// its steps' code, the variables they touch, each tile's peak over them and its stash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<PartMemory>,
}

/// One IPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IpuRow {
    /// The IPU (within one replica).
    pub ipu: usize,
    /// Its stages.
    pub stages: Vec<usize>,
    /// Cycles running its slots in one weight update's pipeline.
    pub busy_cycles: u64,
    /// Cycles waiting for other IPUs.
    pub idle_cycles: u64,
    /// Idle fraction.
    pub idle_fraction: f64,
    /// Cycles of its weight update.
    pub weight_update_cycles: u64,
    /// Bytes used (sum of its tiles' peaks, stash included).
    pub bytes_used: u64,
    /// The fullest tile's bytes.
    pub max_tile_bytes: u64,
    /// Tiles holding anything.
    pub tiles_used: usize,
    /// Stash bytes over its tiles.
    pub stash_bytes: u64,
    /// Bytes kept in streaming memory (offloaded optimizer state).
    pub streaming_memory_bytes: u64,
    /// The ten fullest tiles.
    pub fullest_tiles: Vec<TileMemory>,
    /// Bytes over all tiles by category.
    pub categories: TileMemory,
    /// Every tile's memory at its peak, tile order (empty without memory accounting).
    pub tiles: Vec<TileMemory>,
    /// The supersteps of its weight update, starts from the update's start.
    pub update_trace: Vec<TraceEvent>,
    /// Vertices of its program: every compute set's, a node lowered once and replayed for
    /// identical nodes counted each time.
    #[serde(default)]
    pub vertices: usize,
    /// The code each graph node adds on this IPU (indexed by graph node; zeros for nodes of
    /// other IPUs and without memory accounting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_code: Vec<crate::memory::NodeCode>,
}

/// The estimate of a multi-IPU run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SystemEstimate {
    /// Schedule.
    pub schedule: String,
    /// Pipeline stages.
    pub stages_count: usize,
    /// Micro-batches per weight update.
    pub accumulation: usize,
    /// Replicas.
    pub replicas: usize,
    /// IPUs in all (replicas x IPUs per replica rounded up to a power of two).
    pub ipus_total: usize,
    /// The system those IPUs need, on a machine with a pod network ([`crate::pod`]): one
    /// IPU-Machine, or the smallest IPU-POD or Bow Pod that holds them. `None` on PCIe cards.
    #[serde(default)]
    pub system: Option<String>,
    /// IPU-Link domains the IPUs span: collectives over more than one cross the gateways.
    #[serde(default = "one")]
    pub ipu_link_domains: usize,
    /// Whether every tile of every IPU fits (always true for an estimate made without memory
    /// accounting, [`SystemOptions::memory`] off).
    pub fits: bool,
    /// The worst out-of-memory tile, when one does not fit.
    pub out_of_memory: Option<OutOfMemory>,
    /// Cycles of the pipeline (all micro-batches of one update).
    pub pipeline_cycles: u64,
    /// Cycles of the weight update (slowest IPU).
    pub weight_update_cycles: u64,
    /// Cycles of the replicas' gradient all-reduce.
    pub all_reduce_cycles: u64,
    /// Cycles per weight update: pipeline + all-reduce + update.
    pub cycles_per_weight_update: u64,
    /// Seconds per weight update.
    pub seconds_per_weight_update: f64,
    /// Samples per weight update over all replicas.
    pub samples_per_weight_update: u64,
    /// Samples per second.
    pub samples_per_second: f64,
    /// Cycles each micro-batch adds to the pipeline once it is full
    /// ([`crate::pipeline::steady_cycles_per_micro_batch`]): `pipeline_cycles` is M times this
    /// plus the pipeline's ramp (its fill and drain).
    #[serde(default)]
    pub steady_cycles_per_micro_batch: f64,
    /// Samples per second at steady state: the limit as M grows, where the ramp, the
    /// all-reduce and the weight update spread over ever more micro-batches.
    #[serde(default)]
    pub steady_samples_per_second: f64,
    /// Weight updates per execution of the on-device loop (R).
    pub repeat_count: usize,
    /// Micro-batches per execution (K = R x M).
    pub steps_per_execution: usize,
    /// Cycles per execution: R weight updates without returning to the host.
    pub cycles_per_execution: u64,
    /// Per stage.
    pub stages: Vec<StageRow>,
    /// Per IPU of one replica.
    pub ipus: Vec<IpuRow>,
    /// Every stage execution on the timeline, but for the steady-state steps of `elided`.
    pub runs: Vec<SlotRun>,
    /// Identical steady-state pipeline steps counted but not listed in `runs`.
    #[serde(default)]
    pub elided: Option<ElidedSteps>,
    /// The branch the cycles assume of each conditional decided at run time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditionals: Vec<ConditionalCost>,
}

/// [`SystemEstimate::ipu_link_domains`] of a report written without it.
fn one() -> usize {
    1
}

/// Estimates `plan` across IPUs of `cfg`, as `opts` says, in phases: the options are checked
/// (`check_system_options`), the stages placed on IPUs and in the schedule (`topology`),
/// each IPU's share lowered (`lower_ipus`) and costed by stage (`cost_stages`), the stash
/// sized (`stash`), the stages run on the timeline, each IPU's memory accounted
/// (`memory_reports`), the replicas' all-reduce costed (`all_reduce_cycles`), and the rows
/// made per IPU (`ipu_rows`) and per stage (`stage_rows`).
pub fn estimate_system<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
) -> Result<SystemEstimate, SystemError>
where
    Plan<S>: Sync,
    tessera_core::Graph<S>: Sync,
{
    check_system_options(cfg, opts)?;
    let t = topology(plan, opts)?;
    let lowered = lower_ipus(plan, cfg, opts, &t)?;
    let run = Run {
        plan,
        cfg,
        opts,
        t: &t,
        programs: lowered.iter().map(|l| &l.0).collect(),
        summaries: lowered.iter().map(|l| &l.1).collect(),
    };
    let mut costs = cost_stages(&run);
    let stash = stash(&run, &mut costs)?;
    let sync = cfg.sync_cycles + cfg.inter_ipu_sync_cycles(t.ipus);
    let placements: Vec<Vec<(usize, usize, StageCost)>> = (0..t.count)
        .map(|p| {
            (0..t.s)
                .filter(|&k| t.positions[k] == p)
                .map(|k| (k, t.mapping[k], costs.stages[k]))
                .collect()
        })
        .collect();
    let tl = timeline_concurrent(&t.pipeline, &placements, sync);
    let steady = steady_cycles_per_micro_batch(&t.pipeline, &placements, sync);
    // The code each node's steps hold, from a walk of its own over each IPU's steps, found
    // beside the memory's.
    let (memory, mut node_code) = rayon::join(
        || memory_reports(&run, &stash),
        || -> Vec<Vec<crate::memory::NodeCode>> {
            run.programs
                .par_iter()
                .zip(&run.summaries)
                .map(|(p, x)| {
                    if opts.memory {
                        crate::memory::node_code(p, x)
                    } else {
                        Vec::new()
                    }
                })
                .collect()
        },
    );
    let all_reduce = all_reduce_cycles(&run);
    let weight_update = if t.training {
        costs.update.iter().map(Cycles::total).max().unwrap_or(0) + sync
    } else {
        0
    };
    let overflow = |what| SystemError::Overflow { what };
    let total = tl
        .cycles
        .checked_add(all_reduce)
        .and_then(|c| c.checked_add(weight_update))
        .filter(|&c| c < u64::MAX)
        .ok_or(overflow("the cycles of one weight update"))?;
    let cycles_per_execution = total
        .checked_mul(t.repeat as u64)
        .ok_or(overflow("the cycles of one execution"))?;
    let seconds = cfg.cycles_to_seconds(total);
    let samples = opts
        .micro_batch
        .checked_mul(t.m as u64)
        .and_then(|x| x.checked_mul(opts.replicas as u64))
        .ok_or(overflow("the samples of one weight update"))?;
    let (ipu_rows, worst) = ipu_rows(&run, &tl, &memory, &mut costs, &mut node_code);
    let fits = ipu_rows
        .iter()
        .all(|r| r.max_tile_bytes <= cfg.sram_bytes_per_tile);
    if !fits && !opts.allow_out_of_memory {
        if let Some(w) = worst {
            return Err(SystemError::Sim(SimError::OutOfMemory(Box::new(w))));
        }
    }
    let conditionals = std::mem::take(&mut costs.conditionals);
    let stages = stage_rows(&run, &tl, &stash, costs);
    let ipus_total = opts.replicas.saturating_mul(t.ipus.next_power_of_two());
    Ok(SystemEstimate {
        schedule: opts.schedule.name().to_string(),
        stages_count: t.s,
        accumulation: t.m,
        replicas: opts.replicas,
        ipus_total,
        system: cfg.pod.as_ref().map(|p| p.system_name(ipus_total)),
        ipu_link_domains: cfg.pod.as_ref().map_or(1, |p| p.domains(ipus_total)),
        fits,
        out_of_memory: if fits { None } else { worst },
        pipeline_cycles: tl.cycles,
        weight_update_cycles: weight_update,
        all_reduce_cycles: all_reduce,
        cycles_per_weight_update: total,
        seconds_per_weight_update: seconds,
        samples_per_weight_update: samples,
        samples_per_second: if seconds > 0.0 {
            samples as f64 / seconds
        } else {
            0.0
        },
        steady_cycles_per_micro_batch: steady,
        steady_samples_per_second: steady_throughput(cfg, opts, steady),
        repeat_count: t.repeat,
        steps_per_execution: t.repeat * t.m,
        cycles_per_execution,
        stages,
        ipus: ipu_rows,
        runs: tl.runs,
        elided: tl.elided,
        conditionals,
    })
}

/// Samples per second at steady state: a micro-batch on every replica each `steady` cycles.
fn steady_throughput(cfg: &IpuConfig, opts: &SystemOptions, steady: f64) -> f64 {
    if steady > 0.0 {
        opts.micro_batch as f64 * opts.replicas as f64 * cfg.clock_hz / steady
    } else {
        0.0
    }
}

/// The machine and the counts of the options, checked before any work.
fn check_system_options(cfg: &IpuConfig, opts: &SystemOptions) -> Result<(), SystemError> {
    cfg.validate()
        .map_err(|e| SystemError::Sim(SimError::Machine(e)))?;
    if opts.replicas == 0 {
        return Err(SystemError::NoReplicas);
    }
    if let Some(mapping) = &opts.device_mapping {
        if let Some((stage, &ipu)) = mapping
            .iter()
            .enumerate()
            .find(|&(_, &d)| d >= MAX_SYSTEM_IPUS)
        {
            return Err(SystemError::IpuOutOfRange { stage, ipu });
        }
    }
    for (what, count) in [
        ("repeat count", opts.repeat_count),
        ("steps per execution", opts.steps_per_execution),
        (
            "inference micro-batch count",
            Some(opts.inference_micro_batches),
        ),
    ] {
        if let Some(count) = count.filter(|&c| c > MAX_LOOP_COUNT) {
            return Err(SystemError::LoopTooLong { what, count });
        }
    }
    Ok(())
}
