//! Where the stages run: their IPUs, their positions in the schedule, the schedule's
//! micro-batches and loop.

use tessera_core::schedule::{Pipeline, Schedule};
use tessera_core::{Plan, Roles, Storage};

use super::stash::stash_entries;
use super::{SystemError, SystemOptions, MAX_SYSTEM_IPUS};

/// Where the stages run: their IPUs and schedule positions, the schedule, its micro-batches
/// and loop, and each stage's stash entries.
pub(super) struct Topology {
    /// Whether the graph trains.
    pub(super) training: bool,
    /// Pipeline stages.
    pub(super) s: usize,
    /// Micro-batches per weight update (M; inference: per execution).
    pub(super) m: usize,
    /// Each stage's IPU.
    pub(super) mapping: Vec<usize>,
    /// Each stage's position in the schedule.
    pub(super) positions: Vec<usize>,
    /// Positions in the schedule.
    pub(super) count: usize,
    /// The schedule.
    pub(super) pipeline: Pipeline,
    /// Weight updates per execution (R).
    pub(super) repeat: usize,
    /// Each stage's stash entries, under the accumulation rule.
    pub(super) entries: Vec<usize>,
    /// IPUs of one replica.
    pub(super) ipus: usize,
}

/// The stages' places: IPUs, schedule positions and stash entries, checked (a variable's
/// users share an IPU; the replicas' IPUs fit the system).
pub(super) fn topology<S: Storage>(
    plan: &Plan<S>,
    opts: &SystemOptions,
) -> Result<Topology, SystemError> {
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
