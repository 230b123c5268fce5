//! Random masks on tiles: element-wise, each tile drawing its own elements' mask from the
//! shared seed and step counter.

use tessera_core::ops::random::Random;
use tessera_core::{NodeId, Storage};

use super::{Lowering, Placement};
use crate::cost::UnaryKind;
use crate::program::{Codelet, Region, VertexType};

/// Where a random mask goes: spread by rows, as a new tensor.
pub(super) fn placement(_op: &Random) -> Placement {
    Placement::Rows(1)
}

pub(super) fn lower<S: Storage>(l: &mut Lowering<'_, S>, i: NodeId, op: &Random) {
    let cfg = l.cfg;
    let dt = l.node(i).dtype();
    let Random::KeepMask { counter, .. } = *op;
    let (out, ct) = (l.t(i), l.t(counter));
    // Estimate: a hash and a compare per element cost about a transcendental (8 cycles per
    // vector); the tile also has a hardware random-number generator poplibs uses instead.
    l.elementwise(
        i,
        out,
        &[],
        // The keep-mask's own codelet (popops' `Dropout`-like random vertices).
        Codelet::Unary(VertexType::of(u8::MAX - 1, dt)),
        move |n| UnaryKind::Sigmoid.cycles(cfg, n, dt),
        move |_, _, reads| reads.push(Region::span(ct, 0, 1)),
    );
}
