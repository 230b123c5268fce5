//! Operands read by broadcast in element-wise compute sets (a batch norm's statistics, its
//! scale and shift, a bias): each tile of the output reads the operand's elements that its
//! intervals' elements map to. A large output holds millions of intervals, and the tiles'
//! joined reads depend only on the output's layout and the kind of broadcast, not on which
//! operand it is: they are made once per (layout, kind) in this process and shared. A batch
//! norm's input is normalised, normalised again for the backward pass and normalised in its
//! gradient, and its scale and shift are read the same way, all on one layout.

use std::sync::Arc;

use tessera_core::Shape;

use super::kept::Kept;
use super::BroadcastReads;
use crate::exchange::PerTile;
use crate::program::{compress_from, Mapping, Region, TensorId};

/// The tensor the shared reads are made for, renamed to each operand when read
/// ([`TileReads::tile`] gives them with it).
const PLACEHOLDER: TensorId = TensorId(u32::MAX);

/// An operand of shape `from` read by broadcast to the output's shape `to`: each element of
/// `from` is `values` consecutive elements of the operand's tensor (2 for a normalisation's
/// statistics, a mean and a 1/sd per group).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Broadcast {
    reads: BroadcastReads,
    from: Shape,
    to: Shape,
    values: u64,
}

impl Broadcast {
    /// Operand `t` of shape `from` read by broadcast to `to`, an element a value.
    pub(crate) fn new(t: TensorId, from: Shape, to: Shape) -> Self {
        Self::with_values(t, from, to, 1)
    }

    /// Operand `t` of shape `from` read by broadcast to `to`, `values` consecutive elements
    /// of `t` per element of `from`.
    pub(crate) fn with_values(t: TensorId, from: Shape, to: Shape, values: u64) -> Self {
        Broadcast {
            reads: BroadcastReads::new(t, from, to),
            from,
            to,
            values: values.max(1),
        }
    }

    /// The operand's tensor.
    pub(crate) fn tensor(&self) -> TensorId {
        self.reads.t
    }

    /// How each tile of the output reads the operand, for the exchange's summary.
    pub(crate) fn per_tile(&self) -> PerTile {
        PerTile::Broadcast {
            from: self.from,
            to: self.to,
            values: self.values,
        }
    }

    /// Whether `other` reads the same elements of its operand as this one does of its own.
    fn reads_alike(&self, other: &Broadcast) -> bool {
        (self.from, self.to, self.values) == (other.from, other.to, other.values)
    }

    /// Appends the regions that output elements `start .. start + len` read to `out` (`tmp`
    /// is room for the groups when an element is several values).
    pub(crate) fn push(&self, start: u64, len: u64, out: &mut Vec<Region>, tmp: &mut Vec<Region>) {
        if self.values == 1 {
            return self.reads.push(start, len, out);
        }
        tmp.clear();
        self.reads.push(start, len, tmp);
        let v = self.values;
        out.extend(
            tmp.iter()
                .map(|r| Region::span(r.tensor, r.start * v, r.len * v)),
        );
    }
}

/// The operands of `broadcast` once each, when each tile's reads of them can be joined apart
/// from the rest: `None` when one is also read element for element (`same`: the tile's
/// regions of it are joined together), or when one tensor is read by broadcast in two ways.
pub(crate) fn distinct<'b>(
    same: &[TensorId],
    broadcast: &'b [Broadcast],
) -> Option<Vec<&'b Broadcast>> {
    let mut out: Vec<&Broadcast> = Vec::with_capacity(broadcast.len());
    for b in broadcast {
        if same.contains(&b.tensor()) {
            return None;
        }
        match out.iter().find(|o| o.tensor() == b.tensor()) {
            // The same elements read twice: the same regions.
            Some(o) if o.reads_alike(b) => {}
            Some(_) => return None,
            None => out.push(b),
        }
    }
    Some(out)
}

/// Each tile's joined reads of a broadcast operand, tiles in the order of the layout's
/// [`intervals_by_tile`](Mapping::intervals_by_tile), made for [`PLACEHOLDER`].
#[derive(Debug, Default)]
struct Lists {
    /// Where each tile's regions start in `regions` (and, last, their end).
    starts: Vec<usize>,
    regions: Vec<Region>,
}

/// Each tile's joined reads of a broadcast operand (shared).
#[derive(Clone, Debug)]
pub(crate) struct TileReads(Arc<Lists>);

