//! `tessera sweep` end to end: rows, the best configuration and the pictures; resuming after a
//! kill; shards (by option and by Slurm's variables) merged to the single run's rows; bad
//! specs; and, where Slurm is installed, a job array on a local one-node cluster.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CNN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/onnx/cnn.onnx"
);

fn tessera(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .current_dir(dir)
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("SLURM_ARRAY_TASK_COUNT")
        .output()
        .expect("the tessera binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "stdout: {}\nstderr: {}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// A spec of 12 configurations over a shipped model and an ONNX file; the four with
/// `pipeline_ipus = 2` on the shipped model fail (that option is ONNX's).
fn spec(dir: &Path) -> PathBuf {
    let path = dir.join("small.toml");
    fs::write(
        &path,
        format!(
            r#"
name = "small"
[base]
gradient_accumulation_count = 4
[grid]
model = ["sequential", "{CNN}"]
batch_size = [8, 16]
pipeline_ipus = [1, 2]
[[configs]]
dtype = "f32"
[[configs]]
dtype = "f16"
replicas = 2
pipeline_schedule = "sequential"
"#
        ),
    )
    .unwrap();
    path
}

fn rows(path: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_sweep_writes_every_row_the_best_and_the_pictures() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let out = tessera(
        &["sweep", spec.to_str().unwrap(), "--jobs", "2"],
        dir.path(),
    );
    let stdout = ok(&out);
    let res = dir.path().join("small-sweep");
    let rows = rows(&res.join("results.jsonl"));
    assert_eq!(rows.len(), 16);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["index"], i);
    }
    let failed: Vec<&serde_json::Value> = rows.iter().filter(|r| !r["error"].is_null()).collect();
    assert_eq!(failed.len(), 4, "pipeline_ipus on the shipped model");
    for r in &failed {
        assert_eq!(r["config"]["model"], "sequential");
        assert!(r["error"]
            .as_str()
            .unwrap()
            .contains("apply to ONNX models"));
    }
    let split = rows
        .iter()
        .find(|r| r["config"]["pipeline_ipus"] == 2 && r["error"].is_null())
        .unwrap();
    assert_eq!(split["boundaries"].as_array().unwrap().len(), 1, "{split}");
    assert_eq!(split["memory_per_ipu"].as_array().unwrap().len(), 2);
    assert!(stdout.contains("best: #"), "{stdout}");
    assert!(stdout.contains("Pareto front"), "{stdout}");
    let csv = fs::read_to_string(res.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 17);
    assert!(csv.starts_with("index,batch_size,dtype,gradient_accumulation_count,model,pipeline_ipus,pipeline_schedule,replicas,fits,"));
    let svg = fs::read_to_string(res.join("pareto.svg")).unwrap();
    assert!(svg.contains("16 configurations"), "{svg}");
    let html = fs::read_to_string(res.join("index.html")).unwrap();
    assert!(html.contains("Pareto front"));
    // A row's command gives the row's estimate.
    let r = rows
        .iter()
        .find(|r| {
            r["error"].is_null() && r["config"]["model"] == CNN && r["config"]["dtype"] == "f16"
        })
        .unwrap();
    let command = r["command"].as_str().unwrap();
    let words: Vec<&str> = command.split(' ').skip(1).collect();
    let mut args = words.clone();
    args.push("--json");
    let one = tessera(&args, dir.path());
    let e: serde_json::Value = serde_json::from_str(ok(&one).lines().last().unwrap()).unwrap();
    assert_eq!(
        e["samples_per_second"], r["samples_per_second"],
        "{command}"
    );
    assert_eq!(e["cycles_per_step"], r["cycles_per_step"]);
    assert_eq!(e["fits"], r["fits"]);
}

