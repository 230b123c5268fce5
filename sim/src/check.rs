//! The checker: a lowered program is valid when every mapping covers its tensor on real
//! tiles, every exchange sends data from where it lives, and every vertex reads only data on
//! its tile (its tensor's mapping or what the preceding exchange delivered) and writes only
//! data mapped to its tile.

use std::collections::HashMap;

use crate::program::{exchange_for, ComputeSet, Program, Step, TensorId, TileId, Transfer};

/// Why a program is not valid. Each variant names the compute set, tile and tensor at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// A tensor's mapping leaves elements unmapped, maps some twice, or names a tile the IPU
    /// does not have.
    #[error("tensor `{tensor}`: {detail}")]
    BadMapping {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// A vertex reads elements that are neither on its tile nor delivered by the exchange
    /// before its compute set (a missing exchange).
    #[error("compute set `{compute_set}`: a vertex on tile {tile} reads elements {start}..{} of `{tensor}`, which are not on that tile (missing exchange)", start + len)]
    NotResident {
        /// The compute set.
        compute_set: String,
        /// The vertex's tile.
        tile: TileId,
        /// The tensor read.
        tensor: String,
        /// First element missing.
        start: u64,
        /// Elements missing.
        len: u64,
    },
    /// A vertex writes elements that are not mapped to its tile.
    #[error("compute set `{compute_set}`: a vertex on tile {tile} writes element {start} of `{tensor}`, which lives on another tile")]
    WriteNotLocal {
        /// The compute set.
        compute_set: String,
        /// The vertex's tile.
        tile: TileId,
        /// The tensor written.
        tensor: String,
        /// First element.
        start: u64,
    },
    /// An exchange sends elements from a tile that does not hold them.
    #[error("exchange for `{node}`: tile {tile} sends element {start} of `{tensor}`, which it does not hold")]
    BadSource {
        /// The graph node of the exchange.
        node: String,
        /// The sending tile named.
        tile: TileId,
        /// The tensor.
        tensor: String,
        /// First element.
        start: u64,
    },
}

/// Checks a program. Memory limits are checked by [`crate::memory`].
pub fn check(program: &Program) -> Result<(), CheckError> {
    for t in &program.tensors {
        let mut next = 0;
        for iv in t.mapping.intervals() {
            let bad = |detail: String| CheckError::BadMapping {
                tensor: t.name.clone(),
                detail,
            };
            if iv.start != next {
                return Err(bad(format!(
                    "elements {next}..{} are mapped {}",
                    iv.start.max(next),
                    if iv.start > next { "nowhere" } else { "twice" }
                )));
            }
            if iv.tile.0 >= program.tiles {
                return Err(bad(format!(
                    "mapped to tile {}, but the IPU has {} tiles",
                    iv.tile, program.tiles
                )));
            }
            next = iv.end();
        }
        if next != t.elements {
            return Err(CheckError::BadMapping {
                tensor: t.name.clone(),
                detail: format!("elements {next}..{} are mapped nowhere", t.elements),
            });
        }
    }
    // The transfers of the exchange before the current compute set (sorted).
    let mut delivered: &[Transfer] = &[];
    for step in &program.steps {
        match step {
            Step::Exchange { node, transfers } => {
                for tr in transfers {
                    let t = &program.tensors[tr.region.tensor.index()];
                    let mut ok = true;
                    t.mapping
                        .for_each_piece_of(&tr.region, |_, tile, _, _| ok &= tile == tr.from);
                    if !ok {
                        return Err(CheckError::BadSource {
                            node: program
                                .node_names
                                .get(node.index())
                                .cloned()
                                .unwrap_or_default(),
                            tile: tr.from,
                            tensor: t.name.clone(),
                            start: tr.region.start,
                        });
                    }
                }
                delivered = transfers;
            }
            Step::Compute(cs) => {
                check_reads(program, cs, delivered)?;
                for v in &cs.vertices {
                    for w in &v.writes {
                        let t = &program.tensors[w.tensor.index()];
                        let mut bad = None;
                        t.mapping.for_each_piece_of(w, |_, tile, s, _| {
                            if tile != v.tile && bad.is_none() {
                                bad = Some(s);
                            }
                        });
                        if let Some(start) = bad {
                            return Err(CheckError::WriteNotLocal {
                                compute_set: cs.name.clone(),
                                tile: v.tile,
                                tensor: t.name.clone(),
                                start,
                            });
                        }
                    }
                }
                delivered = &[];
            }
            _ => delivered = &[],
        }
    }
    Ok(())
}

/// Every element a vertex reads from another tile must have been delivered to its tile. The
/// needed transfers are computed as the lowering computes them; each is found in the delivered
/// list (fast path) or, failing that, its elements are looked for row by row among everything
/// delivered to that tile for that tensor.
fn check_reads(
    program: &Program,
    cs: &ComputeSet,
    delivered: &[Transfer],
) -> Result<(), CheckError> {
    let needed = exchange_for(&program.tensors, &cs.vertices);
    let mut expanded: HashMap<(TileId, TensorId), Vec<(u64, u64)>> = HashMap::new();
    for tr in &needed {
        if delivered.binary_search(tr).is_ok() {
            continue;
        }
        let key = (tr.to, tr.region.tensor);
        let got = expanded.entry(key).or_insert_with(|| {
            let mut v: Vec<(u64, u64)> = delivered
                .iter()
                .filter(|d| d.to == key.0 && d.region.tensor == key.1)
                .flat_map(|d| d.region.runs().map(|(s, l)| (s, s + l)).collect::<Vec<_>>())
                .collect();
            v.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(v.len());
            for (s, e) in v {
                match merged.last_mut() {
                    Some((_, le)) if s <= *le => *le = (*le).max(e),
                    _ => merged.push((s, e)),
                }
            }
            merged
        });
        for (start, len) in tr.region.runs() {
            if !covered(Some(got), start, start + len) {
                return Err(CheckError::NotResident {
                    compute_set: cs.name.clone(),
                    tile: tr.to,
                    tensor: program.tensors[tr.region.tensor.index()].name.clone(),
                    start,
                    len,
                });
            }
        }
    }
    Ok(())
}

/// Whether the sorted, merged intervals `got` cover `s..e`.
fn covered(got: Option<&Vec<(u64, u64)>>, s: u64, e: u64) -> bool {
    let Some(v) = got else { return false };
    let i = v.partition_point(|&(_, ie)| ie <= s);
    i < v.len() && v[i].0 <= s && v[i].1 >= e
}
