//! The vertex cost model: tile cycles of common vertices, exchanges and compute sets.
//!
//! Every function is pure: it reads an [`IpuConfig`] (worker contexts, vector widths, AMP MAC
//! rates, exchange figures, and its codelets' figures, [`IpuConfig::codelets`]) and an element
//! type, and returns tile cycles. The shapes follow the poplibs cycle estimators as paraphrased
//! in ARCH.md ("Cost of common vertices"):
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

mod codelets;

pub use codelets::Codelets;

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
                    cfg.codelets.unary_exp_worker_setup
                } else {
                    cfg.codelets.unary_worker_setup
                };
                vectorised(
                    cfg,
                    cfg.codelets.unary_supervisor,
                    setup,
                    cycles,
                    n,
                    elements,
                )
            }
            None => {
                // Exactly the kinds without a popops loop have a vector estimate.
                let per_vector = match self.per_vector_cycles() {
                    Some(c) => c,
                    None => cfg.codelets.binary_cycles_per_vector,
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
        cfg.codelets.elementwise_supervisor,
        cfg.codelets.elementwise_worker_setup,
        cfg.codelets.binary_cycles_per_vector,
        n,
        vector_width(cfg, dtype),
    )
}

/// Tile cycles of an add, sub or mul over `n` elements whose other operand holds one value per
/// run of `run` consecutive elements (a per-channel scale or shift of NCHW data, a norm's
/// statistics along its trailing axes): popops' `BroadcastVectorOuterByRow1D` (each worker
/// takes whole rows) or `...ByColumn1D` (each worker a share of every row), whichever is
/// cheaper (`BroadcastVectorOuterCycleEstimate`, `lib/popops/popopsCycleEstimators.cpp`):
/// `11 + W x (15 + outer loops x (7 + ceil(row elements / vw) x 2))`.
pub fn broadcast_outer_cycles(cfg: &IpuConfig, n: u64, run: u64, dtype: DType) -> u64 {
    let c = &cfg.codelets;
    let w = workers(cfg);
    let vw = vector_width(cfg, dtype);
    let run = run.clamp(1, n.max(1));
    let rows = n.div_ceil(run);
    let row = |columns: u64| {
        c.broadcast_outer_row_cycles.saturating_add(
            columns
                .div_ceil(vw)
                .saturating_mul(c.broadcast_cycles_per_vector),
        )
    };
    let by_row = rows.div_ceil(w).saturating_mul(row(run));
    let by_column = rows.saturating_mul(row(run.div_ceil(w)));
    c.basic_op_supervisor.saturating_add(
        w.saturating_mul(
            c.broadcast_outer_worker_setup
                .saturating_add(by_row.min(by_column)),
        ),
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
        cfg.codelets.basic_op_supervisor,
        cfg.codelets.binary_in_place_worker_setup,
        cfg.codelets.binary_in_place_cycles_per_vector,
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
        cfg.codelets.elementwise_supervisor,
        cfg.codelets.elementwise_worker_setup,
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
        cfg.codelets.scaled_add_supervisor,
        cfg.codelets.scaled_add_worker_setup,
        cfg.codelets.scaled_add_cycles_per_vector,
        n,
        vector_width(cfg, dtype),
    )
}

