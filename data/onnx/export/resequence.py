"""Re-trace a weight-free transformer export at another sequence length.

`torch.onnx.export` traces a model at one input shape and writes what it derived from the
sequence length as constants: the position ids (a slice of `arange(max_positions)`), the
attention mask's index grid and its all-true broadcast, and the shapes of the attention's
Reshapes. This script writes the same graph at sequence length S, each such constant made
again at S by the rule of its kind:

- a 1-D integer shape (a Reshape's target) holding the old length: the length becomes S;
- an integer tensor counting 0, 1, ... along its sequence axis (position ids): 0..S;
- an index grid of GatherND (last axis the index tuple, its sequence entry counting): made
  again over S;
- a tensor of one value throughout (the mask's all-true): the same value at the new shape.

Any other constant with an axis of the old length is refused, as is a file where the old
length is ambiguous (another axis of the graph inputs of that size). Weights are untouched
(stripped as `strip.py` strips them); the position table must hold S rows. With
onnxruntime installed, `--check` fills the weights at random and runs the result at S.

    python resequence.py IN.onnx OUT.onnx S [--check]
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper, TensorProto

INTEGER = (TensorProto.INT64, TensorProto.INT32)


def old_length(g):
    dims = {d.dim_value for i in g.input for d in i.type.tensor_type.shape.dim[1:]}
    if len(dims) != 1:
        sys.exit(f"the graph inputs' non-batch axes {sorted(dims)} are not one sequence length")
    return dims.pop()


def remade(a, old, new, name):
    """The constant `a` made again at sequence length `new`, or None when it holds no `old`."""
    if old not in a.shape and not (a.ndim == 1 and a.dtype.kind == "i" and old in a):
        return None
    if a.ndim == 1 and a.dtype.kind == "i" and old not in a.shape:
        if list(a).count(old) != 1:
            sys.exit(f"`{name}` {list(a)} holds the length {old} more than once")
        return np.where(a == old, new, a).astype(a.dtype)
    axes = [k for k, d in enumerate(a.shape) if d == old]
    if len(axes) != 1:
        sys.exit(f"`{name}` {a.shape} has several axes of length {old}")
    ax = axes[0]
    shape = list(a.shape)
    shape[ax] = new
    flat = a.reshape(-1)
    if np.all(flat == flat[0]):
        return np.full(shape, flat[0], dtype=a.dtype)
    if a.dtype.kind == "i":
        count = np.arange(old).reshape([-1 if k == ax else 1 for k in range(a.ndim)])
        if np.array_equal(a, np.broadcast_to(count, a.shape)):
            return np.broadcast_to(
                np.arange(new).reshape([-1 if k == ax else 1 for k in range(a.ndim)]), shape
            ).astype(a.dtype).copy()
        # A GatherND grid: the last axis holds index tuples, one entry counting the sequence.
        if ax == a.ndim - 2:
            tuples = a.reshape(-1, old, a.shape[-1])
            counting = [
                j for j in range(a.shape[-1]) if np.all(tuples[:, :, j] == np.arange(old))
            ]
            fixed = [j for j in range(a.shape[-1]) if j not in counting]
            if len(counting) == 1 and all(
                np.all(tuples[:, :, j] == tuples[:, :1, j]) for j in fixed
            ):
                out = np.repeat(tuples[:, :1, :], new, axis=1)
                out[:, :, counting[0]] = np.arange(new)
                return out.reshape(shape).astype(a.dtype)
    sys.exit(f"`{name}` {a.shape} has an axis of length {old} but no rule remakes it")


def resequence(src, dst, new):
    m = onnx.load(src, load_external_data=False)
    g = m.graph
    old = old_length(g)
    for t in g.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            if t.name.endswith("position_embeddings.weight") and t.dims[0] < new:
                sys.exit(f"`{t.name}` holds {t.dims[0]} positions, fewer than {new}")
            continue
        a = numpy_helper.to_array(t)
        b = remade(a, old, new, t.name)
        if b is not None:
            t.CopyFrom(numpy_helper.from_array(b, t.name))
    for v in list(g.input) + list(g.output):
        for d in v.type.tensor_type.shape.dim[1:]:
            if d.dim_value == old:
                d.dim_value = new
    del g.value_info[:]
    onnx.save(m, dst)
    return m


def check(m, new):
    """Runs the re-traced graph with random weights at its new length."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    for t in m.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            a = (rng.standard_normal(list(t.dims)) * 0.02).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    onnx.checker.check_model(m, full_check=True)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in s.get_inputs():
        shape = [1, new]
        feeds[i.name] = (rng.integers(0, 2, shape) if "mask" in i.name else rng.integers(0, 1000, shape)).astype(np.int64)
    out = s.run(None, feeds)
    print("ran at", new, [o.shape for o in out])


if __name__ == "__main__":
    model = resequence(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    if "--check" in sys.argv[4:]:
        check(model, int(sys.argv[3]))
