#!/usr/bin/env python3
"""Write reference fixtures for neural-network operators to tests/fixtures/ops/.

Each case is one small JSON file, computed by onnxruntime (a one-node or
few-node ONNX graph built with onnx.helper) or, where onnxruntime has no
matching operator, by numpy in float64 and rounded to float32. Inputs come from
a fixed numpy seed per case, so re-running the script rewrites identical bytes.
The output directory is tests/fixtures/ops/ relative to the repository root,
which is found from this script's own location (scripts/..).

Run it from the repository root:

    python3 -m venv .venv && .venv/bin/pip install -r scripts/requirements-fixtures.txt && .venv/bin/python scripts/make_op_fixtures.py

File format (keys in this order, compact JSON, one trailing newline):

    {"case": name, "op": ONNX op type or short name, "attrs": {...},
     "inputs":  [{"name", "shape", "dtype", "data"}, ...],
     "outputs": [{"name", "shape", "dtype", "data"}, ...],
     "source": "onnxruntime X.Y.Z" or "numpy X.Y.Z"}

"data" is flat and row-major. dtype is "f32", "i64" or "bool" (0/1 ints).
Every float is written as the exact value of the float32 as a double, so that
parsing it as f64 and casting to f32 is exact.
"""

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "ops"

ORT_SOURCE = f"onnxruntime {ort.__version__}"
NP_SOURCE = f"numpy {np.__version__}"

# ONNX opset used unless a case needs a newer operator version.
OPSET = 17
IR_VERSION = 10

F32 = np.float32

# One fixed seed per case (not derived from the order, so adding a case does
# not change the others). conv_nhwc reuses conv_stride_pad's seed on purpose.
SEEDS = {
    "conv_basic": 101,
    "conv_stride_pad": 102,
    "conv_same": 103,
    "conv_dilation": 104,
    "conv_groups": 105,
    "conv_depthwise": 106,
    "conv_1x1": 107,
    "maxpool_2x2": 201,
    "maxpool_3x3_pad": 202,
    "avgpool_3x3_pad": 203,
    "globalavgpool": 204,
    "batchnorm_inference": 301,
    "batchnorm_training": 302,
    "layernorm_last": 303,
    "layernorm_last2": 304,
    "groupnorm": 305,
    "attention": 401,
    "batched_matmul_broadcast": 402,
    "batched_matmul_broadcast2": 403,
    "gelu": 404,
    "softmax_axis1": 405,
    "transpose": 406,
    "reduce": 407,
    "gather_embedding": 408,
    "elementwise_broadcast": 409,
    "where_mask": 410,
    "clip_relu6": 411,
    "lstm": 501,
    "lstm_no_init": 502,
}


# ---------------------------------------------------------------------------
# Helpers


def rng_for(key):
    return np.random.default_rng(SEEDS[key])


def uniform(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(F32)


def away_from_zero(rng, shape, lo=0.5, hi=1.0):
    mag = rng.uniform(lo, hi, size=shape)
    sign = np.where(rng.uniform(0.0, 1.0, size=shape) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(F32)


ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}

DTYPE_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.int64): "i64",
    np.dtype(np.int32): "i32",
    np.dtype(np.bool_): "bool",
}


def tensor(name, arr):
    arr = np.ascontiguousarray(arr)
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


def run_ort(nodes, inputs, output_names, opset=OPSET):
    """Run a graph of `nodes` on named numpy inputs; return the named outputs."""
    graph_inputs = [
        helper.make_tensor_value_info(name, ONNX_TYPES[arr.dtype], list(arr.shape))
        for name, arr in inputs
    ]

    def build(output_shapes):
        graph_outputs = [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
            for name, shape in zip(output_names, output_shapes)
        ]
        graph = helper.make_graph(nodes, "fixture", graph_inputs, graph_outputs)
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
        )

    model = build([None] * len(output_names))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # Run the operators as written, without fusions into contrib kernels.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    results = sess.run(output_names, {name: arr for name, arr in inputs})
    out = []
    for name, res in zip(output_names, results):
        res = np.asarray(res)
        if res.dtype != np.float32:
            raise TypeError(f"output {name} has dtype {res.dtype}")
        out.append(res)
    # Validate the graph, now with the output shapes onnxruntime produced (the
    # checker and strict shape inference must agree with them).
    onnx.checker.check_model(build([list(r.shape) for r in out]), full_check=True)
    return out