#[test]
fn a_killed_sweep_resumes_without_recomputing_finished_rows() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let s = spec.to_str().unwrap();
    ok(&tessera(&["sweep", s, "--output", "whole"], dir.path()));
    let whole = fs::read_to_string(dir.path().join("whole/results.jsonl")).unwrap();
    // As a kill leaves it: five rows done, in another order, and a sixth cut short.
    let lines: Vec<&str> = whole.lines().collect();
    let mut cut: String = [lines[7], lines[2], lines[0], lines[12], lines[9]]
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    cut.push_str(&lines[3][..40]);
    fs::create_dir_all(dir.path().join("cut")).unwrap();
    fs::write(dir.path().join("cut/results.jsonl"), cut).unwrap();
    let again = tessera(&["sweep", s, "--output", "cut"], dir.path());
    ok(&again);
    let err = text(&again.stderr);
    assert!(
        err.contains("16 configurations, 5 done already, 11 to run"),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("cut/results.jsonl")).unwrap(),
        whole,
        "the resumed run's rows equal the whole run's"
    );
    assert_eq!(
        fs::read_to_string(dir.path().join("cut/results.csv")).unwrap(),
        fs::read_to_string(dir.path().join("whole/results.csv")).unwrap()
    );
    let done = tessera(&["sweep", s, "--output", "cut"], dir.path());
    assert!(text(&done.stderr).contains("16 done already, 0 to run"));
}

