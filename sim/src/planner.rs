//! Planning a matrix multiply across tiles, as poplibs does: split `[m, k] x [k, n]` into a
//! grid of `pm x pk x pn` tiles, each computing a block's partial product on its AMP; when `k`
//! is split, the partial sums are exchanged and reduced.
//!
//! The joint planning of a fully-connected layer's three training passes is in `fc`.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use tessera_core::DType;

use crate::cost::{self, Codelets, UnaryKind};
use crate::machine::IpuConfig;

mod fc;

pub use fc::{plan_fc, plan_fc_with, FcPlans};

/// How a matmul is split across tiles, and its planned cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatMulPlan {
    /// Splits of m, k and n.
    pub pm: u64,
    /// Split of k (the reduction dimension).
    pub pk: u64,
    /// Split of n.
    pub pn: u64,
    /// Block sizes: `ceil(m / pm)`.
    pub bm: u64,
    /// `ceil(k / pk)`.
    pub bk: u64,
    /// `ceil(n / pn)`.
    pub bn: u64,
    /// Planned cycles (compute, exchange, reduction and syncs), for choosing among plans.
    pub planned_cycles: u64,
    /// Whether the AMP runs the product transposed (`C^T = B^T A^T`): the `n` columns are its
    /// field positions and the `m` rows its output channels. poplibs' planner tries both
    /// ways for matmuls (`swapOperands`, lib/poplin/ConvPlan.cpp).
    #[serde(default)]
    pub swapped: bool,
    /// How blocks are laid on tiles: a pass of a jointly planned fully-connected layer puts
    /// each block on the tile of the forward block holding the same weights.
    #[serde(default)]
    pub order: GridOrder,
    /// Serial steps over each block's `k` range (poplin's serial input-channel split): each
    /// step brings and multiplies `1 / serial` of the block's operands and accumulates into
    /// the same partial sums, so a block whose operands would not fit in its tile's share of
    /// memory runs in several steps. 1 when the block runs at once.
    #[serde(default = "one")]
    pub serial: u64,
    /// Serial steps over each block's `n` range (poplin's serial output-channel split): each
    /// step brings the block's share of `a` and `1 / serial_n` of its columns of `b`, and makes
    /// that share of the output in full, so a block whose partial sums would not fit runs in
    /// several steps. 1 when the block runs at once; at most one of `serial` and `serial_n` is
    /// over 1.
    #[serde(default = "one")]
    pub serial_n: u64,
    /// The vertices that make the partial sums.
    #[serde(default)]
    pub method: Method,
    /// The partial sums' type: half only for fp16 products on the AMP planned with
    /// `partialsType` half ([`PlanOptions::partials`]); see [`MatMulPlan::partials_dtype`].
    #[serde(default)]
    pub partials: PartialsType,
}

/// poplin's `partialsType`: the element type of a product's partial sums. fp32 products always
/// keep fp32 partials (poplin promotes a narrower `partialsType` to the input type,
/// `getConvVertexAMPCandidates`, lib/poplin/ConvVertexType.cpp).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartialsType {
    /// fp32 partial sums: poplin's default (`lib/poplin/ConvOptions.hpp`, `MatMul.cpp`).
    #[default]
    Float,
    /// fp16 partial sums for fp16 products (TensorFlow's `partialsType: 'half'` in
    /// `set_matmul_options` / `set_convolution_options`, PopART's `partialsTypeMatMuls`,
    /// PopTorch's `setPartialsType`): the AMP runs at its fp16 peak, partials take half the
    /// bytes, and the AMP writes an fp16 output itself (no cast).
    Half,
}

impl PartialsType {
    /// The partial sums' element type for products in `dtype`.
    pub fn of(self, dtype: DType) -> DType {
        match (self, dtype) {
            (PartialsType::Half, DType::F16) => DType::F16,
            _ => DType::F32,
        }
    }
}

impl std::fmt::Display for PartialsType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PartialsType::Float => "float",
            PartialsType::Half => "half",
        })
    }
}

/// The options of poplin's planner that users set, per product (TensorFlow's
/// `set_matmul_options` / `set_convolution_options`, PopART's per-IPU proportions).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// poplin's `availableMemoryProportion`: the share of a tile that a product's temporary
    /// memory (operand copies, partial sums, serial accumulators) may take in the planner's
    /// first pass (default [`AVAILABLE_MEMORY_PROPORTION`]). Finite, in `(0, 1]`.
    pub available_memory_proportion: f64,
    /// poplin's `partialsType`.
    pub partials: PartialsType,
    /// Serialization of the products over a vocabulary (PopTorch's
    /// `embedding_serialization_factor`, PopART's `serializeMatMul`): a product whose
    /// reduction (`k`) or output columns (`n`) are `serialized_size` long runs in at least
    /// `serialization` serial steps over that dimension, each bringing and making its share
    /// (1: none).
    #[serde(default = "one")]
    pub serialization: u64,
    /// The length of the dimension [`serialization`](Self::serialization) splits (0: none).
    #[serde(default)]
    pub serialized_size: u64,
}

// Proportions are finite (`validate`), so equality is an equivalence.
impl Eq for PlanOptions {}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            available_memory_proportion: AVAILABLE_MEMORY_PROPORTION,
            partials: PartialsType::Float,
            serialization: 1,
            serialized_size: 0,
        }
    }
}

impl PlanOptions {
    /// Checks the proportion: finite and in `(0, 1]`, as poplin requires of
    /// `availableMemoryProportion` (it refuses values outside `[0, 1]`; 0 leaves no plan).
    ///
    /// # Errors
    ///
    /// The message names the value at fault.
    pub fn validate(&self) -> Result<(), String> {
        check_proportion(self.available_memory_proportion).map_err(|e| {
            format!("available memory proportion {e}: it is the share of each tile a product's temporary memory may take")
        })
    }

    /// The planner's first bound on a tile's temporary bytes.
    pub fn bound_bytes(&self, cfg: &IpuConfig) -> u64 {
        (cfg.sram_bytes_per_tile as f64 * self.available_memory_proportion) as u64
    }

    /// A key for the plan caches.
    fn key(&self) -> (u64, PartialsType, u64, u64) {
        (
            self.available_memory_proportion.to_bits(),
            self.partials,
            self.serialization,
            self.serialized_size,
        )
    }

    /// The fewest serial steps over `len`, a product's `k` or `n`: the serialization's when it
    /// splits that dimension, else 1.
    fn min_steps(&self, len: u64) -> u64 {
        if self.serialization > 1 && len == self.serialized_size {
            self.serialization
        } else {
            1
        }
    }
}

/// How a plan's blocks are multiplied: poplin's convolution methods (`Plan::Method`,
/// `lib/poplin/ConvPlanTypes.hpp`) that Tessera models.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The AMP (`ConvPartial1x1Out`): the default, and every plan but the ones below.
    #[default]
    Amp,
    /// Horizontal MACs (`ConvPartialHorizontalMac`): dot products over input-channel groups of
    /// `group`, one output channel per group. A batch-1 fp32 layer's forward and input-gradient
    /// passes, planned jointly.
    Hmac {
        /// Input channels per group.
        group: u64,
    },
    /// Outer products (`OuterProduct`): a weight update with one input channel (a batch of 1),
    /// output channels in groups of `group`.
    OuterProduct {
        /// Output channels per group.
        group: u64,
    },
}

