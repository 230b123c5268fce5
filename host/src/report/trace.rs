//! `trace.json`: one weight update in Chrome's trace-event format (JSON object form).
//!
//! One process per IPU. Thread "pipeline stages" has a slice per stage run (then the all-reduce
//! and the weight update), thread "BSP phases" the phases of every superstep of those runs,
//! thread "weight update" the supersteps of the update. Timestamps are IPU cycles: one trace
//! microsecond is one cycle (`otherData.clock_hz` converts).

use serde::Serialize;
use tessera_sim::estimate::{Phase, TraceEvent};
use tessera_sim::pipeline::SlotRun;
use tessera_sim::system::{StageRow, SystemEstimate};

use super::Report;

/// At most this many BSP-phase slices go into a trace (stage slices are always all there).
/// Runs are detailed in timeline order until the next one would pass the limit.
pub const MAX_PHASE_SLICES: usize = 200_000;

const TID_STAGES: u64 = 1;
const TID_PHASES: u64 = 2;
const TID_UPDATE: u64 = 3;

/// A Chrome trace, ready to serialise (see [`chrome_trace`]).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace<'a> {
    trace_events: Vec<Event<'a>>,
    display_time_unit: &'static str,
    other_data: OtherData<'a>,
}

/// A metadata event (`ph: "M"`) or a complete slice (`ph: "X"`).
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
enum Event<'a> {
    Metadata {
        name: &'static str,
        ph: &'static str,
        pid: usize,
        tid: u64,
        args: MetadataArgs,
    },
    Slice {
        name: String,
        cat: &'static str,
        ph: &'static str,
        ts: u64,
        dur: u64,
        pid: usize,
        tid: u64,
        args: SliceArgs<'a>,
    },
}

#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
enum MetadataArgs {
    Name { name: String },
    SortIndex { sort_index: u64 },
}

#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
enum SliceArgs<'a> {
    Stage {
        stage: usize,
        micro_batch: usize,
        step: usize,
        cycles: u64,
        direction: &'static str,
    },
    Phase {
        op: &'a str,
        superstep: usize,
        tiles: String,
        cycles: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        direction: Option<&'static str>,
        #[serde(flatten)]
        run: Option<PhaseRun>,
    },
    AllReduce {
        cycles: u64,
        replicas: usize,
    },
    Update {
        cycles: u64,
        slowest_ipu_cycles_with_sync: u64,
    },
    Steady {
        first_step: usize,
        steps: usize,
        cycles: u64,
    },
}

/// Which stage run a BSP-phase slice belongs to.
#[derive(Clone, Copy, Debug, Serialize)]
struct PhaseRun {
    stage: usize,
    micro_batch: usize,
    pass: &'static str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    recomputed: bool,
}

#[derive(Clone, Debug, Serialize)]
struct OtherData<'a> {
    title: &'a str,
    command: &'a str,
    machine: &'a str,
    time_unit: &'static str,
    clock_hz: f64,
    schedule: &'a str,
    micro_batches_per_weight_update: usize,
    replicas: usize,
    cycles_per_weight_update: u64,
    pipeline_cycles: u64,
    all_reduce_cycles: u64,
    weight_update_cycles: u64,
    runs: usize,
    runs_with_phases: usize,
    phase_slices: usize,
    phase_slices_omitted: usize,
    phase_slice_limit: usize,
}

/// The Chrome trace of one weight update: see the module documentation.
pub fn chrome_trace(report: &Report) -> Trace<'_> {
    chrome_trace_with_limit(report, MAX_PHASE_SLICES)
}

