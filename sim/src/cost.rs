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

/// Supervisor cycles of poplibs' basic element-wise ops (`basicOpSupervisorOverhead`,
/// `lib/popops/PerformanceEstimation.cpp`, without scaled pointers).
pub const BASIC_OP_SUPERVISOR_CYCLES: u64 = 11;
/// Worker cycles of an in-place binary op's vertex outside its loop
/// (`getBinaryOp1DInPlaceEstimate`, `lib/popops/popopsCycleEstimators.cpp`).
pub const BINARY_IN_PLACE_WORKER_SETUP_CYCLES: u64 = 58;
/// Worker cycles per vector of an in-place float or half add: the table's 1 cycle a loop
/// (`binaryOpInPlacePerfInfo`, `lib/popops/popopsCycleEstimators.hpp`) plus the 2 of load,
/// store and loop decision of an op with an assembly codelet (`binaryOpInnerLoopCycles`).
pub const BINARY_IN_PLACE_CYCLES_PER_VECTOR: u64 = 3;

/// Worker cycles of a `UnaryOp1D` vertex outside its loop (poplibs' estimator: 17, 33 for
/// exp).
pub const UNARY_WORKER_SETUP_CYCLES: u64 = 17;
/// [`UNARY_WORKER_SETUP_CYCLES`] of exp.
pub const UNARY_EXP_WORKER_SETUP_CYCLES: u64 = 33;
/// Supervisor cycles of a `UnaryOp1D` vertex: the estimator's 9 and
/// [`BASIC_OP_SUPERVISOR_CYCLES`].
pub const UNARY_SUPERVISOR_CYCLES: u64 = 9 + BASIC_OP_SUPERVISOR_CYCLES;

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

/// Worker cycles of a reduction vertex outside its outputs: 10 of set-up and 7 of call and
/// return (`getCycleEstimateReduceAllRegionsContinuous`,
/// `lib/popops/reduction/CycleEstimationFunctions.cpp`, 2023).
pub const REDUCE_VERTEX_CYCLES: u64 = 17;
/// Worker cycles per output of a reduction beyond its inner loop (the same estimator:
/// `12 * numOutputs`).
pub const REDUCE_PER_OUTPUT_OVERHEAD_CYCLES: u64 = 12;
/// The accumulators' width in fp32 elements (ARCH.md: "accumulator width 4").
pub const REDUCE_ACCUMULATOR_WIDTH_FP32: u64 = 4;
/// The accumulators' width in fp16 elements (ARCH.md: "8 (fp16)").
pub const REDUCE_ACCUMULATOR_WIDTH_FP16: u64 = 8;
/// The tile's load data path, bits: a reduction's inner loop takes the fewer of the
/// accumulators' width and the elements one load brings (`elemsPerInnerLoop =
/// min(accVectorWidth, dataPathWidth)` in the same estimator; Poplar's `getDataPathWidth`,
/// 64 bits).
pub const DATA_PATH_BITS: u64 = 64;

/// Supervisor cycles of an AMP (matmul / convolution partials) vertex outside its loops
/// (poplibs `getConvPartial1x1SupervisorOuterLoopCycleEstimate`, `supervisorNonloopOverhead`,
/// lib/poplin/PerformanceEstimation.hpp, SDK 2.0).
pub const AMP_SUPERVISOR_CYCLES: u64 = 50;
/// Supervisor cycles per convolution group of an AMP vertex (poplibs, as above: `12`).
pub const AMP_CONV_GROUP_CYCLES: u64 = 12;
/// Supervisor cycles per input-channel group but the last (poplibs, as above: `15` plus the
/// excess-input-channel overhead `1`).
pub const AMP_IN_GROUP_CYCLES: u64 = 16;
/// Supervisor cycles of the last input-channel group, which also zeroes the partials
/// (poplibs, as above: `10 + 1`).
pub const AMP_LAST_IN_GROUP_CYCLES: u64 = 11;
/// Supervisor cycles per output-channel group (poplibs, as above: `19`).
pub const AMP_OUT_GROUP_CYCLES: u64 = 19;
/// Supervisor cycles per pass of the conv units over an (input, output) group pair, before
/// the weight load and the workers (poplibs, as above: `6`; `outPassesOverhead` `7` in the
/// zeroing pass).
pub const AMP_PASS_CYCLES: u64 = 6;
/// [`AMP_PASS_CYCLES`] of the pass that zeroes the partials.
pub const AMP_ZEROING_PASS_CYCLES: u64 = 7;
/// Input channels per AMP group (the weights one conv unit holds), fp32 inputs: a pass is
/// `8` inputs x conv units outputs in 8 worker cycles per position (poplibs' "16x8 AMP" core
/// loop, lib/poplin/PerformanceEstimation.hpp; `weightsPerConvUnit`, our reading of it).
pub const AMP_IN_GROUP_FP32: u64 = 8;
/// Input channels per AMP group, fp16 inputs: `16` inputs per conv unit in 4 worker cycles
/// per position (as above).
pub const AMP_IN_GROUP_FP16: u64 = 16;
/// Worker cycles per field position per pass, fp32 inputs (poplibs `coreCycles`, as above).
pub const AMP_CORE_CYCLES_FP32: u64 = 8;
/// Worker cycles per field position per pass, fp16 inputs (poplibs `coreCycles`, as above).
pub const AMP_CORE_CYCLES_FP16: u64 = 4;
/// Bytes per cycle at which a pass loads its weights into the conv units. The 128-bit load
/// moves 16 B per cycle, but poplibs plans with `use128BitConvUnitLoad = false`, which halves
/// it (lib/poplin/ConvModel.cpp; `getConvPartialAmpSupervisorWeightLoadCycleEstimate`).
pub const AMP_COEFF_LOAD_BYTES_PER_CYCLE: u64 = 8;
/// Tile cycles the estimator adds to the least loaded worker's before comparing it with the
/// busiest's (poplibs `getConvPartial1x1SupervisorInnerLoopCycleEstimate`: `+ 14`).
pub const AMP_BALANCE_TAG_CYCLES: u64 = 14;

/// Partial-sum depth from which poplin reduces a product's partials in two stages, and
/// [`REDUCE_THREE_STAGE_DEPTH`] in three (`getNumReduceStages`, lib/poplin/ConvReducePlan.cpp:
/// "thresholds chosen based on benchmarking"; `enableMultiStageReduce` is on by default).
pub const REDUCE_TWO_STAGE_DEPTH: u64 = 16;
/// Partial-sum depth from which poplin reduces in three stages (as above).
pub const REDUCE_THREE_STAGE_DEPTH: u64 = 125;
/// Fixed worker cycles of poplin's `ReduceAdd` supervisor vertex (`getReduceCycleEstimate`,
/// lib/poplin/PerformanceEstimation.hpp, SDK 2.0: `32`).
pub const REDUCE_ADD_FIXED_CYCLES: u64 = 32;
/// Fixed worker cycles of the single-input `ReduceAdd` (as above: `20`), which poplin uses
/// when the outputs are whole accumulator vectors; plus [`REDUCE_ADD_SINGLE_SUPERVISOR_CYCLES`].
pub const REDUCE_ADD_SINGLE_FIXED_CYCLES: u64 = 20;
/// Supervisor cycles of the single-input `ReduceAdd` (as above: `33`).
pub const REDUCE_ADD_SINGLE_SUPERVISOR_CYCLES: u64 = 33;
/// fp32 partials a `ReduceAdd` loop accumulates (as above: `accVectorWidth`, 4 for float).
pub const REDUCE_ADD_VECTOR: u64 = 4;
/// fp32 values the 64-bit data path loads per cycle (as above: `partialsInDataPathWidth`).
pub const REDUCE_ADD_LOADS_PER_CYCLE: u64 = 2;

