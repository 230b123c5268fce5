//! Small ONNX models with weights (`tests/fixtures/onnx`, made by
//! `scripts/make_onnx_fixtures.py`) run through the importer and the core's kernels give
//! onnxruntime's outputs within 1e-4; weight-free forms import for estimates and refuse
//! numerics; bad files fail with one clear error each.

use std::path::PathBuf;

use serde_json::Value;
use tessera_core::Graph;
use tessera_host::compile::onnx::{run_onnx, NamedTensor};
use tessera_host::compile::SessionError;
use tessera_host::onnx::{import, ImportOptions, OnnxError, OnnxModel};
use tessera_sim::Heap;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/onnx")
}

fn tensor(file: &str) -> NamedTensor {
    tensor_in(&dir(), file)
}

/// The JSON tensor `file` of fixture directory `dir`.
fn tensor_in(dir: &std::path::Path, file: &str) -> NamedTensor {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(file)).expect("fixture tensor"))
            .expect("json");
    NamedTensor {
        name: v["name"].as_str().expect("name").to_string(),
        dims: v["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect(),
        data: v["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|x| x.as_f64().expect("value") as f32)
            .collect(),
    }
}

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).expect("manifest"))
        .expect("json")
}

fn load(file: &str) -> OnnxModel {
    OnnxModel::load(&dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn outputs_equal_onnxruntime() {
    let cases = outputs_equal_onnxruntime_in(&dir(), &manifest());
    assert!(cases >= 7);
}

/// Runs every case of `manifest`'s `numerics` (fixtures in `dir`) and checks its outputs
/// against onnxruntime's within 1e-4: the number of cases.
fn outputs_equal_onnxruntime_in(dir: &std::path::Path, m: &Value) -> usize {
    let cases = m["numerics"].as_array().expect("numerics");
    for case in cases {
        let file = case["file"].as_str().unwrap();
        let model = OnnxModel::load(&dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let inputs: Vec<NamedTensor> = case["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| tensor_in(dir, i["file"].as_str().unwrap()))
            .collect();
        let got = run_onnx(&model, &inputs).unwrap_or_else(|e| panic!("{file}: {e:?}"));
        for o in case["outputs"].as_array().unwrap() {
            let want = tensor_in(dir, o["file"].as_str().unwrap());
            let g = got
                .iter()
                .find(|t| t.name == want.name)
                .unwrap_or_else(|| panic!("{file}: no output `{}`", want.name));
            assert_eq!(g.dims, want.dims, "{file}: `{}` shape", want.name);
            let mut worst = 0f32;
            for (i, (a, e)) in g.data.iter().zip(&want.data).enumerate() {
                let err = (a - e).abs() / e.abs().max(1.0);
                assert!(
                    err <= 1e-4,
                    "{file}: `{}`[{i}] = {a}, onnxruntime {e}",
                    want.name
                );
                worst = worst.max(err);
            }
            println!("{file}: `{}` within {worst:.2e}", want.name);
        }
    }
    cases.len()
}

/// Models exported the way their users export them, with the exporters' defaults
/// (`scripts/export_default_models.py`): transformers' BERT, DistilBERT, GPT-2 and T5
/// encoder through `torch.onnx.export` at opset 17 (SDPA attention: `IsNaN` at run time; T5's
/// relative-position buckets: `Abs` of int64 constants) give onnxruntime's outputs, and they
/// and torchvision's resnet18 from the dynamo exporter (opset 18, external data, kept without
/// its weights) estimate for inference and for training.
#[test]
fn exporters_default_models_run_and_estimate() {
    use tessera_host::compile::onnx::{compile_onnx, OnnxOptions};
    use tessera_host::compile::SessionOptions;
    let dir = dir().join("exporters");
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("manifest.json")).expect("manifest"),
    )
    .expect("json");
    assert_eq!(outputs_equal_onnxruntime_in(&dir, &m), 4);
    let cases = m["estimates"].as_array().expect("estimates");
    assert_eq!(cases.len(), 5);
    for case in cases {
        let file = case["file"].as_str().unwrap();
        let model = OnnxModel::load(&dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for inference in [true, false] {
            let oo = OnnxOptions {
                inference,
                ..OnnxOptions::default()
            };
            let what = format!("{file} inference {inference}");
            let so = SessionOptions {
                batch_size: case["batch"].as_u64().expect("batch") as usize,
                ..SessionOptions::default()
            };
            let c = compile_onnx(&model, &so, &oo).unwrap_or_else(|e| panic!("{what}: {e}"));
            let e = c
                .target
                .estimate()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(e.fits && e.samples_per_second > 0.0, "{what}");
        }
    }
}

#[test]
fn weight_free_forms_import_but_refuse_numerics() {
    for file in ["stripped.onnx", "light_cnn.onnx"] {
        let model = load(file);
        let mut g: Graph<Heap> = Graph::new();
        let imp = import(&model, &mut g, &ImportOptions::default()).expect("imports");
        assert_eq!(imp.outputs[0].dims, vec![2, 10], "{file}");
        let x = tensor("cnn.input.json");
        let err = run_onnx(&model, &[x]).expect_err(file);
        let SessionError::Onnx(OnnxError::NoWeights { tensor, .. }) = &err else {
            panic!("{file}: {err:?}");
        };
        let text = err.to_string();
        assert!(
            text.contains(tensor.as_str()) && text.contains("numerics need the weights"),
            "{text}"
        );
        assert!(!text.contains('\n'));
    }
}

#[test]
fn bad_models_fail_with_a_typed_error_naming_the_culprit() {
    let e = import(
        &load("unsupported_op.onnx"),
        &mut Graph::new(),
        &ImportOptions::default(),
    )
    .expect_err("Det");
    let OnnxError::Unsupported {
        node, op, opset, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!((node.as_str(), op.as_str(), *opset), ("my_det", "Det", 17));
    assert!(e.to_string().contains("supported ops: Abs, Add"), "{e}");
    // A variant of a supported op says what is not read, without the list.
    let peepholes = dir().join("../onnx_node/test_lstm_with_peepholes/model.onnx");
    let e = import(
        &OnnxModel::load(&peepholes).unwrap(),
        &mut Graph::new(),
        &ImportOptions::default(),
    )
    .expect_err("peepholes");
    let text = e.to_string();
    assert!(
        matches!(e, OnnxError::Unsupported { .. })
            && text.contains("LSTM (opset 22) is not supported (")
            && !text.contains("supported ops"),
        "{text}"
    );

    // Three unsupported op types: one error names them all, with their counts.
    let e = import(
        &load("unsupported_ops.onnx"),
        &mut Graph::new(),
        &ImportOptions::default(),
    )
    .expect_err("Det, NonZero, MyOp");
    let OnnxError::UnsupportedOps { ops } = &e else {
        panic!("{e:?}")
    };
    let got: Vec<(&str, usize, &str)> = ops
        .iter()
        .map(|o| (o.op.as_str(), o.nodes, o.first.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("Det", 2, "det_a"),
            ("NonZero", 1, "nonzero"),
            ("com.example.MyOp", 1, "custom")
        ]
    );
    assert!(
        e.to_string().starts_with("3 op types are not supported"),
        "{e}"
    );

    let e = import(
        &load("dynamic_batch.onnx"),
        &mut Graph::new(),
        &ImportOptions::default(),
    )
    .expect_err("symbolic batch");
    assert!(
        matches!(&e, OnnxError::UnboundDim { input, axis: 0, param, .. } if input == "x" && param == "batch"),
        "{e:?}"
    );
    let bound = ImportOptions {
        batch_size: Some(3),
        ..ImportOptions::default()
    };
    let imp = import(&load("dynamic_batch.onnx"), &mut Graph::new(), &bound).expect("binds");
    assert_eq!(imp.outputs[0].dims, vec![3, 3]);

    let e = OnnxModel::load(&dir().join("old_opset.onnx")).expect_err("opset 5");
    assert!(matches!(e, OnnxError::Opset { opset: 5, .. }), "{e:?}");

    let bytes = std::fs::read(dir().join("cnn.onnx")).unwrap();
    let cut = &bytes[..bytes.len() / 2];
    let e = OnnxModel::from_bytes(cut, &PathBuf::from("cut.onnx")).expect_err("truncated");
    assert!(
        matches!(e, OnnxError::Decode { .. }) && e.to_string().contains("truncated"),
        "{e}"
    );
    let e = OnnxModel::from_bytes(b"name,value\n1,2\n", &PathBuf::from("x.onnx")).expect_err("csv");
    assert!(
        e.to_string().contains("not an ONNX model") && e.to_string().contains("byte 0"),
        "{e}"
    );
}

#[test]
fn inference_folds_each_batch_norm_into_the_convolution_before_it() {
    use tessera_host::estimation::{estimate, EstimateOptions, ModelSource};
    use tessera_sim::techniques::Techniques;
    let model = load("cnn.onnx");
    // The norms an import keeps, and the graph's size.
    let import_with = |training: bool, inference_rewrites: bool| {
        let mut g: Graph<Heap> = Graph::new();
        let options = ImportOptions {
            training,
            techniques: Techniques {
                inference_rewrites,
                ..Techniques::default()
            },
            ..ImportOptions::default()
        };
        let imported = import(&model, &mut g, &options).expect("imports");
        let norms = imported
            .layers
            .iter()
            .filter(|l| l.op == "BatchNormalization")
            .count();
        (norms, g.nodes().len())
    };
    let (folded, rewritten) = import_with(false, true);
    let (kept, as_written) = import_with(false, false);
    assert_eq!((folded, kept), (0, 2));
    assert!(
        rewritten < as_written,
        "{rewritten} graph nodes, {as_written} without"
    );
    // Training normalises with the batch's statistics: nothing folds.
    assert_eq!(import_with(true, true).0, 2);
    // The folded graph's outputs are onnxruntime's (`outputs_equal_onnxruntime` runs it); its
    // estimate drops the norms' passes.
    let cycles = |no_inference_rewrites: bool| {
        let o = EstimateOptions {
            inference: true,
            no_inference_rewrites,
            ..EstimateOptions::default()
        };
        let e = estimate(&ModelSource::OnnxFile(dir().join("cnn.onnx")), &o).expect("estimates");
        e.summary.cycles_per_step
    };
    assert!(cycles(false) < cycles(true));
}

/// `tessera run` binds every symbolic axis of an input from the array given for it, as
/// onnxruntime does, not only the batch: `window1d.onnx` (1-D convolutions and pooling over
/// `[2, 4, 11]`) with its length made a symbol runs on arrays of length 11 (the fixture's
/// values) and 17.
#[test]
fn run_binds_every_symbolic_axis_from_its_inputs() {
    use prost::Message as _;
    use tessera_host::onnx::proto::{tensor_shape_proto::dimension::Value as D, type_proto};
    let case = manifest()["numerics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "window1d")
        .cloned()
        .expect("window1d");
    let path = dir().join("window1d.onnx");
    let mut proto = load("window1d.onnx").proto;
    let input = &mut proto.graph.as_mut().unwrap().input[0];
    let Some(type_proto::Value::TensorType(t)) = input.r#type.as_mut().unwrap().value.as_mut()
    else {
        panic!("a tensor input")
    };
    t.shape.as_mut().unwrap().dim[2].value = Some(D::DimParam("length".into()));
    let model = OnnxModel::from_bytes(&proto.encode_to_vec(), &path).unwrap();
    let x = tensor(case["inputs"][0]["file"].as_str().unwrap());
    let got = run_onnx(&model, std::slice::from_ref(&x)).expect("runs at length 11");
    let fixed = run_onnx(&load("window1d.onnx"), std::slice::from_ref(&x)).unwrap();
    for (a, b) in got.iter().zip(&fixed) {
        assert_eq!(
            (a.dims.clone(), &a.data),
            (b.dims.clone(), &b.data),
            "{}",
            a.name
        );
    }
    let longer = NamedTensor {
        name: x.name.clone(),
        dims: vec![2, 4, 17],
        data: (0..2 * 4 * 17).map(|v| (v % 7) as f32 / 7.0).collect(),
    };
    let got = run_onnx(&model, &[longer]).expect("runs at length 17");
    assert!(
        got.iter().all(|t| t.dims.len() == 3 && t.dims[0] == 2),
        "{:?}",
        got.iter().map(|t| &t.dims).collect::<Vec<_>>()
    );
    assert!(got.iter().any(|t| t.dims[2] > fixed[0].dims[2]));
}

/// Every numerics fixture also estimates for inference, at the file's batch: what `run`
/// computes (run-time If conditions, computed Clip bounds, wide pools, ...) the estimator lays
/// out, prices and fits.
#[test]
fn numerics_fixtures_estimate() {
    let m = manifest();
    for case in m["numerics"].as_array().unwrap() {
        let file = dir().join(case["file"].as_str().unwrap());
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args([
                "estimate",
                file.to_str().unwrap(),
                "--inference",
                "--no-search",
            ])
            .output()
            .expect("runs tessera");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("fits: yes"),
            "{}: {}{}",
            file.display(),
            out,
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// An array whose size differs from the file's where it fixes a dimension is refused naming
/// the input, its shape and the axis, not by the first op it would reach (`dynamic_batch.onnx`
/// is `[batch, 4]`: a `[3, 5]` array).
#[test]
fn run_names_the_input_whose_fixed_axis_differs() {
    let x = NamedTensor {
        name: "x".into(),
        dims: vec![3, 5],
        data: vec![0.5; 15],
    };
    let e = run_onnx(&load("dynamic_batch.onnx"), &[x])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`x` is [3, 5]") && e.contains("axis 1 is fixed at 4"),
        "{e}"
    );
}
