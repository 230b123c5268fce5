//! Named systems (`--system`): the IPU generation and count set, the replicas filling the
//! system, each on the pipeline IPUs given or on the fewest whose automatic split fits; and
//! the throughput at steady state beside the run's.

use tessera_host::estimation::{estimate, EstimateOptions, ModelSource, System};
use tessera_host::names::Named;

fn on(model: &str, system: &str, more: EstimateOptions) -> tessera_host::estimation::Estimation {
    let o = EstimateOptions {
        system: Some(System::from_name(system, false).unwrap()),
        ..more
    };
    estimate(&ModelSource::from_arg(model), &o).unwrap()
}

#[test]
fn replicas_fill_the_system_on_the_fewest_ipus_that_fit() {
    let root = env!("CARGO_MANIFEST_DIR");
    let bert = format!("{root}/../data/onnx/bert_tiny.stripped.onnx");
    // BERT-Tiny fits on one IPU: 16 replicas of it.
    let e = on(&bert, "bow-pod16", EstimateOptions::default());
    let s = &e.summary;
    assert!(s.fits);
    assert_eq!((s.replicas, s.ipus_total, s.ipus.len()), (16, 16, 1));
    assert_eq!(s.system.as_deref(), Some("Bow Pod16"));
    assert_eq!(s.ipu, "bow");
    // A model file's two-IPU pipeline: 8 replicas of it.
    let e = on("pipelined_sequential", "pod16", EstimateOptions::default());
    assert_eq!((e.summary.replicas, e.summary.ipus_total), (8, 16));
    assert_eq!(e.summary.system.as_deref(), Some("IPU-POD16"));
    // Replicas given: each takes the system's IPUs over them, split automatically.
    let e = on(
        &bert,
        "pod16",
        EstimateOptions {
            replicas: Some(4),
            ..EstimateOptions::default()
        },
    );
    assert_eq!((e.summary.replicas, e.summary.ipus.len()), (4, 4));
}

#[test]
fn a_placement_that_does_not_fit_the_system_is_refused() {
    let root = env!("CARGO_MANIFEST_DIR");
    let bert = format!("{root}/../data/onnx/bert_tiny.stripped.onnx");
    let o = |replicas, pipeline_ipus| EstimateOptions {
        system: Some(System::from_name("ipu-m2000", false).unwrap()),
        replicas: Some(replicas),
        pipeline_ipus,
        ..EstimateOptions::default()
    };
    let err = |o: EstimateOptions| {
        estimate(&ModelSource::from_arg(&bert), &o)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(
        err(o(3, None)).contains("3 replica(s) do not divide the 4 IPUs of system `ipu-m2000`"),
        "{}",
        err(o(3, None))
    );
    let e = err(o(2, Some(4)));
    assert!(
        e.contains("system `ipu-m2000` has 4 IPUs: 2 replica(s) of this placement take 8"),
        "{e}"
    );
    // The IPU generation is the system's; another given with it is refused.
    let e = err(EstimateOptions {
        ipu: tessera_sim::machine::Preset::Bow,
        ..o(1, None)
    });
    assert!(
        e.contains("ipu: `bow` is not the IPU of system `ipu-m2000` (mk2)"),
        "{e}"
    );
}

#[test]
fn throughput_at_steady_state_is_the_run_s_without_its_ramp_and_update() {
    let e = estimate(
        &ModelSource::from_arg("pipelined_sequential"),
        &EstimateOptions::default(),
    )
    .unwrap();
    let s = &e.summary;
    let m = s.gradient_accumulation_count as f64;
    // M micro-batches at steady state and the ramp make the pipeline's cycles.
    let steady = e.estimate.steady_cycles_per_micro_batch;
    assert_eq!(
        (s.pipeline_cycles as f64 - m * steady).round() as u64,
        s.ramp_cycles
    );
    assert!(s.ramp_cycles > 0);
    // The samples of a micro-batch over all replicas, at the clock, every `steady` cycles.
    let clock = s.cycles_per_weight_update as f64 / s.seconds_per_weight_update;
    let per_micro_batch = s.samples_per_second * s.seconds_per_weight_update / m;
    let expected = per_micro_batch * clock / steady;
    assert!((s.steady_samples_per_second - expected).abs() <= 1e-9 * expected);
    assert!(s.steady_samples_per_second > s.samples_per_second);
    let text = e.to_text(false);
    let line = text
        .lines()
        .find(|l| l.starts_with("steady state: "))
        .unwrap();
    assert!(
        line.contains("samples/s as M grows (at M = 4, the pipeline's fill and drain"),
        "{line}"
    );
}
