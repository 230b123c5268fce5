//! The machine: IPU generations, their published figures, custom machines and multi-IPU systems.
//!
//! Figures come from Graphcore's datasheets, Hot Chips talks, Poplar's printed target summaries
//! and the public poplibs sources (see the project's ARCH.md). Each preset constant carries a
//! comment naming its source; "vendor" marks a published figure, "arithmetic" a figure derived
//! from published ones, and "estimate" a guess.

use core::fmt;
use core::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cost::Codelets;
use crate::pod::{PodFamily, PodNetwork};

/// An IPU generation whose published figures [`IpuConfig::preset`] knows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Preset {
    /// Colossus Mk1 (GC2, Poplar's "ipu1"): 1216 tiles, 256 KiB each, 1.6 GHz.
    Mk1,
    /// Colossus Mk2 (GC200, Poplar's "ipu2"): 1472 tiles, 624 KiB each, 1.325 GHz.
    #[default]
    Mk2,
    /// Bow IPU: the Mk2 tile array clocked at 1.85 GHz.
    Bow,
    /// C600: Graphcore's PCIe card, one Mk2 IPU (with fp8) clocked to the card's 280 TFLOP/s
    /// fp16 (1.486 GHz), its host link and remote buffers over the card's PCIe.
    C600,
}

impl Preset {
    /// Every preset, in generation order.
    pub const ALL: [Preset; 4] = [Preset::Mk1, Preset::Mk2, Preset::Bow, Preset::C600];

    /// The lower-case name that [`FromStr`] accepts and [`fmt::Display`] prints.
    pub const fn name(self) -> &'static str {
        match self {
            Preset::Mk1 => "mk1",
            Preset::Mk2 => "mk2",
            Preset::Bow => "bow",
            Preset::C600 => "c600",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A preset name that is not `mk1`, `mk2`, `bow` or `c600`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown IPU preset `{name}`; valid presets are mk1, mk2, bow, c600")]
pub struct UnknownPreset {
    /// The name that was given.
    pub name: String,
}

impl FromStr for Preset {
    type Err = UnknownPreset;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownPreset { name: s.to_owned() })
    }
}

/// A machine description that does not make sense.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MachineError {
    /// A count or size that must be at least one is zero.
    #[error("machine field `{field}` is 0; it must be at least 1")]
    Zero {
        /// The field's name.
        field: &'static str,
    },
    /// A real-valued figure is NaN, infinite, zero or negative.
    #[error("machine field `{field}` is {value}; it must be finite and greater than 0")]
    NotPositiveFinite {
        /// The field's name.
        field: &'static str,
        /// The offending value.
        value: f64,
    },
    /// A region of tile memory that starts at or beyond the end of the tile's SRAM.
    #[error("machine field `{field}` is {value}; it must be below sram_bytes_per_tile ({sram})")]
    BeyondSram {
        /// The field's name.
        field: &'static str,
        /// The offending value.
        value: u64,
        /// SRAM per tile.
        sram: u64,
    },
}

