//! Inference rewrites: what inference compilers do to a graph before they compile it.
//! PopRT's and onnxruntime's graph optimisers fold a `BatchNormalization` that reads a
//! `Conv`'s only output into the convolution: with `s = scale / sqrt(var + epsilon)`, the
//! weights become `W[c] * s[c]` and the bias `(b[c] - mean[c]) * s[c] + B[c]`, so the norm's
//! pass over the activations is gone and the convolution adds one bias instead.
//!
//! The folded norm becomes an `Identity` of the convolution's output, so the graph keeps
//! its nodes, their names and their order (stage boundaries and `ipu` attributes read the
//! file's nodes). Where the weights are in the file, the folded values are computed; where
//! they are not (a weight-free export, a light model's placeholders), the convolution keeps
//! its weight tensor and takes a bias of the norm's shape: the shapes are what estimates
//! read.

use std::collections::HashMap;

use super::super::consts::{decode, Elem};
use super::super::proto::{GraphProto, NodeProto, TensorProto};
use super::OnnxModel;

/// The ONNX element type FLOAT.
const FLOAT: i32 = 1;

/// `model` with every batch norm that can be folded into the convolution before it folded,
/// or `None` when none can.
pub(super) fn fold_batch_norms(model: &OnnxModel) -> Option<OnnxModel> {
    let graph = model.graph();
    let folds = foldable(graph);
    if folds.is_empty() {
        return None;
    }
    let mut g = graph.clone();
    for (conv, norm) in folds {
        fold(&mut g, conv, norm);
    }
    let mut folded = model.clone();
    folded.proto.graph = Some(g);
    Some(folded)
}

/// Whether `n` is `op` of the default domain.
fn is(n: &NodeProto, op: &str) -> bool {
    n.op_type.as_deref() == Some(op)
        && matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx"))
}

/// An integer attribute of `n`, or `default`.
fn attr_i(n: &NodeProto, name: &str, default: i64) -> i64 {
    n.attribute
        .iter()
        .find(|a| a.name.as_deref() == Some(name))
        .and_then(|a| a.i)
        .unwrap_or(default)
}

/// The (convolution, norm) node pairs that fold: a norm in inference mode with one output,
/// whose input is a convolution's output that nothing else reads, with the norm's four
/// parameters and the convolution's weights and bias given as weights (initializers, or a
/// light model's `ConstantOfShape` placeholders).
fn foldable(graph: &GraphProto) -> Vec<(usize, usize)> {
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for n in &graph.node {
        for i in n.input.iter().filter(|i| !i.is_empty()) {
            *readers.entry(i.as_str()).or_default() += 1;
        }
    }
    for o in &graph.output {
        *readers.entry(o.name.as_deref().unwrap_or("")).or_default() += 1;
    }
    let producer: HashMap<&str, usize> = graph
        .node
        .iter()
        .enumerate()
        .flat_map(|(k, n)| n.output.iter().map(move |o| (o.as_str(), k)))
        .collect();
    let weight = |name: &str| {
        graph
            .initializer
            .iter()
            .any(|t| t.name.as_deref() == Some(name))
            || producer
                .get(name)
                .is_some_and(|&k| is(&graph.node[k], "ConstantOfShape"))
    };
    let mut out = Vec::new();
    for (k, n) in graph.node.iter().enumerate() {
        let one_output = n.output.iter().skip(1).all(String::is_empty);
        if !is(n, "BatchNormalization")
            || n.input.len() != 5
            || !one_output
            || attr_i(n, "training_mode", 0) != 0
            || attr_i(n, "spatial", 1) != 1
            || !n.input[1..].iter().all(|i| weight(i))
        {
            continue;
        }
        let Some(&c) = producer.get(n.input[0].as_str()) else {
            continue;
        };
        let conv = &graph.node[c];
        let bias_ok = conv.input.get(2).is_none_or(|b| b.is_empty() || weight(b));
        if is(conv, "Conv")
            && readers.get(n.input[0].as_str()) == Some(&1)
            && conv.input.get(1).is_some_and(|w| weight(w))
            && bias_ok
        {
            out.push((c, k));
        }
    }
    out
}

/// The initializer called `name`, if it is one.
fn initializer<'g>(graph: &'g GraphProto, name: &str) -> Option<&'g TensorProto> {
    graph
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some(name))
}

