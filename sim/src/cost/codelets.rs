//! The codelet costs of a machine: the figures poplibs' cycle estimators give its vertices.
//!
//! A [`Codelets`] table belongs to the machine description ([`IpuConfig::codelets`]), as
//! poplibs keeps each estimator beside its codelet and reads per-target figures from the
//! target: a generation whose codelets cost differently carries its own table, and the cost
//! functions of [`crate::cost`] read every figure from the machine they price. Every preset
//! runs the same poplibs codelets and carries [`Codelets::COLOSSUS`].
//!
//! Each field's comment gives its unit and the source of the Colossus figure. A field named
//! after a fixed overhead (a supervisor, a set-up, a vertex's fixed cost) drops the word
//! "cycles"; one priced per unit of work (per vector, group, pass, row, matrix, position)
//! keeps it.
//!
//! [`IpuConfig::codelets`]: crate::machine::IpuConfig::codelets

use serde::{Deserialize, Serialize};

/// The tile-cycle figures of a machine's codelets, which the cost functions of
/// [`crate::cost`] read from [`IpuConfig::codelets`](crate::machine::IpuConfig::codelets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Codelets {
    /// Supervisor cycles of an element-wise vertex (ARCH.md: "about a dozen cycles of
    /// supervisor overhead"). Also used for unary vertices ("like binary").
    pub elementwise_supervisor: u64,
    /// Worker setup cycles of an element-wise vertex (ARCH.md: "about 26-29"; 28 is our pick
    /// in that range, an estimate).
    pub elementwise_worker_setup: u64,
    /// Worker cycles per vector of an add, sub or mul (ARCH.md: "ceil(n_w / vw) x 3").
    pub binary_cycles_per_vector: u64,

    /// Supervisor cycles of poplibs' basic element-wise ops (`basicOpSupervisorOverhead`,
    /// `lib/popops/PerformanceEstimation.cpp`, without scaled pointers).
    pub basic_op_supervisor: u64,
    /// Worker cycles of an in-place binary op's vertex outside its loop
    /// (`getBinaryOp1DInPlaceEstimate`, `lib/popops/popopsCycleEstimators.cpp`).
    pub binary_in_place_worker_setup: u64,
    /// Worker cycles per vector of an in-place float or half add: the table's 1 cycle a loop
    /// (`binaryOpInPlacePerfInfo`, `lib/popops/popopsCycleEstimators.hpp`) plus the 2 of load,
    /// store and loop decision of an op with an assembly codelet (`binaryOpInnerLoopCycles`).
    pub binary_in_place_cycles_per_vector: u64,

    /// Worker cycles of a `UnaryOp1D` vertex outside its loop (poplibs' estimator: 17, 33 for
    /// exp).
    pub unary_worker_setup: u64,
    /// [`unary_worker_setup`](Self::unary_worker_setup) of exp, worker cycles.
    pub unary_exp_worker_setup: u64,
    /// Supervisor cycles of a `UnaryOp1D` vertex: the estimator's 9 and
    /// [`basic_op_supervisor`](Self::basic_op_supervisor).
    pub unary_supervisor: u64,

    /// Supervisor cycles of a scaled add, the SGD update (ARCH.md: "supervisor about 60
    /// cycles").
    pub scaled_add_supervisor: u64,
    /// Worker setup cycles of a scaled add (ARCH.md: "W x (about 24 + 3 per vector)").
    pub scaled_add_worker_setup: u64,
    /// Worker cycles per vector of a scaled add (ARCH.md: "3 per vector").
    pub scaled_add_cycles_per_vector: u64,

    /// Fixed cycles of a cast vertex (ARCH.md: "about 12 + W x (37 + 2 per vector of 4)").
    pub cast_supervisor: u64,
    /// Worker setup cycles of a cast vertex (ARCH.md: "37").
    pub cast_worker_setup: u64,
    /// Worker cycles per vector of a cast (ARCH.md: "2 per vector of 4").
    pub cast_cycles_per_vector: u64,
    /// Elements per cast vector, whichever direction (ARCH.md: "per vector of 4").
    pub cast_vector_width: u64,

    /// Worker cycles of a reduction vertex outside its outputs: 10 of set-up and 7 of call and
    /// return (`getCycleEstimateReduceAllRegionsContinuous`,
    /// `lib/popops/reduction/CycleEstimationFunctions.cpp`, 2023).
    pub reduce_vertex: u64,
    /// Worker cycles per output of a reduction beyond its inner loop (the same estimator:
    /// `12 * numOutputs`).
    pub reduce_per_output_overhead: u64,
    /// The accumulators' width in fp32 elements (ARCH.md: "accumulator width 4").
    pub reduce_accumulator_width_fp32: u64,
    /// The accumulators' width in fp16 elements (ARCH.md: "8 (fp16)").
    pub reduce_accumulator_width_fp16: u64,
    /// The tile's load data path, bits: a reduction's inner loop takes the fewer of the
    /// accumulators' width and the elements one load brings (`elemsPerInnerLoop =
    /// min(accVectorWidth, dataPathWidth)` in the same estimator; Poplar's `getDataPathWidth`,
    /// 64 bits).
    pub data_path_bits: u64,

    /// Supervisor cycles of an AMP (matmul / convolution partials) vertex outside its loops
    /// (poplibs `getConvPartial1x1SupervisorOuterLoopCycleEstimate`,
    /// `supervisorNonloopOverhead`, lib/poplin/PerformanceEstimation.hpp, SDK 2.0).
    pub amp_supervisor: u64,
    /// Supervisor cycles per convolution group of an AMP vertex (poplibs, as above: `12`).
    pub amp_conv_group_cycles: u64,
    /// Supervisor cycles per input-channel group but the last (poplibs, as above: `15` plus
    /// the excess-input-channel overhead `1`).
    pub amp_in_group_cycles: u64,
    /// Supervisor cycles of the last input-channel group, which also zeroes the partials
    /// (poplibs, as above: `10 + 1`).
    pub amp_last_in_group_cycles: u64,
    /// Supervisor cycles per output-channel group (poplibs, as above: `19`).
    pub amp_out_group_cycles: u64,
    /// Supervisor cycles per pass of the conv units over an (input, output) group pair,
    /// before the weight load and the workers (poplibs, as above: `6`; `outPassesOverhead`
    /// `7` in the zeroing pass).
    pub amp_pass_cycles: u64,
    /// [`amp_pass_cycles`](Self::amp_pass_cycles) of the pass that zeroes the partials,
    /// supervisor cycles.
    pub amp_zeroing_pass_cycles: u64,
    /// Input channels per AMP group (the weights one conv unit holds), fp32 inputs: a pass is
    /// `8` inputs x conv units outputs in 8 worker cycles per position (poplibs' "16x8 AMP"
    /// core loop, lib/poplin/PerformanceEstimation.hpp; `weightsPerConvUnit`, our reading of
    /// it).
    pub amp_in_group_fp32: u64,
    /// Input channels per AMP group, fp16 inputs: `16` inputs per conv unit in 4 worker cycles
    /// per position (as above).
    pub amp_in_group_fp16: u64,
    /// Worker cycles per field position per pass, fp32 inputs (poplibs `coreCycles`, as
    /// above).
    pub amp_core_cycles_fp32: u64,
    /// Worker cycles per field position per pass, fp16 inputs (poplibs `coreCycles`, as
    /// above).
    pub amp_core_cycles_fp16: u64,
    /// Bytes per cycle at which a pass loads its weights into the conv units. The 128-bit load
    /// moves 16 B per cycle, but poplibs plans with `use128BitConvUnitLoad = false`, which
    /// halves it (lib/poplin/ConvModel.cpp; `getConvPartialAmpSupervisorWeightLoadCycleEstimate`).
    pub amp_coeff_load_bytes_per_cycle: u64,
    /// Tile cycles the estimator adds to the least loaded worker's before comparing it with
    /// the busiest's (poplibs `getConvPartial1x1SupervisorInnerLoopCycleEstimate`: `+ 14`).
    pub amp_balance_tag: u64,

    /// Partial-sum depth (partials per output) from which poplin reduces a product's partials
    /// in two stages, and [`reduce_three_stage_depth`](Self::reduce_three_stage_depth) in
    /// three (`getNumReduceStages`, lib/poplin/ConvReducePlan.cpp: "thresholds chosen based
    /// on benchmarking"; `enableMultiStageReduce` is on by default).
    pub reduce_two_stage_depth: u64,
    /// Partial-sum depth (partials per output) from which poplin reduces in three stages (as
    /// above).
    pub reduce_three_stage_depth: u64,
    /// Fixed worker cycles of poplin's `ReduceAdd` supervisor vertex (`getReduceCycleEstimate`,
    /// lib/poplin/PerformanceEstimation.hpp, SDK 2.0: `32`).
    pub reduce_add_fixed: u64,
    /// Fixed worker cycles of the single-input `ReduceAdd` (as above: `20`), which poplin uses
    /// when the outputs are whole accumulator vectors; plus
    /// [`reduce_add_single_supervisor`](Self::reduce_add_single_supervisor).
    pub reduce_add_single_fixed: u64,
    /// Supervisor cycles of the single-input `ReduceAdd` (as above: `33`).
    pub reduce_add_single_supervisor: u64,
    /// fp32 partials a `ReduceAdd` loop accumulates (as above: `accVectorWidth`, 4 for
    /// float), elements.
    pub reduce_add_vector: u64,
    /// fp32 values the 64-bit data path loads per cycle (as above: `partialsInDataPathWidth`).
    pub reduce_add_loads_per_cycle: u64,

    /// Supervisor cycles a compute set costs on every tile that runs it. ARCH.md says only
    /// that such an overhead exists; 30 cycles is an estimate (control code to launch the
    /// workers and enter the next sync), of the same order as one vertex's supervisor
    /// overhead.
    pub compute_set_overhead: u64,

    /// Worker cycles per vector of popops' broadcast add, sub and mul: `broadcastOpPerfInfo`'s
    /// 1 cycle a loop for ADD, SUBTRACT and MULTIPLY (`lib/popops/popopsCycleEstimators.hpp`)
    /// plus the 1 of load, store and loop decision of their assembly codelets
    /// (`BroadcastVectorOuterByRow1D`, `...ByColumn1D`: `overheadPerInnerLoop` 1).
    pub broadcast_cycles_per_vector: u64,
    /// Worker cycles per row (one broadcast value's run) of popops' `BroadcastVectorOuter`
    /// vertices on aligned data (`BroadcastVectorOuterCycleEstimate`: `allowMisaligned ? 25 :
    /// 7`).
    pub broadcast_outer_row_cycles: u64,
    /// Worker cycles of a `BroadcastVectorOuter` vertex outside its loops (the estimate's 15).
    pub broadcast_outer_worker_setup: u64,

    /// Fixed worker cycles of a 4-byte `Transpose2D` vertex's fast path (poplibs
    /// `lib/popops/popopsCycleEstimators.cpp` before commit 18ee6463, 2022, when the
    /// transposition estimators moved into Poplar): `27 + matrices x (11 + rows / 2 x (6 + 3 x
    /// (columns / 2 - 1)))`.
    pub transpose_fp32_fixed: u64,
    /// Worker cycles per matrix of a 4-byte `Transpose2D` (the 11 above).
    pub transpose_fp32_matrix_cycles: u64,
    /// Worker cycles per pair of rows of a 4-byte `Transpose2D` (the 6 above).
    pub transpose_fp32_row_pair_cycles: u64,
    /// Worker cycles per pair of columns after the first, per pair of rows (the 3 above).
    pub transpose_fp32_column_pair_cycles: u64,
    /// Fixed worker cycles of the fp16 `Transpose1D` worker (poplibs `TransposeWorkerCycles`,
    /// as above): `29 + matrices x (18 + rows / 4 x (12 + 4 x (columns / 4 - 2)))`.
    pub transpose_fp16_fixed: u64,
    /// Worker cycles per matrix of the fp16 `Transpose1D` worker (the 18 above).
    pub transpose_fp16_matrix_cycles: u64,
    /// Worker cycles per four rows of the fp16 `Transpose1D` worker (the 12 above).
    pub transpose_fp16_row_quad_cycles: u64,
    /// Worker cycles per four columns beyond eight, per four rows (the 4 above).
    pub transpose_fp16_column_quad_cycles: u64,

    /// Fixed worker cycles of a 4-byte `Transpose2D` vertex's slow path (poplibs, as above):
    /// `13 + matrices x (8 + columns x (5 + rows x 4 / 2))`, taken when a block's rows are odd
    /// or its strides exceed the fast path's (`rows x (columns - 2) / 2 >= 512`, `rows >=
    /// 512`).
    pub transpose_fp32_slow_fixed: u64,
    /// Worker cycles per matrix of the slow path (the 8 above).
    pub transpose_fp32_slow_matrix_cycles: u64,
    /// Worker cycles per column of the slow path (the 5 above).
    pub transpose_fp32_slow_column_cycles: u64,
    /// Worker cycles per row per column of the slow path (the 4 / 2 above).
    pub transpose_fp32_slow_element_cycles: u64,

    /// Supervisor overhead cycles of poplin's fp32 `ConvPartialHorizontalMac` vertex
    /// (`convHorizontalMacOverhead`, `lib/poplin/PerformanceEstimation.hpp`).
    pub hmac_fp32_overhead: u64,
    /// Supervisor cycles per worker, the zeroing retention saving the HMAC supervisor adds
    /// back (`zeroPartialsRetentionSavings` for fp32 partials, as above).
    pub hmac_zero_retention: u64,
    /// Supervisor cycles per convolution group of the HMAC supervisor
    /// (`getConvPartialHorizontalMacSupervisor OuterLoopCycleEstimate`, as above).
    pub hmac_conv_group_cycles: u64,
    /// Supervisor cycles per input-channel group of the HMAC supervisor (as above).
    pub hmac_in_group_cycles: u64,
    /// Supervisor cycles per output group of the HMAC supervisor (as above).
    pub hmac_out_group_cycles: u64,
    /// A worker's fixed cycles in an HMAC pass: 16 in
    /// `getConvPartialHorizontalMacCycleEstimate` and the 16 of `workerNonLoopOverhead` (as
    /// above).
    pub hmac_worker_fixed: u64,
    /// Worker cycles per run of outputs a worker computes (the 19 of a non-empty `convSize`,
    /// as above).
    pub hmac_run_cycles: u64,
    /// Worker cycles per output position, before its dot products (the 7 of `convSize x (7 +
    /// ...)`, as above).
    pub hmac_position_cycles: u64,
    /// Worker cycles of a worker with no outputs (the 7 of an empty `convSize`, as above).
    pub hmac_empty_run_cycles: u64,
    /// Fixed worker cycles of one dense dot product, fp32 (`getDenseDotProductCycles`: rpt and
    /// wind down 3, sum with the previous partial 3, branch 1).
    pub dot_product_fixed: u64,
    /// Fixed worker cycles of zeroing fp32 partials (`getZeroSupervisorVertexCycleEstimate`: 14
    /// less the retention saving of 9; fp16 partials: 15 less 10, the same).
    pub zero_partials_worker: u64,
    /// Supervisor overhead cycles of the fp16 HMAC vertex (`convHorizontalMacOverhead`: 65).
    pub hmac_fp16_overhead: u64,
    /// What the HMAC's 1x1 specialisation (fp16 activations with fp32 partials) saves of the
    /// supervisor overhead (`convHorizontalMacOverhead`: 10).
    pub hmac_1x1_overhead_saving: u64,
    /// [`hmac_zero_retention`](Self::hmac_zero_retention) for fp16 partials
    /// (`zeroPartialsRetentionSavings`: 10).
    pub hmac_zero_retention_fp16: u64,
    /// Worker cycles the HMAC's fp16 worker saves by state retention
    /// (`convHzmacWorkerRetentionSavings`: 6; 0 for fp32).
    pub hmac_worker_retention_fp16: u64,
    /// The same for the 1x1 specialisation (15).
    pub hmac_worker_retention_1x1: u64,
    /// [`hmac_run_cycles`](Self::hmac_run_cycles) of the 1x1 specialisation (13, as above).
    pub hmac_run_cycles_1x1: u64,
    /// Worker cycles per output position of the 1x1 specialisation with one output channel a
    /// pass, before its dot product (`convSize x (2 + ...)`, as above), after a cycle a run to
    /// preload the weights' pointer.
    pub hmac_position_cycles_1x1: u64,
    /// What a dense dot product of fp16 activations into fp16 partials adds to
    /// [`dot_product_fixed`](Self::dot_product_fixed): it makes two output channels, the
    /// second's rpt and wind-down (3) and a format conversion (1) (`getDenseDotProductCycles`).
    pub dot_product_pair_extra: u64,

    /// Fixed worker cycles of poplin's `OuterProduct` vertex (`getOuterProductCycleEstimate`,
    /// `lib/poplin/PerformanceEstimation.hpp`): `25 + groups x (11 + width x (6 + (group - 6)
    /// / 2))` on the fp32 fast path (an even group of at least 6), `25 + groups x (11 + width
    /// x (10 + 2 x group))` otherwise.
    pub outer_product_fixed: u64,
    /// Worker cycles per channel group of an outer product (the 11 above).
    pub outer_product_group_cycles: u64,
    /// Worker cycles per output position per group on the fast path, before its channels (the
    /// 6 above).
    pub outer_product_fast_position_cycles: u64,
    /// Worker cycles per output position per group on the slow path (the 10 above).
    pub outer_product_slow_position_cycles: u64,
    /// [`outer_product_group_cycles`](Self::outer_product_group_cycles) of fp16 (10: `25 +
    /// groups x (10 + width x (6 + (group - 12) / 4))` on the fp16 fast path, a group of at
    /// least 12 in fours, `25 + groups x (10 + width x (10 + 5 x group / 2))` otherwise).
    pub outer_product_group_cycles_fp16: u64,

    /// popnn's pooling vertex cycles per vector of a forward pass (`poolVertexCyclesPerVector`,
    /// `lib/popnn/PerformanceEstimation.hpp`).
    pub pool_cycles_per_vector: u64,
    /// popnn's cycles per vector of a max pooling gradient (`MaxPoolingGrad`: a compare with
    /// the forward's input and output and a conditional add; `poolVertexCyclesPerVector`).
    pub pool_grad_cycles_per_vector: u64,

    /// Worker cycles of popops' `MultiUpdateOp` (an embedding's gradient added into its table
    /// by index) before its loop over the indices, fp16: 3 to load the count, check it and exit,
    /// 30 of the outer loop's set-up and 4 to load the scale and check the regions
    /// (`getMultiUpdateOpCycleEstimate`, `lib/popops/PerformanceEstimation.cpp`, scaled ADD).
    pub multi_update_setup_fp16: u64,
    /// [`multi_update_setup_fp16`](Self::multi_update_setup_fp16) for 4-byte elements: 3, 29
    /// and 6 (the same estimator).
    pub multi_update_setup_fp32: u64,
    /// Worker cycles per index in a worker's range of rows, fp16: 12 and 1 for the scale
    /// (the same estimator), before the row's atoms beyond the first.
    pub multi_update_index_cycles_fp16: u64,
    /// [`multi_update_index_cycles_fp16`](Self::multi_update_index_cycles_fp16) for 4-byte
    /// elements: 11 (the same estimator).
    pub multi_update_index_cycles_fp32: u64,
    /// Worker cycles per atomic store (4 bytes) of a row beyond the first (the same
    /// estimator's `3` per `elemsPerAtom`).
    pub multi_update_atom_cycles: u64,
    /// Worker cycles per index outside the worker's range of rows, skipped (the same
    /// estimator's `cyclesPerOffsetOutOfRange`).
    pub multi_update_skip_cycles: u64,
    /// Worker cycles per index in range on the 64-bit path, fp16 rows of 4 elements (the same
    /// estimator's specialised region size: 9), which also saves a cycle of set-up.
    pub multi_update_index_cycles_region64_fp16: u64,
    /// The same for 4-byte rows, per pair of elements (rows of 2 or 4: 8 or 16).
    pub multi_update_index_cycles_region64_fp32_pair: u64,
}

