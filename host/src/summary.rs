//! The estimate as the command shows it: one summary (fit, memory per IPU and category,
//! cycles by phase, per-stage rows) serialised as JSON or rendered as text.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::memory::MemoryCategory;
use tessera_sim::system::SystemEstimate;

use crate::report::format::{bytes, count, decimal, percent, seconds};

/// Memory of one IPU, as the JSON outputs give it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IpuMemorySummary {
    /// The IPU.
    pub ipu: usize,
    /// Bytes over all tiles.
    pub bytes_used: u64,
    /// The fullest tile's bytes.
    pub max_tile_bytes: u64,
    /// Tiles holding anything.
    pub tiles_used: usize,
    /// The fullest tile.
    pub max_tile: u32,
    /// Of the fullest tile's bytes, the gaps below its interleaved data (memory its other data
    /// does not fill under the AMP partials, which must sit in the interleaved region).
    pub max_tile_gap_bytes: u64,
    /// SRAM per tile.
    pub tile_bytes_available: u64,
    /// Bytes by category over all tiles.
    pub categories: BTreeMap<&'static str, u64>,
    /// Vertices of its program.
    pub vertices: usize,
}

/// One pipeline stage, as the JSON outputs give it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageSummary {
    /// The stage.
    pub stage: usize,
    /// Its IPU.
    pub ipu: usize,
    /// Forward cycles per micro-batch.
    pub forward_cycles: u64,
    /// Backward cycles per micro-batch.
    pub backward_cycles: u64,
    /// Stash depth (micro-batches).
    pub stash_depth: usize,
    /// Stash bytes (depth x entry).
    pub stash_bytes: u64,
    /// Bytes used on its IPU.
    pub ipu_bytes_used: u64,
    /// Idle fraction of its IPU.
    pub idle_fraction: f64,
    /// Its own memory when its IPU holds other stages too (`--device-mapping`): its steps'
    /// code, the variables they touch and its tiles' peak over them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<StageMemorySummary>,
}

/// A stage's own memory (a stage sharing its IPU), as the JSON outputs give it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageMemorySummary {
    /// Bytes over its IPU's tiles.
    pub bytes_used: u64,
    /// The fullest tile's bytes.
    pub max_tile_bytes: u64,
    /// Bytes by category over its IPU's tiles.
    pub categories: BTreeMap<&'static str, u64>,
}

/// The estimate in the form the command prints as JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EstimateSummary {
    /// The model.
    pub model: String,
    /// The IPU generation.
    pub ipu: String,
    /// Whether every tile fits.
    pub fits: bool,
    /// Why not, when it does not.
    pub out_of_memory: Option<String>,
    /// Average cycles per micro-batch step (cycles per weight update / M).
    pub cycles_per_step: u64,
    /// Cycles per weight update.
    pub cycles_per_weight_update: u64,
    /// Cycles per execution (R weight updates).
    pub cycles_per_execution: u64,
    /// Pipeline cycles of one update.
    pub pipeline_cycles: u64,
    /// All-reduce cycles of one update.
    pub all_reduce_cycles: u64,
    /// Weight-update cycles.
    pub weight_update_cycles: u64,
    /// Cycles by phase over one update's stage runs and its update (before pipeline overlap).
    pub cycles_by_phase: BTreeMap<&'static str, u64>,
    /// Seconds per weight update.
    pub seconds_per_weight_update: f64,
    /// Samples per second.
    pub samples_per_second: f64,
    /// Samples per second at steady state: the limit as M grows, where the pipeline's ramp
    /// (fill and drain), the all-reduce and the weight update spread over ever more
    /// micro-batches.
    pub steady_samples_per_second: f64,
    /// Cycles of the pipeline's ramp in one weight update: its fill and drain, the pipeline's
    /// cycles beyond M micro-batches at steady state.
    pub ramp_cycles: u64,
    /// Micro-batches per weight update.
    pub gradient_accumulation_count: usize,
    /// Replicas.
    pub replicas: usize,
    /// IPUs in all.
    pub ipus_total: usize,
    /// The system they need (one IPU-Machine, an IPU-POD or a Bow Pod), on machines in pods.
    pub system: Option<String>,
    /// IPU-Link domains they span; collectives over more than one cross the gateways.
    pub ipu_link_domains: usize,
    /// Schedule.
    pub schedule: String,
    /// Per IPU of one replica.
    pub ipus: Vec<IpuMemorySummary>,
    /// Per stage.
    pub stages: Vec<StageSummary>,
}

