//! ONNX's own backend node tests (tests/fixtures/onnx_node/, written by
//! scripts/make_onnx_node_tests.py from the pinned `onnx` package) for the ops the importer
//! reads, run through `tessera run`'s code path (`run_onnx`). Each case passes (every output
//! within rtol 1e-3 / atol 1e-5 of ONNX's expected values, of its shape), or is refused with
//! a typed error; a case that runs and gives other values, shapes or types fails the test.
//! The pass table by op is docs/onnx.md's, which a test checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_host::compile::onnx::{run_onnx, NamedTensor};
use tessera_host::onnx::{read_tensor, Elem, OnnxModel};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx_node")
}

/// How a case went.
enum Outcome {
    Pass,
    Refused(String),
    Wrong(String),
}

fn close(got: f64, want: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= 1e-5 + 1e-3 * want.abs()
}

/// An error and its causes, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(&format!(": {c}"));
        cause = c.source();
    }
    s
}

fn run_case(case: &Path) -> Outcome {
    let model = match OnnxModel::load(&case.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    let graph = model.graph();
    let mut inputs = Vec::new();
    for (j, vi) in graph.input.iter().enumerate() {
        let path = case.join(format!("input_{j}.pb"));
        let bytes = std::fs::read(&path).expect("input file");
        // A type the importer has no element type for: the import refuses the model too.
        let (dims, _, values) = match read_tensor(&bytes, &path) {
            Ok(t) => t,
            Err(e) => return Outcome::Refused(e.to_string()),
        };
        inputs.push(NamedTensor {
            name: vi.name.clone().unwrap_or_default(),
            dims,
            data: values.iter().map(|&v| v as f32).collect(),
        });
    }
    let outputs = match run_onnx(&model, &inputs) {
        Ok(o) => o,
        Err(e) => return Outcome::Refused(chain(&e)),
    };
    for (j, vi) in graph.output.iter().enumerate() {
        let name = vi.name.clone().unwrap_or_default();
        let path = case.join(format!("output_{j}.pb"));
        let bytes = std::fs::read(&path).expect("output file");
        let (dims, elem, want) = match read_tensor(&bytes, &path) {
            Ok(t) => t,
            Err(e) => {
                return Outcome::Wrong(format!(
                    "`{name}` ran, but is of a type Tessera has not: {e}"
                ))
            }
        };
        if matches!(elem, Elem::F64 | Elem::F16 | Elem::Bf16) {
            return Outcome::Wrong(format!("`{name}` is {elem:?} but was computed in float32"));
        }
        let Some(got) = outputs.iter().find(|t| t.name == name) else {
            return Outcome::Wrong(format!("no output `{name}`"));
        };
        if got.dims != dims {
            return Outcome::Wrong(format!("`{name}` is {:?}, expected {dims:?}", got.dims));
        }
        if let Some((i, (g, w))) = got
            .data
            .iter()
            .zip(&want)
            .enumerate()
            .find(|(_, (&g, &w))| !close(f64::from(g), w))
        {
            return Outcome::Wrong(format!("`{name}`[{i}] is {g}, expected {w}"));
        }
    }
    Outcome::Pass
}

/// Per op: (cases, passed); the cases refused, with why; the cases that ran wrong.
type Results = (BTreeMap<String, (usize, usize)>, Vec<String>, Vec<String>);

fn run_all() -> Results {
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).unwrap())
            .unwrap();
    let mut by_op: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut wrong = Vec::new();
    let mut refused = Vec::new();
    for case in manifest["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let op = case["op"].as_str().unwrap().to_string();
        let entry = by_op.entry(op).or_default();
        entry.0 += 1;
        match run_case(&dir().join(name)) {
            Outcome::Pass => entry.1 += 1,
            Outcome::Refused(why) => refused.push(format!("{name}: {why}")),
            Outcome::Wrong(why) => wrong.push(format!("{name}: {why}")),
        }
    }
    (by_op, refused, wrong)
}

/// The pass table docs/onnx.md shows.
fn table(by_op: &BTreeMap<String, (usize, usize)>) -> String {
    let (cases, passed) = by_op
        .values()
        .fold((0, 0), |(c, p), &(c1, p1)| (c + c1, p + p1));
    let mut out = String::from("| op | node tests | passed |\n|---|---|---|\n");
    for (op, (c, p)) in by_op {
        out.push_str(&format!("| {op} | {c} | {p} |\n"));
    }
    out.push_str(&format!("| all | {cases} | {passed} |\n"));
    out
}

#[test]
fn onnx_node_tests_pass_or_are_refused() {
    let (by_op, refused, wrong) = run_all();
    let table = table(&by_op);
    if std::env::var_os("TESSERA_NODE_TESTS_LIST").is_some() {
        eprintln!("Refused:\n{}", refused.join("\n"));
    }
    assert!(
        wrong.is_empty(),
        "{} node tests ran and gave wrong results:\n{}\n\n{table}",
        wrong.len(),
        wrong.join("\n")
    );
    let docs = include_str!("../../docs/onnx.md");
    assert!(
        docs.contains(&table),
        "docs/onnx.md's node-test table differs; put this in it:\n{table}\nRefused:\n{}",
        refused.join("\n")
    );
}