fn one() -> u64 {
    1
}

/// Part `s` of `parts` nearly equal parts of the range `r` (sizes differing by at most one, in
/// order; empty only when the range is shorter than `parts`).
fn even_part(r: (u64, u64), s: u64, parts: u64) -> (u64, u64) {
    let (len, parts) = (r.1 - r.0, parts.max(1));
    let at = |i: u64| r.0 + (u128::from(len) * u128::from(i.min(parts)) / u128::from(parts)) as u64;
    (at(s), at(s + 1))
}

/// The share of a tile's memory a product's temporary memory (operand copies and partial
/// sums) may take: poplibs' `availableMemoryProportion` default (`lib/poplin/ConvOptions.hpp`,
/// `MatMul.cpp`: 0.6).
pub const AVAILABLE_MEMORY_PROPORTION: f64 = 0.6;

/// poplin's rule for `availableMemoryProportion` as Tessera takes it: finite, in `(0, 1]`
/// (poplin refuses values outside `[0, 1]`; its 0, "minimise temporary memory", is not
/// offered). The error is the value and the range.
///
/// # Errors
///
/// `"{p} is not in (0, 1]"`.
pub fn check_proportion(p: f64) -> Result<(), String> {
    if p.is_finite() && p > 0.0 && p <= 1.0 {
        Ok(())
    } else {
        Err(format!("{p} is not in (0, 1]"))
    }
}

/// Whether a product in `dtype` with reduction length `k`, a kernel of `kernel_area`
/// positions and partial sums of type `partials` makes its output with a compute set of casts
/// from them, even when its `k` is not split. Partials of the output's own type need none.
/// With fp32 partials of an fp16 product: poplin lets the AMP write an output narrower than
/// its partials only when every input channel fits one conv unit's weights and the kernel is
/// 1 x 1 (`getConvVertexAMPCandidates`, `lib/poplin/ConvVertexType.cpp`); otherwise its
/// vertices write fp32 partials and `convolutionImpl` casts them (`popops::cast` in a `Cast`
/// compute set, `lib/poplin/Convolution.cpp`). A matmul is a 1 x 1 convolution with `k`
/// input channels.
pub fn casts_partials(
    cfg: &IpuConfig,
    k: u64,
    kernel_area: u64,
    dtype: DType,
    partials: DType,
) -> bool {
    partials != dtype && !(kernel_area == 1 && k <= cost::amp_in_group(cfg, dtype))
}

/// The most serial steps the planner gives a block (an estimate: poplin's serial splits are
/// a handful; each step costs a sync, an exchange and the AMP's per-call overheads).
pub const MAX_SERIAL_STEPS: u64 = 64;

/// The order in which a plan's blocks `(im, ik, in)` are laid on tiles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GridOrder {
    /// `(im x pk + ik) x pn + in`.
    #[default]
    Standard,
    /// The input-gradient pass of a joint plan, `dX = dY . W^T`: its `k` is the forward's `n`
    /// and its `n` the forward's `k`, so block `(im, ik, in)` sits on the forward's tile
    /// `(im, in, ik)`: `(im x pn + in) x pk + ik` (poplin's `FC_BWD_AS_CONV` tile order).
    FcBackward,
    /// The weight-update pass of a joint plan, `dW = X^T . dY`: its `m` is the forward's `k`
    /// and its `k` the forward's `m`, so block `(im, ik, in)` sits on the forward's tile
    /// `(ik, im, in)`: `(ik x pm + im) x pn + in` (poplin's `FC_WU` tile order).
    FcWeightUpdate,
}

impl MatMulPlan {
    /// Tiles the plan uses.
    pub fn tiles(&self) -> u64 {
        self.pm * self.pk * self.pn
    }

    /// The `k` range of serial step `s` of a block whose `k` range is `k`: the block's range
    /// cut into `serial` nearly equal parts (empty when the block has fewer elements).
    pub fn serial_range(&self, k: (u64, u64), s: u64) -> (u64, u64) {
        even_part(k, s, self.serial)
    }

    /// The `n` range of serial output step `s` of a block whose `n` range is `n`, as
    /// [`MatMulPlan::serial_range`] cuts `k`.
    pub fn serial_n_range(&self, n: (u64, u64), s: u64) -> (u64, u64) {
        even_part(n, s, self.serial_n)
    }

    /// Tile cycles of the vertex making one block's partial sums, `m x k x n`, in this plan's
    /// method and orientation (transposed, the columns are the field and the rows the output
    /// channels).
    pub fn amp_cycles(&self, cfg: &IpuConfig, m: u64, k: u64, n: u64, dtype: DType) -> u64 {
        let (field, out) = if self.swapped { (n, m) } else { (m, n) };
        match self.method {
            Method::Amp => {
                cost::matmul_amp_cycles_with(cfg, field, k, out, dtype, self.partials_dtype())
            }
            Method::Hmac { group } => {
                cost::hmac_cycles(cfg, [field, k, out, group], dtype, self.partials_dtype())
            }
            Method::OuterProduct { group } => {
                cost::outer_product_cycles(cfg, field, out, group, dtype)
            }
        }
    }

    /// The partial sums' element type.
    pub fn partials_dtype(&self) -> DType {
        match self.partials {
            PartialsType::Half => DType::F16,
            PartialsType::Float => DType::F32,
        }
    }

    /// Whether the AMP makes the partial sums (they then live in interleaved memory).
    pub fn on_amp(&self) -> bool {
        self.method == Method::Amp
    }

    /// The blocks (rows x columns) poplin transposes a weight in before the input-gradient pass
    /// of a layer this plan's pass belongs to: the passes' channel groups (`getGroupSizes` in
    /// `lib/poplin/Convolution.cpp`), the AMP's input group by its conv units, or an HMAC
    /// plan's group both ways.
    pub fn transpose_block(&self, cfg: &IpuConfig, dtype: DType) -> (u64, u64) {
        match self.method {
            Method::Hmac { group } | Method::OuterProduct { group } => (group, group),
            Method::Amp => (
                cost::amp_in_group(cfg, dtype),
                cost::amp_conv_units_with(cfg, dtype, self.partials_dtype()),
            ),
        }
    }

    /// The operand whose blocks neighbouring tiles share, so that both tiles of an exchange
    /// bus (tiles `2j`, `2j + 1`) receive the same block and it arrives at twice the rate:
    /// the block the grid's innermost split (of more than one block) does not index, when that
    /// split is even. Standard order runs `n` innermost, so tiles `in`, `in + 1` read the same
    /// block of `a`: poplin lays output channels innermost for this reason (its
    /// `ExchangeEstimator`, `linearizeConvIndices`).
    pub fn paired_operand(&self) -> Option<Operand> {
        let inner: &[(u64, Option<Operand>)] = match self.order {
            GridOrder::Standard => &[
                (self.pn, Some(Operand::A)),
                (self.pk, None),
                (self.pm, Some(Operand::B)),
            ],
            GridOrder::FcBackward => &[
                (self.pk, None),
                (self.pn, Some(Operand::A)),
                (self.pm, Some(Operand::B)),
            ],
            GridOrder::FcWeightUpdate => &[
                (self.pn, Some(Operand::A)),
                (self.pm, Some(Operand::B)),
                (self.pk, None),
            ],
        };
        let &(split, operand) = inner.iter().find(|(split, _)| *split > 1)?;
        operand.filter(|_| split % 2 == 0)
    }