impl EstimateSummary {
    /// Summarises `e` for `model` on `machine`, IPUs of generation `ipu`.
    pub fn new(model: &str, ipu: Preset, machine: &IpuConfig, e: &SystemEstimate) -> Self {
        EstimateSummary::for_machine(model, ipu.name(), machine, e)
    }

    /// [`EstimateSummary::new`] for a machine named `machine_name` (a preset's name, or a
    /// custom machine's).
    pub fn for_machine(
        model: &str,
        machine_name: &str,
        machine: &IpuConfig,
        e: &SystemEstimate,
    ) -> Self {
        let m = e.accumulation as u64;
        let ipus = e
            .ipus
            .iter()
            .map(|r| {
                let c = &r.categories;
                IpuMemorySummary {
                    ipu: r.ipu,
                    bytes_used: r.bytes_used,
                    max_tile_bytes: r.max_tile_bytes,
                    tiles_used: r.tiles_used,
                    max_tile: r.fullest_tiles.first().map_or(0, |t| t.tile.0),
                    max_tile_gap_bytes: r.fullest_tiles.first().map_or(0, |t| t.gaps),
                    tile_bytes_available: machine.sram_bytes_per_tile,
                    categories: c.categories().map(|(k, b)| (k.key(), b)).collect(),
                    vertices: r.vertices,
                }
            })
            .collect();
        let stages = e
            .stages
            .iter()
            .map(|s| StageSummary {
                stage: s.stage,
                ipu: s.ipu,
                forward_cycles: s.forward_cycles,
                backward_cycles: s.backward_cycles,
                stash_depth: s.stash_depth,
                stash_bytes: s.stash_entry_bytes * s.stash_depth as u64,
                ipu_bytes_used: e.ipus.get(s.ipu).map_or(0, |r| r.bytes_used),
                idle_fraction: s.idle_fraction,
                memory: s.memory.as_ref().map(|m| StageMemorySummary {
                    bytes_used: m.bytes_used,
                    max_tile_bytes: m.max_tile_bytes,
                    categories: m
                        .categories
                        .categories()
                        .map(|(k, b)| (k.key(), b))
                        .collect(),
                }),
            })
            .collect();
        EstimateSummary {
            model: model.to_string(),
            ipu: machine_name.to_string(),
            fits: e.fits,
            out_of_memory: e.out_of_memory.as_ref().map(ToString::to_string),
            cycles_per_step: e.cycles_per_weight_update / m.max(1),
            cycles_per_weight_update: e.cycles_per_weight_update,
            cycles_per_execution: e.cycles_per_execution,
            pipeline_cycles: e.pipeline_cycles,
            all_reduce_cycles: e.all_reduce_cycles,
            weight_update_cycles: e.weight_update_cycles,
            cycles_by_phase: cycles_by_phase(e),
            seconds_per_weight_update: e.seconds_per_weight_update,
            samples_per_second: e.samples_per_second,
            steady_samples_per_second: e.steady_samples_per_second,
            ramp_cycles: ramp_cycles(e),
            gradient_accumulation_count: e.accumulation,
            replicas: e.replicas,
            ipus_total: e.ipus_total,
            system: e.system.clone(),
            ipu_link_domains: e.ipu_link_domains,
            schedule: e.schedule.clone(),
            ipus,
            stages,
        }
    }

