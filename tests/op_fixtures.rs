//! The reference kernels against an independent implementation: every case in
//! `tests/fixtures/ops/` (inputs and outputs computed by onnxruntime, or numpy for batch-norm
//! training, by `scripts/make_op_fixtures.py`) is rebuilt as a graph, run by the core, and
//! compared within 1e-5 relative.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;
use tessera::core::ops::conv::{ConvParams, DataLayout, Padding};
use tessera::core::ops::elementwise::{BinaryFn, GeluForm, UnaryFn};
use tessera::core::ops::norm::BatchNorm;
use tessera::core::ops::pool::{PoolKind, PoolParams};
use tessera::core::ops::reduce::ReduceKind;
use tessera::core::{DType, Graph, LstmStates, NodeId, Plan};
use tessera::sim::Heap;

struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
    dtype: String,
}

struct Fixture {
    attrs: Value,
    inputs: HashMap<String, Tensor>,
    outputs: Vec<(String, Tensor)>,
}

fn tensors(v: &Value) -> Vec<(String, Tensor)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let shape = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let data = t["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let dtype = t["dtype"].as_str().unwrap_or("f32").to_string();
            (
                t["name"].as_str().unwrap().to_string(),
                Tensor { shape, data, dtype },
            )
        })
        .collect()
}

fn load(case: &str) -> Fixture {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/ops/{case}.json"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    Fixture {
        attrs: v["attrs"].clone(),
        inputs: tensors(&v["inputs"]).into_iter().collect(),
        outputs: tensors(&v["outputs"]),
    }
}

/// A graph under test: its fixture's inputs as graph inputs (integers as i32, booleans as u8).
struct Case {
    f: Fixture,
    g: Graph<Heap>,
    ids: HashMap<String, NodeId>,
    state: Vec<(String, Vec<f32>)>,
}

impl Case {
    fn new(case: &str) -> Case {
        let f = load(case);
        let mut g = Graph::new();
        let mut ids = HashMap::new();
        let mut names: Vec<&String> = f.inputs.keys().collect();
        names.sort();
        for name in names {
            let t = &f.inputs[name];
            let dtype = match t.dtype.as_str() {
                "i64" | "i32" => DType::I32,
                "bool" => DType::U8,
                _ => DType::F32,
            };
            ids.insert(name.clone(), g.input(name, &t.shape, dtype).unwrap());
        }
        Case {
            f,
            g,
            ids,
            state: Vec::new(),
        }
    }

    fn id(&self, name: &str) -> NodeId {
        self.ids[name]
    }

    fn attr(&self, key: &str) -> Vec<u32> {
        self.f.attrs[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    }

    /// Sets a variable the graph made (by name) from a fixture input.
    fn set(&mut self, var: &str, input: &str) {
        self.state
            .push((var.to_string(), self.f.inputs[input].data.clone()));
    }

    /// Runs every node (updates included) and compares `outputs` (fixture name, node).
    fn check(mut self, outputs: &[(&str, NodeId)]) {
        for (_, id) in outputs {
            self.g.mark_output(*id).unwrap();
        }
        let plan = Plan::new(&self.g).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, 0).unwrap();
        for (var, values) in &self.state {
            plan.write_state(var.as_str(), &mut state, values).unwrap();
        }
        for (name, t) in &self.f.inputs {
            plan.write_input(name.as_str(), &mut arena, &t.data)
                .unwrap();
        }
        for i in 0..self.g.len() {
            plan.run_node(i, &mut arena, &mut state).unwrap();
        }
        for (name, id) in outputs {
            let want = &self.f.outputs.iter().find(|(n, _)| n == name).unwrap().1;
            let got = plan.tensor(*id, &arena, &state).unwrap();
            assert_eq!(
                got.shape()
                    .dims()
                    .iter()
                    .map(|&d| d as usize)
                    .collect::<Vec<_>>(),
                want.shape,
                "{name}: shape"
            );
            for (i, (a, e)) in got.iter().zip(&want.data).enumerate() {
                assert!(
                    (a - e).abs() <= 1e-5 * e.abs().max(1.0),
                    "{name}[{i}]: {a} vs {e}"
                );
            }
        }
    }
}

