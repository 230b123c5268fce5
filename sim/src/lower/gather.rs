//! Gathers on tiles. Which table row an output row reads is data, unknown when the program is
//! lowered; the estimate stands in row `i mod rows` for output row `i` (spreading lookups over
//! the table's tiles as random indices do) and copies each row where the output lives. The
//! scatter-add gradient is planned and laid out as poplibs plans `multiUpdateAdd`
//! ([`super::embedding`]).

use tessera_core::ops::gather::Gather;
use tessera_core::{NodeId, Storage};

use super::{row_segments, Lowering, Placement};
use crate::cost::UnaryKind;
use crate::program::{Codelet, Region, VertexType, GATHER_ROWS, ONE_HOT};

pub(super) fn placement(node: &tessera_core::Node, op: &Gather) -> Placement {
    match op {
        // Looked-up rows are cut into chunks that divide the row, spread over the tiles as
        // poplibs' multiSlice plans split the embedding dimension: whole rows would put a
        // sequence's activations (and everything laid out like them) on as many tiles as
        // it has tokens.
        Gather::Rows { .. } => Placement::Rows(1),
        // The gradient of a table is laid out by its plan (see `embedding`).
        Gather::ScatterAdd { .. } => Placement::Own,
        Gather::OneHot { .. } => Placement::Rows(node.shape().last() as u64),
    }
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Gather) {
    let cfg = l.cfg;
    let node = l.node(i);
    let (dt, so) = (node.dtype(), node.shape());
    let out = l.t(i);
    match *op {
        Gather::Rows { table, indices } => {
            let (tt, it) = (l.t(table), l.t(indices));
            let st = l.node(table).shape();
            let (rows, row) = (st.dim(0) as u64, (st.elements() / st.dim(0)) as u64);
            l.per_tile(
                i,
                "gather",
                out,
                Codelet::Gather(VertexType::of(GATHER_ROWS, dt)),
                move |n| UnaryKind::Copy.cycles(cfg, n, dt),
                |iv, reads| {
                    for (r, c0, c1) in row_segments(iv.start, iv.len, row) {
                        reads.push(Region::span(it, r, 1));
                        reads.push(Region::span(tt, (r % rows) * row + c0, c1 - c0));
                    }
                },
            );
        }
        Gather::ScatterAdd { dy, indices } => {
            super::embedding::lower_scatter_add(l, i, dy, indices)
        }
        Gather::OneHot { indices } => {
            let it = l.t(indices);
            let depth = so.last() as u64;
            l.elementwise(
                i,
                out,
                &[],
                Codelet::Gather(VertexType::of(ONE_HOT, dt)),
                move |n| UnaryKind::Copy.cycles(cfg, n, dt),
                move |s, len, reads| {
                    reads.push(Region::span(
                        it,
                        s / depth,
                        (s + len).div_ceil(depth) - s / depth,
                    ));
                },
            );
        }
    }
}
