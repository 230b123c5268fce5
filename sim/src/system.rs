//! Training and inference across IPUs: pipeline stages on their IPUs (sharding is a pipeline
//! run with the Sequential schedule), gradient accumulation, replication with a ring
//! all-reduce of gradients over the IPU-Links, optimizer-state offload, recomputation.
//!
//! Each IPU's share of the graph is lowered on its own (tensors crossing IPUs arrive over the
//! links); a stage's forward and backward cycles come from its IPU's program; the schedule's
//! timeline runs the M micro-batches of one weight update; the update itself runs on every
//! IPU at once, after the replicas' all-reduce.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tessera_core::schedule::{AccumulationRule, Pipeline, Schedule, ScheduleError};
use tessera_core::{Op, Plan, Roles, Storage};

use crate::estimate::{cost_steps_with, Cycles, SimError, TraceEvent};
use crate::exchange::Summaries;
use crate::lower::{lower_with, LowerOptions};
use crate::machine::IpuConfig;
use crate::memory::{
    account_part, account_with, MemoryReport, OutOfMemory, PartMemory, TileMemory,
};
use crate::pipeline::{timeline_concurrent, ElidedSteps, SlotRun, StageCost};
use crate::program::{Program, TensorClass};
use crate::techniques::{MemoryProportion, Techniques};

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
}

/// The tensors each stage stashes for its backward pass, as (stage, tensor) pairs: what its
/// backward reads of the forward pass or, recomputing, of its inputs (a view's root, which is
/// what is stashed).
fn stashed_tensors<S: Storage>(plan: &Plan<S>, recompute: bool) -> Vec<(usize, usize)> {
    let g = plan.graph();
    let s = g.stage_count();
    let forward_len = g.forward_len();
    // Per stage and tensor (root): whether the stage's nodes read it, and whether its
    // backward nodes do (updates aside).
    let mut read = vec![vec![(false, false); g.len()]; s];
    for (c, n) in g.nodes().iter().enumerate() {
        if n.roles().contains(Roles::UPDATE) {
            continue;
        }
        for &o in n.op().operands().as_slice() {
            let r = &mut read[n.stage()][plan.storage_of(o).index()];
            r.0 = true;
            r.1 |= c >= forward_len;
        }
    }
    let mut out = Vec::new();
    for (t, node) in g.nodes()[..forward_len].iter().enumerate() {
        if node.op().is_state() || node.op().is_update() || plan.slots()[t].view_of.is_some() {
            continue;
        }
        for (k, read) in read.iter().enumerate() {
            let stage_input = node.stage() != k || matches!(node.op(), Op::Input);
            let keep = if recompute {
                stage_input && read[t].0
            } else {
                read[t].1
            };
            if keep {
                out.push((k, t));
            }
        }
    }
    out
}

/// The bytes `depth` stashed copies of `tensor` take on each of its tiles (tile index, bytes).
fn stash_per_tile(
    tensor: &crate::program::ProgTensor,
    depth: u64,
) -> impl Iterator<Item = (usize, u64)> + '_ {
    let eb = tensor.elem_bytes();
    tensor
        .mapping
        .elements_per_tile()
        .into_iter()
        .map(move |(tile, n)| (tile.index(), depth * n * eb))
}

fn add(a: &mut Cycles, b: &Cycles) {
    a.compute += b.compute;
    a.exchange += b.exchange;
    a.sync += b.sync;
    a.host_streams += b.host_streams;
    a.remote_buffers += b.remote_buffers;
}

/// The lowering options of the whole system (a proportion given per stage leaves Poplar's
/// default here; each IPU's own are [`ipu_lower_options`]).
fn system_lower_options(opts: &SystemOptions) -> LowerOptions {
    let proportion = match &opts.techniques.available_memory_proportion {
        MemoryProportion::All(p) => *p,
        MemoryProportion::PerStage(_) => crate::planner::AVAILABLE_MEMORY_PROPORTION,
    };
    LowerOptions {
        min_chunk_bytes: opts.min_chunk_bytes,
        ..opts.techniques.lower_options(opts.replicas, proportion)
    }
}

