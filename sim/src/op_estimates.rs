//! Op-level estimates, as Graphcore's poplibs benchmark tools (`general_matrix_multiply`,
//! `fully_connected_layer`) give them: one op on a whole IPU, its cycles, its total memory
//! (always-live plus peak temporary) and its fullest tile.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_core::ops::conv::{ConvDims, ConvParams, DataLayout, Padding};
use tessera_core::ops::reduce::ReduceKind;
use tessera_core::{DType, Fixed, Graph, GraphError, Init, Plan, PlanError, Shape};

use crate::cost;
use crate::estimate::{estimate_only, Estimate, IpuEstimateOptions, Phase, SimError};
use crate::machine::IpuConfig;
use crate::memory::{MemoryCategory, TileMemory};

/// The estimate of one op.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpEstimate {
    /// What was estimated (`matmul`, `fc forward`, ...).
    pub name: String,
    /// Cycles: compute, exchange and syncs (no host streams).
    pub cycles: u64,
    /// Compute cycles alone.
    pub compute_cycles: u64,
    /// Exchange cycles alone.
    pub exchange_cycles: u64,
    /// Always-live bytes (operands laid out for the op) plus the peak of everything else,
    /// summed over tiles (gaps not counted, as liveness totals do not).
    pub total_memory_bytes: u64,
    /// The fullest tile's bytes, gaps below its interleaved data included.
    pub max_tile_bytes: u64,
    /// Tiles used.
    pub tiles_used: usize,
    /// Whether every tile fits in its SRAM.
    pub fits: bool,
    /// Floating-point operations (2 per multiply-accumulate).
    pub flops: u64,
    /// `total_memory_bytes` by memory category (PopVision's names, gaps left out), summed
    /// over the tiles the op uses: where the op's memory goes.
    #[serde(default)]
    pub memory_by_category: BTreeMap<MemoryCategory, u64>,
}

/// Why an op cannot be estimated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// A size is zero or the shape is invalid.
    #[error(transparent)]
    Shape(Box<GraphError>),
    /// Planning failed.
    #[error(transparent)]
    Plan(Box<PlanError>),
    /// Estimation failed.
    #[error(transparent)]
    Sim(Box<SimError>),
    /// A convolution whose sizes do not make a convolution (a zero size, a kernel larger than
    /// the padded field).
    #[error("convolution: {0}")]
    Conv(&'static str),
    /// A grouped layer whose sizes are not multiples of the group count.
    #[error("{what} {value} is not a multiple of the {groups} groups")]
    Groups {
        /// Which size.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The group count.
        groups: usize,
    },
}

impl OpError {
    fn shape(e: GraphError) -> Self {
        OpError::Shape(Box::new(e))
    }
}

fn run(
    name: &str,
    g: &Graph<Fixed<8>>,
    cfg: &IpuConfig,
    flops: u64,
) -> Result<OpEstimate, OpError> {
    Ok(figures(name, &run_estimate(g, cfg)?, flops))
}

/// The estimate of graph `g` on one IPU, out of memory allowed (the figures say so).
fn run_estimate<const N: usize>(g: &Graph<Fixed<N>>, cfg: &IpuConfig) -> Result<Estimate, OpError> {
    let plan = Plan::new(g).map_err(|e| OpError::Plan(Box::new(e)))?;
    let opts = IpuEstimateOptions {
        allow_out_of_memory: true,
        ..Default::default()
    };
    estimate_only(&plan, cfg, &opts).map_err(|e| OpError::Sim(Box::new(e)))
}

/// An op's figures from the estimate of its graph.
fn figures(name: &str, e: &Estimate, flops: u64) -> OpEstimate {
    let ipu = &e.ipus[0];
    // The fixed per-tile costs of an otherwise idle tile (stack, control code) are not the op's.
    let idle = |t: &TileMemory| {
        t.always_live + t.not_always_live + t.vertex_state + t.exchange_buffers == 0
    };
    let used = TileMemory::sum(ipu.tiles.iter().filter(|t| !idle(t)));
    let op_bytes = used.data_bytes();
    let memory_by_category = used
        .categories()
        .filter(|&(c, b)| c != MemoryCategory::Gaps && b > 0)
        .collect();
    OpEstimate {
        name: name.to_string(),
        cycles: e.cycles.compute + e.cycles.exchange + e.cycles.sync,
        compute_cycles: e.cycles.compute,
        exchange_cycles: e.cycles.exchange,
        total_memory_bytes: op_bytes,
        max_tile_bytes: ipu.max_tile_bytes,
        tiles_used: ipu.tiles_used,
        fits: e.fits,
        flops,
        memory_by_category,
    }
}

