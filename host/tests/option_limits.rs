//! Any value of any numeric option of `train`, `estimate` and `sweep` (0, 1, 2^32 - 1,
//! 2^63, 2^64 - 1, small counts and random 64-bit values) gives a result or a one-line error
//! naming it: never a panic, an abort or a runaway. Each command runs under a 1 GiB ceiling
//! on its address space (`prlimit --as`, so an allocation beyond it aborts and fails the
//! test) and must end before a runaway guard of 60 seconds.

use std::path::Path;

use proptest::prelude::*;

use crate::common;
use common::run_capped;

const BERT_TINY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/onnx/bert_tiny.stripped.onnx"
);

/// `train`'s numeric options.
const TRAIN: &[&str] = &[
    "--batch-size",
    "--gradient-accumulation-count",
    "--repeat-count",
    "--steps-per-execution",
    "--replicas",
    "--epochs",
    "--seed",
    "--prefetch-depth",
    "--buffer-depth",
    "--embedding-serialization",
    "--learning-rate",
    "--available-memory-proportion",
];

/// `estimate`'s numeric options (the last two of an ONNX model's).
const ESTIMATE: &[&str] = &[
    "--batch-size",
    "--gradient-accumulation-count",
    "--repeat-count",
    "--steps-per-execution",
    "--replicas",
    "--embedding-serialization",
    "--learning-rate",
    "--available-memory-proportion",
    "--device-mapping",
    "--pipeline-ipus",
    "--mask-tokens",
];

/// `sweep`'s numeric options.
const SWEEP: &[&str] = &["--jobs", "--shard", "--array-size"];

fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::from(u32::MAX)),
        Just(1u64 << 63),
        Just(u64::MAX),
        1u64..=8,
        any::<u64>(),
    ]
}

/// A result (exit 0), or one error line (then only `caused by:` lines), exit 1.
fn acceptable(args: &[String], dir: &Path) -> Result<(), String> {
    let (code, err) = run_capped(args, dir)?;
    let shown = format!("tessera {}: {err}", args.join(" "));
    match code {
        Some(0) => Ok(()),
        Some(1) => {
            let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
            let one = lines.first().is_some_and(|l| l.starts_with("error: "))
                && lines[1..].iter().all(|l| l.starts_with("caused by: "))
                && !err.contains("panicked");
            if one {
                Ok(())
            } else {
                Err(format!("not a one-line error: {shown}"))
            }
        }
        other => Err(format!("exit {other:?} (a crash or an abort): {shown}")),
    }
}

fn spec(dir: &Path) -> String {
    let path = dir.join("tiny.toml");
    std::fs::write(
        &path,
        "[base]\nmodel = \"sequential\"\n[grid]\nbatch_size = [8, 16]\n",
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_numeric_option_value_gives_a_result_or_one_line(
        command in 0usize..3,
        pick in any::<prop::sample::Index>(),
        v in value(),
        w in value(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let args: Vec<String> = match command {
            0 => {
                let option = TRAIN[pick.index(TRAIN.len())];
                let mut a = vec!["train".to_string(), option.into(), v.to_string()];
                // One pass, unless the option is the number of passes.
                if option != "--epochs" {
                    a.extend(["--epochs".into(), "1".into()]);
                }
                a
            }
            1 => {
                let option = ESTIMATE[pick.index(ESTIMATE.len())];
                let value = if option == "--device-mapping" {
                    format!("0,{v}")
                } else {
                    v.to_string()
                };
                let mut a = vec!["estimate".to_string()];
                if matches!(option, "--pipeline-ipus" | "--mask-tokens") {
                    a.push(BERT_TINY.into());
                }
                a.extend([option.to_string(), value, "--json".into()]);
                a
            }
            _ => {
                let spec = spec(dir.path());
                match SWEEP[pick.index(SWEEP.len())] {
                    "--jobs" => vec!["sweep".into(), spec, "--jobs".into(), v.to_string()],
                    "--shard" => vec!["sweep".into(), spec, "--shard".into(), format!("{v}/{w}")],
                    _ => vec![
                        "sweep".into(),
                        "submit".into(),
                        "--slurm".into(),
                        spec,
                        "--dry-run".into(),
                        "--array-size".into(),
                        v.to_string(),
                    ],
                }
            }
        };
        if let Err(e) = acceptable(&args, dir.path()) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// One-sample batches make an epoch of as many steps as samples, and what the outfeeds deliver
/// at its report is held until then: beyond what the host can allocate, a one-line error
/// naming the queue and what to change, not an abort.
#[test]
fn an_outfeed_the_host_cannot_hold_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = ["train", "--batch-size", "1", "--epochs", "1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    acceptable(&args, dir.path()).unwrap();
}