def run_single(op_type, inputs, output_names, attrs=None, opset=OPSET, input_names=None):
    """One ONNX node. `input_names` may contain "" for omitted optional inputs."""
    if input_names is None:
        input_names = [name for name, _ in inputs]
    node = helper.make_node(op_type, input_names, output_names, **(attrs or {}))
    return run_ort([node], inputs, output_names, opset=opset)


def check_close(name, got, want, rtol=1e-4, atol=1e-5):
    """Self-check of a fixture against an independent numpy computation."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
        diff = np.max(np.abs(got - want)) if got.shape == want.shape else "shape"
        raise AssertionError(f"self-check failed for {name}: max diff {diff}")


def fixture(case, op, attrs, inputs, outputs, source):
    return {
        "case": case,
        "op": op,
        "attrs": attrs,
        "inputs": [tensor(n, a) for n, a in inputs],
        "outputs": [tensor(n, a) for n, a in outputs],
        "source": source,
    }


# ---------------------------------------------------------------------------
# Convolution


def conv_reference(x, w, b, strides, pads, dilations, group):
    """Direct NCHW / OIHW convolution in float64 (used only to self-check)."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    sh, sw = strides
    dh, dw = dilations
    pt, pl, pb, pr = pads
    xp = np.zeros((n, c, h + pt + pb, wd + pl + pr))
    xp[:, :, pt : pt + h, pl : pl + wd] = x
    oh = (h + pt + pb - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + pl + pr - (dw * (kw - 1) + 1)) // sw + 1
    y = np.zeros((n, o, oh, ow))
    og = o // group
    for oc in range(o):
        g = oc // og
        for i in range(oh):
            for j in range(ow):
                patch = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    i * sh : i * sh + dh * (kh - 1) + 1 : dh,
                    j * sw : j * sw + dw * (kw - 1) + 1 : dw,
                ]
                y[:, oc, i, j] = np.sum(patch * w[oc], axis=(1, 2, 3))
    if b is not None:
        y += b.astype(np.float64)[None, :, None, None]
    return y