    /// Grid index of block (im, ik, in): the tile it runs on, counted from the first tile.
    pub fn grid(&self, im: u64, ik: u64, i_n: u64) -> u64 {
        match self.order {
            GridOrder::Standard => (im * self.pk + ik) * self.pn + i_n,
            GridOrder::FcBackward => (im * self.pn + i_n) * self.pk + ik,
            GridOrder::FcWeightUpdate => (ik * self.pm + im) * self.pn + i_n,
        }
    }
}

/// Distinct split counts of a dimension of size `d` (each giving a different block size), at
/// most `cap`, thinned to about 48 candidates spread geometrically. Each candidate's block is
/// also offered rounded up to a multiple of `grain`: the AMP works on groups of `grain` inputs
/// or outputs, so a block of 25 outputs costs as much as one of 32 on 8 conv units, and the
/// split giving 24 or 32 may be the better one.
fn splits(d: u64, cap: u64, grain: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut last_block = 0;
    let mut p = 1;
    let grain = grain.max(1);
    while p <= d.min(cap) {
        let b = d.div_ceil(p);
        if b != last_block {
            // The smallest p giving block b: keep it.
            out.push(d.div_ceil(b));
            let aligned = b.next_multiple_of(grain).min(d);
            out.push(d.div_ceil(aligned));
            last_block = b;
        }
        // Geometric stride once the list is long, so huge dimensions stay cheap to plan.
        p = if p < 64 { p + 1 } else { p + p / 16 };
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The geometry of a convolution's activation operand, as the planner prices the bytes a block
/// of it brings: a block of `bm` positions (flattened images of `rows x width`) reads the rows
/// of the source its receptive field covers, whole, for the channels its `bk` patch elements
/// cover (`kernel_area` patch elements a channel), as the lowering reads them and as poplin's
/// planner counts a partition's input with its halo. The operand is `a` (positions along `m`,
/// patch elements along `k`) in a forward or input-gradient pass, `b` (positions along `k`,
/// patch elements along `n`) in a weight-update pass. A matmul has none: its blocks are
/// `bm x bk` and `bk x bn` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Field {
    /// Which operand it is.
    pub operand: Operand,
    /// Positions of an image (along `m` for `a`, along `k` for `b`).
    pub image: u64,
    /// Positions of a row.
    pub width: u64,
    /// Rows of a source image, and elements of a source row.
    pub source: (u64, u64),
    /// Source rows that `r` rows along `m` read: `((r - 1) x num + halo) / den + 1` (a forward
    /// convolution's input: `num` its stride, `halo` `(kernel rows - 1) x dilation`, `den` 1;
    /// an input gradient's output gradient: `num` 1, `den` the stride).
    pub rows: (u64, u64, u64),
    /// Patch elements per channel.
    pub kernel_area: u64,
    /// The share `(num, den)` of the positions along `m` whose products contribute. An input
    /// gradient of a strided convolution is a convolution of the output gradient dilated by
    /// the stride: for each kernel position only the outputs on the stride's grid read a
    /// real element (the others read the dilation's zeros), and poplin counts and computes
    /// only those (`getNumberOfMACs`, `lib/poplin/PerformanceEstimation.hpp`: a kernel
    /// index's output range in steps of `lcm(output stride, input dilation)`; the vertices'
    /// work lists skip the rest): `(ceil(h / sh) x ceil(w / sw), h x w)`, edges aside. `(1,
    /// 1)` for every other field.
    pub contributing: (u64, u64),
}

impl Field {
    /// Positions of a block of `bm` along `m` whose products contribute (see
    /// [`Field::contributing`]).
    pub fn contributing_positions(&self, bm: u64) -> u64 {
        let (num, den) = self.contributing;
        if num >= den || den == 0 {
            return bm;
        }
        (u128::from(bm) * u128::from(num))
            .div_ceil(u128::from(den))
            .try_into()
            .unwrap_or(bm)
    }

    /// Elements of the source a block of `bm` positions by `bk` patch elements reads.
    pub fn elements(&self, bm: u64, bk: u64) -> u64 {
        let (num, halo, den) = self.rows;
        let source_rows = |r: u64| {
            (r.saturating_sub(1).saturating_mul(num).saturating_add(halo) / den.max(1) + 1)
                .min(self.source.0)
        };
        let channels = bk.div_ceil(self.kernel_area.max(1));
        let image = self.image.max(1);
        let rows = if bm >= image {
            bm.div_ceil(image) * self.source.0
        } else {
            // A block not starting at a row's start spans one row more.
            let width = self.width.max(1);
            let r = bm.div_ceil(width) + u64::from(bm % width != 0);
            source_rows(r.min(image / width).max(1))
        };
        rows.saturating_mul(self.source.1).saturating_mul(channels)
    }
}

/// An operand of `a . b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// The left-hand operand (`m x k`).
    A,
    /// The right-hand operand (`k x n`).
    B,
}

/// Which operands of a product are laid out by its plan (each block spread over the tiles
/// that read it, so each of those already holds its share), as poplibs lays out tensors it
/// creates for an op (`createMatMulInputLHS` / `RHS`) and weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LaidOut {
    /// `a`'s block `(im, ik)` is spread over its `pn` tiles.
    pub a: bool,
    /// `b`'s block `(ik, in)` is spread over its `pm` tiles.
    pub b: bool,
}

impl LaidOut {
    /// Neither operand.
    pub const NONE: LaidOut = LaidOut { a: false, b: false };
    /// The right-hand operand (a weight).
    pub const B: LaidOut = LaidOut { a: false, b: true };
}

/// Which orientations of the AMP a plan may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Orientation {
    /// The cheaper of straight and transposed.
    Either,
    /// Transposed (`C^T = B^T A^T`), as a joint plan's passes are.
    Swapped,
}

/// How far a plan's temporary memory is over the bound: 0 within it, `l` when within `2^l`
/// times it (poplin's planner, when no plan meets its bound, plans again with the bound
/// doubled until it reaches twice the tile's bytes: `minimizeMemory` in `runPlanner`,
/// `lib/poplin/ConvPlan.cpp`), and `OVER_EVERY_BOUND` beyond that (poplin then plans for
/// cycles alone).
pub type BoundLevel = u32;

/// The level of a plan within none of the doubled bounds.
pub const OVER_EVERY_BOUND: BoundLevel = BoundLevel::MAX;

/// How a product is computed, besides its shape, grid and type ([`price`]).
#[derive(Clone, Copy)]
struct Pass {
    /// Which operands are laid out already.
    laid_out: LaidOut,
    /// Which orientations of the AMP the plan may use.
    orientation: Orientation,
    /// The order of the grid's blocks on the tiles.
    order: GridOrder,
    /// The vertices that compute the blocks.
    method: Method,
    /// A convolution's field, for an operand gathered from its image.
    field: Option<Field>,
}

