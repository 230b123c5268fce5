//! Matmuls on tiles, as poplibs plans them: each product `[m, k] x [k, n]` is split into a
//! grid of `pm x pk x pn` blocks, each block's partial product runs on one tile's AMP, and
//! when `k` is split the fp32 partial sums are exchanged and reduced.
//!
//! A batched product is a set of independent groups (as poplibs treats grouped matmuls), each
//! planned on its share of the tiles; when only the left operand has batch axes (a dense layer
//! applied to a sequence) the batch folds into `m` and it is one plain product.

use std::collections::HashMap;

use tessera_core::ops::matmul::MatMul;
use tessera_core::{DType, NodeId, Op, Shape, Storage};

use super::{rect, Lowering};
use crate::cost;
use crate::matmul::{plan_matmul, MatMulPlan};
use crate::program::{Codelet, Interval, Mapping, Region, TensorId, TileId, Vertex};

/// Plans made so far, by node.
pub(crate) type Plans = HashMap<NodeId, (Geometry, MatMulPlan)>;

/// The shape of a (batched) product as the tiles see it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Geometry {
    /// Per group: the first element of its `a` matrix, of its `b` matrix and of its output.
    groups: Vec<(u64, u64, u64)>,
    m: u64,
    k: u64,
    n: u64,
    /// Stored columns of `a` and `b` (their last axes).
    a_cols: u64,
    b_cols: u64,
    ta: bool,
    tb: bool,
    /// Tiles each group's plan uses (its share).
    tiles_per_group: u64,
}

/// The batch axes of a rank >= 2 shape, as dims.
fn batch_dims(s: Shape) -> Vec<u64> {
    s.dims()[..s.rank() - 2]
        .iter()
        .map(|&d| u64::from(d))
        .collect()
}

fn geometry<S: Storage>(l: &Lowering<'_, S>, i: NodeId, op: &MatMul) -> Geometry {
    let (sa, sb, so) = (
        l.node(op.a).shape(),
        l.node(op.b).shape(),
        l.node(i).shape(),
    );
    let (ta, tb) = (op.transpose_a, op.transpose_b);
    let (a_rows, a_cols) = (sa.dim(sa.rank() - 2) as u64, sa.last() as u64);
    let (b_rows, b_cols) = (sb.dim(sb.rank() - 2) as u64, sb.last() as u64);
    let (m, k) = if ta {
        (a_cols, a_rows)
    } else {
        (a_rows, a_cols)
    };
    let n = if tb { b_rows } else { b_cols };
    let tiles = u64::from(l.tile_count());
    let out_batch = batch_dims(so);
    let groups_total: u64 = out_batch.iter().product();
    if sb.rank() == 2 && !ta {
        // The batch folds into m: one product of [batch * m, k] x [k, n].
        return Geometry {
            groups: vec![(0, 0, 0)],
            m: m * groups_total,
            k,
            n,
            a_cols,
            b_cols,
            ta,
            tb,
            tiles_per_group: tiles,
        };
    }
    // Each output batch element: the a and b matrices it reads (numpy broadcasting).
    let (ab, bb) = (batch_dims(sa), batch_dims(sb));
    let r = out_batch.len();
    let strides = |dims: &[u64]| {
        let pad = r - dims.len();
        let mut st = vec![0u64; r];
        let mut s = 1;
        for i in (0..r).rev() {
            let d = if i >= pad { dims[i - pad] } else { 1 };
            st[i] = if d == 1 && out_batch[i] != 1 { 0 } else { s };
            s *= d;
        }
        st
    };
    let (sa_, sb_) = (strides(&ab), strides(&bb));
    let mut groups = Vec::with_capacity(groups_total as usize);
    for g in 0..groups_total {
        let (mut rem, mut ia, mut ib) = (g, 0, 0);
        for d in (0..r).rev() {
            let c = rem % out_batch[d];
            rem /= out_batch[d];
            ia += c * sa_[d];
            ib += c * sb_[d];
        }
        groups.push((ia * a_rows * a_cols, ib * b_rows * b_cols, g * m * n));
    }
    Geometry {
        groups,
        m,
        k,
        n,
        a_cols,
        b_cols,
        ta,
        tb,
        tiles_per_group: (tiles / groups_total.max(1)).max(1),
    }
}