/// Tile cycles of popops' `MultiUpdateOp` adding `offsets` rows of `row` elements into a
/// table's block by index, `in_range` of them in each worker's range of the block's rows (the
/// others skipped): every worker scans every index (`getMultiUpdateOpCycleEstimate`,
/// `lib/popops/PerformanceEstimation.cpp`, a scaled ADD without sorted indices; the figures
/// are [`Codelets`]' `multi_update_*`). Rows whose bytes are
/// not whole atomic stores (4 bytes) take poplibs' generated C++ path, 20 cycles an element.
pub fn multi_update_add_cycles(
    cfg: &IpuConfig,
    dtype: DType,
    row: u64,
    offsets: u64,
    in_range: u64,
) -> u64 {
    let c = &cfg.codelets;
    let es = dtype.size() as u64;
    let four = es >= 4;
    let (mut setup, mut per_index) = if four {
        (c.multi_update_setup_fp32, c.multi_update_index_cycles_fp32)
    } else {
        (c.multi_update_setup_fp16, c.multi_update_index_cycles_fp16)
    };
    let atom = ATOMIC_STORE_BYTES.max(es) / es.max(1);
    let region64 = (four && (row == 2 || row == 4)) || (es == 2 && row == 4);
    if region64 {
        setup -= 1;
        per_index = if four {
            c.multi_update_index_cycles_region64_fp32_pair * row / 2
        } else {
            c.multi_update_index_cycles_region64_fp16
        };
    } else if (row * es) % ATOMIC_STORE_BYTES != 0 {
        per_index += row * 20;
    } else {
        per_index += (row / atom).saturating_sub(1) * c.multi_update_atom_cycles;
    }
    if offsets == 0 {
        return setup * u64::from(cfg.worker_contexts);
    }
    let in_range = in_range.min(offsets);
    let worker = setup + per_index * in_range + c.multi_update_skip_cycles * (offsets - in_range);
    worker * u64::from(cfg.worker_contexts)
}

/// Bytes a tile stores atomically (the Colossus tile's 32-bit store; poplar's
/// `Target::getAtomicStoreGranularity`): a row of fewer bytes is written by sub-word
/// read-modify-writes.
pub const ATOMIC_STORE_BYTES: u64 = 4;

/// Tile cycles of transposing `n` elements of a weight on one tile in `rows x columns` blocks, as
/// poplin's `fullyConnectedWeightTranspose` does before a fully-connected layer's
/// input-gradient pass (`addTransposeVertices` with the forward and backward plans' channel
/// groups, `lib/poplin/Convolution.cpp`): the blocks shared among the workers, each worker's time
/// by poplibs' transposition estimators (`Transpose2D` for 4-byte types, fast or slow path, the
/// `Transpose1D` worker for fp16).
pub fn weight_transpose_cycles(cfg: &IpuConfig, n: u64, dtype: DType, rows: u64, cols: u64) -> u64 {
    let c = &cfg.codelets;
    let (rows, cols) = (rows.max(1), cols.max(1));
    let w = workers(cfg);
    let matrices = n.div_ceil(rows * cols).div_ceil(w);
    let worker = if dtype.size() < 4 {
        c.transpose_fp16_fixed
            + matrices
                * (c.transpose_fp16_matrix_cycles
                    + (rows / 4).max(1)
                        * (c.transpose_fp16_row_quad_cycles
                            + c.transpose_fp16_column_quad_cycles * (cols / 4).saturating_sub(2)))
    } else if rows % 2 == 0 && cols % 2 == 0 && rows * (cols - 2) / 2 < 512 && rows < 512 {
        c.transpose_fp32_fixed
            + matrices
                * (c.transpose_fp32_matrix_cycles
                    + rows / 2
                        * (c.transpose_fp32_row_pair_cycles
                            + c.transpose_fp32_column_pair_cycles * (cols / 2).saturating_sub(1)))
    } else {
        c.transpose_fp32_slow_fixed
            + matrices
                * (c.transpose_fp32_slow_matrix_cycles
                    + cols
                        * (c.transpose_fp32_slow_column_cycles
                            + rows * c.transpose_fp32_slow_element_cycles))
    };
    w * worker
}

/// Worker cycles of one dense dot product of `size` input channels in a horizontal MAC
/// (`getDenseDotProductCycles`, `lib/poplin/PerformanceEstimation.hpp`): fp32, fp16 into fp32
/// partials, or fp16 into fp16 partials (two output channels at once). The widest vector
/// dividing `size` is loaded a 64-bit word a cycle, narrower ones at half the rate.
fn dense_dot_product_cycles(cfg: &IpuConfig, size: u64, dtype: DType, partials: DType) -> u64 {
    let c = &cfg.codelets;
    let float_acts = dtype != DType::F16;
    let half_half = !float_acts && partials == DType::F16;
    let out_chans = if half_half { 2 } else { 1 };
    let fixed = c.dot_product_fixed
        + if half_half {
            c.dot_product_pair_extra
        } else {
            0
        };
    let per_64 = if float_acts { 2 } else { 4 };
    let width = vector_width(cfg, dtype).max(1);
    let mut w = 1u64 << (63 - width.leading_zeros());
    while w > 1 && size % w != 0 {
        w /= 2;
    }
    let (per_width, extra) = if w >= per_64 { (1, 0) } else { (2, out_chans) };
    (fixed + extra + size / w * per_width).saturating_sub(u64::from(!float_acts))
}