/// `C = op(A) . op(B) + C` with `op(A)` m x k and `op(B)` k x n, operands laid out for the op
/// (as poplibs' `general_matrix_multiply` creates them), on one IPU.
pub fn matmul(
    cfg: &IpuConfig,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<OpEstimate, OpError> {
    let mut g: Graph<Fixed<8>> = Graph::new();
    let a_dims = if transpose_a { [k, m] } else { [m, k] };
    let b_dims = if transpose_b { [n, k] } else { [k, n] };
    let a = g
        .variable("A", &a_dims, dtype, Init::Zeros)
        .map_err(OpError::shape)?;
    let b = g
        .variable("B", &b_dims, dtype, Init::Zeros)
        .map_err(OpError::shape)?;
    let c = g
        .variable("C", &[m, n], dtype, Init::Zeros)
        .map_err(OpError::shape)?;
    let ab = g
        .matmul_t("A.B", a, b, transpose_a, transpose_b)
        .map_err(OpError::shape)?;
    g.add("A.B+C", ab, c).map_err(OpError::shape)?;
    run("matmul", &g, cfg, 2 * (m * k * n) as u64 + (m * n) as u64)
}

/// The pass of a fully-connected layer to estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FcPass {
    /// `Y = X . W`.
    Forward,
    /// The input gradient `dX = dY . W^T`.
    Backward,
    /// The weight gradient `dW = X^T . dY` and the update `W -= lr . dW`.
    WeightUpdate,
}

/// One pass of a fully-connected layer (batch x input -> output) in `groups` independent
/// groups, alone in its program and planned alone (as an inference layer's forward pass is).
/// Groups run side by side, each on `tiles / groups` tiles. A trained layer's passes are one
/// program: [`fully_connected_training`].
pub fn fully_connected(
    cfg: &IpuConfig,
    batch: usize,
    input: usize,
    output: usize,
    groups: usize,
    dtype: DType,
    pass: FcPass,
) -> Result<OpEstimate, OpError> {
    let (sub, i, o) = fc_groups(cfg, input, output, groups)?;
    let mut g: Graph<Fixed<8>> = Graph::new();
    let e = |r: Result<tessera_core::NodeId, GraphError>| r.map_err(OpError::shape);
    let name = match pass {
        FcPass::Forward => {
            let x = e(g.variable("X", &[batch, i], dtype, Init::Zeros))?;
            let w = e(g.variable("W", &[i, o], dtype, Init::Zeros))?;
            e(g.matmul("Y", x, w))?;
            "fc forward"
        }
        FcPass::Backward => {
            let dy = e(g.variable("dY", &[batch, o], dtype, Init::Zeros))?;
            let w = e(g.variable("W", &[i, o], dtype, Init::Zeros))?;
            e(g.matmul_t("dX", dy, w, false, true))?;
            "fc backward"
        }
        FcPass::WeightUpdate => {
            let x = e(g.variable("X", &[batch, i], dtype, Init::Zeros))?;
            let dy = e(g.variable("dY", &[batch, o], dtype, Init::Zeros))?;
            e(g.matmul_t("dW", x, dy, true, false))?;
            "fc weight update"
        }
    };
    let mut est = run(name, &g, &sub, 2 * (batch * i * o) as u64)?;
    if pass == FcPass::WeightUpdate {
        add_update(&mut est, &sub, (i * o) as u64, dtype);
    }
    scale_groups(&mut est, groups);
    Ok(est)
}