impl Codelets {
    /// The codelets of the Colossus generation (Mk1, Mk2 and Bow: one poplibs codelet library)
    /// as poplibs' estimators and ARCH.md price them; each field's comment gives the source.
    pub const COLOSSUS: Codelets = {
        let basic_op_supervisor = 11;
        Codelets {
            elementwise_supervisor: 12,
            elementwise_worker_setup: 28,
            binary_cycles_per_vector: 3,
            basic_op_supervisor,
            binary_in_place_worker_setup: 58,
            binary_in_place_cycles_per_vector: 3,
            unary_worker_setup: 17,
            unary_exp_worker_setup: 33,
            // The `UnaryOp1D` estimator's 9 and the basic ops' supervisor overhead.
            unary_supervisor: 9 + basic_op_supervisor,
            scaled_add_supervisor: 60,
            scaled_add_worker_setup: 24,
            scaled_add_cycles_per_vector: 3,
            cast_supervisor: 12,
            cast_worker_setup: 37,
            cast_cycles_per_vector: 2,
            cast_vector_width: 4,
            reduce_vertex: 17,
            reduce_per_output_overhead: 12,
            reduce_accumulator_width_fp32: 4,
            reduce_accumulator_width_fp16: 8,
            data_path_bits: 64,
            amp_supervisor: 50,
            amp_conv_group_cycles: 12,
            amp_in_group_cycles: 16,
            amp_last_in_group_cycles: 11,
            amp_out_group_cycles: 19,
            amp_pass_cycles: 6,
            amp_zeroing_pass_cycles: 7,
            amp_in_group_fp32: 8,
            amp_in_group_fp16: 16,
            amp_core_cycles_fp32: 8,
            amp_core_cycles_fp16: 4,
            amp_coeff_load_bytes_per_cycle: 8,
            amp_balance_tag: 14,
            reduce_two_stage_depth: 16,
            reduce_three_stage_depth: 125,
            reduce_add_fixed: 32,
            reduce_add_single_fixed: 20,
            reduce_add_single_supervisor: 33,
            reduce_add_vector: 4,
            reduce_add_loads_per_cycle: 2,
            compute_set_overhead: 30,
            broadcast_cycles_per_vector: 2,
            broadcast_outer_row_cycles: 7,
            broadcast_outer_worker_setup: 15,
            transpose_fp32_fixed: 27,
            transpose_fp32_matrix_cycles: 11,
            transpose_fp32_row_pair_cycles: 6,
            transpose_fp32_column_pair_cycles: 3,
            transpose_fp16_fixed: 29,
            transpose_fp16_matrix_cycles: 18,
            transpose_fp16_row_quad_cycles: 12,
            transpose_fp16_column_quad_cycles: 4,
            transpose_fp32_slow_fixed: 13,
            transpose_fp32_slow_matrix_cycles: 8,
            transpose_fp32_slow_column_cycles: 5,
            transpose_fp32_slow_element_cycles: 2,
            hmac_fp32_overhead: 58,
            hmac_zero_retention: 9,
            hmac_conv_group_cycles: 23,
            hmac_in_group_cycles: 15,
            hmac_out_group_cycles: 10,
            hmac_worker_fixed: 32,
            hmac_run_cycles: 19,
            hmac_position_cycles: 7,
            hmac_empty_run_cycles: 7,
            dot_product_fixed: 7,
            zero_partials_worker: 5,
            hmac_fp16_overhead: 65,
            hmac_1x1_overhead_saving: 10,
            hmac_zero_retention_fp16: 10,
            hmac_worker_retention_fp16: 6,
            hmac_worker_retention_1x1: 15,
            hmac_run_cycles_1x1: 13,
            hmac_position_cycles_1x1: 2,
            dot_product_pair_extra: 4,
            outer_product_fixed: 25,
            outer_product_group_cycles: 11,
            outer_product_fast_position_cycles: 6,
            outer_product_slow_position_cycles: 10,
            outer_product_group_cycles_fp16: 10,
            pool_cycles_per_vector: 3,
            pool_grad_cycles_per_vector: 5,
            multi_update_setup_fp16: 3 + 30 + 4,
            multi_update_setup_fp32: 3 + 29 + 6,
            multi_update_index_cycles_fp16: 12 + 1,
            multi_update_index_cycles_fp32: 11,
            multi_update_atom_cycles: 3,
            multi_update_skip_cycles: 5,
            multi_update_index_cycles_region64_fp16: 9,
            multi_update_index_cycles_region64_fp32_pair: 8,
        }
    };
}

