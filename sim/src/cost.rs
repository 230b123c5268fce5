//! The vertex cost model: tile cycles of common vertices, exchanges and compute sets.
//!
//! Every function is pure: it reads an [`IpuConfig`] (worker contexts, vector widths, AMP MAC
//! rates, exchange figures) and an element type, and returns tile cycles. The shapes follow the
//! poplibs cycle estimators as paraphrased in ARCH.md ("Cost of common vertices"):
//!
//! - `W` = worker contexts ([`IpuConfig::worker_contexts`], 6 on every preset);
//! - `vw` = vector width of the element type (2 for fp32, 4 for fp16);
//! - a vertex over `n` elements gives each worker `ceil(n / W)` of them;
//! - the barrel scheduler issues each worker once every `W` cycles, so `W x` worker cycles are
//!   tile cycles when all workers are busy (and the same when fewer are: an idle slot is lost).
//!
//! Integer element types (`i32`, `u8`) are priced like fp32 (vector width, accumulator width,
//! AMP rate): the IPU's published figures cover only floats, so that is an estimate.
//!
//! The functions never panic and never overflow: arithmetic saturates at `u64::MAX`, and a
//! zero rate in an unvalidated [`IpuConfig`] is treated as one.

use tessera_core::DType;

use crate::machine::IpuConfig;

/// Supervisor cycles of an element-wise vertex (ARCH.md: "about a dozen cycles of supervisor
/// overhead"). Also used for unary vertices ("like binary").
pub const ELEMENTWISE_SUPERVISOR_CYCLES: u64 = 12;
/// Worker setup cycles of an element-wise vertex (ARCH.md: "about 26-29"; 28 is our pick in
/// that range, an estimate).
pub const ELEMENTWISE_WORKER_SETUP_CYCLES: u64 = 28;
/// Worker cycles per vector of an add, sub or mul (ARCH.md: "ceil(n_w / vw) x 3").
pub const BINARY_CYCLES_PER_VECTOR: u64 = 3;

/// Supervisor cycles of a scaled add, the SGD update (ARCH.md: "supervisor about 60 cycles").
pub const SCALED_ADD_SUPERVISOR_CYCLES: u64 = 60;
/// Worker setup cycles of a scaled add (ARCH.md: "W x (about 24 + 3 per vector)").
pub const SCALED_ADD_WORKER_SETUP_CYCLES: u64 = 24;
/// Worker cycles per vector of a scaled add (ARCH.md: "3 per vector").
pub const SCALED_ADD_CYCLES_PER_VECTOR: u64 = 3;

/// Fixed cycles of a cast vertex (ARCH.md: "about 12 + W x (37 + 2 per vector of 4)").
pub const CAST_SUPERVISOR_CYCLES: u64 = 12;
/// Worker setup cycles of a cast vertex (ARCH.md: "37").
pub const CAST_WORKER_SETUP_CYCLES: u64 = 37;
/// Worker cycles per vector of a cast (ARCH.md: "2 per vector of 4").
pub const CAST_CYCLES_PER_VECTOR: u64 = 2;
/// Elements per cast vector, whichever direction (ARCH.md: "per vector of 4").
pub const CAST_VECTOR_WIDTH: u64 = 4;

/// Worker cycles to start one output of a reduction (ARCH.md: "about 9 + (elements /
/// accumulator width) cycles per output").
pub const REDUCE_OUTPUT_SETUP_CYCLES: u64 = 9;
/// Further per-output overhead of a reduction (ARCH.md: "plus per-output overhead of about
/// 12 cycles").
pub const REDUCE_PER_OUTPUT_OVERHEAD_CYCLES: u64 = 12;
/// Elements a reduction accumulates per worker cycle in fp32 (ARCH.md: "accumulator width 4").
pub const REDUCE_ACCUMULATOR_WIDTH_FP32: u64 = 4;
/// Elements a reduction accumulates per worker cycle in fp16 (ARCH.md: "8 (fp16)").
pub const REDUCE_ACCUMULATOR_WIDTH_FP16: u64 = 8;

