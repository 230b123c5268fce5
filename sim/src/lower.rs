//! Lowering a core plan onto one IPU: every tensor gets a tile mapping, every op becomes
//! compute sets of vertices, and exchanges bring each vertex's operands to its tile.
//!
//! Mapping policy:
//! - a matmul's output is laid out by its plan (blocks on the tiles that compute them), and a
//!   variable whose first use is a matmul's right-hand operand is laid out by that plan too
//!   (as poplibs creates weights), so weights need no exchange;
//! - optimizer state is laid out like its variable;
//! - every other tensor is spread linearly in chunks of at least [`LowerOptions::min_chunk_bytes`]
//!   (whole on one tile when smaller), row-aligned for row-wise ops, starting where the last
//!   tensor ended so small tensors spread over the tiles.

use std::collections::HashMap;

use tessera_core::{DType, Graph, Op, Place, Plan, Roles};

use crate::cost::{self, UnaryKind};
use crate::machine::IpuConfig;
use crate::matmul::{plan_matmul, MatMulPlan};
use crate::program::{
    compress, exchange_for, Codelet, ComputeSet, Interval, Mapping, ProgTensor, Program, Region,
    Step, TensorClass, TileId, Vertex,
};

/// Knobs of the lowering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowerOptions {
    /// The smallest chunk of a tensor a tile gets when a tensor is spread.
    pub min_chunk_bytes: u64,
    /// Keep optimizer state (momentum, Adam moments) in streaming memory: it is loaded onto
    /// its tiles for the weight update and stored back after it.
    pub offload_optimizer_state: bool,
}

impl Default for LowerOptions {
    fn default() -> Self {
        // Estimate: 128 bytes keeps vertices' fixed costs below their per-element costs.
        LowerOptions {
            min_chunk_bytes: 128,
            offload_optimizer_state: false,
        }
    }
}

/// Worker cycles a multi-region vertex spends per region beyond the first (estimate: loading
/// the next region's pointers and length).
pub const REGION_OVERHEAD_CYCLES: u64 = 12;

struct Lowering<'a, const N: usize> {
    cfg: &'a IpuConfig,
    graph: &'a Graph<N>,
    opts: LowerOptions,
    tensors: Vec<ProgTensor>,
    steps: Vec<Step>,
    node_steps: Vec<(usize, usize)>,
    /// Temporaries and the (writer step, reader step) they live between.
    cursor: u32,
    mm_plans: HashMap<usize, MatMulPlan>,
    /// Nodes lowered onto this IPU.
    include: Vec<bool>,
    /// Nodes of other IPUs whose tensors this IPU reads: copies arrive over the IPU-Links.
    remote: Vec<bool>,
    /// State tensors kept in streaming memory between weight updates.
    offloaded: Vec<bool>,
}

/// 2-D view of a tensor: (rows, cols) with cols the last axis.
fn rows_cols(shape: tessera_core::Shape) -> (u64, u64) {
    (shape.rows() as u64, shape.last() as u64)
}

/// Row segments of the rectangle rows `r0..r1` x cols `c0..c1` of a row-major matrix with
/// `cols` columns, as (start, len) element ranges.
fn rect(r0: u64, r1: u64, c0: u64, c1: u64, cols: u64) -> impl Iterator<Item = (u64, u64)> {
    (r0..r1).map(move |r| (r * cols + c0, c1 - c0))
}