/// Prices the plan `pm x pk x pn` of `[m, k] x [k, n]`: (its bound level, plan). The
/// fewest serial steps that bring a tile's temporary memory under the lowest bound some
/// number of steps meets ([`Pricing::serial_steps`]), and the cycles of the plan with them
/// ([`Pricing::cycles`]), computed as `pass` says.
fn price(
    cfg: &IpuConfig,
    opts: PlanOptions,
    [m, k, n]: [u64; 3],
    [pm, pk, pn]: [u64; 3],
    dtype: DType,
    pass: Pass,
) -> (BoundLevel, MatMulPlan) {
    let Pass {
        laid_out,
        orientation,
        order,
        method,
        field,
    } = pass;
    // The partial sums' type (fp16 only for fp16 products with half partials, on the AMP or
    // horizontal MACs: outer products keep fp32 partials).
    let partials = match method {
        Method::Amp | Method::Hmac { .. } => opts.partials.of(dtype),
        Method::OuterProduct { .. } => DType::F32,
    };
    let (bm, bk, bn) = (m.div_ceil(pm), k.div_ceil(pk), n.div_ceil(pn));
    let pr = Pricing {
        cfg,
        opts,
        k,
        n,
        grid: [pm, pk, pn],
        block: [bm, bk, bn],
        dtype,
        partials,
        laid_out,
        orientation,
        method,
        field,
        superstep: cost::compute_set_overhead_cycles(cfg) + cfg.sync_cycles,
        // In serial steps over k (poplin's loop) each step's fresh partials are added into an
        // fp32 accumulator of the tile's share of the output (and, when k is split, first
        // reduced into an fp32 sum of the same share).
        out_share: (bm * bn).div_ceil(pk),
        // Partial sums are of the partials' type when k is split (over tiles or serially) and
        // when the output is narrower but poplin's AMP cannot write it (`casts_partials`): a
        // cast then makes it.
        casts: casts_partials(cfg, k, 1, dtype, partials),
    };
    let (level, (sk, sn)) = pr.serial_steps();
    let (total, swapped) = pr.cycles(sk, sn);
    let plan = MatMulPlan {
        pm,
        pk,
        pn,
        bm,
        bk,
        bn,
        planned_cycles: total,
        swapped,
        order,
        serial: sk,
        serial_n: sn,
        method,
        partials: if partials == DType::F16 {
            PartialsType::Half
        } else {
            PartialsType::Float
        },
    };
    (level, plan)
}

/// A plan being priced ([`price`]).
struct Pricing<'c> {
    cfg: &'c IpuConfig,
    opts: PlanOptions,
    k: u64,
    n: u64,
    /// Tiles along m, k and n.
    grid: [u64; 3],
    /// A tile's block along m, k and n.
    block: [u64; 3],
    dtype: DType,
    /// The partial sums' type.
    partials: DType,
    laid_out: LaidOut,
    orientation: Orientation,
    method: Method,
    field: Option<Field>,
    /// A compute set's overhead and its sync.
    superstep: u64,
    /// A tile's share of the output when k is split.
    out_share: u64,
    /// Whether a cast makes the output from the partial sums.
    casts: bool,
}

impl Pricing<'_> {
    /// The operand bytes a tile receives for a step over `bk` of k and `bn` of n (a
    /// convolution's input with its receptive field, `Field`). An operand laid out by the
    /// plan is spread over the tiles that read each block (each holds 1/pn of its block of a,
    /// 1/pm of its block of b): each receives the rest.
    fn received(&self, bk: u64, bn: u64) -> u64 {
        let [pm, _, pn] = self.grid;
        let bm = self.block[0];
        let s = self.dtype.size() as u64;
        let share = |bytes: u64, over: u64, laid_out: bool| {
            if laid_out {
                bytes * (over - 1) / over
            } else {
                bytes
            }
        };
        let a_elements = match self.field {
            Some(f) if f.operand == Operand::A => f.elements(bm, bk),
            _ => bm * bk,
        };
        let b_elements = match self.field {
            Some(f) if f.operand == Operand::B => f.elements(bk, bn),
            _ => bk * bn,
        };
        share(a_elements * s, pn, self.laid_out.a) + share(b_elements * s, pm, self.laid_out.b)
    }

    /// Temporary bytes on a tile of `sk` steps over k or `sn` steps over n (one of them 1):
    /// the operand copies it receives and its partial sums. An fp32 output is its own
    /// accumulator (only a reduced step's sum is temporary).
    fn block_bytes(&self, sk: u64, sn: u64) -> u64 {
        let [bm, bk, bn] = self.block;
        let pk = self.grid[1];
        let ps = self.partials.size() as u64;
        let accumulators = u64::from(pk > 1) + u64::from(self.dtype != self.partials);
        let bn_s = bn.div_ceil(sn);
        self.received(bk.div_ceil(sk), bn_s)
            + if sk > 1 {
                bm * bn * ps + self.out_share * ps * accumulators
            } else if pk > 1 || self.casts {
                bm * bn_s * ps
            } else {
                0
            }
    }

    /// The partials' reduction of blocks `bn` wide into `out`, stage by stage as poplin plans
    /// it: a stage summing f blocks spreads each result over the f x (tiles so far) tiles
    /// holding them.
    fn reduction(&self, out: DType, bn: u64) -> u64 {
        let (cfg, partials, pk, bm) = (self.cfg, self.partials, self.grid[1], self.block[0]);
        let ps = partials.size() as u64;
        let mut spread = 1;
        let mut cycles = 0;
        let factors = cost::stage_factors(cfg, pk);
        for (st, &f) in factors.iter().enumerate() {
            let last = st + 1 == factors.len();
            let holders = if last { pk } else { (spread * f).min(pk) };
            let share = (bm * bn).div_ceil(holders);
            let out = if last { out } else { partials };
            cycles += cost::exchange_cycles(cfg, share * (f - 1) * ps, false)
                + cost::partials_reduce_cycles(cfg, share, f, out, partials)
                + self.superstep;
            spread *= f;
        }
        cycles
    }

    /// Cycles of `sk` steps over k or `sn` steps over n, and whether the AMP runs transposed.
    fn cycles(&self, sk: u64, sn: u64) -> (u64, bool) {
        let (cfg, dtype, partials) = (self.cfg, self.dtype, self.partials);
        let [bm, bk, bn] = self.block;
        let pk = self.grid[1];
        let superstep = self.superstep;
        let (bk_s, bn_s) = (bk.div_ceil(sk), bn.div_ceil(sn));
        // The AMP's cost of one step (the whole block when it runs at once), in the
        // orientation allowed, the cheaper when both are.
        let vertex = |field: u64, k: u64, out: u64| match self.method {
            Method::Amp => cost::matmul_amp_cycles_with(cfg, field, k, out, dtype, partials),
            Method::Hmac { group } => {
                cost::hmac_cycles(cfg, [field, k, out, group], dtype, partials)
            }
            Method::OuterProduct { group } => {
                cost::outer_product_cycles(cfg, field, out, group, dtype)
            }
        };
        let transposed = vertex(bn_s, bk_s, bm);
        let (step_amp, swapped) = match self.orientation {
            Orientation::Swapped => (transposed, true),
            Orientation::Either => {
                // Positions along the AMP's field that no product reaches are skipped (a
                // strided convolution's input gradient); transposed, they are output channels
                // and are computed.
                let field_m = self.field.map_or(bm, |f| f.contributing_positions(bm));
                let straight = vertex(field_m, bk_s, bn_s);
                (straight.min(transposed), transposed < straight)
            }
        };
        // The planner prices no exchange-bus pair discount (poplin's does, for its input when
        // the output-channel split is even): in Tessera's element-order layouts the plans it
        // favours, with many narrow column blocks, cut every downstream tensor into a region
        // per row of a block, which costs region overheads and exchange code the planner does
        // not see. The exchanges of the lowered program count what pairs do share.
        let exchange = cost::exchange_cycles(cfg, self.received(bk_s, bn_s), false);
        let mut total = sk * sn * (step_amp + exchange + superstep);
        // Each tile casts its share of fp32 results to the output.
        let cast = |n: u64| cost::cast_cycles(cfg, n) + superstep;
        if sk > 1 {
            // poplin's serial loop over k: every step reduces its partials to fp32 and copies
            // (the first) or adds them into the accumulator, which is cast to the output after
            // the loop.
            total += sk * (self.reduction(partials, bn) + superstep)
                + UnaryKind::Copy.cycles(cfg, self.out_share, partials)
                + (sk - 1) * cost::binary_in_place_cycles(cfg, self.out_share, partials);
            if dtype != partials {
                total += cast(self.out_share);
            }
        } else {
            total += sn * self.reduction(dtype, bn_s);
            if pk == 1 && self.casts {
                total += sn * cast(bm * bn_s);
            }
        }
        (total, swapped)
    }

    /// The plan's temporary memory on a tile (the operand copies it receives and its fp32
    /// partial sums) may take `AVAILABLE_MEMORY_PROPORTION` of the tile, as poplibs' planner
    /// bounds it; plans over that are a last resort, ranked by the doubled bound they meet
    /// (`BoundLevel`). A block over the bound runs in serial steps, over k (each step bringing
    /// its share of both operands, its partials added into an accumulator) or over n (each
    /// bringing the whole block of a and its share of b's columns, and making its share of the
    /// output in full): the fewest steps of either kind that bring it under the lowest bound
    /// some number of steps meets, the cheaper kind when both do. (The level, (sk, sn)).
    fn serial_steps(&self) -> (BoundLevel, (u64, u64)) {
        let (cfg, dtype) = (self.cfg, self.dtype);
        let [_, bk, bn] = self.block;
        let pk = self.grid[1];
        let most_k = bk
            .div_ceil(cost::amp_in_group(cfg, dtype))
            .clamp(1, MAX_SERIAL_STEPS);
        let most_n = bn
            .div_ceil(cost::amp_conv_units_with(cfg, dtype, self.partials))
            .clamp(1, MAX_SERIAL_STEPS);
        // A serialized dimension takes at least its serialization's steps.
        let (min_k, min_n) = (self.opts.min_steps(self.k), self.opts.min_steps(self.n));
        let mut level = 0;
        let mut bound = self.opts.bound_bytes(cfg);
        loop {
            let over_k = if min_n > 1 {
                None
            } else {
                (min_k..=most_k.max(min_k)).find(|&st| self.block_bytes(st, 1) <= bound)
            };
            // Steps over n are taken only when k is not split across tiles (each step's
            // reduction would share out a narrower block than the output's layout).
            let over_n = if pk == 1 && min_k == 1 {
                (min_n.max(2)..=most_n.max(min_n)).find(|&st| self.block_bytes(1, st) <= bound)
            } else {
                None
            };
            let steps = match (over_k, over_n) {
                (Some(1), _) => Some((1, 1)),
                (Some(st_k), Some(st_n)) => {
                    if self.cycles(1, st_n).0 < self.cycles(st_k, 1).0 {
                        Some((1, st_n))
                    } else {
                        Some((st_k, 1))
                    }
                }
                (Some(st_k), None) => Some((st_k, 1)),
                (None, Some(st_n)) => Some((1, st_n)),
                (None, None) => None,
            };
            if let Some(steps) = steps {
                return (level, steps);
            }
            if bound >= 2 * cfg.sram_bytes_per_tile {
                return (OVER_EVERY_BOUND, (1, 1));
            }
            level += 1;
            bound = bound.saturating_mul(2);
        }
    }
}

