#!/usr/bin/env python3
"""Write ONNX model fixtures for the ONNX importer to tests/fixtures/onnx/.

Two kinds of small models, all built with onnx.helper and numpy (no exporter):

* Numerics models, with every weight embedded (initializers with raw_data), a
  reference input from a fixed numpy seed and onnxruntime's output for it:
  `cnn` (opset 17), `cnn_external` (the same model with its weights in an
  external data file, as large exports are saved), `cnn_opset20`,
  `transformer` (opset 17, two post-norm
  encoder layers), `transformer_opset14` (the same layers as older exporters
  wrote them: decomposed LayerNorm, tanh GELU, Constant nodes and Shape
  arithmetic), `lstm`, `lstm_noinit` (opset 17) and `gpt_block` (opset 20, as
  the dynamo exporter writes one GPT-2 block) and `cnn_opset9` (opset 9, with
  the attribute forms later versions replaced by inputs) and `matmul_fixed`
  (two inputs of fixed shapes, X[5, 3] and Y[3, 4]), `activations` (opset 18:
  the activations ONNX has as ops, PRelu, InstanceNormalization, Pad, Tile,
  Resize), `window1d` (1-D Conv and pooling), `conv_transpose` (2-D and
  1-D), `einsum`, `pad_crop` and
  `upsample_opset9`. Each model's intermediate
  shapes are stored as `value_info` (ONNX shape inference with data
  propagation, checked against the shapes onnxruntime computes), and every
  onnxruntime output is cross-checked against onnx's own numpy reference
  evaluator (onnx.reference).
* Models the importer must reject or import without weights:
  `unsupported_op` (a Det node named `my_det`), `dynamic_batch` (a
  symbolic batch dimension `batch`), `old_opset` (opset 5), `stripped` (weight
  bytes removed as data/onnx/export/strip.py removes them) and `light_cnn`
  (weights replaced by ConstantOfShape nodes, as in the "light" models the
  onnx package ships under onnx/backend/test/data/light/).

Every model passes onnx.checker.check_model(full_check=True). The stripped
model names an external file `__stripped__` that deliberately does not exist,
and the checker insists that external data files exist, so the script checks
it saved next to an empty file of that name in a temporary directory.
`manifest.json` lists the models, their input and output files and what each
error case must report; `README.md` describes the directory. Re-running the
script rewrites identical bytes.

Run it from the repository root, with the same pinned versions as the
operator fixtures:

    python3 -m venv .venv && .venv/bin/pip install -r scripts/requirements-fixtures.txt && .venv/bin/python scripts/make_onnx_fixtures.py

Tensor files (`NAME.input.json`, `NAME.output.json`) hold one tensor each in
the format of the operator fixtures' tensors (tests/fixtures/ops/, written by
scripts/make_op_fixtures.py), compact JSON with one trailing newline:

    {"name", "shape", "dtype", "data"}

"data" is flat and row-major; dtype is "f32", "i64" or "bool" (0/1 ints); every
float is the exact value of the float32 written as a double, so parsing it as
f64 and casting to f32 is exact. "name" is the graph input or output name.
"""

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator
from onnx.tools.replace_constants import replace_initializer_by_constant_of_shape

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "onnx"

ORT_SOURCE = f"onnxruntime {ort.__version__}"
PRODUCER = "tessera make_onnx_fixtures.py"

IR_VERSION = 10
F32 = np.float32
I64 = np.int64

# Each model file must stay below this many bytes.
MAX_MODEL_BYTES = 200_000

# One fixed seed per model (not derived from the order, so adding a model does
# not change the others). transformer_opset14 reuses transformer's weights and
# input on purpose, stripped and light_cnn reuse cnn's weights.
SEEDS = {
    "cnn": 1001,
    "cnn_opset20": 1002,
    "transformer": 1003,
    "lstm": 1004,
    "lstm_noinit": 1005,
    "gpt_block": 1006,
    "dynamic_batch": 1101,
    "old_opset": 1102,
    "cnn_opset9": 1007,
    "matmul_fixed": 1008,
    "activations": 1009,
    "upsample_opset9": 1010,
    "pad_crop": 1011,
    "pad_modes": 1015,
    "control_flow": 1016,
    "wide_pools": 1017,
    "clip_computed": 1018,
    "recurrent": 1019,
    "quantized": 1020,
    "cnn_opset6": 1021,
    "windows3d": 1022,
    "recurrent_batch_first": 1023,
    "window1d": 1012,
    "conv_transpose": 1013,
    "einsum": 1014,
}


# ---------------------------------------------------------------------------
# Helpers


def rng_for(key):
    return np.random.default_rng(SEEDS[key])


def uniform(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(F32)


def fan_in_uniform(rng, shape, fan_in, gain=1.0):
    """Uniform in +-gain/sqrt(fan_in), PyTorch's default bound for Linear and Conv."""
    bound = gain / math.sqrt(fan_in)
    return uniform(rng, shape, -bound, bound)


DTYPE_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.int64): "i64",
    np.dtype(np.bool_): "bool",
}

ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.bool_): TensorProto.BOOL,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.int32): TensorProto.INT32,
}


def tensor_json(name, arr):
    """One tensor in the operator fixtures' format."""
    arr = np.array(arr, order="C")  # keeps rank 0 (ascontiguousarray would not)
    dt = arr.dtype
    if dt not in DTYPE_NAMES:
        raise TypeError(f"{name}: unsupported dtype {dt}")
    flat = arr.reshape(-1)
    if dt == np.float32:
        if not np.all(np.isfinite(flat)):
            raise ValueError(f"{name}: non-finite value")
        data = [float(F32(v)) for v in flat]
    elif dt == np.bool_:
        data = [1 if v else 0 for v in flat]
    else:
        data = [int(v) for v in flat]
    return {
        "name": name,
        "shape": [int(d) for d in arr.shape],
        "dtype": DTYPE_NAMES[dt],
        "data": data,
    }


def write_json(path, value):
    text = json.dumps(value, indent=None, separators=(",", ":"), allow_nan=False) + "\n"
    path.write_text(text, encoding="utf-8")


class Builder:
    """Collects nodes and initializers; names outputs after their nodes."""

    def __init__(self):
        self.nodes = []
        self.initializers = []
        self.names = set()
        self.counts = {}

    def init(self, name, arr):
        """An initializer (raw_data embedded); returns its name."""
        if name in self.names:
            raise ValueError(f"duplicate tensor {name}")
        self.names.add(name)
        # np.array, not np.ascontiguousarray, which turns a scalar into shape [1].
        self.initializers.append(numpy_helper.from_array(np.array(arr, order="C"), name))
        return name

    def node_name(self, op_type, scope):
        key = f"{scope}/{op_type}"
        i = self.counts.get(key, 0)
        self.counts[key] = i + 1
        return key if i == 0 else f"{key}_{i}"

    def op(self, op_type, inputs, scope="", n_out=1, name=None, outputs=None, **attrs):
        """Adds a node; returns its output name (or the list of them if n_out > 1).

        Node names follow the PyTorch exporter's style (`scope/Op`, `scope/Op_1`)
        and outputs are `<node>_output_<i>` unless given."""
        name = name or self.node_name(op_type, scope)
        if outputs is None:
            outputs = [f"{name}_output_{i}" for i in range(n_out)]
        for o in outputs:
            if o in self.names:
                raise ValueError(f"duplicate tensor {o}")
            self.names.add(o)
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def const(self, value, dtype, scope=""):
        """A Constant node holding `value` (a scalar or list) as a `value` tensor attribute."""
        arr = np.array(value, dtype=dtype)
        name = self.node_name("Constant", scope)
        out = f"{name}_output_0"
        return self.op("Constant", [], name=name, outputs=[out],
                       value=numpy_helper.from_array(arr, out))


def value_info(name, dtype, shape):
    return helper.make_tensor_value_info(name, ONNX_TYPES[np.dtype(dtype)], shape)


def make_model(b, graph_name, inputs, outputs, opset, doc, ir_version=IR_VERSION):
    """`inputs` and `outputs` are value infos."""
    graph = helper.make_graph(b.nodes, graph_name, inputs, outputs,
                              initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=ir_version, producer_name=PRODUCER)
    model.doc_string = doc
    return model


def session(model):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Errors only: light_cnn's initializers listed as graph inputs draw a warning each.
    opts.log_severity_level = 3
    # Run the operators as written, without fusions into contrib kernels.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def check_close(name, got, want, rtol=1e-4, atol=1e-5):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        diff = np.max(np.abs(got - want)) if got.shape == want.shape else "shape"
        raise AssertionError(f"self-check failed for {name}: max diff {diff}")


def elem_dims(vi):
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    return t.elem_type, (dims if t.HasField("shape") else None)


def finish_numerics(name, model, feeds, reference=True):
    """Runs onnxruntime, fixes the output shapes, stores inferred value_info.

    `feeds` is a list of (input name, array). Returns (model, outputs) with
    outputs a list of (name, array). `reference=False` skips the cross-check with
    onnx.reference (for a model whose emit gives its own numpy check instead)."""
    onnx.checker.check_model(model, full_check=True)
    out_names = [o.name for o in model.graph.output]
    results = session(model).run(out_names, dict(feeds))
    outputs = []
    for o, res in zip(model.graph.output, results):
        res = np.asarray(res)
        if res.dtype != np.float32:
            raise TypeError(f"{name}: output {o.name} has dtype {res.dtype}")
        outputs.append((o.name, res))
    # An independent implementation: onnx's numpy reference evaluator.
    if reference:
        ref = ReferenceEvaluator(model).run(None, dict(feeds))
        for (oname, got), want in zip(outputs, ref):
            check_close(f"{name} {oname} (onnx.reference)", got, want, rtol=1e-4, atol=1e-5)

    # The declared output shapes are the computed ones; every intermediate shape
    # comes from ONNX shape inference (strict, with data propagation through
    # Shape arithmetic).
    for o, (_, res) in zip(model.graph.output, outputs):
        if elem_dims(o)[1] != list(res.shape):
            raise AssertionError(f"{name}: output {o.name} declared {elem_dims(o)[1]}, "
                                 f"computed {list(res.shape)}")
    model = shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                         data_prop=True)
    onnx.checker.check_model(model, full_check=True)

    # Every value_info must agree with what onnxruntime computes for that tensor.
    debug = onnx.ModelProto()
    debug.CopyFrom(model)
    debug.graph.output.extend(debug.graph.value_info)
    names = [o.name for o in debug.graph.output]
    values = session(debug).run(names, dict(feeds))
    n_shaped = -len(model.graph.output)
    for vi, val in zip(debug.graph.output, values):
        elem, dims = elem_dims(vi)
        val = np.asarray(val)
        if ONNX_TYPES.get(val.dtype) != elem:
            raise AssertionError(f"{name}: value_info {vi.name} type {elem} vs {val.dtype}")
        if dims is None:
            continue
        if None in dims:
            raise AssertionError(f"{name}: value_info {vi.name} has unknown dims {dims}")
        if list(val.shape) != dims:
            raise AssertionError(f"{name}: value_info {vi.name} {dims} vs {list(val.shape)}")
        n_shaped += 1
    if n_shaped != len(model.graph.value_info):
        raise AssertionError(f"{name}: some value_info without a shape")
    return model, outputs


# ---------------------------------------------------------------------------
# CNNs


def bn_params(rng, b, prefix, c):
    """Inference batch-norm parameters, all nonzero (PyTorch names)."""
    return [
        b.init(f"{prefix}.weight", uniform(rng, (c,), 0.5, 1.5)),
        b.init(f"{prefix}.bias", uniform(rng, (c,), -0.5, 0.5)),
        b.init(f"{prefix}.running_mean", uniform(rng, (c,), -0.5, 0.5)),
        b.init(f"{prefix}.running_var", uniform(rng, (c,), 0.5, 1.5)),
    ]