fn conv(case: &str) {
    let mut c = Case::new(case);
    let layout = if c.f.attrs["layout"] == "NHWC" {
        DataLayout::Nhwc
    } else {
        DataLayout::Nchw
    };
    let (s, d, pads) = (c.attr("strides"), c.attr("dilations"), c.attr("pads"));
    let p = ConvParams::new(layout)
        .stride(s[0], s[1])
        .dilation(d[0], d[1])
        .groups(c.f.attrs["group"].as_u64().unwrap() as u32);
    let padding = if c.f.attrs["padding"] == "same" {
        Padding::Same
    } else {
        Padding::Explicit([pads[0], pads[1], pads[2], pads[3]])
    };
    let (x, w) = (c.id("x"), c.id("w"));
    let mut y = c.g.conv2d("conv", x, w, p, padding).unwrap();
    if c.f.inputs.contains_key("bias") {
        let b = c.id("bias");
        let o = c.f.inputs["bias"].shape[0];
        let b = match layout {
            DataLayout::Nhwc => b,
            DataLayout::Nchw => c.g.reshape("bias_view", b, &[o, 1, 1]).unwrap(),
        };
        y = c.g.add("y", y, b).unwrap();
    }
    c.check(&[("y", y)]);
}

#[test]
fn convolutions() {
    for case in [
        "conv_basic",
        "conv_stride_pad",
        "conv_same",
        "conv_dilation",
        "conv_groups",
        "conv_depthwise",
        "conv_1x1",
        "conv_nhwc",
        "conv_nhwc_depthwise",
    ] {
        conv(case);
    }
}

#[test]
fn pooling() {
    for case in [
        "maxpool_2x2",
        "maxpool_3x3_pad",
        "avgpool_3x3_pad_exclude",
        "avgpool_3x3_pad_include",
    ] {
        let mut c = Case::new(case);
        let (k, s, pads) = (c.attr("kernel_shape"), c.attr("strides"), c.attr("pads"));
        let kind = if case.starts_with("max") {
            PoolKind::Max
        } else {
            PoolKind::Average {
                count_include_pad: c.f.attrs["count_include_pad"] == 1,
            }
        };
        let p = PoolParams::new(kind, DataLayout::Nchw, [k[0], k[1]], [s[0], s[1]]);
        let x = c.id("x");
        let y =
            c.g.pool2d(
                "y",
                x,
                p,
                Padding::Explicit([pads[0], pads[1], pads[2], pads[3]]),
            )
            .unwrap();
        c.check(&[("y", y)]);
    }
    let mut c = Case::new("globalavgpool");
    let x = c.id("x");
    let y =
        c.g.global_average_pool("y", x, DataLayout::Nchw, true)
            .unwrap();
    c.check(&[("y", y)]);
}

#[test]
fn normalisation() {
    let mut c = Case::new("batchnorm_inference");
    let x = c.id("x");
    let bn = BatchNorm {
        axis: 1,
        epsilon: 1e-5,
        momentum: 0.9,
        training: false,
    };
    let y = c.g.batch_norm("bn", x, bn).unwrap();
    for (v, i) in [
        ("bn/gamma:0", "scale"),
        ("bn/beta:0", "bias"),
        ("bn/moving_mean:0", "mean"),
        ("bn/moving_variance:0", "var"),
    ] {
        c.set(v, i);
    }
    c.check(&[("y", y)]);

    let mut c = Case::new("batchnorm_training");
    let x = c.id("x");
    let bn = BatchNorm {
        axis: 1,
        epsilon: 1e-3,
        momentum: 0.9,
        training: true,
    };
    let y = c.g.batch_norm("bn", x, bn).unwrap();
    for (v, i) in [
        ("bn/gamma:0", "scale"),
        ("bn/beta:0", "bias"),
        ("bn/moving_mean:0", "running_mean"),
        ("bn/moving_variance:0", "running_var"),
    ] {
        c.set(v, i);
    }
    let (m, v) = (
        c.g.find("bn/moving_mean:0").unwrap(),
        c.g.find("bn/moving_variance:0").unwrap(),
    );
    c.check(&[("y", y), ("running_mean_out", m), ("running_var_out", v)]);

    for (case, axes) in [("layernorm_last", 1), ("layernorm_last2", 2)] {
        let mut c = Case::new(case);
        let x = c.id("x");
        let y = c.g.layer_norm("ln", x, axes, 1e-5).unwrap();
        c.set("ln/gamma:0", "scale");
        c.set("ln/beta:0", "bias");
        c.check(&[("y", y)]);
    }

    let mut c = Case::new("groupnorm");
    let x = c.id("x");
    let y = c.g.group_norm("gn", x, 3, DataLayout::Nchw, 1e-5).unwrap();
    c.set("gn/gamma:0", "scale");
    c.set("gn/beta:0", "bias");
    c.check(&[("y", y)]);
}

