"""Writes host/tests/fixtures/onnx_shapes/NAME.json: every tensor's shape as ONNX's own shape
inference (onnx.shape_inference.infer_shapes with data propagation) gives it, for the bundled
models whose files carry no value_info of their own. The import test compares against it.

Run from the repository root with the pinned requirements (scripts/requirements-fixtures.txt):
    python scripts/onnx_reference_shapes.py data/onnx/bert_base_opset14.stripped.onnx
"""
import json
import os
import sys

import onnx
from onnx import shape_inference

out_dir = os.path.join("host", "tests", "fixtures", "onnx_shapes")
os.makedirs(out_dir, exist_ok=True)
for path in sys.argv[1:]:
    model = onnx.load(path, load_external_data=False)
    inferred = shape_inference.infer_shapes(model, data_prop=True)
    shapes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.HasField("shape") and all(d is not None for d in dims):
            shapes[v.name] = dims
    name = os.path.basename(path).split(".")[0]
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(dict(sorted(shapes.items())), f, indent=0, sort_keys=True)
        f.write("\n")
    print(f"{path}: {len(shapes)} shapes")
