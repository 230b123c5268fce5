//! Collectives over replicas: the all-reduce of the gradients once per weight update, and the
//! small all-reduces of distributed batch norm in every batch norm.
//!
//! Both run as GCL runs a collective (its syncful implementation, the default; the syncless
//! one was removed in SDK 3.1, GCL release notes): a ring of cross-replica exchanges, one step
//! after another, each step a sync of the whole partition (every IPU of every replica; the
//! PopART user guide's "Sync configuration": the IPUs fall in at most two sync groups). A
//! ring of `q` replicas takes `q - 1` steps to reduce-scatter and `q - 1` to all-gather. Within
//! one IPU-Link domain the sync is the Sync-Link's ([`IpuConfig::inter_ipu_sync_cycles`]);
//! across domains it also crosses the gateways, there and back, over as many hops as the
//! farthest domain is away on their ring ([`crate::pod`]).

use crate::machine::IpuConfig;

/// Cycles of the sync that ends each step of a collective over a partition of `ipus` IPUs:
/// the on-chip sync, the Sync-Link's cross-IPU part over the IPUs of one IPU-Link domain, and
/// beyond one domain the gateways' hops there and back.
pub fn step_sync_cycles(cfg: &IpuConfig, ipus: usize) -> u64 {
    let domain = cfg
        .pod
        .as_ref()
        .map_or(ipus, |p| ipus.min(p.ild_ipus as usize));
    cfg.sync_cycles
        .saturating_add(cfg.inter_ipu_sync_cycles(domain))
        .saturating_add(gateway_sync_cycles(cfg, ipus))
}

/// Cycles a sync over `ipus` IPUs spends crossing gateways: none within one IPU-Link domain;
/// beyond, `2 x floor(n / 2)` hops of [`crate::pod::PodNetwork::gw_hop_ns`] for `n` domains
/// on a ring (there and back to the farthest).
pub fn gateway_sync_cycles(cfg: &IpuConfig, ipus: usize) -> u64 {
    let Some(pod) = &cfg.pod else { return 0 };
    let domains = pod.domains(ipus);
    if domains <= 1 {
        return 0;
    }
    let hops = 2 * (domains / 2) as u64;
    // `as` saturates, so an absurd machine cannot panic here.
    (hops as f64 * pod.gw_hop_ns * cfg.clock_hz / 1e9).ceil() as u64
}

/// Cycles of the all-reduce of `bytes` held by each of `replicas` replicas on `ipus` IPUs in
/// all, each step ending in a [`step_sync_cycles`]. Within one IPU-Link domain (or on a
/// machine without a pod network) it is one ring over the neighbour links: `2 (r - 1) / r` of
/// the bytes each way in `2 (r - 1)` steps. Across `n` domains it is hierarchical, as GCL runs
/// it ([`crate::pod`]): a reduce-scatter and an all-gather on the ring of each domain's `q`
/// replicas, `2 (q - 1) / q` of the bytes in `2 (q - 1)` steps, and between them the
/// all-reduce of each IPU's `1 / q` shard across the domains' gateways in `2 (n - 1)` steps.
pub fn all_reduce_cycles(cfg: &IpuConfig, bytes: u64, replicas: usize, ipus: usize) -> u64 {
    let domains = cfg.pod.as_ref().map_or(1, |p| p.domains(ipus));
    let pod = match &cfg.pod {
        Some(pod) if domains > 1 && replicas > 1 => pod,
        // One ring of all the replicas.
        _ => return group_all_reduce_cycles(cfg, bytes, replicas, ipus),
    };
    let q = replicas.div_ceil(domains).max(1);
    let cross = pod.cross_domain_seconds(bytes as f64 / q as f64, domains) * cfg.clock_hz;
    let steps = 2 * (q - 1) + 2 * (domains - 1);
    // `as` saturates, so an absurd machine cannot panic here.
    ((ring_cycles(cfg, bytes, q) + cross).ceil() as u64)
        .saturating_add((steps as u64).saturating_mul(step_sync_cycles(cfg, ipus)))
}

/// Cycles a ring of `q` replicas spends moving `2 (q - 1) / q` of `bytes` each way over the
/// neighbour links (before rounding).
fn ring_cycles(cfg: &IpuConfig, bytes: u64, q: usize) -> f64 {
    let q = q as f64;
    2.0 * (q - 1.0) / q * bytes as f64 / cfg.neighbour_link_bytes_per_cycle()
}

