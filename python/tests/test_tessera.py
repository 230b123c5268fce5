"""The Python package over the library entry: results as the command gives them, errors as
typed exceptions, sources of every kind, sweeps, calibration and the notebook example.

`TESSERA_BIN` names the `tessera` command to compare with (the Rust test that runs this suite
sets it); the comparisons skip without it.
"""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import tessera

ROOT = Path(__file__).resolve().parents[2]
BERT_TINY = ROOT / "data" / "onnx" / "bert_tiny.stripped.onnx"
NOTEBOOK = ROOT / "examples" / "notebooks" / "estimate.ipynb"


def command_json(*args):
    """`tessera estimate ARGS --json`, parsed; skips when no command is named."""
    binary = os.environ.get("TESSERA_BIN")
    if not binary:
        pytest.skip("TESSERA_BIN is not set: no `tessera` command to compare with")
    out = subprocess.run(
        [binary, "estimate", *map(str, args), "--json"],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout)


def without_seconds(d):
    d = json.loads(json.dumps(d))
    d.get("onnx", {}).pop("seconds", None)
    return d


def test_an_estimate_is_the_commands():
    e = tessera.estimate(BERT_TINY, batch_size=2, pipeline_ipus=2)
    cli = command_json(BERT_TINY, "--batch-size", 2, "--pipeline-ipus", 2)
    assert without_seconds(e.to_dict()) == without_seconds(cli)
    assert e.samples_per_second == cli["samples_per_second"]
    assert e.split["ipus"] == 2
    assert len(e.split["boundaries"]) == 1


def test_a_model_file_estimates_as_the_command_does():
    e = tessera.estimate("pipelined_sequential", inference=True)
    assert e.to_dict() == command_json("pipelined_sequential", "--inference")
    assert e.ipus == 2
    assert "inference:" in str(e)


def test_typed_attributes_read_the_summary():
    e = tessera.estimate(BERT_TINY, batch_size=4, dtype="f16", ipu="bow")
    d = e.to_dict()
    assert e.fits is True and d["fits"] is True
    assert e.cycles_per_step == d["cycles_per_step"] > 0
    assert e.samples_per_second == pytest.approx(d["samples_per_second"])
    assert e.ipus == 1 and e.replicas == 1
    assert e.system == d["system"] == "Bow-2000" and e.ipu_link_domains == 1
    assert set(e.memory_by_category[0]) >= {"always_live", "not_always_live", "vertex_code"}
    assert e.memory[0]["bytes_used"] > 0 and e.memory[0]["categories"] == e.memory_by_category[0]
    assert e.split is None and e.out_of_memory is None
    assert d["onnx"]["batch_size"] == 4
    layers = e.layers
    names = list(layers["name"]) if hasattr(layers, "columns") else [r["name"] for r in layers]
    assert "node_layer_norm" in names
    columns = set(layers.columns) if hasattr(layers, "columns") else set(layers[0])
    parts = {"gradient", "recompute", "exchange", "update"}
    assert {f"backward_{p}_cycles" for p in parts} <= columns


def test_bytes_and_paths_give_the_same_estimate():
    by_path = tessera.estimate(BERT_TINY, batch_size=2, inference=True)
    by_bytes = tessera.estimate(BERT_TINY.read_bytes(), batch_size=2, inference=True)
    assert by_bytes.cycles_per_step == by_path.cycles_per_step
    assert by_bytes.to_dict()["onnx"]["file"] == "model.onnx"


def test_an_onnx_proto_estimates():
    onnx = pytest.importorskip("onnx", reason="the onnx package is not installed")
    by_path = tessera.estimate(BERT_TINY, batch_size=2, inference=True)
    # A plain load reads the empty `__stripped__`: weights without values. Without external
    # data the stripped weights stay external. Both are the graph alone.
    for proto in [onnx.load(str(BERT_TINY)), onnx.load(str(BERT_TINY), load_external_data=False)]:
        e = tessera.estimate(proto, batch_size=2, inference=True)
        assert e.cycles_per_step == by_path.cycles_per_step
    onnx.checker.check_model(str(BERT_TINY))


def test_bad_options_are_option_errors_naming_the_option():
    with pytest.raises(tessera.OptionError, match="batch_sise"):
        tessera.estimate("sequential", batch_sise=2)
    with pytest.raises(tessera.OptionError, match=r"dtype: `f8` is not one of f32, f16"):
        tessera.estimate("sequential", dtype="f8")
    with pytest.raises(tessera.OptionError, match="exclude each other"):
        tessera.estimate(BERT_TINY, pipeline_ipus=2, layers_per_ipu=[1, 1])
    with pytest.raises(ValueError):  # an OptionError is a ValueError too
        tessera.estimate("sequential", replicas="two")