/// Tile cycles of poplin's `ConvPartialHorizontalMac` vertex (HMAC) over a block of `field`
/// output positions, `in_chans` input channels in groups of `group` and `out_chans` output
/// channels, fp32 or fp16 `dtype` into `partials`, with the zeroing of its partials
/// (`getConvPartialHorizontalMacSupervisorCycleEstimate`, `estimateZeroSupervisorCycles`,
/// `lib/poplin/PerformanceEstimation.hpp`, as poplin's planner prices it in
/// `lib/poplin/ConvModel.cpp`). fp32 partials take an output channel a group, fp16 partials
/// two; fp16 activations into fp32 partials run the 1x1 specialisation (a product's kernel is
/// 1x1). The field is one row: each worker takes a sixth of it.
pub fn hmac_cycles(
    cfg: &IpuConfig,
    [field, in_chans, out_chans, group]: [u64; 4],
    dtype: DType,
    partials: DType,
) -> u64 {
    let c = &cfg.codelets;
    let w = workers(cfg);
    let group = group.max(1);
    let per_worker = field.div_ceil(w);
    let float_acts = dtype != DType::F16;
    let float_partials = float_acts || partials != DType::F16;
    let one_by_one = float_partials && !float_acts;
    let dot = dense_dot_product_cycles(cfg, group, dtype, partials);
    let retention = if one_by_one {
        c.hmac_worker_retention_1x1
    } else if float_acts {
        0
    } else {
        c.hmac_worker_retention_fp16
    };
    let run = if per_worker == 0 {
        c.hmac_empty_run_cycles
    } else if one_by_one {
        c.hmac_run_cycles_1x1 + 1 + per_worker * (c.hmac_position_cycles_1x1 + dot)
    } else {
        c.hmac_run_cycles + per_worker * (c.hmac_position_cycles + dot)
    };
    let inner = w * (c.hmac_worker_fixed - retention + run);
    let in_groups = in_chans.div_ceil(group).max(1);
    let out_groups = if float_partials {
        out_chans.max(1)
    } else {
        out_chans.div_ceil(2).max(1)
    };
    let overhead = if float_acts {
        c.hmac_fp32_overhead
    } else {
        c.hmac_fp16_overhead
            - if one_by_one {
                c.hmac_1x1_overhead_saving
            } else {
                0
            }
    };
    let zero_retention = if float_partials {
        c.hmac_zero_retention
    } else {
        c.hmac_zero_retention_fp16
    };
    // poplin adds back the workers' retention savings judged by the partials' type.
    let added_back = if one_by_one {
        c.hmac_worker_retention_1x1
    } else if float_partials {
        0
    } else {
        c.hmac_worker_retention_fp16
    };
    let outer = overhead
        + w * (zero_retention + added_back)
        + c.hmac_conv_group_cycles
        + in_groups * (c.hmac_in_group_cycles + out_groups * (c.hmac_out_group_cycles + inner));
    // Zeroing: a 64-bit vector of partials a cycle, for each output group.
    let per_vector = if float_partials { 2 } else { 4 };
    let zero = (per_worker.div_ceil(per_vector) + c.zero_partials_worker) * w * out_groups;
    outer + zero
}

/// Tile cycles of poplin's `OuterProduct` vertices (a weight update with one input
/// channel) over `field` positions and `out_chans` channels in groups of `group`, fp32 or fp16:
/// each worker takes a sixth of the field (as poplin's planner prices it, `ConvModel.cpp`;
/// `getOuterProductCycleEstimate`).
pub fn outer_product_cycles(
    cfg: &IpuConfig,
    field: u64,
    out_chans: u64,
    group: u64,
    dtype: DType,
) -> u64 {
    let c = &cfg.codelets;
    let w = workers(cfg);
    let group = group.max(1);
    let width = field.div_ceil(w);
    let groups = out_chans.div_ceil(group);
    let (group_cycles, per_position) = if dtype == DType::F16 {
        let p = if group >= 12 && group % 4 == 0 {
            c.outer_product_fast_position_cycles + (group - 12) / 4
        } else {
            c.outer_product_slow_position_cycles + 5 * group / 2
        };
        (c.outer_product_group_cycles_fp16, p)
    } else {
        let p = if group >= 6 && group % 2 == 0 {
            c.outer_product_fast_position_cycles + (group - 6) / 2
        } else {
            c.outer_product_slow_position_cycles + 2 * group
        };
        (c.outer_product_group_cycles, p)
    };
    w * (c.outer_product_fixed + groups * (group_cycles + width * per_position))
}