/// Each IPU's lowering options: the system's, with the planner's proportion of the first
/// stage on the IPU.
fn ipu_lower_options(
    opts: &SystemOptions,
    mapping: &[usize],
    ipus: usize,
) -> Result<Vec<LowerOptions>, SystemError> {
    let proportions = opts
        .techniques
        .available_memory_proportion
        .per_ipu(mapping, ipus)
        .map_err(|detail| SystemError::StageOption {
            option: "available memory proportion",
            detail,
        })?;
    let base = system_lower_options(opts);
    Ok(proportions
        .into_iter()
        .map(|p| LowerOptions {
            plan: crate::planner::PlanOptions {
                available_memory_proportion: p,
                ..base.plan
            },
            ..base
        })
        .collect())
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
    let programs: Vec<&Program> = lowered.iter().map(|l| &l.0).collect();
    let summaries: Vec<&Summaries> = lowered.iter().map(|l| &l.1).collect();
    let mut costs = cost_stages(plan, cfg, opts, &t, &programs, &summaries);
    let stash = stash(plan, cfg, opts, &t, &mut costs)?;
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
    // The code each node's steps hold, from a walk of its own over each IPU's steps, found
    // beside the memory's.
    let (memory, mut node_code) = rayon::join(
        || memory_reports(plan, cfg, opts, &t, &programs, &summaries, &stash),
        || -> Vec<Vec<crate::memory::NodeCode>> {
            programs
                .par_iter()
                .zip(&summaries)
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
    let all_reduce = all_reduce_cycles(plan, cfg, opts, &t, &programs, sync);
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
    let (ipu_rows, worst) = ipu_rows(
        plan,
        cfg,
        opts,
        &t,
        &programs,
        &summaries,
        &tl,
        &memory,
        &mut costs,
        &mut node_code,
    );
    let fits = ipu_rows
        .iter()
        .all(|r| r.max_tile_bytes <= cfg.sram_bytes_per_tile);
    if !fits && !opts.allow_out_of_memory {
        if let Some(w) = worst {
            return Err(SystemError::Sim(SimError::OutOfMemory(Box::new(w))));
        }
    }
    let stages = stage_rows(
        plan, cfg, opts, &t, &programs, &summaries, &tl, &stash, costs,
    );
    Ok(SystemEstimate {
        schedule: opts.schedule.name().to_string(),
        stages_count: t.s,
        accumulation: t.m,
        replicas: opts.replicas,
        ipus_total: opts.replicas * t.ipus.next_power_of_two(),
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
        repeat_count: t.repeat,
        steps_per_execution: t.repeat * t.m,
        cycles_per_execution,
        stages,
        ipus: ipu_rows,
        runs: tl.runs,
        elided: tl.elided,
    })
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

/// Where the stages run: their IPUs and schedule positions, the schedule, its micro-batches
/// and loop, and each stage's stash entries.
struct Topology {
    /// Whether the graph trains.
    training: bool,
    /// Pipeline stages.
    s: usize,
    /// Micro-batches per weight update (M; inference: per execution).
    m: usize,
    /// Each stage's IPU.
    mapping: Vec<usize>,
    /// Each stage's position in the schedule.
    positions: Vec<usize>,
    /// Positions in the schedule.
    count: usize,
    /// The schedule.
    pipeline: Pipeline,
    /// Weight updates per execution (R).
    repeat: usize,
    /// Each stage's stash entries, under the accumulation rule.
    entries: Vec<usize>,
    /// IPUs of one replica.
    ipus: usize,
}

/// The stages' places: IPUs, schedule positions and stash entries, checked (a variable's
/// users share an IPU; the replicas' IPUs fit the system).
fn topology<S: Storage>(plan: &Plan<S>, opts: &SystemOptions) -> Result<Topology, SystemError> {
    let g = plan.graph();
    let training = g.is_training();
    let s = g.stage_count();
    let m = if training {
        g.accumulation_count() as usize
    } else {
        opts.inference_micro_batches
    };
    let mapping: Vec<usize> = opts
        .device_mapping
        .clone()
        .unwrap_or_else(|| (0..s).collect());
    let positions = stage_positions(
        opts.stage_positions.as_deref(),
        &mapping,
        s,
        opts.schedule,
        training,
    )?;
    let count = positions.iter().copied().max().unwrap_or(0) + 1;
    let pipeline = Pipeline::with_rule(count, m, opts.schedule, training, opts.accumulation_rule)
        .map_err(SystemError::Schedule)?;
    let repeat = loop_repeat(opts.steps_per_execution, opts.repeat_count, m)?;
    // Each stage's stash entries, under the accumulation rule's framework.
    let entries: Vec<usize> = (0..s)
        .map(|k| stash_entries(&pipeline, positions[k], opts.accumulation_rule))
        .collect();
    if opts.stage_positions.is_none() {
        pipeline
            .check_mapping(&mapping)
            .map_err(SystemError::Schedule)?;
    }
    // Stages sharing a variable must share an IPU.
    for (i, n) in g.nodes().iter().enumerate() {
        if !n.roles().contains(Roles::TRAINABLE) {
            continue;
        }
        let users: Vec<usize> = g.nodes()[..g.forward_len()]
            .iter()
            .filter(|c| c.op().operands().as_slice().iter().any(|o| o.index() == i))
            .map(|c| c.stage())
            .collect();
        for &a in &users {
            for &b in &users {
                if mapping[a] != mapping[b] {
                    return Err(SystemError::SharedVariable {
                        variable: n.name().to_string(),
                        first: a.min(b),
                        second: a.max(b),
                    });
                }
            }
        }
    }
    let ipus = mapping.iter().copied().max().unwrap_or(0) + 1;
    if opts
        .replicas
        .checked_mul(ipus.next_power_of_two())
        .is_none_or(|n| n > MAX_SYSTEM_IPUS)
    {
        return Err(SystemError::TooManyIpus {
            replicas: opts.replicas,
            per_replica: ipus.next_power_of_two(),
        });
    }
    Ok(Topology {
        training,
        s,
        m,
        mapping,
        positions,
        count,
        pipeline,
        repeat,
        entries,
        ipus,
    })
}

/// Each IPU's share of the plan, lowered with what the estimate needs of its exchanges.
fn lower_ipus<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
    t: &Topology,
) -> Result<Vec<crate::cache::Lowered>, SystemError>
where
    Plan<S>: Sync,
    tessera_core::Graph<S>: Sync,
{
    let (ipus, s, mapping) = (t.ipus, t.s, &t.mapping);
    let lower_options = ipu_lower_options(opts, mapping, ipus)?;
    // The IPUs are independent, so they are lowered in parallel, the last first: it holds
    // the loss and, in a language model, the output head, whose nodes no other IPU's
    // lowering shares, so it tends to take longest (the results do not depend on the
    // order). With the lowering cache on (sweeps), an IPU's program lowered before is
    // reused.
    let fingerprint = crate::cache::enabled().then(|| crate::cache::plan_fingerprint(plan));
    // The layouts copies of other IPUs' tensors keep, made once for all the IPUs that lower.
    let layouts = std::sync::OnceLock::new();
    let mut lowered: Vec<crate::cache::Lowered> = (0..ipus)
        .into_par_iter()
        .rev()
        .map(|d| {
            let lower = || {
                lower_with(
                    plan,
                    cfg,
                    lower_options[d],
                    &|i| mapping[plan.graph().nodes()[i].stage()] == d,
                    true,
                    (ipus > 1).then(|| {
                        std::sync::Arc::clone(layouts.get_or_init(|| {
                            crate::lower::whole_graph_layouts(plan, cfg, system_lower_options(opts))
                        }))
                    }),
                )
            };
            match fingerprint {
                Some(f) => {
                    let stages: Vec<usize> = (0..s).filter(|&k| mapping[k] == d).collect();
                    let key = crate::cache::key(f, &stages, cfg, lower_options[d]);
                    crate::cache::get_or_lower(key, lower)
                }
                None => std::sync::Arc::new(lower()),
            }
        })
        .collect();
    lowered.reverse();
    Ok(lowered)
}

/// Cycles by stage and pass, with their phases and traces, and each IPU's weight update.
struct Costs {
    /// Each stage's forward and backward cycles per micro-batch.
    stages: Vec<StageCost>,
    /// Each stage's (forward, backward) cycles by phase.
    phases: Vec<(Cycles, Cycles)>,
    /// Each stage's (forward, backward) trace.
    traces: Vec<(Vec<TraceEvent>, Vec<TraceEvent>)>,
    /// Each IPU's weight-update cycles.
    update: Vec<Cycles>,
    /// Each IPU's weight-update trace.
    update_traces: Vec<Vec<TraceEvent>>,
}

/// Every node's steps costed into its stage's forward or backward pass, or its IPU's weight
/// update; recomputation adds the forward pass to the backward one.
fn cost_stages<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
    t: &Topology,
    programs: &[&Program],
    summaries: &[&Summaries],
) -> Costs {
    let g = plan.graph();
    let (s, ipus, forward_len) = (t.s, t.ipus, g.forward_len());
    let node_cycles = |d: usize, i: usize| {
        let (a, b) = programs[d].node_steps[i];
        cost_steps_with(programs[d], summaries[d], cfg, a..b)
    };
    let mut c = Costs {
        stages: vec![StageCost::default(); s],
        phases: vec![(Cycles::default(), Cycles::default()); s],
        traces: vec![Default::default(); s],
        update: vec![Cycles::default(); ipus],
        update_traces: vec![Vec::new(); ipus],
    };
    let append = |trace: &mut Vec<TraceEvent>, at: u64, d: usize, events: Vec<TraceEvent>| {
        trace.extend(events.into_iter().map(|mut e| {
            e.start += at;
            e.ipu = d;
            e
        }));
    };
    for (i, n) in g.nodes().iter().enumerate() {
        let k = n.stage();
        let d = t.mapping[k];
        let (cycles, _, events) = node_cycles(d, i);
        if n.roles().contains(Roles::UPDATE) {
            append(&mut c.update_traces[d], c.update[d].total(), d, events);
            add(&mut c.update[d], &cycles);
        } else if i < forward_len {
            append(&mut c.traces[k].0, c.stages[k].forward, d, events);
            c.stages[k].forward += cycles.total();
            add(&mut c.phases[k].0, &cycles);
        } else {
            append(&mut c.traces[k].1, c.stages[k].backward, d, events);
            c.stages[k].backward += cycles.total();
            add(&mut c.phases[k].1, &cycles);
        }
    }
    if opts.techniques.recompute.stages && t.training {
        for cost in &mut c.stages {
            cost.backward += cost.forward;
        }
    }
    c
}

/// What the stages stash for their backward passes.
struct Stash {
    /// (stage, tensor) pairs: what each stage's backward reads of its forward (or,
    /// recomputing, of its inputs).
    stashed: Vec<(usize, usize)>,
    /// Each stage's stash bytes per micro-batch.
    entry_bytes: Vec<u64>,
    /// Whether the stash is kept in streaming memory.
    offloaded: bool,
}

/// The stages' stash; offloaded, each stage with a stash stores it to streaming memory after
/// its forward pass and loads it before its backward pass (TensorFlow's
/// `offload_activations`), which `costs` gains.
fn stash<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
    t: &Topology,
    costs: &mut Costs,
) -> Result<Stash, SystemError> {
    let g = plan.graph();
    let stashed = if t.training {
        stashed_tensors(plan, opts.techniques.recompute.stages)
    } else {
        Vec::new()
    };
    let mut entry_bytes = vec![0u64; t.s];
    for &(k, i) in &stashed {
        entry_bytes[k] += g.nodes()[i].bytes() as u64;
    }
    let offloaded = opts.techniques.offload.activations && t.training;
    if offloaded {
        if cfg.streaming_memory_bytes == 0 {
            return Err(SystemError::StageOption {
                option: "offload activations",
                detail: "the machine has no streaming memory (remote buffers) to hold them".into(),
            });
        }
        for (k, &bytes) in entry_bytes.iter().enumerate() {
            if t.entries[k] == 0 || bytes == 0 {
                continue;
            }
            let x = (bytes as f64 / cfg.streaming_memory_bytes_per_cycle()).ceil() as u64
                + cfg.exchange_overhead_cycles;
            costs.stages[k].forward += x;
            costs.stages[k].backward += x;
            costs.phases[k].0.remote_buffers += x;
            costs.phases[k].1.remote_buffers += x;
        }
    }
    Ok(Stash {
        stashed,
        entry_bytes,
        offloaded,
    })
}