#[test]
fn shards_merge_to_the_single_run() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let s = spec.to_str().unwrap();
    ok(&tessera(&["sweep", s, "--output", "whole"], dir.path()));
    ok(&tessera(
        &["sweep", s, "--output", "parts", "--shard", "0/3"],
        dir.path(),
    ));
    let by_env = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["sweep", s, "--output", "parts"])
        .current_dir(dir.path())
        .env("SLURM_ARRAY_TASK_ID", "1")
        .env("SLURM_ARRAY_TASK_COUNT", "3")
        .output()
        .unwrap();
    ok(&by_env);
    let shard1 = rows(&dir.path().join("parts/shard-1-of-3.jsonl"));
    let idx: Vec<u64> = shard1
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [5, 6, 7, 8, 9]);
    // Merged before the last shard: what is there, and which are missing.
    let early = tessera(&["sweep", "merge", s, "--output", "parts"], dir.path());
    assert!(!early.status.success());
    let err = text(&early.stderr);
    assert!(
        err.contains("6 of 16 configurations have no row yet (the first: #10"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(rows(&dir.path().join("parts/results.jsonl")).len(), 10);
    ok(&tessera(
        &["sweep", s, "--output", "parts", "--shard", "2/3"],
        dir.path(),
    ));
    ok(&tessera(
        &["sweep", "merge", s, "--output", "parts"],
        dir.path(),
    ));
    for f in ["results.jsonl", "results.csv", "pareto.svg", "index.html"] {
        assert_eq!(
            fs::read_to_string(dir.path().join("parts").join(f)).unwrap(),
            fs::read_to_string(dir.path().join("whole").join(f)).unwrap(),
            "{f}"
        );
    }
}

/// A failure: non-zero status and one `error:` line naming `needles`.
fn fails(o: &Output, needles: &[&str]) {
    let err = text(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
}

#[test]
fn bad_specs_and_outputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, body: &str| {
        let p = dir.path().join(name);
        fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_string()
    };
    let typo = write("typo.toml", "[base]\nmodel = 'sequential'\nbatchsize = 4\n");
    fails(
        &tessera(&["sweep", &typo], dir.path()),
        &["typo.toml", "unknown key `batchsize`", "batch_size"],
    );
    let value = write(
        "value.toml",
        "[base]\nmodel = 'sequential'\n[grid]\npipeline_schedule = ['grouped', 'zigzag']\n",
    );
    fails(
        &tessera(&["sweep", &value], dir.path()),
        &[
            "value.toml",
            "[grid]: pipeline_schedule",
            "zigzag",
            "grouped",
        ],
    );
    assert!(
        !dir.path().join("value-sweep").exists(),
        "nothing runs before every configuration is checked"
    );
    fails(
        &tessera(&["sweep", "absent.toml"], dir.path()),
        &["absent.toml"],
    );
    fails(
        &tessera(&["sweep", &typo, "--shard", "3/3"], dir.path()),
        &["0 <= I < N"],
    );
    // Rows of another sweep in the output directory are not mixed in.
    let a = write("a.toml", "[base]\nmodel = 'sequential'\nbatch_size = 4\n");
    let b = write("b.toml", "[base]\nmodel = 'sequential'\nbatch_size = 8\n");
    ok(&tessera(&["sweep", &a, "--output", "same"], dir.path()));
    fails(
        &tessera(&["sweep", &b, "--output", "same"], dir.path()),
        &["results.jsonl", "not in the spec", "batch_size=4"],
    );
    // A script without a scheduler to submit to.
    let dry = tessera(
        &[
            "sweep",
            "submit",
            &a,
            "--slurm",
            "--array-size",
            "2",
            "--dry-run",
            "--output",
            "sub",
        ],
        dir.path(),
    );
    ok(&dry);
    let script = fs::read_to_string(dir.path().join("sub/sweep.sbatch")).unwrap();
    assert!(
        script.contains("#SBATCH --array=0-0"),
        "one configuration: one task\n{script}"
    );
    assert!(
        script.contains("--shard \"$SLURM_ARRAY_TASK_ID/1\""),
        "{script}"
    );
}

/// Stops a local Slurm cluster's daemons when dropped.
struct Cluster {
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", self.dir.to_str().unwrap()])
            .status();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/local-slurm")
}

/// Submits the sweep as a 4-task job array to a one-node cluster started here (as
/// ../shared-style recipe `scripts/local-slurm` does), waits, merges, and compares with the
/// single-machine run. Skipped with a message when Slurm is not installed or this is not root,
/// unless TESSERA_REQUIRE_SLURM=1 (CI, which installs it).
#[test]
fn a_slurm_job_array_merges_to_the_single_run() {
    let required = std::env::var("TESSERA_REQUIRE_SLURM").is_ok_and(|v| v == "1");
    let installed =
        Path::new("/usr/sbin/slurmctld").exists() && Path::new("/usr/bin/sbatch").exists();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| text(&o.stdout).trim() == "0");
    if !(installed && root) {
        assert!(
            !required,
            "TESSERA_REQUIRE_SLURM=1 but Slurm is {} (scripts/install-slurm)",
            if installed {
                "installed and this is not root"
            } else {
                "not installed"
            }
        );
        eprintln!("skipped: Slurm's daemons are not installed or this is not root (scripts/install-slurm; TESSERA_REQUIRE_SLURM=1 makes this a failure)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    let s = spec.to_str().unwrap();
    let cluster_dir = dir.path().join("cluster");
    let start = Command::new(script())
        .args(["start", cluster_dir.to_str().unwrap()])
        .output()
        .unwrap();
    let _cluster = Cluster {
        dir: cluster_dir.clone(),
    };
    assert!(start.status.success(), "{}", text(&start.stderr));
    let conf = cluster_dir.join("slurm.conf");
    ok(&tessera(&["sweep", s, "--output", "whole"], dir.path()));
    let submit = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "sweep",
            "submit",
            s,
            "--slurm",
            "--array-size",
            "4",
            "--output",
            "array",
            "--wait",
        ])
        .current_dir(dir.path())
        .env("SLURM_CONF", &conf)
        .output()
        .unwrap();
    let out = ok(&submit);
    assert!(out.contains("(4 tasks)"), "{out}");
    for i in 0..4 {
        assert!(dir
            .path()
            .join(format!("array/shard-{i}-of-4.jsonl"))
            .exists());
    }
    assert_eq!(
        fs::read_to_string(dir.path().join("array/results.jsonl")).unwrap(),
        fs::read_to_string(dir.path().join("whole/results.jsonl")).unwrap(),
        "the array's merged rows equal the single-machine run's, row for row"
    );
}

/// Writes the small sweep's picture as PNG (with system fonts) when `TESSERA_REPORT_PNG` names
/// a directory: for looking at it.
#[test]
fn pareto_png_on_request() {
    let Some(out) = std::env::var_os("TESSERA_REPORT_PNG") else {
        return;
    };
    let out = Path::new(&out);
    fs::create_dir_all(out).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path());
    ok(&tessera(&["sweep", spec.to_str().unwrap()], dir.path()));
    let svg = fs::read_to_string(dir.path().join("small-sweep/pareto.svg")).unwrap();
    let mut opts = resvg::usvg::Options::default();
    opts.fontdb_mut().load_system_fonts();
    let tree = resvg::usvg::Tree::from_str(&svg, &opts).unwrap();
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    pixmap.save_png(out.join("pareto.png")).unwrap();
}