/// Every candidate grid `(pm, pk, pn)` of `[m, k] x [k, n]` on up to `tiles` tiles.
fn candidates(
    cfg: &IpuConfig,
    opts: PlanOptions,
    [m, k, n]: [u64; 3],
    dtype: DType,
    tiles: u64,
) -> Vec<[u64; 3]> {
    let tiles = tiles.max(1);
    // Either m or n (whichever the AMP takes as output channels) groups by conv units.
    let (k_grain, out_grain) = (
        cost::amp_in_group(cfg, dtype),
        cost::amp_conv_units_with(cfg, dtype, opts.partials.of(dtype)),
    );
    let mut out = Vec::new();
    for &pm in &splits(m, tiles, out_grain) {
        for &pn in &splits(n, tiles / pm, out_grain) {
            for &pk in &splits(k, tiles / (pm * pn), k_grain) {
                out.push([pm, pk, pn]);
            }
        }
    }
    out
}

/// The plan used when a dimension is empty of candidates (never, as `splits` offers 1).
fn whole(m: u64, k: u64, n: u64) -> MatMulPlan {
    MatMulPlan {
        pm: 1,
        pk: 1,
        pn: 1,
        bm: m,
        bk: k,
        bn: n,
        planned_cycles: u64::MAX,
        swapped: false,
        order: GridOrder::Standard,
        serial: 1,
        serial_n: 1,
        method: Method::Amp,
        partials: PartialsType::Float,
    }
}

/// A machine's identity for the plan caches and the lowering's memo (whose keys pick the tiles
/// a node's temporaries spread from): a hash of its description. The codelets' table is part of
/// the description only when it is not [`Codelets::COLOSSUS`], every preset's, so a machine's
/// key, and the tiles its layouts start from, are the hash of its other figures while it runs
/// the Colossus codelets. The pod network, which places nothing, is never part of it.
pub(crate) fn machine_key(cfg: &IpuConfig) -> u128 {
    let mut text = format!("{cfg:?}");
    // The pod network (the last field) places nothing; the Colossus table (the one before it)
    // is every preset's.
    let cut = if cfg.codelets == Codelets::COLOSSUS {
        ", codelets: "
    } else {
        ", pod: "
    };
    if let Some(at) = text.rfind(cut) {
        text.truncate(at);
        text.push_str(" }");
    }
    xxhash_rust::xxh3::xxh3_128(text.as_bytes())
}

/// What [`plan_matmul`] reads of a product: `m`, `k`, `n`, element type, the operands laid
/// out by the plan, tiles and field.
pub(crate) type ProductKey = (u64, u64, u64, DType, LaidOut, u64, Option<Field>);

/// A key of [`plan_matmul`]'s arguments (the machine by [`machine_key`], the options by
/// [`PlanOptions::key`]).
type MatMulKey = (u128, (u64, PartialsType, u64, u64), ProductKey);
/// A key of [`plan_fc`]'s arguments.
type FcKey = (
    u128,
    u64,
    u64,
    u64,
    DType,
    u64,
    (u64, PartialsType, u64, u64),
);

/// Plans made in this process. Planning is a function of its arguments alone, and a pipeline
/// split, its search for the fewest IPUs and a sweep plan the same layers many times.
static MATMUL_PLANS: std::sync::LazyLock<std::sync::Mutex<HashMap<MatMulKey, MatMulPlan>>> =
    std::sync::LazyLock::new(Default::default);