def same_pads(in_hw, k_hw, strides, dilations):
    """TensorFlow/Keras SAME rule; returns ONNX-order pads [top, left, bottom, right]."""
    begin, end = [], []
    for n_in, k, s, d in zip(in_hw, k_hw, strides, dilations):
        out = -(-n_in // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n_in, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return begin + end


def conv_case(case, seed_key, x_shape, w_shape, bias=True, strides=(1, 1), pads=None,
              dilations=(1, 1), group=1, padding=None):
    rng = rng_for(seed_key)
    x = uniform(rng, x_shape)
    w = uniform(rng, w_shape)
    b = uniform(rng, (w_shape[0],)) if bias else None
    if padding == "same":
        pads = same_pads(x_shape[2:], w_shape[2:], strides, dilations)
    if pads is None:
        pads = [0, 0, 0, 0]
    onnx_attrs = {
        "strides": list(strides),
        "pads": list(pads),
        "dilations": list(dilations),
        "group": group,
        "kernel_shape": list(w_shape[2:]),
    }
    inputs = [("x", x), ("w", w)] + ([("bias", b)] if bias else [])
    (y,) = run_single("Conv", inputs, ["y"], onnx_attrs)
    check_close(case, y, conv_reference(x, w, b, strides, pads, dilations, group))
    if padding == "same":
        # onnxruntime's SAME_UPPER puts the odd extra pad at the end, as TF does.
        auto = dict(onnx_attrs)
        del auto["pads"]
        auto["auto_pad"] = "SAME_UPPER"
        (y_auto,) = run_single("Conv", inputs, ["y"], auto)
        check_close(case + " (auto_pad)", y_auto, y, rtol=0, atol=0)
    attrs = {
        "strides": list(strides),
        "pads": list(pads),
        "dilations": list(dilations),
        "group": group,
        "layout": "NCHW",
        "weight_layout": "OIHW",
    }
    if padding is not None:
        attrs["padding"] = padding
    return x, w, b, y, attrs, inputs


def conv_fixtures():
    out = []
    specs = [
        ("conv_basic", dict(x_shape=(2, 3, 6, 7), w_shape=(4, 3, 3, 3))),
        ("conv_stride_pad", dict(x_shape=(2, 3, 7, 8), w_shape=(5, 3, 3, 2),
                                 strides=(2, 1), pads=[1, 0, 2, 1])),
        ("conv_same", dict(x_shape=(1, 2, 7, 6), w_shape=(3, 2, 3, 3),
                           strides=(2, 2), padding="same")),
        ("conv_dilation", dict(x_shape=(1, 3, 9, 9), w_shape=(2, 3, 3, 3),
                               dilations=(2, 3), pads=[1, 1, 1, 1])),
        ("conv_groups", dict(x_shape=(2, 4, 5, 5), w_shape=(6, 2, 3, 3),
                             group=2, pads=[1, 1, 1, 1])),
        ("conv_depthwise", dict(x_shape=(1, 6, 6, 6), w_shape=(6, 1, 3, 3),
                                group=6, strides=(2, 2), pads=[1, 1, 1, 1])),
        ("conv_1x1", dict(x_shape=(2, 8, 4, 4), w_shape=(5, 8, 1, 1), bias=False)),
    ]
    for case, spec in specs:
        _, _, _, y, attrs, inputs = conv_case(case, case, **spec)
        out.append(fixture(case, "Conv", attrs, inputs, [("y", y)], ORT_SOURCE))

    # NHWC / HWIO versions: computed in NCHW / OIHW and transposed.
    nhwc_specs = [
        ("conv_nhwc", "conv_stride_pad", specs[1][1]),
        ("conv_nhwc_depthwise", "conv_depthwise", specs[5][1]),
    ]
    for case, seed_key, spec in nhwc_specs:
        x, w, b, y, attrs, _ = conv_case(case, seed_key, **spec)
        attrs["layout"] = "NHWC"
        attrs["weight_layout"] = "HWIO"
        x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
        # OIHW [out, in/groups, kh, kw] -> HWIO [kh, kw, in/groups, out]; for
        # depthwise (multiplier 1) this is [kh, kw, 1, channels].
        w_hwio = np.ascontiguousarray(w.transpose(2, 3, 1, 0))
        y_nhwc = np.ascontiguousarray(y.transpose(0, 2, 3, 1))
        inputs = [("x", x_nhwc), ("w", w_hwio)] + ([("bias", b)] if b is not None else [])
        out.append(fixture(case, "Conv", attrs, inputs, [("y", y_nhwc)], ORT_SOURCE))
    return out


# ---------------------------------------------------------------------------
# Pooling


def pool_fixtures():
    out = []

    rng = rng_for("maxpool_2x2")
    x = uniform(rng, (2, 3, 6, 6))
    a = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0]}
    (y,) = run_single("MaxPool", [("x", x)], ["y"], a)
    check_close("maxpool_2x2", y, x.reshape(2, 3, 3, 2, 3, 2).max(axis=(3, 5)), 0, 0)
    out.append(fixture("maxpool_2x2", "MaxPool", {**a, "layout": "NCHW"},
                       [("x", x)], [("y", y)], ORT_SOURCE))

    rng = rng_for("maxpool_3x3_pad")
    x = uniform(rng, (1, 2, 7, 7))
    a = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    (y,) = run_single("MaxPool", [("x", x)], ["y"], a)
    xp = np.full((1, 2, 9, 9), -np.inf, dtype=np.float64)
    xp[:, :, 1:8, 1:8] = x
    want = np.array([[[[xp[n, c, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max()
                        for j in range(4)] for i in range(4)]
                      for c in range(2)] for n in range(1)])
    check_close("maxpool_3x3_pad", y, want, 0, 0)
    out.append(fixture("maxpool_3x3_pad", "MaxPool", {**a, "layout": "NCHW"},
                       [("x", x)], [("y", y)], ORT_SOURCE))

    rng = rng_for("avgpool_3x3_pad")
    x = uniform(rng, (1, 2, 7, 7))
    xp = np.zeros((1, 2, 9, 9), dtype=np.float64)
    xp[:, :, 1:8, 1:8] = x
    ones = np.zeros((9, 9))
    ones[1:8, 1:8] = 1.0
    for cip, case in [(0, "avgpool_3x3_pad_exclude"), (1, "avgpool_3x3_pad_include")]:
        a = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
             "count_include_pad": cip}
        (y,) = run_single("AveragePool", [("x", x)], ["y"], a)
        want = np.zeros((1, 2, 4, 4))
        for i in range(4):
            for j in range(4):
                win = xp[:, :, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].sum(axis=(2, 3))
                cnt = 9.0 if cip else ones[2 * i : 2 * i + 3, 2 * j : 2 * j + 3].sum()
                want[:, :, i, j] = win / cnt
        check_close(case, y, want)
        out.append(fixture(case, "AveragePool", {**a, "layout": "NCHW"},
                           [("x", x)], [("y", y)], ORT_SOURCE))

    rng = rng_for("globalavgpool")
    x = uniform(rng, (2, 5, 4, 3))
    (y,) = run_single("GlobalAveragePool", [("x", x)], ["y"])
    check_close("globalavgpool", y, x.astype(np.float64).mean(axis=(2, 3), keepdims=True))
    out.append(fixture("globalavgpool", "GlobalAveragePool", {"layout": "NCHW"},
                       [("x", x)], [("y", y)], ORT_SOURCE))
    return out