/// Each IPU's memory, with the stash on its tiles.
struct Memory {
    /// Each IPU's tiles.
    reports: Vec<MemoryReport>,
    /// Each IPU's stash bytes on its tiles.
    stash_bytes: Vec<u64>,
    /// Each IPU's stash bytes in streaming memory.
    offloaded_stash: Vec<u64>,
}

/// Each IPU's memory by tile (when `opts.memory` asks for it), the stash added as data below
/// any interleaved data.
fn memory_reports<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
    t: &Topology,
    programs: &[&Program],
    summaries: &[&Summaries],
    stash: &Stash,
) -> Memory {
    let g = plan.graph();
    let mut reports: Vec<MemoryReport> = if opts.memory {
        programs
            .par_iter()
            .zip(summaries)
            .map(|(p, x)| account_with(p, x, cfg))
            .collect()
    } else {
        (0..t.ipus)
            .map(|_| MemoryReport {
                sram_bytes_per_tile: cfg.sram_bytes_per_tile,
                interleaved_region_start_bytes: cfg.interleaved_region_start_bytes,
                tiles: Vec::new(),
            })
            .collect()
    };
    let mut stash_bytes = vec![0u64; t.ipus];
    let mut offloaded_stash = vec![0u64; t.ipus];
    for &(k, i) in &stash.stashed {
        let depth = t.entries[k] as u64;
        let d = t.mapping[k];
        if stash.offloaded {
            offloaded_stash[d] += depth * g.nodes()[i].bytes() as u64;
            continue;
        }
        if !opts.memory {
            continue;
        }
        for (tile, bytes) in stash_per_tile(&programs[d].tensors[i], depth) {
            reports[d].tiles[tile].stash += bytes;
            stash_bytes[d] += bytes;
        }
    }
    // The stash is data below any interleaved data: it fills gaps.
    for r in &mut reports {
        r.settle_gaps();
    }
    Memory {
        reports,
        stash_bytes,
        offloaded_stash,
    }
}