    /// The human-readable report: fit, memory per IPU and category, fullest tiles, cycles by
    /// phase, per-stage rows, and why it does not fit when it does not. Numbers are written by
    /// [`crate::report::format`](mod@crate::report::format).
    pub fn to_text(&self) -> String {
        let mut s = self.text_without_out_of_memory();
        if let Some(oom) = &self.out_of_memory {
            let _ = writeln!(s, "{oom}");
        }
        s
    }

    /// [`Self::to_text`] without the out-of-memory paragraph (the command prints it once, as
    /// its error).
    pub fn text_without_out_of_memory(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}: {} x {} per replica, {} replica(s), {} schedule, M = {}",
            self.model,
            self.ipus.len(),
            self.ipu,
            self.replicas,
            self.schedule,
            self.gradient_accumulation_count
        );
        self.system_text(&mut s);
        let fullest = self.ipus.iter().max_by_key(|i| i.max_tile_bytes);
        match fullest.filter(|_| self.fits) {
            Some(i) => {
                let (max, sram) = (bytes(i.max_tile_bytes), bytes(i.tile_bytes_available));
                let _ = writeln!(s, "fits: yes (fullest tile {max} of {sram})");
            }
            None => s.push_str(if self.fits {
                "fits: yes\n"
            } else {
                "fits: NO\n"
            }),
        }
        self.memory_text(&mut s);
        self.cycles_text(&mut s);
        self.stages_text(&mut s);
        s
    }

    /// The system the IPUs need, and whether the collectives cross the gateways between
    /// IPU-Link domains.
    fn system_text(&self, s: &mut String) {
        let Some(system) = &self.system else { return };
        let ipus = count(self.ipus_total as u64);
        if self.ipu_link_domains > 1 {
            let _ = writeln!(
                s,
                "system: {system} ({ipus} IPUs in {} IPU-Link domains; the all-reduce crosses their gateways)",
                self.ipu_link_domains
            );
        } else {
            let _ = writeln!(s, "system: {system} ({ipus} IPUs)");
        }
    }

    /// Memory per IPU: totals, the fullest tile, then every category that holds anything.
    fn memory_text(&self, s: &mut String) {
        s.push_str("memory per IPU:\n");
        for i in &self.ipus {
            let gaps = if i.max_tile_gap_bytes > 0 {
                format!(
                    " ({} of it gaps below interleaved data)",
                    bytes(i.max_tile_gap_bytes)
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "  IPU {}: {} on {} tiles; fullest tile {} holds {} of {}{gaps}",
                i.ipu,
                bytes(i.bytes_used),
                count(i.tiles_used as u64),
                i.max_tile,
                bytes(i.max_tile_bytes),
                bytes(i.tile_bytes_available)
            );
            let _ = writeln!(s, "    {}", categories_line(&i.categories));
        }
    }

    /// Whether the estimate is of training: it has a backward pass or a weight update
    /// (inference has neither).
    pub fn trains(&self) -> bool {
        self.weight_update_cycles > 0 || self.stages.iter().any(|st| st.backward_cycles > 0)
    }

    /// Cycles per weight update and its parts, per step and execution, by phase; time and
    /// throughput. Inference speaks of steps only.
    fn cycles_text(&self, s: &mut String) {
        if !self.trains() {
            let m = self.gradient_accumulation_count.max(1) as u64;
            let _ = writeln!(
                s,
                "cycles per step (batch): {}; per execution: {}",
                count(self.cycles_per_step),
                count(self.cycles_per_execution)
            );
            let phases: Vec<String> = self
                .cycles_by_phase
                .iter()
                .filter(|(k, &v)| v > 0 || !matches!(**k, "all_reduce" | "weight_update"))
                .map(|(k, &v)| format!("{k} {}", count(v)))
                .collect();
            let _ = writeln!(s, "cycles by phase (before overlap): {}", phases.join(", "));
            let _ = writeln!(
                s,
                "{} per step, {} samples/s",
                seconds(self.seconds_per_weight_update / m as f64),
                decimal(self.samples_per_second)
            );
            self.steady_text(s);
            return;
        }
        let _ = writeln!(
            s,
            "cycles per weight update: {} (pipeline {}, all-reduce {}, weight update {}); per execution: {}",
            count(self.cycles_per_weight_update),
            count(self.pipeline_cycles),
            count(self.all_reduce_cycles),
            count(self.weight_update_cycles),
            count(self.cycles_per_execution)
        );
        let _ = writeln!(
            s,
            "cycles per step (micro-batch): {}",
            count(self.cycles_per_step)
        );
        let phases: Vec<String> = self
            .cycles_by_phase
            .iter()
            .map(|(k, &v)| format!("{k} {}", count(v)))
            .collect();
        let _ = writeln!(s, "cycles by phase (before overlap): {}", phases.join(", "));
        let _ = writeln!(
            s,
            "{} per weight update, {} samples/s at M = {}",
            seconds(self.seconds_per_weight_update),
            decimal(self.samples_per_second),
            self.gradient_accumulation_count
        );
        self.steady_text(s);
    }

    /// The throughput at steady state, where it differs from the run's, with what the run
    /// spends beyond it: the pipeline's ramp, and in training the all-reduce and the update.
    fn steady_text(&self, s: &mut String) {
        if self.steady_samples_per_second <= self.samples_per_second * 1.001 {
            return;
        }
        let total = self.cycles_per_weight_update.max(1) as f64;
        let share = |c: u64| percent(c as f64 / total);
        let per = if self.trains() {
            "weight update"
        } else {
            "step"
        };
        let mut parts = Vec::new();
        if self.stages.len() > 1 {
            parts.push(format!(
                "the pipeline's fill and drain {}",
                share(self.ramp_cycles)
            ));
        }
        if self.trains() {
            parts.push(format!(
                "the all-reduce and weight update {}",
                share(self.all_reduce_cycles + self.weight_update_cycles)
            ));
        }
        let spent = match parts.is_empty() {
            true => String::new(),
            false => format!(
                " (at M = {}, {} of each {per})",
                self.gradient_accumulation_count,
                parts.join(", ")
            ),
        };
        let _ = writeln!(
            s,
            "steady state: {} samples/s as M grows{spent}",
            decimal(self.steady_samples_per_second),
        );
    }

    /// One row per pipeline stage (inference: without the backward pass's columns).
    fn stages_text(&self, s: &mut String) {
        if !self.trains() {
            let _ = writeln!(
                s,
                "{:<6} {:>4} {:>10} {:>12} {:>6}",
                "stage", "IPU", "fwd cyc", "IPU bytes", "idle"
            );
            for st in &self.stages {
                let _ = writeln!(
                    s,
                    "{:<6} {:>4} {:>10} {:>12} {:>6}",
                    st.stage,
                    st.ipu,
                    count(st.forward_cycles),
                    bytes(st.ipu_bytes_used),
                    percent(st.idle_fraction)
                );
            }
            self.stage_memory_text(s);
            return;
        }
        let _ = writeln!(
            s,
            "{:<6} {:>4} {:>10} {:>10} {:>7} {:>12} {:>12} {:>6}",
            "stage", "IPU", "fwd cyc", "bwd cyc", "stash", "stash bytes", "IPU bytes", "idle"
        );
        for st in &self.stages {
            let _ = writeln!(
                s,
                "{:<6} {:>4} {:>10} {:>10} {:>7} {:>12} {:>12} {:>6}",
                st.stage,
                st.ipu,
                count(st.forward_cycles),
                count(st.backward_cycles),
                st.stash_depth,
                bytes(st.stash_bytes),
                bytes(st.ipu_bytes_used),
                percent(st.idle_fraction)
            );
        }
        self.stage_memory_text(s);
    }

    /// Each stage's memory on its own, when the estimate has it.
    fn stage_memory_text(&self, s: &mut String) {
        for st in &self.stages {
            if let Some(m) = &st.memory {
                let _ = writeln!(
                    s,
                    "  stage {} on IPU {} on its own: {}; fullest tile {}",
                    st.stage,
                    st.ipu,
                    bytes(m.bytes_used),
                    bytes(m.max_tile_bytes)
                );
                let _ = writeln!(s, "    {}", categories_line(&m.categories));
            }
        }
    }
}

