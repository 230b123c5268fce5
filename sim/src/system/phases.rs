//! The phases of a system estimate after its options are checked: each IPU's share
//! lowered, its steps costed by stage, each IPU's memory accounted, the replicas' all-reduce.

use rayon::prelude::*;
use tessera_core::{Plan, Roles, Storage};

use super::conditional::{untaken, ConditionalCost};
use super::stash::{stash_per_tile, Stash};
use super::topology::Topology;
use super::{SystemError, SystemOptions};
use crate::estimate::{cost_steps_with, Cycles, TraceEvent};
use crate::exchange::Summaries;
use crate::lower::{lower_with, LowerOptions};
use crate::machine::IpuConfig;
use crate::memory::{account_with, MemoryReport};
use crate::pipeline::StageCost;
use crate::program::Program;
use crate::techniques::MemoryProportion;

/// The lowering options of the whole system (a proportion given per stage leaves Poplar's
/// default here; each IPU's own are [`ipu_lower_options`]).
pub(super) fn system_lower_options(opts: &SystemOptions) -> LowerOptions {
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
pub(super) fn ipu_lower_options(
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
    let base = LowerOptions {
        partition_ipus: u32::try_from(opts.replicas.saturating_mul(ipus.next_power_of_two()))
            .unwrap_or(u32::MAX),
        ..system_lower_options(opts)
    };
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

/// Each IPU's share of the plan, lowered with what the estimate needs of its exchanges.
pub(super) fn lower_ipus<S: Storage>(
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

/// What every phase after the lowering reads: the plan, the machine, the options, the
/// stages' places, and each IPU's lowered program with its exchange summaries.
pub(super) struct Run<'a, S: Storage> {
    pub(super) plan: &'a Plan<S>,
    pub(super) cfg: &'a IpuConfig,
    pub(super) opts: &'a SystemOptions,
    pub(super) t: &'a Topology,
    pub(super) programs: Vec<&'a Program>,
    pub(super) summaries: Vec<&'a Summaries>,
}

/// Cycles by stage and pass, with their phases and traces, and each IPU's weight update.
pub(super) struct Costs {
    /// Each stage's forward and backward cycles per micro-batch.
    pub(super) stages: Vec<StageCost>,
    /// Each stage's (forward, backward) cycles by phase.
    pub(super) phases: Vec<(Cycles, Cycles)>,
    /// Each stage's (forward, backward) trace.
    pub(super) traces: Vec<(Vec<TraceEvent>, Vec<TraceEvent>)>,
    /// Each IPU's weight-update cycles.
    pub(super) update: Vec<Cycles>,
    /// Each IPU's weight-update trace.
    pub(super) update_traces: Vec<Vec<TraceEvent>>,
    /// The branch assumed of each conditional decided at run time.
    pub(super) conditionals: Vec<ConditionalCost>,
}

/// Every node's steps costed into its stage's forward or backward pass, or its IPU's weight
/// update, but for the cheaper branch of each conditional decided at run time
/// ([`untaken`]); recomputation adds the forward pass to the backward one.
pub(super) fn cost_stages<S: Storage>(run: &Run<'_, S>) -> Costs {
    let Run {
        plan,
        cfg,
        opts,
        t,
        programs,
        summaries,
        ..
    } = run;
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
        conditionals: Vec::new(),
    };
    let (skip, conditionals) = untaken(g, &opts.conditionals, |i| {
        let d = t.mapping[g.nodes()[i].stage()];
        node_cycles(d, i).0.total()
    });
    c.conditionals = conditionals;
    let append = |trace: &mut Vec<TraceEvent>, at: u64, d: usize, events: Vec<TraceEvent>| {
        trace.extend(events.into_iter().map(|mut e| {
            e.start += at;
            e.ipu = d;
            e
        }));
    };
    for (i, n) in g.nodes().iter().enumerate().filter(|&(i, _)| !skip[i]) {
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

/// Each IPU's memory, with the stash on its tiles.
pub(super) struct Memory {
    /// Each IPU's tiles.
    pub(super) reports: Vec<MemoryReport>,
    /// Each IPU's stash bytes on its tiles.
    pub(super) stash_bytes: Vec<u64>,
    /// Each IPU's stash bytes in streaming memory.
    pub(super) offloaded_stash: Vec<u64>,
}

/// Each IPU's memory by tile (when `opts.memory` asks for it), the stash added as data below
/// any interleaved data.
pub(super) fn memory_reports<S: Storage>(run: &Run<'_, S>, stash: &Stash) -> Memory {
    let Run {
        plan,
        cfg,
        opts,
        t,
        programs,
        summaries,
        ..
    } = run;
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
pub(super) fn all_reduce_cycles<S: Storage>(run: &Run<'_, S>) -> u64 {
    let Run {
        plan,
        cfg,
        opts,
        t,
        programs,
        ..
    } = run;
    if opts.replicas <= 1 || !t.training {
        return 0;
    }
    let g = plan.graph();
    let ipus = opts.replicas.saturating_mul(t.ipus.next_power_of_two());
    (0..t.ipus)
        .map(|d| {
            let grad_bytes: u64 = programs[d]
                .tensors
                .iter()
                .zip(g.nodes())
                .filter(|(_, n)| n.roles().contains(Roles::TRAINABLE))
                .map(|(t, _)| t.elements * t.elem_bytes())
                .sum();
            crate::collective::all_reduce_cycles(cfg, grad_bytes, opts.replicas, ipus)
        })
        .max()
        .unwrap_or(0)
}

pub(super) fn add(a: &mut Cycles, b: &Cycles) {
    a.compute += b.compute;
    a.exchange += b.exchange;
    a.sync += b.sync;
    a.host_streams += b.host_streams;
    a.remote_buffers += b.remote_buffers;
}