/// Tile cycles of a cast between fp32 and fp16 over `n` elements, either direction (ARCH.md:
/// about `12 + W x (37 + 2 per vector of 4)`).
pub fn cast_cycles(cfg: &IpuConfig, n: u64) -> u64 {
    vectorised(
        cfg,
        cfg.codelets.cast_supervisor,
        cfg.codelets.cast_worker_setup,
        cfg.codelets.cast_cycles_per_vector,
        n,
        cfg.codelets.cast_vector_width,
    )
}

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
        DType::F16 => cfg.codelets.reduce_accumulator_width_fp16,
        DType::F32 | DType::I32 | DType::U8 => cfg.codelets.reduce_accumulator_width_fp32,
    };
    let per_load = (cfg.codelets.data_path_bits / (8 * dtype.size() as u64)).max(1);
    let per_loop = width.min(per_load).max(1);
    let w = workers(cfg);
    let per_output = cfg
        .codelets
        .reduce_per_output_overhead
        .saturating_add(elements_per_output.div_ceil(per_loop));
    let per_worker = outputs
        .div_ceil(w)
        .saturating_mul(per_output)
        .saturating_add(cfg.codelets.reduce_vertex);
    w.saturating_mul(per_worker)
}

/// Input channels per AMP group for an element type ([`Codelets::amp_in_group_fp32`],
/// [`Codelets::amp_in_group_fp16`]; integer types like fp32).
pub fn amp_in_group(cfg: &IpuConfig, dtype: DType) -> u64 {
    let group = match dtype {
        DType::F16 => cfg.codelets.amp_in_group_fp16,
        DType::F32 | DType::I32 | DType::U8 => cfg.codelets.amp_in_group_fp32,
    };
    group.max(1)
}