# ---------------------------------------------------------------------------
# Normalisation


def norm_fixtures():
    out = []

    # BatchNormalization, inference mode.
    rng = rng_for("batchnorm_inference")
    x = uniform(rng, (2, 4, 3, 3))
    scale = uniform(rng, (4,))
    bias = uniform(rng, (4,))
    mean = uniform(rng, (4,))
    var = uniform(rng, (4,), 0.1, 1.0)
    eps = 1e-5
    inputs = [("x", x), ("scale", scale), ("bias", bias), ("mean", mean), ("var", var)]
    (y,) = run_single("BatchNormalization", inputs, ["y"], {"epsilon": eps})
    c = lambda v: v.astype(np.float64)[None, :, None, None]  # noqa: E731
    want = c(scale) * (x - c(mean)) / np.sqrt(c(var) + F32(eps)) + c(bias)
    check_close("batchnorm_inference", y, want)
    out.append(fixture("batchnorm_inference", "BatchNormalization",
                       {"epsilon": eps, "training_mode": 0},
                       inputs, [("y", y)], ORT_SOURCE))

    # BatchNormalization, training mode (numpy, float64 then rounded to f32).
    rng = rng_for("batchnorm_training")
    x = uniform(rng, (4, 3, 2, 2))
    scale = uniform(rng, (3,))
    bias = uniform(rng, (3,))
    running_mean = uniform(rng, (3,))
    running_var = uniform(rng, (3,), 0.1, 1.0)
    eps = F32(1e-3)
    momentum = F32(0.9)
    xd = x.astype(np.float64)
    bmean = xd.mean(axis=(0, 2, 3))
    bvar = xd.var(axis=(0, 2, 3))  # biased, used to normalise
    bvar_unbiased = xd.var(axis=(0, 2, 3), ddof=1)
    y = (c(scale) * (xd - bmean[None, :, None, None])
         / np.sqrt(bvar[None, :, None, None] + np.float64(eps)) + c(bias)).astype(F32)
    m = np.float64(momentum)
    rm_out = (m * running_mean.astype(np.float64) + (1 - m) * bmean).astype(F32)
    rv_out = (m * running_var.astype(np.float64) + (1 - m) * bvar_unbiased).astype(F32)
    out.append(fixture(
        "batchnorm_training", "BatchNormalization",
        {"epsilon": 1e-3, "momentum": 0.9, "training_mode": 1,
         "running_var_uses": "unbiased"},
        [("x", x), ("scale", scale), ("bias", bias),
         ("running_mean", running_mean), ("running_var", running_var)],
        [("y", y), ("running_mean_out", rm_out), ("running_var_out", rv_out)],
        NP_SOURCE))

    # LayerNormalization (opset 17).
    for case, shape, axis, pshape in [
        ("layernorm_last", (2, 3, 8), -1, (8,)),
        ("layernorm_last2", (2, 4, 3), -2, (4, 3)),
    ]:
        rng = rng_for(case)
        x = uniform(rng, shape)
        scale = uniform(rng, pshape)
        bias = uniform(rng, pshape)
        eps = 1e-5
        inputs = [("x", x), ("scale", scale), ("bias", bias)]
        (y,) = run_single("LayerNormalization", inputs, ["y"],
                          {"axis": axis, "epsilon": eps}, opset=17)
        axes = tuple(range(len(shape) + axis, len(shape)))
        xd = x.astype(np.float64)
        mu = xd.mean(axis=axes, keepdims=True)
        va = xd.var(axis=axes, keepdims=True)
        check_close(case, y, (xd - mu) / np.sqrt(va + F32(eps)) * scale + bias)
        out.append(fixture(case, "LayerNormalization",
                           {"axis": axis, "epsilon": eps},
                           inputs, [("y", y)], ORT_SOURCE))

    # GroupNormalization (opset 21: per-channel scale and bias).
    rng = rng_for("groupnorm")
    x = uniform(rng, (2, 6, 3, 3))
    scale = uniform(rng, (6,))
    bias = uniform(rng, (6,))
    eps = 1e-5
    groups = 3
    inputs = [("x", x), ("scale", scale), ("bias", bias)]
    xg = x.astype(np.float64).reshape(2, groups, -1)
    xn = ((xg - xg.mean(axis=2, keepdims=True))
          / np.sqrt(xg.var(axis=2, keepdims=True) + F32(eps))).reshape(x.shape)
    want = xn * c(scale) + c(bias)
    (y,) = run_single("GroupNormalization", inputs, ["y"],
                      {"num_groups": groups, "epsilon": eps}, opset=21)
    check_close("groupnorm", y, want)
    out.append(fixture("groupnorm", "GroupNormalization",
                       {"num_groups": groups, "epsilon": eps},
                       inputs, [("y", y)], ORT_SOURCE))
    return out