/// One IPU's hardware figures.
///
/// Start from [`IpuConfig::preset`] and change public fields (or use the `with_*` builders)
/// to describe a custom machine; [`IpuConfig::validate`] checks the result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IpuConfig {
    /// Tiles per IPU.
    pub tiles: u32,
    /// SRAM per tile in bytes (code, vertex state, exchange buffers and tensors all share it).
    pub sram_bytes_per_tile: u64,
    /// Tile clock in Hz.
    pub clock_hz: f64,
    /// Hardware worker contexts per tile (the barrel scheduler's worker slots).
    pub worker_contexts: u32,
    /// Accumulating Matrix Product (AMP) multiply-accumulates per tile per cycle, fp16 inputs:
    /// the vendor's fp16 peak, which needs fp16 partial sums (peak FLOP/s are figured from it).
    pub amp_macs_per_cycle_fp16: u32,
    /// AMP multiply-accumulates per tile per cycle, fp16 inputs with fp32 partial sums: what
    /// matmuls and convolutions use, as their partials are fp32 (poplibs' default partials
    /// type). Reports written before the field existed read as 32, every preset's figure.
    #[serde(default = "fp16_fp32_partials_default")]
    pub amp_macs_per_cycle_fp16_fp32_partials: u32,
    /// AMP multiply-accumulates per tile per cycle, fp32.
    pub amp_macs_per_cycle_fp32: u32,
    /// Where a tile's interleaved memory begins, in bytes from the bottom of its SRAM: the
    /// region from here to the top is interleaved. Data that must be interleaved (the AMP's
    /// partial sums) sits at or above it, so a tile holding any has a gap below it that its
    /// other data does not fill. 0 makes the whole SRAM interleaved: no gaps. Machine files and
    /// reports written without the field read as 0.
    #[serde(default)]
    pub interleaved_region_start_bytes: u64,
    /// fp32 elements per worker vector instruction.
    pub vector_width_fp32: u32,
    /// fp16 elements per worker vector instruction.
    pub vector_width_fp16: u32,
    /// Bytes a tile sends or receives per cycle over the exchange.
    pub exchange_bytes_per_cycle_per_tile: u32,
    /// Fixed cycles added to every exchange phase.
    pub exchange_overhead_cycles: u64,
    /// Cycles for an on-chip sync of all tiles.
    pub sync_cycles: u64,
    /// Nanoseconds per hop of a cross-IPU sync (each way).
    pub inter_ipu_sync_ns_per_hop: f64,
    /// IPU-Links per IPU.
    pub ipu_links: u32,
    /// Bandwidth of one IPU-Link in one direction, bytes per second.
    pub link_bytes_per_second_per_direction: f64,
    /// Bandwidth of the host link (PCIe) in one direction, bytes per second.
    pub host_link_bytes_per_second_per_direction: f64,
    /// Streaming memory (remote buffers) available to one IPU, bytes.
    pub streaming_memory_bytes: u64,
    /// IPU-Links between two neighbouring IPUs (pipeline stages and ring all-reduces use them).
    pub links_to_neighbour: u32,
    /// Bandwidth of remote-buffer copies to and from streaming memory, per IPU, bytes/s.
    pub streaming_memory_bytes_per_second: f64,
    /// The figures of the machine's codelets (vertex cycle costs, the compute-set overhead, the
    /// AMP's input groups), which every cost of [`crate::cost`] reads: every preset carries
    /// [`Codelets::COLOSSUS`], and a generation with other codelet timings carries its own
    /// table. Reports written without the field read as the Colossus table. (A machine's key
    /// for the plan caches and layouts, `planner::machine_key`, leaves the Colossus table out
    /// of its description, so it stays second to last.)
    #[serde(default)]
    pub codelets: Codelets,
    /// The IPU-POD network the IPU sits in: its IPU-Link domain, its machine's gateway and
    /// GW-Links, which collectives over more replicas than one domain holds cross
    /// ([`crate::pod`]). `None` for IPUs on PCIe cards (Mk1's C2, the C600), whose replicas
    /// all share IPU-Links. Machine files and reports written without the field read as
    /// `None`. (The last field: no plan or layout depends on it, and `planner::machine_key`
    /// leaves it out.)
    #[serde(default)]
    pub pod: Option<PodNetwork>,
}

/// [`IpuConfig::amp_macs_per_cycle_fp16_fp32_partials`] of a report written without it.
fn fp16_fp32_partials_default() -> u32 {
    32
}

impl Default for IpuConfig {
    /// The default preset's figures ([`Preset::Mk2`]).
    fn default() -> Self {
        IpuConfig::preset(Preset::default())
    }
}

impl IpuConfig {
    /// The published figures of one IPU generation.
    pub fn preset(preset: Preset) -> IpuConfig {
        match preset {
            Preset::Mk1 => mk1(),
            Preset::Mk2 => mk2(),
            Preset::Bow => bow(),
            Preset::C600 => c600(),
        }
    }

    /// Replaces the tile count.
    pub fn with_tiles(mut self, tiles: u32) -> Self {
        self.tiles = tiles;
        self
    }

    /// Replaces the SRAM per tile, in bytes. The interleaved region keeps its share of the
    /// tile: its start scales with the SRAM.
    pub fn with_sram_bytes_per_tile(mut self, bytes: u64) -> Self {
        let old = self.sram_bytes_per_tile.max(1);
        self.interleaved_region_start_bytes = u64::try_from(
            u128::from(self.interleaved_region_start_bytes) * u128::from(bytes) / u128::from(old),
        )
        .unwrap_or(0);
        self.sram_bytes_per_tile = bytes;
        self
    }

    /// Replaces the clock, in Hz.
    pub fn with_clock_hz(mut self, clock_hz: f64) -> Self {
        self.clock_hz = clock_hz;
        self
    }

    /// Replaces the number of worker contexts per tile.
    pub fn with_worker_contexts(mut self, workers: u32) -> Self {
        self.worker_contexts = workers;
        self
    }

    /// Replaces the on-chip sync cost, in cycles.
    pub fn with_sync_cycles(mut self, cycles: u64) -> Self {
        self.sync_cycles = cycles;
        self
    }

    /// Replaces the fixed exchange overhead, in cycles.
    pub fn with_exchange_overhead_cycles(mut self, cycles: u64) -> Self {
        self.exchange_overhead_cycles = cycles;
        self
    }