impl<const N: usize> Lowering<'_, N> {
    fn tile_count(&self) -> u32 {
        self.cfg.tiles
    }

    /// A linear mapping with chunks of at least `min_chunk_bytes`, multiples of `grain`. Rows
    /// of `cols` elements are cut at the same places in every row (chunks that divide the row,
    /// or whole rows), so blocks of the matrix read as strided regions.
    fn linear(&mut self, elements: u64, elem_bytes: u64, grain: u64, cols: u64) -> Mapping {
        let mut min_chunk = self.opts.min_chunk_bytes.div_ceil(elem_bytes.max(1));
        let per = elements
            .div_ceil(u64::from(self.tile_count().max(1)))
            .max(min_chunk);
        let mut grain = grain.max(1);
        if cols > 1 && grain < cols {
            if per >= cols {
                grain = cols;
            } else if let Some(d) = (per..=cols).find(|d| cols % d == 0 && d % grain == 0) {
                min_chunk = d;
                grain = d;
            }
        }
        let m = Mapping::linear(
            elements,
            grain,
            min_chunk,
            self.cursor,
            self.tile_count(),
            self.tile_count(),
        );
        let used = m.intervals().len() as u32;
        self.cursor = (self.cursor + used) % self.tile_count().max(1);
        m
    }

    fn plan_of(&mut self, node: usize) -> MatMulPlan {
        if let Some(p) = self.mm_plans.get(&node) {
            return *p;
        }
        let n = &self.graph.nodes()[node];
        let Op::MatMul {
            a,
            b,
            transpose_a,
            transpose_b,
        } = *n.op()
        else {
            unreachable!("plan_of is only called on matmuls")
        };
        let sa = self.graph.node(a).shape();
        let k = if transpose_a { sa.dim(0) } else { sa.dim(1) } as u64;
        let (m, nn) = (n.shape().dim(0) as u64, n.shape().dim(1) as u64);
        let _ = transpose_b;
        let b_resident =
            self.graph.node(b).op().is_state() && self.first_consumer(b.index()) == Some(node);
        let p = plan_matmul(
            self.cfg,
            m,
            k,
            nn,
            n.dtype(),
            b_resident,
            u64::from(self.tile_count()),
        );
        self.mm_plans.insert(node, p);
        p
    }

    /// The first node on this IPU that reads `x`.
    fn first_consumer(&self, x: usize) -> Option<usize> {
        self.graph.nodes().iter().enumerate().position(|(c, n)| {
            self.include[c] && n.op().operands().as_slice().iter().any(|o| o.index() == x)
        })
    }

    /// The mapping of the right-hand operand of matmul `mm` by its plan: block (ik, in) on the
    /// tile of grid (0, ik, in).
    fn b_mapping(&mut self, mm: usize) -> Mapping {
        let p = self.plan_of(mm);
        let Op::MatMul { b, transpose_b, .. } = *self.graph.nodes()[mm].op() else {
            unreachable!()
        };
        let sb = self.graph.node(b).shape();
        let (rows, cols) = (sb.dim(0) as u64, sb.dim(1) as u64);
        let (k, n) = if transpose_b {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let mut iv = Vec::new();
        for ik in 0..p.pk {
            let (k0, k1) = (ik * p.bk, ((ik + 1) * p.bk).min(k));
            for i_n in 0..p.pn {
                let (n0, n1) = (i_n * p.bn, ((i_n + 1) * p.bn).min(n));
                if k0 >= k1 || n0 >= n1 {
                    continue;
                }
                let tile = (p.grid(0, ik, i_n) % u64::from(self.tile_count())) as TileId;
                let segs: Vec<(u64, u64)> = if transpose_b {
                    rect(n0, n1, k0, k1, cols).collect()
                } else {
                    rect(k0, k1, n0, n1, cols).collect()
                };
                iv.extend(
                    segs.into_iter()
                        .map(|(start, len)| Interval { tile, start, len }),
                );
            }
        }
        Mapping::from_intervals(iv)
    }

    fn new_tensor(
        &mut self,
        name: String,
        node: usize,
        dtype: DType,
        elements: u64,
        mapping: Mapping,
        class: TensorClass,
    ) -> u32 {
        self.tensors.push(ProgTensor {
            name,
            node: node as u16,
            dtype,
            elements,
            mapping,
            class,
            live: (0, 0),
        });
        (self.tensors.len() - 1) as u32
    }

    /// Appends a compute set, preceded by the exchange its vertices need.
    fn compute(&mut self, node: usize, phase: &str, vertices: Vec<Vertex>) {
        if vertices.is_empty() {
            return;
        }
        let transfers = exchange_for(&self.tensors, &vertices);
        if !transfers.is_empty() {
            self.steps.push(Step::Exchange {
                node: node as u16,
                transfers,
            });
        }
        let name = format!("{}/{phase}", self.graph.nodes()[node].name());
        self.steps.push(Step::Compute(ComputeSet {
            name,
            node: node as u16,
            vertices,
        }));
    }

    /// One vertex per tile of `over`'s mapping, covering all the tile's intervals:
    /// `regions(interval)` gives each interval's reads and writes, and the vertex costs
    /// `cycles(elements)` plus [`REGION_OVERHEAD_CYCLES`] per extra interval.
    fn per_tile(
        &mut self,
        node: usize,
        phase: &str,
        over: u32,
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        regions: impl Fn(&Interval) -> (Vec<Region>, Vec<Region>),
    ) {
        let mut ivs: Vec<Interval> = self.tensors[over as usize].mapping.intervals().to_vec();
        ivs.sort_by_key(|iv| (iv.tile, iv.start));
        let mut vertices = Vec::new();
        for group in ivs.chunk_by(|a, b| a.tile == b.tile) {
            let (mut reads, mut writes) = (Vec::new(), Vec::new());
            for iv in group {
                let (r, w) = regions(iv);
                reads.extend(r);
                writes.extend(w);
            }
            let (reads, writes) = (compress(reads), compress(writes));
            let elements: u64 = group.iter().map(|iv| iv.len).sum();
            let extra = REGION_OVERHEAD_CYCLES * (group.len() as u64 - 1);
            vertices.push(Vertex {
                tile: group[0].tile,
                codelet,
                cycles: cycles(elements) + extra,
                reads,
                writes,
            });
        }
        self.compute(node, phase, vertices);
    }

    /// A vertex per tile of `out`'s mapping, reading the same elements of `same` and the
    /// regions `extra` gives.
    fn elementwise(
        &mut self,
        node: usize,
        out: u32,
        same: &[u32],
        codelet: Codelet,
        cycles: impl Fn(u64) -> u64,
        extra: impl Fn(u64, u64) -> Vec<Region>,
    ) {
        self.per_tile(node, "op", out, codelet, cycles, |iv| {
            let mut reads: Vec<Region> = same
                .iter()
                .map(|&t| Region::span(t, iv.start, iv.len))
                .collect();
            reads.extend(extra(iv.start, iv.len));
            (reads, vec![Region::span(out, iv.start, iv.len)])
        });
    }

    fn lower_node(&mut self, i: usize) {
        if !self.include[i] {
            if self.remote[i] {
                let bytes = self.graph.nodes()[i].bytes() as u64;
                self.steps.push(Step::LinkReceive {
                    tensor: i as u32,
                    bytes,
                });
            }
            return;
        }
        // Offloaded optimizer state comes from streaming memory for this op and goes back after.
        let offloaded: Vec<u32> = self.graph.nodes()[i]
            .op()
            .operands()
            .as_slice()
            .iter()
            .map(|o| o.index())
            .filter(|&o| self.offloaded[o])
            .map(|o| o as u32)
            .collect();
        for &t in &offloaded {
            let bytes = self.graph.nodes()[t as usize].bytes() as u64;
            self.steps.push(Step::RemoteBuffer {
                tensor: t,
                bytes,
                load: true,
            });
        }
        self.lower_op(i);
        for &t in &offloaded {
            let bytes = self.graph.nodes()[t as usize].bytes() as u64;
            self.steps.push(Step::RemoteBuffer {
                tensor: t,
                bytes,
                load: false,
            });
        }
    }

    fn lower_op(&mut self, i: usize) {
        let cfg = self.cfg;
        let node = &self.graph.nodes()[i];
        let dt = node.dtype();
        let out = i as u32;
        let t = |x: tessera_core::NodeId| x.index() as u32;
        let unary = |k: UnaryKind| move |n: u64| k.cycles(cfg, n, dt);
        let binary = move |n: u64| cost::elementwise_binary_cycles(cfg, n, dt);
        let none = |_: u64, _: u64| Vec::new();
        match *node.op() {
            Op::Input => {
                let bytes = node.bytes() as u64;
                self.steps.push(Step::HostToDevice { tensor: out, bytes });
            }
            Op::Variable { .. } | Op::Constant { .. } => {}
            Op::Add { a, b } | Op::Sub { a, b } | Op::Mul { a, b } => {
                self.elementwise(i, out, &[t(a), t(b)], Codelet::Binary, binary, none)
            }
            Op::ReluGrad { dy, y } | Op::SigmoidGrad { dy, y } | Op::TanhGrad { dy, y } => {
                self.elementwise(i, out, &[t(dy), t(y)], Codelet::Binary, binary, none)
            }
            Op::Scale { x, .. } | Op::Relu { x } | Op::Sigmoid { x } | Op::Tanh { x } => {
                let kind = match *node.op() {
                    Op::Scale { .. } => UnaryKind::Scale,
                    Op::Relu { .. } => UnaryKind::Relu,
                    Op::Sigmoid { .. } => UnaryKind::Sigmoid,
                    _ => UnaryKind::Tanh,
                };
                self.elementwise(i, out, &[t(x)], Codelet::Unary, unary(kind), none)
            }
            Op::Reshape { x } | Op::Tap { x } => {
                self.elementwise(i, out, &[t(x)], Codelet::Copy, unary(UnaryKind::Copy), none)
            }
            Op::Cast { x } => self.elementwise(
                i,
                out,
                &[t(x)],
                Codelet::Cast,
                move |n| cost::cast_cycles(cfg, n),
                none,
            ),
            Op::BiasAdd { x, bias } => {
                let cols = node.shape().last() as u64;
                let bt = t(bias);
                self.elementwise(i, out, &[t(x)], Codelet::Binary, binary, move |s, l| {
                    let c0 = s % cols;
                    if l >= cols {
                        vec![Region::span(bt, 0, cols)]
                    } else if c0 + l <= cols {
                        vec![Region::span(bt, c0, l)]
                    } else {
                        vec![
                            Region::span(bt, c0, cols - c0),
                            Region::span(bt, 0, l - (cols - c0)),
                        ]
                    }
                })
            }
            Op::Softmax { x } | Op::SoftmaxGrad { y: x, .. } => {
                let (_, cols) = rows_cols(node.shape());
                let mut same = vec![t(x)];
                if let Op::SoftmaxGrad { dy, .. } = *node.op() {
                    same.push(t(dy));
                }
                self.elementwise(
                    i,
                    out,
                    &same,
                    Codelet::Softmax,
                    move |n| row_op_cycles(cfg, n, cols, dt),
                    none,
                )
            }
            Op::SparseCrossEntropyGrad {
                x, labels, dloss, ..
            } => {
                let (_, cols) = rows_cols(node.shape());
                let (lt, dl) = (t(labels), t(dloss));
                self.elementwise(
                    i,
                    out,
                    &[t(x)],
                    Codelet::CrossEntropy,
                    move |n| row_op_cycles(cfg, n, cols, dt),
                    move |s, l| {
                        vec![
                            Region::span(lt, s / cols, (s + l).div_ceil(cols) - s / cols),
                            Region::span(dl, 0, 1),
                        ]
                    },
                )
            }
            Op::SparseCrossEntropy { x, labels, .. } => {
                self.lower_cross_entropy(i, t(x), t(labels))
            }
            Op::ReduceSum { x, axis } | Op::ReduceMean { x, axis } | Op::ReduceMax { x, axis } => {
                self.lower_reduce(i, t(x), axis)
            }
            Op::Broadcast { x, axis } => self.lower_broadcast(i, t(x), axis),
            Op::MatMul { .. } => self.lower_matmul(i),
            Op::ApplySgd { var, grad, .. } => {
                let c = move |n| cost::scaled_add_cycles(cfg, n, dt);
                self.lower_update(i, t(var), &[t(grad)], c)
            }
            Op::ApplyMomentum {
                var,
                velocity,
                grad,
                ..
            } => {
                let c = move |n| 2 * cost::scaled_add_cycles(cfg, n, dt);
                self.lower_update(i, t(var), &[t(velocity), t(grad)], c)
            }
            Op::ApplyAdam {
                var,
                m,
                v,
                grad,
                step,
                ..
            } => {
                // Two moment updates, a square root, a divide and the scaled add.
                let c = move |n| {
                    2 * cost::scaled_add_cycles(cfg, n, dt)
                        + UnaryKind::Sqrt.cycles(cfg, n, dt)
                        + UnaryKind::Reciprocal.cycles(cfg, n, dt)
                        + cost::scaled_add_cycles(cfg, n, dt)
                };
                let st = t(step);
                let (var, m, v, grad) = (t(var), t(m), t(v), t(grad));
                self.per_tile(i, "update", var, Codelet::Update, c, |iv| {
                    let reg = |x: u32| Region::span(x, iv.start, iv.len);
                    let mut reads: Vec<Region> = [var, m, v, grad].map(reg).to_vec();
                    reads.push(Region::span(st, 0, 1));
                    (reads, [var, m, v].map(reg).to_vec())
                });
            }
            Op::Concat { a, b } => {
                let (ca, cb) = (
                    self.graph.node(a).shape().last() as u64,
                    self.graph.node(b).shape().last() as u64,
                );
                let (ta, tb) = (t(a), t(b));
                let c = unary(UnaryKind::Copy);
                self.per_tile(i, "concat", out, Codelet::Copy, c, |iv| {
                    let mut reads = Vec::new();
                    for (r, c0, c1) in row_segments(iv.start, iv.len, ca + cb) {
                        if c0 < ca {
                            reads.push(Region::span(ta, r * ca + c0, c1.min(ca) - c0));
                        }
                        if c1 > ca {
                            let b0 = c0.max(ca) - ca;
                            reads.push(Region::span(tb, r * cb + b0, c1 - ca - b0));
                        }
                    }
                    (reads, vec![Region::span(out, iv.start, iv.len)])
                });
            }
            Op::Slice { x, offset } => {
                let (cx, cols) = (
                    self.graph.node(x).shape().last() as u64,
                    node.shape().last() as u64,
                );
                let tx = t(x);
                let c = unary(UnaryKind::Copy);
                self.per_tile(i, "slice", out, Codelet::Copy, c, |iv| {
                    let reads = row_segments(iv.start, iv.len, cols)
                        .into_iter()
                        .map(|(r, c0, c1)| {
                            Region::span(tx, r * cx + u64::from(offset) + c0, c1 - c0)
                        })
                        .collect();
                    (reads, vec![Region::span(out, iv.start, iv.len)])
                });
            }
            Op::Accumulate {
                acc, grad, counter, ..
            } => {
                let c = move |n| cost::scaled_add_cycles(cfg, n, dt);
                let (acc, grad, ct) = (t(acc), t(grad), t(counter));
                self.per_tile(i, "accumulate", acc, Codelet::Update, c, |iv| {
                    let reg = |x: u32| Region::span(x, iv.start, iv.len);
                    (
                        vec![reg(acc), reg(grad), Region::span(ct, 0, 1)],
                        vec![reg(acc)],
                    )
                });
            }
            Op::Fill { x, .. } => {
                let x = t(x);
                let c = move |n| UnaryKind::Copy.cycles(cfg, n, dt);
                self.per_tile(i, "fill", x, Codelet::Copy, c, |iv| {
                    (Vec::new(), vec![Region::span(x, iv.start, iv.len)])
                });
            }
            Op::Increment { counter } => {
                let ct = t(counter);
                let tile = self.tensors[ct as usize].mapping.intervals()[0].tile;
                let r = Region::span(ct, 0, 1);
                let v = Vertex {
                    tile,
                    codelet: Codelet::Update,
                    cycles: cost::compute_set_overhead_cycles() + 20,
                    reads: vec![r],
                    writes: vec![r],
                };
                self.compute(i, "increment", vec![v]);
            }
            _ => {
                // Every op of the core has a lowering above; an op added to the core later
                // without one is lowered as a copy of its first operand so estimates still
                // run, costed as a copy.
                let first = node.op().operands().as_slice().first().map(|x| t(*x));
                if let Some(x) =
                    first.filter(|&x| self.tensors[x as usize].elements == self.tensors[i].elements)
                {
                    self.elementwise(i, out, &[x], Codelet::Copy, unary(UnaryKind::Copy), none);
                }
            }
        }
        if node
            .roles()
            .intersects(Roles::TAPPED | Roles::LOSS | Roles::OUTPUT)
            && !node.op().is_update()
        {
            self.steps.push(Step::DeviceToHost {
                tensor: out,
                bytes: node.bytes() as u64,
            });
        }
    }

    fn lower_update(&mut self, i: usize, var: u32, others: &[u32], cycles: impl Fn(u64) -> u64) {
        let writes_state: Vec<u32> = others
            .iter()
            .copied()
            .filter(|&x| self.tensors[x as usize].class == TensorClass::AlwaysLive)
            .collect();
        self.per_tile(i, "update", var, Codelet::Update, cycles, |iv| {
            let reg = |x: u32| Region::span(x, iv.start, iv.len);
            let mut reads = vec![reg(var)];
            reads.extend(others.iter().map(|&x| reg(x)));
            let mut writes = vec![reg(var)];
            writes.extend(writes_state.iter().map(|&x| reg(x)));
            (reads, writes)
        });
    }

    fn lower_cross_entropy(&mut self, i: usize, x: u32, labels: u32) {
        let cfg = self.cfg;
        let xs = self.graph.nodes()[x as usize].shape();
        let (rows, cols) = rows_cols(xs);
        let dt = self.graph.nodes()[x as usize].dtype();
        // Stage 1: the rows starting on each tile of x, one partial sum per tile.
        let mut groups: Vec<(TileId, u64, u64)> = Vec::new();
        for iv in self.tensors[x as usize].mapping.intervals() {
            let r0 = iv.start.div_ceil(cols);
            let r1 = iv.end().div_ceil(cols).min(rows);
            if r1 > r0 {
                groups.push((iv.tile, r0, r1));
            }
        }
        let partials = self.new_tensor(
            format!("{}/partials", self.graph.nodes()[i].name()),
            i,
            DType::F32,
            groups.len() as u64,
            Mapping::from_intervals(
                groups
                    .iter()
                    .enumerate()
                    .map(|(g, &(tile, _, _))| Interval {
                        tile,
                        start: g as u64,
                        len: 1,
                    })
                    .collect(),
            ),
            TensorClass::Temporary,
        );
        let stage1 = groups
            .iter()
            .enumerate()
            .map(|(g, &(tile, r0, r1))| Vertex {
                tile,
                codelet: Codelet::CrossEntropy,
                cycles: row_op_cycles(cfg, (r1 - r0) * cols, cols, dt),
                reads: vec![
                    Region::span(x, r0 * cols, (r1 - r0) * cols),
                    Region::span(labels, r0, r1 - r0),
                ],
                writes: vec![Region::span(partials, g as u64, 1)],
            })
            .collect();
        self.compute(i, "rows", stage1);
        let out_tile = self.tensors[i].mapping.intervals()[0].tile;
        let n = groups.len() as u64;
        let stage2 = Vertex {
            tile: out_tile,
            codelet: Codelet::Reduce,
            cycles: cost::reduce_cycles(cfg, 1, n, DType::F32),
            reads: vec![Region::span(partials, 0, n)],
            writes: vec![Region::span(i as u32, 0, 1)],
        };
        self.compute(i, "mean", vec![stage2]);
    }

    fn lower_reduce(&mut self, i: usize, x: u32, axis: Option<u8>) {
        let cfg = self.cfg;
        let xs = self.graph.nodes()[x as usize].shape();
        let dt = self.graph.nodes()[i].dtype();
        let (outer, len, inner) = match axis {
            Some(a) => xs.split_at_axis(a as usize),
            None => (1, xs.elements(), 1),
        };
        let (outer, len, inner) = (outer as u64, len as u64, inner as u64);
        if outer * inner == 1 {
            // Reduce everything: partials where the data is, then one final reduction.
            let ivs: Vec<Interval> = self.tensors[x as usize].mapping.intervals().to_vec();
            let partials = self.new_tensor(
                format!("{}/partials", self.graph.nodes()[i].name()),
                i,
                DType::F32,
                ivs.len() as u64,
                Mapping::from_intervals(
                    ivs.iter()
                        .enumerate()
                        .map(|(g, iv)| Interval {
                            tile: iv.tile,
                            start: g as u64,
                            len: 1,
                        })
                        .collect(),
                ),
                TensorClass::Temporary,
            );
            let stage1 = ivs
                .iter()
                .enumerate()
                .map(|(g, iv)| Vertex {
                    tile: iv.tile,
                    codelet: Codelet::Reduce,
                    cycles: cost::reduce_cycles(cfg, 1, iv.len, dt),
                    reads: vec![Region::span(x, iv.start, iv.len)],
                    writes: vec![Region::span(partials, g as u64, 1)],
                })
                .collect();
            self.compute(i, "partials", stage1);
            let tile = self.tensors[i].mapping.intervals()[0].tile;
            let n = ivs.len() as u64;
            let v = Vertex {
                tile,
                codelet: Codelet::Reduce,
                cycles: cost::reduce_cycles(cfg, 1, n, DType::F32),
                reads: vec![Region::span(partials, 0, n)],
                writes: vec![Region::span(i as u32, 0, 1)],
            };
            self.compute(i, "reduce", vec![v]);
            return;
        }
        // Along an axis: each output interval's owner reads, for each of its outer indices
        // and each position along the axis, the matching run of inner elements.
        let ivs: Vec<Interval> = self.tensors[i].mapping.intervals().to_vec();
        let vertices = ivs
            .iter()
            .map(|iv| {
                let mut reads = Vec::new();
                let mut o = iv.start;
                while o < iv.end() {
                    let (oo, j0) = (o / inner, o % inner);
                    let j1 = inner.min(j0 + (iv.end() - o));
                    for l in 0..len {
                        reads.push(Region::span(x, (oo * len + l) * inner + j0, j1 - j0));
                    }
                    o += j1 - j0;
                }
                Vertex {
                    tile: iv.tile,
                    codelet: Codelet::Reduce,
                    cycles: cost::reduce_cycles(cfg, iv.len, len, dt),
                    reads: compress(reads),
                    writes: vec![Region::span(i as u32, iv.start, iv.len)],
                }
            })
            .collect();
        self.compute(i, "reduce", vertices);
    }

    fn lower_broadcast(&mut self, i: usize, x: u32, axis: Option<u8>) {
        let cfg = self.cfg;
        let shape = self.graph.nodes()[i].shape();
        let dt = self.graph.nodes()[i].dtype();
        let (_, len, inner) = match axis {
            Some(a) => shape.split_at_axis(a as usize),
            None => (1, shape.elements(), 1),
        };
        let (len, inner) = (len as u64, inner as u64);
        let ivs: Vec<Interval> = self.tensors[i].mapping.intervals().to_vec();
        let vertices = ivs
            .iter()
            .map(|iv| {
                let mut reads: Vec<Region> = Vec::new();
                let mut o = iv.start;
                while o < iv.end() {
                    let (row, j0) = (o / inner, o % inner);
                    let j1 = inner.min(j0 + (iv.end() - o));
                    let oo = row / len;
                    let r = Region::span(x, oo * inner + j0, j1 - j0);
                    if reads.last() != Some(&r) {
                        reads.push(r);
                    }
                    o += j1 - j0;
                }
                Vertex {
                    tile: iv.tile,
                    codelet: Codelet::Broadcast,
                    cycles: UnaryKind::Copy.cycles(cfg, iv.len, dt),
                    reads: compress(reads),
                    writes: vec![Region::span(i as u32, iv.start, iv.len)],
                }
            })
            .collect();
        self.compute(i, "broadcast", vertices);
    }

    fn lower_matmul(&mut self, i: usize) {
        let cfg = self.cfg;
        let p = self.plan_of(i);
        let node = &self.graph.nodes()[i];
        let Op::MatMul {
            a,
            b,
            transpose_a: ta,
            transpose_b: tb,
        } = *node.op()
        else {
            unreachable!()
        };
        let dt = node.dtype();
        let (m, n) = (node.shape().dim(0) as u64, node.shape().dim(1) as u64);
        let sa = self.graph.node(a).shape();
        let sb = self.graph.node(b).shape();
        let k = if ta { sa.dim(0) } else { sa.dim(1) } as u64;
        let (a_cols, b_cols) = (sa.dim(1) as u64, sb.dim(1) as u64);
        let tiles = u64::from(self.tile_count());
        let tile_of = |g: u64| (g % tiles) as TileId;
        let (at, bt) = (a.index() as u32, b.index() as u32);
        let blocks = |p: &MatMulPlan| {
            let mut v = Vec::new();
            for im in 0..p.pm {
                for ik in 0..p.pk {
                    for i_n in 0..p.pn {
                        let (m0, m1) = (im * p.bm, ((im + 1) * p.bm).min(m));
                        let (k0, k1) = (ik * p.bk, ((ik + 1) * p.bk).min(k));
                        let (n0, n1) = (i_n * p.bn, ((i_n + 1) * p.bn).min(n));
                        if m0 < m1 && k0 < k1 && n0 < n1 {
                            v.push((im, ik, i_n, m0, m1, k0, k1, n0, n1));
                        }
                    }
                }
            }
            v
        };
        let blocks = blocks(&p);
        // Each block reads one strided region of each operand.
        let block = |t: u32, r0: u64, r1: u64, c0: u64, c1: u64, cols: u64| {
            Region::strided(t, r0 * cols + c0, c1 - c0, r1 - r0, cols)
        };
        let reads_of = |m0, m1, k0, k1, n0, n1| {
            let a = if ta {
                block(at, k0, k1, m0, m1, a_cols)
            } else {
                block(at, m0, m1, k0, k1, a_cols)
            };
            let b = if tb {
                block(bt, n0, n1, k0, k1, b_cols)
            } else {
                block(bt, k0, k1, n0, n1, b_cols)
            };
            vec![a, b]
        };
        if p.pk == 1 {
            let vertices = blocks
                .iter()
                .map(|&(im, ik, i_n, m0, m1, k0, k1, n0, n1)| Vertex {
                    tile: tile_of(p.grid(im, ik, i_n)),
                    codelet: Codelet::MatMulPartial,
                    cycles: cost::matmul_amp_cycles(cfg, m1 - m0, k1 - k0, n1 - n0, dt),
                    reads: reads_of(m0, m1, k0, k1, n0, n1),
                    writes: vec![block(i as u32, m0, m1, n0, n1, n)],
                })
                .collect();
            self.compute(i, "matmul", vertices);
            return;
        }
        // Partial sums (fp32) block by block, then each block reduced by its pk tiles.
        let mut offsets = HashMap::new();
        let mut total = 0u64;
        let mut iv = Vec::new();
        for &(im, ik, i_n, m0, m1, _, _, n0, n1) in &blocks {
            offsets.insert((im, ik, i_n), total);
            let size = (m1 - m0) * (n1 - n0);
            iv.push(Interval {
                tile: tile_of(p.grid(im, ik, i_n)),
                start: total,
                len: size,
            });
            total += size;
        }
        let partials = self.new_tensor(
            format!("{}/partials", node.name()),
            i,
            DType::F32,
            total,
            Mapping::from_intervals(iv),
            TensorClass::Temporary,
        );
        let vertices = blocks
            .iter()
            .map(|&(im, ik, i_n, m0, m1, k0, k1, n0, n1)| Vertex {
                tile: tile_of(p.grid(im, ik, i_n)),
                codelet: Codelet::MatMulPartial,
                cycles: cost::matmul_amp_cycles(cfg, m1 - m0, k1 - k0, n1 - n0, dt),
                reads: reads_of(m0, m1, k0, k1, n0, n1),
                writes: vec![Region::span(
                    partials,
                    offsets[&(im, ik, i_n)],
                    (m1 - m0) * (n1 - n0),
                )],
            })
            .collect();
        self.compute(i, "partials", vertices);
        let mut vertices = Vec::new();
        for &(im, ik, i_n, m0, m1, _, _, n0, n1) in &blocks {
            let pk_here = (0..p.pk)
                .filter(|&q| offsets.contains_key(&(im, q, i_n)))
                .count() as u64;
            let Some((r0, r1, c0, c1)) = reduce_share(m1 - m0, n1 - n0, ik, pk_here) else {
                continue;
            };
            let bw = n1 - n0;
            // The same rectangle of every partial block of this output block.
            let reads = (0..p.pk)
                .filter_map(|q| offsets.get(&(im, q, i_n)))
                .map(|&off| Region::strided(partials, off + r0 * bw + c0, c1 - c0, r1 - r0, bw))
                .collect();
            let writes = vec![Region::strided(
                i as u32,
                (m0 + r0) * n + n0 + c0,
                c1 - c0,
                r1 - r0,
                n,
            )];
            vertices.push(Vertex {
                tile: tile_of(p.grid(im, ik, i_n)),
                codelet: Codelet::Reduce,
                cycles: cost::reduce_cycles(cfg, (r1 - r0) * (c1 - c0), pk_here, DType::F32),
                reads,
                writes,
            });
        }
        self.compute(i, "reduce", vertices);
    }

    /// The mapping of matmul `i`'s output: where its final values are written.
    fn matmul_output_mapping(&mut self, i: usize) -> Mapping {
        let p = self.plan_of(i);
        let node = &self.graph.nodes()[i];
        let (m, n) = (node.shape().dim(0) as u64, node.shape().dim(1) as u64);
        let Op::MatMul {
            a, transpose_a: ta, ..
        } = *node.op()
        else {
            unreachable!()
        };
        let sa = self.graph.node(a).shape();
        let k = if ta { sa.dim(0) } else { sa.dim(1) } as u64;
        let tiles = u64::from(self.tile_count());
        let mut iv = Vec::new();
        for im in 0..p.pm {
            for i_n in 0..p.pn {
                let (m0, m1) = (im * p.bm, ((im + 1) * p.bm).min(m));
                let (n0, n1) = (i_n * p.bn, ((i_n + 1) * p.bn).min(n));
                if m0 >= m1 || n0 >= n1 {
                    continue;
                }
                let pk_here = (0..p.pk).filter(|&q| q * p.bk < k).count() as u64;
                for ik in 0..pk_here {
                    let Some((r0, r1, c0, c1)) = reduce_share(m1 - m0, n1 - n0, ik, pk_here) else {
                        continue;
                    };
                    let tile = (p.grid(im, ik, i_n) % tiles) as TileId;
                    for (start, len) in rect(m0 + r0, m0 + r1, n0 + c0, n0 + c1, n) {
                        iv.push(Interval { tile, start, len });
                    }
                }
            }
        }
        Mapping::from_intervals(iv)
    }

    fn map_graph_tensors(&mut self, plan: &Plan<N>) {
        for (i, node) in self.graph.nodes().iter().enumerate() {
            let here = self.include[i] || self.remote[i];
            let elements = if node.op().is_update() || !here {
                0
            } else {
                node.shape().elements() as u64
            };
            let class =
                if plan.slots()[i].place == Place::State && self.include[i] && !self.offloaded[i] {
                    TensorClass::AlwaysLive
                } else {
                    TensorClass::NotAlwaysLive
                };
            let es = node.dtype().size() as u64;
            let mapping = if elements == 0 {
                Mapping::default()
            } else if !self.include[i] {
                // A copy of another IPU's tensor, spread like any new tensor.
                self.linear(elements, es, 1, node.shape().last() as u64)
            } else if matches!(node.op(), Op::MatMul { .. }) {
                self.matmul_output_mapping(i)
            } else if let Some(mm) = self.weight_consumer(i) {
                self.b_mapping(mm)
            } else if let Some(var) = self.state_owner(i) {
                self.tensors[var].mapping.clone()
            } else if let Some(x) = like_operand(node.op()) {
                // Element-wise results are laid out like their operand (as poplibs clones
                // it), so the op needs no exchange and the next op sees the same layout.
                self.tensors[x].mapping.clone()
            } else {
                let grain = match node.op() {
                    Op::Softmax { .. }
                    | Op::SoftmaxGrad { .. }
                    | Op::SparseCrossEntropyGrad { .. } => node.shape().last() as u64,
                    _ => 1,
                };
                self.linear(elements, es, grain, node.shape().last() as u64)
            };
            self.new_tensor(
                node.name().to_string(),
                i,
                node.dtype(),
                elements,
                mapping,
                class,
            );
        }
    }

    /// The matmul that uses state tensor `i` as its right-hand operand first, if any.
    fn weight_consumer(&self, i: usize) -> Option<usize> {
        let node = &self.graph.nodes()[i];
        if !node.op().is_state() {
            return None;
        }
        let c = self.first_consumer(i)?;
        match self.graph.nodes()[c].op() {
            Op::MatMul { b, .. } if b.index() == i => Some(c),
            _ => None,
        }
    }

    /// The variable whose update uses optimizer-state or accumulator tensor `i`, if any.
    fn state_owner(&self, i: usize) -> Option<usize> {
        let node = &self.graph.nodes()[i];
        if !node
            .roles()
            .intersects(Roles::OPTIMIZER_STATE | Roles::ACCUMULATOR)
        {
            return None;
        }
        self.graph
            .nodes()
            .iter()
            .find_map(|n| match *n.op() {
                Op::ApplySgd { var, grad, .. } if grad.index() == i => Some(var.index()),
                Op::ApplyMomentum {
                    var,
                    velocity,
                    grad,
                    ..
                } if velocity.index() == i || grad.index() == i => Some(var.index()),
                Op::ApplyAdam {
                    var, m, v, grad, ..
                } if m.index() == i || v.index() == i || grad.index() == i => Some(var.index()),
                _ => None,
            })
            .filter(|&var| self.graph.nodes()[var].shape() == node.shape())
    }
}

