//! Data movement on tiles: views cost nothing (they read their root's tensor), taps are
//! copies laid out like their operand, and transposes, concatenations, slices and pads are
//! copies into the output's layout, receiving what each tile's part needs.

use tessera_core::ops::layout::Layout;
use tessera_core::{NodeId, Shape, Storage};

use super::{row_segments, Lowering, Placement};
use crate::cost::UnaryKind;
use crate::program::{Codelet, Region};

pub(super) fn placement(op: &Layout) -> Placement {
    match *op {
        Layout::Reshape { .. } => Placement::Nothing,
        Layout::Tap { x } => Placement::Like(x),
        _ => Placement::Rows(1),
    }
}

/// (outer, elements per outer index) of `s` from `axis` on.
fn chunks(s: Shape, axis: u8) -> (u64, u64) {
    let (outer, len, inner) = s.split_at_axis(axis as usize);
    (outer as u64, (len * inner) as u64)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Layout) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, so) = (node.dtype(), node.shape());
    let out = l.t(i);
    let copy = move |n| UnaryKind::Copy.cycles(cfg, n, dt);
    let span_out = |s, len| vec![Region::span(out, s, len)];
    match *op {
        Layout::Reshape { .. } => {}
        Layout::Tap { x } => {
            let xt = l.t(x);
            l.elementwise(i, out, &[xt], Codelet::Copy, copy, |_, _| Vec::new());
        }
        Layout::Transpose { x, .. } if so.rank() <= 1 => {
            // Nothing moves: a copy.
            let xt = l.t(x);
            l.elementwise(i, out, &[xt], Codelet::Copy, copy, |_, _| Vec::new());
        }
        Layout::Transpose { x, perm } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let r = so.rank();
            let mut st = vec![0u64; r];
            let mut acc = 1u64;
            for a in (0..r).rev() {
                st[a] = acc;
                acc *= sx.dim(a) as u64;
            }
            // x's stride for each output axis.
            let ps: Vec<u64> = (0..r).map(|a| st[perm[a] as usize]).collect();
            let cols = so.last() as u64;
            l.per_tile(i, "transpose", out, Codelet::Copy, copy, |iv| {
                let mut reads = Vec::new();
                for (row, c0, c1) in row_segments(iv.start, iv.len, cols) {
                    let (mut rem, mut off) = (row, c0 * ps[r - 1]);
                    for a in (0..r - 1).rev() {
                        let d = so.dim(a) as u64;
                        off += (rem % d) * ps[a];
                        rem /= d;
                    }
                    reads.push(if ps[r - 1] == 1 {
                        Region::span(xt, off, c1 - c0)
                    } else {
                        Region::strided(xt, off, 1, c1 - c0, ps[r - 1])
                    });
                }
                (reads, span_out(iv.start, iv.len))
            });
        }
        Layout::Concat { a, b, axis } => {
            let (ta, tb) = (l.t(a), l.t(b));
            let ca = chunks(l.node(a).shape(), axis).1;
            let cb = chunks(l.node(b).shape(), axis).1;
            l.per_tile(i, "concat", out, Codelet::Copy, copy, |iv| {
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
                (reads, span_out(iv.start, iv.len))
            });
        }
        Layout::Slice { x, axis, start } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let cx = chunks(sx, axis).1;
            let c = chunks(so, axis).1;
            let at = u64::from(start) * (cx / sx.dim(axis as usize) as u64);
            l.per_tile(i, "slice", out, Codelet::Copy, copy, |iv| {
                let reads = row_segments(iv.start, iv.len, c)
                    .into_iter()
                    .map(|(r, c0, c1)| Region::span(xt, r * cx + at + c0, c1 - c0))
                    .collect();
                (reads, span_out(iv.start, iv.len))
            });
        }
        Layout::Pad { x, axis, before } => {
            let (xt, sx) = (l.t(x), l.node(x).shape());
            let cx = chunks(sx, axis).1;
            let c = chunks(so, axis).1;
            let at = u64::from(before) * (c / so.dim(axis as usize) as u64);
            l.per_tile(i, "pad", out, Codelet::Copy, copy, |iv| {
                let mut reads = Vec::new();
                for (r, c0, c1) in row_segments(iv.start, iv.len, c) {
                    let (s, e) = (c0.max(at), c1.min(at + cx));
                    if s < e {
                        reads.push(Region::span(xt, r * cx + s - at, e - s));
                    }
                }
                (reads, span_out(iv.start, iv.len))
            });
        }
        _ => {}
    }
}