    /// Checks that every count and size (the codelets' widths and group sizes among them) is at
    /// least one and every real figure is finite and positive; the error names the first field
    /// that is not.
    pub fn validate(&self) -> Result<(), MachineError> {
        let counts: [(&'static str, u64); 13] = [
            ("tiles", self.tiles.into()),
            ("sram_bytes_per_tile", self.sram_bytes_per_tile),
            ("worker_contexts", self.worker_contexts.into()),
            (
                "amp_macs_per_cycle_fp16",
                self.amp_macs_per_cycle_fp16.into(),
            ),
            (
                "amp_macs_per_cycle_fp16_fp32_partials",
                self.amp_macs_per_cycle_fp16_fp32_partials.into(),
            ),
            (
                "amp_macs_per_cycle_fp32",
                self.amp_macs_per_cycle_fp32.into(),
            ),
            ("vector_width_fp32", self.vector_width_fp32.into()),
            ("vector_width_fp16", self.vector_width_fp16.into()),
            (
                "exchange_bytes_per_cycle_per_tile",
                self.exchange_bytes_per_cycle_per_tile.into(),
            ),
            ("sync_cycles", self.sync_cycles),
            ("ipu_links", self.ipu_links.into()),
            ("streaming_memory_bytes", self.streaming_memory_bytes),
            ("links_to_neighbour", self.links_to_neighbour.into()),
        ];
        // exchange_overhead_cycles may be 0: an idealised exchange is a legitimate machine, and
        // so may a codelet's cycles; its widths and group sizes divide.
        for (field, value) in counts.into_iter().chain(self.codelets.sizes()) {
            if value == 0 {
                return Err(MachineError::Zero { field });
            }
        }
        let reals: [(&'static str, f64); 5] = [
            ("clock_hz", self.clock_hz),
            ("inter_ipu_sync_ns_per_hop", self.inter_ipu_sync_ns_per_hop),
            (
                "link_bytes_per_second_per_direction",
                self.link_bytes_per_second_per_direction,
            ),
            (
                "host_link_bytes_per_second_per_direction",
                self.host_link_bytes_per_second_per_direction,
            ),
            (
                "streaming_memory_bytes_per_second",
                self.streaming_memory_bytes_per_second,
            ),
        ];
        if self.interleaved_region_start_bytes >= self.sram_bytes_per_tile {
            return Err(MachineError::BeyondSram {
                field: "interleaved_region_start_bytes",
                value: self.interleaved_region_start_bytes,
                sram: self.sram_bytes_per_tile,
            });
        }
        for (field, value) in reals {
            if !(value.is_finite() && value > 0.0) {
                return Err(MachineError::NotPositiveFinite { field, value });
            }
        }
        match &self.pod {
            Some(pod) => pod.validate(),
            None => Ok(()),
        }
    }

    /// Bytes per cycle between two neighbouring IPUs, one way.
    pub fn neighbour_link_bytes_per_cycle(&self) -> f64 {
        self.link_bytes_per_second_per_direction * f64::from(self.links_to_neighbour)
            / self.clock_hz
    }

    /// Bytes per cycle of remote-buffer copies.
    pub fn streaming_memory_bytes_per_cycle(&self) -> f64 {
        self.streaming_memory_bytes_per_second / self.clock_hz
    }

    /// Peak fp16 FLOP/s (the vendor's figure, fp16 partials): tiles x clock x AMP MACs x 2.
    pub fn peak_flops_fp16(&self) -> f64 {
        f64::from(self.tiles) * self.clock_hz * f64::from(self.amp_macs_per_cycle_fp16) * 2.0
    }

    /// Peak fp32 FLOP/s: tiles x clock x AMP MACs x 2.
    pub fn peak_flops_fp32(&self) -> f64 {
        f64::from(self.tiles) * self.clock_hz * f64::from(self.amp_macs_per_cycle_fp32) * 2.0
    }

    /// SRAM of the whole IPU, in bytes.
    pub fn total_sram_bytes(&self) -> u64 {
        u64::from(self.tiles).saturating_mul(self.sram_bytes_per_tile)
    }

    /// Wall-clock seconds for a number of tile cycles.
    pub fn cycles_to_seconds(&self, cycles: u64) -> f64 {
        cycles as f64 / self.clock_hz
    }

    /// Cycles of the cross-IPU part of a sync over `num_ipus` IPUs:
    /// 2 x ceil(ns per hop x (1 + num_ipus / 4) in cycles), "there and back" (ARCH.md).
    ///
    /// `num_ipus / 4` is integer division: one extra hop per four IPUs.
    pub fn inter_ipu_sync_cycles(&self, num_ipus: usize) -> u64 {
        let hops = 1 + num_ipus / 4;
        // Multiply before dividing so whole-cycle results (15 ns x 1.6 GHz = 24) stay exact.
        let one_way = (self.inter_ipu_sync_ns_per_hop * hops as f64 * self.clock_hz / 1e9).ceil();
        // `as` saturates for out-of-range floats, so an absurd machine cannot panic here.
        (one_way as u64).saturating_mul(2)
    }
}

/// The published figures of the first generation (GC2, [`Preset::Mk1`]).
fn mk1() -> IpuConfig {
    IpuConfig {
        // vendor: GC2 datasheet / Hot Chips.
        tiles: 1216,
        // vendor: 256 KiB per tile (304 MiB per IPU).
        sram_bytes_per_tile: 256 * 1024,
        // vendor: GC2 datasheet, 1.6 GHz.
        clock_hz: 1.6e9,
        // vendor: 6 worker slots + supervisor (Hot Chips).
        worker_contexts: 6,
        // arithmetic: 124.5 TFLOP/s / (1216 tiles x 1.6 GHz x 2).
        amp_macs_per_cycle_fp16: 32,
        // arithmetic: 31.1 TFLOP/s / (1216 tiles x 1.6 GHz x 2).
        amp_macs_per_cycle_fp32: 8,
        // poplibs (SDK 2.0): the 16-conv-unit AMP vertex exists for half -> half and
        // float -> float only (`hasAssembly`, lib/poplin/codelets/ConvPartial1x1Out.cpp),
        // so fp16 inputs with fp32 partials use 8 conv units on every generation:
        // 16 x 8 MACs per 4-cycle pass (lib/poplin/PerformanceEstimation.hpp). Later
        // poplibs caps these units by the fp32 store bandwidth (tools/single_conv_layer.cpp).
        amp_macs_per_cycle_fp16_fp32_partials: 32,
        // data: poplibs' IPU Model benchmarks report a fullest tile of 131,072 B plus a
        // few partials for tiny AMP layers on Mk1 (docs/cost-model.md, "Interleaved
        // memory"): the top half of the 256 KiB is interleaved. No public source states it.
        interleaved_region_start_bytes: 131_072,
        // vendor: 64-bit data path, 2 x fp32 per instruction (Poplar target summary).
        vector_width_fp32: 2,
        // vendor: 64-bit data path, 4 x fp16 per instruction (Poplar target summary).
        vector_width_fp16: 4,
        // vendor: 4 bytes/cycle/tile exchange (Poplar target summary).
        exchange_bytes_per_cycle_per_tile: 4,
        // "of the order of 100 cycles" fixed exchange overhead (ARCH.md); poplibs models a
        // small exchange the same way (`fixedOverheadExchangeCycles`, CTCLossPlan.cpp).
        exchange_overhead_cycles: 100,
        // estimate: on-chip sync, poplibs' planners assume about 90 cycles.
        sync_cycles: 90,
        // poplibs: 15 ns per hop of a cross-IPU sync.
        inter_ipu_sync_ns_per_hop: 15.0,
        // vendor: 10 IPU-Links per GC2.
        ipu_links: 10,
        // arithmetic: vendor 64 GB/s bidirectional per link, so 32 GB/s each way.
        link_bytes_per_second_per_direction: 32e9,
        // arithmetic: vendor PCIe Gen4 x16, 64 GB/s bidirectional, so 32 GB/s each way.
        host_link_bytes_per_second_per_direction: 32e9,
        // estimate: Mk1 remote buffers live in host memory; 64 GB per IPU assumed.
        streaming_memory_bytes: 64_000_000_000,
        // vendor: 3 IPU-Links between the two IPUs of a C2 card.
        links_to_neighbour: 3,
        // estimate: remote buffers in host memory, over PCIe (32 GB/s each way) shared
        // by the card's two IPUs: 16 GB/s.
        streaming_memory_bytes_per_second: 16e9,
        // poplibs: Mk1, Mk2 and Bow run the same poplibs codelets, priced by the same
        // estimators (docs/cost-model.md, "Constants and their sources").
        codelets: Codelets::COLOSSUS,
        // vendor: C2 PCIe cards in a server, no gateway.
        pod: None,
    }
}

/// The published figures of the second generation (GC200, [`Preset::Mk2`]).
fn mk2() -> IpuConfig {
    IpuConfig {
        // vendor: GC200 datasheet.
        tiles: 1472,
        // vendor: 624 KiB = 638,976 B per tile (900 MB per IPU).
        sram_bytes_per_tile: 638_976,
        // vendor: GC200, 1.325 GHz (1.33 GHz seen on devices).
        clock_hz: 1.325e9,
        // vendor: 6 worker slots + supervisor (Hot Chips 33).
        worker_contexts: 6,
        // arithmetic: 250 TFLOP/s / (1472 tiles x 1.325 GHz x 2).
        amp_macs_per_cycle_fp16: 64,
        // arithmetic: 62.5 TFLOP/s / (1472 tiles x 1.325 GHz x 2).
        amp_macs_per_cycle_fp32: 16,
        // poplibs (SDK 2.0): the 16-conv-unit AMP vertex exists for half -> half and
        // float -> float only (`hasAssembly`, lib/poplin/codelets/ConvPartial1x1Out.cpp),
        // so fp16 inputs with fp32 partials use 8 conv units on every generation:
        // 16 x 8 MACs per 4-cycle pass (lib/poplin/PerformanceEstimation.hpp). Later
        // poplibs caps these units by the fp32 store bandwidth (tools/single_conv_layer.cpp).
        amp_macs_per_cycle_fp16_fp32_partials: 32,
        // data: poplibs' IPU Model benchmarks report a fullest tile of 212,992 B plus a
        // few partials for tiny AMP layers on Mk2 (docs/cost-model.md, "Interleaved
        // memory"): the top two thirds of the 624 KiB are interleaved. No public source
        // states it.
        interleaved_region_start_bytes: 212_992,
        // vendor: 2 x fp32 per instruction (Poplar target summary).
        vector_width_fp32: 2,
        // vendor: 4 x fp16 per instruction (Poplar target summary).
        vector_width_fp16: 4,
        // vendor: 4 bytes/cycle/tile exchange (Poplar target summary; 8 TB/s aggregate).
        exchange_bytes_per_cycle_per_tile: 4,
        // "of the order of 100 cycles" fixed exchange overhead (ARCH.md); poplibs models a
        // small exchange the same way (`fixedOverheadExchangeCycles`, CTCLossPlan.cpp).
        exchange_overhead_cycles: 100,
        // estimate: on-chip sync, poplibs' planners assume about 90 cycles.
        sync_cycles: 90,
        // poplibs: 15 ns per hop of a cross-IPU sync.
        inter_ipu_sync_ns_per_hop: 15.0,
        // vendor: 10 IPU-Links per GC200.
        ipu_links: 10,
        // arithmetic: vendor 320 GB/s over 10 links, read as bidirectional: 16 GB/s each way.
        link_bytes_per_second_per_direction: 16e9,
        // arithmetic: vendor PCIe Gen4 x16, 64 GB/s bidirectional, so 32 GB/s each way.
        host_link_bytes_per_second_per_direction: 32e9,
        // arithmetic: vendor 448 GB per IPU-M2000 (4 IPUs), so 112 GB per IPU.
        streaming_memory_bytes: 112_000_000_000,
        // estimate: IPU-M2000 IPUs form a ring; 2 links to each neighbour assumed.
        links_to_neighbour: 2,
        // estimate: IPU-M2000 streaming memory (DDR4 behind the gateway), about 20 GB/s
        // per IPU.
        streaming_memory_bytes_per_second: 20e9,
        // poplibs: the same codelets as Mk1 and Bow.
        codelets: Codelets::COLOSSUS,
        // vendor: IPU-M2000 machines in IPU-PODs (crate::pod).
        pod: Some(PodNetwork::machines(PodFamily::IpuPod)),
    }
}

/// The published figures of the Bow IPU ([`Preset::Bow`]).
fn bow() -> IpuConfig {
    IpuConfig {
        // vendor: Bow IPU datasheet.
        tiles: 1472,
        // vendor: 624 KiB = 638,976 B per tile.
        sram_bytes_per_tile: 638_976,
        // vendor: Bow IPU, 1.85 GHz.
        clock_hz: 1.85e9,
        // vendor: 6 worker slots + supervisor.
        worker_contexts: 6,
        // arithmetic: 348.6 TFLOP/s / (1472 tiles x 1.85 GHz x 2).
        amp_macs_per_cycle_fp16: 64,
        // arithmetic: 87.1 TFLOP/s / (1472 tiles x 1.85 GHz x 2).
        amp_macs_per_cycle_fp32: 16,
        // poplibs (SDK 2.0): the 16-conv-unit AMP vertex exists for half -> half and
        // float -> float only (`hasAssembly`, lib/poplin/codelets/ConvPartial1x1Out.cpp),
        // so fp16 inputs with fp32 partials use 8 conv units on every generation:
        // 16 x 8 MACs per 4-cycle pass (lib/poplin/PerformanceEstimation.hpp). Later
        // poplibs caps these units by the fp32 store bandwidth (tools/single_conv_layer.cpp).
        amp_macs_per_cycle_fp16_fp32_partials: 32,
        // inference: the Bow tile is the Mk2 tile (same SRAM), so the same region as Mk2.
        interleaved_region_start_bytes: 212_992,
        // vendor: 2 x fp32 per instruction (Poplar target summary).
        vector_width_fp32: 2,
        // vendor: 4 x fp16 per instruction (Poplar target summary).
        vector_width_fp16: 4,
        // vendor: 4 bytes/cycle/tile exchange (Poplar target summary).
        exchange_bytes_per_cycle_per_tile: 4,
        // "of the order of 100 cycles" fixed exchange overhead (ARCH.md); poplibs models a
        // small exchange the same way (`fixedOverheadExchangeCycles`, CTCLossPlan.cpp).
        exchange_overhead_cycles: 100,
        // estimate: on-chip sync, poplibs' planners assume about 90 cycles.
        sync_cycles: 90,
        // poplibs: 15 ns per hop of a cross-IPU sync.
        inter_ipu_sync_ns_per_hop: 15.0,
        // vendor: 10 IPU-Links per Bow IPU.
        ipu_links: 10,
        // arithmetic: vendor 512 Gbit/s = 64 GB/s per link, read as bidirectional: 32 GB/s each way.
        link_bytes_per_second_per_direction: 32e9,
        // arithmetic: vendor PCIe Gen4 x16, 64 GB/s bidirectional, so 32 GB/s each way.
        host_link_bytes_per_second_per_direction: 32e9,
        // arithmetic: vendor 256 GB per Bow-2000 (4 IPUs), so 64 GB per IPU.
        streaming_memory_bytes: 64_000_000_000,
        // estimate: as the IPU-M2000, 2 links to each neighbour.
        links_to_neighbour: 2,
        // estimate: as the IPU-M2000, about 20 GB/s per IPU.
        streaming_memory_bytes_per_second: 20e9,
        // poplibs: the same codelets as Mk1 and Mk2.
        codelets: Codelets::COLOSSUS,
        // vendor: Bow-2000 machines in Bow Pods (crate::pod).
        pod: Some(PodNetwork::machines(PodFamily::BowPod)),
    }
}

/// The published figures of the C600 PCIe card ([`Preset::C600`]): the Mk2 IPU's tile array
/// and links at the card's clock, with the host and streaming memory behind its PCIe link.
fn c600() -> IpuConfig {
    IpuConfig {
        // arithmetic: 280 TFLOP/s fp16 (ByteMLPerf's IPU backend README, from the card's
        // datasheet) / (1472 tiles x 64 MACs x 2) = 1.486 GHz.
        clock_hz: 1.486e9,
        // vendor: the card exposes 4 IPU-Links, "a total of 1 Tbps bi-directional bandwidth"
        // (ByteMLPerf's IPU backend README).
        ipu_links: 4,
        // arithmetic: 1 Tbps over 4 links, read as bidirectional: 15.625 GB/s each way.
        link_bytes_per_second_per_direction: 15.625e9,
        // vendor: "each pair of cards linked together with an IPU-Link cable carrying 2
        // IPU-Links" (ByteMLPerf's IPU backend README).
        links_to_neighbour: 2,
        // vendor: "Dual PCIe Gen4 8-lane interfaces" (ByteMLPerf's IPU backend README), 16 GB/s
        // each way each: 32 GB/s each way.
        host_link_bytes_per_second_per_direction: 32e9,
        // estimate: the card has no memory of its own beside the IPU (C600 datasheet), so
        // remote buffers live in the host's memory: 64 GB per card assumed.
        streaming_memory_bytes: 64_000_000_000,
        // estimate: remote buffers in host memory reached over the card's PCIe links, one IPU
        // per card: 32 GB/s.
        streaming_memory_bytes_per_second: 32e9,
        // vendor: a PCIe card, no gateway: cards join over IPU-Link cables only.
        pod: None,
        // vendor: the GC200's tiles, SRAM, workers, AMP and exchange ("Graphcore's Mk2 IPU",
        // C600 datasheet), and the same codelets.
        ..mk2()
    }
}

/// Several identical IPUs working as one system (a pipeline or a set of replicas).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SystemConfig {
    /// The figures of each IPU.
    pub ipu: IpuConfig,
    /// How many IPUs the system has.
    pub num_ipus: usize,
}

impl Default for SystemConfig {
    /// One IPU of the default preset.
    fn default() -> Self {
        SystemConfig {
            ipu: IpuConfig::default(),
            num_ipus: 1,
        }
    }
}

impl SystemConfig {
    /// `num_ipus` IPUs of one preset.
    pub fn preset(preset: Preset, num_ipus: usize) -> SystemConfig {
        SystemConfig {
            ipu: IpuConfig::preset(preset),
            num_ipus,
        }
    }

