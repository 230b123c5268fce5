#!/usr/bin/env python3
"""Writes tests/fixtures/onnx_node/: ONNX's own backend node tests (the cases of
`onnx.backend.test.case.node`, which the onnx repository writes to
onnx/backend/test/data/node) for the ops Tessera's importer reads, as the pinned `onnx`
package generates them (scripts/requirements-fixtures.txt).

A case is kept when every node of its model (a function's expansion included) is an op of the
importer's registry (the op table of docs/onnx.md, generated from it), its opset is one the
importer reads (6 to 22) and its inputs and outputs are tensors. Each case directory holds `model.onnx` and its first data set as
`input_<j>.pb` / `output_<j>.pb` (TensorProto), as the onnx repository lays them out.
`manifest.json` lists the cases with their op, opset and the element types of their inputs
and outputs. Re-running the script rewrites identical bytes.

    .venv/bin/python scripts/make_onnx_node_tests.py
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node as node_cases

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "onnx_node"
DOCS = ROOT / "docs" / "onnx.md"

# The importer's opsets (host/src/onnx/mod.rs, MIN_OPSET and MAX_OPSET).
MIN_OPSET, MAX_OPSET = 6, 22
# A case whose data set is larger than this is left out (the suite stays small in the repo).
MAX_CASE_BYTES = 256 * 1024


README = """# ONNX's backend node tests

{n} cases of ONNX's own backend node tests (`onnx.backend.test.case.node`, which the onnx
repository writes to `onnx/backend/test/data/node`), as the `onnx` package {version} generates
them, for the ops Tessera's importer reads at the opsets it reads. Written by
`scripts/make_onnx_node_tests.py` (its docstring says how cases are chosen); run by
`host/tests/onnx_node_tests.rs`. Each directory holds `model.onnx`, `input_<j>.pb` and
`output_<j>.pb` (TensorProto); `manifest.json` lists the cases with their op and opset.

Licence: the `onnx` package's, the Apache License 2.0 (data/onnx/zoo_light/LICENSE).
"""


def registry_ops():
    """The ops of the importer's registry, read from the op table docs/onnx.md carries (a
    test checks that table against the registry)."""
    ops = set()
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| [a-z -]+ \| (\w+) \| [0-9, ]+ \|$", line)
        if m:
            ops.add(m.group(1))
    if len(ops) < 50:
        raise SystemExit("docs/onnx.md's op table is missing")
    return ops


def model_ops(model):
    ops = set()

    def walk(graph):
        for n in graph.node:
            ops.add((n.domain or "", n.op_type))
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(model.graph)
    return ops


ALL_OPS = sorted({s.name for s in onnx.defs.get_all_schemas_with_history()
                  if s.domain in ("", "ai.onnx")})
# Case names that do not start with their op's name.
ALIASES = {"basic_conv": "Conv", "conv": "Conv", "batchnorm": "BatchNormalization",
           "instancenorm": "InstanceNormalization", "mvn": "MeanVarianceNormalization",
           "edge_pad": "Pad", "reflect_pad": "Pad", "constant_pad": "Pad", "wrap_pad": "Pad",
           "nllloss": "NegativeLogLikelihoodLoss", "sce": "SoftmaxCrossEntropyLoss",
           "logsoftmax": "LogSoftmax", "globalaveragepool": "GlobalAveragePool",
           "globalmaxpool": "GlobalMaxPool", "maxpool": "MaxPool", "averagepool": "AveragePool"}


def case_op(model, name):
    """The op a case tests: a one-node model's op, else (a function's expansion) the longest
    ONNX op name the case's name starts with (`test_layer_normalization_2d_axis0_expanded`
    tests LayerNormalization)."""
    if len(model.graph.node) == 1:
        return model.graph.node[0].op_type
    rest = name[len("test_"):]
    for alias in sorted(ALIASES, key=len, reverse=True):
        if rest.startswith(alias):
            return ALIASES[alias]
    flat = rest.replace("_", "").lower()
    found = [op for op in ALL_OPS if flat.startswith(op.lower())]
    return max(found, key=len) if found else rest.split("_")[0]


def is_tensor(vi):
    return vi.type.HasField("tensor_type")


def elem_name(code):
    return onnx.helper.tensor_dtype_to_np_dtype(code).name if code else "undefined"


def main():
    supported = registry_ops()
    cases = node_cases.collect_testcases(None)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    entries = []
    skipped = {"ops": 0, "opset": 0, "types": 0, "size": 0}
    for case in sorted(cases, key=lambda c: c.name):
        model = case.model
        ops = model_ops(model)
        if any(d not in ("", "ai.onnx") or op not in supported for d, op in ops):
            skipped["ops"] += 1
            continue
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if not MIN_OPSET <= opset <= MAX_OPSET:
            skipped["opset"] += 1
            continue
        if not all(is_tensor(v) for v in list(model.graph.input) + list(model.graph.output)):
            skipped["types"] += 1
            continue
        inputs, outputs = case.data_sets[0]
        protos = []
        for vi, arr in zip(model.graph.input, inputs):
            protos.append(("input", arr if isinstance(arr, onnx.TensorProto)
                           else numpy_helper.from_array(np.asarray(arr), vi.name)))
        for vi, arr in zip(model.graph.output, outputs):
            protos.append(("output", arr if isinstance(arr, onnx.TensorProto)
                           else numpy_helper.from_array(np.asarray(arr), vi.name)))
        size = len(model.SerializeToString()) + sum(len(p.SerializeToString()) for _, p in protos)
        if size > MAX_CASE_BYTES:
            skipped["size"] += 1
            continue
        d = OUT / case.name
        d.mkdir()
        (d / "model.onnx").write_bytes(model.SerializeToString())
        counts = {"input": 0, "output": 0}
        for kind, p in protos:
            (d / f"{kind}_{counts[kind]}.pb").write_bytes(p.SerializeToString())
            counts[kind] += 1
        entries.append({
            "name": case.name,
            "op": case_op(model, case.name),
            "ops": sorted(op for _, op in ops),
            "opset": opset,
            "inputs": [elem_name(v.type.tensor_type.elem_type) for v in model.graph.input],
            "outputs": [elem_name(v.type.tensor_type.elem_type) for v in model.graph.output],
        })
    manifest = {
        "generator": "scripts/make_onnx_node_tests.py",
        "onnx": onnx.__version__,
        "selected": len(entries),
        "left_out": skipped,
        "cases": entries,
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (OUT / "README.md").write_text(README.format(version=onnx.__version__, n=len(entries)),
                                   encoding="utf-8")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {len(entries)} node tests ({total} bytes); left out {skipped}")


if __name__ == "__main__":
    main()