/// The float values of initializer `name`, when the file holds them.
fn values(graph: &GraphProto, name: &str) -> Option<(Vec<i64>, Vec<f64>)> {
    let t = initializer(graph, name).filter(|t| t.data_type == Some(FLOAT))?;
    let count = t.dims.iter().product::<i64>().max(0) as usize;
    decode(t, Elem::F32, count)
        .ok()
        .map(|v| (t.dims.clone(), v))
}

/// A name no tensor of `graph` has, from `base`.
fn fresh(graph: &GraphProto, base: &str) -> String {
    let taken = |n: &str| {
        graph
            .initializer
            .iter()
            .any(|t| t.name.as_deref() == Some(n))
            || graph.node.iter().any(|x| x.output.iter().any(|o| o == n))
            || graph.input.iter().any(|i| i.name.as_deref() == Some(n))
    };
    let mut name = base.to_string();
    let mut k = 1;
    while taken(&name) {
        name = format!("{base}_{k}");
        k += 1;
    }
    name
}

/// A float initializer.
fn float_tensor(name: String, dims: Vec<i64>, values: &[f64]) -> TensorProto {
    TensorProto {
        name: Some(name),
        dims,
        data_type: Some(FLOAT),
        float_data: values.iter().map(|&v| v as f32).collect(),
        ..TensorProto::default()
    }
}

/// The folded weights and bias as new initializers, when the file holds every value they
/// are made from; returns their names.
fn folded_values(g: &mut GraphProto, conv: usize, norm: usize) -> Option<(String, String)> {
    let (c, n) = (&g.node[conv], &g.node[norm]);
    let epsilon = n
        .attribute
        .iter()
        .find(|a| a.name.as_deref() == Some("epsilon"))
        .and_then(|a| a.f)
        .unwrap_or(1e-5);
    let (wdims, w) = values(g, &c.input[1])?;
    let param = |i: usize| values(g, &n.input[i]).map(|(_, v)| v);
    let (scale, beta, mean, var) = (param(1)?, param(2)?, param(3)?, param(4)?);
    let channels = scale.len();
    let bias = match c.input.get(2).filter(|b| !b.is_empty()) {
        Some(b) => values(g, b)?.1,
        None => vec![0.0; channels],
    };
    let per = w.len() / channels.max(1);
    let lens = [beta.len(), mean.len(), var.len(), bias.len()];
    if wdims.first() != Some(&(channels as i64)) || lens.iter().any(|&l| l != channels) {
        return None;
    }
    let s: Vec<f64> = (0..channels)
        .map(|k| scale[k] / (var[k] + f64::from(epsilon)).sqrt())
        .collect();
    let w2: Vec<f64> = w.iter().enumerate().map(|(i, v)| v * s[i / per]).collect();
    let b2: Vec<f64> = (0..channels)
        .map(|k| (bias[k] - mean[k]) * s[k] + beta[k])
        .collect();
    let wname = fresh(g, &format!("{}_bn_folded", c.input[1]));
    let bname = fresh(g, &format!("{}_bias_bn_folded", n.output[0]));
    g.initializer.push(float_tensor(wname.clone(), wdims, &w2));
    g.initializer
        .push(float_tensor(bname.clone(), vec![channels as i64], &b2));
    Some((wname, bname))
}

/// Folds norm node `norm` into convolution node `conv` of `g`.
fn fold(g: &mut GraphProto, conv: usize, norm: usize) {
    let (weights, bias) = folded_values(g, conv, norm).unwrap_or_else(|| {
        // Without the values: the same weight tensor, and a bias of the norm's shape.
        let c = &g.node[conv];
        let bias = match c.input.get(2).filter(|b| !b.is_empty()) {
            Some(b) => b.clone(),
            None => g.node[norm].input[2].clone(),
        };
        (c.input[1].clone(), bias)
    });
    let c = &mut g.node[conv];
    c.input.truncate(2);
    c.input[1] = weights;
    c.input.push(bias);
    let n = &mut g.node[norm];
    n.op_type = Some("Identity".into());
    n.domain = None;
    n.input.truncate(1);
    n.output.truncate(1);
    // Only the placement attributes stay (`__ipu_number`, `__pipeline_stage`).
    n.attribute
        .retain(|a| a.name.as_deref().is_some_and(|s| s.starts_with("__")));
}