/// The replicas' gradient all-reduce: a ring over the links, once per weight update, as long
/// as the IPU with the most gradient bytes takes.
fn all_reduce_cycles<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
    t: &Topology,
    programs: &[&Program],
    sync: u64,
) -> u64 {
    if opts.replicas <= 1 || !t.training {
        return 0;
    }
    let g = plan.graph();
    (0..t.ipus)
        .map(|d| {
            let grad_bytes: u64 = programs[d]
                .tensors
                .iter()
                .zip(g.nodes())
                .filter(|(_, n)| n.roles().contains(Roles::TRAINABLE))
                .map(|(t, _)| t.elements * t.elem_bytes())
                .sum();
            let r = opts.replicas as f64;
            (2.0 * (r - 1.0) / r * grad_bytes as f64 / cfg.neighbour_link_bytes_per_cycle()).ceil()
                as u64
                + sync
        })
        .max()
        .unwrap_or(0)
}

/// Each IPU's row, and the worst tile over the limit (with what it holds), if any.
#[allow(clippy::too_many_arguments)]
fn ipu_rows<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
    t: &Topology,
    programs: &[&Program],
    summaries: &[&Summaries],
    tl: &crate::pipeline::Timeline,
    memory: &Memory,
    costs: &mut Costs,
    node_code: &mut [Vec<crate::memory::NodeCode>],
) -> (Vec<IpuRow>, Option<OutOfMemory>) {
    let g = plan.graph();
    let mut worst: Option<OutOfMemory> = None;
    let rows = (0..t.ipus)
        .map(|d| {
            let r = &memory.reports[d];
            let fullest = r.fullest(10).into_iter().cloned().collect::<Vec<_>>();
            if let Some(tile) = fullest
                .first()
                .filter(|tile| tile.total() > cfg.sram_bytes_per_tile)
            {
                if worst.as_ref().is_none_or(|w| tile.total() > w.needed) {
                    worst = crate::memory::check_fits_with(programs[d], summaries[d], r)
                        .err()
                        .map(|b| *b);
                }
            }
            let streaming: u64 = programs[d]
                .tensors
                .iter()
                .zip(g.nodes())
                .filter(|(t, n)| {
                    t.class == TensorClass::NotAlwaysLive
                        && ((n.roles().contains(Roles::OPTIMIZER_STATE)
                            && opts.techniques.offload.optimizer_state)
                            || (n.roles().contains(Roles::ACCUMULATOR)
                                && opts.techniques.offload.gradient_accumulators))
                })
                .map(|(t, n)| {
                    let shards = if n.roles().contains(Roles::OPTIMIZER_STATE) {
                        system_lower_options(opts).shards_of(t.elements)
                    } else {
                        1
                    };
                    (t.elements * t.elem_bytes()).div_ceil(shards)
                })
                .sum::<u64>()
                + memory.offloaded_stash[d];
            IpuRow {
                ipu: d,
                stages: (0..t.s).filter(|&k| t.mapping[k] == d).collect(),
                busy_cycles: tl.ipus[d].busy,
                idle_cycles: tl.ipus[d].idle,
                idle_fraction: tl.ipus[d].idle_fraction(),
                weight_update_cycles: costs.update[d].total(),
                bytes_used: r.total_bytes(),
                max_tile_bytes: r.tiles.iter().map(TileMemory::total).max().unwrap_or(0),
                tiles_used: r.tiles_used(),
                stash_bytes: memory.stash_bytes[d],
                streaming_memory_bytes: streaming,
                fullest_tiles: fullest,
                categories: TileMemory::sum(&r.tiles),
                tiles: r.tiles.clone(),
                update_trace: std::mem::take(&mut costs.update_traces[d]),
                vertices: programs[d].vertex_count(),
                node_code: std::mem::take(&mut node_code[d]),
            }
        })
        .collect();
    (rows, worst)
}