/// [`chrome_trace`] with at most `limit` BSP-phase slices (pipeline runs are detailed in
/// timeline order, then the weight updates, until the next would pass the limit); every stage
/// slice is kept. `otherData` says how many phase slices were left out.
pub fn chrome_trace_with_limit(report: &Report, limit: usize) -> Trace<'_> {
    let e = &report.estimate;
    let mut budget = Budget::new(limit);
    let mut events = metadata_events(e);
    events.extend(e.runs.iter().map(stage_slice));
    // The steady-state steps the timeline counted without listing: one slice on each IPU.
    if let Some(el) = e.elided {
        for row in &e.ipus {
            events.push(Event::Slice {
                name: format!(
                    "{} steady-state steps (each as the period before)",
                    el.steps
                ),
                cat: "stage",
                ph: "X",
                ts: el.start,
                dur: el.cycles,
                pid: row.ipu + 1,
                tid: TID_STAGES,
                args: SliceArgs::Steady {
                    first_step: el.first_step,
                    steps: el.steps,
                    cycles: el.cycles,
                },
            });
        }
    }
    let mut runs_with_phases = 0;
    for run in &e.runs {
        let Some(stage) = stage_row(e, run.stage) else {
            continue;
        };
        let phases = run_events(stage, run);
        if budget.take(phases.len()) {
            runs_with_phases += 1;
            events.extend(phases.into_iter().map(|(offset, ev, recomputed)| {
                let at = run.start.saturating_add(offset);
                let of = PhaseRun {
                    stage: run.stage,
                    micro_batch: run.micro_batch,
                    pass: direction(run),
                    recomputed,
                };
                phase_slice(ev, at, run.ipu + 1, TID_PHASES, Some(of))
            }));
        }
    }
    update_slices(e, &mut budget, &mut events);
    Trace {
        trace_events: events,
        display_time_unit: "ns",
        other_data: other_data(report, runs_with_phases, &budget, limit),
    }
}

/// How many phase slices may still go in: once one run or update does not fit, none after it
/// does either.
#[derive(Debug)]
struct Budget {
    left: usize,
    taken: usize,
    omitted: usize,
    exhausted: bool,
}

impl Budget {
    fn new(limit: usize) -> Budget {
        Budget {
            left: limit,
            taken: 0,
            omitted: 0,
            exhausted: false,
        }
    }

    /// Whether `n` more slices fit; counts them as taken or omitted.
    fn take(&mut self, n: usize) -> bool {
        if self.exhausted || n > self.left {
            self.exhausted = true;
            self.omitted += n;
            return false;
        }
        self.left -= n;
        self.taken += n;
        true
    }
}

fn direction(run: &SlotRun) -> &'static str {
    if run.backward {
        "backward"
    } else {
        "forward"
    }
}

/// Process and thread names and orders for every IPU of one replica.
fn metadata_events<'a>(e: &SystemEstimate) -> Vec<Event<'a>> {
    let meta = |name, pid, tid, args| Event::Metadata {
        name,
        ph: "M",
        pid,
        tid,
        args,
    };
    let mut events = Vec::new();
    for d in 0..ipu_count(e) {
        let pid = d + 1;
        let name = format!("IPU {d}");
        events.push(meta("process_name", pid, 0, MetadataArgs::Name { name }));
        let sort_index = d as u64;
        events.push(meta(
            "process_sort_index",
            pid,
            0,
            MetadataArgs::SortIndex { sort_index },
        ));
        for (tid, name) in [
            (TID_STAGES, "pipeline stages"),
            (TID_PHASES, "BSP phases"),
            (TID_UPDATE, "weight update"),
        ] {
            let name = name.to_string();
            events.push(meta("thread_name", pid, tid, MetadataArgs::Name { name }));
            let args = MetadataArgs::SortIndex { sort_index: tid };
            events.push(meta("thread_sort_index", pid, tid, args));
        }
    }
    events
}

fn stage_slice<'a>(r: &SlotRun) -> Event<'a> {
    let direction = direction(r);
    Event::Slice {
        name: format!("stage {} {direction} mb {}", r.stage, r.micro_batch),
        cat: "stage",
        ph: "X",
        ts: r.start,
        dur: r.cycles,
        pid: r.ipu + 1,
        tid: TID_STAGES,
        args: SliceArgs::Stage {
            stage: r.stage,
            micro_batch: r.micro_batch,
            step: r.step,
            cycles: r.cycles,
            direction,
        },
    }
}

/// After the pipeline: the replicas' all-reduce, then every IPU's weight update and its
/// supersteps (while the budget lasts).
fn update_slices<'a>(e: &'a SystemEstimate, budget: &mut Budget, events: &mut Vec<Event<'a>>) {
    let update_start = e.pipeline_cycles.saturating_add(e.all_reduce_cycles);
    let slice = |name: &str, cat, ts, dur, pid, args| Event::Slice {
        name: name.to_string(),
        cat,
        ph: "X",
        ts,
        dur,
        pid,
        tid: TID_STAGES,
        args,
    };
    for row in &e.ipus {
        let pid = row.ipu + 1;
        if e.all_reduce_cycles > 0 {
            let args = SliceArgs::AllReduce {
                cycles: e.all_reduce_cycles,
                replicas: e.replicas,
            };
            let (ts, dur) = (e.pipeline_cycles, e.all_reduce_cycles);
            events.push(slice("all-reduce", "all-reduce", ts, dur, pid, args));
        }
        if e.weight_update_cycles == 0 && row.update_trace.is_empty() {
            continue;
        }
        let args = SliceArgs::Update {
            cycles: row.weight_update_cycles,
            slowest_ipu_cycles_with_sync: e.weight_update_cycles,
        };
        let dur = row.weight_update_cycles;
        events.push(slice(
            "weight update",
            "update",
            update_start,
            dur,
            pid,
            args,
        ));
        if budget.take(row.update_trace.len()) {
            let phases = row.update_trace.iter();
            events.extend(phases.map(|ev| phase_slice(ev, update_start, pid, TID_UPDATE, None)));
        }
    }
}