/// Cycles of an all-reduce of `bytes` within groups of `group` consecutive replicas (GCL's
/// `CommGroupType::CONSECUTIVE`, as distributed batch norm reduces its statistics), on a
/// partition of `ipus` IPUs: a ring of the group over the neighbour links, `2 (g - 1) / g` of
/// the bytes in `2 (g - 1)` steps, each step a sync of the partition. Zero for a group of one.
pub fn group_all_reduce_cycles(cfg: &IpuConfig, bytes: u64, group: usize, ipus: usize) -> u64 {
    let (moving, sync) = group_all_reduce_parts(cfg, bytes, group, ipus);
    moving.saturating_add(sync)
}

/// [`group_all_reduce_cycles`] in its two parts: the cycles moving the bytes over the links,
/// and those of the steps' syncs.
pub fn group_all_reduce_parts(
    cfg: &IpuConfig,
    bytes: u64,
    group: usize,
    ipus: usize,
) -> (u64, u64) {
    if group <= 1 {
        return (0, 0);
    }
    let steps = 2 * (group as u64 - 1);
    // `as` saturates, so an absurd machine cannot panic here.
    (
        ring_cycles(cfg, bytes, group).ceil() as u64,
        steps.saturating_mul(step_sync_cycles(cfg, ipus)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Preset;
    use proptest::prelude::*;

    #[test]
    fn a_sync_across_two_domains_pays_one_gateway_hop_each_way() {
        let mk2 = IpuConfig::preset(Preset::Mk2);
        assert_eq!(gateway_sync_cycles(&mk2, 64), 0);
        // 2 hops of 1 us at 1.325 GHz.
        assert_eq!(gateway_sync_cycles(&mk2, 128), 2650);
        // The farthest of 4 domains on a ring is 2 hops away.
        assert_eq!(gateway_sync_cycles(&mk2, 256), 5300);
        let within = step_sync_cycles(&mk2, 64);
        assert_eq!(within, mk2.sync_cycles + mk2.inter_ipu_sync_cycles(64));
        assert_eq!(step_sync_cycles(&mk2, 128), within + 2650);
        // A PCIe card has no gateway.
        let c600 = IpuConfig::preset(Preset::C600);
        assert_eq!(gateway_sync_cycles(&c600, 1024), 0);
    }

    #[test]
    fn a_ring_of_r_replicas_takes_2_r_minus_1_synced_steps() {
        let mk2 = IpuConfig::preset(Preset::Mk2);
        let bytes = 1_000_000;
        let moving =
            (2.0 * 15.0 / 16.0 * bytes as f64 / mk2.neighbour_link_bytes_per_cycle()).ceil() as u64;
        assert_eq!(
            all_reduce_cycles(&mk2, bytes, 16, 16),
            moving + 30 * step_sync_cycles(&mk2, 16)
        );
        assert_eq!(all_reduce_cycles(&mk2, bytes, 1, 1), 0);
        // A pair of replicas: one step each way.
        let pair = group_all_reduce_cycles(&mk2, 64, 2, 16);
        assert_eq!(
            pair,
            (64.0 / mk2.neighbour_link_bytes_per_cycle()).ceil() as u64
                + 2 * step_sync_cycles(&mk2, 16)
        );
        assert_eq!(group_all_reduce_cycles(&mk2, 64, 1, 16), 0);
    }

    proptest! {
        /// A collective over more IPUs, or of more bytes, never costs less.
        #[test]
        fn collectives_grow_with_ipus_and_bytes(
            bytes in 0u64..100_000_000, more in 0u64..100_000_000,
            log_r in 1u32..10, group in 1usize..8, bow in any::<bool>(),
        ) {
            let cfg = IpuConfig::preset(if bow { Preset::Bow } else { Preset::Mk2 });
            let r = 1usize << log_r;
            prop_assert!(all_reduce_cycles(&cfg, bytes + more, r, r) >= all_reduce_cycles(&cfg, bytes, r, r));
            prop_assert!(step_sync_cycles(&cfg, 2 * r) >= step_sync_cycles(&cfg, r));
            prop_assert!(
                group_all_reduce_cycles(&cfg, bytes, group, 2 * r)
                    >= group_all_reduce_cycles(&cfg, bytes, group, r)
            );
        }
    }
}