def cnn_model(fc_weight_as_constant=False):
    """cnn.onnx (opset 17): Conv-BN-Relu-MaxPool, grouped Conv-BN + residual,
    Conv 1x1, Clip as ReLU6, ReduceMean (axes attribute), Flatten, Gemm."""
    rng = rng_for("cnn")
    x = uniform(rng, (2, 3, 16, 16))
    b = Builder()
    w1 = b.init("conv1.weight", fan_in_uniform(rng, (8, 3, 3, 3), 27, 2.0))
    b1 = b.init("conv1.bias", fan_in_uniform(rng, (8,), 27))
    bn1 = bn_params(rng, b, "bn1", 8)
    # group=2: each group of 4 output channels sees 4 input channels.
    w2 = b.init("conv2.weight", fan_in_uniform(rng, (8, 4, 3, 3), 36, 2.0))
    b2 = b.init("conv2.bias", fan_in_uniform(rng, (8,), 36))
    bn2 = bn_params(rng, b, "bn2", 8)
    # A large gain so that some values pass 6 and ReLU6 clips at both ends.
    w3 = b.init("conv3.weight", fan_in_uniform(rng, (16, 8, 1, 1), 8, 6.0))
    b3 = b.init("conv3.bias", fan_in_uniform(rng, (16,), 8, 2.0))
    lo = b.init("relu6.min", np.array(0.0, dtype=F32))
    hi = b.init("relu6.max", np.array(6.0, dtype=F32))
    fc_w_value = fan_in_uniform(rng, (10, 16), 16)
    fc_b = b.init("fc.bias", fan_in_uniform(rng, (10,), 16))
    if fc_weight_as_constant:
        fc_w = b.op("Constant", [], name="fc.weight", outputs=["fc.weight"],
                    value=numpy_helper.from_array(fc_w_value, "fc.weight"))
    else:
        fc_w = b.init("fc.weight", fc_w_value)

    h = b.op("Conv", ["x", w1, b1], "conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             strides=[1, 1], dilations=[1, 1], group=1)
    h = b.op("BatchNormalization", [h] + bn1, "bn1", epsilon=1e-5, momentum=0.9)
    h = b.op("Relu", [h], "relu1")
    p = b.op("MaxPool", [h], "pool", kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    h = b.op("Conv", [p, w2, b2], "conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
             strides=[1, 1], group=2)
    h = b.op("BatchNormalization", [h] + bn2, "bn2", epsilon=1e-5, momentum=0.9)
    h = b.op("Add", [h, p], "residual")
    h = b.op("Relu", [h], "relu2")
    h = b.op("Conv", [h, w3, b3], "conv3", kernel_shape=[1, 1])
    h = b.op("Clip", [h, lo, hi], "relu6")
    h = b.op("ReduceMean", [h], "pool2", axes=[2, 3], keepdims=1)
    h = b.op("Flatten", [h], "flatten", axis=1)
    b.op("Gemm", [h, fc_w, fc_b], "fc", outputs=["logits"], alpha=1.0, beta=1.0, transB=1)

    model = make_model(b, "cnn", [value_info("x", F32, [2, 3, 16, 16])],
                       [value_info("logits", F32, [2, 10])], 17,
                       "Small CNN: Conv/BatchNorm/Relu/MaxPool, grouped Conv with a "
                       "residual Add, Conv 1x1, Clip(0, 6), ReduceMean over H and W, "
                       "Flatten, Gemm (transB=1) to 10 logits.")
    return model, [("x", x)]


def cnn_opset20_model():
    """cnn_opset20.onnx: Conv auto_pad SAME_UPPER with stride 2 (asymmetric
    padding), SiLU as Sigmoid/Mul, a depthwise Conv with dilation 2, AveragePool
    excluding pads, a squeeze-excitation block with GlobalAveragePool, ReduceMean
    with axes as an input, Gemm with alpha and beta.

    The dilated Conv has explicit pads: onnxruntime's CPU Conv rejects dilations
    together with auto_pad SAME_UPPER/SAME_LOWER ("Dilation not supported for
    AutoPadType::SAME_UPPER"), so no reference output could be made for both in
    one node."""
    rng = rng_for("cnn_opset20")
    x = uniform(rng, (2, 3, 16, 16))
    b = Builder()
    w1 = b.init("stem.weight", fan_in_uniform(rng, (8, 3, 3, 3), 27, 2.0))
    b1 = b.init("stem.bias", fan_in_uniform(rng, (8,), 27))
    w2 = b.init("dw.weight", fan_in_uniform(rng, (8, 1, 3, 3), 9, 2.0))
    b2 = b.init("dw.bias", fan_in_uniform(rng, (8,), 9))
    w_se1 = b.init("se.reduce.weight", fan_in_uniform(rng, (4, 8, 1, 1), 8, 2.0))
    b_se1 = b.init("se.reduce.bias", fan_in_uniform(rng, (4,), 8))
    w_se2 = b.init("se.expand.weight", fan_in_uniform(rng, (8, 4, 1, 1), 4, 2.0))
    b_se2 = b.init("se.expand.bias", fan_in_uniform(rng, (8,), 4))
    axes = b.init("pool.axes", np.array([2, 3], dtype=I64))
    fc_w = b.init("fc.weight", fan_in_uniform(rng, (8, 5), 8))  # [K, N]: transB=0
    fc_b = b.init("fc.bias", fan_in_uniform(rng, (5,), 8))

    # 16 in, stride 2 -> 8 out; total pad (8 - 1) * 2 + 3 - 16 = 1: 0 before, 1 after.
    h = b.op("Conv", ["x", w1, b1], "stem", kernel_shape=[3, 3], auto_pad="SAME_UPPER",
             strides=[2, 2])
    s = b.op("Sigmoid", [h], "stem/silu")
    h = b.op("Mul", [h, s], "stem/silu")
    h = b.op("Conv", [h, w2, b2], "dw", kernel_shape=[3, 3], dilations=[2, 2],
             pads=[2, 2, 2, 2], group=8)
    s = b.op("Sigmoid", [h], "dw/silu")
    h = b.op("Mul", [h, s], "dw/silu")
    h = b.op("AveragePool", [h], "avgpool", kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1], count_include_pad=0)
    g = b.op("GlobalAveragePool", [h], "se")
    g = b.op("Conv", [g, w_se1, b_se1], "se/reduce", kernel_shape=[1, 1])
    g = b.op("Relu", [g], "se")
    g = b.op("Conv", [g, w_se2, b_se2], "se/expand", kernel_shape=[1, 1])
    g = b.op("Sigmoid", [g], "se")
    h = b.op("Mul", [h, g], "se")
    h = b.op("ReduceMean", [h, axes], "pool", keepdims=0)
    b.op("Gemm", [h, fc_w, fc_b], "fc", outputs=["logits"], alpha=0.5, beta=2.0,
         transA=0, transB=0)

    model = make_model(b, "cnn_opset20", [value_info("x", F32, [2, 3, 16, 16])],
                       [value_info("logits", F32, [2, 5])], 20,
                       "Opset-20 CNN: Conv auto_pad SAME_UPPER (stride 2, pads 0 before "
                       "and 1 after), SiLU as Sigmoid/Mul, depthwise Conv with dilation 2, "
                       "AveragePool with count_include_pad=0, GlobalAveragePool "
                       "squeeze-excitation, ReduceMean with axes as an input "
                       "(keepdims=0), Gemm alpha=0.5 beta=2.")
    return model, [("x", x)]


def conv64(x, w, b, stride, dilation, pads, group):
    """Direct NCHW / OIHW convolution in float64 (self-checks only)."""
    n, c, hgt, wid = x.shape
    o, cg, kh, kw = w.shape
    pt, pl, pb, pr = pads
    xp = np.zeros((n, c, hgt + pt + pb, wid + pl + pr))
    xp[:, :, pt : pt + hgt, pl : pl + wid] = x
    oh = (hgt + pt + pb - (dilation * (kh - 1) + 1)) // stride + 1
    ow = (wid + pl + pr - (dilation * (kw - 1) + 1)) // stride + 1
    y = np.zeros((n, o, oh, ow))
    og = o // group
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, g * cg : (g + 1) * cg,
                           i * stride : i * stride + dilation * (kh - 1) + 1 : dilation,
                           j * stride : j * stride + dilation * (kw - 1) + 1 : dilation]
                y[:, oc, i, j] = np.sum(patch * w[oc], axis=(1, 2, 3))
    return y + b[None, :, None, None]


def cnn_opset20_self_check(model, x, y):
    """The whole model in float64 numpy, SAME_UPPER as explicit pads by the ONNX rule."""
    d = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    h = conv64(x.astype(np.float64), d["stem.weight"], d["stem.bias"], 2, 1, [0, 0, 1, 1], 1)
    h = h / (1.0 + np.exp(-h))
    h = conv64(h, d["dw.weight"], d["dw.bias"], 1, 2, [2, 2, 2, 2], 8)
    h = h / (1.0 + np.exp(-h))
    hp = np.zeros((2, 8, 10, 10))
    hp[:, :, 1:9, 1:9] = h
    cnt = np.zeros((10, 10))
    cnt[1:9, 1:9] = 1.0
    pooled = np.zeros((2, 8, 4, 4))
    for i in range(4):
        for j in range(4):
            win = (slice(2 * i, 2 * i + 3), slice(2 * j, 2 * j + 3))
            pooled[:, :, i, j] = hp[:, :, win[0], win[1]].sum(axis=(2, 3)) / cnt[win].sum()
    g = pooled.mean(axis=(2, 3))
    g = np.maximum(g @ d["se.reduce.weight"][:, :, 0, 0].T + d["se.reduce.bias"], 0.0)
    g = g @ d["se.expand.weight"][:, :, 0, 0].T + d["se.expand.bias"]
    g = 1.0 / (1.0 + np.exp(-g))
    feat = (pooled * g[:, :, None, None]).mean(axis=(2, 3))
    want = 0.5 * feat @ d["fc.weight"] + 2.0 * d["fc.bias"]
    check_close("cnn_opset20 (numpy)", y, want)


# ---------------------------------------------------------------------------
# Transformer encoders

VOCAB, SEQ, BATCH, HIDDEN, HEADS, HEAD_DIM, FFN, LAYERS = 50, 8, 2, 32, 4, 8, 64, 2
# Key positions 6 and 7 are padding: every query sees keys 0..5 only.
KEY_KEEP = np.array([1, 1, 1, 1, 1, 1, 0, 0], dtype=I64)


def transformer_weights():
    """Weights and input shared by transformer and transformer_opset14."""
    rng = rng_for("transformer")
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(I64)
    w = {
        "embeddings.word_embeddings.weight": uniform(rng, (VOCAB, HIDDEN)),
        "embeddings.position_embeddings.weight": uniform(rng, (SEQ, HIDDEN)),
    }
    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}"
        for n in ("query", "key", "value", "output"):
            w[f"{p}.attention.{n}.weight"] = fan_in_uniform(rng, (HIDDEN, HIDDEN), HIDDEN, 1.5)
            w[f"{p}.attention.{n}.bias"] = fan_in_uniform(rng, (HIDDEN,), HIDDEN)
        w[f"{p}.attention.LayerNorm.weight"] = uniform(rng, (HIDDEN,), 0.5, 1.5)
        w[f"{p}.attention.LayerNorm.bias"] = uniform(rng, (HIDDEN,), -0.2, 0.2)
        w[f"{p}.intermediate.dense.weight"] = fan_in_uniform(rng, (HIDDEN, FFN), HIDDEN, 1.5)
        w[f"{p}.intermediate.dense.bias"] = fan_in_uniform(rng, (FFN,), HIDDEN)
        w[f"{p}.output.dense.weight"] = fan_in_uniform(rng, (FFN, HIDDEN), FFN, 1.5)
        w[f"{p}.output.dense.bias"] = fan_in_uniform(rng, (HIDDEN,), FFN)
        w[f"{p}.output.LayerNorm.weight"] = uniform(rng, (HIDDEN,), 0.5, 1.5)
        w[f"{p}.output.LayerNorm.bias"] = uniform(rng, (HIDDEN,), -0.2, 0.2)
    return ids, w


def transformer_model():
    """transformer.onnx (opset 17): two post-norm encoder layers, fused
    LayerNormalization, GELU in Erf form, an additive mask from Where."""
    ids, w = transformer_weights()
    b = Builder()
    wi = {k: b.init(k, v) for k, v in w.items()}
    pos_ids = b.init("position_ids", np.arange(SEQ, dtype=I64).reshape(1, SEQ))
    heads_shape = b.init("heads_shape", np.array([BATCH, SEQ, HEADS, HEAD_DIM], dtype=I64))
    merge_shape = b.init("merge_shape", np.array([BATCH, SEQ, HIDDEN], dtype=I64))
    scale = b.init("attention_scale", np.array(1.0 / math.sqrt(HEAD_DIM), dtype=F32))
    keep = np.broadcast_to(KEY_KEEP.astype(bool), (1, 1, SEQ, SEQ)).copy()
    mask_bool = b.init("attention_mask_bool", keep)
    zero = b.init("mask_zero", np.array(0.0, dtype=F32))
    neg = b.init("mask_neg", np.array(-1e9, dtype=F32))
    sqrt2 = b.init("gelu_sqrt2", np.array(math.sqrt(2.0), dtype=F32))
    one = b.init("gelu_one", np.array(1.0, dtype=F32))
    half = b.init("gelu_half", np.array(0.5, dtype=F32))

    e = b.op("Gather", [wi["embeddings.word_embeddings.weight"], "input_ids"], "embeddings",
             axis=0)
    pe = b.op("Gather", [wi["embeddings.position_embeddings.weight"], pos_ids], "embeddings",
              axis=0)
    h = b.op("Add", [e, pe], "embeddings")
    mask = b.op("Where", [mask_bool, zero, neg], "extended_attention_mask")

    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}"
        s = f"encoder/layer.{layer}"

        def dense(x, n, scope):
            y = b.op("MatMul", [x, wi[f"{p}.{n}.weight"]], scope)
            return b.op("Add", [y, wi[f"{p}.{n}.bias"]], scope)

        def heads(x, scope, perm):
            y = b.op("Reshape", [x, heads_shape], scope)
            return b.op("Transpose", [y], scope, perm=perm)

        q = heads(dense(h, "attention.query", f"{s}/attention/query"),
                  f"{s}/attention/query", [0, 2, 1, 3])
        k = heads(dense(h, "attention.key", f"{s}/attention/key"),
                  f"{s}/attention/key", [0, 2, 3, 1])
        v = heads(dense(h, "attention.value", f"{s}/attention/value"),
                  f"{s}/attention/value", [0, 2, 1, 3])
        a = f"{s}/attention"
        sc = b.op("MatMul", [q, k], a)
        sc = b.op("Mul", [sc, scale], a)
        sc = b.op("Add", [sc, mask], a)
        pr = b.op("Softmax", [sc], a, axis=-1)
        c = b.op("MatMul", [pr, v], a)
        c = b.op("Transpose", [c], a, perm=[0, 2, 1, 3])
        c = b.op("Reshape", [c, merge_shape], a)
        o = dense(c, "attention.output", f"{a}/output")
        o = b.op("Add", [o, h], f"{a}/output")
        h1 = b.op("LayerNormalization", [o, wi[f"{p}.attention.LayerNorm.weight"],
                                         wi[f"{p}.attention.LayerNorm.bias"]],
                  f"{a}/LayerNorm", axis=-1, epsilon=1e-5)
        f = dense(h1, "intermediate.dense", f"{s}/intermediate")
        # GELU, Erf form, in the PyTorch exporter's order.
        g = b.op("Div", [f, sqrt2], f"{s}/intermediate/gelu")
        g = b.op("Erf", [g], f"{s}/intermediate/gelu")
        g = b.op("Add", [g, one], f"{s}/intermediate/gelu")
        g = b.op("Mul", [f, g], f"{s}/intermediate/gelu")
        g = b.op("Mul", [g, half], f"{s}/intermediate/gelu")
        f2 = dense(g, "output.dense", f"{s}/output")
        f2 = b.op("Add", [f2, h1], f"{s}/output")
        ln_out = ["last_hidden_state"] if layer == LAYERS - 1 else None
        h = b.op("LayerNormalization", [f2, wi[f"{p}.output.LayerNorm.weight"],
                                        wi[f"{p}.output.LayerNorm.bias"]],
                 f"{s}/output/LayerNorm", outputs=ln_out, axis=-1, epsilon=1e-5)

    model = make_model(b, "transformer", [value_info("input_ids", I64, [BATCH, SEQ])],
                       [value_info("last_hidden_state", F32, [BATCH, SEQ, HIDDEN])], 17,
                       "Two post-norm transformer encoder layers (hidden 32, 4 heads, FFN "
                       "64) over token ids < 50, with LayerNormalization, GELU as "
                       "x*0.5*(1+Erf(x/sqrt2)) and an additive attention mask "
                       "Where(mask, 0, -1e9) that hides key positions 6 and 7.")
    return model, [("input_ids", ids)]


