"""Export a transformer of `export.py` with its batch and sequence axes symbolic, so that every
shape the graph derives from the sequence length is computed from its inputs' shapes
(Shape / Gather / Concat / Range / Expand) rather than written as constants; `tessera estimate
--input-shape` then sets any length. Then:

- the graph inputs keep the traced example's dims (1 x 128), so the file estimates as it did
  without options;
- float tensors of more than 16 elements lose their bytes, as `strip.py FILE OUT 16` strips;
- every node, tensor and initializer the fixed-shape file (OLD, the shipped file) has takes its
  name there: the compute nodes are matched in order by op type, and each match is checked
  (the same inputs from the same matched nodes, or initializers of the same dims and type; an
  integer or boolean constant of OLD may be computed here, from the inputs' shapes). Names in
  reports and in options (`--pipeline-stages node_layer_norm_24`) stay as they were. A graph
  that does not match is refused.

    python dynamic.py NAME OLD.onnx OUT.onnx      (NAME: bert_tiny, bert_base, bert_large, gpt2)

Made with the versions of scripts/requirements-exporters.txt.
"""
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
import onnx  # noqa: E402
import torch  # noqa: E402
from torch.export import Dim  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from strip import strip_model  # noqa: E402


def build(name):
    """The model, example inputs and input names `export.py` builds."""
    src = open(os.path.join(HERE, "export.py"), encoding="utf-8").read().split("def hist")[0]
    ns = {}
    exec(src, ns)  # export.py's imports, seed and build(), not its command line
    return ns["build"](name)


def export(name, path):
    model, args, names = build(name)
    seq = Dim("sequence", max=512)
    prog = torch.onnx.export(model, args, input_names=names, dynamo=True, optimize=True,
                             external_data=True,
                             dynamic_shapes={n: {1: seq} for n in names})
    prog.save(path, external_data=True)
    return [list(a.shape) for a in args]


def fix_inputs(m, shapes):
    for vi, dims in zip(m.graph.input, shapes):
        for d, v in zip(vi.type.tensor_type.shape.dim, dims):
            d.ClearField("dim_param")
            d.dim_value = v


def carry_names(old, new):
    """Gives NEW's nodes, tensors and initializers OLD's names (see the docstring)."""
    g0, g1 = old.graph, new.graph
    i0 = {t.name: t for t in g0.initializer}
    i1 = {t.name: t for t in g1.initializer}
    p0 = {o: n for n in g0.node for o in n.output}
    p1 = {o: n for n in g1.node for o in n.output}
    pairs, j, n1 = {}, 0, list(g1.node)
    for n in g0.node:
        while j < len(n1) and n1[j].op_type != n.op_type:
            j += 1
        if j == len(n1):
            sys.exit(f"no counterpart for node `{n.name}` ({n.op_type})")
        pairs[id(n1[j])] = n
        j += 1

    def source(b):
        """The matched node `b` comes from, through nodes OLD has not (first inputs)."""
        while b in p1 and id(p1[b]) not in pairs and p1[b].input:
            b = p1[b].input[0]
        return pairs.get(id(p1[b])) if b in p1 else None

    value, init, through, uses = {}, {}, {}, []
    for m in n1:
        if id(m) not in pairs:
            continue
        n = pairs[id(m)]
        if len(n.input) != len(m.input) or len(n.output) != len(m.output):
            sys.exit(f"`{n.name}`: its inputs or outputs differ in number")
        for o, o1 in zip(n.output, m.output):
            value[o1] = o
        for k, (a, b) in enumerate(zip(n.input, m.input)):
            if a in p0:
                if source(b) is not p0[a]:
                    sys.exit(f"`{n.name}`: input `{a}` is `{b}`, made elsewhere")
                if id(p1[b]) not in pairs:
                    through[b] = a
            elif a in i0 and b in i1:
                ta, tb = i0[a], i1[b]
                if list(ta.dims) != list(tb.dims) or ta.data_type != tb.data_type:
                    sys.exit(f"`{n.name}`: initializer `{a}` {list(ta.dims)} is `{b}` "
                             f"{list(tb.dims)}")
                if a not in init.setdefault(b, []):
                    init[b].append(a)
                uses.append((m, k, a))
            elif a in i0 and i0[a].data_type in (6, 7, 9) and b in p1:
                if value.get(b, a) != a:
                    sys.exit(f"`{b}` is both `{value[b]}` and `{a}`")
                value[b] = a
            elif a != b:
                sys.exit(f"`{n.name}`: input `{a}` is `{b}`")
    for b, a in through.items():
        for o1 in [k for k, v in value.items() if v == a]:
            value[o1] = None
        value[b] = a
    taken = set(p0) | set(i0) | {n.name for n in g0.node}

    def fresh(x):
        y = x
        while y in taken:
            y += "_s"
        taken.add(y)
        return y

    rename = {k: (v if v is not None else fresh(k)) for k, v in value.items()}
    rename.update({b: names[0] for b, names in init.items()})
    for m in n1:
        if id(m) in pairs:
            m.name = pairs[id(m)].name
        else:
            m.name = fresh(m.name)
            for o in m.output:
                rename.setdefault(o, fresh(o))
    for t in g1.initializer:
        if t.name not in rename:
            rename[t.name] = fresh(t.name)
    for m in n1:
        m.input[:] = [rename.get(x, x) if x else x for x in m.input]
        m.output[:] = [rename.get(x, x) for x in m.output]
    for t in list(g1.initializer):
        # One initializer OLD holds twice (under two names) is copied for the second.
        for a in init.get(t.name, [])[1:]:
            c = g1.initializer.add()
            c.CopyFrom(t)
            c.name = a
        t.name = rename.get(t.name, t.name)
    for m, k, a in uses:
        m.input[k] = a
    for v in list(g1.output) + list(g1.value_info):
        v.name = rename.get(v.name, v.name)
    return len(pairs), len(n1) - len(pairs)


def main():
    name, old_path, out = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, f"{name}.onnx")
        shapes = export(name, raw)
        m = onnx.load(raw, load_external_data=True)
    fix_inputs(m, shapes)
    strip_model(m, limit=16)
    matched, more = carry_names(onnx.load(old_path, load_external_data=False), m)
    onnx.save(m, out)
    print(f"{out}: {matched} nodes matched the fixed-shape file, {more} more compute shapes; "
          f"{os.path.getsize(out) / 1e3:.1f} kB")


if __name__ == "__main__":
    main()