fn phase_slice(ev: &TraceEvent, at: u64, pid: usize, tid: u64, run: Option<PhaseRun>) -> Event<'_> {
    let direction = match ev.phase {
        Phase::HostToDevice => Some("host to device"),
        Phase::DeviceToHost => Some("device to host"),
        _ => None,
    };
    Event::Slice {
        name: phase_name(ev.phase).to_string(),
        cat: "phase",
        ph: "X",
        ts: at.saturating_add(ev.start),
        dur: ev.cycles,
        pid,
        tid,
        args: SliceArgs::Phase {
            op: &ev.op,
            superstep: ev.superstep,
            tiles: format!("{}-{}", ev.tiles.0, ev.tiles.1),
            cycles: ev.cycles,
            direction,
            run,
        },
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Compute => "compute",
        Phase::Exchange => "exchange",
        Phase::Sync => "sync",
        Phase::HostToDevice | Phase::DeviceToHost => "host",
        Phase::RemoteBuffer => "remote buffer",
    }
}

fn other_data<'a>(
    r: &'a Report,
    runs_with_phases: usize,
    b: &Budget,
    limit: usize,
) -> OtherData<'a> {
    let e = &r.estimate;
    OtherData {
        title: &r.title,
        command: &r.command,
        machine: &r.machine_name,
        time_unit:
            "ts and dur are IPU cycles: 1 trace microsecond = 1 cycle; seconds = cycles / clock_hz",
        clock_hz: r.machine.clock_hz,
        schedule: &e.schedule,
        micro_batches_per_weight_update: e.accumulation,
        replicas: e.replicas,
        cycles_per_weight_update: e.cycles_per_weight_update,
        pipeline_cycles: e.pipeline_cycles,
        all_reduce_cycles: e.all_reduce_cycles,
        weight_update_cycles: e.weight_update_cycles,
        runs: e.runs.len(),
        runs_with_phases,
        phase_slices: b.taken,
        phase_slices_omitted: b.omitted,
        phase_slice_limit: limit,
    }
}

/// IPUs of one replica: rows, runs and stages all counted.
fn ipu_count(e: &SystemEstimate) -> usize {
    let rows = e.ipus.iter().map(|r| r.ipu + 1).max().unwrap_or(0);
    let runs = e.runs.iter().map(|r| r.ipu + 1).max().unwrap_or(0);
    let stages = e.stages.iter().map(|s| s.ipu + 1).max().unwrap_or(0);
    rows.max(runs).max(stages).max(e.ipus.len())
}

fn stage_row(e: &SystemEstimate, stage: usize) -> Option<&StageRow> {
    match e.stages.get(stage) {
        Some(s) if s.stage == stage => Some(s),
        _ => e.stages.iter().find(|s| s.stage == stage),
    }
}

/// The superstep events of one run, with starts from the run's start and whether each is a
/// recomputed forward. A recomputing backward (its cycles are its phases' plus the forward's)
/// replays the forward first.
fn run_events<'a>(stage: &'a StageRow, run: &SlotRun) -> Vec<(u64, &'a TraceEvent, bool)> {
    if !run.backward {
        return stage.forward_trace.iter().map(|e| (0, e, false)).collect();
    }
    let own = stage.backward_phases.total();
    let recompute = stage.forward_cycles > 0
        && !stage.forward_trace.is_empty()
        && stage.backward_cycles.checked_sub(own) == Some(stage.forward_cycles);
    let mut v = Vec::new();
    let mut offset = 0;
    if recompute {
        v.extend(stage.forward_trace.iter().map(|e| (0, e, true)));
        offset = stage.forward_cycles;
    }
    v.extend(stage.backward_trace.iter().map(|e| (offset, e, false)));
    v
}