static FC_PLANS: std::sync::LazyLock<std::sync::Mutex<HashMap<FcKey, FcPlans>>> =
    std::sync::LazyLock::new(Default::default);

/// [`plan_matmul`], made once per process for each machine (`machine` is its
/// [`machine_key`]), options and product.
pub(crate) fn plan_matmul_cached(
    cfg: &IpuConfig,
    machine: u128,
    opts: PlanOptions,
    product: ProductKey,
) -> MatMulPlan {
    let (m, k, n, dtype, laid_out, tiles, field) = product;
    cached(&MATMUL_PLANS, (machine, opts.key(), product), || {
        plan_product_with(cfg, [m, k, n], dtype, laid_out, tiles, opts, field)
    })
}

/// The value of `key` in `cache`, made by `make` (outside the lock) when absent. A poisoned
/// lock only loses the cache: the value is made again.
fn cached<K: std::hash::Hash + Eq, V: Copy>(
    cache: &std::sync::Mutex<HashMap<K, V>>,
    key: K,
    make: impl FnOnce() -> V,
) -> V {
    if let Some(v) = cache.lock().ok().and_then(|c| c.get(&key).copied()) {
        return v;
    }
    let v = make();
    if let Ok(mut c) = cache.lock() {
        c.insert(key, v);
    }
    v
}

/// [`plan_fc`] of a layer of `[batch, input, output]`, made once per process for each machine
/// and arguments.
pub(crate) fn plan_fc_cached(
    cfg: &IpuConfig,
    machine: u128,
    [batch, input, output]: [u64; 3],
    dtype: DType,
    tiles: u64,
    opts: PlanOptions,
) -> FcPlans {
    let key = (machine, batch, input, output, dtype, tiles, opts.key());
    cached(&FC_PLANS, key, || {
        plan_fc_with(cfg, batch, input, output, dtype, tiles, opts)
    })
}

/// The cheapest plan for `[m, k] x [k, n]` in `dtype` on up to `tiles` tiles, with the
/// operands `laid_out` by the plan (as weights, and tensors created for the op, are) already
/// partly on the tiles that read them.
pub fn plan_matmul(
    cfg: &IpuConfig,
    m: u64,
    k: u64,
    n: u64,
    dtype: DType,
    laid_out: LaidOut,
    tiles: u64,
) -> MatMulPlan {
    plan_matmul_with(
        cfg,
        [m, k, n],
        dtype,
        laid_out,
        tiles,
        PlanOptions::default(),
    )
}

/// [`plan_matmul`] of `[m, k] x [k, n]` with the planner's options
/// (`availableMemoryProportion`, `partialsType`).
pub fn plan_matmul_with(
    cfg: &IpuConfig,
    [m, k, n]: [u64; 3],
    dtype: DType,
    laid_out: LaidOut,
    tiles: u64,
    opts: PlanOptions,
) -> MatMulPlan {
    plan_product_with(cfg, [m, k, n], dtype, laid_out, tiles, opts, None)
}