/// The geometry and plan of matmul `i`.
pub(crate) fn plan_of<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId) -> (Geometry, MatMulPlan) {
    if let Some(p) = l.mm.get(&i) {
        return p.clone();
    }
    let Op::MatMul(op) = *l.node(i).op() else {
        unreachable!("plan_of is only called on matmuls")
    };
    let g = geometry(l, i, &op);
    let b_resident =
        g.groups.len() == 1 && l.node(op.b).op().is_state() && l.first_consumer(op.b) == Some(i);
    let p = plan_matmul(
        l.cfg,
        g.m,
        g.k,
        g.n,
        l.node(i).dtype(),
        b_resident,
        g.tiles_per_group,
    );
    l.mm.insert(i, (g.clone(), p));
    (g, p)
}

/// Whether matmul `i` is one plain product (so its right-hand operand can be laid out by it).
pub(super) fn single_product<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId) -> bool {
    plan_of(l, i).0.groups.len() == 1
}

/// The tile of block `grid` of group `g`.
fn tile(g: usize, grid: u64, geo: &Geometry, tiles: u32) -> TileId {
    TileId::wrapping(g as u64 * geo.tiles_per_group + grid, tiles)
}

/// The mapping of the right-hand operand of matmul `mm` by its plan: block (ik, in) on the
/// tile of grid (0, ik, in).
pub(super) fn b_mapping<S: Storage>(l: &mut Lowering<'_, S>, mm: NodeId) -> Mapping {
    let (geo, p) = plan_of(l, mm);
    let (k, n, cols) = (geo.k, geo.n, geo.b_cols);
    let mut iv = Vec::new();
    for ik in 0..p.pk {
        let (k0, k1) = (ik * p.bk, ((ik + 1) * p.bk).min(k));
        for i_n in 0..p.pn {
            let (n0, n1) = (i_n * p.bn, ((i_n + 1) * p.bn).min(n));
            if k0 >= k1 || n0 >= n1 {
                continue;
            }
            let tile = tile(0, p.grid(0, ik, i_n), &geo, l.tile_count());
            let segs: Vec<(u64, u64)> = if geo.tb {
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

/// The mapping of matmul `i`'s output: where its final values are written.
pub(super) fn output_mapping<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId) -> Mapping {
    let (geo, p) = plan_of(l, i);
    let (m, k, n) = (geo.m, geo.k, geo.n);
    let mut iv = Vec::new();
    for (g, &(_, _, base)) in geo.groups.iter().enumerate() {
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
                    let tile = tile(g, p.grid(im, ik, i_n), &geo, l.tile_count());
                    for (start, len) in rect(m0 + r0, m0 + r1, n0 + c0, n0 + c1, n) {
                        iv.push(Interval {
                            tile,
                            start: base + start,
                            len,
                        });
                    }
                }
            }
        }
    }
    Mapping::from_intervals(iv)
}

