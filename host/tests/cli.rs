//! The `tessera` command end to end: help on every subcommand, estimates of every shipped
//! model, JSON outputs, reports, and bad inputs that must give one clear line and a non-zero
//! exit status, never a panic.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flate2::read::GzDecoder;
use tessera_host::model::SHIPPED;

const BUNDLED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mnist-binarized-10k");

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the tessera binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failure as users must see it: non-zero status, `error: ...` on stderr containing every
/// one of `needles`, then only `caused by: ...` lines; no panic, no backtrace.
fn assert_clean_failure(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, stderr: {err}");
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(
        lines[1..].iter().all(|l| l.starts_with("caused by: ")),
        "{err}"
    );
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

/// A bad option: exactly one line on stderr, nothing on stdout.
fn assert_bad_option(o: &Output, needles: &[&str]) {
    assert_clean_failure(o, needles);
    assert_eq!(stderr(o).lines().count(), 1, "{}", stderr(o));
    assert_eq!(stdout(o), "", "nothing on stdout for a bad option");
}

fn last_json(o: &Output) -> serde_json::Value {
    let out = stdout(o);
    let line = out.lines().last().expect("stdout has a line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

/// A copy of the bundled data, decompressed, in a fresh directory.
fn data_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ] {
        let mut bytes = Vec::new();
        GzDecoder::new(std::fs::File::open(Path::new(BUNDLED).join(format!("{f}.gz"))).unwrap())
            .read_to_end(&mut bytes)
            .unwrap();
        std::fs::write(dir.path().join(f), bytes).unwrap();
    }
    dir
}

/// The bundled digits with the test split cut to its first `samples` (raw IDX files).
fn data_with_test_split(samples: u32) -> tempfile::TempDir {
    let dir = data_copy();
    for (f, header, item) in [
        ("t10k-images-idx3-ubyte", 16, 28 * 28),
        ("t10k-labels-idx1-ubyte", 8, 1),
    ] {
        let path = dir.path().join(f);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[4..8].copy_from_slice(&samples.to_be_bytes());
        bytes.truncate(header + samples as usize * item);
        std::fs::write(&path, bytes).unwrap();
    }
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    p
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        vec!["--help"],
        vec!["train", "--help"],
        vec!["estimate", "--help"],
        vec!["estimate-op", "--help"],
        vec!["estimate-op", "matmul", "--help"],
        vec!["estimate-op", "fc", "--help"],
        vec!["estimate-op", "conv", "--help"],
        vec!["dataset-benchmark", "--help"],
        vec!["calibrate", "--help"],
        vec!["report", "--help"],
    ] {
        let o = tessera(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).contains("Usage:"), "{args:?}");
    }
    let train = stdout(&tessera(&["train", "--help"]));
    for flag in [
        "--gradient-accumulation-count",
        "--repeat-count",
        "--steps-per-execution",
        "--epochs",
        "--run-single-step",
        "--outfeed-pre-accumulated-gradients",
        "--gradients-filters",
        "--activations-filters",
        "--no-pipelining",
        "--pipeline-schedule",
        "--replicas",
        "--ipu",
        "--optimizer",
        "--offload-optimizer-state",
        "--dtype",
        "--seed",
        "--data",
        "--report-dir",
        "--checkpoint",
        "--json",
    ] {
        assert!(train.contains(flag), "train --help lacks {flag}");
    }
}