impl TileReads {
    /// The `k`th tile's regions (of a tensor to be named by the reader).
    pub(crate) fn tile(&self, k: usize) -> &[Region] {
        let l = &self.0;
        &l.regions[l.starts[k]..l.starts[k + 1]]
    }
}

/// What each tile's reads depend on: the output's layout (by digest), the broadcast's shapes
/// and values per element.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    mapping: u128,
    from: Shape,
    to: Shape,
    values: u64,
}

/// Tiles' reads made so far in this process. At most 1024 are kept (an estimate: a few
/// models' worth of normalised layouts, each with a few kinds of broadcast).
static KEPT: Kept<Key, TileReads> = Kept::new(1024);

/// Drops the tiles' reads this process keeps.
pub(super) fn clear() {
    KEPT.clear();
}

/// Each tile of `mapping` (the output's layout) with the regions of `b`'s operand its
/// intervals read, joined as [`compress`](crate::program::compress) joins them: the regions
/// of each interval, in any order, give the same joined regions (joining sorts them and
/// drops repeats).
pub(crate) fn per_tile(mapping: &Mapping, b: &Broadcast) -> TileReads {
    let key = Key {
        mapping: mapping.digest(),
        from: b.from,
        to: b.to,
        values: b.values,
    };
    KEPT.get_or_make(key, || make(mapping, b))
}

/// [`per_tile`], made.
fn make(mapping: &Mapping, b: &Broadcast) -> TileReads {
    let b = Broadcast {
        reads: BroadcastReads::new(PLACEHOLDER, b.from, b.to),
        ..*b
    };
    let mut lists = Lists::default();
    let (mut raw, mut tmp) = (Vec::new(), Vec::new());
    lists.starts.push(0);
    for group in mapping
        .intervals_by_tile()
        .chunk_by(|a, b| a.tile == b.tile)
    {
        raw.clear();
        for iv in group {
            b.push(iv.start, iv.len, &mut raw, &mut tmp);
        }
        lists.regions.append(&mut compress_from(&mut raw));
        lists.starts.push(lists.regions.len());
    }
    TileReads(Arc::new(lists))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{compress, Interval, TileId};

    fn shape(d: &[usize]) -> Shape {
        Shape::new(d).unwrap()
    }

    /// A tile's shared reads, renamed, are the joined regions its intervals read one by one;
    /// an operand read both ways, or broadcast two ways, is not taken apart.
    #[test]
    fn shared_reads_are_each_tiles_joined_reads() {
        let (to, from) = (shape(&[2, 6, 4, 4]), shape(&[1, 6, 1, 1]));
        // Intervals of irregular lengths dealt over three tiles, out of order.
        let mut ivs = Vec::new();
        let (mut at, mut k) = (0u64, 0u32);
        while at < 192 {
            let len = [5u64, 16, 3, 11, 7][k as usize % 5].min(192 - at);
            ivs.push(Interval {
                tile: TileId((k * 7) % 3),
                start: at,
                len,
            });
            at += len;
            k += 1;
        }
        let mapping = Mapping::from_intervals(ivs);
        for values in [1, 2] {
            let b = Broadcast::with_values(TensorId(9), from, to, values);
            let shared = per_tile(&mapping, &b);
            let mut tmp = Vec::new();
            for (k, group) in mapping
                .intervals_by_tile()
                .chunk_by(|a, b| a.tile == b.tile)
                .enumerate()
            {
                let mut raw = Vec::new();
                for iv in group {
                    b.push(iv.start, iv.len, &mut raw, &mut tmp);
                }
                let renamed: Vec<Region> = shared
                    .tile(k)
                    .iter()
                    .map(|r| Region {
                        tensor: TensorId(9),
                        ..*r
                    })
                    .collect();
                assert_eq!(renamed, compress(raw), "tile {k}, {values} values");
            }
        }
        let a = Broadcast::new(TensorId(1), from, to);
        let b = Broadcast::new(TensorId(2), shape(&[2, 1, 1, 1]), to);
        let twice = Broadcast::new(TensorId(1), shape(&[1, 1, 1, 4]), to);
        assert_eq!(
            distinct(&[TensorId(3)], &[a, b, a]).map(|v| v.len()),
            Some(2)
        );
        assert!(distinct(&[TensorId(1)], &[a, b]).is_none());
        assert!(distinct(&[], &[a, twice]).is_none());
    }
}