/// Each stage's row: its cycles, stash, traces and, when it shares its IPU, its own memory
/// over its own steps.
#[allow(clippy::too_many_arguments)]
fn stage_rows<S: Storage>(
    plan: &Plan<S>,
    cfg: &IpuConfig,
    opts: &SystemOptions,
    t: &Topology,
    programs: &[&Program],
    summaries: &[&Summaries],
    tl: &crate::pipeline::Timeline,
    stash: &Stash,
    costs: Costs,
) -> Vec<StageRow>
where
    Plan<S>: Sync,
    tessera_core::Graph<S>: Sync,
{
    let g = plan.graph();
    let (s, mapping) = (t.s, &t.mapping);
    // The memory of each stage that shares its IPU, over its own steps.
    let stage_memory: Vec<Option<PartMemory>> = (0..s)
        .into_par_iter()
        .map(|k| {
            let d = mapping[k];
            if !opts.memory || (0..s).filter(|&j| mapping[j] == d).count() < 2 {
                return None;
            }
            let mut part = vec![false; programs[d].steps.len()];
            for (i, n) in g.nodes().iter().enumerate() {
                if n.stage() == k {
                    let (a, b) = programs[d].node_steps[i];
                    part[a..b].iter_mut().for_each(|x| *x = true);
                }
            }
            let mut r = account_part(programs[d], summaries[d], cfg, Some(&part));
            // Its own stash, as its IPU's holds it.
            if !stash.offloaded {
                let depth = t.entries[k] as u64;
                for &(_, i) in stash.stashed.iter().filter(|&&(j, _)| j == k) {
                    for (tile, bytes) in stash_per_tile(&programs[d].tensors[i], depth) {
                        r.tiles[tile].stash += bytes;
                    }
                }
            }
            r.settle_gaps();
            Some(PartMemory {
                categories: TileMemory::sum(&r.tiles),
                bytes_used: r.total_bytes(),
                max_tile_bytes: r.tiles.iter().map(TileMemory::total).max().unwrap_or(0),
            })
        })
        .collect();
    let Costs {
        stages: cycles,
        phases,
        traces,
        ..
    } = costs;
    (0..s)
        .zip(traces)
        .zip(stage_memory)
        .map(|((k, (forward_trace, backward_trace)), memory)| StageRow {
            stage: k,
            position: t.positions[k],
            ipu: mapping[k],
            forward_cycles: cycles[k].forward,
            backward_cycles: cycles[k].backward,
            stash_depth: t.entries[k],
            stash_entry_bytes: stash.entry_bytes[k],
            idle_fraction: tl.ipus[mapping[k]].idle_fraction(),
            forward_phases: phases[k].0,
            backward_phases: phases[k].1,
            forward_trace,
            backward_trace,
            memory,
        })
        .collect()
}

