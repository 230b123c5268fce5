//! The estimate as the command shows it: one summary (fit, memory per IPU and category,
//! cycles by phase, per-stage rows) serialised as JSON or rendered as text.

use std::collections::BTreeMap;

use serde::Serialize;
use tessera_sim::machine::{IpuConfig, Preset};
use tessera_sim::system::SystemEstimate;

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
    /// SRAM per tile.
    pub tile_bytes_available: u64,
    /// Bytes by category over all tiles.
    pub categories: BTreeMap<&'static str, u64>,
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
    /// Micro-batches per weight update.
    pub gradient_accumulation_count: usize,
    /// Replicas.
    pub replicas: usize,
    /// IPUs in all.
    pub ipus_total: usize,
    /// Schedule.
    pub schedule: String,
    /// Per IPU of one replica.
    pub ipus: Vec<IpuMemorySummary>,
    /// Per stage.
    pub stages: Vec<StageSummary>,
}

impl EstimateSummary {
    /// Summarises `e` for `model` on `machine`.
    pub fn new(model: &str, ipu: Preset, machine: &IpuConfig, e: &SystemEstimate) -> Self {
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
                    max_tile: r.fullest_tiles.first().map_or(0, |t| t.tile),
                    tile_bytes_available: machine.sram_bytes_per_tile,
                    categories: c.categories().map(|(k, b)| (k.key(), b)).collect(),
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
            })
            .collect();
        EstimateSummary {
            model: model.to_string(),
            ipu: ipu.name().to_string(),
            fits: e.fits,
            out_of_memory: e.out_of_memory.as_ref().map(ToString::to_string),
            cycles_per_step: e.cycles_per_weight_update / m.max(1),
            cycles_per_weight_update: e.cycles_per_weight_update,
            cycles_per_execution: e.cycles_per_execution,
            pipeline_cycles: e.pipeline_cycles,
            all_reduce_cycles: e.all_reduce_cycles,
            weight_update_cycles: e.weight_update_cycles,
            cycles_by_phase: phases,
            seconds_per_weight_update: e.seconds_per_weight_update,
            samples_per_second: e.samples_per_second,
            gradient_accumulation_count: e.accumulation,
            replicas: e.replicas,
            ipus_total: e.ipus_total,
            schedule: e.schedule.clone(),
            ipus,
            stages,
        }
    }

    /// The human-readable report: fit, memory per IPU and category, fullest tiles, cycles by
    /// phase, per-stage rows.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let kib = |b: u64| b as f64 / 1024.0;
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
        let _ = writeln!(s, "fits: {}", if self.fits { "yes" } else { "NO" });
        let _ = writeln!(s, "memory per IPU:");
        for i in &self.ipus {
            let _ = writeln!(
                s,
                "  IPU {}: {:.1} MiB on {} tiles; fullest tile {} holds {:.1} of {:.1} KiB",
                i.ipu,
                i.bytes_used as f64 / 1_048_576.0,
                i.tiles_used,
                i.max_tile,
                kib(i.max_tile_bytes),
                kib(i.tile_bytes_available)
            );
            let cats: Vec<String> = i
                .categories
                .iter()
                .filter(|(_, &b)| b > 0)
                .map(|(k, &b)| format!("{k} {:.1} KiB", kib(b)))
                .collect();
            let _ = writeln!(s, "    {}", cats.join(", "));
        }
        let _ = writeln!(
            s,
            "cycles per step (micro-batch): {}; per weight update: {} (pipeline {}, all-reduce {}, weight update {}); per execution: {}",
            self.cycles_per_step,
            self.cycles_per_weight_update,
            self.pipeline_cycles,
            self.all_reduce_cycles,
            self.weight_update_cycles,
            self.cycles_per_execution
        );
        let phases: Vec<String> = self
            .cycles_by_phase
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(s, "cycles by phase (before overlap): {}", phases.join(", "));
        let _ = writeln!(
            s,
            "{:.1} us per weight update, {:.0} samples/s",
            self.seconds_per_weight_update * 1e6,
            self.samples_per_second
        );
        let _ = writeln!(
            s,
            "{:<6} {:>4} {:>10} {:>10} {:>7} {:>12} {:>14} {:>6}",
            "stage", "IPU", "fwd cyc", "bwd cyc", "stash", "stash bytes", "IPU bytes", "idle"
        );
        for st in &self.stages {
            let _ = writeln!(
                s,
                "{:<6} {:>4} {:>10} {:>10} {:>7} {:>12} {:>14} {:>5.1}%",
                st.stage,
                st.ipu,
                st.forward_cycles,
                st.backward_cycles,
                st.stash_depth,
                st.stash_bytes,
                st.ipu_bytes_used,
                st.idle_fraction * 100.0
            );
        }
        if let Some(oom) = &self.out_of_memory {
            let _ = writeln!(s, "{oom}");
        }
        s
    }
}