/// A fully-connected layer (batch x input -> output, in `groups` independent groups) trained
/// on one IPU, as poplibs' `fully_connected_layer` runs it: one program of the forward pass
/// `Y = X . W`, the input gradient `dX = dY . W^T`, the weight gradient `dW = X^T . dY` and the
/// update `W -= lr . dW`, so the three products are planned as one layer (jointly, when that
/// is cheaper: [`crate::planner::plan_fc`]). Each pass's cycles are its supersteps' (the
/// update's with the weight update); the memory figures are the layer's, the same in every
/// pass: one program holds them all.
pub fn fully_connected_training(
    cfg: &IpuConfig,
    batch: usize,
    input: usize,
    output: usize,
    groups: usize,
    dtype: DType,
) -> Result<Vec<OpEstimate>, OpError> {
    let (sub, i, o) = fc_groups(cfg, input, output, groups)?;
    let mut g: Graph<Fixed<16>> = Graph::new();
    let e = |r: Result<tessera_core::NodeId, GraphError>| r.map_err(OpError::shape);
    let x = e(g.variable("X", &[batch, i], dtype, Init::Zeros))?;
    let w = e(g.variable("W", &[i, o], dtype, Init::Zeros))?;
    let dy = e(g.variable("dY", &[batch, o], dtype, Init::Zeros))?;
    e(g.matmul("Y", x, w))?;
    e(g.matmul_t("dX", dy, w, false, true))?;
    let dw = e(g.matmul_t("dW", x, dy, true, false))?;
    e(g.apply_sgd("W/update", w, dw, 0.01))?;
    let est = run_estimate(&g, &sub)?;
    let flops = 2 * (batch * i * o) as u64;
    let layer = figures("fc layer", &est, flops);
    let passes: [(&str, &[&str]); 3] = [
        ("fc forward", &["Y"]),
        ("fc backward", &["dX"]),
        ("fc weight update", &["dW", "W/update"]),
    ];
    Ok(passes
        .iter()
        .map(|&(name, ops)| {
            let (mut compute, mut exchange, mut sync) = (0, 0, 0);
            for ev in est.trace.iter().filter(|ev| ops.contains(&ev.op.as_str())) {
                match ev.phase {
                    Phase::Compute => compute += ev.cycles,
                    Phase::Sync => sync += ev.cycles,
                    _ => exchange += ev.cycles,
                }
            }
            let mut pass = OpEstimate {
                name: name.to_string(),
                cycles: compute + exchange + sync,
                compute_cycles: compute,
                exchange_cycles: exchange,
                ..layer.clone()
            };
            // All groups: the same cycles side by side, memory times the groups.
            scale_groups(&mut pass, groups);
            pass
        })
        .collect())
}

/// The sub-IPU each of `groups` groups runs on, and each group's input and output sizes.
fn fc_groups(
    cfg: &IpuConfig,
    input: usize,
    output: usize,
    groups: usize,
) -> Result<(IpuConfig, usize, usize), OpError> {
    let groups = groups.max(1);
    for (what, value) in [("input size", input), ("output size", output)] {
        if value % groups != 0 {
            return Err(OpError::Groups {
                what,
                value,
                groups,
            });
        }
    }
    let mut sub = cfg.clone();
    sub.tiles = (cfg.tiles / u32::try_from(groups).unwrap_or(u32::MAX)).max(1);
    Ok((sub, input / groups, output / groups))
}

/// Scales one group's figures to `groups` groups side by side: the same cycles, memory and
/// tiles times the groups.
fn scale_groups(est: &mut OpEstimate, groups: usize) {
    let groups = groups.max(1) as u64;
    est.total_memory_bytes *= groups;
    est.tiles_used *= groups as usize;
    est.flops *= groups;
    for b in est.memory_by_category.values_mut() {
        *b *= groups;
    }
}

/// A 2-D convolution layer as poplibs' `single_conv_layer` describes it: sizes per group,
/// symmetric padding, NCHW activations and OIHW weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConvLayer {
    /// Images.
    pub batch: usize,
    /// Input channels per group.
    pub in_channels: usize,
    /// Output channels per group.
    pub out_channels: usize,
    /// Groups.
    pub groups: usize,
    /// Input height and width.
    pub field: [usize; 2],
    /// Kernel height and width.
    pub kernel: [usize; 2],
    /// Vertical and horizontal stride.
    pub stride: [usize; 2],
    /// Zero padding at both ends of each spatial axis.
    pub padding: [usize; 2],
    /// Whether a bias is added to each output channel (poplibs' default).
    pub bias: bool,
}

impl ConvLayer {
    fn params(&self) -> Result<ConvParams, OpError> {
        let u = |v: usize| u32::try_from(v).map_err(|_| OpError::Conv("a size is too large"));
        let [ph, pw] = [u(self.padding[0])?, u(self.padding[1])?];
        Ok(ConvParams::new(DataLayout::Nchw)
            .stride(u(self.stride[0])?, u(self.stride[1])?)
            .pads([ph, pw, ph, pw])
            .groups(u(self.groups.max(1))?))
    }