/// The elements `start .. start + len` of a row-major matrix with `cols` columns, as
/// (row, first column, end column) pieces.
fn row_segments(start: u64, len: u64, cols: u64) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut i = start;
    while i < start + len {
        let (r, c0) = (i / cols, i % cols);
        let c1 = cols.min(c0 + (start + len - i));
        out.push((r, c0, c1));
        i += c1 - c0;
    }
    out
}

/// The rectangle (rows r0..r1, cols c0..c1, within a rows x cols output block) that the q-th
/// of `pk` tiles reduces: a band of rows when there are enough rows, else a band of columns.
fn reduce_share(rows: u64, cols: u64, q: u64, pk: u64) -> Option<(u64, u64, u64, u64)> {
    if rows >= pk {
        let c = rows.div_ceil(pk);
        let (r0, r1) = (q * c, ((q + 1) * c).min(rows));
        (r0 < r1).then_some((r0, r1, 0, cols))
    } else {
        let c = cols.div_ceil(pk);
        let (c0, c1) = (q * c, ((q + 1) * c).min(cols));
        (c0 < c1).then_some((0, rows, c0, c1))
    }
}

/// The operand an element-wise op's result is laid out like.
fn like_operand(op: &Op) -> Option<usize> {
    match *op {
        Op::Add { a, .. } | Op::Sub { a, .. } | Op::Mul { a, .. } => Some(a.index()),
        Op::BiasAdd { x, .. }
        | Op::Scale { x, .. }
        | Op::Relu { x }
        | Op::Sigmoid { x }
        | Op::Tanh { x }
        | Op::Cast { x }
        | Op::Tap { x }
        | Op::Reshape { x } => Some(x.index()),
        Op::ReluGrad { dy, .. } | Op::SigmoidGrad { dy, .. } | Op::TanhGrad { dy, .. } => {
            Some(dy.index())
        }
        _ => None,
    }
}