# ---------------------------------------------------------------------------
# Attention and friends


def softmax64(z, axis):
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def misc_fixtures():
    out = []

    # Scaled dot-product attention with an additive mask.
    rng = rng_for("attention")
    q = uniform(rng, (2, 2, 5, 4))
    k = uniform(rng, (2, 2, 5, 4))
    v = uniform(rng, (2, 2, 5, 4))
    mask = np.zeros((2, 1, 1, 5), dtype=F32)
    mask[0, 0, 0, 4] = -10000.0  # batch 0: last key masked
    mask[1, 0, 0, 1] = -10000.0  # batch 1: keys 1 and 3 masked
    mask[1, 0, 0, 3] = -10000.0
    scale = 1.0 / math.sqrt(4.0)
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Constant", [], ["scale"],
                         value=helper.make_tensor("scale_value", TensorProto.FLOAT, [], [scale])),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"]),
    ]
    inputs = [("q", q), ("k", k), ("v", v), ("mask", mask)]
    y, probs = run_ort(nodes, inputs, ["y", "probs"])
    p = softmax64(q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) * scale
                  + mask, -1)
    check_close("attention probs", probs, p)
    check_close("attention", y, p @ v.astype(np.float64))
    out.append(fixture("attention", "ScaledDotProductAttention",
                       {"scale": scale, "mask": "additive", "softmax_axis": -1},
                       inputs, [("y", y), ("probs", probs)], ORT_SOURCE))

    # Batched MatMul with numpy broadcasting of the batch dimensions.
    for case, ashape, bshape in [
        ("batched_matmul_broadcast", (2, 3, 4, 5), (5, 6)),
        ("batched_matmul_broadcast2", (3, 1, 4, 5), (2, 5, 3)),
    ]:
        rng = rng_for(case)
        a = uniform(rng, ashape)
        b = uniform(rng, bshape)
        (y,) = run_single("MatMul", [("a", a), ("b", b)], ["y"])
        check_close(case, y, a.astype(np.float64) @ b.astype(np.float64))
        out.append(fixture(case, "MatMul", {}, [("a", a), ("b", b)], [("y", y)], ORT_SOURCE))

    # Gelu (opset 20), exact and tanh approximation, on the same x.
    rng = rng_for("gelu")
    x = uniform(rng, (3, 7), -4.0, 4.0)
    xd = x.astype(np.float64)
    erf = np.vectorize(math.erf)
    for case, approx, want in [
        ("gelu_erf", "none", 0.5 * xd * (1 + erf(xd / math.sqrt(2)))),
        ("gelu_tanh", "tanh",
         0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))),
    ]:
        (y,) = run_single("Gelu", [("x", x)], ["y"], {"approximate": approx}, opset=20)
        check_close(case, y, want)
        out.append(fixture(case, "Gelu", {"approximate": approx},
                           [("x", x)], [("y", y)], ORT_SOURCE))

    # Softmax over axis 1 (opset 13+ semantics: that axis alone).
    rng = rng_for("softmax_axis1")
    x = uniform(rng, (2, 4, 3))
    (y,) = run_single("Softmax", [("x", x)], ["y"], {"axis": 1})
    check_close("softmax_axis1", y, softmax64(x.astype(np.float64), 1))
    out.append(fixture("softmax_axis1", "Softmax", {"axis": 1}, [("x", x)], [("y", y)],
                       ORT_SOURCE))

    # Transpose.
    rng = rng_for("transpose")
    x = uniform(rng, (2, 3, 4, 5))
    for case, perm in [("transpose_0213", [0, 2, 1, 3]), ("transpose_3102", [3, 1, 0, 2])]:
        (y,) = run_single("Transpose", [("x", x)], ["y"], {"perm": perm})
        check_close(case, y, x.transpose(perm), 0, 0)
        out.append(fixture(case, "Transpose", {"perm": perm}, [("x", x)], [("y", y)],
                           ORT_SOURCE))

    # Reductions (axes as attributes, opset 17).
    rng = rng_for("reduce")
    x = uniform(rng, (2, 3, 4, 5))
    for case, op, axes, keepdims, fn in [
        ("reduce_mean_axes", "ReduceMean", [1, 3], 1, np.mean),
        ("reduce_max_axes", "ReduceMax", [0, 2], 0, np.max),
    ]:
        (y,) = run_single(op, [("x", x)], ["y"], {"axes": axes, "keepdims": keepdims})
        check_close(case, y, fn(x.astype(np.float64), axis=tuple(axes),
                                keepdims=bool(keepdims)))
        out.append(fixture(case, op, {"axes": axes, "keepdims": keepdims},
                           [("x", x)], [("y", y)], ORT_SOURCE))

    # Gather as an embedding lookup.
    rng = rng_for("gather_embedding")
    table = uniform(rng, (10, 4))
    indices = rng.integers(0, 10, size=(2, 3)).astype(np.int64)
    (y,) = run_single("Gather", [("table", table), ("indices", indices)], ["y"], {"axis": 0})
    check_close("gather_embedding", y, table[indices], 0, 0)
    out.append(fixture("gather_embedding", "Gather", {"axis": 0},
                       [("table", table), ("indices", indices)], [("y", y)], ORT_SOURCE))

    # Broadcasting element-wise binary ops.
    rng = rng_for("elementwise_broadcast")
    x = uniform(rng, (2, 3, 1, 5))
    y_in = away_from_zero(rng, (4, 1))
    px = uniform(rng, (2, 3, 1, 5), 0.5, 2.0)
    py = uniform(rng, (4, 1), -2.0, 2.0)
    nodes = [
        helper.make_node("Add", ["x", "y"], ["add"]),
        helper.make_node("Sub", ["x", "y"], ["sub"]),
        helper.make_node("Mul", ["x", "y"], ["mul"]),
        helper.make_node("Div", ["x", "y"], ["div"]),
        helper.make_node("Pow", ["px", "py"], ["pow"]),
    ]
    inputs = [("x", x), ("y", y_in), ("px", px), ("py", py)]
    names = ["add", "sub", "mul", "div", "pow"]
    results = run_ort(nodes, inputs, names)
    xd, yd = x.astype(np.float64), y_in.astype(np.float64)
    wants = [xd + yd, xd - yd, xd * yd, xd / yd,
             np.power(px.astype(np.float64), py.astype(np.float64))]
    for name, got, want in zip(names, results, wants):
        check_close("elementwise_broadcast " + name, got, want)
    out.append(fixture(
        "elementwise_broadcast", "Elementwise",
        {"ops": {"add": "Add(x,y)", "sub": "Sub(x,y)", "mul": "Mul(x,y)",
                 "div": "Div(x,y)", "pow": "Pow(px,py)"}},
        inputs, list(zip(names, results)), ORT_SOURCE))

    # Where with a broadcast boolean condition.
    rng = rng_for("where_mask")
    cond = rng.uniform(0.0, 1.0, size=(2, 1, 4)) < 0.5
    a = uniform(rng, (2, 3, 4))
    b = uniform(rng, (4,))
    inputs = [("cond", cond), ("a", a), ("b", b)]
    (y,) = run_single("Where", inputs, ["y"])
    check_close("where_mask", y, np.where(cond, a, b), 0, 0)
    out.append(fixture("where_mask", "Where", {}, inputs, [("y", y)], ORT_SOURCE))

    # Clip as ReLU6 (opset 11+: min and max are inputs; here constants).
    rng = rng_for("clip_relu6")
    x = uniform(rng, (2, 5), -3.0, 9.0)
    nodes = [
        helper.make_node("Constant", [], ["lo"],
                         value=helper.make_tensor("lo_value", TensorProto.FLOAT, [], [0.0])),
        helper.make_node("Constant", [], ["hi"],
                         value=helper.make_tensor("hi_value", TensorProto.FLOAT, [], [6.0])),
        helper.make_node("Clip", ["x", "lo", "hi"], ["y"]),
    ]
    (y,) = run_ort(nodes, [("x", x)], ["y"])
    check_close("clip_relu6", y, np.clip(x, 0.0, 6.0), 0, 0)
    out.append(fixture("clip_relu6", "Clip", {"min": 0.0, "max": 6.0},
                       [("x", x)], [("y", y)], ORT_SOURCE))
    return out