#[test]
fn estimate_every_shipped_model() {
    for (name, _) in SHIPPED {
        let o = tessera(&["estimate", name]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let out = stdout(&o);
        assert!(out.contains("fits: yes"), "{name}: {out}");
        assert!(out.contains("memory per IPU"), "{name}");
        assert!(out.contains("always_live"), "{name}");
        assert!(out.contains("cycles per step"), "{name}");
        assert!(out.contains("Pipeline Stage"), "{name}");
        let j = last_json(&tessera(&["estimate", name, "--json"]));
        assert_eq!(j["fits"], true);
        assert!(j["cycles_per_step"].as_u64().unwrap() > 0);
        let ipus = j["ipus"].as_array().unwrap();
        let expected_ipus = tessera_host::model::shipped(name).unwrap().unwrap().ipus();
        assert_eq!(ipus.len(), expected_ipus, "{name}");
        for ipu in ipus {
            assert!(ipu["bytes_used"].as_u64().unwrap() > 0);
            assert!(ipu["max_tile_bytes"].as_u64().unwrap() > 0);
            assert!(ipu["tiles_used"].as_u64().unwrap() > 0);
        }
        assert_eq!(j["stages"].as_array().unwrap().len(), expected_ipus);
    }
}

#[test]
fn oversized_batch_names_the_tile_and_fails() {
    // The images alone (300,000 x 784 x 4 bytes) exceed the first IPU's 900 MB.
    let o = tessera(&["estimate", "--batch-size", "300000"]);
    assert!(stdout(&o).contains("fits: NO"));
    assert_clean_failure(
        &o,
        &["does not fit", "out of memory: tile", "largest tensors"],
    );
    // The paragraph is printed once: on stderr, as the error.
    assert!(
        !stdout(&o).contains("out of memory: tile"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn train_json_and_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let ckpt = dir.path().join("weights.safetensors");
    let o = tessera(&[
        "train",
        "--run-single-step",
        "--json",
        "--report-dir",
        report.to_str().unwrap(),
        "--checkpoint",
        ckpt.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = last_json(&o);
    for key in [
        "test_accuracy",
        "final_loss",
        "steps",
        "cycles_per_step",
        "samples_per_second",
    ] {
        assert!(j.get(key).is_some(), "missing {key}: {j}");
    }
    assert_eq!(j["steps"], 248);
    let acc = j["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.5, "one epoch of training reaches {acc}");
    let mem = j["memory"].as_array().unwrap();
    assert_eq!(mem.len(), 2);
    for m in mem {
        for key in ["bytes_used", "max_tile_bytes", "tiles_used"] {
            assert!(m[key].as_u64().unwrap() > 0);
        }
    }
    // The checkpoint holds the six trained variables.
    let bytes = std::fs::read(&ckpt).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    assert_eq!(
        header["Dense_128/kernel:0"]["shape"],
        serde_json::json!([256, 128])
    );
    assert_eq!(header["Dense_10/bias:0"]["dtype"], "F32");
    // The report renders again from its directory.
    for f in [
        "estimate.json",
        "trace.json",
        "memory.svg",
        "timeline.svg",
        "index.html",
    ] {
        assert!(report.join(f).exists(), "{f}");
    }
    let o = tessera(&["report", report.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn train_prints_the_seeds_statistics() {
    let o = tessera(&["train", "--run-single-step"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "Layer (type)",
        "Gradients callback",
        "key: Dense_128/bias:0_grad shape: (62, 128)",
        "key: Dense_128/kernel:0_grad shape: (62, 256, 128)",
        "Multi-layer activations callback",
        "key: Dense_128_acts shape: (248, 32, 128)",
        "Epoch 1 - Summary Stats",
        "Index",
        "NaNs",
        "infs",
        "test accuracy",
    ] {
        assert!(out.contains(needle), "`{needle}` missing:\n{out}");
    }
    // No filter matches: nothing is enqueued, and the callback says so.
    let o = tessera(&[
        "train",
        "--run-single-step",
        "--gradients-filters",
        "nothing-matches",
    ]);
    let out = stdout(&o);
    assert!(
        out.contains("Gradients callback\nNo data enqueued"),
        "{out}"
    );
}

#[test]
fn estimate_op_json() {
    let o = tessera(&[
        "estimate-op",
        "matmul",
        "--m",
        "256",
        "--k",
        "256",
        "--n",
        "256",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = last_json(&o);
    for key in ["cycles", "total_memory_bytes", "max_tile_bytes"] {
        assert!(j[key].as_u64().unwrap() > 0, "{key}");
    }
    let half = j["cycles"].as_u64().unwrap();
    let float = last_json(&tessera(&[
        "estimate-op",
        "matmul",
        "--m",
        "256",
        "--k",
        "256",
        "--n",
        "256",
        "--data-type",
        "float",
        "--json",
    ]))["cycles"]
        .as_u64()
        .unwrap();
    assert!(half < float, "half {half} float {float}");
    let fc = last_json(&tessera(&[
        "estimate-op",
        "fc",
        "--batch-size",
        "32",
        "--input-size",
        "784",
        "--output-size",
        "256",
        "--json",
    ]));
    let fwd = last_json(&tessera(&[
        "estimate-op",
        "fc",
        "--batch-size",
        "32",
        "--input-size",
        "784",
        "--output-size",
        "256",
        "--inference-only",
        "--json",
    ]));
    assert!(fc["cycles"].as_u64().unwrap() > fwd["cycles"].as_u64().unwrap());
    let o = tessera(&[
        "estimate-op",
        "fc",
        "--batch-size",
        "4",
        "--input-size",
        "10",
        "--output-size",
        "8",
        "--num-groups",
        "3",
    ]);
    assert_clean_failure(&o, &["3"]);
}

/// `estimate-op conv` takes poplibs' single_conv_layer option names and shape syntax, and
/// names what is wrong with a layer.
#[test]
fn estimate_op_conv_takes_single_conv_layer_options() {
    let args = |extra: &[&str]| {
        let mut v = vec![
            "estimate-op",
            "conv",
            "--field",
            "{28,28}",
            "--kernel-size",
            "3",
            "--input-channels",
            "16",
            "--output-channels",
            "32",
            "--padding",
            "1",
            "--batch-size",
            "2",
            "--json",
        ];
        v.extend_from_slice(extra);
        tessera(&v)
    };
    let o = args(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = last_json(&o);
    for pass in ["conv forward", "conv backward", "conv weight update"] {
        let p = &j["passes"][pass];
        assert!(p["cycles"].as_u64().unwrap() > 0, "{pass}: {j}");
        // 2 x 32 x 28 x 28 outputs, 16 x 3 x 3 MACs each, 2 flops per MAC.
        assert_eq!(
            p["flops"].as_u64().unwrap(),
            2 * 2 * 32 * 28 * 28 * 16 * 9,
            "{pass}"
        );
    }
    let fwd = last_json(&args(&["--inference-only"]));
    assert_eq!(fwd["passes"].as_object().unwrap().len(), 1);
    // Stride 2 has a quarter of the outputs.
    let strided = last_json(&args(&["--stride", "2", "--inference-only"]));
    assert_eq!(
        strided["passes"]["conv forward"]["flops"].as_u64().unwrap() * 4,
        fwd["passes"]["conv forward"]["flops"].as_u64().unwrap()
    );
    // A 1-D field is a 2-D one of height 1.
    let one_d = last_json(&tessera(&[
        "estimate-op",
        "conv",
        "--field",
        "100",
        "--kernel-size",
        "5",
        "--input-channels",
        "8",
        "--output-channels",
        "8",
        "--json",
    ]));
    let flat = last_json(&tessera(&[
        "estimate-op",
        "conv",
        "--field",
        "1,100",
        "--kernel-size",
        "1,5",
        "--input-channels",
        "8",
        "--output-channels",
        "8",
        "--json",
    ]));
    assert_eq!(one_d, flat);
    let too_big = tessera(&[
        "estimate-op",
        "conv",
        "--field",
        "{7,7}",
        "--kernel-size",
        "9",
        "--input-channels",
        "4",
        "--output-channels",
        "4",
    ]);
    assert_clean_failure(&too_big, &["larger than the padded input"]);
    for (bad, named) in [
        (vec!["--conv-groups", "0"], "groups"),
        (vec!["--stride", "1,2,3"], "--stride"),
        (vec!["--bias", "maybe"], "--bias"),
    ] {
        assert_clean_failure(&args(&bad), &[named]);
    }
}

/// A small whole-model set (the bundled one takes minutes of estimates in a debug build): a
/// published-run entry of the tiny BERT, one Tessera cannot express, and a profile entry.
fn small_whole_models(dir: &Path) -> PathBuf {
    let onnx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/onnx/bert_tiny.stripped.onnx");
    let model = onnx.display().to_string().replace('\\', "/");
    let text = format!(
        "[[run]]\nname = 'tiny BERT'\nmodel = '{model}'\nsamples_per_second = 1000.0\n\
         includes_host = false\noptions = {{ batch_size = 2, dtype = 'f16', optimizer = 'lamb', \
         recompute_checkpoints = 'auto', partials_type = 'half' }}\n\
         [[run]]\nname = 'cannot run'\nmodel = '{model}'\nsamples_per_second = 1000.0\n\
         includes_host = false\noptions = {{ optimizer = 'rmsprop' }}\n\
         [[profile]]\nname = 'tiny BERT inference'\nmodel = '{model}'\nipu = 0\n\
         options = {{ inference = true, batch_size = 1 }}\nvariables = 10.0\nvertex_code = 1.0\n\
         vertex_state = 1.0\nexchange_code = 1.0\ncontrol_code = 1.0\ntotal = 14.0\n\
         fullest_tile_bytes = 100000\n"
    );
    write(dir, "whole.toml", &text)
}

#[test]
fn calibrate_prints_the_error_table() {
    let dir = tempfile::tempdir().unwrap();
    let whole = small_whole_models(dir.path());
    let whole = whole.to_str().unwrap();
    let o = tessera(&["calibrate", "--whole-models", whole]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("gemm_1000x256x10000") && out.contains("fc_layer_1_1000_5_float"));
    assert!(out.contains("44 rows; median |error|: cycles"), "{out}");
    // Then the whole models: the published runs (each estimated, or saying why not) and
    // Poplar's profiles, category by category.
    assert!(out.contains("tiny BERT "), "{out}");
    assert!(
        out.contains("not estimated: optimizer: `rmsprop` is not one of sgd, momentum"),
        "{out}"
    );
    assert!(
        out.contains("tiny BERT inference") && out.contains("exchange_code"),
        "{out}"
    );
    let o = tessera(&["calibrate", "--json", "--whole-models", whole]);
    let j = last_json(&o);
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 44);
    let runs = j["published_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs[0]["ratio"].as_f64().unwrap() > 0.0, "{}", runs[0]);
    assert!(runs[0]["fits"].is_boolean(), "{}", runs[0]);
    assert!(
        runs[1]["error"].as_str().unwrap().contains("rmsprop"),
        "{}",
        runs[1]
    );
    let profiles = j["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 1);
    for p in profiles {
        // Every category estimated, each ratio that of the two figures.
        let cats = p["categories"].as_array().unwrap();
        assert_eq!(cats.len(), 7, "{p}");
        for c in cats {
            let (ours, poplar) = (c["ours"].as_f64().unwrap(), c["poplar"].as_f64().unwrap());
            assert!(ours > 0.0 && poplar > 0.0, "{c}");
            assert!(
                (c["ratio"].as_f64().unwrap() - ours / poplar).abs() < 1e-9,
                "{c}"
            );
        }
    }
    // A row's estimate is estimate-op's for the same op.
    let row = rows
        .iter()
        .find(|r| r["target"] == "IpuModel2" && r["benchmark"] == "gemm_200x64x10000")
        .unwrap();
    let op = last_json(&tessera(&[
        "estimate-op",
        "matmul",
        "--m",
        "200",
        "--k",
        "64",
        "--n",
        "10000",
        "--data-type",
        "half",
        "--ipu",
        "mk2",
        "--json",
    ]));
    for key in ["cycles", "total_memory_bytes", "max_tile_bytes"] {
        assert_eq!(row["estimate"][key], op[key], "{key}");
    }
    // --check fails exactly when some bound is broken.
    let broken = !j["breaks"].as_array().unwrap().is_empty();
    let checked = tessera(&["calibrate", "--check", "--ops-only"]);
    assert_eq!(checked.status.success(), !broken, "{}", stdout(&checked));
    // A file with a bad row names its line.
    let dir = tempfile::tempdir().unwrap();
    let bad = write(
        dir.path(),
        "bad.csv",
        "target,benchmark,cycles,total_memory_bytes,max_tile_bytes\nIpuModel2,conv_7,1,2,3\n",
    );
    let o = tessera(&["calibrate", bad.to_str().unwrap()]);
    assert_clean_failure(&o, &["bad.csv", "line 2", "conv_7"]);
    // And a whole-model file with a bad figure names its entry.
    let bad = write(
        dir.path(),
        "bad_whole.toml",
        "[[run]]\nname = 'r'\nmodel = 'm.onnx'\nsamples_per_second = -1.0\nincludes_host = false\noptions = {}\n",
    );
    let o = tessera(&["calibrate", "--whole-models", bad.to_str().unwrap()]);
    assert_clean_failure(&o, &["bad_whole.toml", "`r`", "samples_per_second"]);
}

#[test]
fn dataset_benchmark_json() {
    let o = tessera(&["dataset-benchmark", "--epochs", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = last_json(&o);
    let epochs = j["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    for e in epochs {
        assert_eq!(e["elements_processed"], 250);
        for key in [
            "total_bytes_processed",
            "time_elapsed",
            "elements_per_second",
            "bandwidth",
        ] {
            assert!(e.get(key).is_some(), "{key}");
        }
    }
}

#[test]
fn missing_data_is_one_line() {
    let o = tessera(&["train", "--data", "/nonexistent/tessera-data"]);
    assert_clean_failure(&o, &["train-images-idx3-ubyte"]);
}

#[test]
fn truncated_idx_is_one_line() {
    let d = data_copy();
    let f = d.path().join("train-images-idx3-ubyte");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..1000]).unwrap();
    let o = tessera(&["train", "--data", d.path().to_str().unwrap()]);
    assert_clean_failure(&o, &["train-images-idx3-ubyte"]);
}

#[test]
fn wrong_magic_is_one_line() {
    let d = data_copy();
    let f = d.path().join("train-labels-idx1-ubyte");
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[2] = 0x0d;
    std::fs::write(&f, &bytes).unwrap();
    let o = tessera(&["train", "--data", d.path().to_str().unwrap()]);
    assert_clean_failure(&o, &["train-labels-idx1-ubyte", "magic"]);
}

#[test]
fn label_count_mismatch_is_one_line() {
    let d = data_copy();
    let f = d.path().join("t10k-labels-idx1-ubyte");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = u32::from_be_bytes(bytes[4..8].try_into().unwrap()) - 1;
    bytes[4..8].copy_from_slice(&n.to_be_bytes());
    bytes.pop();
    std::fs::write(&f, &bytes).unwrap();
    let o = tessera(&["train", "--data", d.path().to_str().unwrap()]);
    assert_clean_failure(&o, &["1999", "2000"]);
}

#[test]
fn unknown_model_key_is_one_line() {
    let d = tempfile::tempdir().unwrap();
    let text = SHIPPED[0].1.replace("units = 128", "units = 128\nunit = 3");
    let p = write(d.path(), "bad.toml", &text);
    let o = tessera(&["estimate", p.to_str().unwrap()]);
    assert_clean_failure(&o, &["bad.toml:", "unknown field `unit`"]);
}

#[test]
fn wrong_layer_width_is_one_line() {
    let d = tempfile::tempdir().unwrap();
    let text = SHIPPED[0].1.replace("units = 10\n", "units = 12\n");
    let p = write(d.path(), "wide.toml", &text);
    let o = tessera(&["train", p.to_str().unwrap()]);
    assert_clean_failure(&o, &["Dense_10", "12 units", "10 classes"]);
}

#[test]
fn invalid_schedule_and_accumulation_is_one_line() {
    let o = tessera(&["estimate", "--gradient-accumulation-count", "3"]);
    assert_bad_option(
        &o,
        &["gradient accumulation count 3", "Grouped", "2 stages"],
    );
    let o = tessera(&["train", "--steps-per-execution", "6"]);
    assert_bad_option(&o, &["steps_per_execution 6", "4"]);
    let o = tessera(&["estimate", "--pipeline-schedule", "zigzag"]);
    assert_bad_option(&o, &["zigzag", "grouped"]);
    let o = tessera(&["train", "--optimizer", "adagrad"]);
    assert_bad_option(&o, &["adagrad", "adam"]);
    let o = tessera(&["train", "--epochs", "0"]);
    assert_bad_option(&o, &["--epochs"]);
    let o = tessera(&["train", "--no-such-option"]);
    assert_bad_option(&o, &["--no-such-option"]);
    let o = tessera(&["evaluate", "--steps-per-execution", "3"]);
    assert_bad_option(&o, &["--steps-per-execution", "3"]);
    let o = tessera(&["predict", "--output", "predictions.txt"]);
    assert_bad_option(&o, &["--output", ".npy"]);
}

#[test]
fn unknown_model_and_bad_depths_are_one_line() {
    assert_bad_option(
        &tessera(&["estimate", "resnet"]),
        &["resnet", "pipelined_sequential"],
    );
    assert_bad_option(
        &tessera(&["train", "--buffer-depth", "0"]),
        &["buffer depth", "0"],
    );
    assert_bad_option(
        &tessera(&["train", "--prefetch-depth", "256"]),
        &["prefetch", "256"],
    );
    assert_bad_option(&tessera(&["train", "--batch-size", "0"]), &["--batch-size"]);
}

/// The seeds' own command: an execution of 100 weight updates of M = 16 spans several passes
/// over the repeated dataset; BEFORE_APPLY outfeeds one gradient per update, AFTER_COMPUTE one
/// per micro-batch.
#[test]
fn the_seeds_command_runs_an_execution_longer_than_an_epoch() {
    let args = [
        "train",
        "pipelined_sequential",
        "--gradient-accumulation-count",
        "16",
        "--repeat-count",
        "100",
        "--run-single-step",
        "--gradients-filters",
        "Dense_128",
    ];
    let o = tessera(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("Dense_128/bias:0_grad shape: (100, 128)"),
        "{out}"
    );
    assert!(out.contains("Epoch 6.4, Mean loss"), "{out}");
    let mut pre = args.to_vec();
    pre.push("--outfeed-pre-accumulated-gradients");
    let o = tessera(&pre);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("Dense_128/bias:0_grad shape: (1600, 128)"),
        "{out}"
    );
}

#[test]
fn evaluate_and_predict_every_shipped_model() {
    let dir = tempfile::tempdir().unwrap();
    // The first 320 test digits: whole executions for every model's batch and schedule (the
    // whole split runs in the training tests' evaluations).
    let split = 320;
    let data = data_with_test_split(split as u32);
    let data = data.path().to_str().unwrap();
    for (name, _) in SHIPPED {
        // The test split in whole micro-batches of the model's batch size.
        let model = tessera_host::model::shipped(name).unwrap().unwrap();
        let batch =
            tessera_host::estimation::EstimateOptions::from_model_file(&model.training, name)
                .unwrap()
                .batch_size
                .unwrap_or(32);
        let rows = split / batch * batch;
        for extra in [&[][..], &["--no-pipelining"][..]] {
            let mut args = vec!["evaluate", name, "--json", "--data", data];
            args.extend_from_slice(extra);
            let o = tessera(&args);
            assert!(o.status.success(), "{name}: {}", stderr(&o));
            let j = last_json(&o);
            assert!(
                j["accuracy"].as_f64().is_some() && j["loss"].as_f64().is_some(),
                "{j}"
            );
            for ext in ["npy", "csv"] {
                let out = dir.path().join(format!("{name}.{ext}"));
                let mut args = vec![
                    "predict",
                    name,
                    "--output",
                    out.to_str().unwrap(),
                    "--data",
                    data,
                ];
                args.extend_from_slice(extra);
                let o = tessera(&args);
                assert!(o.status.success(), "{name}: {}", stderr(&o));
                assert!(stdout(&o).contains("inference:"), "{}", stdout(&o));
                let bytes = std::fs::read(&out).unwrap();
                if ext == "npy" {
                    assert!(bytes.starts_with(b"\x93NUMPY"));
                    let text = String::from_utf8_lossy(&bytes[..128]).to_string();
                    assert!(text.contains(&format!("'shape': ({rows}, 10")), "{text}");
                } else {
                    let text = String::from_utf8(bytes).unwrap();
                    assert_eq!(text.lines().count(), rows + 1);
                    assert!(text.starts_with("index,label,output_0,"), "{text}");
                }
            }
        }
    }
}

#[test]
fn estimate_inference_shows_the_inference_schedule() {
    let o = tessera(&["estimate", "--inference"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("inference: Grouped schedule over 2 stage(s)"),
        "{out}"
    );
    assert!(out.contains("stash depths [0, 0]"), "{out}");
}

#[test]
fn optimizer_state_offload_is_on_by_default_for_pipelines_and_accumulation() {
    let help = stdout(&tessera(&["train", "--help"]));
    assert!(help.contains("On by default"), "{help}");
    let adam = |extra: &[&str]| {
        let mut args = vec!["estimate", "--optimizer", "adam", "--json"];
        args.extend_from_slice(extra);
        let o = tessera(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        last_json(&o)["ipus"][0]["categories"]["always_live"]
            .as_u64()
            .unwrap()
    };
    let offloaded = adam(&[]);
    let kept = adam(&["--no-offload-optimizer-state"]);
    assert!(offloaded < kept, "{offloaded} vs {kept}");
    // One stage, M = 1: nothing to offload by default.
    let one = adam(&["sequential", "--gradient-accumulation-count", "1"]);
    let one_kept = adam(&[
        "sequential",
        "--gradient-accumulation-count",
        "1",
        "--no-offload-optimizer-state",
    ]);
    assert_eq!(one, one_kept);
}

#[test]
fn offloaded_state_is_sharded_over_the_replicas_by_default() {
    let help = stdout(&tessera(&["estimate", "--help"]));
    assert!(help.contains("--no-replicated-tensor-sharding"), "{help}");
    let update = |extra: &[&str]| {
        let mut args = vec![
            "estimate",
            "--optimizer",
            "adam",
            "--replicas",
            "4",
            "--json",
        ];
        args.extend_from_slice(extra);
        let o = tessera(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        last_json(&o)["weight_update_cycles"].as_u64().unwrap()
    };
    // TensorFlow's default: the offloaded state is sharded, each replica updating its share.
    let default = update(&[]);
    assert_eq!(default, update(&["--replicated-tensor-sharding"]));
    let whole = update(&["--no-replicated-tensor-sharding"]);
    assert!(default < whole, "{default} vs {whole}");
    // State kept on the tiles is not sharded by default; asked for, as PopART allows, each
    // replica updates its share there.
    let kept = update(&["--no-offload-optimizer-state"]);
    assert!(kept < whole, "{kept} vs {whole}");
    let kept_sharded = update(&[
        "--no-offload-optimizer-state",
        "--replicated-tensor-sharding",
    ]);
    assert!(kept_sharded < kept, "{kept_sharded} vs {kept}");
}

// ----- ONNX models -----

const ONNX_FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/onnx");

fn fixture(name: &str) -> String {
    format!("{ONNX_FIXTURES}/{name}")
}

/// A fixture tensor (`{name, shape, data}` JSON) written as a float32 .npy file.
fn fixture_npy(json: &str, out: &Path) {
    use npyz::WriterBuilder as _;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(json)).unwrap()).unwrap();
    let shape: Vec<u64> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&shape)
        .writer(std::fs::File::create(out).unwrap())
        .begin_nd()
        .unwrap();
    for x in v["data"].as_array().unwrap() {
        w.push(&(x.as_f64().unwrap() as f32)).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn onnx_run_writes_onnxruntimes_outputs() {
    // `cnn_external` is `cnn` with its weights in `cnn_external.onnx.data` (external data).
    for name in ["cnn", "cnn_external"] {
        let dir = tempfile::tempdir().unwrap();
        let x = dir.path().join("x.npy");
        fixture_npy(&format!("{name}.input.json"), &x);
        let out = dir.path().join("out");
        let o = tessera(&[
            "run",
            &fixture(&format!("{name}.onnx")),
            "--input",
            &format!("x={}", x.display()),
            "--output-dir",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let bytes = std::fs::read(out.join("logits.npy")).unwrap();
        let got: Vec<f32> = npyz::NpyFile::new(&bytes[..]).unwrap().into_vec().unwrap();
        let want: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture(&format!("{name}.output.json"))).unwrap(),
        )
        .unwrap();
        let want = want["data"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (a, e) in got.iter().zip(want) {
            let e = e.as_f64().unwrap() as f32;
            assert!(
                (a - e).abs() <= 1e-4 * e.abs().max(1.0),
                "{name}: {a} vs {e}"
            );
        }
    }
}

/// External data is read from the model's folder, and only from there: without its data
/// file `run` says which file is missing; a data file cut short, or a location that leaves
/// the folder, is an error naming the tensor.
#[test]
fn external_data_is_read_from_the_models_folder_only() {
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    fixture_npy("cnn_external.input.json", &x);
    let model = dir.path().join("m.onnx");
    std::fs::copy(fixture("cnn_external.onnx"), &model).unwrap();
    let input = format!("x={}", x.display());
    let run = || tessera(&["run", model.to_str().unwrap(), "--input", &input]);
    let o = run();
    assert_clean_failure(&o, &["cnn_external.onnx.data", "absent or empty"]);
    let data = std::fs::read(fixture("cnn_external.onnx.data")).unwrap();
    std::fs::write(
        dir.path().join("cnn_external.onnx.data"),
        &data[..data.len() / 2],
    )
    .unwrap();
    let o = run();
    assert_clean_failure(&o, &["cnn_external.onnx.data", "beyond the file's end"]);
    // A model naming a file outside its folder: the same model one folder down, its
    // locations rewritten to `../`.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(dir.path().join("cnn_external.onnx.data"), &data).unwrap();
    // Strings are length-prefixed: the same length keeps the protobuf valid.
    let bytes = std::fs::read(fixture("cnn_external.onnx")).unwrap();
    let from = b"cnn_external.onnx.data";
    let to = b"../cnn_external.onnx.d";
    assert_eq!(from.len(), to.len());
    let mut moved = bytes;
    let mut at = 0;
    while let Some(i) = moved[at..].windows(from.len()).position(|w| w == from) {
        moved[at + i..at + i + from.len()].copy_from_slice(to);
        at += i + from.len();
    }
    assert!(at > 0);
    let escaped = sub.join("m.onnx");
    std::fs::write(&escaped, moved).unwrap();
    let o = tessera(&["run", escaped.to_str().unwrap(), "--input", &input]);
    assert_clean_failure(&o, &["../cnn_external.onnx.d", "leaves the model's folder"]);
}

#[test]
fn stages_sharing_an_ipu_have_their_own_memory() {
    let model = fixture("transformer.onnx");
    let cut = "encoder/layer.0/output/LayerNorm/LayerNormalization";
    let run = |mapping: &str| {
        tessera(&[
            "estimate",
            &model,
            "--inference",
            "--batch-size",
            "4",
            "--pipeline-stages",
            cut,
            "--device-mapping",
            mapping,
            "--json",
        ])
    };
    let o = run("0,0");
    assert!(o.status.success(), "{}", stderr(&o));
    let j = last_json(&o);
    assert_eq!(j["ipus"].as_array().unwrap().len(), 1);
    let stages = j["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2);
    for s in stages {
        assert_eq!(s["ipu"], 0);
        let own = s["memory"]["bytes_used"].as_u64().unwrap();
        assert!(own > 0 && own <= j["ipus"][0]["bytes_used"].as_u64().unwrap());
        assert!(s["memory"]["categories"]["exchange_code"]
            .as_u64()
            .is_some());
    }
    // A stage per IPU: no separate figures.
    let o = run("0,1");
    assert!(o.status.success(), "{}", stderr(&o));
    let j = last_json(&o);
    assert!(j["stages"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["memory"].is_null()));
    // Mappings that cannot be.
    assert_bad_option(
        &run("0"),
        &["--device-mapping", "1 entries for 2 pipeline stages"],
    );
    assert_bad_option(&run("0,2"), &["--device-mapping", "IPU 1"]);
}

#[test]
fn onnx_estimates_print_fit_memory_cycles_and_layers() {
    for extra in [&[][..], &["--inference"][..], &["--pipeline-ipus", "2"][..]] {
        let mut args = vec!["estimate", "--json", "--batch-size", "4"];
        let model = fixture("transformer.onnx");
        args.push(&model);
        args.extend_from_slice(extra);
        let o = tessera(&args);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        let j = last_json(&o);
        assert_eq!(j["fits"], true, "{extra:?}");
        assert!(j["samples_per_second"].as_f64().unwrap() > 0.0);
        assert!(j["cycles_per_step"].as_u64().unwrap() > 0);
        assert!(!j["ipus"][0]["categories"].as_object().unwrap().is_empty());
        assert_eq!(j["onnx"]["batch_size"], 4);
        let layers = j["onnx"]["layers"].as_array().unwrap();
        assert!(layers
            .iter()
            .any(|l| l["op"] == "MatMul" && l["forward_cycles"].as_u64().unwrap() > 0));
        if extra.contains(&"--pipeline-ipus") {
            assert_eq!(j["ipus"].as_array().unwrap().len(), 2);
            assert_eq!(
                j["onnx"]["split"]["boundaries"].as_array().unwrap().len(),
                1
            );
        }
    }
}

/// `estimate` of the wide MLP fixture on a Mk1 at batch 8 with Adam, as JSON: too big for one
/// IPU, an automatic split fits on 3 (the next test). `extra` goes before `--json`.
fn wide_mlp_estimate<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "estimate",
        model,
        "--ipu",
        "mk1",
        "--batch-size",
        "8",
        "--optimizer",
        "adam",
    ];
    args.extend_from_slice(extra);
    args.push("--json");
    args
}

/// A model too big to train on one IPU: the out-of-memory report names the fullest tile and
/// the largest tensors by ONNX name, the exit is non-zero, and the search finds the fewest
/// IPUs an automatic split fits on. They are the fewest: the split on them fits, and the
/// automatic split on one IPU fewer does not.
#[test]
fn onnx_search_finds_the_fewest_ipus_a_split_fits_on() {
    let model = fixture("wide_mlp.onnx");
    let common = wide_mlp_estimate(&model, &[]);
    let o = tessera(&common);
    assert!(!o.status.success());
    let j = last_json(&o);
    assert_eq!(j["fits"], false);
    let err = stderr(&o);
    assert!(
        err.contains("out of memory: tile") && err.contains("`dense_"),
        "{err}"
    );
    let found = &j["onnx"]["fewest_ipus"];
    let ipus = found["ipus"].as_u64().expect("a split fits") as usize;
    assert!(ipus > 1, "{found}");
    let boundaries = found["boundaries"].as_array().unwrap();
    assert_eq!(boundaries.len(), ipus - 1, "{found}");
    assert!(
        err.contains(&format!(
            "an automatic split fits on {ipus} IPUs: add --pipeline-ipus {ipus}"
        )),
        "{err}"
    );
    // The split it names fits; the automatic split on one IPU fewer does not.
    for (n, fits) in [(ipus, true), (ipus - 1, false)] {
        let n = n.to_string();
        let mut args = common.to_vec();
        args.extend_from_slice(&["--pipeline-ipus", &n, "--no-search"]);
        let o = tessera(&args);
        let j = last_json(&o);
        assert_eq!(j["fits"], fits, "{n} IPUs: {}", stderr(&o));
        assert_eq!(o.status.success(), fits, "{n} IPUs");
        if fits {
            assert_eq!(j["onnx"]["split"]["boundaries"], found["boundaries"]);
        }
    }
}

/// A model too big for one IPU (an automatic split fits on 3, see the test above) with the
/// accumulation count given: splits whose schedule cannot take it cannot run, and the search
/// finds the fewest IPUs among those that can, saying which could not, instead of ending on
/// the first one's schedule error. Grouped takes PopART's rule for ONNX models (at least
/// 2 x stages - 1): M = 2 lets no split run, M = 4 lets 2 IPUs run, where the model does not
/// fit. Interleaved keeps TensorFlow's (a multiple of the stages): M = 4 lets 2 and 4 IPUs run,
/// not 3 (so the search, which takes more IPUs to fit when fewer do, must not step over 4);
/// M = 6 lets 3 run again.
#[test]
fn onnx_search_skips_splits_that_cannot_run() {
    let model = fixture("wide_mlp.onnx");
    for (schedule, m, ipus, unrunnable, says) in [
        ("grouped", "2", None, 2, "no automatic split can run"),
        (
            "grouped",
            "4",
            None,
            3,
            "no automatic split fits on up to 2 IPUs",
        ),
        (
            "interleaved",
            "4",
            Some(4),
            3,
            "an automatic split fits on 4 IPUs",
        ),
        (
            "interleaved",
            "6",
            Some(3),
            4,
            "an automatic split fits on 3 IPUs",
        ),
    ] {
        let o = tessera(&wide_mlp_estimate(
            &model,
            &[
                "--gradient-accumulation-count",
                m,
                "--pipeline-schedule",
                schedule,
            ],
        ));
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(err.contains("out of memory: tile"), "M = {m}: {err}");
        let j = last_json(&o);
        let found = &j["onnx"]["fewest_ipus"];
        assert_eq!(found["ipus"].as_u64(), ipus, "{schedule} M = {m}: {found}");
        let why =
            format!("the split on {unrunnable} IPUs cannot run: gradient accumulation count {m}");
        assert!(
            found["unrunnable"]
                .as_str()
                .is_some_and(|s| s.starts_with(&why)),
            "{schedule} M = {m}: {found}"
        );
        // When none fits, the message says why more IPUs were not tried.
        assert!(
            err.contains(says) && (ipus.is_some() || err.contains(&why)),
            "{schedule} M = {m}: {err}"
        );
    }
}

/// A model that does not fit, with `--no-search`: the estimate and its out-of-memory report,
/// a non-zero exit, and no search for the fewest IPUs.
#[test]
fn onnx_no_search_reports_without_searching() {
    let model = fixture("cnn.onnx");
    let o = tessera(&[
        "estimate",
        &model,
        "--batch-size",
        "12000",
        "--ipu",
        "mk1",
        "--json",
        "--no-search",
    ]);
    assert!(!o.status.success());
    let j = last_json(&o);
    assert_eq!(j["fits"], false);
    assert!(j["onnx"]["fewest_ipus"].is_null(), "{}", j["onnx"]);
    let err = stderr(&o);
    assert!(
        err.contains("does not fit") && err.contains("out of memory: tile"),
        "{err}"
    );
    assert!(!err.contains("automatic split"), "{err}");
    // The flag is for ONNX models only.
    assert_bad_option(
        &tessera(&["estimate", "--no-search"]),
        &["--no-search", "ONNX"],
    );
}

#[test]
fn onnx_bad_inputs_fail_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture("cnn.onnx")).unwrap();
    let cut = dir.path().join("cut.onnx");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let text = dir.path().join("text.onnx");
    std::fs::write(&text, "this is not a model\n").unwrap();
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            vec!["estimate".into(), cut.display().to_string()],
            vec!["not an ONNX model", "truncated", "byte"],
        ),
        (
            vec!["estimate".into(), text.display().to_string()],
            vec!["not an ONNX model", "byte 0"],
        ),
        (
            vec!["estimate".into(), fixture("unsupported_op.onnx")],
            vec!["my_det", "Det", "opset 17", "supported ops:"],
        ),
        (
            vec!["estimate".into(), fixture("unsupported_ops.onnx")],
            vec![
                "3 op types are not supported",
                "Det (opset 17; 2 nodes, the first `det_a`)",
                "NonZero",
                "com.example.MyOp",
            ],
        ),
        (
            vec!["estimate".into(), fixture("dynamic_batch.onnx")],
            vec!["input `x`", "symbolic (`batch`)", "--batch-size"],
        ),
        (
            vec![
                "estimate".into(),
                fixture("cnn.onnx"),
                "--pipeline-stages".into(),
                "no_such_node".into(),
            ],
            vec!["--pipeline-stages", "no_such_node"],
        ),
        (
            vec!["estimate".into(), fixture("old_opset.onnx")],
            vec!["opset 5", "supported: 6 to 22"],
        ),
        (
            vec![
                "run".into(),
                fixture("stripped.onnx"),
                "--input".into(),
                "x=unused.npy".into(),
            ],
            vec!["has no values", "__stripped__", "numerics need the weights"],
        ),
        (
            vec![
                "run".into(),
                fixture("double.onnx"),
                "--input".into(),
                "x=unused.npy".into(),
            ],
            vec!["tensor `x` is float64", "computes in float32"],
        ),
    ];
    for (args, needles) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = tessera(&args);
        assert_bad_option(&o, &needles);
    }
}

#[test]
fn onnx_report_directory_has_the_layer_table() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let o = tessera(&[
        "estimate",
        &fixture("gpt_block.onnx"),
        "--report-dir",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(page.contains("Layers (ONNX nodes)"), "no layer table");
    assert!(page.contains("Gemm") && page.contains("Softmax"));
    for f in ["estimate.json", "trace.json", "memory.svg", "timeline.svg"] {
        assert!(report.join(f).exists(), "{f}");
    }
    // Re-rendering from estimate.json keeps the layers.
    let o = tessera(&["report", report.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert!(page.contains("Layers (ONNX nodes)"));
}

/// The techniques' options: checked before any work, each error naming the option.
#[test]
fn memory_technique_options_are_checked() {
    let o = tessera(&["estimate", "--available-memory-proportion", "0"]);
    assert_bad_option(&o, &["--available-memory-proportion", "0 is not in (0, 1]"]);
    let o = tessera(&["estimate", "--partials-type", "double"]);
    assert_bad_option(&o, &["--partials-type", "double"]);
    let o = tessera(&["estimate", "--recompute-checkpoints", "auto,Dense_256"]);
    assert_bad_option(&o, &["--recompute-checkpoints", "`auto` stands alone"]);
    let o = tessera(&["estimate", "--recompute-checkpoints", "no_such_layer"]);
    assert_clean_failure(&o, &["--recompute-checkpoints", "no_such_layer"]);
    // A per-stage proportion list must have one value per stage.
    let o = tessera(&["estimate", "--available-memory-proportion", "0.3,0.3,0.3"]);
    assert_clean_failure(
        &o,
        &[
            "available memory proportion",
            "3 values",
            "2 pipeline stages",
        ],
    );
    // And they run: the seeds' pipelined model with every technique.
    let o = tessera(&[
        "estimate",
        "--optimizer",
        "lamb",
        "--replicas",
        "2",
        "--gradient-accumulation-count",
        "8",
        "--dtype",
        "f16",
        "--partials-type",
        "half",
        "--available-memory-proportion",
        "0.3,0.4",
        "--recompute-checkpoints",
        "auto",
        "--replicated-tensor-sharding",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(last_json(&o)["samples_per_second"].as_f64().unwrap() > 0.0);
}

/// Where outputs go is checked before any work, each failure one line naming the path; files
/// are written whole (through a temporary file renamed into place), and none is left behind.
#[test]
fn outputs_are_checked_before_work_and_written_whole() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a_file");
    std::fs::write(&file, b"not a folder").unwrap();
    let missing = dir.path().join("missing/w.safetensors");
    let o = tessera(&["train", "--checkpoint", missing.to_str().unwrap()]);
    assert_clean_failure(&o, &["missing", "does not exist"]);
    assert!(stdout(&o).is_empty(), "no training ran: {}", stdout(&o));
    let o = tessera(&["estimate", "--report-dir", file.to_str().unwrap()]);
    assert_clean_failure(&o, &["a_file", "is not a folder"]);
    let o = tessera(&[
        "predict",
        "--output",
        dir.path().join("missing/p.npy").to_str().unwrap(),
    ]);
    assert_clean_failure(&o, &["missing", "does not exist"]);
    assert!(stdout(&o).is_empty(), "no inference ran: {}", stdout(&o));
    // Written whole, twice over the same names: the second replaces the first.
    let report = dir.path().join("report");
    let out = dir.path().join("p.csv");
    for _ in 0..2 {
        let o = tessera(&["estimate", "--report-dir", report.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = tessera(&["predict", "--output", out.to_str().unwrap()]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert!(std::fs::read_to_string(&out)
        .unwrap()
        .starts_with("index,label,output_0,"));
    for d in [dir.path(), &report] {
        let left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') || n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{}: {left:?}", d.display());
    }
}

/// On a full file system (a 64 KiB tmpfs), a checkpoint, predictions and a report that do not
/// fit each fail with one line naming the file and the cause, and every final name keeps its
/// old contents, with no temporary file left beside it.
///
/// The tmpfs is mounted in a private mount namespace (`unshare -rm`, no privileges needed
/// where user namespaces are allowed). Where the machine allows none the test says so and
/// stops; `output::tests::a_failed_write_keeps_the_old_file_and_leaves_nothing_behind`
/// covers the same mechanism with a writer that fails mid-way.
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_leaves_every_old_output_whole() {
    let allowed = Command::new("unshare")
        .args(["-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !allowed {
        eprintln!("skipped: this machine allows no private tmpfs mount (unshare -rm)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = r#"set -e
d="$1"
mount -t tmpfs -o size=64k tmpfs "$d"
mkdir "$d/report"
printf old > "$d/w.safetensors"; printf old > "$d/p.npy"; printf old > "$d/report/estimate.json"
for c in "train --epochs 1 --checkpoint $d/w.safetensors" "predict --output $d/p.npy" "estimate --report-dir $d/report"; do
  if msg=$("$0" $c 2>&1 >/dev/null); then echo "succeeded: $c"; exit 3; fi
  printf '%s\n--\n' "$msg"
done
echo "contents: $(cat "$d/w.safetensors") $(cat "$d/p.npy") $(cat "$d/report/estimate.json")"
echo "left: $(ls -A "$d" "$d/report" | grep '^\.' || true)"
"#;
    let o = Command::new("unshare")
        .args(["-rm", "sh", "-c", script, env!("CARGO_BIN_EXE_tessera")])
        .arg(dir.path())
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    let messages: Vec<&str> = out.split("--\n").take(3).collect();
    for (m, name) in messages.iter().zip(["w.safetensors", "p.npy", "report"]) {
        let lines: Vec<&str> = m.lines().filter(|l| !l.is_empty()).collect();
        assert!(lines[0].starts_with("error: "), "{m}");
        assert!(
            lines[1..].iter().all(|l| l.starts_with("caused by: ")),
            "{m}"
        );
        assert!(m.contains(name) && m.contains("No space left"), "{m}");
        assert!(
            !m.contains("at path"),
            "names the removed temporary file: {m}"
        );
        assert!(!m.contains("panicked"), "{m}");
    }
    assert!(out.contains("contents: old old old\n"), "{out}");
    assert!(out.contains("left: \n"), "a temporary file was left: {out}");
}

/// `.npy` bytes of float32 `values` stored in `order` for `shape` (NumPy format 1.0).
fn npy_bytes(shape: &[usize], values: &[f32], fortran: bool) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut header = format!(
        "{{'descr': '<f4', 'fortran_order': {}, 'shape': ({},), }}",
        if fortran { "True" } else { "False" },
        dims.join(", ")
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// `tessera run` reads what a `.npy` file says: a Fortran-order file gives the outputs its
/// C-order twin gives; data that ends early and an input the model does not have (or one
/// given twice) are errors that say so.
#[test]
fn onnx_run_reads_npy_files_as_numpy_does() {
    let dir = tempfile::tempdir().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("cnn.input.json")).unwrap()).unwrap();
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    let c: Vec<f32> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    // The same tensor in column-major order: element (i0, i1, i2, i3) at
    // i0 + d0 (i1 + d1 (i2 + d2 i3)).
    let mut f = vec![0f32; c.len()];
    let (d0, d1, d2, d3) = (shape[0], shape[1], shape[2], shape[3]);
    for i0 in 0..d0 {
        for i1 in 0..d1 {
            for i2 in 0..d2 {
                for i3 in 0..d3 {
                    let ci = ((i0 * d1 + i1) * d2 + i2) * d3 + i3;
                    f[i0 + d0 * (i1 + d1 * (i2 + d2 * i3))] = c[ci];
                }
            }
        }
    }
    let run = |file: &Path, out: &Path, extra: &[&str]| {
        let spec = format!("x={}", file.display());
        let mut args = vec![
            "run",
            &fixture("cnn.onnx"),
            "--input",
            &spec,
            "--output-dir",
            out.to_str().unwrap(),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        tessera(&refs)
    };
    let (xc, xf) = (dir.path().join("c.npy"), dir.path().join("f.npy"));
    std::fs::write(&xc, npy_bytes(&shape, &c, false)).unwrap();
    std::fs::write(&xf, npy_bytes(&shape, &f, true)).unwrap();
    let (oc, of) = (dir.path().join("oc"), dir.path().join("of"));
    for (x, o) in [(&xc, &oc), (&xf, &of)] {
        let r = run(x, o, &[]);
        assert!(r.status.success(), "{}", stderr(&r));
    }
    assert_eq!(
        std::fs::read(oc.join("logits.npy")).unwrap(),
        std::fs::read(of.join("logits.npy")).unwrap()
    );
    // Data that ends early.
    let short = dir.path().join("short.npy");
    let mut bytes = npy_bytes(&shape, &c, false);
    bytes.truncate(bytes.len() - 10);
    std::fs::write(&short, bytes).unwrap();
    assert_clean_failure(
        &run(&short, &oc, &[]),
        &["short.npy", "ends early", "1536 elements"],
    );
    // An input the model does not have, and one given twice.
    assert_clean_failure(
        &run(&xc, &oc, &["--input", &format!("y={}", xc.display())]),
        &["no input `y`", "its inputs: x"],
    );
    assert_clean_failure(
        &run(&xc, &oc, &["--input", &format!("x={}", xc.display())]),
        &["`x` is given twice"],
    );
}

/// `tessera run` binds a symbolic batch from the array given for the input, as onnxruntime
/// does (it takes no `--batch-size`); without that input it says so. A negative dimension is
/// named as what it is, not as a symbol.
#[test]
fn run_binds_the_batch_from_its_inputs_and_negative_dims_are_named() {
    use prost::Message as _;
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    let values: Vec<f32> = (0..12).map(|v| v as f32 / 10.0).collect();
    std::fs::write(&x, npy_bytes(&[3, 4], &values, false)).unwrap();
    let out = dir.path().join("out");
    let model = fixture("dynamic_batch.onnx");
    let o = tessera(&[
        "run",
        &model,
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(out.join("y.npy")).unwrap();
    let y = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(y.shape(), &[3, 3]);
    let o = tessera(&["run", &model]);
    assert_clean_failure(&o, &["`x` is not given"]);
    assert!(!stderr(&o).contains("--batch-size"), "{}", stderr(&o));

    let mut m = tessera_host::onnx::proto::ModelProto::decode(
        &std::fs::read(fixture("cnn.onnx")).unwrap()[..],
    )
    .unwrap();
    let input = &mut m.graph.as_mut().unwrap().input[0];
    let Some(tessera_host::onnx::proto::type_proto::Value::TensorType(t)) =
        input.r#type.as_mut().unwrap().value.as_mut()
    else {
        panic!("a tensor input")
    };
    t.shape.as_mut().unwrap().dim[1].value =
        Some(tessera_host::onnx::proto::tensor_shape_proto::dimension::Value::DimValue(-3));
    let bad = dir.path().join("negative.onnx");
    std::fs::write(&bad, m.encode_to_vec()).unwrap();
    let o = tessera(&["estimate", bad.to_str().unwrap(), "--inference"]);
    assert_clean_failure(&o, &["`x`", "dimension 1 is -3"]);
    assert!(!stderr(&o).contains("symbolic"), "{}", stderr(&o));
}

/// The data's sample shape is checked against the model's input, not only its element
/// count: 14x56 images are not 28x28 ones, though both hold 784 pixels.
#[test]
fn idx_dimensions_are_checked_against_the_model() {
    let d = data_copy();
    for name in ["train-images-idx3-ubyte", "t10k-images-idx3-ubyte"] {
        let f = d.path().join(name);
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[8..12].copy_from_slice(&14u32.to_be_bytes());
        bytes[12..16].copy_from_slice(&56u32.to_be_bytes());
        std::fs::write(&f, &bytes).unwrap();
    }
    let o = tessera(&["train", "--data", d.path().to_str().unwrap()]);
    assert_clean_failure(&o, &["[28, 28]", "[14, 56]"]);
}

/// Sizes users type are held to the machine's: an IPU a system cannot have, more replicas
/// than its IPUs, loops longer than Poplar's 32-bit repeat count and cycle counts past 64
/// bits are one-line errors naming the value; a billion micro-batches per update is a
/// result, computed in the steady state's closed form.
#[test]
fn sizes_are_held_to_the_machine() {
    let dir = tempfile::tempdir().unwrap();
    let (name, text) = SHIPPED[0];
    assert_eq!(name, "pipelined_sequential");
    let text = text.replace("device_mapping = [0, 1]", "device_mapping = [0, 1000000]");
    assert!(text.contains("1000000"));
    let model = write(dir.path(), "far.toml", &text);
    let o = tessera(&["estimate", model.to_str().unwrap()]);
    assert_clean_failure(&o, &["1000000"]);
    let o = tessera(&["estimate", "--replicas", "1000000"]);
    assert_clean_failure(&o, &["--replicas", "1000000", "1024"]);
    for cmd in ["estimate", "train"] {
        let o = tessera(&[cmd, "--repeat-count", "9223372036854775807"]);
        assert_clean_failure(&o, &["--repeat-count", "9223372036854775807", "4294967295"]);
    }
    // Within the loop limit, the cycles of an execution pass 64 bits.
    let o = tessera(&[
        "estimate",
        "--gradient-accumulation-count",
        "4294967292",
        "--repeat-count",
        "4294967295",
    ]);
    assert_clean_failure(&o, &["overflows a 64-bit count"]);
    let o = tessera(&[
        "estimate",
        "--gradient-accumulation-count",
        "1000000000",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = last_json(&o);
    assert_eq!(e["gradient_accumulation_count"], 1_000_000_000);
    assert!(e["cycles_per_weight_update"].as_u64().unwrap() > 1_000_000_000);
    let o = tessera(&["train", "--epochs", "4294967295"]);
    assert_clean_failure(&o, &["--epochs", "micro-batch steps"]);
}

/// A long pipeline's steady state is counted, not listed: the report's timeline and trace
/// show it as one block on every IPU, and the trace stays the size of a short one.
#[test]
fn a_long_pipelines_steady_state_is_one_block_in_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let report = |m: &str| {
        let out = dir.path().join(format!("m{m}"));
        let o = tessera(&[
            "estimate",
            "--gradient-accumulation-count",
            m,
            "--report-dir",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        (
            std::fs::read_to_string(out.join("timeline.svg")).unwrap(),
            std::fs::read_to_string(out.join("trace.json")).unwrap(),
        )
    };
    let (svg, trace) = report("200");
    assert!(
        svg.contains("181 steady steps"),
        "no steady block in the timeline"
    );
    assert!(
        trace.contains("181 steady-state steps"),
        "no steady slice in the trace"
    );
    let (_, long_trace) = report("100000");
    assert!(long_trace.contains("99,981 steady") || long_trace.contains("99981 steady-state"));
    assert!(
        long_trace.len() < trace.len() * 2,
        "{} vs {}",
        long_trace.len(),
        trace.len()
    );
}

/// `--layers-per-ipu` (PopTorch's `layers_per_ipu`) is `--pipeline-stages` after each IPU's
/// last whole layer, the embeddings with the first IPU; bad counts are one-line errors.
#[test]
fn layers_per_ipu_splits_after_whole_layers() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data/onnx/bert_tiny.stripped.onnx")
        .display()
        .to_string();
    let run = |extra: &[&str]| {
        let mut args = vec!["estimate", &model, "--batch-size", "4", "--json"];
        args.extend_from_slice(extra);
        tessera(&args)
    };
    // Its three layers each end with their second layer norm.
    for (counts, after) in [
        ("1,1,1", "node_layer_norm_2,node_layer_norm_4"),
        ("0,2,1", "node_layer_norm,node_layer_norm_4"),
    ] {
        let by_layers = run(&["--layers-per-ipu", counts]);
        let by_nodes = run(&["--pipeline-stages", after]);
        assert!(
            by_layers.status.success(),
            "{counts}: {}",
            stderr(&by_layers)
        );
        assert!(by_nodes.status.success(), "{after}: {}", stderr(&by_nodes));
        let (a, b) = (last_json(&by_layers), last_json(&by_nodes));
        assert_eq!(a["ipus"].as_array().unwrap().len(), 3, "{counts}");
        for key in ["samples_per_second", "cycles_per_step", "ipus", "stages"] {
            assert_eq!(a[key], b[key], "{counts} against {after}: {key}");
        }
    }
    // The inference schedule finds the same layers, from the model's output.
    let o = run(&["--layers-per-ipu", "1,2", "--inference"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(last_json(&o)["ipus"].as_array().unwrap().len(), 2);
    assert_bad_option(
        &run(&["--layers-per-ipu", "1,1"]),
        &["--layers-per-ipu", "add up to 2", "3 repeated blocks"],
    );
    assert_bad_option(
        &run(&["--layers-per-ipu", "1,0,2"]),
        &["--layers-per-ipu", "IPU 1 would hold no layer"],
    );
    // It is a split of its own: not with another.
    assert_bad_option(
        &run(&["--layers-per-ipu", "1,2", "--pipeline-ipus", "2"]),
        &["--layers-per-ipu", "cannot be used with", "--pipeline-ipus"],
    );
}

/// The file's input shapes stand: `--batch-size` rebinds only inputs whose batch axis is
/// symbolic or holds the file's batch, and `--input-shape` gives an input's whole shape.
#[test]
fn input_shapes_stand_unless_rebound() {
    let matmul = fixture("matmul_fixed.onnx");
    let cnn = fixture("cnn.onnx");
    let layer_names = |o: &Output| -> Vec<serde_json::Value> {
        assert!(o.status.success(), "{}", stderr(o));
        last_json(o)["onnx"]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].clone())
            .collect()
    };
    // X[5, 3] . Y[3, 4]: Y's first axis is not the batch, at the file's batch or another.
    for batch in [None, Some("10")] {
        let mut args = vec!["estimate", &matmul, "--inference", "--json"];
        if let Some(b) = batch {
            args.extend_from_slice(&["--batch-size", b]);
        }
        let o = tessera(&args);
        assert!(!layer_names(&o).is_empty());
        assert_eq!(
            last_json(&o)["onnx"]["batch_size"],
            batch.map_or(5, |b| b.parse::<u64>().unwrap())
        );
    }
    // A larger image: the cycles grow, the batch stays the file's.
    let run = |extra: &[&str]| {
        let mut args = vec!["estimate", &cnn, "--inference", "--json"];
        args.extend_from_slice(extra);
        tessera(&args)
    };
    let small = run(&[]);
    let large = run(&["--input-shape", "x=2,3,32,32"]);
    assert!(large.status.success(), "{}", stderr(&large));
    let (s, l) = (last_json(&small), last_json(&large));
    assert_eq!(l["onnx"]["batch_size"], 2);
    assert!(l["cycles_per_step"].as_u64() > s["cycles_per_step"].as_u64());
    assert_bad_option(
        &run(&["--input-shape", "nope=1,2"]),
        &["--input-shape nope", "no such input", "x"],
    );
    assert_bad_option(
        &run(&["--input-shape", "x=2,3,32"]),
        &["--input-shape x", "3 dimensions given; the input has 4"],
    );
    assert_bad_option(
        &run(&["--input-shape", "x=2,3,32,32", "--input-shape", "x=2,3,8,8"]),
        &["--input-shape x", "given twice"],
    );
    assert_bad_option(
        &run(&["--input-shape", "x=2,3,a,32"]),
        &["--input-shape", "`a` is not a size"],
    );
}

/// The bundled transformers compute what they derive from the sequence length from their
/// inputs' shapes: `--input-shape` sets another length, and a batch it gives rebinds the
/// shapes written at the file's batch as `--batch-size` does (the same estimate).
#[test]
fn input_shapes_set_a_transformers_sequence_length() {
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/onnx/bert_tiny.stripped.onnx"
    );
    let run = |extra: &[&str]| {
        let mut args = vec!["estimate", model, "--inference", "--no-search", "--json"];
        args.extend_from_slice(extra);
        let o = tessera(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        last_json(&o)
    };
    let shapes = |b: usize, s: usize| {
        [
            "--input-shape".to_string(),
            format!("input_ids={b},{s}"),
            "--input-shape".to_string(),
            format!("attention_mask={b},{s}"),
        ]
    };
    let args = shapes(2, 128);
    let given = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let batch = run(&["--batch-size", "2"]);
    assert_eq!(given["onnx"]["batch_size"], 2);
    assert_eq!(given["onnx"]["file_batch_size"], 1);
    assert_eq!(given["cycles_per_step"], batch["cycles_per_step"]);
    assert_eq!(given["ipus"], batch["ipus"]);
    let args = shapes(2, 384);
    let long = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(long["cycles_per_step"].as_u64() > batch["cycles_per_step"].as_u64());
    // One input's batch against another's, or against --batch-size: an error naming it.
    let o = tessera(&[
        "estimate",
        model,
        "--inference",
        "--input-shape",
        "input_ids=2,128",
        "--batch-size",
        "4",
    ]);
    assert_bad_option(&o, &["input_ids", "batch axis 0 is 2", "--batch-size"]);
    // A length given for one input only: the other would keep the old one.
    let o = tessera(&[
        "estimate",
        model,
        "--inference",
        "--input-shape",
        "input_ids=2,384",
    ]);
    assert_bad_option(
        &o,
        &[
            "input_ids",
            "axis 1 from 128 to 384",
            "`attention_mask` [1, 128]",
            "--input-shape attention_mask=",
        ],
    );
}

/// The IPU has no float64: an estimate of a float64 model says so and names the tensors.
#[test]
fn a_float64_model_is_estimated_with_a_note() {
    let model = fixture("double.onnx");
    let o = tessera(&["estimate", &model, "--inference"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o)
            .contains("the IPU has no float64; the model's 3 float64 tensors (`w`, `x`, `y`)"),
        "{}",
        stdout(&o)
    );
    let o = tessera(&["estimate", &model, "--inference", "--json"]);
    assert_eq!(
        last_json(&o)["onnx"]["float64"],
        serde_json::json!(["w", "x", "y"])
    );
    let o = tessera(&["estimate", &fixture("cnn.onnx"), "--inference", "--json"]);
    assert!(last_json(&o)["onnx"].get("float64").is_none());
}

/// An estimate that cannot get the memory it needs (here a 100 MB address-space ceiling for
/// BERT-Base) ends with one `error:` line naming the allocation and exit status 1, not an
/// abort.
#[test]
fn an_estimate_out_of_memory_is_one_error_line() {
    let prlimit = std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !prlimit {
        return;
    }
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../data/onnx/bert_base.stripped.onnx");
    let o = std::process::Command::new("prlimit")
        .arg("--as=100000000")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_tessera"))
        .args(["estimate", model.to_str().unwrap(), "--no-search"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: out of memory: an allocation of ") && err.lines().count() == 1,
        "{err}"
    );
}

/// A model that does not fit because of its stashed activations: the hint's first suggestion
/// is recomputation from checkpoints, checked by estimating with it, and the paragraph is
/// printed once, on stderr.
#[test]
fn the_out_of_memory_hint_checks_its_first_suggestion() {
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/onnx/bert_base.stripped.onnx"
    );
    let out = tessera(&[
        "estimate",
        model,
        "--batch-size",
        "16",
        "--pipeline-ipus",
        "4",
        "--dtype",
        "f16",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let advice = stderr.lines().last().unwrap();
    assert!(
        advice.contains("(try --recompute-checkpoints auto, --offload-activations"),
        "{advice}"
    );
    assert!(
        advice.contains("; with --recompute-checkpoints auto it fits (fullest tile"),
        "{advice}"
    );
    assert!(!advice.contains("--dtype f16"), "{advice}");
    assert_eq!(stderr.matches("does not fit: out of memory").count(), 1);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("out of memory"));
}