/// Cycles of a row-wise op (softmax, cross-entropy and their gradients) over `n` elements in
/// rows of `cols`: an exp per element, a reduction per row and a divide per element.
fn row_op_cycles(cfg: &IpuConfig, n: u64, cols: u64, dt: DType) -> u64 {
    let rows = n.div_ceil(cols.max(1));
    UnaryKind::Exp.cycles(cfg, n, dt)
        + cost::reduce_cycles(cfg, rows, cols, dt)
        + UnaryKind::Reciprocal.cycles(cfg, n, dt)
}

/// Lowers `plan` onto one IPU described by `cfg`.
pub fn lower<const N: usize>(plan: &Plan<N>, cfg: &IpuConfig, opts: LowerOptions) -> Program {
    lower_subset(plan, cfg, opts, &|_| true)
}

/// Lowers the nodes `include` selects onto one IPU (one IPU of a sharded or pipelined system).
/// Tensors of other IPUs that these nodes read arrive over the IPU-Links into copies here;
/// state tensors (weights, counters) that these nodes read are kept here too.
pub fn lower_subset<const N: usize>(
    plan: &Plan<N>,
    cfg: &IpuConfig,
    opts: LowerOptions,
    include: &dyn Fn(usize) -> bool,
) -> Program {
    let graph = plan.graph();
    let mut inc: Vec<bool> = (0..graph.len()).map(include).collect();
    let reads_here = |inc: &[bool], x: usize| {
        graph
            .nodes()
            .iter()
            .enumerate()
            .any(|(c, n)| inc[c] && n.op().operands().as_slice().iter().any(|o| o.index() == x))
    };
    for i in 0..graph.len() {
        if !inc[i] && graph.nodes()[i].op().is_state() && reads_here(&inc, i) {
            inc[i] = true;
        }
    }
    let remote: Vec<bool> = (0..graph.len())
        .map(|i| !inc[i] && !graph.nodes()[i].op().is_update() && reads_here(&inc, i))
        .collect();
    let offloaded: Vec<bool> = (0..graph.len())
        .map(|i| {
            opts.offload_optimizer_state
                && inc[i]
                && graph.nodes()[i].roles().contains(Roles::OPTIMIZER_STATE)
                && graph.nodes()[i].shape().rank() > 0
        })
        .collect();
    let mut l = Lowering {
        cfg,
        graph,
        opts,
        tensors: Vec::with_capacity(graph.len() * 2),
        steps: Vec::new(),
        node_steps: Vec::with_capacity(graph.len()),
        cursor: 0,
        mm_plans: HashMap::new(),
        include: inc,
        remote,
        offloaded,
    };
    l.map_graph_tensors(plan);
    for i in 0..graph.len() {
        let start = l.steps.len();
        l.lower_node(i);
        l.node_steps.push((start, l.steps.len()));
    }
    // Liveness in program steps.
    let last_step = l.steps.len().saturating_sub(1);
    let step_range = |first_node: usize, last_node: usize, ns: &[(usize, usize)]| {
        let s = ns[first_node].0;
        let e = ns[last_node].1.max(s + 1) - 1;
        (s, e.min(last_step))
    };
    for (i, slot) in plan.slots().iter().enumerate() {
        l.tensors[i].live = match slot.place {
            // Offloaded state is on its tiles only while the op that uses it runs.
            Place::State if l.offloaded[i] => {
                let users: Vec<usize> = (0..graph.len())
                    .filter(|&c| {
                        graph.nodes()[c]
                            .op()
                            .operands()
                            .as_slice()
                            .iter()
                            .any(|o| o.index() == i)
                    })
                    .collect();
                match (users.first(), users.last()) {
                    (Some(&a), Some(&b)) => step_range(a, b, &l.node_steps),
                    _ => (0, 0),
                }
            }
            Place::State => (0, last_step),
            _ => step_range(
                if graph.nodes()[i].op() == &Op::Input {
                    0
                } else {
                    slot.first
                },
                slot.last,
                &l.node_steps,
            ),
        };
    }
    // Temporaries: from the first step that writes them to the last that reads them.
    let n_graph = graph.len();
    let mut first = vec![usize::MAX; l.tensors.len()];
    let mut last = vec![0usize; l.tensors.len()];
    for (s, step) in l.steps.iter().enumerate() {
        let mut touch = |t: u32| {
            let t = t as usize;
            if t >= n_graph {
                first[t] = first[t].min(s);
                last[t] = last[t].max(s);
            }
        };
        match step {
            Step::Compute(cs) => {
                for v in &cs.vertices {
                    v.reads
                        .iter()
                        .chain(&v.writes)
                        .for_each(|r| touch(r.tensor));
                }
            }
            Step::Exchange { transfers, .. } => {
                transfers.iter().for_each(|t| touch(t.region.tensor))
            }
            _ => {}
        }
    }
    for t in n_graph..l.tensors.len() {
        l.tensors[t].live = (first[t].min(last[t]), last[t]);
    }
    Program {
        tiles: cfg.tiles,
        tensors: l.tensors,
        steps: l.steps,
        node_steps: l.node_steps,
        node_names: graph.nodes().iter().map(|n| n.name().to_string()).collect(),
        forward_nodes: graph.forward_len(),
    }
}