# ---------------------------------------------------------------------------
# LSTM


def sigmoid64(z):
    return 1.0 / (1.0 + np.exp(-z))


def lstm_reference(X, W, R, B, h0, c0):
    """ONNX LSTM, forward, gate order i, o, f, c, no peepholes (self-check only)."""
    X, W, R = (a.astype(np.float64) for a in (X, W, R))
    hs = W.shape[1] // 4
    Wb = B[0, : 4 * hs].astype(np.float64) if B is not None else np.zeros(4 * hs)
    Rb = B[0, 4 * hs :].astype(np.float64) if B is not None else np.zeros(4 * hs)
    h = h0[0].astype(np.float64) if h0 is not None else np.zeros((X.shape[1], hs))
    c = c0[0].astype(np.float64) if c0 is not None else np.zeros((X.shape[1], hs))
    ys = []
    for t in range(X.shape[0]):
        g = X[t] @ W[0].T + h @ R[0].T + Wb + Rb
        i, o, f, cc = (g[:, j * hs : (j + 1) * hs] for j in range(4))
        i, o, f, cc = sigmoid64(i), sigmoid64(o), sigmoid64(f), np.tanh(cc)
        c = f * c + i * cc
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys)[:, None], h[None], c[None]


def lstm_fixtures():
    out = []
    seq, batch, inp, hidden = 5, 2, 3, 4
    attrs = {"hidden_size": hidden, "direction": "forward", "layout": 0}
    for case, full in [("lstm", True), ("lstm_no_init", False)]:
        rng = rng_for(case)
        X = uniform(rng, (seq, batch, inp))
        W = uniform(rng, (1, 4 * hidden, inp))
        R = uniform(rng, (1, 4 * hidden, hidden))
        if full:
            B = uniform(rng, (1, 8 * hidden))
            h0 = uniform(rng, (1, batch, hidden))
            c0 = uniform(rng, (1, batch, hidden))
            inputs = [("X", X), ("W", W), ("R", R), ("B", B),
                      ("initial_h", h0), ("initial_c", c0)]
            names = ["X", "W", "R", "B", "", "initial_h", "initial_c"]
        else:
            B = h0 = c0 = None
            inputs = [("X", X), ("W", W), ("R", R)]
            names = ["X", "W", "R"]
        Y, Y_h, Y_c = run_single("LSTM", inputs, ["Y", "Y_h", "Y_c"], attrs,
                                 input_names=names)
        wY, wh, wc = lstm_reference(X, W, R, B, h0, c0)
        check_close(case + " Y", Y, wY)
        check_close(case + " Y_h", Y_h, wh)
        check_close(case + " Y_c", Y_c, wc)
        fattrs = {**attrs, "activations": ["Sigmoid", "Tanh", "Tanh"],
                  "gate_order": "iofc"}
        out.append(fixture(case, "LSTM", fattrs, inputs,
                           [("Y", Y), ("Y_h", Y_h), ("Y_c", Y_c)], ORT_SOURCE))
    return out