/// Supervisor cycles a compute set costs on every tile that runs it. ARCH.md says only that
/// such an overhead exists; 30 cycles is an estimate (control code to launch the workers and
/// enter the next sync), of the same order as one vertex's supervisor overhead.
pub const COMPUTE_SET_OVERHEAD_CYCLES: u64 = 30;

/// A unary element-wise operation. Those popops runs as a `UnaryOp1D` cost poplibs' table
/// entry ([`UnaryKind::popops_loop`]); copy, scale and clip a vector estimate
/// ([`UnaryKind::per_vector_cycles`]).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryKind {
    /// Copy: 2 worker cycles a 64-bit vector, one load and one store, the rate poplibs'
    /// `getDynamicSlice1DEstimate` assumes for aligned data ("copying aligned data at
    /// 64bits/2cycles", `lib/popops/popopsCycleEstimators.cpp`); Poplar's own copy code is not
    /// published.
    Copy,
    /// Multiply by a scalar (estimate: 3 cycles a vector, the cost of a binary mul).
    Scale,
    /// ReLU (popops `RELU`).
    Relu,
    /// Negation (popops `NEGATE`).
    Neg,
    /// Absolute value (popops `ABSOLUTE`).
    Abs,
    /// Square (popops `SQUARE`).
    Square,
    /// Square root (popops `SQRT`).
    Sqrt,
    /// Reciprocal (popops `INVERSE`).
    Reciprocal,
    /// Natural exponential (popops `EXPONENT`).
    Exp,
    /// Natural logarithm (popops `LOGARITHM`).
    Log,
    /// Hyperbolic tangent (popops `TANH`).
    Tanh,
    /// Logistic sigmoid (popops `SIGMOID`).
    Sigmoid,
    /// The error function (popops `ERF`).
    Erf,
    /// GELU (popops `GELU_ERF`, the exact form PyTorch and ONNX models export).
    Gelu,
    /// Clamp between two bounds (estimate: 3 cycles a vector, a single clamp instruction, like
    /// ReLU).
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

    /// Worker cycles per vector of the kinds popops has no unary op for (see each variant);
    /// `None` for the others, which cost [`popops_loop`](Self::popops_loop).
    pub const fn per_vector_cycles(self) -> Option<u64> {
        match self {
            UnaryKind::Copy => Some(2),
            UnaryKind::Scale | UnaryKind::Clip => Some(3),
            UnaryKind::Relu
            | UnaryKind::Neg
            | UnaryKind::Abs
            | UnaryKind::Square
            | UnaryKind::Sqrt
            | UnaryKind::Reciprocal
            | UnaryKind::Exp
            | UnaryKind::Log
            | UnaryKind::Tanh
            | UnaryKind::Sigmoid
            | UnaryKind::Erf
            | UnaryKind::Gelu => None,
        }
    }

    /// poplibs' inner loop of this operation as a `UnaryOp1D` on `dtype` (integers as fp32):
    /// (worker cycles a loop, elements a loop), from `unaryOpPerfInfo`
    /// (`lib/popops/popopsCycleEstimators.hpp`, 2023) read as `unaryOpInnerLoopCycles` reads
    /// it: an entry with an unroll factor `u` costs its cycles per `u` elements, one without
    /// costs its cycles plus 4 per element. `None` for the kinds popops has no unary op for
    /// (copy, scale, clip), which keep [`per_vector_cycles`](Self::per_vector_cycles).
    pub const fn popops_loop(self, dtype: DType) -> Option<(u64, u64)> {
        // (fp32 entry, fp16 entry), each (cycles a loop, elements a loop).
        let (single, half) = match self {
            UnaryKind::Copy | UnaryKind::Scale | UnaryKind::Clip => return None,
            UnaryKind::Relu => ((3, 2), (3, 4)),
            UnaryKind::Neg | UnaryKind::Square => ((2, 2), (2, 4)),
            UnaryKind::Abs => ((1 + 4, 1), (1 + 4, 1)),
            UnaryKind::Sqrt => ((10, 2), (23, 4)),
            UnaryKind::Reciprocal => ((6, 2), (15, 4)),
            UnaryKind::Exp => ((6, 2), (4, 4)),
            UnaryKind::Log | UnaryKind::Tanh => ((12, 2), (4, 4)),
            UnaryKind::Sigmoid => ((12, 2), (6, 4)),
            UnaryKind::Erf => ((41, 1), (13, 1)),
            // popops' GELU_ERF (the exact GELU that PyTorch and ONNX models export).
            UnaryKind::Gelu => ((22, 1), (16, 1)),
        };
        Some(if matches!(dtype, DType::F16) {
            half
        } else {
            single
        })
    }

    /// Tile cycles of this operation over `n` elements. The kinds popops has priced
    /// ([`popops_loop`](Self::popops_loop)) cost poplibs' `UnaryOp1D` estimate:
    /// `W x (17 + loops x cycles) + 9 + 11` (33 instead of 17 for exp); the others
    /// [`elementwise_unary_cycles`] with their per-vector cost.
    pub fn cycles(self, cfg: &IpuConfig, n: u64, dtype: DType) -> u64 {
        match self.popops_loop(dtype) {
            Some((cycles, elements)) => {
                let setup = if matches!(self, UnaryKind::Exp) {
                    UNARY_EXP_WORKER_SETUP_CYCLES
                } else {
                    UNARY_WORKER_SETUP_CYCLES
                };
                vectorised(cfg, UNARY_SUPERVISOR_CYCLES, setup, cycles, n, elements)
            }
            None => {
                // Exactly the kinds without a popops loop have a vector estimate.
                let per_vector = match self.per_vector_cycles() {
                    Some(c) => c,
                    None => BINARY_CYCLES_PER_VECTOR,
                };
                elementwise_unary_cycles(cfg, n, dtype, per_vector)
            }
        }
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

/// AMP multiply-accumulates per tile cycle for an element type with fp32 partial sums
/// (poplin's default `partialsType`): [`amp_macs_per_cycle_with`] with fp32 partials.
pub fn amp_macs_per_cycle(cfg: &IpuConfig, dtype: DType) -> u64 {
    amp_macs_per_cycle_with(cfg, dtype, DType::F32)
}

/// AMP multiply-accumulates per tile cycle for inputs of `dtype` summed into partials of
/// `partials`: fp16 inputs into fp16 partials run the AMP at its fp16 peak (16 conv units on
/// Mk2 and Bow: the half -> half `ConvPartial1x1Out` vertex, `lib/poplin/codelets`), fp16
/// inputs into fp32 partials at the rate with fp32 partials, every other type at the fp32
/// rate (integer types have no AMP path: an estimate).
pub fn amp_macs_per_cycle_with(cfg: &IpuConfig, dtype: DType, partials: DType) -> u64 {
    let macs = match (dtype, partials) {
        (DType::F16, DType::F16) => cfg.amp_macs_per_cycle_fp16,
        (DType::F16, _) => cfg.amp_macs_per_cycle_fp16_fp32_partials,
        (DType::F32 | DType::I32 | DType::U8, _) => cfg.amp_macs_per_cycle_fp32,
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

/// Worker cycles per vector of popops' broadcast add, sub and mul: `broadcastOpPerfInfo`'s 1
/// cycle a loop for ADD, SUBTRACT and MULTIPLY (`lib/popops/popopsCycleEstimators.hpp`) plus
/// the 1 of load, store and loop decision of their assembly codelets
/// (`BroadcastVectorOuterByRow1D`, `...ByColumn1D`: `overheadPerInnerLoop` 1).
pub const BROADCAST_CYCLES_PER_VECTOR: u64 = 2;
/// Worker cycles per row (one broadcast value's run) of popops' `BroadcastVectorOuter`
/// vertices on aligned data (`BroadcastVectorOuterCycleEstimate`: `allowMisaligned ? 25 :
/// 7`).
pub const BROADCAST_OUTER_ROW_CYCLES: u64 = 7;
/// Worker cycles of a `BroadcastVectorOuter` vertex outside its loops (the estimate's 15).
pub const BROADCAST_OUTER_WORKER_SETUP_CYCLES: u64 = 15;

/// Tile cycles of an add, sub or mul over `n` elements whose other operand holds one value per
/// run of `run` consecutive elements (a per-channel scale or shift of NCHW data, a norm's
/// statistics along its trailing axes): popops' `BroadcastVectorOuterByRow1D` (each worker
/// takes whole rows) or `...ByColumn1D` (each worker a share of every row), whichever is
/// cheaper (`BroadcastVectorOuterCycleEstimate`, `lib/popops/popopsCycleEstimators.cpp`):
/// `11 + W x (15 + outer loops x (7 + ceil(row elements / vw) x 2))`.
pub fn broadcast_outer_cycles(cfg: &IpuConfig, n: u64, run: u64, dtype: DType) -> u64 {
    let w = workers(cfg);
    let vw = vector_width(cfg, dtype);
    let run = run.clamp(1, n.max(1));
    let rows = n.div_ceil(run);
    let row = |columns: u64| {
        BROADCAST_OUTER_ROW_CYCLES.saturating_add(
            columns
                .div_ceil(vw)
                .saturating_mul(BROADCAST_CYCLES_PER_VECTOR),
        )
    };
    let by_row = rows.div_ceil(w).saturating_mul(row(run));
    let by_column = rows.saturating_mul(row(run.div_ceil(w)));
    BASIC_OP_SUPERVISOR_CYCLES.saturating_add(
        w.saturating_mul(BROADCAST_OUTER_WORKER_SETUP_CYCLES.saturating_add(by_row.min(by_column))),
    )
}

/// Tile cycles of an add, sub or mul over `n` elements whose other operand holds one value per
/// run of `run` elements ([`broadcast_outer_cycles`]), or varies element by element (`None`:
/// [`elementwise_binary_cycles`]).
pub fn binary_pass_cycles(cfg: &IpuConfig, n: u64, run: Option<u64>, dtype: DType) -> u64 {
    match run {
        Some(run) => broadcast_outer_cycles(cfg, n, run, dtype),
        None => elementwise_binary_cycles(cfg, n, dtype),
    }
}

/// Tile cycles of an in-place add `a += b` over `n` elements (`BinaryOp1DInPlace<ADD>`), at
/// poplibs' price (`getBinaryOp1DInPlaceEstimate`, 2023):
/// `11 + W x (58 + ceil(ceil(n / W) / vw) x 3)`.
pub fn binary_in_place_cycles(cfg: &IpuConfig, n: u64, dtype: DType) -> u64 {
    vectorised(
        cfg,
        BASIC_OP_SUPERVISOR_CYCLES,
        BINARY_IN_PLACE_WORKER_SETUP_CYCLES,
        BINARY_IN_PLACE_CYCLES_PER_VECTOR,
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

/// Fixed worker cycles of a 4-byte `Transpose2D` vertex's fast path (poplibs
/// `lib/popops/popopsCycleEstimators.cpp` before commit 18ee6463, 2022, when the transposition
/// estimators moved into Poplar): `27 + matrices x (11 + rows / 2 x (6 + 3 x (columns / 2 -
/// 1)))`.
pub const TRANSPOSE_FP32_FIXED_CYCLES: u64 = 27;
/// Per matrix of a 4-byte `Transpose2D` (the 11 above).
pub const TRANSPOSE_FP32_MATRIX_CYCLES: u64 = 11;
/// Per pair of rows of a 4-byte `Transpose2D` (the 6 above).
pub const TRANSPOSE_FP32_ROW_PAIR_CYCLES: u64 = 6;
/// Per pair of columns after the first, per pair of rows (the 3 above).
pub const TRANSPOSE_FP32_COLUMN_PAIR_CYCLES: u64 = 3;
/// Fixed worker cycles of the fp16 `Transpose1D` worker (poplibs `TransposeWorkerCycles`, as
/// above): `29 + matrices x (18 + rows / 4 x (12 + 4 x (columns / 4 - 2)))`.
pub const TRANSPOSE_FP16_FIXED_CYCLES: u64 = 29;
/// Per matrix of the fp16 `Transpose1D` worker (the 18 above).
pub const TRANSPOSE_FP16_MATRIX_CYCLES: u64 = 18;
/// Per four rows of the fp16 `Transpose1D` worker (the 12 above).
pub const TRANSPOSE_FP16_ROW_QUAD_CYCLES: u64 = 12;
/// Per four columns beyond eight, per four rows (the 4 above).
pub const TRANSPOSE_FP16_COLUMN_QUAD_CYCLES: u64 = 4;

/// Fixed worker cycles of a 4-byte `Transpose2D` vertex's slow path (poplibs, as above): `13 +
/// matrices x (8 + columns x (5 + rows x 4 / 2))`, taken when a block's rows are odd or its
/// strides exceed the fast path's (`rows x (columns - 2) / 2 >= 512`, `rows >= 512`).
pub const TRANSPOSE_FP32_SLOW_FIXED_CYCLES: u64 = 13;
/// Per matrix of the slow path (the 8 above).
pub const TRANSPOSE_FP32_SLOW_MATRIX_CYCLES: u64 = 8;
/// Per column of the slow path (the 5 above).
pub const TRANSPOSE_FP32_SLOW_COLUMN_CYCLES: u64 = 5;
/// Per row per column of the slow path (the 4 / 2 above).
pub const TRANSPOSE_FP32_SLOW_ELEMENT_CYCLES: u64 = 2;

/// Tile cycles of transposing `n` elements of a weight on one tile in `rows x columns` blocks, as
/// poplin's `fullyConnectedWeightTranspose` does before a fully-connected layer's
/// input-gradient pass (`addTransposeVertices` with the forward and backward plans' channel
/// groups, `lib/poplin/Convolution.cpp`): the blocks shared among the workers, each worker's time
/// by poplibs' transposition estimators (`Transpose2D` for 4-byte types, fast or slow path, the
/// `Transpose1D` worker for fp16).
pub fn weight_transpose_cycles(cfg: &IpuConfig, n: u64, dtype: DType, rows: u64, cols: u64) -> u64 {
    let (rows, cols) = (rows.max(1), cols.max(1));
    let w = workers(cfg);
    let matrices = n.div_ceil(rows * cols).div_ceil(w);
    let worker = if dtype.size() < 4 {
        TRANSPOSE_FP16_FIXED_CYCLES
            + matrices
                * (TRANSPOSE_FP16_MATRIX_CYCLES
                    + (rows / 4).max(1)
                        * (TRANSPOSE_FP16_ROW_QUAD_CYCLES
                            + TRANSPOSE_FP16_COLUMN_QUAD_CYCLES * (cols / 4).saturating_sub(2)))
    } else if rows % 2 == 0 && cols % 2 == 0 && rows * (cols - 2) / 2 < 512 && rows < 512 {
        TRANSPOSE_FP32_FIXED_CYCLES
            + matrices
                * (TRANSPOSE_FP32_MATRIX_CYCLES
                    + rows / 2
                        * (TRANSPOSE_FP32_ROW_PAIR_CYCLES
                            + TRANSPOSE_FP32_COLUMN_PAIR_CYCLES * (cols / 2).saturating_sub(1)))
    } else {
        TRANSPOSE_FP32_SLOW_FIXED_CYCLES
            + matrices
                * (TRANSPOSE_FP32_SLOW_MATRIX_CYCLES
                    + cols
                        * (TRANSPOSE_FP32_SLOW_COLUMN_CYCLES
                            + rows * TRANSPOSE_FP32_SLOW_ELEMENT_CYCLES))
    };
    w * worker
}

/// Supervisor overhead of poplin's fp32 `ConvPartialHorizontalMac` vertex
/// (`convHorizontalMacOverhead`, `lib/poplin/PerformanceEstimation.hpp`).
pub const HMAC_FP32_OVERHEAD_CYCLES: u64 = 58;
/// Per worker, the zeroing retention saving the HMAC supervisor adds back
/// (`zeroPartialsRetentionSavings` for fp32 partials, as above).
pub const HMAC_ZERO_RETENTION_CYCLES: u64 = 9;
/// Per convolution group of the HMAC supervisor (`getConvPartialHorizontalMacSupervisor
/// OuterLoopCycleEstimate`, as above).
pub const HMAC_CONV_GROUP_CYCLES: u64 = 23;
/// Per input-channel group of the HMAC supervisor (as above).
pub const HMAC_IN_GROUP_CYCLES: u64 = 15;
/// Per output group of the HMAC supervisor (as above).
pub const HMAC_OUT_GROUP_CYCLES: u64 = 10;
/// A worker's fixed cycles in an HMAC pass: 16 in `getConvPartialHorizontalMacCycleEstimate`
/// and the 16 of `workerNonLoopOverhead` (as above).
pub const HMAC_WORKER_FIXED_CYCLES: u64 = 32;
/// Per run of outputs a worker computes (the 19 of a non-empty `convSize`, as above).
pub const HMAC_RUN_CYCLES: u64 = 19;
/// Per output position, before its dot products (the 7 of `convSize x (7 + ...)`, as above).
pub const HMAC_POSITION_CYCLES: u64 = 7;
/// A worker with no outputs (the 7 of an empty `convSize`, as above).
pub const HMAC_EMPTY_RUN_CYCLES: u64 = 7;
/// Fixed cycles of one dense dot product, fp32 (`getDenseDotProductCycles`: rpt and wind down 3,
/// sum with the previous partial 3, branch 1).
pub const DOT_PRODUCT_FIXED_CYCLES: u64 = 7;
/// Fixed worker cycles of zeroing fp32 partials (`getZeroSupervisorVertexCycleEstimate`: 14 less
/// the retention saving of 9).
pub const ZERO_PARTIALS_WORKER_CYCLES: u64 = 5;

/// Tile cycles of poplin's fp32 `ConvPartialHorizontalMac` vertex (HMAC) over a block of
/// `field` output positions, `in_chans` input channels in groups of `group` and `out_chans`
/// output channels (one per group, as fp32 partials have), with the zeroing of its partials
/// (`getConvPartialHorizontalMacSupervisorCycleEstimate`, `estimateZeroSupervisorCycles`,
/// `lib/poplin/PerformanceEstimation.hpp`, as poplin's planner prices it in
/// `lib/poplin/ConvModel.cpp`). The field is one row: each worker takes a sixth of it.
pub fn hmac_cycles(cfg: &IpuConfig, field: u64, in_chans: u64, out_chans: u64, group: u64) -> u64 {
    let w = workers(cfg);
    let group = group.max(1);
    let per_worker = field.div_ceil(w);
    // fp32 dot products run two elements a cycle when the group is even, else one per two
    // cycles with a cycle more to start.
    let dot = if group % 2 == 0 {
        DOT_PRODUCT_FIXED_CYCLES + group / 2
    } else {
        DOT_PRODUCT_FIXED_CYCLES + 1 + 2 * group
    };
    let worker = HMAC_WORKER_FIXED_CYCLES
        + if per_worker > 0 {
            HMAC_RUN_CYCLES + per_worker * (HMAC_POSITION_CYCLES + dot)
        } else {
            HMAC_EMPTY_RUN_CYCLES
        };
    let inner = w * worker;
    let in_groups = in_chans.div_ceil(group).max(1);
    let out_groups = out_chans.max(1);
    let outer = HMAC_FP32_OVERHEAD_CYCLES
        + w * HMAC_ZERO_RETENTION_CYCLES
        + HMAC_CONV_GROUP_CYCLES
        + in_groups * (HMAC_IN_GROUP_CYCLES + out_groups * (HMAC_OUT_GROUP_CYCLES + inner));
    let zero = (per_worker.div_ceil(2) + ZERO_PARTIALS_WORKER_CYCLES) * w * out_groups;
    outer + zero
}

/// Fixed worker cycles of poplin's `OuterProduct` vertex (`getOuterProductCycleEstimate`,
/// `lib/poplin/PerformanceEstimation.hpp`): `25 + groups x (11 + width x (6 + (group - 6) / 2))`
/// on the fp32 fast path (an even group of at least 6), `25 + groups x (11 + width x (10 + 2 x
/// group))` otherwise.
pub const OUTER_PRODUCT_FIXED_CYCLES: u64 = 25;
/// Per channel group of an outer product (the 11 above).
pub const OUTER_PRODUCT_GROUP_CYCLES: u64 = 11;
/// Per output position per group on the fast path, before its channels (the 6 above).
pub const OUTER_PRODUCT_FAST_POSITION_CYCLES: u64 = 6;
/// Per output position per group on the slow path (the 10 above).
pub const OUTER_PRODUCT_SLOW_POSITION_CYCLES: u64 = 10;

/// Tile cycles of poplin's fp32 `OuterProduct` vertices (a weight update with one input
/// channel) over `field` positions and `out_chans` channels in groups of `group`: each worker
/// takes a sixth of the field (as poplin's planner prices it, `ConvModel.cpp`).
pub fn outer_product_cycles(cfg: &IpuConfig, field: u64, out_chans: u64, group: u64) -> u64 {
    let w = workers(cfg);
    let group = group.max(1);
    let width = field.div_ceil(w);
    let groups = out_chans.div_ceil(group);
    let per_position = if group >= 6 && group % 2 == 0 {
        OUTER_PRODUCT_FAST_POSITION_CYCLES + (group - 6) / 2
    } else {
        OUTER_PRODUCT_SLOW_POSITION_CYCLES + 2 * group
    };
    w * (OUTER_PRODUCT_FIXED_CYCLES + groups * (OUTER_PRODUCT_GROUP_CYCLES + width * per_position))
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

/// popnn's pooling vertex cycles per vector of a forward pass (`poolVertexCyclesPerVector`,
/// `lib/popnn/PerformanceEstimation.hpp`).
pub const POOL_CYCLES_PER_VECTOR: u64 = 3;
/// popnn's cycles per vector of a max pooling gradient (`MaxPoolingGrad`: a compare with the
/// forward's input and output and a conditional add; `poolVertexCyclesPerVector`).
pub const POOL_GRAD_CYCLES_PER_VECTOR: u64 = 5;

/// Tile cycles of a reduction producing `outputs` values, each summing `elements_per_output`
/// inputs of type `dtype`, at poplibs' price for continuous regions
/// (`getCycleEstimateReduceAllRegionsContinuous`, 2023): per output 12 cycles plus one per
/// inner loop of `min(accumulator width, data path width)` elements (2 fp32, 4 fp16 on a
/// 64-bit path), and 17 per vertex. The outputs are shared among the workers
/// (`ceil(outputs / W)` each, one vertex per worker), and worker cycles times `W` are tile
/// cycles.
pub fn reduce_cycles(cfg: &IpuConfig, outputs: u64, elements_per_output: u64, dtype: DType) -> u64 {
    if outputs == 0 {
        return 0;
    }
    let width = match dtype {
        DType::F16 => REDUCE_ACCUMULATOR_WIDTH_FP16,
        DType::F32 | DType::I32 | DType::U8 => REDUCE_ACCUMULATOR_WIDTH_FP32,
    };
    let per_load = (DATA_PATH_BITS / (8 * dtype.size() as u64)).max(1);
    let per_loop = width.min(per_load);
    let w = workers(cfg);
    let per_output =
        REDUCE_PER_OUTPUT_OVERHEAD_CYCLES.saturating_add(elements_per_output.div_ceil(per_loop));
    let per_worker = outputs
        .div_ceil(w)
        .saturating_mul(per_output)
        .saturating_add(REDUCE_VERTEX_CYCLES);
    w.saturating_mul(per_worker)
}

/// Input channels per AMP group for an element type ([`AMP_IN_GROUP_FP32`],
/// [`AMP_IN_GROUP_FP16`]; integer types like fp32).
pub fn amp_in_group(dtype: DType) -> u64 {
    match dtype {
        DType::F16 => AMP_IN_GROUP_FP16,
        DType::F32 | DType::I32 | DType::U8 => AMP_IN_GROUP_FP32,
    }
}

fn amp_core_cycles(dtype: DType) -> u64 {
    match dtype {
        DType::F16 => AMP_CORE_CYCLES_FP16,
        DType::F32 | DType::I32 | DType::U8 => AMP_CORE_CYCLES_FP32,
    }
}

/// Conv units of the AMP for an element type, which is also the outputs of one AMP group:
/// `MACs per tile cycle x core cycles / inputs per group`. With the presets' rates that is 8
/// (fp16 inputs with fp32 partials, every generation; fp32 on Mk1) or 16 (fp32 on Mk2 and
/// Bow), poplibs' `numConvUnits`. Deriving it keeps the vendor peaks exact.
pub fn amp_conv_units(cfg: &IpuConfig, dtype: DType) -> u64 {
    amp_conv_units_with(cfg, dtype, DType::F32)
}

/// [`amp_conv_units`] for partial sums of type `partials`: fp16 inputs with fp16 partials
/// have 16 conv units on Mk2 and Bow (the fp16 peak), 8 on Mk1.
pub fn amp_conv_units_with(cfg: &IpuConfig, dtype: DType, partials: DType) -> u64 {
    (amp_macs_per_cycle_with(cfg, dtype, partials) * amp_core_cycles(dtype) / amp_in_group(dtype))
        .max(1)
}

/// Worker cycles of one AMP pass over `positions` field positions (poplibs
/// `getConvPartial1x1SupervisorInnerLoopCycleEstimate`, fp32 partials: the fp32 path, or the
/// fp16 path shared with fp32 partials, less the fp16 worker-retention saving of 10).
fn amp_worker_cycles(positions: u64, dtype: DType, zeroing: bool, conv_units: u64) -> u64 {
    if dtype == DType::F16 {
        let base: u64 = match positions {
            0 => 20,
            1 => 31,
            2 => 40,
            n => (if zeroing { 38u64 } else { 40 })
                .saturating_add((n - 3).saturating_mul(AMP_CORE_CYCLES_FP16)),
        };
        let zero_extra = match positions {
            0..=2 if zeroing => 2,
            0..=2 => 4,
            _ => 0,
        };
        base.saturating_add(zero_extra).saturating_sub(10)
    } else {
        let per_group = if conv_units == 16 { 8 } else { 4 };
        let zero = |n: u64| if zeroing { 2 + per_group * n } else { 0 };
        match positions {
            0 => 24,
            1 => 47 + zero(1),
            2 => 46 + zero(2),
            n => (46 + zero(n)).saturating_add((n - 3).saturating_mul(AMP_CORE_CYCLES_FP32)),
        }
    }
}

/// Tile cycles of one tile's matmul partial `[m, k] x [k, n]` on the AMP, as poplibs'
/// `ConvPartial1x1Out` estimator prices it (`getConvPartial1x1SupervisorOuterLoopCycleEstimate`
/// and its inner loop, lib/poplin/PerformanceEstimation.hpp, SDK 2.0).
///
/// - The `k` inputs form `ceil(k / in group)` groups and the `n` outputs `ceil(n / conv
///   units)` groups; every (input, output) group pair is a pass of the conv units, which
///   loads its weights (`conv units x in group x element bytes` at
///   [`AMP_COEFF_LOAD_BYTES_PER_CYCLE`]) and runs the workers over the positions.
/// - The `m` positions are shared among the `W` workers; a pass takes `W x` the busiest
///   worker's cycles, or the idlest's plus [`AMP_BALANCE_TAG_CYCLES`] if that is more (every
///   worker has a work list, even an empty one).
/// - The last input group's passes also zero the partials.
/// - Supervisor overheads per vertex, input group, output group and pass are poplibs'.
///
/// Large blocks run at the AMP peak ([`amp_macs_per_cycle`]); small ones pay the fixed costs,
/// which is why the IPU Model never prices even a tiny product below a few hundred cycles.
pub fn matmul_amp_cycles(cfg: &IpuConfig, m: u64, k: u64, n: u64, dtype: DType) -> u64 {
    matmul_amp_cycles_with(cfg, m, k, n, dtype, DType::F32)
}

/// [`matmul_amp_cycles`] with partial sums of type `partials`. fp16 inputs with fp16 partials
/// run twice the conv units; their workers take the same path as with fp32 partials and 8
/// conv units (poplibs' `commonHalfAndFloatPartialsCodePath`, and the same retention saving,
/// `conv1x1WorkerRetentionSavings`, lib/poplin/PerformanceEstimation.hpp, 2023), so only the
/// output groups per pass and the weights loaded per pass change.
pub fn matmul_amp_cycles_with(
    cfg: &IpuConfig,
    m: u64,
    k: u64,
    n: u64,
    dtype: DType,
    partials: DType,
) -> u64 {
    let w = workers(cfg);
    let units = amp_conv_units_with(cfg, dtype, partials);
    let in_groups = k.div_ceil(amp_in_group(dtype)).max(1);
    let out_groups = n.div_ceil(units).max(1);
    let weight_bytes = units * amp_in_group(dtype) * dtype.size() as u64;
    let loads = weight_bytes.div_ceil(AMP_COEFF_LOAD_BYTES_PER_CYCLE);
    let (most, fewest) = (m.div_ceil(w), m / w);
    // Every worker has a work-list entry, empty or not.
    let inner = |zeroing: bool| {
        let busiest = w.saturating_mul(amp_worker_cycles(most, dtype, zeroing, units));
        let idlest = w.saturating_mul(amp_worker_cycles(fewest, dtype, zeroing, units));
        busiest.max(idlest.saturating_add(AMP_BALANCE_TAG_CYCLES))
    };
    // fp16 inputs with fp32 partials keep a register per worker between passes: poplibs adds
    // `W x (10 + 2 x (input groups - 1))` to the supervisor for it (and saves 10 per worker).
    let retention = if dtype == DType::F16 {
        w.saturating_mul((in_groups - 1).saturating_mul(2).saturating_add(10))
    } else {
        0
    };
    let pass = |overhead: u64, zeroing: bool| {
        AMP_OUT_GROUP_CYCLES.saturating_add(overhead + loads + inner(zeroing))
    };
    let other_groups = (in_groups - 1).saturating_mul(
        AMP_IN_GROUP_CYCLES.saturating_add(out_groups.saturating_mul(pass(AMP_PASS_CYCLES, false))),
    );
    let last_group = AMP_LAST_IN_GROUP_CYCLES
        .saturating_add(out_groups.saturating_mul(pass(AMP_ZEROING_PASS_CYCLES, true)));
    AMP_SUPERVISOR_CYCLES
        .saturating_add(retention)
        .saturating_add(AMP_CONV_GROUP_CYCLES)
        .saturating_add(other_groups)
        .saturating_add(last_group)
}

/// How poplin splits the reduction of `depth` partial sums per output into stages: the number
/// of partials each stage sums, first to last (their product is at least `depth`). One stage
/// below [`REDUCE_TWO_STAGE_DEPTH`], two below [`REDUCE_THREE_STAGE_DEPTH`], three from there;
/// the intermediate depths are about `depth^((s-1)/s)`, rounded down or up, whichever needs
/// fewer messages per tile (`getMultiStageReducePlanAndCost`, lib/poplin/ConvReducePlan.cpp).
/// Depth 1 needs no stage.
pub fn reduce_stage_factors(depth: u64) -> Vec<u64> {
    stage_factors(depth).to_vec()
}

/// At most three factors (see [`reduce_stage_factors`]), held in place: the planner prices
/// millions of plans, and a list each was an allocation each.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StageFactors {
    factors: [u64; 3],
    len: usize,
}

impl StageFactors {
    fn push(&mut self, f: u64) {
        self.factors[self.len] = f;
        self.len += 1;
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for StageFactors {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        &self.factors[..self.len]
    }
}

/// [`reduce_stage_factors`], in place.
pub(crate) fn stage_factors(depth: u64) -> StageFactors {
    if depth <= 1 {
        return StageFactors::default();
    }
    let stages = if depth >= REDUCE_THREE_STAGE_DEPTH {
        3
    } else if depth >= REDUCE_TWO_STAGE_DEPTH {
        2
    } else {
        1
    };
    // Intermediate depths, as poplin plans them (messages per tile as the cost): for each
    // stage but the last, about depth^((s-1)/s), rounded down or up, whichever costs less.
    // (At most two intermediate depths, kept in an array: this runs for every plan the
    // planner prices.)
    fn plan(depth: u64, stages: u32) -> ([u64; 2], usize, f64) {
        if stages == 1 {
            return ([0; 2], 0, depth as f64);
        }
        let down =
            ((depth as f64).powf((f64::from(stages) - 1.0) / f64::from(stages)) as u64).max(1);
        let try_depth = |next: u64| {
            let (rest, n, c) = plan(next, stages - 1);
            let mut p = [0; 2];
            p[0] = next;
            p[1..=n].copy_from_slice(&rest[..n]);
            (p, n + 1, c + depth as f64 / next as f64)
        };
        let (a, b) = (try_depth(down), try_depth(down + 1));
        if a.2 < b.2 {
            a
        } else {
            b
        }
    }
    let (depths, n, _) = plan(depth, stages);
    let intermediate = &depths[..n];
    let mut factors = StageFactors::default();
    let mut remaining = depth;
    for &d in intermediate {
        let f = remaining.div_ceil(d.max(1)).max(1);
        remaining = remaining.div_ceil(f);
        factors.push(f);
    }
    if remaining > 1 || factors.is_empty() {
        factors.push(remaining);
    }
    factors
}

/// Tile cycles of poplin's `ReduceAdd` vertex summing `partials` partial sums of type
/// `partials_type` (fp32, or fp16 with half partials) into each of `outputs` values of type
/// `out` (`getReduceCycleEstimate`, lib/poplin/PerformanceEstimation.hpp, SDK 2.0).
///
/// - When the outputs are whole vectors of [`REDUCE_ADD_VECTOR`] and the partials received
///   are small (under 1/16 of the tile, poplin's `checkPartialsSizeForSingleInputReduce`),
///   the single-input vertex runs: one partial is the one already on the tile, each of the
///   others costs 2 cycles per vector.
/// - Otherwise the supervisor vertex: 3 cycles per partial per vector (2 loads of the 64-bit
///   path and a pointer load), with a shorter tail for a last partial vector.
/// - fp16 partials: vectors of 8 (`accVectorWidth`), 4 per 64-bit load, so a vector of 8
///   costs what one of 4 fp32 partials does; the loop overheads are poplibs' half ones.
pub fn partials_reduce_cycles(
    cfg: &IpuConfig,
    outputs: u64,
    partials: u64,
    out: DType,
    partials_type: DType,
) -> u64 {
    let w = workers(cfg);
    let out_float = out != DType::F16;
    let half = partials_type == DType::F16;
    // Elements per accumulator vector, and per 64-bit load.
    let (vector, per_load) = if half {
        (2 * REDUCE_ADD_VECTOR, 2 * REDUCE_ADD_LOADS_PER_CYCLE)
    } else {
        (REDUCE_ADD_VECTOR, REDUCE_ADD_LOADS_PER_CYCLE)
    };
    let received = partials
        .saturating_sub(1)
        .saturating_mul(outputs)
        .saturating_mul(partials_type.size() as u64);
    if outputs % vector == 0 && received < cfg.sram_bytes_per_tile / 16 {
        let per_loop = vector / vector.min(per_load);
        let loops = (outputs / vector).div_ceil(w);
        let outer = match (half, out_float) {
            (false, true) => 8,
            (false, false) => 7,
            (true, true) => 10,
            (true, false) => 9,
        };
        let depth = partials.saturating_sub(1);
        let worker = REDUCE_ADD_SINGLE_FIXED_CYCLES.saturating_add(
            per_loop
                .saturating_mul(depth)
                .saturating_add(outer)
                .saturating_mul(loops),
        );
        return w
            .saturating_mul(worker)
            .saturating_add(REDUCE_ADD_SINGLE_SUPERVISOR_CYCLES);
    }
    let per_loop = vector / vector.min(per_load) + 1;
    let mut loops = outputs / vector;
    // A partial last vector adds a loop per set low bit (poplibs' `ceilLog2` loop).
    let tail_bits = outputs % vector;
    loops += u64::from(tail_bits.count_ones());
    let mut per_worker = loops / w;
    let mut cycles = REDUCE_ADD_FIXED_CYCLES;
    if loops % w != 0 {
        if tail_bits != 0 {
            let tail = if half { 11 } else { 13 };
            cycles = cycles.saturating_add(partials.saturating_mul(2).saturating_add(tail));
        } else {
            per_worker += 1;
        }
    }
    let outer = match (half, out_float) {
        (false, true) => 7,
        (false, false) => 6,
        (true, true) => 9,
        (true, false) => 8,
    };
    cycles = cycles.saturating_add(
        per_loop
            .saturating_mul(partials)
            .saturating_add(outer)
            .saturating_mul(per_worker),
    );
    w.saturating_mul(cycles)
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
    fn the_serial_accumulation_is_poplibs_in_place_add() {
        // getBinaryOp1DInPlaceEstimate(ADD, FLOAT, 1200) on 6 workers: 11 + 6 x (58 + 100 x 3).
        assert_eq!(
            binary_in_place_cycles(&mk2(), 1200, DType::F32),
            11 + 6 * (58 + 300)
        );
        // About 180 cycles above the out-of-place add's fixed cost.
        let (a, b) = (
            binary_in_place_cycles(&mk2(), 1200, DType::F32),
            elementwise_binary_cycles(&mk2(), 1200, DType::F32),
        );
        assert!(a > b + 150, "{a} vs {b}");
    }

    #[test]
    fn hmac_outer_product_and_transposes_match_poplibs_formulas() {
        let c = IpuConfig::preset(Preset::Mk1);
        // HMAC over 40 positions and 40 input channels in one group of 40, one output channel:
        // 7 positions a worker, dot products of 7 + 40 / 2; outer loop 58 + 6 x 9 + 23 + (15 +
        // 10 + inner); zeroing (ceil(7 / 2) + 5) x 6.
        let inner = 6 * (32 + 19 + 7 * (7 + (7 + 20)));
        assert_eq!(
            hmac_cycles(&c, 40, 40, 1, 40),
            58 + 6 * 9 + 23 + (15 + (10 + inner)) + (4 + 5) * 6
        );
        // Two input groups and two output channels: the inner loop runs four times.
        assert_eq!(
            hmac_cycles(&c, 40, 80, 2, 40),
            58 + 6 * 9 + 23 + 2 * (15 + 2 * (10 + inner)) + (4 + 5) * 6 * 2
        );
        // An odd group takes the slow dot product: 7 + 1 + 2 per channel.
        let odd = 6 * (32 + 19 + 7 * (7 + (8 + 2 * 5)));
        assert_eq!(
            hmac_cycles(&c, 40, 5, 1, 5),
            58 + 6 * 9 + 23 + (15 + (10 + odd)) + (4 + 5) * 6
        );
        // Outer products, fast path (even group of at least 6) and slow path.
        assert_eq!(
            outer_product_cycles(&c, 40, 80, 40),
            6 * (25 + 2 * (11 + 7 * (6 + 17)))
        );
        assert_eq!(
            outer_product_cycles(&c, 40, 5, 5),
            6 * (25 + (11 + 7 * (10 + 10)))
        );
        // Transpositions of fp32 blocks: 8 x 8 on the fast path, 40 x 40 on the slow one (its
        // strides are too long), one block a worker here.
        assert_eq!(
            weight_transpose_cycles(&c, 64, DType::F32, 8, 8),
            6 * (27 + (11 + 4 * (6 + 3 * 3)))
        );
        assert_eq!(
            weight_transpose_cycles(&c, 1600, DType::F32, 40, 40),
            6 * (13 + (8 + 40 * (5 + 40 * 2)))
        );
        // fp16 in 16 x 8 blocks: 29 + (18 + 4 x 12) per block.
        assert_eq!(
            weight_transpose_cycles(&c, 128, DType::F16, 16, 8),
            6 * (29 + (18 + 4 * 12))
        );
        // Thirteen blocks over six workers: the busiest does three.
        assert_eq!(
            weight_transpose_cycles(&c, 13 * 64, DType::F32, 8, 8),
            6 * (27 + 3 * (11 + 4 * (6 + 3 * 3)))
        );
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
    fn broadcast_outer_matches_poplibs_formula() {
        let c = mk2();
        // 10,976 halves of 3,136-element rows (a 56x56 feature map's channels): the by-column
        // split, 4 rows (the last partial) of 523 elements a worker.
        let (n, run) = (10_976, 3_136);
        let by_column = 4 * (7 + 523u64.div_ceil(4) * 2);
        assert_eq!(
            broadcast_outer_cycles(&c, n, run, DType::F16),
            11 + 6 * (15 + by_column)
        );
        // 49-element rows (7x7 maps): whole rows a worker.
        let (n, run) = (10_976, 49);
        let by_row = 224u64.div_ceil(6) * (7 + 13 * 2);
        assert_eq!(
            broadcast_outer_cycles(&c, n, run, DType::F16),
            11 + 6 * (15 + by_row)
        );
    }

    #[test]
    fn long_broadcast_rows_cost_two_thirds_of_a_binary_op() {
        let c = mk2();
        let n = 1 << 20;
        for dtype in [DType::F32, DType::F16] {
            let r = ratio(
                broadcast_outer_cycles(&c, n, 1 << 16, dtype),
                elementwise_binary_cycles(&c, n, dtype),
            );
            assert!(near(r, 2.0 / 3.0, 0.01), "{dtype}: {r}");
        }
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
    fn unary_costs_follow_popops_tables() {
        let c = mk2();
        // UnaryOp1D<RELU, float> over 1200 elements: 9 + 11 + 6 x (17 + ceil(200 / 2) x 3).
        assert_eq!(
            UnaryKind::Relu.cycles(&c, 1200, DType::F32),
            9 + 11 + 6 * (17 + 100 * 3)
        );
        // ERF on floats is 41 cycles an element (unrolled by 1): about 7x the old estimate's
        // 12 a vector of two.
        assert_eq!(
            UnaryKind::Erf.cycles(&c, 1200, DType::F32),
            9 + 11 + 6 * (17 + 200 * 41)
        );
        // exp's vertex sets up in 33 cycles.
        assert_eq!(
            UnaryKind::Exp.cycles(&c, 1200, DType::F16),
            9 + 11 + 6 * (33 + 50 * 4)
        );
        // Kinds popops has no unary op for keep the vector estimate, and only they.
        for k in UnaryKind::ALL {
            for dt in [DType::F32, DType::F16] {
                assert_ne!(k.popops_loop(dt).is_some(), k.per_vector_cycles().is_some());
            }
        }
        assert_eq!(
            UnaryKind::Copy.cycles(&c, 1000, DType::F32),
            elementwise_unary_cycles(&c, 1000, DType::F32, 2)
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
        // poplibs' continuous-regions estimate: 17 + outputs x (12 + partials / 2 (fp32) or
        // / 4 (fp16)) a worker.
        assert_eq!(
            reduce_cycles(&c, 12, 64, DType::F32),
            6 * (17 + 2 * (12 + 32))
        );
        assert_eq!(
            reduce_cycles(&c, 12, 64, DType::F16),
            6 * (17 + 2 * (12 + 16))
        );
        assert_eq!(reduce_cycles(&c, 0, 64, DType::F32), 0);
        let r = ratio(
            reduce_cycles(&c, 6, 1 << 20, DType::F32),
            reduce_cycles(&c, 6, 1 << 19, DType::F32),
        );
        assert!(near(r, 2.0, 0.01), "{r}");
    }

    #[test]
    fn conv_units_follow_the_rates() {
        // fp16 inputs with fp32 partials: 8 conv units on every generation; fp32: 8 on Mk1,
        // 16 on Mk2 and Bow (poplibs' numConvUnits).
        for p in Preset::ALL {
            let c = IpuConfig::preset(p);
            assert_eq!(amp_conv_units(&c, DType::F16), 8, "{p}");
            let fp32 = if p == Preset::Mk1 { 8 } else { 16 };
            assert_eq!(amp_conv_units(&c, DType::F32), fp32, "{p}");
            // fp16 partials: the fp16 peak, 16 conv units where it is 64 MACs a cycle.
            let half = if p == Preset::Mk1 { 8 } else { 16 };
            assert_eq!(amp_conv_units_with(&c, DType::F16, DType::F16), half, "{p}");
            assert_eq!(amp_conv_units_with(&c, DType::F32, DType::F16), fp32, "{p}");
        }
    }

    #[test]
    fn matmul_matches_poplibs_estimator() {
        let mk1 = IpuConfig::preset(Preset::Mk1);
        // fp32, one position, 8 inputs, 8 outputs: one zeroing pass. The busy worker takes
        // 47 + (2 + 4) cycles (the idle ones 24); the weights are 8 units x 8 inputs x 4 B at
        // 8 B/cycle.
        assert_eq!(
            matmul_amp_cycles(&mk1, 1, 8, 8, DType::F32),
            50 + 12 + 11 + (19 + 7 + 32 + 6 * (47 + 6))
        );
        // 12 positions (2 per worker, all busy: + 14), 16 inputs (2 groups), 8 outputs.
        assert_eq!(
            matmul_amp_cycles(&mk1, 12, 16, 8, DType::F32),
            50 + 12
                + (16 + (19 + 6 + 32 + 6 * 46 + 14))
                + (11 + (19 + 7 + 32 + 6 * (46 + 2 + 8) + 14))
        );
        // fp16: 20 positions (4 or 3 per worker), 32 inputs (2 groups), 16 outputs (2 groups);
        // retention costs 6 x (10 + 2) and saves 10 per worker pass.
        let w4 = |zeroing: bool| (if zeroing { 38 } else { 40 }) + 4 - 10;
        let w3 = |zeroing: bool| (if zeroing { 38 } else { 40 }) - 10;
        let inner = |z: bool| (6 * w4(z)).max(6 * w3(z) + 14);
        assert_eq!(
            matmul_amp_cycles(&mk1, 20, 32, 16, DType::F16),
            50 + 6 * 12
                + 12
                + (16 + 2 * (19 + 6 + 32 + inner(false)))
                + (11 + 2 * (19 + 7 + 32 + inner(true)))
        );
    }

    #[test]
    fn large_matmul_runs_near_the_amp_peak() {
        for p in Preset::ALL {
            let c = IpuConfig::preset(p);
            for dtype in [DType::F16, DType::F32] {
                // Thousands of positions per worker: the fixed costs of a pass vanish.
                let (m, k, n) = (6 * 4000, 256, 256);
                let cycles = matmul_amp_cycles(&c, m, k, n, dtype);
                let macs_per_cycle = ratio(m * k * n, cycles);
                let peak = amp_macs_per_cycle(&c, dtype) as f64;
                // Within 5%: the zeroing pass of the last input group costs a little more.
                assert!(
                    macs_per_cycle <= peak && near(macs_per_cycle, peak, 0.05),
                    "{p} {dtype}: {macs_per_cycle}"
                );
            }
        }
    }

    #[test]
    fn fp16_matmul_is_cheaper_than_fp32_with_the_same_conv_units() {
        // On Mk1 both use 8 conv units, and fp16 groups twice the inputs per pass.
        let c = IpuConfig::preset(Preset::Mk1);
        for (m, k, n) in [(1, 1, 1), (16, 16, 16), (100, 300, 70), (1024, 1024, 1024)] {
            assert!(
                matmul_amp_cycles(&c, m, k, n, DType::F16)
                    < matmul_amp_cycles(&c, m, k, n, DType::F32),
                "{m}x{k}x{n}"
            );
        }
    }

    #[test]
    fn tiny_products_pay_the_fixed_costs() {
        // The IPU Model prices no AMP vertex below a few hundred cycles.
        for p in Preset::ALL {
            let c = IpuConfig::preset(p);
            for dtype in [DType::F16, DType::F32] {
                assert!(matmul_amp_cycles(&c, 1, 1, 1, dtype) > 250, "{p} {dtype}");
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
    fn reductions_stage_as_poplin_plans_them() {
        assert!(reduce_stage_factors(1).is_empty());
        assert_eq!(reduce_stage_factors(2), vec![2]);
        assert_eq!(reduce_stage_factors(15), vec![15]);
        // 16 -> 4 -> 1; 125 -> 25 -> 5 -> 1 (poplin's depths: depth^((s-1)/s)).
        assert_eq!(reduce_stage_factors(16), vec![4, 4]);
        assert_eq!(reduce_stage_factors(125), vec![5, 5, 5]);
        assert_eq!(reduce_stage_factors(1000).len(), 3);
    }

    #[test]
    fn partials_reduce_matches_poplibs_estimator() {
        let mk1 = IpuConfig::preset(Preset::Mk1);
        // 8 outputs (2 whole vectors), 5 partials: the single-input vertex, 4 extra partials
        // at 2 cycles each per vector; 2 loops over 6 workers is 1 loop each.
        assert_eq!(
            partials_reduce_cycles(&mk1, 8, 5, DType::F32, DType::F32),
            6 * (20 + (2 * 4 + 8)) + 33
        );
        // 1 output: the supervisor vertex; its one loop is a tail (2 x 5 + 13 on top).
        assert_eq!(
            partials_reduce_cycles(&mk1, 1, 5, DType::F32, DType::F32),
            6 * (32 + 2 * 5 + 13)
        );
        // 24 outputs, 3 partials, half out: 6 loops, one per worker, 3 x 3 + 6 each.
        // (24 x 2 x 4 B received is small, but 24 is a whole number of vectors: single input.)
        assert_eq!(
            partials_reduce_cycles(&mk1, 24, 3, DType::F16, DType::F32),
            6 * (20 + (2 * 2 + 7)) + 33
        );
        // 26 outputs: 6 whole vectors and a tail of 2; 7 loops over 6 workers.
        assert_eq!(
            partials_reduce_cycles(&mk1, 26, 3, DType::F32, DType::F32),
            6 * (32 + (2 * 3 + 13) + (3 * 3 + 7))
        );
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

        /// More inputs or outputs never cost less; more positions cost at most a few cycles
        /// less per pass (poplibs prices 2 positions per worker 1 cycle under 1).
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
            prop_assert!(base >= AMP_SUPERVISOR_CYCLES);
            let passes = k.div_ceil(amp_in_group(dtype)).max(1)
                .saturating_mul(n.div_ceil(amp_conv_units(&c, dtype)).max(1));
            let slack = passes.saturating_mul(6 * 14);
            prop_assert!(base <= matmul_amp_cycles(&c, m.saturating_add(extra), k, n, dtype).saturating_add(slack));
            prop_assert!(base <= matmul_amp_cycles(&c, m, k.saturating_add(extra), n, dtype));
            prop_assert!(base <= matmul_amp_cycles(&c, m, k, n.saturating_add(extra), dtype));
        }

        /// The stages sum every partial: the factors' product covers the depth, with at
        /// most three stages, each summing at least two (poplin never plans a stage of one).
        #[test]
        fn reduce_stages_cover_the_depth(depth in 2u64..100_000) {
            let f = reduce_stage_factors(depth);
            prop_assert!(!f.is_empty() && f.len() <= 3, "{depth}: {f:?}");
            let mut remaining = depth;
            for &x in &f {
                prop_assert!(x >= 2, "{depth}: {f:?}");
                remaining = remaining.div_ceil(x);
            }
            prop_assert_eq!(remaining, 1, "{} : {:?}", depth, f);
        }

        /// Summing more partials never costs less.
        #[test]
        fn partials_reduce_is_monotone_in_the_partials(
            outputs in 0u64..10_000,
            partials in 1u64..10_000,
            extra in 0u64..1_000,
        ) {
            let c = mk2();
            for out in [DType::F32, DType::F16] {
                for p in [DType::F32, DType::F16] {
                    prop_assert!(
                        partials_reduce_cycles(&c, outputs, partials, out, p)
                            <= partials_reduce_cycles(&c, outputs, partials + extra, out, p)
                    );
                }
            }
        }

        /// fp16 partials (twice the conv units) never make an fp16 product of at least 16
        /// outputs slower (narrower ones load twice the weights per pass for nothing).
        #[test]
        fn half_partials_never_cost_more(m in 0u64..4096, k in 0u64..4096, n in 16u64..4096) {
            for c in [mk2(), IpuConfig::preset(Preset::Mk1), IpuConfig::preset(Preset::Bow)] {
                prop_assert!(
                    matmul_amp_cycles_with(&c, m, k, n, DType::F16, DType::F16)
                        <= matmul_amp_cycles(&c, m, k, n, DType::F16)
                );
            }
        }

        #[test]
        fn fp16_never_costs_more_than_fp32(m in 0u64..4096, k in 0u64..4096, n in 0u64..4096) {
            let c = mk2();
            let mk1 = IpuConfig::preset(Preset::Mk1);
            prop_assert!(matmul_amp_cycles(&mk1, m, k, n, DType::F16) <= matmul_amp_cycles(&mk1, m, k, n, DType::F32));
            prop_assert!(elementwise_binary_cycles(&c, n, DType::F16) <= elementwise_binary_cycles(&c, n, DType::F32));
        }
    }
}