/// Worker setup cycles of an AMP (matmul / convolution partials) vertex (ARCH.md: "per worker
/// about 40 cycles of setup").
pub const AMP_WORKER_SETUP_CYCLES: u64 = 40;
/// Outputs per AMP block (ARCH.md: "block of 16 outputs x 16 inputs").
pub const AMP_BLOCK_OUTPUTS: u64 = 16;
/// Inputs (reduction depth) per AMP block (ARCH.md: "block of 16 outputs x 16 inputs").
pub const AMP_BLOCK_INPUTS: u64 = 16;
/// Bytes per cycle at which weights are loaded into the AMP (ARCH.md: "loading weights into
/// the AMP at 16 bytes per cycle", the 128-bit load).
pub const AMP_WEIGHT_LOAD_BYTES_PER_CYCLE: u64 = 16;

/// Supervisor cycles a compute set costs on every tile that runs it. ARCH.md says only that
/// such an overhead exists; 30 cycles is an estimate (control code to launch the workers and
/// enter the next sync), of the same order as one vertex's supervisor overhead.
pub const COMPUTE_SET_OVERHEAD_CYCLES: u64 = 30;

/// A unary element-wise operation, with its worker cycles per vector.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryKind {
    /// Copy (estimate: 2 cycles, one load and one store per vector).
    Copy,
    /// Multiply by a scalar (estimate: 3 cycles, the cost of a binary mul).
    Scale,
    /// ReLU (ARCH.md: "ReLU costs about 3 worker cycles per vector").
    Relu,
    /// Negation (estimate: 3 cycles, like ReLU).
    Neg,
    /// Absolute value (estimate: 3 cycles, like ReLU).
    Abs,
    /// Square (estimate: 3 cycles, a binary mul with itself).
    Square,
    /// Square root (estimate: 10 cycles, ARCH.md's cost of divide).
    Sqrt,
    /// Reciprocal (estimate: 10 cycles, ARCH.md's cost of divide).
    Reciprocal,
    /// Natural exponential (estimate: 6 cycles; ARCH.md says only "exp costs more" than ReLU,
    /// and the tile has a hardware exp instruction).
    Exp,
    /// Natural logarithm (estimate: 6 cycles, like exp).
    Log,
    /// Hyperbolic tangent (estimate: 8 cycles, a little more than exp).
    Tanh,
    /// Logistic sigmoid (estimate: 8 cycles, like tanh).
    Sigmoid,
    /// The error function (estimate: 12 cycles, a rational approximation: an exp and about
    /// four multiply-adds; no hardware instruction).
    Erf,
    /// GELU (estimate: 14 cycles, the tanh form: a tanh and about two vector multiply-adds;
    /// popnn has a GELU non-linearity vertex).
    Gelu,
    /// Clamp between two bounds (estimate: 3 cycles, a single clamp instruction per vector,
    /// like ReLU).
    Clip,
}

impl UnaryKind {
    /// Every unary kind.
    pub const ALL: [UnaryKind; 15] = [
        UnaryKind::Copy,
        UnaryKind::Scale,
        UnaryKind::Relu,
        UnaryKind::Neg,
        UnaryKind::Abs,
        UnaryKind::Square,
        UnaryKind::Sqrt,
        UnaryKind::Reciprocal,
        UnaryKind::Exp,
        UnaryKind::Log,
        UnaryKind::Tanh,
        UnaryKind::Sigmoid,
        UnaryKind::Erf,
        UnaryKind::Gelu,
        UnaryKind::Clip,
    ];