/// The entries of stage position `p`'s stash. TensorFlow's depth is the schedule's: the
/// micro-batches whose activations wait for their backward while a newer one's are the
/// stage's working tensors ([`Pipeline::stash_depth`]). PopART sizes a stash by the pipeline
/// stages from the stashing one to the restoring one, both counted
/// (`Pipeline::getStashSize`: `numIndependentStages(stash stage, restore stage + 1)`, with a
/// forward stage `s` of `N` restored in backward stage `2(N - 1) - s`), one entry more for
/// every stage but the last, whose forward and backward share a stage and stash nothing.
pub fn stash_entries(pipeline: &Pipeline, p: usize, rule: AccumulationRule) -> usize {
    let depth = pipeline.stash_depth(p);
    let popart_grouped =
        rule == AccumulationRule::PopArt && pipeline.schedule() == Schedule::Grouped;
    if popart_grouped && pipeline.training() && p + 1 < pipeline.stages() {
        depth + 1
    } else {
        depth
    }
}

/// Checks stage positions: one per stage, no empty position, concurrent stages on distinct
/// IPUs, and (Interleaved training) no IPU holding stages of two positions.
pub fn stage_positions(
    positions: Option<&[usize]>,
    mapping: &[usize],
    stages: usize,
    schedule: Schedule,
    training: bool,
) -> Result<Vec<usize>, SystemError> {
    let bad = |detail: String| Err(SystemError::Positions { detail });
    // Without concurrent stages the schedule's own mapping check reports this case.
    let concurrent = positions.is_some();
    let positions: Vec<usize> = positions.map_or_else(|| (0..stages).collect(), <[usize]>::to_vec);
    if positions.len() != stages || mapping.len() != stages {
        return bad(format!(
            "{} positions and {} device mapping entries for {stages} stages",
            positions.len(),
            mapping.len()
        ));
    }
    let count = positions.iter().copied().max().unwrap_or(0) + 1;
    for p in 0..count {
        let at: Vec<usize> = (0..stages).filter(|&k| positions[k] == p).collect();
        if at.is_empty() {
            return bad(format!("position {p} has no stage"));
        }
        for (i, &a) in at.iter().enumerate() {
            for &b in &at[i + 1..] {
                if mapping[a] == mapping[b] {
                    return bad(format!(
                        "concurrent stages {a} and {b} (position {p}) are both on IPU {}",
                        mapping[a]
                    ));
                }
            }
        }
    }
    if concurrent && schedule == Schedule::Interleaved && training {
        for a in 0..stages {
            for b in 0..stages {
                if mapping[a] == mapping[b] && positions[a] != positions[b] {
                    return bad(format!(
                        "the Interleaved schedule cannot train with stages {a} and {b} both on IPU {}",
                        mapping[a]
                    ));
                }
            }
        }
    }
    Ok(positions)
}

/// The on-device loop's repeat count R from Keras' `steps_per_execution` K (micro-batches,
/// a multiple of M) or the pipelined example's repeat count; 1 when neither is given.
pub fn loop_repeat(
    steps_per_execution: Option<usize>,
    repeat_count: Option<usize>,
    m: usize,
) -> Result<usize, SystemError> {
    match (steps_per_execution, repeat_count) {
        (None, None) => Ok(1),
        (None, Some(r)) if r > 0 => Ok(r),
        (None, Some(_)) => Err(SystemError::StepsPerExecution {
            steps: 0,
            accumulation: m,
            repeat_count: Some(0),
        }),
        (Some(k), r) if k > 0 && k % m == 0 && r.is_none_or(|r| r.checked_mul(m) == Some(k)) => {
            Ok(k / m)
        }
        (Some(k), r) => Err(SystemError::StepsPerExecution {
            steps: k,
            accumulation: m,
            repeat_count: r,
        }),
    }
}