/// One block of the grid: group, (im, ik, in) and its element ranges.
#[derive(Clone, Copy)]
struct Block {
    g: usize,
    im: u64,
    ik: u64,
    i_n: u64,
    m: (u64, u64),
    k: (u64, u64),
    n: (u64, u64),
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &MatMul) {
    let cfg = l.cfg;
    let (geo, p) = plan_of(l, i);
    let dt = l.node(i).dtype();
    let (m, k, n) = (geo.m, geo.k, geo.n);
    let tiles = l.tile_count();
    let (at, bt, out) = (l.t(op.a), l.t(op.b), l.t(i));
    let mut blocks = Vec::new();
    for g in 0..geo.groups.len() {
        for im in 0..p.pm {
            for ik in 0..p.pk {
                for i_n in 0..p.pn {
                    let (m0, m1) = (im * p.bm, ((im + 1) * p.bm).min(m));
                    let (k0, k1) = (ik * p.bk, ((ik + 1) * p.bk).min(k));
                    let (n0, n1) = (i_n * p.bn, ((i_n + 1) * p.bn).min(n));
                    if m0 < m1 && k0 < k1 && n0 < n1 {
                        blocks.push(Block {
                            g,
                            im,
                            ik,
                            i_n,
                            m: (m0, m1),
                            k: (k0, k1),
                            n: (n0, n1),
                        });
                    }
                }
            }
        }
    }
    // Each block reads one strided region of each operand.
    let block = |t: TensorId, base: u64, r: (u64, u64), c: (u64, u64), cols: u64| {
        Region::strided(t, base + r.0 * cols + c.0, c.1 - c.0, r.1 - r.0, cols)
    };
    let reads_of = |b: &Block| {
        let (abase, bbase, _) = geo.groups[b.g];
        let a = if geo.ta {
            block(at, abase, b.k, b.m, geo.a_cols)
        } else {
            block(at, abase, b.m, b.k, geo.a_cols)
        };
        let bb = if geo.tb {
            block(bt, bbase, b.n, b.k, geo.b_cols)
        } else {
            block(bt, bbase, b.k, b.n, geo.b_cols)
        };
        vec![a, bb]
    };
    let tile_of = |b: &Block| tile(b.g, p.grid(b.im, b.ik, b.i_n), &geo, tiles);
    let amp =
        |b: &Block| cost::matmul_amp_cycles(cfg, b.m.1 - b.m.0, b.k.1 - b.k.0, b.n.1 - b.n.0, dt);
    if p.pk == 1 {
        let vertices = blocks
            .iter()
            .map(|b| Vertex {
                tile: tile_of(b),
                codelet: Codelet::MatMulPartial,
                cycles: amp(b),
                reads: reads_of(b),
                writes: vec![block(out, geo.groups[b.g].2, b.m, b.n, n)],
            })
            .collect();
        l.compute(i, "matmul", vertices);
        return;
    }
    // Partial sums (fp32) block by block, then each block reduced by its pk tiles.
    let mut offsets = HashMap::new();
    let mut total = 0u64;
    let mut iv = Vec::new();
    for b in &blocks {
        offsets.insert((b.g, b.im, b.ik, b.i_n), total);
        let size = (b.m.1 - b.m.0) * (b.n.1 - b.n.0);
        iv.push(Interval {
            tile: tile_of(b),
            start: total,
            len: size,
        });
        total += size;
    }
    let partials = l.temporary(
        i,
        "partials",
        DType::F32,
        total,
        Mapping::from_intervals(iv),
    );
    let vertices = blocks
        .iter()
        .map(|b| Vertex {
            tile: tile_of(b),
            codelet: Codelet::MatMulPartial,
            cycles: amp(b),
            reads: reads_of(b),
            writes: vec![Region::span(
                partials,
                offsets[&(b.g, b.im, b.ik, b.i_n)],
                (b.m.1 - b.m.0) * (b.n.1 - b.n.0),
            )],
        })
        .collect();
    l.compute(i, "partials", vertices);
    let mut vertices = Vec::new();
    for b in &blocks {
        let pk_here = (0..p.pk)
            .filter(|&q| offsets.contains_key(&(b.g, b.im, q, b.i_n)))
            .count() as u64;
        let (rows, cols) = (b.m.1 - b.m.0, b.n.1 - b.n.0);
        let Some((r0, r1, c0, c1)) = reduce_share(rows, cols, b.ik, pk_here) else {
            continue;
        };
        // The same rectangle of every partial block of this output block.
        let reads = (0..p.pk)
            .filter_map(|q| offsets.get(&(b.g, b.im, q, b.i_n)))
            .map(|&off| Region::strided(partials, off + r0 * cols + c0, c1 - c0, r1 - r0, cols))
            .collect();
        let base = geo.groups[b.g].2;
        let writes = vec![Region::strided(
            out,
            base + (b.m.0 + r0) * n + b.n.0 + c0,
            c1 - c0,
            r1 - r0,
            n,
        )];
        vertices.push(Vertex {
            tile: tile_of(b),
            codelet: Codelet::Reduce,
            cycles: cost::reduce_cycles(cfg, (r1 - r0) * (c1 - c0), pk_here, DType::F32),
            reads,
            writes,
        });
    }
    l.compute(i, "reduce", vertices);
}