    /// Worker cycles per vector of this operation (see each variant for its source).
    pub const fn per_vector_cycles(self) -> u64 {
        match self {
            UnaryKind::Copy => 2,
            UnaryKind::Scale
            | UnaryKind::Relu
            | UnaryKind::Neg
            | UnaryKind::Abs
            | UnaryKind::Square
            | UnaryKind::Clip => 3,
            UnaryKind::Exp | UnaryKind::Log => 6,
            UnaryKind::Tanh | UnaryKind::Sigmoid => 8,
            UnaryKind::Sqrt | UnaryKind::Reciprocal => 10,
            UnaryKind::Erf => 12,
            UnaryKind::Gelu => 14,
        }
    }

    /// Tile cycles of this operation over `n` elements: [`elementwise_unary_cycles`] with this
    /// kind's per-vector cost.
    pub fn cycles(self, cfg: &IpuConfig, n: u64, dtype: DType) -> u64 {
        elementwise_unary_cycles(cfg, n, dtype, self.per_vector_cycles())
    }
}

fn workers(cfg: &IpuConfig) -> u64 {
    u64::from(cfg.worker_contexts.max(1))
}

/// Elements per worker vector instruction: fp16 uses the fp16 width, every other type the
/// fp32 width (integer types: an estimate).
pub fn vector_width(cfg: &IpuConfig, dtype: DType) -> u64 {
    let vw = match dtype {
        DType::F16 => cfg.vector_width_fp16,
        DType::F32 | DType::I32 | DType::U8 => cfg.vector_width_fp32,
    };
    u64::from(vw.max(1))
}

/// AMP multiply-accumulates per tile cycle for an element type: fp16 inputs use the rate with
/// fp32 partial sums (the partials of every matmul and convolution are fp32), every other type
/// the fp32 rate (integer types have no AMP path: an estimate).
pub fn amp_macs_per_cycle(cfg: &IpuConfig, dtype: DType) -> u64 {
    let macs = match dtype {
        DType::F16 => cfg.amp_macs_per_cycle_fp16_fp32_partials,
        DType::F32 | DType::I32 | DType::U8 => cfg.amp_macs_per_cycle_fp32,
    };
    u64::from(macs.max(1))
}

/// The shared shape of a vectorised vertex:
/// `supervisor + W x (setup + ceil(ceil(n / W) / width) x per_vector)`.
fn vectorised(
    cfg: &IpuConfig,
    supervisor: u64,
    setup: u64,
    per_vector: u64,
    n: u64,
    width: u64,
) -> u64 {
    let w = workers(cfg);
    let vectors = n.div_ceil(w).div_ceil(width.max(1));
    let per_worker = setup.saturating_add(vectors.saturating_mul(per_vector));
    supervisor.saturating_add(w.saturating_mul(per_worker))
}

/// Tile cycles of an element-wise add, sub or mul over `n` elements (ARCH.md: about a dozen
/// supervisor cycles plus `W x (26-29 + ceil(n_w / vw) x 3)`; about 1.5 tile cycles per fp32
/// element for large `n`).
pub fn elementwise_binary_cycles(cfg: &IpuConfig, n: u64, dtype: DType) -> u64 {
    vectorised(
        cfg,
        ELEMENTWISE_SUPERVISOR_CYCLES,
        ELEMENTWISE_WORKER_SETUP_CYCLES,
        BINARY_CYCLES_PER_VECTOR,
        n,
        vector_width(cfg, dtype),
    )
}

/// Tile cycles of an element-wise unary operation over `n` elements costing
/// `per_vector_cycles` worker cycles per vector (ARCH.md: "like binary"). See
/// [`UnaryKind::per_vector_cycles`] for the usual operations.
pub fn elementwise_unary_cycles(
    cfg: &IpuConfig,
    n: u64,
    dtype: DType,
    per_vector_cycles: u64,
) -> u64 {
    vectorised(
        cfg,
        ELEMENTWISE_SUPERVISOR_CYCLES,
        ELEMENTWISE_WORKER_SETUP_CYCLES,
        per_vector_cycles,
        n,
        vector_width(cfg, dtype),
    )
}