    /// Checks the IPU's figures and that the system has at least one IPU.
    pub fn validate(&self) -> Result<(), MachineError> {
        if self.num_ipus == 0 {
            return Err(MachineError::Zero { field: "num_ipus" });
        }
        self.ipu.validate()
    }

    /// Cycles of one sync of the whole system: the on-chip sync alone for one IPU, plus the
    /// cross-IPU sync when there are several.
    pub fn sync_cycles(&self) -> u64 {
        if self.num_ipus <= 1 {
            self.ipu.sync_cycles
        } else {
            self.ipu
                .sync_cycles
                .saturating_add(self.ipu.inter_ipu_sync_cycles(self.num_ipus))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn within_1pct(got: f64, want: f64) -> bool {
        ((got / want) - 1.0).abs() < 0.01
    }

    #[test]
    fn presets_validate() {
        for p in Preset::ALL {
            IpuConfig::preset(p).validate().unwrap();
            SystemConfig::preset(p, 16).validate().unwrap();
        }
        assert_eq!(IpuConfig::default(), IpuConfig::preset(Preset::Mk2));
        assert_eq!(Preset::default(), Preset::Mk2);
    }

    #[test]
    fn peak_flops_match_vendor_figures() {
        let want = [
            (Preset::Mk1, 124.5e12, 31.1e12),
            (Preset::Mk2, 250e12, 62.5e12),
            (Preset::Bow, 348.6e12, 87.1e12),
            (Preset::C600, 280e12, 70e12),
        ];
        for (p, fp16, fp32) in want {
            let c = IpuConfig::preset(p);
            assert!(within_1pct(c.peak_flops_fp16(), fp16), "{p} fp16");
            assert!(within_1pct(c.peak_flops_fp32(), fp32), "{p} fp32");
        }
    }

    #[test]
    fn vendor_memory_figures() {
        assert_eq!(IpuConfig::preset(Preset::Mk2).sram_bytes_per_tile, 638_976);
        assert_eq!(IpuConfig::preset(Preset::Mk1).sram_bytes_per_tile, 262_144);
        assert_eq!(IpuConfig::preset(Preset::Mk1).tiles, 1216);
        // 1472 x 624 KiB = 897 MiB, the vendor's "900 MB" per Mk2 IPU.
        let mk2 = IpuConfig::preset(Preset::Mk2).total_sram_bytes();
        assert_eq!(mk2, 1472 * 638_976);
        assert_eq!(mk2, 897 * 1024 * 1024);
        // 448 GB per 4-IPU IPU-M2000; 256 GB per 4-IPU Bow-2000.
        assert_eq!(
            4 * IpuConfig::preset(Preset::Mk2).streaming_memory_bytes,
            448_000_000_000
        );
        assert_eq!(
            4 * IpuConfig::preset(Preset::Bow).streaming_memory_bytes,
            256_000_000_000
        );
    }

    #[test]
    fn link_figures() {
        let mk1 = IpuConfig::preset(Preset::Mk1);
        assert_eq!(mk1.link_bytes_per_second_per_direction * 2.0, 64e9);
        let mk2 = IpuConfig::preset(Preset::Mk2);
        let total = mk2.link_bytes_per_second_per_direction * 2.0 * f64::from(mk2.ipu_links);
        assert_eq!(total, 320e9);
        let bow = IpuConfig::preset(Preset::Bow);
        assert_eq!(bow.link_bytes_per_second_per_direction * 2.0 * 8.0, 512e9);
        // C600: 1 Tbps bidirectional over its 4 links, 2 to each neighbouring card.
        let c600 = IpuConfig::preset(Preset::C600);
        let bits = c600.link_bytes_per_second_per_direction * 2.0 * 8.0 * f64::from(c600.ipu_links);
        assert_eq!(bits, 1e12);
        assert_eq!(c600.links_to_neighbour, 2);
        for p in Preset::ALL {
            let c = IpuConfig::preset(p);
            assert_eq!(c.host_link_bytes_per_second_per_direction * 2.0, 64e9);
        }
    }

    #[test]
    fn cycles_to_seconds_uses_clock() {
        let c = IpuConfig::preset(Preset::Mk1);
        assert_eq!(c.cycles_to_seconds(1_600_000_000), 1.0);
        assert_eq!(c.cycles_to_seconds(0), 0.0);
    }

    #[test]
    fn inter_ipu_sync_follows_hops() {
        // Mk1: 15 ns = 24 cycles exactly at 1.6 GHz.
        let mk1 = IpuConfig::preset(Preset::Mk1);
        assert_eq!(mk1.inter_ipu_sync_cycles(2), 2 * 24);
        assert_eq!(mk1.inter_ipu_sync_cycles(4), 2 * 48);
        assert_eq!(mk1.inter_ipu_sync_cycles(8), 2 * 72);
        // Mk2: 15 ns x 1.325 GHz = 19.875, rounded up to 20.
        let mk2 = IpuConfig::preset(Preset::Mk2);
        assert_eq!(mk2.inter_ipu_sync_cycles(2), 40);
        // 30 ns x 1.325 GHz = 39.75 -> 40.
        assert_eq!(mk2.inter_ipu_sync_cycles(4), 80);
    }

    #[test]
    fn system_sync() {
        let one = SystemConfig::preset(Preset::Mk2, 1);
        assert_eq!(one.sync_cycles(), 90);
        let two = SystemConfig::preset(Preset::Mk2, 2);
        assert_eq!(two.sync_cycles(), 90 + 40);
        assert!(SystemConfig::preset(Preset::Mk2, 16).sync_cycles() > two.sync_cycles());
        assert_eq!(SystemConfig::default().num_ipus, 1);
    }

    #[test]
    fn validation_errors_name_the_field() {
        let e = IpuConfig::preset(Preset::Mk2)
            .with_tiles(0)
            .validate()
            .unwrap_err();
        assert_eq!(e, MachineError::Zero { field: "tiles" });
        assert!(e.to_string().contains("tiles"));

        let e = IpuConfig::preset(Preset::Bow)
            .with_clock_hz(f64::NAN)
            .validate()
            .unwrap_err();
        assert!(matches!(
            e,
            MachineError::NotPositiveFinite {
                field: "clock_hz",
                ..
            }
        ));
        assert!(e.to_string().contains("clock_hz"));

        let mut c = IpuConfig::preset(Preset::Mk1);
        c.host_link_bytes_per_second_per_direction = -1.0;
        let e = c.validate().unwrap_err();
        assert!(e
            .to_string()
            .contains("host_link_bytes_per_second_per_direction"));
        assert!(e.to_string().contains("-1"));

        let e = IpuConfig::preset(Preset::Mk2)
            .with_worker_contexts(0)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("worker_contexts"));

        let e = SystemConfig::preset(Preset::Mk2, 0).validate().unwrap_err();
        assert_eq!(e, MachineError::Zero { field: "num_ipus" });

        let mut s = SystemConfig::preset(Preset::Mk2, 2);
        s.ipu.sram_bytes_per_tile = 0;
        assert_eq!(
            s.validate(),
            Err(MachineError::Zero {
                field: "sram_bytes_per_tile"
            })
        );
    }

    #[test]
    fn custom_machine_builders() {
        let c = IpuConfig::preset(Preset::Mk2)
            .with_tiles(4)
            .with_sram_bytes_per_tile(1024)
            .with_clock_hz(1e9)
            .with_worker_contexts(4)
            .with_sync_cycles(10)
            .with_exchange_overhead_cycles(0);
        c.validate().unwrap();
        assert_eq!(c.total_sram_bytes(), 4096);
        assert_eq!(c.peak_flops_fp16(), 4.0 * 1e9 * 64.0 * 2.0);
        // The interleaved region keeps its share (the top two thirds on Mk2).
        assert_eq!(c.interleaved_region_start_bytes, 1024 / 3);
    }

    #[test]
    fn the_interleaved_region_starts_inside_the_tile() {
        for p in Preset::ALL {
            let c = IpuConfig::preset(p);
            assert!(c.interleaved_region_start_bytes < c.sram_bytes_per_tile);
        }
        let mut c = IpuConfig::preset(Preset::Mk1);
        c.interleaved_region_start_bytes = c.sram_bytes_per_tile;
        let e = c.validate().unwrap_err();
        assert_eq!(
            e,
            MachineError::BeyondSram {
                field: "interleaved_region_start_bytes",
                value: 262_144,
                sram: 262_144
            }
        );
        assert!(e.to_string().contains("interleaved_region_start_bytes"));
        c.interleaved_region_start_bytes = 0;
        c.validate().unwrap();
    }

    #[test]
    fn preset_parse_and_display() {
        for p in Preset::ALL {
            assert_eq!(p.to_string().parse::<Preset>(), Ok(p));
        }
        assert_eq!("MK2".parse::<Preset>(), Ok(Preset::Mk2));
        assert_eq!("Bow".parse::<Preset>(), Ok(Preset::Bow));
        assert_eq!("mK1".parse::<Preset>(), Ok(Preset::Mk1));
        let e = "mk3".parse::<Preset>().unwrap_err();
        assert_eq!(e.name, "mk3");
        let msg = e.to_string();
        assert!(
            msg.contains("mk3") && msg.contains("mk1, mk2, bow, c600"),
            "{msg}"
        );
        assert!("".parse::<Preset>().is_err());
    }

    proptest! {
        #[test]
        fn inter_ipu_sync_monotone_in_ipus(a in 1usize..4096, b in 1usize..4096) {
            let c = IpuConfig::preset(Preset::Mk2);
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(c.inter_ipu_sync_cycles(lo) <= c.inter_ipu_sync_cycles(hi));
        }

        #[test]
        fn unknown_names_never_parse(s in "[a-z0-9]{0,6}") {
            prop_assume!(!["mk1", "mk2", "bow"].contains(&s.as_str()));
            prop_assert!(s.parse::<Preset>().is_err());
        }
    }
}