def transformer_opset14_model():
    """transformer_opset14.onnx: the same layers and weights as older exporters
    wrote them."""
    ids, w = transformer_weights()
    b = Builder()
    wi = {k: b.init(k, v) for k, v in w.items()}
    pos_ids = b.init("position_ids", np.arange(SEQ, dtype=I64).reshape(1, SEQ))

    def c_f32(value, scope):
        return b.const(value, F32, scope)

    def c_i64(value, scope):
        return b.const(value, I64, scope)

    def layer_norm(x, p, scope):
        mu = b.op("ReduceMean", [x], scope, axes=[-1], keepdims=1)
        d = b.op("Sub", [x, mu], scope)
        sq = b.op("Pow", [d, c_f32(2.0, scope)], scope)
        var = b.op("ReduceMean", [sq], scope, axes=[-1], keepdims=1)
        var = b.op("Add", [var, c_f32(1e-5, scope)], scope)
        sd = b.op("Sqrt", [var], scope)
        n = b.op("Div", [d, sd], scope)
        n = b.op("Mul", [n, wi[f"{p}.weight"]], scope)
        return b.op("Add", [n, wi[f"{p}.bias"]], scope)

    def gelu_tanh(x, scope):
        x3 = b.op("Pow", [x, c_f32(3.0, scope)], scope)
        t = b.op("Mul", [c_f32(0.044715, scope), x3], scope)
        t = b.op("Add", [x, t], scope)
        t = b.op("Mul", [c_f32(0.7978845608028654, scope), t], scope)
        t = b.op("Tanh", [t], scope)
        t = b.op("Add", [c_f32(1.0, scope), t], scope)
        hx = b.op("Mul", [c_f32(0.5, scope), x], scope)
        return b.op("Mul", [hx, t], scope)

    ids_shape = b.op("Shape", ["input_ids"], "embeddings")
    positions = b.op("Expand", [pos_ids, ids_shape], "embeddings")
    e = b.op("Gather", [wi["embeddings.word_embeddings.weight"], "input_ids"], "embeddings",
             axis=0)
    pe = b.op("Gather", [wi["embeddings.position_embeddings.weight"], positions],
              "embeddings", axis=0)
    h = b.op("Add", [e, pe], "embeddings")
    h = b.op("Identity", [h], "embeddings/dropout")

    # The extended attention mask as BERT computed it: (1 - mask) * -10000.
    m = "extended_attention_mask"
    ones = b.op("ConstantOfShape", [ids_shape], m,
                value=numpy_helper.from_array(np.array([1], dtype=I64), "value"))
    keep = b.op("Mul", [ones, c_i64(KEY_KEEP.tolist(), m)], m)
    keep = b.op("Unsqueeze", [keep, c_i64([1, 2], m)], m)
    keep = b.op("Cast", [keep], m, to=TensorProto.FLOAT)
    mask = b.op("Sub", [c_f32(1.0, m), keep], m)
    mask = b.op("Mul", [mask, c_f32(-10000.0, m)], m)

    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}"
        s = f"encoder/layer.{layer}"
        a = f"{s}/attention"
        # Reshape targets from the input's own shape: [batch, seq, 4, 8] and [batch, seq, 32].
        shp = b.op("Shape", [h], a)
        bsz = b.op("Gather", [shp, c_i64(0, a)], a, axis=0)
        seq = b.op("Gather", [shp, c_i64(1, a)], a, axis=0)
        bsz = b.op("Unsqueeze", [bsz, c_i64([0], a)], a)
        seq = b.op("Unsqueeze", [seq, c_i64([0], a)], a)
        heads_shape = b.op("Concat", [bsz, seq, c_i64([HEADS], a), c_i64([HEAD_DIM], a)], a,
                           axis=0)
        merge_shape = b.op("Concat", [bsz, seq, c_i64([HIDDEN], a)], a, axis=0)

        def dense(x, n, scope):
            y = b.op("MatMul", [x, wi[f"{p}.{n}.weight"]], scope)
            return b.op("Add", [wi[f"{p}.{n}.bias"], y], scope)

        def heads(x, scope, perm):
            y = b.op("Reshape", [x, heads_shape], scope)
            return b.op("Transpose", [y], scope, perm=perm)

        q = heads(dense(h, "attention.query", f"{a}/query"), f"{a}/query", [0, 2, 1, 3])
        k = heads(dense(h, "attention.key", f"{a}/key"), f"{a}/key", [0, 2, 3, 1])
        v = heads(dense(h, "attention.value", f"{a}/value"), f"{a}/value", [0, 2, 1, 3])
        sc = b.op("MatMul", [q, k], a)
        sc = b.op("Div", [sc, c_f32(math.sqrt(HEAD_DIM), a)], a)
        sc = b.op("Add", [sc, mask], a)
        pr = b.op("Softmax", [sc], a, axis=-1)
        pr = b.op("Identity", [pr], f"{a}/dropout")
        c = b.op("MatMul", [pr, v], a)
        c = b.op("Transpose", [c], a, perm=[0, 2, 1, 3])
        c = b.op("Reshape", [c, merge_shape], a)
        o = dense(c, "attention.output", f"{a}/output")
        o = b.op("Identity", [o], f"{a}/output/dropout")
        o = b.op("Add", [o, h], f"{a}/output")
        h1 = layer_norm(o, f"{p}.attention.LayerNorm", f"{a}/output/LayerNorm")
        f = dense(h1, "intermediate.dense", f"{s}/intermediate")
        g = gelu_tanh(f, f"{s}/intermediate/gelu")
        f2 = dense(g, "output.dense", f"{s}/output")
        f2 = b.op("Identity", [f2], f"{s}/output/dropout")
        f2 = b.op("Add", [f2, h1], f"{s}/output")
        h = layer_norm(f2, f"{p}.output.LayerNorm", f"{s}/output/LayerNorm")
    b.op("Identity", [h], "output", outputs=["last_hidden_state"])

    model = make_model(b, "transformer_opset14",
                       [value_info("input_ids", I64, [BATCH, SEQ])],
                       [value_info("last_hidden_state", F32, [BATCH, SEQ, HIDDEN])], 14,
                       "transformer.onnx's layers and weights as an opset-14 export: "
                       "LayerNorm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add, "
                       "GELU in tanh form, Constant nodes for scalars, Identity for "
                       "dropout, Reshape targets from Shape/Gather/Unsqueeze/Concat, "
                       "position ids by Expand to Shape(input_ids) and the mask "
                       "(1 - mask) * -10000 from ConstantOfShape.")
    return model, [("input_ids", ids)]


def transformer_self_check(ids, w, y, gelu):
    """Both transformer models in float64 numpy."""
    d = {k: v.astype(np.float64) for k, v in w.items()}
    h = d["embeddings.word_embeddings.weight"][ids] \
        + d["embeddings.position_embeddings.weight"][np.arange(SEQ)][None]
    mask = np.where(KEY_KEEP.astype(bool), 0.0, -1e9)[None, None, None, :]

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * d[f"{p}.weight"] + d[f"{p}.bias"]

    for layer in range(LAYERS):
        p = f"encoder.layer.{layer}"

        def dense(x, n):
            return x @ d[f"{p}.{n}.weight"] + d[f"{p}.{n}.bias"]

        def split(x):
            return x.reshape(BATCH, SEQ, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)

        q, k, v = (split(dense(h, f"attention.{n}")) for n in ("query", "key", "value"))
        sc = q @ k.transpose(0, 1, 3, 2) / math.sqrt(HEAD_DIM) + mask
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        pr = sc / sc.sum(-1, keepdims=True)
        c = (pr @ v).transpose(0, 2, 1, 3).reshape(BATCH, SEQ, HIDDEN)
        h1 = ln(dense(c, "attention.output") + h, f"{p}.attention.LayerNorm")
        f = dense(h1, "intermediate.dense")
        if gelu == "erf":
            g = 0.5 * f * (1.0 + np.vectorize(math.erf)(f / math.sqrt(2.0)))
        else:
            g = 0.5 * f * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (f + 0.044715 * f**3)))
        h = ln(dense(g, "output.dense") + h1, f"{p}.output.LayerNorm")
    check_close(f"transformer ({gelu}, numpy)", y, h)


# ---------------------------------------------------------------------------
# LSTM

LSTM_SEQ, LSTM_BATCH, LSTM_IN, LSTM_HIDDEN, LSTM_OUT = 6, 2, 5, 7, 3


def lstm_model(case):
    """lstm.onnx / lstm_noinit.onnx (opset 17): an LSTM (gates i, o, f, c), its
    last step by Gather index -1, a Gemm head."""
    full = case == "lstm"
    rng = rng_for(case)
    x = uniform(rng, (LSTM_SEQ, LSTM_BATCH, LSTM_IN))
    b = Builder()
    hs = LSTM_HIDDEN
    bound = 1.0 / math.sqrt(hs)
    W = b.init("lstm.W", uniform(rng, (1, 4 * hs, LSTM_IN), -bound, bound))
    R = b.init("lstm.R", uniform(rng, (1, 4 * hs, hs), -bound, bound))
    inputs = ["x", W, R]
    if full:
        B = b.init("lstm.B", uniform(rng, (1, 8 * hs), -bound, bound))
        h0 = b.init("lstm.initial_h", uniform(rng, (1, LSTM_BATCH, hs), -0.5, 0.5))
        c0 = b.init("lstm.initial_c", uniform(rng, (1, LSTM_BATCH, hs), -0.5, 0.5))
        inputs += [B, "", h0, c0]
    last = b.init("last_index", np.array(-1, dtype=I64))
    fc_w = b.init("fc.weight", fan_in_uniform(rng, (LSTM_OUT, hs), hs))
    fc_b = b.init("fc.bias", fan_in_uniform(rng, (LSTM_OUT,), hs))

    y = b.op("LSTM", inputs, "lstm", hidden_size=hs, direction="forward", layout=0)
    if full:
        axes = b.init("squeeze_axes", np.array([1], dtype=I64))
        y = b.op("Squeeze", [y, axes], "lstm")
    else:
        shape = b.init("squeeze_shape", np.array([LSTM_SEQ, LSTM_BATCH, hs], dtype=I64))
        y = b.op("Reshape", [y, shape], "lstm")
    y = b.op("Gather", [y, last], "last_step", axis=0)
    b.op("Gemm", [y, fc_w, fc_b], "fc", outputs=["logits"], transB=1)

    doc = ("LSTM (hidden 7, forward, layout 0, ONNX gate order i, o, f, c) over "
           "x [seq 6, batch 2, input 5]; "
           + ("with bias B, no sequence_lens and nonzero initial_h and initial_c; "
              "Y squeezed on axis 1; " if full else
              "without B or initial states; Y reshaped to [6, 2, 7]; ")
           + "the last step (Gather index -1 on axis 0) into a Gemm (transB=1) to 3.")
    model = make_model(b, case, [value_info("x", F32, [LSTM_SEQ, LSTM_BATCH, LSTM_IN])],
                       [value_info("logits", F32, [LSTM_BATCH, LSTM_OUT])], 17, doc)
    return model, [("x", x)]


def lstm_self_check(case, model, x, y):
    inits = {t.name: numpy_helper.to_array(t).astype(np.float64)
             for t in model.graph.initializer}
    W, R = inits["lstm.W"][0], inits["lstm.R"][0]
    hs = LSTM_HIDDEN
    bias = inits["lstm.B"][0] if "lstm.B" in inits else np.zeros(8 * hs)
    h = inits["lstm.initial_h"][0] if "lstm.initial_h" in inits else np.zeros((LSTM_BATCH, hs))
    c = inits["lstm.initial_c"][0] if "lstm.initial_c" in inits else np.zeros((LSTM_BATCH, hs))

    def sig(z):
        return 1.0 / (1.0 + np.exp(-z))

    for t in range(LSTM_SEQ):
        g = x[t].astype(np.float64) @ W.T + h @ R.T + bias[: 4 * hs] + bias[4 * hs :]
        i, o, f, cc = (g[:, j * hs : (j + 1) * hs] for j in range(4))
        c = sig(f) * c + sig(i) * np.tanh(cc)
        h = sig(o) * np.tanh(c)
    check_close(f"{case} (numpy)", y, h @ inits["fc.weight"].T + inits["fc.bias"])


# ---------------------------------------------------------------------------
# GPT-2 block

GPT_VOCAB, GPT_POS, GPT_SEQ, GPT_D, GPT_HEADS, GPT_FFN = 40, 16, 8, 16, 2, 64