    /// The input, weight and output shapes, checked.
    fn shapes(&self) -> Result<[[usize; 4]; 3], OpError> {
        let sizes = [
            (self.batch, "the batch size must be at least 1"),
            (self.in_channels, "input channels must be at least 1"),
            (self.out_channels, "output channels must be at least 1"),
            (self.groups, "convolution groups must be at least 1"),
            (
                self.field[0].min(self.field[1]),
                "the field's sizes must be at least 1",
            ),
            (
                self.kernel[0].min(self.kernel[1]),
                "the kernel's sizes must be at least 1",
            ),
            (
                self.stride[0].min(self.stride[1]),
                "strides must be at least 1",
            ),
        ];
        if let Some(&(_, why)) = sizes.iter().find(|(v, _)| *v == 0) {
            return Err(OpError::Conv(why));
        }
        let g = self.groups;
        let x = [
            self.batch,
            self.in_channels * g,
            self.field[0],
            self.field[1],
        ];
        let w = [
            self.out_channels * g,
            self.in_channels,
            self.kernel[0],
            self.kernel[1],
        ];
        let shape = |d: &[usize; 4]| {
            Shape::new(d).map_err(|_| OpError::Conv("every size must be at least 1"))
        };
        let p = self.params()?;
        let dims = ConvDims::of(shape(&x)?, shape(&w)?, &p).map_err(OpError::Conv)?;
        Ok([x, w, dims.output(DataLayout::Nchw)])
    }
}

/// The pass of a convolution layer to estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConvPass {
    /// `y = conv(x, w)` (plus the bias).
    Forward,
    /// The input gradient, a transposed convolution of `dy`.
    Backward,
    /// The weight gradient (and the bias gradient), and the update `w -= lr . dw`.
    WeightUpdate,
}

/// One pass of a convolution layer on one IPU, its operands laid out for it, as poplibs'
/// `single_conv_layer` runs it.
pub fn convolution(
    cfg: &IpuConfig,
    layer: &ConvLayer,
    dtype: DType,
    pass: ConvPass,
) -> Result<OpEstimate, OpError> {
    let [xs, ws, ys] = layer.shapes()?;
    let p = layer.params()?;
    let macs = {
        let [n, o, oh, ow] = ys;
        (n * o * oh * ow) as u64 * (layer.in_channels * layer.kernel[0] * layer.kernel[1]) as u64
    };
    let mut g: Graph<Fixed<8>> = Graph::new();
    let e = |r: Result<tessera_core::NodeId, GraphError>| r.map_err(OpError::shape);
    let name = match pass {
        ConvPass::Forward => {
            let x = e(g.variable("X", &xs, dtype, Init::Zeros))?;
            let w = e(g.variable("W", &ws, dtype, Init::Zeros))?;
            let y = e(g.conv2d("Y", x, w, p, Padding::Explicit(p.pads)))?;
            if layer.bias {
                let b = e(g.variable("B", &[1, ys[1], 1, 1], dtype, Init::Zeros))?;
                e(g.add("Y+B", y, b))?;
            }
            "conv forward"
        }
        ConvPass::Backward => {
            let dy = e(g.variable("dY", &ys, dtype, Init::Zeros))?;
            let w = e(g.variable("W", &ws, dtype, Init::Zeros))?;
            e(g.conv2d_grad_input("dX", dy, w, p, &xs))?;
            "conv backward"
        }
        ConvPass::WeightUpdate => {
            let x = e(g.variable("X", &xs, dtype, Init::Zeros))?;
            let dy = e(g.variable("dY", &ys, dtype, Init::Zeros))?;
            e(g.conv2d_grad_weight("dW", x, dy, p, &ws))?;
            if layer.bias {
                e(g.reduce("dB", dy, &[0, 2, 3], false, ReduceKind::Sum))?;
            }
            "conv weight update"
        }
    };
    let flops = 2 * macs;
    let mut est = run(name, &g, cfg, flops)?;
    if pass == ConvPass::WeightUpdate {
        let weights = ws.iter().product::<usize>() + if layer.bias { ys[1] } else { 0 };
        add_update(&mut est, cfg, weights as u64, dtype);
    }
    Ok(est)
}