def test_errors_name_options_by_their_keywords_not_the_commands_flags():
    # The library's message names `--pipeline-ipus` and `--input-shape` on the command line.
    with pytest.raises(tessera.OptionError) as e:
        tessera.estimate("sequential", pipeline_ipus=2)
    assert "pipeline_ipus" in str(e.value) and "--" not in str(e.value), str(e.value)
    with pytest.raises(tessera.OptionError, match="replicas: 3 replica.s. do not divide the 16 IPUs of system `pod16`"):
        tessera.estimate("sequential", system="pod16", replicas=3)


def test_a_system_is_filled_with_replicas():
    e = tessera.estimate("pipelined_sequential", system="pod16")
    assert (e.replicas, e.ipus, e.system) == (8, 16, "IPU-POD16"), (e.replicas, e.ipus, e.system)
    assert e.steady_samples_per_second > e.samples_per_second


def test_bad_models_are_model_errors_with_their_causes():
    with pytest.raises(tessera.ModelError, match="neither a shipped model"):
        tessera.estimate("no_such_model")
    with pytest.raises(tessera.ModelError, match="caused by"):
        tessera.estimate(ROOT / "README.md")
    with pytest.raises(tessera.ModelError):
        tessera.estimate(b"not an onnx model")
    with pytest.raises(TypeError, match="expected a path"):
        tessera.estimate(3.5)


def test_a_model_that_does_not_fit_says_where():
    e = tessera.estimate("transformer_encoder", ipu="mk1", batch_size=1024)
    assert not e.fits
    oom = e.out_of_memory
    assert isinstance(oom, tessera.OutOfMemory)
    assert oom.needed > oom.available > 0
    assert oom.tile == e.to_dict()["ipus"][0]["max_tile"] or oom.tiles_over >= 1
    assert sum(oom.categories.values()) == oom.needed
    assert oom.largest_tensors and all(b > 0 for _, b in oom.largest_tensors)
    with pytest.raises(tessera.OutOfMemory, match="does not fit") as raised:
        tessera.estimate("transformer_encoder", ipu="mk1", batch_size=1024, must_fit=True)
    assert raised.value.estimate.fits is False


def test_reports_and_notebook_html(tmp_path):
    e = tessera.estimate(BERT_TINY, batch_size=2, inference=True)
    files = e.save_report(tmp_path / "report")
    assert {Path(f).name for f in files} >= {"index.html", "memory.svg", "timeline.svg"}
    html = e._repr_html_()
    assert html.count("<svg") == 2 and "Layers (ONNX nodes)" in html
    assert "samples/s" in html


def test_the_notebook_view_of_a_large_model_stays_small():
    """BERT-Base on four IPUs: the memory picture draws groups of tiles, the layers the top
    dozen, so a notebook keeps well under 200 KB per view."""
    e = tessera.estimate(
        str(ROOT / "data/onnx/bert_base.stripped.onnx"),
        batch_size=8,
        pipeline_ipus=4,
        dtype="f16",
        recompute_checkpoints="auto",
    )
    html = e._repr_html_()
    assert len(html.encode()) < 200_000, len(html.encode())
    assert "each bar the fullest of 16 neighbouring tiles" in html
    # The memory picture's total is the IPU table's, the gaps named beside it.
    used = e.to_dict()["ipus"][1]["bytes_used"]
    assert f"IPU 1: {used / 2**20:.1f} MiB used" in html


def test_the_gil_is_released_while_an_estimate_runs():
    done = []
    worker = threading.Thread(target=lambda: done.append(tessera.estimate(BERT_TINY, batch_size=8)))
    worker.start()
    spins = 0
    while worker.is_alive():
        spins += 1
    worker.join()
    assert done and done[0].fits
    # With the GIL held for the whole estimate this thread could not have run at all.
    assert spins > 1000


def test_a_sweep_gives_one_row_per_configuration_as_the_estimates():
    spec = {
        "name": "tiny",
        "base": {"model": str(BERT_TINY), "inference": True},
        "grid": {"batch_size": [1, 2], "dtype": ["f16", "f32"]},
    }
    rows = tessera.sweep(spec, jobs=2, progress=False)
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        e = tessera.estimate(BERT_TINY, inference=True, batch_size=r["batch_size"], dtype=r["dtype"])
        assert r["cycles_per_step"] == e.cycles_per_step
        assert r["error"] is None
    with pytest.raises(tessera.OptionError, match="unknown key `batch_sise`"):
        tessera.sweep({"base": {"model": "sequential", "batch_sise": 2}})
    # Values a spec cannot hold are named by their keys in the dict, not by a position in
    # text the package made.
    with pytest.raises(tessera.OptionError, match=r"^base\.batch_size: None is not a value"):
        tessera.sweep({"base": {"model": "sequential", "batch_size": None}})
    with pytest.raises(tessera.OptionError, match=r"^grid\.learning_rate\[1\]: nan is not a finite number"):
        tessera.sweep({"base": {"model": "sequential"}, "grid": {"learning_rate": [0.1, float("nan")]}})
    with pytest.raises(tessera.OptionError, match=r"^grid\.dtype: a set is not a value"):
        tessera.sweep({"base": {"model": "sequential"}, "grid": {"dtype": {"f16"}}})


