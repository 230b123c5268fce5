//! Planning a matrix multiply across tiles, as poplibs does: split `[m, k] x [k, n]` into a
//! grid of `pm x pk x pn` tiles, each computing a block's partial product on its AMP; when `k`
//! is split, the partial sums are exchanged and reduced.

use serde::{Deserialize, Serialize};
use tessera_core::DType;

use crate::cost;
use crate::machine::IpuConfig;

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
}

impl MatMulPlan {
    /// Tiles the plan uses.
    pub fn tiles(&self) -> u64 {
        self.pm * self.pk * self.pn
    }

    /// Tile cycles of the AMP vertex of one block of `m x k x n` in this plan's orientation.
    pub fn amp_cycles(&self, cfg: &IpuConfig, m: u64, k: u64, n: u64, dtype: DType) -> u64 {
        if self.swapped {
            cost::matmul_amp_cycles(cfg, n, k, m, dtype)
        } else {
            cost::matmul_amp_cycles(cfg, m, k, n, dtype)
        }
    }

    /// Grid index of block (im, ik, in): the tile it runs on, counted from the first tile.
    pub fn grid(&self, im: u64, ik: u64, i_n: u64) -> u64 {
        (im * self.pk + ik) * self.pn + i_n
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

/// The cheapest plan for `[m, k] x [k, n]` in `dtype` on up to `tiles` tiles. With
/// `b_resident`, the right-hand operand is laid out by the plan (as weights are) and costs no
/// exchange.
pub fn plan_matmul(
    cfg: &IpuConfig,
    m: u64,
    k: u64,
    n: u64,
    dtype: DType,
    b_resident: bool,
    tiles: u64,
) -> MatMulPlan {
    let s = dtype.size() as u64;
    let sync = cfg.sync_cycles;
    let mut best: Option<((bool, u64, u64), MatMulPlan)> = None;
    let tiles = tiles.max(1);
    // Either m or n (whichever the AMP takes as output channels) groups by conv units.
    let (k_grain, out_grain) = (cost::amp_in_group(dtype), cost::amp_conv_units(cfg, dtype));
    for &pm in &splits(m, tiles, out_grain) {
        for &pn in &splits(n, tiles / pm, out_grain) {
            for &pk in &splits(k, tiles / (pm * pn), k_grain) {
                let (bm, bk, bn) = (m.div_ceil(pm), k.div_ceil(pk), n.div_ceil(pn));
                let straight = cost::matmul_amp_cycles(cfg, bm, bk, bn, dtype);
                let transposed = cost::matmul_amp_cycles(cfg, bn, bk, bm, dtype);
                let swapped = transposed < straight;
                let compute = straight.min(transposed) + cost::compute_set_overhead_cycles();
                // A weight laid out by the plan is spread over the tiles of its column of the
                // grid (each holds 1/pm of the block): each receives the rest.
                let received = bm * bk * s
                    + if b_resident {
                        bk * bn * s * (pm - 1) / pm
                    } else {
                        bk * bn * s
                    };
                // Operands, received copies and the output block must leave room on the tile
                // for everything else: plans using more than half its SRAM are a last resort.
                let block_bytes = bm * bk * s + bk * bn * s + bm * bn * if pk > 1 { 4 } else { s };
                let too_big = block_bytes > cfg.sram_bytes_per_tile / 2;
                let mut total = compute + cost::exchange_cycles(cfg, received, false) + sync;
                // The partials' reduction, stage by stage as poplin plans it: a stage summing
                // f blocks spreads each result over the f x (tiles so far) tiles holding them.
                let mut spread = 1;
                let factors = cost::reduce_stage_factors(pk);
                for (s, &f) in factors.iter().enumerate() {
                    let holders = if s + 1 == factors.len() {
                        pk
                    } else {
                        (spread * f).min(pk)
                    };
                    let share = (bm * bn).div_ceil(holders);
                    let out = if s + 1 == factors.len() {
                        dtype
                    } else {
                        DType::F32
                    };
                    total += cost::exchange_cycles(cfg, share * (f - 1) * 4, false)
                        + cost::partials_reduce_cycles(cfg, share, f, out)
                        + cost::compute_set_overhead_cycles()
                        + sync;
                    spread *= f;
                }
                let plan = MatMulPlan {
                    pm,
                    pk,
                    pn,
                    bm,
                    bk,
                    bn,
                    planned_cycles: total,
                    swapped,
                };
                let key = (too_big, total, plan.tiles());
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, plan));
                }
            }
        }
    }
    // `splits` always offers 1, so there is always a plan.
    best.map(|(_, p)| p).unwrap_or(MatMulPlan {
        pm: 1,
        pk: 1,
        pn: 1,
        bm: m,
        bk: k,
        bn: n,
        planned_cycles: u64::MAX,
        swapped: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Preset;

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

    #[test]
    fn plans_fit_the_tiles_and_use_many_of_them() {
        let cfg = IpuConfig::preset(Preset::Mk2);
        let p = plan_matmul(&cfg, 32, 784, 256, DType::F32, true, 1472);
        assert!(p.tiles() <= 1472);
        assert!(p.tiles() >= 64, "{p:?}");
        let big = plan_matmul(&cfg, 2048, 2048, 2048, DType::F16, false, 1472);
        assert!(big.tiles() > 1000, "{big:?}");
    }
}