#[test]
fn attention_and_matmuls() {
    let mut c = Case::new("attention");
    let (q, k, v, mask) = (c.id("q"), c.id("k"), c.id("v"), c.id("mask"));
    let s = c.g.matmul_t("scores", q, k, false, true).unwrap();
    let s = c.g.scale("scaled", s, 0.5).unwrap();
    let s = c.g.add("masked", s, mask).unwrap();
    let p = c.g.softmax_axis("probs", s, -1).unwrap();
    let y = c.g.matmul("y", p, v).unwrap();
    c.check(&[("y", y), ("probs", p)]);

    for case in ["batched_matmul_broadcast", "batched_matmul_broadcast2"] {
        let mut c = Case::new(case);
        let (a, b) = (c.id("a"), c.id("b"));
        let y = c.g.matmul("y", a, b).unwrap();
        c.check(&[("y", y)]);
    }
}

#[test]
fn elementwise_softmax_and_layout() {
    for (case, form) in [("gelu_erf", GeluForm::Erf), ("gelu_tanh", GeluForm::Tanh)] {
        let mut c = Case::new(case);
        let x = c.id("x");
        let y = c.g.unary("y", x, UnaryFn::Gelu(form)).unwrap();
        c.check(&[("y", y)]);
    }
    let mut c = Case::new("clip_relu6");
    let x = c.id("x");
    let y =
        c.g.unary("y", x, UnaryFn::Clip { min: 0.0, max: 6.0 })
            .unwrap();
    c.check(&[("y", y)]);

    let mut c = Case::new("softmax_axis1");
    let x = c.id("x");
    let y = c.g.softmax_axis("y", x, 1).unwrap();
    c.check(&[("y", y)]);

    for case in ["transpose_0213", "transpose_3102"] {
        let mut c = Case::new(case);
        let perm: Vec<usize> = case[10..]
            .chars()
            .map(|d| d as usize - '0' as usize)
            .collect();
        let x = c.id("x");
        let y = c.g.transpose("y", x, &perm).unwrap();
        c.check(&[("y", y)]);
    }

    let mut c = Case::new("reduce_mean_axes");
    let x = c.id("x");
    let y = c.g.reduce("y", x, &[1, 3], true, ReduceKind::Mean).unwrap();
    c.check(&[("y", y)]);
    let mut c = Case::new("reduce_max_axes");
    let x = c.id("x");
    let y = c.g.reduce("y", x, &[0, 2], false, ReduceKind::Max).unwrap();
    c.check(&[("y", y)]);

    let mut c = Case::new("gather_embedding");
    let (t, i) = (c.id("table"), c.id("indices"));
    let y = c.g.gather("y", t, i).unwrap();
    c.check(&[("y", y)]);

    let mut c = Case::new("elementwise_broadcast");
    let (x, y, px, py) = (c.id("x"), c.id("y"), c.id("px"), c.id("py"));
    let mut outs = Vec::new();
    for (name, f) in [
        ("add", BinaryFn::Add),
        ("sub", BinaryFn::Sub),
        ("mul", BinaryFn::Mul),
        ("div", BinaryFn::Div),
    ] {
        outs.push((name, c.g.binary(name, x, y, f).unwrap()));
    }
    outs.push(("pow", c.g.binary("pow", px, py, BinaryFn::Pow).unwrap()));
    c.check(&outs);

    let mut c = Case::new("where_mask");
    let (cond, a, b) = (c.id("cond"), c.id("a"), c.id("b"));
    let y = c.g.select("y", cond, a, b).unwrap();
    c.check(&[("y", y)]);
}

#[test]
fn lstm_in_the_onnx_layout() {
    let mut c = Case::new("lstm");
    let (x, w, r, b, h, cc) = (
        c.id("X"),
        c.id("W"),
        c.id("R"),
        c.id("B"),
        c.id("initial_h"),
        c.id("initial_c"),
    );
    let initial = LstmStates {
        hidden: Some(h),
        cell: Some(cc),
    };
    let out = c.g.lstm_onnx("lstm", x, w, r, Some(b), initial).unwrap();
    c.check(&[("Y", out.sequence), ("Y_h", out.hidden), ("Y_c", out.cell)]);

    let mut c = Case::new("lstm_no_init");
    let (x, w, r) = (c.id("X"), c.id("W"), c.id("R"));
    let out =
        c.g.lstm_onnx("lstm", x, w, r, None, LstmStates::default())
            .unwrap();
    c.check(&[("Y", out.sequence), ("Y_h", out.hidden), ("Y_c", out.cell)]);
}