/// Tile cycles of a scaled add `a += s x b` over `n` elements, the SGD update (ARCH.md:
/// supervisor about 60 cycles plus `W x (about 24 + 3 per vector)`).
pub fn scaled_add_cycles(cfg: &IpuConfig, n: u64, dtype: DType) -> u64 {
    vectorised(
        cfg,
        SCALED_ADD_SUPERVISOR_CYCLES,
        SCALED_ADD_WORKER_SETUP_CYCLES,
        SCALED_ADD_CYCLES_PER_VECTOR,
        n,
        vector_width(cfg, dtype),
    )
}

/// Tile cycles of a cast between fp32 and fp16 over `n` elements, either direction (ARCH.md:
/// about `12 + W x (37 + 2 per vector of 4)`).
pub fn cast_cycles(cfg: &IpuConfig, n: u64) -> u64 {
    vectorised(
        cfg,
        CAST_SUPERVISOR_CYCLES,
        CAST_WORKER_SETUP_CYCLES,
        CAST_CYCLES_PER_VECTOR,
        n,
        CAST_VECTOR_WIDTH,
    )
}

/// Tile cycles of a reduction producing `outputs` values, each summing `elements_per_output`
/// inputs of type `dtype`.
///
/// ARCH.md: about `9 + elements / accumulator width` worker cycles per output (width 4 for
/// fp32, 8 for fp16) plus about 12 cycles of per-output overhead. The outputs are shared among
/// the workers (`ceil(outputs / W)` each, our reading), and worker cycles times `W` are tile
/// cycles.
pub fn reduce_cycles(cfg: &IpuConfig, outputs: u64, elements_per_output: u64, dtype: DType) -> u64 {
    let width = match dtype {
        DType::F16 => REDUCE_ACCUMULATOR_WIDTH_FP16,
        DType::F32 | DType::I32 | DType::U8 => REDUCE_ACCUMULATOR_WIDTH_FP32,
    };
    let w = workers(cfg);
    let per_output = (REDUCE_OUTPUT_SETUP_CYCLES + REDUCE_PER_OUTPUT_OVERHEAD_CYCLES)
        .saturating_add(elements_per_output.div_ceil(width));
    let per_worker = outputs.div_ceil(w).saturating_mul(per_output);
    w.saturating_mul(per_worker)
}

/// Worker cycles the AMP spends on one block of 16 outputs x 16 inputs:
/// `ceil(256 / AMP MACs per tile cycle)`.
///
/// ARCH.md gives 4 (fp16) and 8 (fp32) cycles per block. With W workers each issuing once every
/// W cycles, a block of 256 MACs every `c` worker cycles per worker runs `256 / c` MACs per
/// tile cycle; `c = 4` is the fp16 AMP's 64 MACs/cycle, but `c = 8` over a 16 x 16 block would
/// be 32 MACs/cycle, twice the vendor fp32 peak. The fp32 AMP's block has half the inputs
/// (16 x 8 in 8 cycles), so a 16 x 16 block costs 16 cycles. Deriving the cost from the MAC
/// rate keeps both ARCH.md figures and the vendor peaks, on every preset.
pub fn amp_cycles_per_block(cfg: &IpuConfig, dtype: DType) -> u64 {
    (AMP_BLOCK_OUTPUTS * AMP_BLOCK_INPUTS)
        .div_ceil(amp_macs_per_cycle(cfg, dtype))
        .max(1)
}