impl Codelets {
    /// The figures that are widths or group sizes, which the costs divide by, named as
    /// [`IpuConfig::validate`](crate::machine::IpuConfig::validate) names them: each must be at
    /// least one.
    pub(crate) fn sizes(&self) -> [(&'static str, u64); 10] {
        [
            ("codelets.cast_vector_width", self.cast_vector_width),
            (
                "codelets.reduce_accumulator_width_fp32",
                self.reduce_accumulator_width_fp32,
            ),
            (
                "codelets.reduce_accumulator_width_fp16",
                self.reduce_accumulator_width_fp16,
            ),
            ("codelets.data_path_bits", self.data_path_bits),
            ("codelets.amp_in_group_fp32", self.amp_in_group_fp32),
            ("codelets.amp_in_group_fp16", self.amp_in_group_fp16),
            (
                "codelets.amp_coeff_load_bytes_per_cycle",
                self.amp_coeff_load_bytes_per_cycle,
            ),
            ("codelets.reduce_add_vector", self.reduce_add_vector),
            (
                "codelets.reduce_add_loads_per_cycle",
                self.reduce_add_loads_per_cycle,
            ),
            (
                "codelets.pool_cycles_per_vector",
                self.pool_cycles_per_vector,
            ),
        ]
    }
}

impl Default for Codelets {
    /// [`Codelets::COLOSSUS`], the table of every preset.
    fn default() -> Self {
        Codelets::COLOSSUS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost;
    use crate::machine::{IpuConfig, MachineError, Preset};
    use tessera_core::DType;

    #[test]
    fn every_preset_carries_the_colossus_table() {
        for p in Preset::ALL {
            assert_eq!(IpuConfig::preset(p).codelets, Codelets::COLOSSUS, "{p}");
        }
        assert_eq!(Codelets::default(), Codelets::COLOSSUS);
    }

    #[test]
    fn the_costs_read_the_machine_s_table() {
        let mk2 = IpuConfig::preset(Preset::Mk2);
        let mut other = mk2.clone();
        other.codelets.compute_set_overhead *= 2;
        assert_eq!(cost::compute_set_overhead_cycles(&mk2), 30);
        assert_eq!(cost::compute_set_overhead_cycles(&other), 60);

        other.codelets.elementwise_supervisor += 100;
        assert_eq!(
            cost::elementwise_binary_cycles(&other, 600, DType::F32),
            cost::elementwise_binary_cycles(&mk2, 600, DType::F32) + 100
        );
        other.codelets.amp_in_group_fp16 = 8;
        assert_eq!(cost::amp_in_group(&other, DType::F16), 8);
        assert_ne!(
            cost::matmul_amp_cycles(&other, 64, 64, 64, DType::F16),
            cost::matmul_amp_cycles(&mk2, 64, 64, 64, DType::F16)
        );
        other.codelets.reduce_two_stage_depth = 4;
        assert_eq!(cost::reduce_stage_factors(&mk2, 4), vec![4]);
        assert_eq!(cost::reduce_stage_factors(&other, 4), vec![2, 2]);
    }

    #[test]
    fn zero_widths_are_refused_and_cost_as_one() {
        let mut c = IpuConfig::preset(Preset::Mk2);
        c.codelets.amp_in_group_fp16 = 0;
        assert_eq!(
            c.validate(),
            Err(MachineError::Zero {
                field: "codelets.amp_in_group_fp16"
            })
        );
        // Unvalidated, every width and group size at zero: the costs take them as one.
        let mut cfg = IpuConfig::preset(Preset::Mk2);
        let t = &mut cfg.codelets;
        t.cast_vector_width = 0;
        t.reduce_accumulator_width_fp32 = 0;
        t.reduce_accumulator_width_fp16 = 0;
        t.data_path_bits = 0;
        t.amp_in_group_fp32 = 0;
        t.amp_in_group_fp16 = 0;
        t.amp_coeff_load_bytes_per_cycle = 0;
        t.reduce_add_vector = 0;
        t.reduce_add_loads_per_cycle = 0;
        t.pool_cycles_per_vector = 0;
        assert!(cfg.codelets.sizes().iter().all(|&(_, v)| v == 0));
        for dtype in [DType::F32, DType::F16] {
            assert!(cost::matmul_amp_cycles(&cfg, 10, 10, 10, dtype) > 0);
            assert!(cost::reduce_cycles(&cfg, 10, 10, dtype) > 0);
            assert!(cost::partials_reduce_cycles(&cfg, 10, 3, dtype, dtype) > 0);
        }
        assert!(cost::cast_cycles(&cfg, 10) > 0);
    }
}