/// [`plan_matmul_with`] for a product whose left-hand operand may be a convolution's
/// activation (`field`, whose blocks bring their receptive field).
pub fn plan_product_with(
    cfg: &IpuConfig,
    [m, k, n]: [u64; 3],
    dtype: DType,
    laid_out: LaidOut,
    tiles: u64,
    opts: PlanOptions,
    field: Option<Field>,
) -> MatMulPlan {
    let mut best: Option<((BoundLevel, u64, u64), MatMulPlan)> = None;
    for grid in candidates(cfg, opts, [m, k, n], dtype, tiles) {
        let (level, plan) = price(
            cfg,
            opts,
            [m, k, n],
            grid,
            dtype,
            Pass {
                laid_out,
                orientation: Orientation::Either,
                order: GridOrder::Standard,
                method: Method::Amp,
                field,
            },
        );
        let key = (level, plan.planned_cycles, plan.tiles());
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, plan));
        }
    }
    // A vector-matrix product (one row: a batch-1 layer, a decode step) can also run on
    // horizontal MACs, as poplin's candidates allow (`getConvVertexHMACCandidates`), in whole
    // groups of input channels over a grid that does not split the row.
    if m == 1 && field.is_none() {
        for (level, plan) in fc::hmac_products(cfg, opts, [k, n], dtype, laid_out, tiles) {
            let key = (level, plan.planned_cycles, plan.tiles());
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, plan));
            }
        }
    }
    best.map(|(_, p)| p).unwrap_or_else(|| whole(m, k, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Preset;

    #[test]
    fn a_machine_s_key_holds_its_codelets_table_only_when_it_is_not_the_colossus_one() {
        let mk2 = IpuConfig::preset(Preset::Mk2);
        let text = format!("{mk2:?}");
        let figures = &text[..text.rfind(", codelets: ").unwrap()];
        assert!(figures.ends_with("streaming_memory_bytes_per_second: 20000000000.0"));
        assert_eq!(
            machine_key(&mk2),
            xxhash_rust::xxh3::xxh3_128(format!("{figures} }}").as_bytes())
        );
        let mut other = mk2.clone();
        other.codelets.compute_set_overhead += 1;
        assert_ne!(machine_key(&other), machine_key(&mk2));
        let described = format!("{other:?}");
        let without_pod = &described[..described.rfind(", pod: ").unwrap()];
        assert_eq!(
            machine_key(&other),
            xxhash_rust::xxh3::xxh3_128(format!("{without_pod} }}").as_bytes())
        );
        // The pod network places nothing: it is no part of the key.
        let mut card = mk2.clone();
        card.pod = None;
        assert_eq!(machine_key(&card), machine_key(&mk2));
        other.pod = None;
        assert_eq!(
            machine_key(&other),
            xxhash_rust::xxh3::xxh3_128(format!("{without_pod} }}").as_bytes())
        );
    }

    /// A 3 x 3, stride-1 convolution on 56 x 56 images: the forward input's geometry.
    fn field_3x3() -> Field {
        Field {
            operand: Operand::A,
            image: 56 * 56,
            width: 56,
            source: (56, 56),
            rows: (1, 2, 1),
            kernel_area: 9,
            contributing: (1, 1),
        }
    }

    /// A block brings the rows its receptive field covers, whole, for its channels: one
    /// output row of a 3 x 3 convolution reads three input rows, not nine times its patch;
    /// a 1 x 1 stride-2 one's output row reads one input row of twice its width.
    #[test]
    fn a_conv_block_brings_its_receptive_field() {
        let f = field_3x3();
        // One whole output row (aligned), 64 channels.
        assert_eq!(f.elements(56, 64 * 9), 3 * 56 * 64);
        // Less than a row, not aligned: it may span two rows, so four input rows.
        assert_eq!(f.elements(30, 16 * 9), 4 * 56 * 16);
        // Two whole images.
        assert_eq!(f.elements(2 * 56 * 56, 9), 2 * 56 * 56);
        let down = Field {
            image: 28 * 28,
            width: 28,
            source: (56, 56),
            rows: (2, 0, 1),
            kernel_area: 1,
            ..field_3x3()
        };
        assert_eq!(down.elements(28, 256), 56 * 256);
        // An input gradient's block reads the output gradient rows its rows feed.
        let grad = Field {
            image: 56 * 56,
            width: 56,
            source: (28, 28),
            rows: (1, 0, 2),
            kernel_area: 1,
            ..field_3x3()
        };
        assert_eq!(grad.elements(2 * 56, 64), 28 * 64);
    }

    proptest::proptest! {
        /// A block of a stride-1 convolution brings at least the input rows its own
        /// positions cover and at most every row of the images it touches, and more patch
        /// elements (more channels) never bring fewer.
        #[test]
        fn a_conv_block_brings_its_rows_and_no_more_than_its_images(
            bm in 1u64..10_000,
            bk in 1u64..600,
        ) {
            let f = field_3x3();
            let channels = bk.div_ceil(9);
            let got = f.elements(bm, bk);
            let own_rows = bm.div_ceil(56).min(56 * bm.div_ceil(56 * 56));
            proptest::prop_assert!(got >= own_rows * 56 * channels);
            proptest::prop_assert!(got <= bm.div_ceil(56 * 56) * 56 * 56 * channels);
            proptest::prop_assert!(got <= f.elements(bm, bk + 9));
        }
    }

    #[test]
    fn splits_are_distinct_and_bounded() {
        for grain in [1, 8, 16] {
            let s = splits(784, 1472, grain);
            assert_eq!(s[0], 1);
            assert!(s.windows(2).all(|w| w[0] < w[1]));
            assert!(s.iter().all(|&p| p <= 784));
            assert!(splits(1_000_000, 1472, grain).len() < 400);
        }
    }

    #[test]
    fn splits_offer_blocks_aligned_to_the_grain() {
        // 10,000 outputs in blocks of 24 (417 tiles) or 32 (313 tiles), multiples of 8.
        let s = splits(10_000, 1216, 8);
        for p in [417, 313] {
            assert!(s.contains(&p), "{p} missing");
        }
    }

    proptest::proptest! {
        #[test]
        fn grid_orders_lay_each_pass_on_the_forward_tiles_of_its_weights(
            pm in 1u64..12, pk in 1u64..12, pn in 1u64..12,
        ) {
            grid_orders_agree(pm, pk, pn);
        }
    }

    fn grid_orders_agree(pm: u64, pk: u64, pn: u64) {
        {
            let plan = |pm, pk, pn, order| MatMulPlan {
                pm,
                pk,
                pn,
                bm: 1,
                bk: 1,
                bn: 1,
                planned_cycles: 0,
                swapped: true,
                order,
                serial: 1,
                serial_n: 1,
                method: Method::Amp,
                partials: PartialsType::Float,
            };
            let f = plan(pm, pk, pn, GridOrder::Standard);
            let b = plan(pm, pn, pk, GridOrder::FcBackward);
            let w = plan(pk, pm, pn, GridOrder::FcWeightUpdate);
            // Each order is a bijection of the blocks onto the tiles: with the equalities
            // below, every tile is met once.
            let mut seen = vec![false; (pm * pk * pn) as usize];
            for im in 0..pm {
                for ik in 0..pk {
                    for i_n in 0..pn {
                        let t = f.grid(im, ik, i_n);
                        // dX's block (batch im, output in, input ik) reads W's block (ik, in);
                        // dW's block (input ik, batch im, output in) writes it.
                        assert_eq!(b.grid(im, i_n, ik), t);
                        assert_eq!(w.grid(ik, im, i_n), t);
                        assert!(!seen[t as usize], "tile {t} twice");
                        seen[t as usize] = true;
                    }
                }
            }
            assert!(seen.iter().all(|&x| x));
        }
    }

    #[test]
    fn a_batch_1_fp32_layer_is_planned_on_horizontal_macs_in_whole_groups() {
        // poplin's joint plan for 1 x 1000 -> 1000 in fp32 on Mk1: HMAC forward and input
        // gradient, outer-product weight update, every split in whole groups of a common group
        // dividing both sizes, the batch not split.
        let cfg = IpuConfig::preset(Preset::Mk1);
        let p = plan_fc(&cfg, 1, 1000, 1000, DType::F32, cfg.tiles.into());
        assert!(p.joint, "{p:?}");
        let Method::Hmac { group } = p.forward.method else {
            panic!("{p:?}");
        };
        assert!(group == 1 || (group % 4 == 0 && 1000 % group == 0), "{p:?}");
        assert_eq!(p.backward.method, Method::Hmac { group });
        assert_eq!(p.weight_update.method, Method::OuterProduct { group });
        let f = p.forward;
        assert_eq!(f.pm, 1);
        assert!(f.bk % group == 0 && f.bn % group == 0, "{p:?}");
        assert_eq!((p.backward.pk, p.backward.pn), (f.pn, f.pk));
        assert_eq!(
            (p.weight_update.pm, p.weight_update.pk, p.weight_update.pn),
            (f.pk, 1, f.pn)
        );
        // poplin's groups cap the grid at (1000 / g)^2 tiles.
        assert!(f.tiles() <= (1000 / group).pow(2), "{p:?}");
        // A larger batch, or fp16, keeps the AMP.
        for (batch, dtype) in [(4, DType::F32), (1, DType::F16)] {
            let p = plan_fc(&cfg, batch, 1000, 1000, dtype, cfg.tiles.into());
            assert!(
                [p.forward, p.backward, p.weight_update]
                    .iter()
                    .all(|q| q.method == Method::Amp),
                "{batch} {dtype:?}: {p:?}"
            );
        }
    }

    #[test]
    fn a_batch_1_fp16_layer_takes_horizontal_macs_where_poplins_estimates_favour_them() {
        // 1 x 4096 -> 4096 in fp16 with fp32 partials on Mk2: poplin's HMAC (its 1x1
        // specialisation) beats the AMP, whose passes over one position are mostly overhead;
        // the group is even and a multiple of the AMP's conv units (the weight update's output
        // channels are the forward's input channels).
        let cfg = IpuConfig::preset(Preset::Mk2);
        let opts = PlanOptions {
            partials: PartialsType::Float,
            ..PlanOptions::default()
        };
        let p = fc::plan_fc_with(&cfg, 1, 4096, 4096, DType::F16, cfg.tiles.into(), opts);
        let Method::Hmac { group } = p.forward.method else {
            panic!("{p:?}");
        };
        let units = cost::amp_conv_units_with(&cfg, DType::F16, DType::F32);
        assert!(group % units == 0 && group % 2 == 0, "{p:?}");
        assert_eq!(p.weight_update.method, Method::OuterProduct { group });
        // The same layer at batch 16 keeps the AMP.
        let q = fc::plan_fc_with(&cfg, 16, 4096, 4096, DType::F16, cfg.tiles.into(), opts);
        assert_eq!(q.forward.method, Method::Amp, "{q:?}");
    }

    #[test]
    fn a_one_row_product_may_run_on_horizontal_macs() {
        // [1, 1024] x [1024, 1024] in fp32 (a batch-1 layer at inference, a decode step):
        // horizontal MACs in whole groups, the row not split.
        let cfg = IpuConfig::preset(Preset::Mk2);
        let p = plan_matmul(
            &cfg,
            1,
            1024,
            1024,
            DType::F32,
            LaidOut::B,
            cfg.tiles.into(),
        );
        let Method::Hmac { group } = p.method else {
            panic!("{p:?}");
        };
        assert_eq!(p.pm, 1);
        assert!(p.bk % group == 0 && p.bn % group == 0, "{p:?}");
        // Two rows keep the AMP (horizontal MACs are planned for one row only).
        let q = plan_matmul(
            &cfg,
            2,
            1024,
            1024,
            DType::F32,
            LaidOut::B,
            cfg.tiles.into(),
        );
        assert_eq!(q.method, Method::Amp, "{q:?}");
    }

    #[test]
    fn a_small_layer_is_planned_jointly_and_a_joint_plan_is_consistent() {
        // 1 x 1000 -> 5 (fp32, Mk1): planned alone, the weight update would spread its 5,000
        // products over hundreds of tiles and then move the gradient to the weights.
        let cfg = IpuConfig::preset(Preset::Mk1);
        let p = plan_fc(&cfg, 1, 1000, 5, DType::F32, 1216);
        assert!(p.joint, "{p:?}");
        let (f, b, w) = (p.forward, p.backward, p.weight_update);
        assert_eq!((b.pm, b.pk, b.pn), (f.pm, f.pn, f.pk));
        assert_eq!((w.pm, w.pk, w.pn), (f.pk, f.pm, f.pn));
        assert!(f.swapped && b.swapped && w.swapped);
        assert_eq!(
            (f.order, b.order, w.order),
            (
                GridOrder::Standard,
                GridOrder::FcBackward,
                GridOrder::FcWeightUpdate
            )
        );
        assert!(w.tiles() == f.tiles() && f.tiles() < 300, "{p:?}");
        // Never dearer than the separate plans, whichever is taken.
        for (batch, input, output) in [(16, 1000, 5), (16, 1000, 1000), (32, 784, 256)] {
            let p = plan_fc(&cfg, batch, input, output, DType::F32, 1216);
            let alone = plan_matmul(&cfg, batch, input, output, DType::F32, LaidOut::B, 1216);
            assert!(p.joint || p.forward == alone, "{p:?}");
            assert!(p.planned_cycles() > 0);
        }
    }

    #[test]
    fn the_operand_neighbouring_tiles_share_follows_the_grid_order() {
        let grid = |[pm, pk, pn]: [u64; 3], order| MatMulPlan {
            pm,
            pk,
            pn,
            order,
            ..whole(64, 64, 64)
        };
        let (s, b, w) = (
            GridOrder::Standard,
            GridOrder::FcBackward,
            GridOrder::FcWeightUpdate,
        );
        for (split, order, want) in [
            ([2, 3, 4], s, Some(Operand::A)),
            ([2, 3, 5], s, None),
            ([2, 3, 1], s, None),
            ([4, 1, 1], s, Some(Operand::B)),
            ([3, 1, 1], s, None),
            ([1, 1, 1], s, None),
            ([2, 4, 2], b, None),
            ([2, 1, 2], b, Some(Operand::A)),
            ([2, 3, 1], b, None),
            ([2, 3, 4], w, Some(Operand::A)),
            ([2, 3, 1], w, Some(Operand::B)),
        ] {
            let p = grid(split, order);
            assert_eq!(p.paired_operand(), want, "{split:?} {order:?}");
            // Whatever it says, neighbours (2j, 2j + 1) of the grid do read the same block.
            if let Some(op) = want {
                let blocks = |t: u64| {
                    let mut found = None;
                    for im in 0..p.pm {
                        for ik in 0..p.pk {
                            for i_n in 0..p.pn {
                                if p.grid(im, ik, i_n) == t {
                                    found = Some(match op {
                                        Operand::A => (im, ik),
                                        Operand::B => (ik, i_n),
                                    });
                                }
                            }
                        }
                    }
                    found.unwrap()
                };
                for j in 0..p.tiles() / 2 {
                    assert_eq!(blocks(2 * j), blocks(2 * j + 1), "{split:?} {order:?}");
                }
            }
        }
    }

    #[test]
    fn serial_steps_bring_a_block_under_the_memory_bound() {
        let cfg = IpuConfig::preset(Preset::Mk2)
            .with_tiles(16)
            .with_sram_bytes_per_tile(48 * 1024);
        let bound = (cfg.sram_bytes_per_tile as f64 * AVAILABLE_MEMORY_PROPORTION) as u64;
        let p = plan_matmul(&cfg, 64, 4096, 64, DType::F32, LaidOut::NONE, 16);
        assert!(p.serial > 1 && p.serial_n == 1, "{p:?}");
        let step_k = p.bk.div_ceil(p.serial);
        // A step's operands, its partial sums and, with k split across tiles, the reduced sum of
        // the tile's share (the fp32 output is its own accumulator).
        let partials = p.bm * p.bn * 4;
        let accumulator = (p.bm * p.bn).div_ceil(p.pk) * 4 * u64::from(p.pk > 1);
        let temp = (p.bm * step_k + step_k * p.bn) * 4 + partials + accumulator;
        assert!(temp <= bound, "{p:?}: {temp} B");
        // The steps cover the block's k range exactly.
        let k = (0, p.bk);
        let covered: u64 = (0..p.serial)
            .map(|s| {
                let r = p.serial_range(k, s);
                r.1 - r.0
            })
            .sum();
        assert_eq!(covered, p.bk);
        // A product that fits at once runs at once.
        let small = plan_matmul(&cfg, 16, 64, 16, DType::F32, LaidOut::NONE, 16);
        assert_eq!((small.serial, small.serial_n), (1, 1));
    }

    #[test]
    fn serial_steps_over_n_bring_a_wide_output_under_the_memory_bound() {
        // [64, 64] x [64, 4096] in fp32 on 16 tiles of 48 KiB: a tile's share of b alone is
        // 64 KiB. Steps over k would not help (their accumulator holds the tile's whole
        // output block); steps over n bring a share of b's columns and make that share.
        let cfg = IpuConfig::preset(Preset::Mk2)
            .with_tiles(16)
            .with_sram_bytes_per_tile(48 * 1024);
        let bound = (cfg.sram_bytes_per_tile as f64 * AVAILABLE_MEMORY_PROPORTION) as u64;
        let p = plan_matmul(&cfg, 64, 64, 4096, DType::F32, LaidOut::NONE, 16);
        assert!(p.serial == 1 && p.serial_n > 1, "{p:?}");
        let step_n = p.bn.div_ceil(p.serial_n);
        let partials = if p.pk > 1 { p.bm * step_n * 4 } else { 0 };
        let temp = (p.bm * p.bk + p.bk * step_n) * 4 + partials;
        assert!(temp <= bound, "{p:?}: {temp} B");
        let n = (3, 3 + p.bn);
        let covered: Vec<u64> = (0..p.serial_n)
            .flat_map(|s| {
                let r = p.serial_n_range(n, s);
                r.0..r.1
            })
            .collect();
        assert_eq!(covered, (n.0..n.1).collect::<Vec<_>>());
    }

    #[test]
    fn plans_fit_the_tiles_and_use_many_of_them() {
        let cfg = IpuConfig::preset(Preset::Mk2);
        let p = plan_matmul(&cfg, 32, 784, 256, DType::F32, LaidOut::B, 1472);
        assert!(p.tiles() <= 1472);
        assert!(p.tiles() >= 64, "{p:?}");
        let big = plan_matmul(&cfg, 2048, 2048, 2048, DType::F16, LaidOut::NONE, 1472);
        assert!(big.tiles() > 1000, "{big:?}");
    }
}