#[cfg(test)]
mod tests {
    use super::super::super::proto::{AttributeProto, ModelProto, OperatorSetIdProto};
    use super::*;

    fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
        NodeProto {
            op_type: Some(op.into()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            name: Some(output.into()),
            ..NodeProto::default()
        }
    }

    fn init(name: &str, dims: &[i64], v: &[f64]) -> TensorProto {
        float_tensor(name.into(), dims.to_vec(), v)
    }

    /// x -> Conv(w, b) -> BatchNormalization -> y, with 2 output channels of a 1x1 kernel
    /// over 1 input channel; `more` adds a second reader of the convolution's output.
    fn model(more: bool) -> OnnxModel {
        let mut norm = node("BatchNormalization", &["c", "s", "beta", "m", "v"], "y");
        norm.attribute.push(AttributeProto {
            name: Some("epsilon".into()),
            f: Some(0.5),
            ..AttributeProto::default()
        });
        let mut nodes = vec![node("Conv", &["x", "w", "b"], "c"), norm];
        if more {
            nodes.push(node("Relu", &["c"], "r"));
        }
        let graph = GraphProto {
            node: nodes,
            initializer: vec![
                init("w", &[2, 1, 1, 1], &[2.0, -3.0]),
                init("b", &[2], &[1.0, 0.5]),
                init("s", &[2], &[1.5, 2.0]),
                init("beta", &[2], &[0.25, -1.0]),
                init("m", &[2], &[0.5, 1.0]),
                init("v", &[2], &[3.5, 1.5]),
            ],
            ..GraphProto::default()
        };
        OnnxModel {
            path: "m.onnx".into(),
            proto: ModelProto {
                graph: Some(graph),
                opset_import: vec![OperatorSetIdProto {
                    domain: None,
                    version: Some(17),
                }],
                ..ModelProto::default()
            },
            opset: 17,
        }
    }

    #[test]
    fn the_folded_convolution_computes_what_the_norm_of_the_convolution_did() {
        let folded = fold_batch_norms(&model(false)).expect("folds");
        let g = folded.graph();
        assert_eq!(g.node[0].input, ["x", "w_bn_folded", "y_bias_bn_folded"]);
        assert_eq!(g.node[1].op_type.as_deref(), Some("Identity"));
        assert_eq!(g.node[1].input, ["c"]);
        assert!(g.node[1].attribute.is_empty());
        let (_, w) = values(g, "w_bn_folded").unwrap();
        let (_, b) = values(g, "y_bias_bn_folded").unwrap();
        // For each channel and input value x: BN(conv(x)) = conv'(x).
        let (wc, bc, s, beta, m, v) = (
            [2.0, -3.0],
            [1.0, 0.5],
            [1.5, 2.0],
            [0.25, -1.0],
            [0.5, 1.0],
            [3.5, 1.5],
        );
        for c in 0..2 {
            for x in [-2.0, 0.0, 0.75, 3.0] {
                let conv = wc[c] * x + bc[c];
                let norm = (conv - m[c]) / (v[c] + 0.5f64).sqrt() * s[c] + beta[c];
                let fused = w[c] * x + b[c];
                assert!((norm - fused).abs() < 1e-6, "channel {c}, x {x}");
            }
        }
    }

    #[test]
    fn a_convolution_output_read_twice_or_a_training_norm_does_not_fold() {
        assert!(fold_batch_norms(&model(true)).is_none());
        let mut training = model(false);
        let g = training.proto.graph.as_mut().unwrap();
        g.node[1].attribute.push(AttributeProto {
            name: Some("training_mode".into()),
            i: Some(1),
            ..AttributeProto::default()
        });
        assert!(fold_batch_norms(&training).is_none());
    }

    #[test]
    fn without_the_values_the_convolution_keeps_its_weights_and_takes_a_bias_of_the_norms_shape() {
        let mut m = model(false);
        let g = m.proto.graph.as_mut().unwrap();
        // A weight-free export: the convolution's weights are stored elsewhere, and it has no
        // bias of its own.
        g.initializer[0].float_data.clear();
        g.initializer[0].data_location = Some(1);
        g.node[0].input.truncate(2);
        let folded = fold_batch_norms(&m).expect("folds");
        assert_eq!(folded.graph().node[0].input, ["x", "w", "beta"]);
    }
}