/// Tile cycles of one tile's matmul partial `[m, k] x [k, n]` on the AMP.
///
/// ARCH.md: per worker about 40 cycles of setup plus [`amp_cycles_per_block`] per block of 16
/// outputs x 16 inputs, times W, plus loading the `k x n` weights into the AMP at 16 bytes per
/// cycle. The `m` rows are shared among the workers (`ceil(m / W)` each, as poplibs splits
/// convolution partials by position); each row needs `ceil(n / 16) x ceil(k / 16)` blocks.
pub fn matmul_amp_cycles(cfg: &IpuConfig, m: u64, k: u64, n: u64, dtype: DType) -> u64 {
    let w = workers(cfg);
    let blocks_per_row = n
        .div_ceil(AMP_BLOCK_OUTPUTS)
        .saturating_mul(k.div_ceil(AMP_BLOCK_INPUTS));
    let blocks_per_worker = m.div_ceil(w).saturating_mul(blocks_per_row);
    let per_worker = AMP_WORKER_SETUP_CYCLES
        .saturating_add(blocks_per_worker.saturating_mul(amp_cycles_per_block(cfg, dtype)));
    let weight_bytes = k.saturating_mul(n).saturating_mul(dtype.size() as u64);
    let weight_load = weight_bytes.div_ceil(AMP_WEIGHT_LOAD_BYTES_PER_CYCLE);
    w.saturating_mul(per_worker).saturating_add(weight_load)
}

/// Cycles of one exchange phase whose busiest tile receives `bytes_received_by_busiest_tile`
/// bytes (ARCH.md: `ceil(bytes / (4 x share)) + overhead`).
///
/// `broadcast_pair` is true when the data is a broadcast received by both tiles of a
/// supertile pair, which goes at twice the rate (share 2). An exchange that moves nothing
/// costs nothing: no exchange phase is needed.
pub fn exchange_cycles(
    cfg: &IpuConfig,
    bytes_received_by_busiest_tile: u64,
    broadcast_pair: bool,
) -> u64 {
    if bytes_received_by_busiest_tile == 0 {
        return 0;
    }
    let share = if broadcast_pair { 2 } else { 1 };
    let rate = u64::from(cfg.exchange_bytes_per_cycle_per_tile.max(1)) * share;
    bytes_received_by_busiest_tile
        .div_ceil(rate)
        .saturating_add(cfg.exchange_overhead_cycles)
}

