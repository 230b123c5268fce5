//! The IPU-POD network: replicas beyond one IPU-Link domain all-reduce hierarchically, their
//! share crossing the machines' gateways, and the estimate names the system the run needs.

use tessera::core::schedule::Schedule;
use tessera::core::{Activation, DType, Graph, Optimizer, Plan};
use tessera::sim::pod::{PodFamily, PodNetwork};
use tessera::sim::system::{estimate_system, SystemEstimate, SystemOptions};
use tessera::sim::{Heap, IpuConfig, Preset};

/// Gradient bytes of the classifier below: fp16 1024 x 1024 and 1024 x 10 kernels, and biases.
const GRADIENT_BYTES: f64 = ((1024 * 1024 + 1024 + 1024 * 10 + 10) * 2) as f64;

/// Training a 1024 -> 1024 -> 10 fp16 classifier with momentum over `replicas` replicas of one
/// IPU of `cfg`.
fn estimate(cfg: &IpuConfig, replicas: usize) -> SystemEstimate {
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[8, 1024], DType::F16).unwrap();
    let labels = g.input("labels", &[8], DType::I32).unwrap();
    let h = g
        .dense("d1", x, 1024, Activation::Relu, DType::F16)
        .unwrap();
    let h = g
        .dense("d2", h, 10, Activation::Linear, DType::F16)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", h, labels, true)
        .unwrap();
    g.differentiate(loss, Optimizer::momentum(0.01, 0.9))
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let opts = SystemOptions {
        micro_batch: 8,
        replicas,
        schedule: Schedule::Sequential,
        allow_out_of_memory: true,
        ..SystemOptions::default()
    };
    estimate_system(&plan, cfg, &opts).unwrap()
}

/// The same IPU without a pod network: every replica on one ring of IPU-Links.
fn without_pod(cfg: &IpuConfig) -> IpuConfig {
    IpuConfig {
        pod: None,
        ..cfg.clone()
    }
}

#[test]
fn one_domain_is_one_ring_of_ipu_links() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    for replicas in [2, 16, 64] {
        let e = estimate(&mk2, replicas);
        assert_eq!(e.ipu_link_domains, 1);
        assert_eq!(
            e.all_reduce_cycles,
            estimate(&without_pod(&mk2), replicas).all_reduce_cycles
        );
    }
    assert_eq!(estimate(&mk2, 16).system.as_deref(), Some("IPU-POD16"));
    assert_eq!(estimate(&mk2, 64).system.as_deref(), Some("IPU-POD64"));
    assert_eq!(estimate(&without_pod(&mk2), 64).system, None);
}

#[test]
fn a_collective_over_two_pod64s_costs_the_gateway_hop() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let e = estimate(&mk2, 128);
    assert_eq!(e.system.as_deref(), Some("IPU-POD128"));
    assert_eq!(e.ipu_link_domains, 2);
    // Reduce-scatter and all-gather on each POD64's ring of 64 replicas, and between them
    // the 1/64 shard of the 4 IPUs of each IPU-M2000 over its two 100 Gbps GW-Links (half
    // the bytes each way on a ring of two domains), with a hop of 1 us for each of its two
    // steps; each of the 2 x 63 + 2 steps ends in a sync of all 128 IPUs: the Sync-Link's
    // over a POD64, and one gateway hop there and back.
    let pod = PodNetwork::machines(PodFamily::IpuPod);
    let ring = 2.0 * 63.0 / 64.0 * GRADIENT_BYTES / mk2.neighbour_link_bytes_per_cycle();
    let gateway =
        (4.0 * GRADIENT_BYTES / 64.0 / (2.0 * 12.5e9) + 2.0 * pod.gw_hop_ns / 1e9) * mk2.clock_hz;
    let gateway_sync = (2.0 * pod.gw_hop_ns / 1e9 * mk2.clock_hz).ceil() as u64;
    let sync = mk2.sync_cycles + mk2.inter_ipu_sync_cycles(64) + gateway_sync;
    let want = (ring + gateway).ceil() as u64 + 128 * sync;
    assert!(
        e.all_reduce_cycles.abs_diff(want) <= 1,
        "{} vs {want}",
        e.all_reduce_cycles
    );
    // Without the gateways the same 128 replicas would share one ring of IPU-Links.
    let flat = estimate(&without_pod(&mk2), 128).all_reduce_cycles;
    assert!(
        e.all_reduce_cycles > flat,
        "{} vs {flat}",
        e.all_reduce_cycles
    );
}

#[test]
fn slower_gw_links_and_more_domains_cost_more() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let mut slow = mk2.clone();
    if let Some(pod) = slow.pod.as_mut() {
        pod.gw_link_bytes_per_second_per_direction /= 4.0;
    }
    let (two, slow_two) = (estimate(&mk2, 128), estimate(&slow, 128));
    assert!(slow_two.all_reduce_cycles > two.all_reduce_cycles);
    // Within one domain the GW-Links carry nothing.
    assert_eq!(
        estimate(&slow, 64).all_reduce_cycles,
        estimate(&mk2, 64).all_reduce_cycles
    );
    let four = estimate(&mk2, 256);
    assert_eq!(four.ipu_link_domains, 4);
    assert!(four.all_reduce_cycles > two.all_reduce_cycles);
}

#[test]
fn bow_pods_name_themselves() {
    let bow = IpuConfig::preset(Preset::Bow);
    let e = estimate(&bow, 1024);
    assert_eq!(e.system.as_deref(), Some("Bow Pod1024"));
    assert_eq!(e.ipu_link_domains, 16);
    // A C600 is a PCIe card: no gateway, no pod.
    let c600 = estimate(&IpuConfig::preset(Preset::C600), 8);
    assert_eq!((c600.system, c600.ipu_link_domains), (None, 1));
}

#[test]
fn a_machine_file_without_a_pod_reads_as_none() {
    let mut value = serde_json::to_value(IpuConfig::preset(Preset::Mk2)).unwrap();
    value.as_object_mut().unwrap().remove("pod");
    let cfg: IpuConfig = serde_json::from_value(value).unwrap();
    assert_eq!(cfg.pod, None);
    let mut bad = IpuConfig::preset(Preset::Mk2);
    bad.pod.as_mut().unwrap().ild_ipus = 0;
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("pod.ild_ipus"));
}