fn amp_core_cycles(cfg: &IpuConfig, dtype: DType) -> u64 {
    match dtype {
        DType::F16 => cfg.codelets.amp_core_cycles_fp16,
        DType::F32 | DType::I32 | DType::U8 => cfg.codelets.amp_core_cycles_fp32,
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
    (amp_macs_per_cycle_with(cfg, dtype, partials) * amp_core_cycles(cfg, dtype)
        / amp_in_group(cfg, dtype))
    .max(1)
}

/// Worker cycles of one AMP pass over `positions` field positions (poplibs
/// `getConvPartial1x1SupervisorInnerLoopCycleEstimate`, fp32 partials: the fp32 path, or the
/// fp16 path shared with fp32 partials, less the fp16 worker-retention saving of 10).
fn amp_worker_cycles(
    c: &Codelets,
    positions: u64,
    dtype: DType,
    zeroing: bool,
    conv_units: u64,
) -> u64 {
    if dtype == DType::F16 {
        let base: u64 = match positions {
            0 => 20,
            1 => 31,
            2 => 40,
            n => (if zeroing { 38u64 } else { 40 })
                .saturating_add((n - 3).saturating_mul(c.amp_core_cycles_fp16)),
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
            n => (46 + zero(n)).saturating_add((n - 3).saturating_mul(c.amp_core_cycles_fp32)),
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
///   [`Codelets::amp_coeff_load_bytes_per_cycle`]) and runs the workers over the positions.
/// - The `m` positions are shared among the `W` workers; a pass takes `W x` the busiest
///   worker's cycles, or the idlest's plus [`Codelets::amp_balance_tag`] if that is more (every
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
    let c = &cfg.codelets;
    let w = workers(cfg);
    let units = amp_conv_units_with(cfg, dtype, partials);
    let in_groups = k.div_ceil(amp_in_group(cfg, dtype)).max(1);
    let out_groups = n.div_ceil(units).max(1);
    let weight_bytes = units * amp_in_group(cfg, dtype) * dtype.size() as u64;
    let loads = weight_bytes.div_ceil(c.amp_coeff_load_bytes_per_cycle.max(1));
    let (most, fewest) = (m.div_ceil(w), m / w);
    // Every worker has a work-list entry, empty or not.
    let inner = |zeroing: bool| {
        let busiest = w.saturating_mul(amp_worker_cycles(c, most, dtype, zeroing, units));
        let idlest = w.saturating_mul(amp_worker_cycles(c, fewest, dtype, zeroing, units));
        busiest.max(idlest.saturating_add(c.amp_balance_tag))
    };
    // fp16 inputs with fp32 partials keep a register per worker between passes: poplibs adds
    // `W x (10 + 2 x (input groups - 1))` to the supervisor for it (and saves 10 per worker).
    let retention = if dtype == DType::F16 {
        w.saturating_mul((in_groups - 1).saturating_mul(2).saturating_add(10))
    } else {
        0
    };
    let pass = |overhead: u64, zeroing: bool| {
        c.amp_out_group_cycles
            .saturating_add(overhead + loads + inner(zeroing))
    };
    let other_groups = (in_groups - 1).saturating_mul(
        c.amp_in_group_cycles
            .saturating_add(out_groups.saturating_mul(pass(c.amp_pass_cycles, false))),
    );
    let last_group = c
        .amp_last_in_group_cycles
        .saturating_add(out_groups.saturating_mul(pass(c.amp_zeroing_pass_cycles, true)));
    c.amp_supervisor
        .saturating_add(retention)
        .saturating_add(c.amp_conv_group_cycles)
        .saturating_add(other_groups)
        .saturating_add(last_group)
}

/// How poplin splits the reduction of `depth` partial sums per output into stages: the number
/// of partials each stage sums, first to last (their product is at least `depth`). One stage
/// below the machine's [`Codelets::reduce_two_stage_depth`], two below
/// [`Codelets::reduce_three_stage_depth`], three from there; the intermediate depths are about
/// `depth^((s-1)/s)`, rounded down or up, whichever needs fewer messages per tile
/// (`getMultiStageReducePlanAndCost`, lib/poplin/ConvReducePlan.cpp). Depth 1 needs no stage.
pub fn reduce_stage_factors(cfg: &IpuConfig, depth: u64) -> Vec<u64> {
    stage_factors(cfg, depth).to_vec()
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
pub(crate) fn stage_factors(cfg: &IpuConfig, depth: u64) -> StageFactors {
    if depth <= 1 {
        return StageFactors::default();
    }
    let stages = if depth >= cfg.codelets.reduce_three_stage_depth {
        3
    } else if depth >= cfg.codelets.reduce_two_stage_depth {
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
/// - When the outputs are whole vectors of [`Codelets::reduce_add_vector`] and the partials
///   received are small (under 1/16 of the tile, poplin's
///   `checkPartialsSizeForSingleInputReduce`), the single-input vertex runs: one partial is the
///   one already on the tile, each of the others costs 2 cycles per vector.
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
    let (vector, per_load) = (
        cfg.codelets.reduce_add_vector.max(1),
        cfg.codelets.reduce_add_loads_per_cycle.max(1),
    );
    let (vector, per_load) = if half {
        (2 * vector, 2 * per_load)
    } else {
        (vector, per_load)
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
        let worker = cfg.codelets.reduce_add_single_fixed.saturating_add(
            per_loop
                .saturating_mul(depth)
                .saturating_add(outer)
                .saturating_mul(loops),
        );
        return w
            .saturating_mul(worker)
            .saturating_add(cfg.codelets.reduce_add_single_supervisor);
    }
    let per_loop = vector / vector.min(per_load) + 1;
    let mut loops = outputs / vector;
    // A partial last vector adds a loop per set low bit (poplibs' `ceilLog2` loop).
    let tail_bits = outputs % vector;
    loops += u64::from(tail_bits.count_ones());
    let mut per_worker = loops / w;
    let mut cycles = cfg.codelets.reduce_add_fixed;
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
/// ([`Codelets::compute_set_overhead`], an estimate).
pub const fn compute_set_overhead_cycles(cfg: &IpuConfig) -> u64 {
    cfg.codelets.compute_set_overhead
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
            hmac_cycles(&c, [40, 40, 1, 40], DType::F32, DType::F32),
            58 + 6 * 9 + 23 + (15 + (10 + inner)) + (4 + 5) * 6
        );
        // Two input groups and two output channels: the inner loop runs four times.
        assert_eq!(
            hmac_cycles(&c, [40, 80, 2, 40], DType::F32, DType::F32),
            58 + 6 * 9 + 23 + 2 * (15 + 2 * (10 + inner)) + (4 + 5) * 6 * 2
        );
        // An odd group takes the slow dot product: 7 + 1 + 2 per channel.
        let odd = 6 * (32 + 19 + 7 * (7 + (8 + 2 * 5)));
        assert_eq!(
            hmac_cycles(&c, [40, 5, 1, 5], DType::F32, DType::F32),
            58 + 6 * 9 + 23 + (15 + (10 + odd)) + (4 + 5) * 6
        );
        // fp16 into fp16 partials: two output channels a pass, dot products of 7 + 4 + 40 / 4
        // - 1, worker retention 6 (added back by the supervisor), overhead 65, zero retention
        // 10, zeroing 4 halves a cycle.
        let inner = 6 * (32 - 6 + 19 + 7 * (7 + (11 + 10 - 1)));
        assert_eq!(
            hmac_cycles(&c, [40, 40, 2, 40], DType::F16, DType::F16),
            65 + 6 * (10 + 6) + 23 + (15 + (10 + inner)) + (2 + 5) * 6
        );
        // fp16 into fp32 partials: the 1x1 specialisation, one output channel a pass, dot
        // products of 7 + 40 / 4 - 1, retention 15, overhead 65 - 10, the fp32 partials' zero
        // retention 9, a run 13 + 1 and 2 a position.
        let inner = 6 * (32 - 15 + 13 + 1 + 7 * (2 + (7 + 10 - 1)));
        assert_eq!(
            hmac_cycles(&c, [40, 40, 1, 40], DType::F16, DType::F32),
            55 + 6 * (9 + 15) + 23 + (15 + (10 + inner)) + (4 + 5) * 6
        );
        // fp16 outer products: the fast path (a group of at least 12 in fours) and the slow.
        assert_eq!(
            outer_product_cycles(&c, 40, 80, 40, DType::F16),
            6 * (25 + 2 * (10 + 7 * (6 + 7)))
        );
        assert_eq!(
            outer_product_cycles(&c, 40, 10, 10, DType::F16),
            6 * (25 + (10 + 7 * (10 + 25)))
        );
        // Outer products, fast path (even group of at least 6) and slow path.
        assert_eq!(
            outer_product_cycles(&c, 40, 80, 40, DType::F32),
            6 * (25 + 2 * (11 + 7 * (6 + 17)))
        );
        assert_eq!(
            outer_product_cycles(&c, 40, 5, 5, DType::F32),
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
        let c = mk2();
        assert!(reduce_stage_factors(&c, 1).is_empty());
        assert_eq!(reduce_stage_factors(&c, 2), vec![2]);
        assert_eq!(reduce_stage_factors(&c, 15), vec![15]);
        // 16 -> 4 -> 1; 125 -> 25 -> 5 -> 1 (poplin's depths: depth^((s-1)/s)).
        assert_eq!(reduce_stage_factors(&c, 16), vec![4, 4]);
        assert_eq!(reduce_stage_factors(&c, 125), vec![5, 5, 5]);
        assert_eq!(reduce_stage_factors(&c, 1000).len(), 3);
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
        let c = mk2();
        assert_eq!(
            compute_set_overhead_cycles(&c),
            c.codelets.compute_set_overhead
        );
        assert!(compute_set_overhead_cycles(&c) > 0);
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
            prop_assert!(base >= c.codelets.amp_supervisor);
            let passes = k.div_ceil(amp_in_group(&c, dtype)).max(1)
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
            let f = reduce_stage_factors(&mk2(), depth);
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