/// Supervisor cycles a compute set costs on every tile that runs it
/// ([`COMPUTE_SET_OVERHEAD_CYCLES`], an estimate).
pub const fn compute_set_overhead_cycles() -> u64 {
    COMPUTE_SET_OVERHEAD_CYCLES
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Preset;
    use proptest::prelude::*;

    fn mk2() -> IpuConfig {
        IpuConfig::preset(Preset::Mk2)
    }

    fn ratio(a: u64, b: u64) -> f64 {
        a as f64 / b as f64
    }

    fn near(got: f64, want: f64, tol: f64) -> bool {
        (got - want).abs() <= tol * want
    }

    #[test]
    fn binary_matches_the_formula() {
        let c = mk2();
        // 600 fp32 elements: 100 per worker, 50 vectors of 2.
        assert_eq!(
            elementwise_binary_cycles(&c, 600, DType::F32),
            12 + 6 * (28 + 50 * 3)
        );
        // 600 fp16 elements: 100 per worker, 25 vectors of 4.
        assert_eq!(
            elementwise_binary_cycles(&c, 600, DType::F16),
            12 + 6 * (28 + 25 * 3)
        );
        // Uneven split: 7 elements give one worker 2.
        assert_eq!(
            elementwise_binary_cycles(&c, 7, DType::F32),
            12 + 6 * (28 + 3)
        );
    }

    #[test]
    fn binary_is_about_one_and_a_half_cycles_per_fp32_element() {
        let n = 6_000_000;
        let per = ratio(elementwise_binary_cycles(&mk2(), n, DType::F32), n);
        assert!(near(per, 1.5, 0.01), "{per}");
    }

    #[test]
    fn doubling_elementwise_n_doubles_cycles() {
        let c = mk2();
        let n = 1 << 20;
        for dtype in [DType::F32, DType::F16] {
            let r = ratio(
                elementwise_binary_cycles(&c, 2 * n, dtype),
                elementwise_binary_cycles(&c, n, dtype),
            );
            assert!(near(r, 2.0, 0.01), "binary {dtype}: {r}");
            for kind in UnaryKind::ALL {
                let r = ratio(kind.cycles(&c, 2 * n, dtype), kind.cycles(&c, n, dtype));
                assert!(near(r, 2.0, 0.01), "{kind:?} {dtype}: {r}");
            }
            let r = ratio(
                scaled_add_cycles(&c, 2 * n, dtype),
                scaled_add_cycles(&c, n, dtype),
            );
            assert!(near(r, 2.0, 0.01), "scaled add {dtype}: {r}");
        }
        let r = ratio(cast_cycles(&c, 2 * n), cast_cycles(&c, n));
        assert!(near(r, 2.0, 0.01), "cast: {r}");
    }

    #[test]
    fn fp16_elementwise_is_cheaper_than_fp32() {
        let c = mk2();
        let n = 4096;
        assert!(
            elementwise_binary_cycles(&c, n, DType::F16)
                < elementwise_binary_cycles(&c, n, DType::F32)
        );
        assert!(scaled_add_cycles(&c, n, DType::F16) < scaled_add_cycles(&c, n, DType::F32));
        assert!(reduce_cycles(&c, 6, n, DType::F16) < reduce_cycles(&c, 6, n, DType::F32));
    }

    #[test]
    fn unary_costs_follow_arch() {
        let c = mk2();
        assert_eq!(UnaryKind::Relu.per_vector_cycles(), 3);
        assert!(UnaryKind::Exp.per_vector_cycles() > UnaryKind::Relu.per_vector_cycles());
        // ReLU costs what an add costs.
        assert_eq!(
            UnaryKind::Relu.cycles(&c, 1000, DType::F32),
            elementwise_binary_cycles(&c, 1000, DType::F32)
        );
        assert!(
            UnaryKind::Exp.cycles(&c, 1000, DType::F32)
                > UnaryKind::Relu.cycles(&c, 1000, DType::F32)
        );
        assert_eq!(
            elementwise_unary_cycles(&c, 600, DType::F16, 10),
            12 + 6 * (28 + 25 * 10)
        );
    }

    #[test]
    fn scaled_add_and_cast_match_the_formula() {
        let c = mk2();
        assert_eq!(
            scaled_add_cycles(&c, 600, DType::F32),
            60 + 6 * (24 + 50 * 3)
        );
        assert_eq!(cast_cycles(&c, 600), 12 + 6 * (37 + 25 * 2));
    }

    #[test]
    fn reduce_matches_the_formula() {
        let c = mk2();
        // 12 outputs -> 2 per worker; 64 fp32 elements -> 16 accumulations each.
        assert_eq!(reduce_cycles(&c, 12, 64, DType::F32), 6 * 2 * (9 + 12 + 16));
        assert_eq!(reduce_cycles(&c, 12, 64, DType::F16), 6 * 2 * (9 + 12 + 8));
        assert_eq!(reduce_cycles(&c, 0, 64, DType::F32), 0);
        let r = ratio(
            reduce_cycles(&c, 6, 1 << 20, DType::F32),
            reduce_cycles(&c, 6, 1 << 19, DType::F32),
        );
        assert!(near(r, 2.0, 0.01), "{r}");
    }

    #[test]
    fn amp_blocks_follow_arch_and_peaks() {
        let c = mk2();
        // fp16 inputs with fp32 partials: 8 conv units on every generation.
        assert_eq!(amp_cycles_per_block(&c, DType::F16), 8);
        assert_eq!(amp_cycles_per_block(&c, DType::F32), 16);
        // Mk1's AMP has half Mk2's fp32 rate and the same fp16-with-fp32-partials rate.
        let mk1 = IpuConfig::preset(Preset::Mk1);
        assert_eq!(amp_cycles_per_block(&mk1, DType::F16), 8);
        assert_eq!(amp_cycles_per_block(&mk1, DType::F32), 32);
    }

    #[test]
    fn matmul_matches_the_formula() {
        let c = mk2();
        // m = 12 -> 2 rows per worker; n = 32, k = 48 -> 2 x 3 blocks per row.
        let blocks = 2 * 2 * 3;
        let weights = (48 * 32 * 2) / 16;
        assert_eq!(
            matmul_amp_cycles(&c, 12, 48, 32, DType::F16),
            6 * (40 + blocks * 8) + weights
        );
    }

    #[test]
    fn large_matmul_runs_near_the_amp_peak() {
        for p in Preset::ALL {
            let c = IpuConfig::preset(p);
            for dtype in [DType::F16, DType::F32] {
                let (m, k, n) = (6 * 1000, 256, 256);
                let cycles = matmul_amp_cycles(&c, m, k, n, dtype);
                let macs_per_cycle = ratio(m * k * n, cycles);
                let peak = amp_macs_per_cycle(&c, dtype) as f64;
                assert!(
                    near(macs_per_cycle, peak, 0.02),
                    "{p} {dtype}: {macs_per_cycle}"
                );
            }
        }
    }

    #[test]
    fn fp16_matmul_is_cheaper_than_fp32() {
        for p in Preset::ALL {
            let c = IpuConfig::preset(p);
            for (m, k, n) in [(1, 1, 1), (16, 16, 16), (100, 300, 70), (1024, 1024, 1024)] {
                assert!(
                    matmul_amp_cycles(&c, m, k, n, DType::F16)
                        < matmul_amp_cycles(&c, m, k, n, DType::F32),
                    "{p} {m}x{k}x{n}"
                );
            }
        }
    }

    #[test]
    fn matmul_scales_with_m_and_n() {
        let c = mk2();
        let (m, k, n) = (1024, 256, 1024);
        for dtype in [DType::F16, DType::F32] {
            let base = matmul_amp_cycles(&c, m, k, n, dtype);
            let r_m = ratio(matmul_amp_cycles(&c, 2 * m, k, n, dtype), base);
            let r_n = ratio(matmul_amp_cycles(&c, m, k, 2 * n, dtype), base);
            let r_mn = ratio(matmul_amp_cycles(&c, 2 * m, k, 2 * n, dtype), base);
            assert!(near(r_m, 2.0, 0.02), "{dtype} m: {r_m}");
            assert!(near(r_n, 2.0, 0.02), "{dtype} n: {r_n}");
            assert!(near(r_mn, 4.0, 0.02), "{dtype} m and n: {r_mn}");
        }
    }

    #[test]
    fn exchange_matches_the_formula() {
        let c = mk2();
        assert_eq!(exchange_cycles(&c, 0, false), 0);
        assert_eq!(exchange_cycles(&c, 0, true), 0);
        assert_eq!(exchange_cycles(&c, 1, false), 1 + 100);
        assert_eq!(exchange_cycles(&c, 4000, false), 1000 + 100);
        assert_eq!(exchange_cycles(&c, 4000, true), 500 + 100);
    }

    #[test]
    fn broadcast_pairs_halve_the_transfer() {
        let c = mk2();
        let bytes = 1 << 20;
        let plain = exchange_cycles(&c, bytes, false);
        let pair = exchange_cycles(&c, bytes, true);
        assert!(pair < plain);
        let r = ratio(plain, pair);
        assert!(r > 1.9 && r <= 2.0, "{r}");
    }

    #[test]
    fn compute_set_overhead_is_positive() {
        assert_eq!(compute_set_overhead_cycles(), COMPUTE_SET_OVERHEAD_CYCLES);
        assert!(compute_set_overhead_cycles() > 0);
    }

    #[test]
    fn integer_types_are_priced_like_fp32() {
        let c = mk2();
        for dtype in [DType::I32, DType::U8] {
            assert_eq!(vector_width(&c, dtype), 2);
            assert_eq!(amp_macs_per_cycle(&c, dtype), 16);
            assert_eq!(
                elementwise_binary_cycles(&c, 1000, dtype),
                elementwise_binary_cycles(&c, 1000, DType::F32)
            );
        }
    }

    #[test]
    fn unvalidated_zero_rates_do_not_panic() {
        let mut c = mk2().with_worker_contexts(0);
        c.vector_width_fp32 = 0;
        c.amp_macs_per_cycle_fp32 = 0;
        c.exchange_bytes_per_cycle_per_tile = 0;
        assert!(elementwise_binary_cycles(&c, 100, DType::F32) > 0);
        assert!(matmul_amp_cycles(&c, 10, 10, 10, DType::F32) > 0);
        assert!(reduce_cycles(&c, 10, 10, DType::F32) > 0);
        assert!(exchange_cycles(&c, 10, false) > 0);
    }

    fn dtype_strategy() -> impl Strategy<Value = DType> {
        prop_oneof![
            Just(DType::F32),
            Just(DType::F16),
            Just(DType::I32),
            Just(DType::U8)
        ]
    }

    fn preset_strategy() -> impl Strategy<Value = Preset> {
        prop_oneof![Just(Preset::Mk1), Just(Preset::Mk2), Just(Preset::Bow)]
    }

    const MAX: u64 = 1 << 32;

    proptest! {
        #[test]
        fn vector_costs_are_monotone_in_n(
            p in preset_strategy(),
            dtype in dtype_strategy(),
            a in 0..=MAX,
            b in 0..=MAX,
            kind in proptest::sample::select(UnaryKind::ALL.to_vec()),
        ) {
            let c = IpuConfig::preset(p);
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(elementwise_binary_cycles(&c, lo, dtype) <= elementwise_binary_cycles(&c, hi, dtype));
            prop_assert!(kind.cycles(&c, lo, dtype) <= kind.cycles(&c, hi, dtype));
            prop_assert!(scaled_add_cycles(&c, lo, dtype) <= scaled_add_cycles(&c, hi, dtype));
            prop_assert!(cast_cycles(&c, lo) <= cast_cycles(&c, hi));
            prop_assert!(exchange_cycles(&c, lo, false) <= exchange_cycles(&c, hi, false));
            prop_assert!(exchange_cycles(&c, lo, true) <= exchange_cycles(&c, hi, true));
            prop_assert!(exchange_cycles(&c, lo, true) <= exchange_cycles(&c, lo, false));
        }

        #[test]
        fn reduce_is_monotone(
            dtype in dtype_strategy(),
            outputs in 0..=MAX,
            a in 0..=MAX,
            b in 0..=MAX,
        ) {
            let c = mk2();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(reduce_cycles(&c, outputs, lo, dtype) <= reduce_cycles(&c, outputs, hi, dtype));
            prop_assert!(reduce_cycles(&c, lo, outputs, dtype) <= reduce_cycles(&c, hi, outputs, dtype));
        }

        #[test]
        fn matmul_is_monotone_and_never_overflows(
            p in preset_strategy(),
            dtype in dtype_strategy(),
            m in 0..=MAX,
            k in 0..=MAX,
            n in 0..=MAX,
            extra in 0..=MAX,
        ) {
            let c = IpuConfig::preset(p);
            let base = matmul_amp_cycles(&c, m, k, n, dtype);
            prop_assert!(base >= AMP_WORKER_SETUP_CYCLES);
            prop_assert!(base <= matmul_amp_cycles(&c, m.saturating_add(extra), k, n, dtype));
            prop_assert!(base <= matmul_amp_cycles(&c, m, k.saturating_add(extra), n, dtype));
            prop_assert!(base <= matmul_amp_cycles(&c, m, k, n.saturating_add(extra), dtype));
        }

        #[test]
        fn fp16_never_costs_more_than_fp32(m in 0u64..4096, k in 0u64..4096, n in 0u64..4096) {
            let c = mk2();
            prop_assert!(matmul_amp_cycles(&c, m, k, n, DType::F16) <= matmul_amp_cycles(&c, m, k, n, DType::F32));
            prop_assert!(elementwise_binary_cycles(&c, n, DType::F16) <= elementwise_binary_cycles(&c, n, DType::F32));
        }
    }
}