def test_a_sweep_spec_file_runs():
    spec = ROOT / "python" / "tests" / "tiny_sweep.toml"
    rows = tessera.sweep(spec, progress=False)
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    assert len(rows) == 2 and all(r["fits"] for r in rows)


def test_calibration_of_the_op_table():
    c = tessera.calibrate(ops_only=True)
    rows = c["rows"]
    assert len(rows) > 10
    assert c["summary"] and c["published_runs"] == [] and c["profiles"] == []


def test_a_torch_module_estimates():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 32 * 32, 10),
    )
    e = tessera.estimate(model, torch.randn(4, 3, 32, 32))
    assert e.fits and e.to_dict()["onnx"]["batch_size"] == 4
    with pytest.raises(tessera.OptionError, match="example input"):
        tessera.estimate(model)


def test_a_keras_model_estimates():
    tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed")
    pytest.importorskip("tf2onnx", reason="tf2onnx is not installed")
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(28, 28, 1), batch_size=8),
            tf.keras.layers.Conv2D(8, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(10),
        ]
    )
    e = tessera.estimate(model)
    assert e.fits and e.to_dict()["onnx"]["batch_size"] == 8


def test_the_example_notebook_runs():
    """Every code cell of the example notebook, in order, in one namespace, from its folder
    (as Jupyter runs it)."""
    nb = json.loads(NOTEBOOK.read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert cells
    namespace = {}
    cwd = os.getcwd()
    os.chdir(NOTEBOOK.parent)
    try:
        for cell in cells:
            exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert namespace["e"].fits


def test_every_option_is_described_from_the_library():
    opts = tessera.options()
    assert list(opts)[0] == "batch_size"
    assert opts["batch_size"].startswith("Samples per micro-batch")
    assert "Values: f32, f16. Default: f32." in opts["dtype"]
    assert "no_inference_rewrites" in opts
    assert "``pipeline_schedule``" in tessera.estimate.__doc__
    # Every option is in help(tessera.estimate), with Graphcore's frameworks' names where
    # they have one, and with keywords where the library's text names the command's flags.
    for name in opts:
        assert f"``{name}``" in tessera.estimate.__doc__, name
    assert "PopART `accumulationFactor`" in opts["gradient_accumulation_count"]
    assert "system" in opts and "bow-pod16" in opts["system"]
    # The options' own flags are named as keywords (trtexec's `--shapes` stays a flag).
    for name in opts:
        flag = "--" + name.replace("_", "-")
        assert flag not in tessera.estimate.__doc__.replace("--input-shape", ""), flag
    assert "with system, as many as the system holds" in opts["replicas"]
    with pytest.raises(tessera.OptionError, match="unknown option `batch_sise`"):
        tessera.estimate("sequential", batch_sise=2)


def test_the_readme_s_python_example_fits_and_says_so():
    """The one-liner of the README's "From Python" section, run as written."""
    readme = (ROOT / "README.md").read_text()
    line = next(l for l in readme.splitlines() if l.startswith('python -c "import tessera'))
    code = line[len('python -c "') : -1]
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert out.startswith("fits "), out
    assert out.split()[1] in readme, f"the README quotes another figure than {out!r}"


def test_the_package_docstring_example_holds():
    """The example opening `tessera.__doc__`: it fits, at the figure it shows."""
    import doctest

    globs = {"tessera": tessera}
    parser = doctest.DocTestParser()
    test = parser.get_doctest(tessera.__doc__, globs, "tessera", None, 0)
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        result = doctest.DocTestRunner().run(test)
    finally:
        os.chdir(old)
    assert result.failed == 0



def test_the_package_installs_the_command():
    # pip installs a `tessera` script beside the interpreter; `python -m tessera` is the same.
    script = Path(sys.executable).with_name("tessera")
    for cmd in ([str(script)], [sys.executable, "-m", "tessera"]):
        if cmd[0] == str(script) and not script.exists():
            pytest.fail(f"no `tessera` script beside {sys.executable}")
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == f"tessera {tessera.__version__}", out
        bad = subprocess.run([*cmd, "estimate", "--batch-size", "0"], capture_output=True, text=True)
        assert bad.returncode == 1 and bad.stdout == "", bad
        assert bad.stderr.startswith("error: "), bad
    est = subprocess.run(
        [sys.executable, "-m", "tessera", "estimate", "sequential", "--json"],
        capture_output=True, text=True, check=True,
    )
    assert json.loads(est.stdout.splitlines()[-1])["fits"] is True