# ---------------------------------------------------------------------------

README = """\
# Operator reference fixtures

Small reference cases for neural-network operators, one JSON file per case,
written by `scripts/make_op_fixtures.py` (do not edit them by hand: change the
script and re-run it; see its docstring). Outputs were computed by
{ort} from one- or few-node ONNX graphs built with onnx.helper (onnx
{onnx_version}, default opset 17; Gelu 20, GroupNormalization 21), except
`batchnorm_training`, which is computed by {np} in float64 and rounded to
float32; each file's `"source"` says which. Inputs are drawn uniformly in
[-1, 1] (positive where needed) from a fixed numpy seed per case, and the
script self-checks every onnxruntime result against a direct numpy
computation. Each file is `{{"case", "op", "attrs", "inputs", "outputs",
"source"}}`, where every tensor is `{{"name", "shape", "dtype", "data"}}` with
`data` flat and row-major and `dtype` one of `f32`, `i64` or `bool` (0/1);
every float is the exact value of a float32 written as a double, so parsing it
as f64 and casting to f32 is exact (float attributes such as `epsilon` are
written short, e.g. `1e-05`, and mean their float32 value). Conventions: convolution and pooling data
are NCHW with OIHW weights (`[out, in/groups, kh, kw]`) unless `"layout":
"NHWC"`, whose weights are HWIO (`[kh, kw, in/groups, out]`, for depthwise
`[kh, kw, 1, channels]`); `pads` are in ONNX order `[top, left, bottom,
right]`; `"padding": "same"` cases also give the explicit pads of the
TensorFlow/Keras SAME rule (total = max((ceil(in/stride) - 1) * stride +
(k - 1) * dilation + 1 - in, 0), top = total // 2, the odd extra at the bottom
or right); batch-norm training normalises with the biased batch variance and
updates `running_var = momentum * running_var + (1 - momentum) *
unbiased_batch_var` (`"running_var_uses": "unbiased"`), and likewise
`running_mean` with the batch mean.
"""


def main():
    fixtures = conv_fixtures() + pool_fixtures() + norm_fixtures() + misc_fixtures() \
        + lstm_fixtures()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    seen = set()
    for fx in fixtures:
        case = fx["case"]
        if case in seen:
            raise ValueError(f"duplicate case {case}")
        seen.add(case)
        text = json.dumps(fx, indent=None, separators=(",", ":"), allow_nan=False) + "\n"
        (OUT_DIR / f"{case}.json").write_text(text, encoding="utf-8")
    readme = README.format(ort=ORT_SOURCE, np=NP_SOURCE, onnx_version=onnx.__version__)
    (OUT_DIR / "README.md").write_text(readme, encoding="utf-8")
    print(f"wrote {len(fixtures)} fixtures and README.md to tests/fixtures/ops/")


if __name__ == "__main__":
    main()