/// Adds the update `w -= lr . dw` of `elements` weights, run in place where `dw` lives
/// (poplibs lays `w` out like `dw`): a scaled add over the fullest tile's share, a sync, and
/// the weights' bytes as always-live memory.
fn add_update(est: &mut OpEstimate, cfg: &IpuConfig, elements: u64, dtype: DType) {
    let per_tile = elements.div_ceil(u64::from(cfg.tiles).min(elements).max(1));
    let compute =
        cost::scaled_add_cycles(cfg, per_tile, dtype) + cost::compute_set_overhead_cycles(cfg);
    est.cycles += compute + cfg.sync_cycles;
    est.compute_cycles += compute;
    est.total_memory_bytes += elements * dtype.size() as u64;
    est.max_tile_bytes += per_tile * dtype.size() as u64;
    est.fits = est.fits && est.max_tile_bytes <= cfg.sram_bytes_per_tile;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Preset;

    #[test]
    fn matmul_cycles_follow_the_arithmetic() {
        let cfg = IpuConfig::preset(Preset::Mk2);
        let base = matmul(&cfg, 256, 256, 256, DType::F16, false, false).unwrap();
        let twice_m = matmul(&cfg, 512, 256, 256, DType::F16, false, false).unwrap();
        let twice_all = matmul(&cfg, 512, 512, 512, DType::F16, false, false).unwrap();
        let fp32 = matmul(&cfg, 256, 256, 256, DType::F32, false, false).unwrap();
        assert!(fp32.cycles > base.cycles, "{fp32:?} vs {base:?}");
        assert!(twice_m.cycles > base.cycles);
        assert!(twice_all.cycles > twice_m.cycles);
        for e in [&base, &twice_m, &twice_all, &fp32] {
            assert!(e.fits && e.total_memory_bytes > 0 && e.max_tile_bytes > 0);
        }
        let t = matmul(&cfg, 256, 128, 64, DType::F32, true, true).unwrap();
        assert!(t.cycles > 0);
    }

    #[test]
    fn conv_passes_estimate_and_bad_layers_are_errors() {
        let cfg = IpuConfig::preset(Preset::Mk2);
        let layer = ConvLayer {
            batch: 2,
            in_channels: 8,
            out_channels: 16,
            groups: 2,
            field: [12, 10],
            kernel: [3, 3],
            stride: [1, 2],
            padding: [1, 1],
            bias: true,
        };
        // Output 12 x 5 (stride 2 over 10 + 2 padding with a kernel of 3).
        let macs = 2 * (16 * 2) * 12 * 5 * 8 * 9;
        for pass in [
            ConvPass::Forward,
            ConvPass::Backward,
            ConvPass::WeightUpdate,
        ] {
            let e = convolution(&cfg, &layer, DType::F16, pass).unwrap();
            assert!(
                e.cycles > 0 && e.fits && e.total_memory_bytes > 0,
                "{pass:?}: {e:?}"
            );
            assert_eq!(e.flops, 2 * macs, "{pass:?}");
        }
        let bad = ConvLayer {
            kernel: [20, 3],
            ..layer
        };
        assert!(matches!(
            convolution(&cfg, &bad, DType::F16, ConvPass::Forward),
            Err(OpError::Conv(_))
        ));
        let no_groups = ConvLayer { groups: 0, ..layer };
        assert!(matches!(
            convolution(&cfg, &no_groups, DType::F16, ConvPass::Backward),
            Err(OpError::Conv(_))
        ));
    }

    #[test]
    fn fc_passes_and_groups() {
        let cfg = IpuConfig::preset(Preset::Mk2);
        for pass in [FcPass::Forward, FcPass::Backward, FcPass::WeightUpdate] {
            let e = fully_connected(&cfg, 32, 784, 256, 1, DType::F16, pass).unwrap();
            assert!(e.cycles > 0 && e.fits, "{pass:?}: {e:?}");
        }
        let g = fully_connected(&cfg, 32, 256, 256, 4, DType::F16, FcPass::Forward).unwrap();
        assert_eq!(g.flops, 2 * 32 * 256 * 256 / 4);
        assert!(matches!(
            fully_connected(&cfg, 32, 250, 256, 4, DType::F16, FcPass::Forward),
            Err(OpError::Groups { .. })
        ));
        assert!(matches!(
            matmul(&cfg, 0, 2, 2, DType::F16, false, false),
            Err(OpError::Shape(_))
        ));
    }
}
