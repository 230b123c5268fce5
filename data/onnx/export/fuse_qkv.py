"""Fuse each attention's query, key and value products into one product of a [hidden, 3 x
hidden] weight followed by a Split, as Graphcore's PopART BERT builds its attention
(`split_qkv` off by default, graphcore/examples `nlp/bert/popart/bert_model.py`): the
architecture Poplar's BERT-Large profiles were made of. Weight-free in, weight-free out:
the fused weight and bias are stripped as `strip.py` strips (location `__stripped__`)."""
import sys, collections, onnx
from onnx import helper, TensorProto, numpy_helper
import numpy as np

src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(src, load_external_data=False)
g = m.graph
inits = {i.name: i for i in g.initializer}
consumers = collections.defaultdict(list)
for n in g.node:
    for x in n.input:
        consumers[x].append(n)

def stripped(name, dims, dtype):
    t = onnx.TensorProto(name=name, dims=dims, data_type=dtype)
    t.data_location = TensorProto.EXTERNAL
    n = int(np.prod(dims)) * {TensorProto.FLOAT: 4}.get(dtype, 2)
    for k, v in (("location", "__stripped__"), ("offset", "0"), ("length", str(n))):
        e = t.external_data.add(); e.key = k; e.value = v
    return t

def weight_product(n):
    """A MatMul by a 2-D weight followed by an Add of a 1-D bias: (matmul, add, weight, bias)."""
    if n.op_type != "MatMul" or n.input[1] not in inits:
        return None
    w = inits[n.input[1]]
    if len(w.dims) != 2:
        return None
    users = consumers[n.output[0]]
    if len(users) != 1 or users[0].op_type != "Add":
        return None
    add = users[0]
    bias = add.input[1] if add.input[0] == n.output[0] else add.input[0]
    if bias not in inits or len(inits[bias].dims) != 1:
        return None
    return n, add, w, inits[bias]

removed, added, new_inits, fused = set(), {}, [], 0
by_input = collections.defaultdict(list)
for n in g.node:
    p = weight_product(n)
    if p:
        by_input[n.input[0]].append(p)
for x, ps in by_input.items():
    if len(ps) != 3 or len({tuple(p[2].dims) for p in ps}) != 1:
        continue
    k, h = ps[0][2].dims
    dtype = ps[0][2].data_type
    base = f"qkv_{fused}"
    new_inits += [
        stripped(f"{base}.weight", [k, 3 * h], dtype),
        stripped(f"{base}.bias", [3 * h], dtype),
        numpy_helper.from_array(np.array([h, h, h], dtype=np.int64), f"{base}.split"),
    ]
    nodes = [
        helper.make_node("MatMul", [x, f"{base}.weight"], [f"{base}.product"], name=f"node_{base}_matmul"),
        helper.make_node("Add", [f"{base}.product", f"{base}.bias"], [f"{base}.biased"], name=f"node_{base}_bias"),
        helper.make_node("Split", [f"{base}.biased", f"{base}.split"], [p[1].output[0] for p in ps], axis=-1, name=f"node_{base}_split"),
    ]
    for p in ps:
        removed.add(id(p[0])); removed.add(id(p[1]))
    added[id(ps[0][0])] = nodes
    fused += 1

out = []
for n in g.node:
    if id(n) in added:
        out += added[id(n)]
    if id(n) not in removed:
        out.append(n)
del g.node[:]
g.node.extend(out)
used = {x for n in g.node for x in n.input}
keep = [i for i in g.initializer if i.name in used]
del g.initializer[:]
g.initializer.extend(keep + new_inits)
# The value_info of the removed products goes; ONNX's shape inference gives the new tensors'.
made = {o for n in g.node for o in n.output}
info = [v for v in g.value_info if v.name in made]
del g.value_info[:]
g.value_info.extend(info)
m = onnx.shape_inference.infer_shapes(m)
onnx.save(m, dst)
print(f"{dst}: {fused} attentions fused, {len(g.node)} nodes")