def gpt_block_model():
    """gpt_block.onnx (opset 20): one GPT-2 block in the dynamo exporter's form."""
    rng = rng_for("gpt_block")
    ids = rng.integers(0, GPT_VOCAB, size=(1, GPT_SEQ)).astype(I64)
    b = Builder()
    D, hd = GPT_D, GPT_D // GPT_HEADS
    wte = b.init("transformer.wte.weight", uniform(rng, (GPT_VOCAB, D)))
    wpe = b.init("transformer.wpe.weight", uniform(rng, (GPT_POS, D), -0.5, 0.5))
    ln1_w = b.init("transformer.h.0.ln_1.weight", uniform(rng, (D,), 0.5, 1.5))
    ln1_b = b.init("transformer.h.0.ln_1.bias", uniform(rng, (D,), -0.2, 0.2))
    # GPT-2's Conv1D keeps weights as [in, out]: Gemm with transB=0.
    attn_w = b.init("transformer.h.0.attn.c_attn.weight", fan_in_uniform(rng, (D, 3 * D), D, 1.5))
    attn_b = b.init("transformer.h.0.attn.c_attn.bias", fan_in_uniform(rng, (3 * D,), D))
    proj_w = b.init("transformer.h.0.attn.c_proj.weight", fan_in_uniform(rng, (D, D), D, 1.5))
    proj_b = b.init("transformer.h.0.attn.c_proj.bias", fan_in_uniform(rng, (D,), D))
    ln2_w = b.init("transformer.h.0.ln_2.weight", uniform(rng, (D,), 0.5, 1.5))
    ln2_b = b.init("transformer.h.0.ln_2.bias", uniform(rng, (D,), -0.2, 0.2))
    fc_w = b.init("transformer.h.0.mlp.c_fc.weight", fan_in_uniform(rng, (D, GPT_FFN), D, 1.5))
    fc_b = b.init("transformer.h.0.mlp.c_fc.bias", fan_in_uniform(rng, (GPT_FFN,), D))
    mp_w = b.init("transformer.h.0.mlp.c_proj.weight",
                  fan_in_uniform(rng, (GPT_FFN, D), GPT_FFN, 1.5))
    mp_b = b.init("transformer.h.0.mlp.c_proj.bias", fan_in_uniform(rng, (D,), GPT_FFN))
    pos = b.init("val_position_ids", np.arange(GPT_SEQ, dtype=I64).reshape(1, GPT_SEQ))
    flat = b.init("val_flat_shape", np.array([-1, D], dtype=I64))
    qkv_shape = b.init("val_qkv_shape", np.array([1, GPT_SEQ, 3 * D], dtype=I64))
    heads_shape = b.init("val_heads_shape", np.array([1, GPT_SEQ, GPT_HEADS, hd], dtype=I64))
    hidden_shape = b.init("val_hidden_shape", np.array([1, GPT_SEQ, D], dtype=I64))
    ffn_shape = b.init("val_ffn_shape", np.array([1, GPT_SEQ, GPT_FFN], dtype=I64))
    ffn_flat = b.init("val_ffn_flat_shape", np.array([-1, GPT_FFN], dtype=I64))
    causal = b.init("val_causal_mask",
                    np.tril(np.ones((GPT_SEQ, GPT_SEQ), dtype=bool)).reshape(1, 1, GPT_SEQ, GPT_SEQ))
    # The padding mask from an all-ones attention_mask (no padding).
    padding = b.init("val_padding_mask", np.ones((1, 1, 1, GPT_SEQ), dtype=bool))
    neg = b.init("val_min", np.array(np.finfo(np.float32).min, dtype=F32))
    scale = b.init("val_sqrt_head_dim", np.array(math.sqrt(hd), dtype=F32))
    c_half = b.init("val_half", np.array(0.5, dtype=F32))
    c_one = b.init("val_one", np.array(1.0, dtype=F32))
    c_three = b.init("val_three", np.array(3.0, dtype=F32))
    c_cubic = b.init("val_gelu_cubic", np.array(0.044715, dtype=F32))
    c_sqrt2pi = b.init("val_sqrt_2_over_pi", np.array(math.sqrt(2.0 / math.pi), dtype=F32))

    def named(op, inputs, out, **attrs):
        """Dynamo-style: node `node_<out>`, output `<out>`."""
        return b.op(op, inputs, name=f"node_{out}", outputs=[out], **attrs)

    e = named("Gather", [wte, "input_ids"], "embedding", axis=0)
    pe = named("Gather", [wpe, pos], "embedding_1", axis=0)
    h = named("Add", [e, pe], "add")
    x = named("LayerNormalization", [h, ln1_w, ln1_b], "layer_norm", axis=-1, epsilon=1e-5)
    x = named("Reshape", [x, flat], "view")
    x = named("Gemm", [x, attn_w, attn_b], "addmm", alpha=1.0, beta=1.0)
    x = named("Reshape", [x, qkv_shape], "view_1")
    q, k, v = b.op("Split", [x], name="node_split", outputs=["split", "split_1", "split_2"],
                   axis=2, num_outputs=3)
    q = named("Reshape", [q, heads_shape], "view_2")
    q = named("Transpose", [q], "transpose", perm=[0, 2, 1, 3])
    k = named("Reshape", [k, heads_shape], "view_3")
    k = named("Transpose", [k], "transpose_1", perm=[0, 2, 3, 1])
    v = named("Reshape", [v, heads_shape], "view_4")
    v = named("Transpose", [v], "transpose_2", perm=[0, 2, 1, 3])
    sc = named("MatMul", [q, k], "matmul")
    sc = named("Div", [sc, scale], "div")
    allowed = named("And", [causal, padding], "and_1")
    sc = named("Where", [allowed, sc, neg], "where")
    pr = named("Softmax", [sc], "softmax", axis=-1)
    c = named("MatMul", [pr, v], "matmul_1")
    c = named("Transpose", [c], "transpose_3", perm=[0, 2, 1, 3])
    c = named("Reshape", [c, flat], "view_5")
    c = named("Gemm", [c, proj_w, proj_b], "addmm_1", alpha=1.0, beta=1.0)
    c = named("Reshape", [c, hidden_shape], "view_6")
    h = named("Add", [c, h], "add_1")
    x = named("LayerNormalization", [h, ln2_w, ln2_b], "layer_norm_1", axis=-1, epsilon=1e-5)
    x = named("Reshape", [x, flat], "view_7")
    x = named("Gemm", [x, fc_w, fc_b], "addmm_2", alpha=1.0, beta=1.0)
    x = named("Reshape", [x, ffn_shape], "view_8")
    # GELU, tanh form (HF NewGELUActivation): 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))).
    t = named("Pow", [x, c_three], "pow_1")
    t = named("Mul", [t, c_cubic], "mul_1")
    t = named("Add", [x, t], "add_2")
    t = named("Mul", [t, c_sqrt2pi], "mul_2")
    t = named("Tanh", [t], "tanh")
    t = named("Add", [t, c_one], "add_3")
    hx = named("Mul", [x, c_half], "mul_3")
    x = named("Mul", [hx, t], "mul_4")
    x = named("Reshape", [x, ffn_flat], "view_9")
    x = named("Gemm", [x, mp_w, mp_b], "addmm_3", alpha=1.0, beta=1.0)
    x = named("Reshape", [x, hidden_shape], "view_10")
    b.op("Add", [x, h], name="node_add_4", outputs=["hidden_states"])

    model = make_model(b, "gpt_block", [value_info("input_ids", I64, [1, GPT_SEQ])],
                       [value_info("hidden_states", F32, [1, GPT_SEQ, GPT_D])], 20,
                       "One GPT-2 block (hidden 16, 2 heads, MLP 64) in the dynamo "
                       "exporter's form: Gather embeddings, LayerNormalization, Gemm on "
                       "[-1, 16] views, Split num_outputs=3, causal mask And(tril, "
                       "padding) into Where(mask, scores, float32 min), GELU in tanh form.")
    return model, [("input_ids", ids)]


# ---------------------------------------------------------------------------
# Error and weight-free fixtures


def unsupported_op_model():
    b = Builder()
    d = b.op("Det", ["x"], name="my_det", outputs=["det"])
    b.op("Relu", [d], name="relu", outputs=["y"])
    return make_model(b, "unsupported_op", [value_info("x", F32, [2, 3, 3])],
                      [value_info("y", F32, [2])], 17,
                      "A Det node named my_det, which the importer does not support.")


