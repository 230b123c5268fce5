#!/usr/bin/env python3
"""Exports small models the way their users export them, with the exporters' defaults, and
records onnxruntime's outputs for them: tests/fixtures/onnx/exporters/.

- transformers' BertModel, DistilBertModel, GPT2Model and T5EncoderModel (small configs,
  random weights, the default attention implementation: SDPA where the model has it), through
  `torch.onnx.export` at opset 17 (the TorchScript exporter), inputs `input_ids` and
  `attention_mask` (the last three positions of each sequence masked), output
  `last_hidden_state`;
- torchvision's resnet18 (random weights) through the default dynamo exporter at opset 18,
  saved with external data. Its 46 MB of weights are not kept: the graph is a fixture for
  estimates, and this script checks Tessera's numerics on it when given the `tessera` binary.

Each transformers model's inputs and onnxruntime's outputs are written as JSON tensors beside
it, with a manifest the tests read (host/tests/onnx_numerics.rs).

Usage: python scripts/export_default_models.py [--tessera target/debug/tessera]
Needs the versions in scripts/requirements-exporters.txt.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "onnx", "exporters")
B, S = 2, 16


def transformers_models():
    from transformers import (BertConfig, BertModel, DistilBertConfig, DistilBertModel,
                              GPT2Config, GPT2Model, T5Config, T5EncoderModel)
    return {
        "bert": BertModel(BertConfig(
            vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)),
        "distilbert": DistilBertModel(DistilBertConfig(
            vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
            max_position_embeddings=64)),
        "gpt2": GPT2Model(GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=64)),
        "t5_encoder": T5EncoderModel(T5Config(
            vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)),
    }


class LastHidden(torch.nn.Module):
    """The model's `last_hidden_state` for `input_ids` and `attention_mask`."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids, attention_mask):
        return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def tensor_json(path, name, a):
    with open(path, "w") as f:
        json.dump({"name": name, "shape": list(a.shape),
                   "data": [float(v) for v in a.reshape(-1)]}, f)


def export_transformers(manifest):
    rng = np.random.default_rng(0)
    for name, m in transformers_models().items():
        m.eval()
        ids = rng.integers(0, 100, (B, S)).astype(np.int64)
        mask = np.ones((B, S), np.int64)
        mask[:, -3:] = 0
        file = f"{name}.onnx"
        path = os.path.join(OUT, file)
        torch.onnx.export(LastHidden(m), (torch.from_numpy(ids), torch.from_numpy(mask)), path,
                          opset_version=17, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], dynamo=False)
        model = onnx.load(path)
        onnx.checker.check_model(model)
        feeds = {"input_ids": ids, "attention_mask": mask}
        (out,) = ort.InferenceSession(path).run(None, feeds)
        inputs = []
        for k, v in feeds.items():
            f = f"{name}.{k}.json"
            tensor_json(os.path.join(OUT, f), k, v)
            inputs.append({"name": k, "file": f})
        f = f"{name}.output.json"
        tensor_json(os.path.join(OUT, f), "last_hidden_state", out)
        ops = sorted(collections.Counter(n.op_type for n in model.graph.node))
        manifest["numerics"].append({"name": name, "file": file, "opset": 17, "ops": ops,
                                     "inputs": inputs,
                                     "outputs": [{"name": "last_hidden_state", "file": f}]})
        print(name, "ops:", ", ".join(ops))


def export_resnet18(manifest, tessera):
    import torchvision
    m = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "resnet18_dynamo.onnx")
        torch.onnx.export(m, (x,), dynamo=True, opset_version=18).save(path, external_data=True)
        model = onnx.load(path, load_external_data=False)
        if tessera:
            ref = ort.InferenceSession(path).run(None, {"x": x.numpy()})[0]
            np.save(os.path.join(d, "x.npy"), x.numpy())
            subprocess.run([tessera, "run", path, "--input", f"x={d}/x.npy", "--output-dir", d],
                           check=True)
            got = np.load(os.path.join(d, f"{model.graph.output[0].name}.npy"))
            print("resnet18 (dynamo): tessera run against onnxruntime, max abs error",
                  float(np.abs(got - ref).max()))
        # The dynamo exporter records each node's Python stack trace, which names the
        # exporting machine's paths: dropped (the rest of its metadata is kept).
        for n in model.graph.node:
            kept = [p for p in n.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
            del n.metadata_props[:]
            n.metadata_props.extend(kept)
        onnx.save(model, os.path.join(OUT, "resnet18_dynamo.onnx"))
    ops = sorted(collections.Counter(n.op_type for n in model.graph.node))
    manifest["estimates"].append({"name": "resnet18_dynamo", "file": "resnet18_dynamo.onnx",
                                  "opset": 18, "ops": ops, "batch": 1})
    print("resnet18 (dynamo) ops:", ", ".join(ops))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tessera", help="a tessera binary, to check its numerics on resnet18")
    a = p.parse_args()
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    import transformers
    manifest = {
        "generator": "scripts/export_default_models.py",
        "source": f"torch {torch.__version__}, transformers {transformers.__version__}, "
                  f"onnxruntime {ort.__version__}",
        "numerics": [],
        "estimates": [],
    }
    export_transformers(manifest)
    export_resnet18(manifest, a.tessera)
    for case in manifest["numerics"]:
        manifest["estimates"].append(
            {**{k: case[k] for k in ("name", "file", "opset", "ops")}, "batch": B})
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
