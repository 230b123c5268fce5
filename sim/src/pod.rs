//! The IPU-POD network beyond one IPU-Link domain: IPU-Machines, their gateways and GW-Links,
//! and the hierarchical collectives that run over them.
//!
//! An IPU-POD is built from IPU-Machines (IPU-M2000 or Bow-2000) of four IPUs each. Within an
//! IPU-Link domain (ILD, one POD64 rack) the IPUs talk over IPU-Links. Between domains the
//! only path is the IPU-Gateway of each machine and its two GW-Links: a POD128 cross-connects
//! the machines of its two racks, larger pods ring the racks or switch the GW-Links (Graphcore's
//! IPU-POD128 datasheet; "Switched GW-Links in large scale Pod systems").
//!
//! A collective over replicas that span several domains runs in three phases, as GCL runs it
//! (its "three-phase collective operations" for groups spanning several ILDs, SDK 3.0 release
//! notes; poplibs ran one ring per ILD in parallel, `lib/popops/ReplicatedCollectives.cpp`):
//! a reduce-scatter within each domain on the IPU-Links, an all-reduce of each IPU's shard
//! across the domains over the GW-Links, and an all-gather within each domain.

use serde::{Deserialize, Serialize};

/// The product line a pod belongs to, which names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PodFamily {
    /// IPU-M2000 machines in IPU-POD16, 64, 128 and 256 systems (Mk2 IPUs).
    IpuPod,
    /// Bow-2000 machines in Bow Pod16, 64, 128, 256 and 1024 systems (Bow IPUs).
    BowPod,
}

impl PodFamily {
    /// The IPU counts of the family's pods, smallest first (Graphcore's IPU-POD and Bow Pod
    /// datasheets).
    pub const fn sizes(self) -> &'static [usize] {
        match self {
            PodFamily::IpuPod => &[16, 64, 128, 256],
            PodFamily::BowPod => &[16, 64, 128, 256, 1024],
        }
    }

    /// The name of one machine of the family.
    pub const fn machine(self) -> &'static str {
        match self {
            PodFamily::IpuPod => "IPU-M2000",
            PodFamily::BowPod => "Bow-2000",
        }
    }

    /// The prefix of the family's pod names ("IPU-POD" in "IPU-POD128").
    pub const fn prefix(self) -> &'static str {
        match self {
            PodFamily::IpuPod => "IPU-POD",
            PodFamily::BowPod => "Bow Pod",
        }
    }
}

/// The network of an IPU-POD: how many IPUs share IPU-Links, and the gateways between them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodNetwork {
    /// The product line, which names the system a run needs.
    pub family: PodFamily,
    /// IPUs in one IPU-Link domain: the IPUs a collective reaches over IPU-Links alone.
    pub ild_ipus: u32,
    /// IPUs in one IPU-Machine, which share its gateway.
    pub ipus_per_machine: u32,
    /// GW-Links per IPU-Machine.
    pub gw_links_per_machine: u32,
    /// Bandwidth of one GW-Link in one direction, bytes per second.
    pub gw_link_bytes_per_second_per_direction: f64,
    /// Latency of one hop between domains (IPU to gateway, over a GW-Link, gateway to IPU),
    /// nanoseconds.
    pub gw_hop_ns: f64,
}

impl PodNetwork {
    /// The network of IPU-M2000 and Bow-2000 machines (the two share their gateway and links).
    pub fn machines(family: PodFamily) -> PodNetwork {
        PodNetwork {
            family,
            // popxl-addons `named_replica_grouping.py` groups at most `min(replicas, 64)`
            // replicas by IPU-Links; Graphcore's MLPerf v2.0 BERT runs a POD128 as 2 ILDs and a
            // POD256 as 4 (`NUM_ILDS`): one POD64 rack is one domain.
            ild_ipus: 64,
            // vendor: 4 IPUs per IPU-M2000 and per Bow-2000 (datasheets).
            ipus_per_machine: 4,
            // vendor: "GW-Link - 2x 100Gbps Gateway-Links for communication between Bow Pods"
            // (Bow-2000 datasheet; the IPU-M2000 has the same two).
            gw_links_per_machine: 2,
            // arithmetic: 100 Gbps = 12.5 GB/s each way.
            gw_link_bytes_per_second_per_direction: 12.5e9,
            // estimate: no published figure; one hop through two gateways and a 100 Gb
            // Ethernet-class link taken as a microsecond.
            gw_hop_ns: 1000.0,
        }
    }