def unsupported_ops_model():
    """Three op types the importer does not read, one of them twice and one in another
    domain: a single error must name all three."""
    b = Builder()
    d = b.op("Det", ["x"], name="det_a")
    d2 = b.op("Det", ["x"], name="det_b")
    s = b.op("Add", [d, d2], name="sum")
    nz = b.op("NonZero", [s], name="nonzero")
    b.op("MyOp", [nz], name="custom", outputs=["y"], domain="com.example")
    graph = helper.make_graph(b.nodes, "unsupported_ops", [value_info("x", F32, [3, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [2, "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)],
                              ir_version=IR_VERSION, producer_name=PRODUCER)
    model.doc_string = ("Det (two nodes), NonZero and com.example.MyOp: three op types the "
                        "importer does not read.")
    return model


def double_model():
    """float64 throughout: onnxruntime computes it in float64, which the IPU has not."""
    b = Builder()
    w = b.init("w", np.array([[1e-3, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float64))
    b.op("MatMul", ["x", w], "matmul", outputs=["y"])
    graph = helper.make_graph(b.nodes, "double", [helper.make_tensor_value_info(
        "x", TensorProto.DOUBLE, [2, 3])], [helper.make_tensor_value_info(
            "y", TensorProto.DOUBLE, [2, 2])], initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION, producer_name=PRODUCER)
    model.doc_string = "A float64 MatMul: tessera run refuses it, estimate notes it."
    return model


def dynamic_batch_model():
    rng = rng_for("dynamic_batch")
    b = Builder()
    w = b.init("fc.weight", uniform(rng, (3, 4)))
    bias = b.init("fc.bias", uniform(rng, (3,)))
    h = b.op("Gemm", ["x", w, bias], "fc", transB=1)
    b.op("Relu", [h], "relu", outputs=["y"])
    return make_model(b, "dynamic_batch", [value_info("x", F32, ["batch", 4])],
                      [value_info("y", F32, ["batch", 3])], 17,
                      "Gemm and Relu whose input's first dimension is the symbolic 'batch'.")


def old_opset_model():
    rng = rng_for("old_opset")
    b = Builder()
    w = b.init("fc.weight", uniform(rng, (4, 3)))
    bias = b.init("fc.bias", uniform(rng, (3,)))
    h = b.op("Gemm", ["x", w, bias], "fc")
    h = b.op("Relu", [h], "relu")
    b.op("Softmax", [h], "softmax", outputs=["y"], axis=1)
    return make_model(b, "old_opset", [value_info("x", F32, [1, 4])],
                      [value_info("y", F32, [1, 3])], 5,
                      "Gemm, Relu and Softmax declaring opset 5 (IR version 4), older than "
                      "the importer reads.",
                      ir_version=4)


def cnn_opset9_model():
    """cnn_opset9.onnx: LRN (as AlexNet and GoogLeNet use it) and the versions of opset 9
    whose attributes later became inputs or whose meaning changed: Slice (version 1, starts/ends/axes attributes), Clip (6, min and
    max attributes), Split (2, the split attribute), Unsqueeze and Squeeze (1, the axes
    attribute), ReduceMean (1), Softmax (1, coercing to 2-D at axis 1), BatchNormalization
    (9), MaxPool (8), Dropout (7, inference), Sum (8), Gemm (9)."""
    rng = rng_for("cnn_opset9")
    x = uniform(rng, (2, 3, 12, 12))
    b = Builder()
    w1 = b.init("conv1.weight", fan_in_uniform(rng, (8, 3, 3, 3), 27, 2.0))
    b1 = b.init("conv1.bias", fan_in_uniform(rng, (8,), 27))
    bn1 = bn_params(rng, b, "bn1", 8)
    w2 = b.init("conv2.weight", fan_in_uniform(rng, (4, 4, 1, 1), 4, 2.0))
    fc_w = b.init("fc.weight", fan_in_uniform(rng, (6, 4), 4))
    fc_b = b.init("fc.bias", fan_in_uniform(rng, (6,), 4))

    h = b.op("Conv", ["x", w1, b1], "conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    h = b.op("BatchNormalization", [h] + bn1, "bn1", epsilon=1e-5, momentum=0.9)
    h = b.op("Clip", [h], "relu6", min=0.0, max=6.0)
    h = b.op("LRN", [h], "lrn", size=3, alpha=0.01, beta=0.75, bias=2.0)
    h = b.op("MaxPool", [h], "pool", kernel_shape=[2, 2], strides=[2, 2])
    # Two halves of the channels: the second through a 1x1 convolution of the first.
    lo, hi = b.op("Split", [h], "split", n_out=2, axis=1, split=[4, 4])
    lo = b.op("Conv", [lo, w2], "conv2", kernel_shape=[1, 1])
    h = b.op("Sum", [lo, hi], "sum")
    h = b.op("Dropout", [h], "dropout", ratio=0.25)
    # Rows 1 to 4 of the 6 and every column, by attributes.
    h = b.op("Slice", [h], "slice", starts=[1, 0], ends=[5, 6], axes=[2, 3])
    h = b.op("ReduceMean", [h], "mean", axes=[2, 3], keepdims=0)
    h = b.op("Unsqueeze", [h], "unsqueeze", axes=[2])
    h = b.op("Squeeze", [h], "squeeze", axes=[2])
    h = b.op("Gemm", [h, fc_w, fc_b], "fc", transB=1)
    b.op("Softmax", [h], "softmax", outputs=["probs"], axis=1)
    model = make_model(b, "cnn_opset9", [value_info("x", F32, [2, 3, 12, 12])],
                       [value_info("probs", F32, [2, 6])], 9,
                       "Opset 9 as older exporters wrote it, with an LRN: Slice, Clip, Split, "
                       "Unsqueeze, "
                       "Squeeze and ReduceMean with attributes where later versions take "
                       "inputs; BatchNormalization 9, MaxPool 8, Dropout 7, Sum 8, Gemm 9, "
                       "Softmax 1.", ir_version=4)
    return model, [("x", x)]


def activations_model():
    """activations.onnx (opset 18): the activations ONNX has as ops of their own, PRelu,
    InstanceNormalization, Pad (constant), Tile and Resize (nearest, whole factors), each a
    graph output."""
    rng = rng_for("activations")
    x = uniform(rng, (2, 3, 4, 5), -3.0, 3.0)
    b = Builder()
    slope = b.init("prelu.slope", uniform(rng, (3, 1, 1), 0.05, 0.5))
    scale = b.init("inorm.scale", uniform(rng, (3,), 0.5, 1.5))
    bias = b.init("inorm.bias", uniform(rng, (3,), -0.5, 0.5))
    pads = b.init("pad.pads", np.array([0, 0, 1, 0, 0, 0, 2, 1], dtype=I64))
    value = b.init("pad.value", np.array(0.5, dtype=F32))
    reps = b.init("tile.repeats", np.array([1, 2, 1, 2], dtype=I64))
    scales = b.init("resize.scales", np.array([1.0, 1.0, 2.0, 3.0], dtype=F32))
    outs = []

    def out(op, inputs, **attrs):
        name = f"y_{op.lower()}"
        b.op(op, inputs, op.lower(), outputs=[name], **attrs)
        outs.append(name)

    out("LeakyRelu", ["x"], alpha=0.1)
    out("Elu", ["x"], alpha=0.7)
    out("Selu", ["x"])
    out("Softplus", ["x"])
    out("Softsign", ["x"])
    out("Abs", ["x"])
    out("Sign", ["x"])
    out("Shrink", ["x"], bias=0.2, lambd=0.4)
    out("HardSigmoid", ["x"], alpha=0.3, beta=0.4)
    out("HardSwish", ["x"])
    out("Mish", ["x"])
    out("PRelu", ["x", slope])
    out("InstanceNormalization", ["x", scale, bias], epsilon=1e-4)
    out("Pad", ["x", pads, value], mode="constant")
    out("Tile", ["x", reps])
    out("Resize", ["x", "", scales], mode="nearest")
    shapes = {"y_pad": [2, 3, 7, 6], "y_tile": [2, 6, 4, 10], "y_resize": [2, 3, 8, 15]}
    model = make_model(b, "activations", [value_info("x", F32, [2, 3, 4, 5])],
                       [value_info(o, F32, shapes.get(o, [2, 3, 4, 5])) for o in outs], 18,
                       "LeakyRelu, Elu, Selu, Softplus, Softsign, Abs, Sign, Shrink, "
                       "HardSigmoid, HardSwish, Mish, PRelu, InstanceNormalization, Pad "
                       "(constant), Tile and Resize (nearest, x2 and x3), "
                       "each a graph output.")
    return model, [("x", x)]


def window1d_model():
    """window1d.onnx (opset 18): 1-D Conv (bias, stride 2, dilation 2, uneven pads, two
    groups), MaxPool and AveragePool 1-D, GlobalAveragePool and GlobalMaxPool of [N, C, L],
    each a graph output."""
    rng = rng_for("window1d")
    x = uniform(rng, (2, 4, 11))
    b = Builder()
    w = b.init("conv.w", uniform(rng, (6, 2, 3)))
    bias = b.init("conv.b", uniform(rng, (6,)))
    b.op("Conv", ["x", w, bias], "conv", outputs=["y_conv"], strides=[2], dilations=[2],
         pads=[1, 2], group=2)
    b.op("MaxPool", ["x"], "maxpool", outputs=["y_maxpool"], kernel_shape=[3], strides=[2],
         pads=[1, 1])
    b.op("AveragePool", ["x"], "avgpool", outputs=["y_avgpool"], kernel_shape=[2],
         pads=[0, 1], count_include_pad=0)
    b.op("GlobalAveragePool", ["x"], "gap", outputs=["y_gap"])
    b.op("GlobalMaxPool", ["x"], "gmp", outputs=["y_gmp"])
    shapes = {"y_conv": [2, 6, 5], "y_maxpool": [2, 4, 6], "y_avgpool": [2, 4, 11],
              "y_gap": [2, 4, 1], "y_gmp": [2, 4, 1]}
    model = make_model(b, "window1d", [value_info("x", F32, [2, 4, 11])],
                       [value_info(o, F32, d) for o, d in shapes.items()], 18,
                       "1-D Conv (bias, stride 2, dilation 2, pads [1, 2], two groups), "
                       "MaxPool 1-D, AveragePool 1-D and the global poolings of [N, C, L].")
    return model, [("x", x)]


def conv_transpose_model():
    """conv_transpose.onnx (opset 17): ConvTranspose 2-D (two groups, strides 2, dilations
    [1, 2], pads [1, 0, 0, 1], output_padding [1, 0], bias) and 1-D (stride 3, output_shape
    with auto_pad SAME_UPPER, an even total padding), each a graph output."""
    rng = rng_for("conv_transpose")
    x = uniform(rng, (2, 4, 3, 4))
    x1 = uniform(rng, (2, 3, 5))
    b = Builder()
    w = b.init("ct2d.w", uniform(rng, (4, 3, 3, 3)))
    bias = b.init("ct2d.b", uniform(rng, (6,)))
    w1 = b.init("ct1d.w", uniform(rng, (3, 2, 4)))
    b.op("ConvTranspose", ["x", w, bias], "ct2d", outputs=["y2d"], group=2, strides=[2, 2],
         dilations=[1, 2], pads=[1, 0, 0, 1], output_padding=[1, 0])
    b.op("ConvTranspose", ["x1", w1], "ct1d", outputs=["y1d"], strides=[3],
         output_shape=[14], auto_pad="SAME_UPPER")
    model = make_model(b, "conv_transpose", [value_info("x", F32, [2, 4, 3, 4]),
                                            value_info("x1", F32, [2, 3, 5])],
                       [value_info("y2d", F32, [2, 6, 7, 10]),
                        value_info("y1d", F32, [2, 2, 14])], 17,
                       "ConvTranspose 2-D (groups, strides, dilations, pads, output_padding, "
                       "bias) and 1-D (output_shape, SAME_UPPER).")
    return model, [("x", x), ("x1", x1)]


EINSUMS = [
    ("y_proj", "bij,jk->bik", ["x", "w_proj"], [2, 3, 5]),
    ("y_attn", "...qd,...kd->...qk", ["q", "k"], [2, 2, 3, 5]),
    ("y_sum_t", "bij->jb", ["x"], [4, 2]),
    ("y_implicit", "ij,jk", ["w_a", "w_b"], [3, 2]),
    ("y_chain", "ab,bc,cd->ad", ["w_a", "w_b", "w_c"], [3, 4]),
    ("y_bcast", "...ij,jk->...ik", ["x", "w_proj"], [2, 3, 5]),
    ("y_outer", "i,j->ij", ["v", "v2"], [4, 3]),
]


def einsum_model():
    """einsum.onnx (opset 17): Einsum as exporters write it - a projection, attention scores
    over an ellipsis, a sum with a transpose, an implicit output, a chain of three operands,
    a broadcast ellipsis and an outer product - each a graph output."""
    rng = rng_for("einsum")
    x = uniform(rng, (2, 3, 4))
    q = uniform(rng, (2, 2, 3, 4))
    k = uniform(rng, (2, 2, 5, 4))
    b = Builder()
    b.init("w_proj", uniform(rng, (4, 5)))
    b.init("w_a", uniform(rng, (3, 4)))
    b.init("w_b", uniform(rng, (4, 2)))
    b.init("w_c", uniform(rng, (2, 4)))
    b.init("v", uniform(rng, (4,)))
    b.init("v2", uniform(rng, (3,)))
    for name, eq, ins, _ in EINSUMS:
        b.op("Einsum", ins, name, outputs=[name], equation=eq)
    model = make_model(b, "einsum", [value_info("x", F32, [2, 3, 4]),
                                    value_info("q", F32, [2, 2, 3, 4]),
                                    value_info("k", F32, [2, 2, 5, 4])],
                       [value_info(n, F32, d) for n, _, _, d in EINSUMS], 17,
                       "Einsum: bij,jk->bik; ...qd,...kd->...qk; bij->jb; ij,jk (implicit); "
                       "ab,bc,cd->ad; ...ij,jk->...ik; i,j->ij.")
    return model, [("x", x), ("q", q), ("k", k)]


def einsum_self_check(model, feeds, outputs):
    """einsum with numpy's einsum, in float64."""
    vals = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    vals.update({n: a.astype(np.float64) for n, a in feeds})
    got = dict(outputs)
    for name, eq, ins, _ in EINSUMS:
        check_close(f"einsum {name} (numpy)", got[name], np.einsum(eq, *[vals[i] for i in ins]))


def conv_transpose_np(x, w, groups, strides, dilations, pads_begin, out_shape):
    """A transposed convolution in numpy (float64): each input element scatters its products
    with the kernel into the output, which is then cropped by the begin pads."""
    n, c_in = x.shape[:2]
    spatial = x.shape[2:]
    c_out_g = w.shape[1]
    k = w.shape[2:]
    full = [strides[a] * (spatial[a] - 1) + (k[a] - 1) * dilations[a] + 1 + 8
            for a in range(len(spatial))]
    y = np.zeros((n, c_out_g * groups, *full))
    c_in_g = c_in // groups
    for ci in range(c_in):
        g = ci // c_in_g
        for idx in np.ndindex(*spatial):
            for kk in np.ndindex(*k):
                pos = tuple(idx[a] * strides[a] + kk[a] * dilations[a] for a in range(len(k)))
                for co in range(c_out_g):
                    y[(slice(None), g * c_out_g + co) + pos] += x[(slice(None), ci) + idx] * w[(ci, co) + kk]
    sl = tuple(slice(pads_begin[a], pads_begin[a] + out_shape[a]) for a in range(len(k)))
    return y[(slice(None), slice(None)) + sl]


def conv_transpose_self_check(model, x, x1, outputs):
    """conv_transpose in numpy, from its initializers."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    got = dict(outputs)
    y2 = conv_transpose_np(x.astype(np.float64), w["ct2d.w"], 2, [2, 2], [1, 2], [1, 0], [7, 10])
    y2 += w["ct2d.b"][None, :, None, None]
    check_close("conv_transpose y2d (numpy)", got["y2d"], y2)
    # output_shape 14 of a full 16: one row of padding at each end.
    y1 = conv_transpose_np(x1.astype(np.float64), w["ct1d.w"], 1, [3], [1], [1], [14])
    check_close("conv_transpose y1d (numpy)", got["y1d"], y1)


def window1d_self_check(model, x, outputs):
    """window1d in numpy, from its initializers."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = x.astype(np.float64)
    got = dict(outputs)
    # Conv: stride 2, dilation 2, pads [1, 2], two groups of 2 input channels.
    xp = np.pad(x, ((0, 0), (0, 0), (1, 2)))
    k, conv = w["conv.w"], np.zeros((2, 6, 5))
    for o in range(6):
        g = o // 3
        for t in range(5):
            taps = xp[:, 2 * g:2 * g + 2, 2 * t:2 * t + 5:2]
            conv[:, o, t] = (taps * k[o][None]).sum(axis=(1, 2)) + w["conv.b"][o]
    check_close("window1d y_conv (numpy)", got["y_conv"], conv)
    xm = np.pad(x, ((0, 0), (0, 0), (1, 1)), constant_values=-np.inf)
    check_close("window1d y_maxpool (numpy)", got["y_maxpool"],
                np.stack([xm[:, :, 2 * t:2 * t + 3].max(axis=2) for t in range(6)], axis=2))
    avg = np.stack([x[:, :, t:t + 2].mean(axis=2) for t in range(11)], axis=2)
    check_close("window1d y_avgpool (numpy)", got["y_avgpool"], avg)
    check_close("window1d y_gap (numpy)", got["y_gap"], x.mean(axis=2, keepdims=True))
    check_close("window1d y_gmp (numpy)", got["y_gmp"], x.max(axis=2, keepdims=True))


def pad_crop_model():
    """pad_crop.onnx: Pad with negative pads (a crop) on one axis and positive on another."""
    rng = rng_for("pad_crop")
    x = uniform(rng, (2, 3, 5))
    b = Builder()
    pads = b.init("pads", np.array([0, -1, 2, 0, 1, -2], dtype=I64))
    b.op("Pad", ["x", pads], "pad", outputs=["y"], mode="constant")
    model = make_model(b, "pad_crop", [value_info("x", F32, [2, 3, 5])],
                       [value_info("y", F32, [2, 3, 5])], 18,
                       "Pad cropping the first row and last two columns, padding a row after "
                       "and two columns before with zeros.")
    return model, [("x", x)]


def pad_crop_self_check(x, y):
    want = np.pad(x[:, 1:, :3], ((0, 0), (0, 1), (2, 0)))
    check_close("pad_crop (numpy)", y, want)


def pad_modes_model():
    """pad_modes.onnx (opset 19): Pad in reflect mode (as voice-activity models pad their
    frames), edge and wrap mode, each on two axes, one of them longer than the axis for
    wrap."""
    rng = rng_for("pad_modes")
    x = uniform(rng, (2, 3, 5))
    b = Builder()
    reflect = b.init("reflect_pads", np.array([0, 2, 3, 0, 1, 4], dtype=I64))
    edge = b.init("edge_pads", np.array([0, 1, 0, 0, 2, 3], dtype=I64))
    wrap = b.init("wrap_pads", np.array([0, 4, 1, 0, 0, 7], dtype=I64))
    b.op("Pad", ["x", reflect], "reflect", outputs=["y_reflect"], mode="reflect")
    b.op("Pad", ["x", edge], "edge", outputs=["y_edge"], mode="edge")
    b.op("Pad", ["x", wrap], "wrap", outputs=["y_wrap"], mode="wrap")
    model = make_model(b, "pad_modes", [value_info("x", F32, [2, 3, 5])],
                       [value_info("y_reflect", F32, [2, 6, 12]),
                        value_info("y_edge", F32, [2, 6, 8]),
                        value_info("y_wrap", F32, [2, 7, 13])], 19,
                       "Pad in reflect, edge and wrap mode on the last two axes.")
    return model, [("x", x)]


def pad_modes_self_check(x, got):
    want = {
        "y_reflect": np.pad(x, ((0, 0), (2, 1), (3, 4)), mode="reflect"),
        "y_edge": np.pad(x, ((0, 0), (1, 2), (0, 3)), mode="edge"),
        "y_wrap": np.pad(x, ((0, 0), (4, 0), (1, 7)), mode="wrap"),
    }
    for name, y in got:
        check_close(f"pad_modes {name} (numpy)", y, want[name])


def control_flow_model(sign):
    """control_flow.onnx / control_flow_else.onnx (opset 17): an If on a condition computed at
    run time (the sum of `x` positive: `x * 2`, else `x - 1`), an If on a constant (true:
    `relu(x)`), and a Loop of constant trip count 3 carrying `v` (`v * 0.5 + i`, its scan
    output `v + i` stacked). `sign` flips `x`, so that the two files take the two branches."""
    rng = rng_for("control_flow")
    x = uniform(rng, (2, 3), 0.1, 1.0) * sign
    b = Builder()
    F = onnx.TensorProto.FLOAT
    s = b.op("ReduceSum", ["x"], "sum", keepdims=0)
    zero = b.init("zero", np.array(0.0, dtype=F32))
    cond = b.op("Greater", [s, zero], "positive")
    two = b.init("two", np.array(2.0, dtype=F32))
    one = b.init("one", np.array(1.0, dtype=F32))
    then_g = helper.make_graph([helper.make_node("Mul", ["x", two], ["t_out"])], "then",
                               [], [helper.make_tensor_value_info("t_out", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", one], ["e_out"])], "else",
                               [], [helper.make_tensor_value_info("e_out", F, [2, 3])])
    b.op("If", [cond], "branch", outputs=["y_if"], then_branch=then_g, else_branch=else_g)
    always = b.const(True, np.bool_, "always")
    relu_g = helper.make_graph([helper.make_node("Relu", ["x"], ["r_out"])], "then",
                               [], [helper.make_tensor_value_info("r_out", F, [2, 3])])
    neg_g = helper.make_graph([helper.make_node("Neg", ["x"], ["n_out"])], "else",
                              [], [helper.make_tensor_value_info("n_out", F, [2, 3])])
    b.op("If", [always], "fixed", outputs=["y_fixed"], then_branch=relu_g, else_branch=neg_g)
    trips = b.init("trips", np.array(3, dtype=I64))
    half = b.init("half", np.array(0.5, dtype=F32))
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=F),
         helper.make_node("Mul", ["v", half], ["v_half"]),
         helper.make_node("Add", ["v_half", "i_f"], ["v_out"]),
         helper.make_node("Add", ["v", "i_f"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", F, [2, 3])],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F, [2, 3]),
         helper.make_tensor_value_info("scan_out", F, [2, 3])])
    b.op("Loop", [trips, "", "x"], "loop", outputs=["y_loop", "y_scan"], body=body)
    name = "control_flow" if sign > 0 else "control_flow_else"
    model = make_model(b, name, [value_info("x", F32, [2, 3])],
                       [value_info("y_if", F32, [2, 3]), value_info("y_fixed", F32, [2, 3]),
                        value_info("y_loop", F32, [2, 3]), value_info("y_scan", F32, [3, 2, 3])],
                       17, "If on a run-time and on a constant condition; a Loop of 3 "
                       "iterations with a carried value and a scan output.")
    return model, [("x", x)]


def control_flow_self_check(x, got):
    v, scans = x, []
    for i in range(3):
        scans.append(v + i)
        v = v * 0.5 + i
    want = {"y_if": x * 2 if x.sum() > 0 else x - 1, "y_fixed": np.maximum(x, 0),
            "y_loop": v, "y_scan": np.stack(scans)}
    for name, y in got:
        check_close(f"control_flow {name} (numpy)", y, want[name])


def wide_pools_model():
    """wide_pools.onnx (opset 17): windows wider than 8 x 8, as YOLO's SPPF pools (MaxPool 13
    x 13 padded by 6) and an AveragePool 9 x 9 padded by 4 without counting the padding."""
    rng = rng_for("wide_pools")
    x = uniform(rng, (1, 4, 20, 20))
    b = Builder()
    b.op("MaxPool", ["x"], "sppf", outputs=["y_max"], kernel_shape=[13, 13],
         pads=[6, 6, 6, 6], strides=[1, 1])
    b.op("AveragePool", ["x"], "avg", outputs=["y_avg"], kernel_shape=[9, 9],
         pads=[4, 4, 4, 4], strides=[1, 1], count_include_pad=0)
    model = make_model(b, "wide_pools", [value_info("x", F32, [1, 4, 20, 20])],
                       [value_info("y_max", F32, [1, 4, 20, 20]),
                        value_info("y_avg", F32, [1, 4, 20, 20])], 17,
                       "MaxPool 13 x 13 and AveragePool 9 x 9, padded to keep the size.")
    return model, [("x", x)]


def windows3d_model():
    """windows3d.onnx (opset 17): 3-D convolutions (strided, dilated, padded unevenly, with a
    bias; and grouped), 3-D pooling (MaxPool in ceil mode, AveragePool counting its padding),
    a dilated 2-D MaxPool and a 2-D AveragePool in ceil mode counting its padding."""
    rng = rng_for("windows3d")
    x = uniform(rng, (1, 3, 6, 7, 8))
    x2 = uniform(rng, (2, 2, 9, 9))
    b = Builder()
    w = b.init("w", fan_in_uniform(rng, (4, 3, 3, 2, 3), 3 * 3 * 2 * 3))
    bias = b.init("bias", uniform(rng, (4,)))
    b.op("Conv", ["x", w, bias], "conv3d", outputs=["y_conv"], kernel_shape=[3, 2, 3],
         pads=[1, 0, 1, 1, 1, 0], strides=[2, 1, 2], dilations=[1, 2, 1])
    wg = b.init("wg", fan_in_uniform(rng, (3, 1, 2, 2, 2), 8))
    b.op("Conv", ["x", wg], "conv3d_grouped", outputs=["y_grouped"], kernel_shape=[2, 2, 2],
         group=3)
    b.op("MaxPool", ["x"], "max3d", outputs=["y_max3d"], kernel_shape=[2, 3, 3],
         strides=[2, 2, 2], pads=[0, 1, 1, 0, 1, 1], ceil_mode=1)
    b.op("AveragePool", ["x"], "avg3d", outputs=["y_avg3d"], kernel_shape=[3, 2, 2],
         pads=[1, 0, 1, 1, 0, 1], count_include_pad=1)
    b.op("MaxPool", ["x2"], "max_dilated", outputs=["y_max_dilated"], kernel_shape=[2, 2],
         dilations=[2, 2])
    b.op("AveragePool", ["x2"], "avg_ceil", outputs=["y_avg_ceil"], kernel_shape=[3, 3],
         strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)
    model = make_model(b, "windows3d",
                       [value_info("x", F32, [1, 3, 6, 7, 8]), value_info("x2", F32, [2, 2, 9, 9])],
                       [value_info("y_conv", F32, [1, 4, 3, 6, 4]), value_info("y_grouped", F32, [1, 3, 5, 6, 7]),
                        value_info("y_max3d", F32, [1, 3, 3, 4, 5]), value_info("y_avg3d", F32, [1, 3, 6, 6, 9]),
                        value_info("y_max_dilated", F32, [2, 2, 7, 7]),
                        value_info("y_avg_ceil", F32, [2, 2, 5, 5])], 17,
                       "3-D convolutions and pools; a dilated and a ceil-mode 2-D pool.")
    return model, [("x", x), ("x2", x2)]


def clip_computed_model():
    """clip_computed.onnx (opset 17): Clip whose lower bound is computed at run time (the mean
    of `x`), the upper a constant; and one with only a computed upper bound."""
    rng = rng_for("clip_computed")
    x = uniform(rng, (3, 8))
    b = Builder()
    lo = b.op("ReduceMean", ["x"], "mean", keepdims=0)
    hi = b.init("hi", np.array(0.5, dtype=F32))
    b.op("Clip", ["x", lo, hi], "clip", outputs=["y"])
    top = b.op("ReduceMax", ["x"], "top", keepdims=0)
    half = b.op("Mul", [top, hi], "half_top")
    b.op("Clip", ["x", "", half], "clip_upper", outputs=["y_upper"])
    model = make_model(b, "clip_computed", [value_info("x", F32, [3, 8])],
                       [value_info("y", F32, [3, 8]), value_info("y_upper", F32, [3, 8])], 17,
                       "Clip between the mean of x and 0.5; Clip below half the max of x.")
    return model, [("x", x)]


def recurrent_model():
    """recurrent.onnx (opset 14): a bidirectional LSTM with initial states, a bidirectional GRU
    (PyTorch's linear_before_reset = 1) and a reverse GRU (linear_before_reset = 0), as OCR
    recognisers and voice-activity models use them; x is [seq 5, batch 2, input 3], hidden 4."""
    rng = rng_for("recurrent")
    seq, batch, inp, hid = 5, 2, 3, 4
    x = uniform(rng, (seq, batch, inp))
    b = Builder()

    def weights(prefix, gates, dirs):
        w = b.init(f"{prefix}.W", uniform(rng, (dirs, gates * hid, inp), -0.5, 0.5))
        r = b.init(f"{prefix}.R", uniform(rng, (dirs, gates * hid, hid), -0.5, 0.5))
        bias = b.init(f"{prefix}.B", uniform(rng, (dirs, 2 * gates * hid), -0.5, 0.5))
        return w, r, bias

    w, r, bias = weights("lstm", 4, 2)
    h0 = b.init("lstm.h0", uniform(rng, (2, batch, hid)))
    c0 = b.init("lstm.c0", uniform(rng, (2, batch, hid)))
    b.op("LSTM", ["x", w, r, bias, "", h0, c0], "lstm", outputs=["y_lstm", "y_lstm_h", "y_lstm_c"],
         hidden_size=hid, direction="bidirectional")
    w, r, bias = weights("gru", 3, 2)
    b.op("GRU", ["x", w, r, bias], "gru", outputs=["y_gru", "y_gru_h"], hidden_size=hid,
         direction="bidirectional", linear_before_reset=1)
    w, r, bias = weights("gru_reverse", 3, 1)
    g0 = b.init("gru_reverse.h0", uniform(rng, (1, batch, hid)))
    b.op("GRU", ["x", w, r, bias, "", g0], "gru_reverse", outputs=["y_gru_rev", "y_gru_rev_h"],
         hidden_size=hid, direction="reverse")
    outs = [value_info("y_lstm", F32, [seq, 2, batch, hid]),
            value_info("y_lstm_h", F32, [2, batch, hid]),
            value_info("y_lstm_c", F32, [2, batch, hid]),
            value_info("y_gru", F32, [seq, 2, batch, hid]),
            value_info("y_gru_h", F32, [2, batch, hid]),
            value_info("y_gru_rev", F32, [seq, 1, batch, hid]),
            value_info("y_gru_rev_h", F32, [1, batch, hid])]
    model = make_model(b, "recurrent", [value_info("x", F32, [seq, batch, inp])], outs, 14,
                       "A bidirectional LSTM with initial states, a bidirectional GRU "
                       "(linear_before_reset 1) and a reverse GRU (linear_before_reset 0).")
    return model, [("x", x)]


def recurrent_batch_first_model():
    """recurrent_batch_first.onnx (opset 14): the layers of recurrent.onnx laid out batch-first
    (`layout` 1, as Keras-style exporters write them): a bidirectional LSTM with initial states
    [batch, directions, hidden] and a bidirectional GRU; x is [batch 2, seq 5, input 3]."""
    rng = rng_for("recurrent_batch_first")
    seq, batch, inp, hid = 5, 2, 3, 4
    x = uniform(rng, (batch, seq, inp))
    b = Builder()

    def weights(prefix, gates):
        w = b.init(f"{prefix}.W", uniform(rng, (2, gates * hid, inp), -0.5, 0.5))
        r = b.init(f"{prefix}.R", uniform(rng, (2, gates * hid, hid), -0.5, 0.5))
        bias = b.init(f"{prefix}.B", uniform(rng, (2, 2 * gates * hid), -0.5, 0.5))
        return w, r, bias

    w, r, bias = weights("lstm", 4)
    h0 = b.init("lstm.h0", uniform(rng, (batch, 2, hid)))
    c0 = b.init("lstm.c0", uniform(rng, (batch, 2, hid)))
    b.op("LSTM", ["x", w, r, bias, "", h0, c0], "lstm", outputs=["y_lstm", "y_lstm_h", "y_lstm_c"],
         hidden_size=hid, direction="bidirectional", layout=1)
    w, r, bias = weights("gru", 3)
    b.op("GRU", ["x", w, r, bias], "gru", outputs=["y_gru", "y_gru_h"], hidden_size=hid,
         direction="bidirectional", linear_before_reset=1, layout=1)
    outs = [value_info("y_lstm", F32, [batch, seq, 2, hid]),
            value_info("y_lstm_h", F32, [batch, 2, hid]),
            value_info("y_lstm_c", F32, [batch, 2, hid]),
            value_info("y_gru", F32, [batch, seq, 2, hid]),
            value_info("y_gru_h", F32, [batch, 2, hid])]
    model = make_model(b, "recurrent_batch_first", [value_info("x", F32, [batch, seq, inp])],
                       outs, 14, "A bidirectional LSTM with initial states and a bidirectional "
                       "GRU, batch-first (layout 1).")
    return model, [("x", x)]


def recurrent_batch_first_expected(model, feeds):
    """The outputs of the batch-first model: onnxruntime runs no `layout` 1, so they are
    onnxruntime's outputs of the same layers sequence-first (x and the initial states
    transposed in, the outputs transposed back, as ONNX defines `layout` 1), checked against
    onnx.reference running the batch-first model itself."""
    seq_first = onnx.ModelProto()
    seq_first.CopyFrom(model)
    g = seq_first.graph
    for node in g.node:
        for a in node.attribute:
            if a.name == "layout":
                a.i = 0
    for t in g.initializer:
        if t.name in ("lstm.h0", "lstm.c0"):
            t.CopyFrom(numpy_helper.from_array(
                np.ascontiguousarray(numpy_helper.to_array(t).transpose(1, 0, 2)), t.name))
    for vi in list(g.input) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        old = [d.dim_value for d in dims]
        new = [old[1], old[0], *old[2:]] if len(old) != 4 else [old[1], old[2], old[0], old[3]]
        for d, v in zip(dims, new):
            d.dim_value = v
    x = dict(feeds)["x"]
    got = session(seq_first).run([o.name for o in g.output],
                                 {"x": np.ascontiguousarray(x.transpose(1, 0, 2))})
    outputs = []
    for o, res in zip(model.graph.output, got):
        res = np.asarray(res)
        res = res.transpose(2, 0, 1, 3) if res.ndim == 4 else res.transpose(1, 0, 2)
        outputs.append((o.name, np.ascontiguousarray(res)))
    ref = ReferenceEvaluator(model).run(None, dict(feeds))
    for (oname, got), want in zip(outputs, ref):
        check_close(f"recurrent_batch_first {oname} (onnx.reference)", got, want,
                    rtol=1e-4, atol=1e-5)
    return outputs


def quantized_model():
    """quantized.onnx (opset 13): float input quantized (QuantizeLinear, uint8), a QLinearConv
    with int8 weights scaled per output channel and an int32 bias, dequantized; a
    QLinearMatMul of uint8 operands; DynamicQuantizeLinear and MatMulInteger; ConvInteger of
    uint8 data and weights. Integer outputs are compared exactly."""
    rng = rng_for("quantized")
    x = uniform(rng, (1, 3, 6, 6), -2.0, 2.0).astype(F32)
    v = uniform(rng, (4, 8), -1.0, 1.0).astype(F32)
    b = Builder()
    xs = b.init("x_scale", np.array(0.02, dtype=F32))
    xz = b.init("x_zero_point", np.array(128, dtype=np.uint8))
    xq = b.op("QuantizeLinear", ["x", xs, xz], "quantize", outputs=["x_q"])
    w = b.init("w", rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8))
    ws = b.init("w_scale", (rng.uniform(0.002, 0.01, 4)).astype(F32))
    wz = b.init("w_zero_point", np.zeros(4, dtype=np.int8))
    ys = b.init("y_scale", np.array(0.05, dtype=F32))
    yz = b.init("y_zero_point", np.array(100, dtype=np.uint8))
    bias = b.init("bias", rng.integers(-500, 500, 4).astype(np.int32))
    yq = b.op("QLinearConv", [xq, xs, xz, w, ws, wz, ys, yz, bias], "qconv", outputs=["y_q"],
              pads=[1, 1, 1, 1])
    b.op("DequantizeLinear", [yq, ys, yz], "dequantize", outputs=["y"])
    vs = b.init("v_scale", np.array(0.01, dtype=F32))
    vz = b.init("v_zero_point", np.array(120, dtype=np.uint8))
    vq = b.op("QuantizeLinear", ["v", vs, vz], "quantize_v", outputs=["v_q"])
    m = b.init("m", rng.integers(0, 255, (8, 5)).astype(np.uint8))
    ms = b.init("m_scale", np.array(0.004, dtype=F32))
    mz = b.init("m_zero_point", np.array(130, dtype=np.uint8))
    ps = b.init("p_scale", np.array(0.03, dtype=F32))
    pz = b.init("p_zero_point", np.array(90, dtype=np.uint8))
    b.op("QLinearMatMul", [vq, vs, vz, m, ms, mz, ps, pz], "qmatmul", outputs=["p_q"])
    dq = b.op("DynamicQuantizeLinear", ["v"], "dynamic", n_out=3,
              outputs=["v_dq", "v_dq_scale", "v_dq_zero_point"])
    b.op("MatMulInteger", ["v_dq", m, "v_dq_zero_point", mz], "matmul_integer",
         outputs=["p_int"])
    wu = b.init("w_u8", rng.integers(0, 255, (2, 3, 3, 3)).astype(np.uint8))
    wuz = b.init("w_u8_zero_point", np.array(127, dtype=np.uint8))
    b.op("ConvInteger", [xq, wu, xz, wuz], "conv_integer", outputs=["c_int"])
    # Integer outputs as floats (the fixtures' tensors are float32): exact integers.
    for t in ["p_q", "v_dq", "v_dq_zero_point", "p_int", "c_int"]:
        b.op("Cast", [t], f"{t}_float", outputs=[f"{t}_f"], to=TensorProto.FLOAT)
    model = make_model(b, "quantized", [value_info("x", F32, [1, 3, 6, 6]),
                                        value_info("v", F32, [4, 8])],
                       [value_info("y", F32, [1, 4, 6, 6]), value_info("p_q_f", F32, [4, 5]),
                        value_info("v_dq_f", F32, [4, 8]), value_info("v_dq_scale", F32, []),
                        value_info("v_dq_zero_point_f", F32, []),
                        value_info("p_int_f", F32, [4, 5]),
                        value_info("c_int_f", F32, [1, 2, 4, 4])],
                       13, "QuantizeLinear, QLinearConv (per-channel int8 weights, int32 bias), "
                       "DequantizeLinear, QLinearMatMul, DynamicQuantizeLinear, MatMulInteger "
                       "and ConvInteger.")
    return model, [("x", x), ("v", v)]


def cnn_opset6_model(legacy=True):
    """cnn_opset6.onnx (opset 6, IR version 4): the versions PopART still reads there, with
    the broadcasting of opsets before 7 (`broadcast = 1` and `axis`: a per-channel bias and
    scale aligned at axis 1), BatchNormalization 6 (`is_test`), Dropout 6 (`is_test`),
    AveragePool 1 and Gemm 6 (`broadcast`)."""
    rng = rng_for("cnn_opset6")
    x = uniform(rng, (2, 3, 8, 8))
    b = Builder()
    w = b.init("conv.weight", fan_in_uniform(rng, (4, 3, 3, 3), 27))
    h = b.op("Conv", ["x", w], "conv", pads=[1, 1, 1, 1])
    # The reference form (`legacy` False) lays the bias out for numpy's broadcasting, as
    # onnx.version_converter's Add adapter cannot take a [4] operand at axis 1.
    bias = uniform(rng, (4,))
    bias = b.init("conv.bias", bias if legacy else bias.reshape(4, 1, 1))
    h = b.op("Add", [h, bias], "bias", broadcast=1, axis=1)
    scale = b.init("scale", uniform(rng, (4, 1, 1), 0.5, 1.5))
    h = b.op("Mul", [h, scale], "scale", broadcast=1, axis=1)
    gamma = b.init("bn.weight", uniform(rng, (4,), 0.5, 1.5))
    beta = b.init("bn.bias", uniform(rng, (4,)))
    mean = b.init("bn.running_mean", uniform(rng, (4,), -0.2, 0.2))
    var = b.init("bn.running_var", uniform(rng, (4,), 0.5, 1.5))
    h = b.op("BatchNormalization", [h, gamma, beta, mean, var], "bn", is_test=1,
             epsilon=1e-5)
    h = b.op("Relu", [h], "relu")
    h = b.op("AveragePool", [h], "pool", kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("Dropout", [h], "dropout", is_test=1, ratio=0.5)
    h = b.op("Flatten", [h], "flatten", axis=1)
    fw = b.init("fc.weight", fan_in_uniform(rng, (64, 5), 64))
    fb = b.init("fc.bias", uniform(rng, (5,)))
    h = b.op("Gemm", [h, fw, fb], "fc", broadcast=1)
    b.op("Softmax", [h], "softmax", outputs=["y"], axis=1)
    model = make_model(b, "cnn_opset6", [value_info("x", F32, [2, 3, 8, 8])],
                       [value_info("y", F32, [2, 5])], 6,
                       "Conv, Add and Mul with opset-6 broadcasting at axis 1, "
                       "BatchNormalization 6, Relu, AveragePool 1, Dropout 6, Flatten, Gemm 6, "
                       "Softmax.", ir_version=4)
    return model, [("x", x)]


def upsample_opset9_model():
    """upsample_opset9.onnx: Upsample 9 (nearest, scales as an input), as YOLOv3 exports."""
    rng = rng_for("upsample_opset9")
    x = uniform(rng, (1, 2, 3, 3))
    b = Builder()
    scales = b.init("scales", np.array([1.0, 1.0, 2.0, 2.0], dtype=F32))
    b.op("Upsample", ["x", scales], "up", outputs=["y"], mode="nearest")
    model = make_model(b, "upsample_opset9", [value_info("x", F32, [1, 2, 3, 3])],
                       [value_info("y", F32, [1, 2, 6, 6])], 9,
                       "Upsample 9, nearest, by 2 along H and W.", ir_version=4)
    return model, [("x", x)]


def matmul_fixed_model():
    """matmul_fixed.onnx: X[5, 3] . Y[3, 4], both shapes fixed by the file (the batch of X
    is 5; Y's first axis is 3 and must stay 3)."""
    rng = rng_for("matmul_fixed")
    x = uniform(rng, (5, 3))
    y = uniform(rng, (3, 4))
    b = Builder()
    b.op("MatMul", ["X", "Y"], "matmul", outputs=["Z"])
    model = make_model(b, "matmul_fixed", [value_info("X", F32, [5, 3]),
                                          value_info("Y", F32, [3, 4])],
                       [value_info("Z", F32, [5, 4])], 17,
                       "One MatMul of two inputs of fixed shapes, X[5, 3] and Y[3, 4].")
    return model, [("X", x), ("Y", y)]


def cnn_opset9_self_check(model, x, y):
    """cnn_opset9 in numpy, from its initializers."""
    w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = x.astype(np.float64)

    def conv(x, k, pad):
        n, c, hh, ww = x.shape
        o, _, kh, kw = k.shape
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        out = np.zeros((n, o, hh + 2 * pad - kh + 1, ww + 2 * pad - kw + 1))
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, :, i:i + out.shape[2], j:j + out.shape[3]]
                out += np.einsum("nchw,oc->nohw", patch, k[:, :, i, j])
        return out

    h = conv(x, w["conv1.weight"], 1) + w["conv1.bias"].reshape(1, -1, 1, 1)
    p = {k: w[f"bn1.{k}"].reshape(1, -1, 1, 1)
         for k in ("weight", "bias", "running_mean", "running_var")}
    h = (h - p["running_mean"]) / np.sqrt(p["running_var"] + 1e-5) * p["weight"] + p["bias"]
    h = np.clip(h, 0.0, 6.0)
    # LRN over 3 channels: one before and one after each (zeros beyond the ends).
    sq = np.pad(h * h, ((0, 0), (1, 1), (0, 0), (0, 0)))
    window = sq[:, :-2] + sq[:, 1:-1] + sq[:, 2:]
    h = h / (2.0 + 0.01 / 3 * window) ** 0.75
    n, c, hh, ww = h.shape
    h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
    lo, hi = h[:, :4], h[:, 4:]
    h = conv(lo, w["conv2.weight"], 0) + hi
    h = h[:, :, 1:5, 0:6].mean(axis=(2, 3))
    z = h @ w["fc.weight"].T + w["fc.bias"]
    z = np.exp(z - z.max(axis=1, keepdims=True))
    check_close("cnn_opset9 (numpy)", y, z / z.sum(axis=1, keepdims=True))


STRIP_LIMIT = 8  # elements; data/onnx used strip.py's default of 1024 for full-size models


def strip_tensor(t, limit):
    """As data/onnx/export/strip.py: float tensors of more than `limit` elements
    keep name, type and dims but lose their bytes, marked EXTERNAL at
    `__stripped__` (offset 0, length the byte size)."""
    n = 1
    for d in t.dims:
        n *= d
    if n <= limit or t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                         TensorProto.BFLOAT16, TensorProto.DOUBLE):
        return False
    nbytes = n * {TensorProto.FLOAT: 4, TensorProto.DOUBLE: 8}.get(t.data_type, 2)
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.ClearField("external_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "__stripped__"), ("offset", "0"), ("length", str(nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return True


def stripped_model():
    """cnn.onnx's graph (its fc weight as a Constant node, which strip.py also
    strips) with float tensors of more than 8 elements stripped: conv and fc
    weights, conv3 and fc biases lose their bytes; the 8-channel batch-norm
    parameters, conv1/conv2 biases and the Clip scalars keep theirs."""
    model, _ = cnn_model(fc_weight_as_constant=True)
    model.graph.name = "stripped"
    count = sum(strip_tensor(t, STRIP_LIMIT) for t in model.graph.initializer)
    for node in model.graph.node:
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    count += strip_tensor(a.t, STRIP_LIMIT)
    model.graph.output[0].CopyFrom(value_info("logits", F32, [2, 10]))
    model.doc_string = ("cnn.onnx's graph with the bytes of every float tensor of more than "
                        f"{STRIP_LIMIT} elements removed ({count} tensors, one of them a "
                        "Constant node's value): data_location EXTERNAL, location "
                        "__stripped__ (absent), offset 0, length in bytes.")
    return model, count


def check_stripped(model):
    """onnx.checker requires every external data file to exist (relative to the
    model's directory, or to the working directory for a model in memory), so a
    stripped model passes only next to a file named `__stripped__`; its size is
    not checked. Check it in a temporary directory holding an empty one."""
    with tempfile.TemporaryDirectory(prefix="onnxfx_") as tmp:
        (Path(tmp) / "__stripped__").write_bytes(b"")
        path = Path(tmp) / "stripped.onnx"
        path.write_bytes(model.SerializeToString())
        onnx.checker.check_model(str(path), full_check=True)
    # Shape inference needs no weight bytes: the output comes out as declared (for
    # stripped.onnx, cnn.onnx's logits).
    inferred = shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    if elem_dims(inferred.graph.output[0])[1] != elem_dims(model.graph.output[0])[1]:
        raise AssertionError(f"{model.graph.name}: output shape")


WIDE_MLP_WIDTH = 2048
WIDE_MLP_LAYERS = 17


def wide_mlp_model():
    """A weight-free MLP too big to train on one IPU: 17 Gemm layers (2048 wide,
    the last to 10 classes) with ReLU between, 63 M parameters whose bytes are
    stripped as in stripped.onnx (every initializer external and absent). Trained
    with Adam at batch 8 it does not fit on one Mk1 IPU, and split automatically
    (pipelined, with the optimizer state offloaded as TensorFlow does by default)
    it needs three: the fewest-IPUs search of `tessera estimate` has something to
    find, past the first doubling."""
    width, layers, classes = WIDE_MLP_WIDTH, WIDE_MLP_LAYERS, 10
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        out = classes if i == layers - 1 else width
        for name, dims in ((f"dense_{i}.weight", [width, out]), (f"dense_{i}.bias", [out])):
            t = TensorProto()
            t.name, t.data_type = name, TensorProto.FLOAT
            t.dims.extend(dims)
            t.raw_data = b"\0"  # stripped below: data_location EXTERNAL, no bytes
            strip_tensor(t, 0)
            inits.append(t)
        nodes.append(helper.make_node("Gemm", [x, f"dense_{i}.weight", f"dense_{i}.bias"],
                                      [f"dense_{i}"], name=f"dense_{i}"))
        x = f"dense_{i}"
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [x], [f"relu_{i}"], name=f"relu_{i}"))
            x = f"relu_{i}"
    graph = helper.make_graph(nodes, "wide_mlp", [value_info("x", F32, [1, width])],
                              [value_info(x, F32, [1, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION, producer_name=PRODUCER)
    model.doc_string = (f"A {layers}-layer MLP {width} wide (weights stripped, location "
                        "__stripped__ absent), too big to train with Adam on one IPU.")
    inferred = shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    if elem_dims(inferred.graph.output[0])[1] != [1, classes]:
        raise AssertionError("wide_mlp: output shape")
    return model


def light_cnn_model():
    """cnn.onnx in the form of the onnx package's light models.

    onnx/backend/test/data/light/light_*.onnx (onnx-caffe2 exports, IR version 3,
    opset 9) were made with onnx.tools.replace_constants.
    replace_initializer_by_constant_of_shape(threshold=128,
    value_constant_of_shape=0.02): each float initializer W of more than 128
    elements is replaced by an INT64 initializer `W__SHAPE` (1-D, W's dims, as
    raw_data) and a node `ConstantOfShape(W__SHAPE) -> W` whose `value` attribute
    is a FLOAT tensor of dims [1] holding 0.02 in float_data (not raw_data);
    smaller initializers (biases, batch-norm vectors of <= 128 channels) keep
    their real values. As IR 3 requires, every initializer, `W__SHAPE` ones
    included, is also listed as a graph input. This fixture does the same to
    cnn.onnx (opset 17, IR 10, so that it exercises the ConstantOfShape path
    rather than the opset check): conv1, conv2 and fc weights (216, 288 and 160
    elements) become ConstantOfShape nodes; conv3's weight (128 elements) and the
    vectors keep their values."""
    model, _ = cnn_model()
    g = model.graph
    # Initializers listed as graph inputs too, as in the shipped IR-3 files.
    inputs = list(g.input) + [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer
    ]
    del g.input[:]
    g.input.extend(inputs)
    # ir_version=3 makes the tool also list the new `__SHAPE` initializers as inputs.
    new_graph = replace_initializer_by_constant_of_shape(
        g, threshold=128, ir_version=3, value_constant_of_shape=0.02)
    new_graph.name = "light_cnn"
    light = helper.make_model(new_graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=IR_VERSION, producer_name=PRODUCER)
    light.graph.output[0].CopyFrom(value_info("logits", F32, [2, 10]))
    light.doc_string = ("cnn.onnx with its float initializers of more than 128 elements "
                        "replaced by ConstantOfShape(W__SHAPE) nodes filled with 0.02, "
                        "as the onnx package's light models; initializers also listed "
                        "as graph inputs.")
    return light


# ---------------------------------------------------------------------------
# Main


def ops_of(model):
    return sorted({n.op_type for n in model.graph.node})


def opset_of(model):
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def save_model(name, model, external=False):
    """Writes NAME.onnx; with `external`, every tensor's bytes (initializers and
    Constant attributes) go to NAME.onnx.data beside it, one after another, each
    named by location, offset and length as large exports store their weights."""
    path = OUT_DIR / f"{name}.onnx"
    data = model.SerializeToString()
    if len(data) >= MAX_MODEL_BYTES:
        raise ValueError(f"{name}.onnx is {len(data)} bytes")
    if not external:
        path.write_bytes(data)
        return path.name
    data_name = f"{name}.onnx.data"
    # onnx appends to an existing data file: start from none.
    (OUT_DIR / data_name).unlink(missing_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=data_name, size_threshold=0,
                    convert_attribute=True)
    saved = onnx.load_model(str(path), load_external_data=False)
    if not all(t.data_location == TensorProto.EXTERNAL for t in saved.graph.initializer):
        raise AssertionError(f"{name}: some initializer is not external")
    onnx.checker.check_model(str(path), full_check=True)
    return path.name


def io_entry(vi, file=None):
    elem, dims = elem_dims(vi)
    dtype = {TensorProto.FLOAT: "f32", TensorProto.INT64: "i64", TensorProto.DOUBLE: "f64"}[elem]
    shape = [d.dim_value if d.HasField("dim_value") else d.dim_param
             for d in vi.type.tensor_type.shape.dim]
    entry = {"name": vi.name, "dtype": dtype, "shape": shape}
    if file is not None:
        entry["file"] = file
    return entry


def numerics_fixtures():
    """Returns the manifest entries of the models with weights."""
    entries = []

    def emit(name, model, feeds, self_check=None, external=False, reference=True,
             via_opset7=None, expected=None):
        if expected is not None:
            # Outputs computed elsewhere (a model onnxruntime does not run), checked there.
            onnx.checker.check_model(model, full_check=True)
            outputs = expected
        elif via_opset7 is not None:
            # onnxruntime runs no opset below 7: the reference outputs are those of
            # `via_opset7` (the same model with numpy-broadcastable operands) converted by
            # onnx.version_converter.
            converted = version_converter.convert_version(via_opset7, 7)
            _, outputs = finish_numerics(name, converted, feeds, reference)
            onnx.checker.check_model(model, full_check=True)
        else:
            model, outputs = finish_numerics(name, model, feeds, reference)
        if self_check is not None:
            self_check(model, feeds, outputs)
        file = save_model(name, model, external)
        if external:
            # onnxruntime reading the file and its data from disk gives the same outputs.
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(str(OUT_DIR / file), opts,
                                        providers=["CPUExecutionProvider"])
            for (oname, want), got in zip(outputs, sess.run(None, dict(feeds))):
                check_close(f"{name} {oname} (from disk)", got, want, rtol=0, atol=0)
        in_files = []
        for i, (iname, arr) in enumerate(feeds):
            f = f"{name}.input.json" if len(feeds) == 1 else f"{name}.input{i}.json"
            write_json(OUT_DIR / f, tensor_json(iname, arr))
            in_files.append(f)
        out_files = []
        for i, (oname, arr) in enumerate(outputs):
            f = f"{name}.output.json" if len(outputs) == 1 else f"{name}.output{i}.json"
            write_json(OUT_DIR / f, tensor_json(oname, arr))
            out_files.append(f)
        entries.append({
            "name": name,
            "file": file,
            "opset": opset_of(model),
            "ops": ops_of(model),
            "nodes": len(model.graph.node),
            "params": int(sum(np.prod(t.dims, dtype=np.int64) for t in model.graph.initializer
                              if t.data_type == TensorProto.FLOAT and len(t.dims) > 0)),
            "inputs": [io_entry(vi, f) for vi, f in zip(model.graph.input, in_files)],
            "outputs": [io_entry(vi, f) for vi, f in zip(model.graph.output, out_files)],
            "source": ORT_SOURCE,
            "doc": model.doc_string,
        })

    # cnn: check the activations clip at both ends of ReLU6.
    model, feeds = cnn_model()
    debug = onnx.ModelProto()
    debug.CopyFrom(model)
    debug.graph.output.extend([helper.make_tensor_value_info("conv3/Conv_output_0",
                                                             TensorProto.FLOAT, None)])
    pre = session(debug).run(["conv3/Conv_output_0"], dict(feeds))[0]
    if not (np.mean(pre < 0) > 0.1 and np.mean(pre > 6) > 0.01):
        raise AssertionError("cnn: ReLU6 does not clip at both ends")
    emit("cnn", model, feeds)
    # The same model saved as large exports are: its weights in an external data file.
    model, feeds = cnn_model()
    model.doc_string += " Weights in cnn_external.onnx.data (external data)."
    emit("cnn_external", model, feeds, external=True)

    model, feeds = cnn_opset20_model()
    emit("cnn_opset20", model, feeds,
         lambda m, f, o: cnn_opset20_self_check(m, f[0][1], o[0][1]))

    ids, w = transformer_weights()
    model, feeds = transformer_model()
    emit("transformer", model, feeds,
         lambda m, f, o: transformer_self_check(ids, w, o[0][1], "erf"))
    model, feeds = transformer_opset14_model()
    emit("transformer_opset14", model, feeds,
         lambda m, f, o: transformer_self_check(ids, w, o[0][1], "tanh"))

    for case in ("lstm", "lstm_noinit"):
        model, feeds = lstm_model(case)
        emit(case, model, feeds,
             lambda m, f, o, case=case: lstm_self_check(case, m, f[0][1], o[0][1]))

    model, feeds = gpt_block_model()
    emit("gpt_block", model, feeds)

    # onnx.reference's BatchNormalization 9 normalises with the batch's statistics (onnx
    # 1.23.2), onnxruntime with the running ones as the operator's inference form does:
    # numpy checks this model instead.
    model, feeds = cnn_opset9_model()
    emit("cnn_opset9", model, feeds, lambda m, f, o: cnn_opset9_self_check(m, f[0][1], o[0][1]),
         reference=False)

    model, feeds = activations_model()
    emit("activations", model, feeds)
    # onnx.reference's GlobalMaxPool reduces axes 2 and 3 whatever the rank (onnx 1.23.2):
    # numpy checks this model instead.
    model, feeds = window1d_model()
    emit("window1d", model, feeds, lambda m, f, o: window1d_self_check(m, f[0][1], o),
         reference=False)
    model, feeds = einsum_model()
    emit("einsum", model, feeds, lambda m, f, o: einsum_self_check(m, f, o))
    # onnx.reference's ConvTranspose reads group 2 as 1 (onnx 1.23.2): numpy checks this one.
    model, feeds = conv_transpose_model()
    emit("conv_transpose", model, feeds,
         lambda m, f, o: conv_transpose_self_check(m, f[0][1], f[1][1], o), reference=False)
    # onnx.reference's Pad refuses negative pads: numpy checks this one.
    model, feeds = pad_crop_model()
    emit("pad_crop", model, feeds, lambda m, f, o: pad_crop_self_check(f[0][1], o[0][1]),
         reference=False)
    model, feeds = pad_modes_model()
    emit("pad_modes", model, feeds, lambda m, f, o: pad_modes_self_check(f[0][1], o))
    for sign, name in [(1.0, "control_flow"), (-1.0, "control_flow_else")]:
        model, feeds = control_flow_model(sign)
        # onnx.reference's Loop fails on a loop without a condition (onnx 1.23.2): numpy
        # checks these.
        emit(name, model, feeds, lambda m, f, o: control_flow_self_check(f[0][1], o),
             reference=False)
    model, feeds = wide_pools_model()
    emit("wide_pools", model, feeds)
    model, feeds = windows3d_model()
    emit("windows3d", model, feeds)
    model, feeds = clip_computed_model()
    emit("clip_computed", model, feeds)
    model, feeds = recurrent_model()
    emit("recurrent", model, feeds)
    model, feeds = recurrent_batch_first_model()
    emit("recurrent_batch_first", model, feeds,
         expected=recurrent_batch_first_expected(model, feeds))
    # onnx.reference has no DequantizeLinear 13 (onnx 1.23.2): onnxruntime alone.
    model, feeds = quantized_model()
    emit("quantized", model, feeds, reference=False)
    model, feeds = cnn_opset6_model()
    emit("cnn_opset6", model, feeds, reference=False, via_opset7=cnn_opset6_model(False)[0])
    model, feeds = upsample_opset9_model()
    emit("upsample_opset9", model, feeds,
         lambda m, f, o: check_close("upsample_opset9 (numpy)", o[0][1],
                                     f[0][1].repeat(2, axis=2).repeat(2, axis=3)))

    model, feeds = matmul_fixed_model()
    emit("matmul_fixed", model, feeds,
         lambda m, f, o: check_close("matmul_fixed (numpy)", o[0][1],
                                     f[0][1].astype(np.float64) @ f[1][1].astype(np.float64)))
    return entries


def other_fixtures():
    """Returns the manifest entries of the error and weight-free models."""
    entries = []

    def emit(name, model, expect, stripped=False, checked=False):
        if stripped:
            check_stripped(model)
        elif not checked:
            onnx.checker.check_model(model, full_check=True)
        file = save_model(name, model)
        if not stripped and not checked:
            onnx.checker.check_model(str(OUT_DIR / file), full_check=True)
        entries.append({
            "name": name,
            "file": file,
            "opset": opset_of(model),
            "ops": ops_of(model),
            "inputs": [io_entry(vi) for vi in model.graph.input
                       if vi.name not in {t.name for t in model.graph.initializer}],
            "outputs": [io_entry(vi) for vi in model.graph.output],
            "expect": expect,
            "doc": model.doc_string,
        })

    model = unsupported_op_model()
    session(model)  # onnxruntime runs it: only the importer lacks the op
    emit("unsupported_op", model,
         {"error": "unsupported", "node": "my_det", "op": "Det"})

    model = unsupported_ops_model()
    onnx.checker.check_model(model)  # MyOp has no schema: the full check cannot type it
    emit("unsupported_ops", model,
         {"error": "unsupported_ops", "ops": ["Det", "NonZero", "com.example.MyOp"]},
         checked=True)

    model = double_model()
    session(model)
    emit("double", model, {"error": "float_type", "tensor": "x"})

    model = dynamic_batch_model()
    session(model)
    emit("dynamic_batch", model,
         {"error": "unbound_dim", "input": "x", "axis": 0, "param": "batch",
          "note": "imports when a batch size is given"})

    # onnxruntime no longer runs opset 6's Gemm; the checker reads the model.
    model = old_opset_model()
    onnx.checker.check_model(model, full_check=True)
    emit("old_opset", model, {"error": "opset", "opset": 5})

    model, count = stripped_model()
    emit("stripped", model,
         {"error": "no_weights_for_numerics", "stripped_tensors": count,
          "note": "imports for estimates (shapes as cnn.onnx); running numerics fails"},
         stripped=True)

    model = wide_mlp_model()
    emit("wide_mlp", model,
         {"error": "no_weights_for_numerics",
          "note": "imports for estimates; training it with Adam at batch 8 needs more than "
                  "one IPU (tessera estimate's fewest-IPUs search)"},
         stripped=True)

    model = light_cnn_model()
    session(model)  # onnxruntime runs it (every replaced weight is 0.02)
    n_cos = sum(n.op_type == "ConstantOfShape" for n in model.graph.node)
    emit("light_cnn", model,
         {"error": "no_weights_for_numerics", "constant_of_shape_weights": n_cos,
          "note": "imports for estimates (shapes as cnn.onnx); running numerics fails"})
    return entries


README = """\
# ONNX importer fixtures

Small ONNX models for the ONNX importer, written by
`scripts/make_onnx_fixtures.py` (do not edit them by hand: change the script and
re-run it; see its docstring). Built with onnx.helper (onnx {onnx_version}) and
{np} from fixed seeds; reference outputs by {ort} (CPU, one
thread, graph optimisations off), each cross-checked against onnx's reference
evaluator (onnx.reference) and, for all but `cnn` and `gpt_block`, a float64
numpy computation. `manifest.json` lists every model with its opset, ops, inputs
and outputs, and for the second group below what the importer must report.

Numerics models (weights embedded as initializers with raw_data; intermediate
shapes stored as `value_info`):

| model | opset | input | output |
|---|---|---|---|
{numerics_table}

For each, `NAME.input.json` is the reference input and `NAME.output.json`
onnxruntime's output. Each holds one tensor as the operator fixtures do
(`tests/fixtures/ops/`): `{{"name", "shape", "dtype", "data"}}` with `data` flat
and row-major, `dtype` `f32` or `i64`, every float the exact value of a float32
written as a double. `name` is the graph input or output name. Outputs agree
with onnxruntime and the reference evaluator within 1e-4 relative.

Models the importer must reject, or import without weights:

| model | opset | what | expected |
|---|---|---|---|
{other_table}

`stripped.onnx` refers to an external file `__stripped__` that does not exist:
`onnx.load` needs `load_external_data=False`, and `onnx.checker` (which requires
external data files to exist, relative to the model's directory, or to the
working directory for a model in memory) passes only with a file of that name
present; the script checks it next to an empty one. `light_cnn.onnx` follows
the form of the "light" models the onnx package ships (`onnx/backend/test/data/light/`, which
are opset 9 and IR version 3): each weight of more than 128 elements is an INT64
initializer `W__SHAPE` and a node `ConstantOfShape(W__SHAPE) -> W` filled with
0.02 (a FLOAT tensor of dims [1] in `float_data`), and every initializer is also
listed as a graph input.
"""


def main():
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    numerics = numerics_fixtures()
    others = other_fixtures()
    manifest = {
        "generator": "scripts/make_onnx_fixtures.py",
        "source": ORT_SOURCE,
        "onnx": onnx.__version__,
        "tensor_format": "one tensor per file: {name, shape, dtype, data}, as tests/fixtures/ops/",
        "numerics": numerics,
        "errors": others,  # rejected at import, or importable without weights
    }
    text = json.dumps(manifest, indent=1, allow_nan=False) + "\n"
    (OUT_DIR / "manifest.json").write_text(text, encoding="utf-8")

    def shape(e):
        return "x".join(str(d) for d in e["shape"])

    numerics_table = "\n".join(
        f"| `{e['file']}` | {e['opset']} | `{e['inputs'][0]['name']}` "
        f"{e['inputs'][0]['dtype']} {shape(e['inputs'][0])} | `{e['outputs'][0]['name']}` "
        f"{shape(e['outputs'][0])} |" for e in numerics)
    other_table = "\n".join(
        f"| `{e['file']}` | {e['opset']} | {e['doc']} | `{e['expect']['error']}` |"
        for e in others)
    readme = README.format(onnx_version=onnx.__version__, np=f"numpy {np.__version__}",
                           ort=ORT_SOURCE, numerics_table=numerics_table,
                           other_table=other_table)
    (OUT_DIR / "README.md").write_text(readme, encoding="utf-8")
    total = sum(p.stat().st_size for p in OUT_DIR.iterdir())
    print(f"wrote {len(numerics)} numerics models, {len(others)} error models, "
          f"manifest.json and README.md to tests/fixtures/onnx/ ({total} bytes)")


if __name__ == "__main__":
    main()