/// The categories that hold anything, in order, as `always_live 1.2 MiB, ...`. Gaps summed over
/// tiles are left out: they are not memory in use (the fullest tile's are named beside it).
fn categories_line(categories: &BTreeMap<&'static str, u64>) -> String {
    MemoryCategory::ALL
        .into_iter()
        .filter(|&c| c != MemoryCategory::Gaps)
        .filter_map(|c| match categories.get(c.key()) {
            Some(&b) if b > 0 => Some(format!("{} {}", c.key(), bytes(b))),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cycles by phase over one update's stage runs (M of each) and its all-reduce and update,
/// before pipeline overlap.
/// The pipeline's cycles beyond its micro-batches at steady state: the fill and drain.
fn ramp_cycles(e: &SystemEstimate) -> u64 {
    let steady = e.steady_cycles_per_micro_batch * e.accumulation as f64;
    (e.pipeline_cycles as f64 - steady).max(0.0).round() as u64
}

fn cycles_by_phase(e: &SystemEstimate) -> BTreeMap<&'static str, u64> {
    let mut phases: BTreeMap<&'static str, u64> = BTreeMap::new();
    let m = e.accumulation as u64;
    for s in &e.stages {
        for c in [&s.forward_phases, &s.backward_phases] {
            *phases.entry("compute").or_default() += c.compute * m;
            *phases.entry("exchange").or_default() += c.exchange * m;
            *phases.entry("sync").or_default() += c.sync * m;
            *phases.entry("host_streams").or_default() += c.host_streams * m;
            *phases.entry("remote_buffers").or_default() += c.remote_buffers * m;
        }
    }
    *phases.entry("all_reduce").or_default() += e.all_reduce_cycles;
    *phases.entry("weight_update").or_default() += e.weight_update_cycles;
    phases
}

/// Memory and cycles of one ONNX node (a layer), as PopVision's operation summary gives
/// them.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct LayerRow {
    /// The ONNX node.
    pub name: String,
    /// Its op type.
    pub op: String,
    /// Its pipeline stage.
    pub stage: usize,
    /// Bytes of the weights and state it holds.
    pub weight_bytes: u64,
    /// Bytes of the tensors it makes (forward).
    pub activation_bytes: u64,
    /// Forward cycles per micro-batch (its compute sets).
    pub forward_cycles: u64,
    /// Backward cycles per micro-batch: its gradient rule's compute sets and exchanges, its
    /// recomputation and its weights' accumulation; the four parts below.
    pub backward_cycles: u64,
    /// Of the backward: its gradient rule's compute sets and syncs.
    #[serde(default)]
    pub backward_gradient_cycles: u64,
    /// Of the backward: the recomputation of its forward pass (`X/recompute`).
    #[serde(default)]
    pub backward_recompute_cycles: u64,
    /// Of the backward: the exchanges of its gradient, recomputation and accumulation.
    #[serde(default)]
    pub backward_exchange_cycles: u64,
    /// Of the backward: its weights' gradient accumulation and updates.
    #[serde(default)]
    pub backward_update_cycles: u64,
    /// The code its steps (forward, backward and update) add, summed over its IPU's tiles:
    /// vertex state, exchange code and control code, as PopVision's program tree shows them.
    #[serde(default)]
    pub code: tessera_sim::memory::NodeCode,
}