    /// Checks that every count is at least 1 and every figure positive and finite, naming the
    /// field at fault.
    pub fn validate(&self) -> Result<(), crate::MachineError> {
        use crate::MachineError;
        for (field, value) in [
            ("pod.ild_ipus", self.ild_ipus),
            ("pod.ipus_per_machine", self.ipus_per_machine),
            ("pod.gw_links_per_machine", self.gw_links_per_machine),
        ] {
            if value == 0 {
                return Err(MachineError::Zero { field });
            }
        }
        for (field, value) in [
            (
                "pod.gw_link_bytes_per_second_per_direction",
                self.gw_link_bytes_per_second_per_direction,
            ),
            ("pod.gw_hop_ns", self.gw_hop_ns),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(MachineError::NotPositiveFinite { field, value });
            }
        }
        Ok(())
    }

    /// IPU-Link domains that `ipus` IPUs span.
    pub fn domains(&self, ipus: usize) -> usize {
        ipus.div_ceil(self.ild_ipus as usize).max(1)
    }

    /// The system `ipus` IPUs need: one machine, the smallest pod of the family that holds
    /// them, or, beyond the largest, that many IPUs named as the family names its pods.
    pub fn system_name(&self, ipus: usize) -> String {
        let f = self.family;
        if ipus <= self.ipus_per_machine as usize {
            return f.machine().to_string();
        }
        match f.sizes().iter().find(|&&s| s >= ipus) {
            Some(s) => format!("{}{s}", f.prefix()),
            None => {
                let ild = self.ild_ipus as usize;
                format!("{}{}", f.prefix(), self.domains(ipus) * ild)
            }
        }
    }

    /// Seconds of the phase across domains of an all-reduce whose IPUs each hold
    /// `shard_bytes` after the reduce-scatter within their domain: a ring over `domains`
    /// domains, each machine sending its IPUs' shards over its GW-Links, `2 (n - 1) / n` of the
    /// bytes each way, with a hop of latency for each of the ring's `2 (n - 1)` steps (the
    /// steps' syncs are [`crate::collective::step_sync_cycles`]). Zero within one domain.
    pub fn cross_domain_seconds(&self, shard_bytes: f64, domains: usize) -> f64 {
        if domains <= 1 {
            return 0.0;
        }
        let n = domains as f64;
        let machine_bytes = shard_bytes * f64::from(self.ipus_per_machine);
        let bandwidth =
            f64::from(self.gw_links_per_machine) * self.gw_link_bytes_per_second_per_direction;
        2.0 * (n - 1.0) / n * machine_bytes / bandwidth + 2.0 * (n - 1.0) * self.gw_hop_ns / 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_the_smallest_pod_that_holds_the_ipus() {
        let m = PodNetwork::machines(PodFamily::IpuPod);
        assert_eq!(m.system_name(1), "IPU-M2000");
        assert_eq!(m.system_name(4), "IPU-M2000");
        assert_eq!(m.system_name(16), "IPU-POD16");
        assert_eq!(m.system_name(17), "IPU-POD64");
        assert_eq!(m.system_name(128), "IPU-POD128");
        assert_eq!(m.system_name(256), "IPU-POD256");
        assert_eq!(m.system_name(300), "IPU-POD320");
        let b = PodNetwork::machines(PodFamily::BowPod);
        assert_eq!(b.system_name(2), "Bow-2000");
        assert_eq!(b.system_name(512), "Bow Pod1024");
        assert_eq!(b.system_name(1024), "Bow Pod1024");
    }

    #[test]
    fn counts_domains_of_64() {
        let m = PodNetwork::machines(PodFamily::IpuPod);
        assert_eq!(m.domains(1), 1);
        assert_eq!(m.domains(64), 1);
        assert_eq!(m.domains(65), 2);
        assert_eq!(m.domains(256), 4);
    }

    #[test]
    fn two_domains_pay_the_gateway_once_each_way() {
        let m = PodNetwork::machines(PodFamily::IpuPod);
        assert_eq!(m.cross_domain_seconds(1e6, 1), 0.0);
        // 4 IPUs' shards of 1 MB over 2 x 12.5 GB/s, plus a hop of 1 us for each of the two
        // ring steps.
        let want = 4e6 / 25e9 + 2e-6;
        assert!((m.cross_domain_seconds(1e6, 2) - want).abs() < 1e-12);
    }

    #[test]
    fn validate_names_the_field() {
        let mut m = PodNetwork::machines(PodFamily::BowPod);
        m.validate().unwrap();
        m.gw_links_per_machine = 0;
        let e = m.validate().unwrap_err().to_string();
        assert!(e.contains("pod.gw_links_per_machine"), "{e}");
        let mut m = PodNetwork::machines(PodFamily::BowPod);
        m.gw_hop_ns = f64::NAN;
        assert!(m
            .validate()
            .unwrap_err()
            .to_string()
            .contains("pod.gw_hop_ns"));
    }

    proptest! {
        /// More domains never make the cross-domain phase cheaper, nor do more bytes.
        #[test]
        fn cross_domain_cost_grows_with_domains_and_bytes(
            bytes in 0.0f64..1e9, more in 0.0f64..1e9, n in 1usize..64, k in 0usize..64,
        ) {
            let m = PodNetwork::machines(PodFamily::IpuPod);
            let base = m.cross_domain_seconds(bytes, n);
            prop_assert!(m.cross_domain_seconds(bytes, n + k) >= base);
            prop_assert!(m.cross_domain_seconds(bytes + more, n) >= base);
        }

        /// The named system always holds the IPUs.
        #[test]
        fn the_named_system_holds_the_ipus(ipus in 1usize..5000, bow in any::<bool>()) {
            let f = if bow { PodFamily::BowPod } else { PodFamily::IpuPod };
            let m = PodNetwork::machines(f);
            let name = m.system_name(ipus);
            let held: usize = name
                .trim_start_matches(f.prefix())
                .parse()
                .unwrap_or(m.ipus_per_machine as usize);
            prop_assert!(held >= ipus, "{} for {} IPUs", name, ipus);
        }
    }
}
