"""The package's functions and types over the native module (``tessera._native``)."""

import copy
import inspect
import io
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor, as_completed

from . import _native


class TesseraError(Exception):
    """An error of Tessera's; the message holds the Rust cause chain, one ``caused by:``
    line per cause."""


class OptionError(TesseraError, ValueError):
    """An option is unknown, has a wrong value, or conflicts with another."""


class ModelError(TesseraError):
    """The model cannot be read, exported or imported."""


class EstimateError(TesseraError):
    """The estimate itself failed."""


class OutOfMemory(TesseraError):
    """The model does not fit: a tile needs more memory than it has.

    Attributes: ``model``; ``tile`` (the fullest tile), ``needed`` and ``available`` (its
    bytes), ``tiles_over`` (tiles over the limit), ``categories`` (bytes by category on that
    tile at its peak), ``largest_tensors`` (name, bytes on that tile) and ``estimate`` (the
    :class:`Estimate`, with the figures of the run that does not fit).
    """

    def __init__(self, message, *, model, oom, estimate=None):
        super().__init__(message)
        self.model = model
        self.tile = oom.get("tile")
        self.needed = oom.get("needed")
        self.available = oom.get("available")
        self.tiles_over = oom.get("tiles_over")
        self.categories = dict(oom.get("categories", {}))
        self.largest_tensors = [tuple(t) for t in oom.get("largest_tensors", [])]
        self.estimate = estimate


_KINDS = {"option": OptionError, "model": ModelError, "estimate": EstimateError}


def _native_call(f, *args):
    """``f(*args)``, with the native module's errors as this package's exceptions."""
    try:
        return f(*args)
    except _native.Error as e:
        kind, message = e.args
        raise _KINDS.get(kind, TesseraError)(message) from None


def _frame(rows):
    """Rows as a pandas DataFrame when pandas is installed, else the list of dicts."""
    try:
        import pandas
    except ImportError:
        return rows
    return pandas.DataFrame(rows)


def _plain(value):
    """A value as JSON takes it: numpy scalars and arrays, tuples and paths made plain."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def _options(options):
    """The keyword options as the JSON object the native module reads."""
    out = {}
    for name, value in options.items():
        if value is None:
            continue
        if name in ("input_shapes", "input_shape"):
            if isinstance(value, dict):
                value = [[k, list(v)] for k, v in value.items()]
            name = "input_shapes"
        out[name] = _plain(value)
    return json.dumps(out)


def _is_instance_of(obj, modules, class_name):
    """Whether ``obj``'s class derives from a class ``class_name`` of one of ``modules``
    (checked without importing them)."""
    for c in type(obj).__mro__:
        if c.__name__ == class_name and any(
            c.__module__ == m or c.__module__.startswith(m + ".") for m in modules
        ):
            return True
    return False


def _from_torch(module, example_input):
    """A ``torch.nn.Module`` as ONNX bytes, exported by ``torch.onnx`` with ``example_input``."""
    try:
        import torch
    except ImportError as e:
        raise ModelError(
            f"exporting a torch.nn.Module to ONNX needs PyTorch (pip install torch): {e}"
        ) from None
    if example_input is None:
        raise OptionError(
            "a torch.nn.Module needs an example input to export: "
            "tessera.estimate(module, torch.randn(batch, ...))"
        )
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    kwargs = {"opset_version": 17}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        # The TorchScript exporter: it needs nothing beyond PyTorch.
        kwargs["dynamo"] = False
    buffer = io.BytesIO()
    try:
        torch.onnx.export(module, args, buffer, **kwargs)
    except Exception as e:  # the exporter's own errors, named as such
        raise ModelError(f"torch.onnx.export of {type(module).__name__} failed: {e}") from e
    return buffer.getvalue(), type(module).__name__ + ".onnx"


def _from_keras(model, example_input):
    """A Keras model as ONNX bytes, exported by tf2onnx."""
    try:
        import tensorflow as tf
        import tf2onnx
    except ImportError as e:
        raise ModelError(
            "exporting a Keras model to ONNX needs TensorFlow and tf2onnx "
            f"(pip install tensorflow tf2onnx): {e}"
        ) from None
    if example_input is not None:
        shape = tuple(getattr(example_input, "shape", example_input))
        signature = (tf.TensorSpec(shape, tf.float32, name="input"),)
    else:
        signature = tuple(
            tf.TensorSpec(i.shape, i.dtype, name=f"input_{k}") for k, i in enumerate(model.inputs)
        )
    try:
        proto, _ = tf2onnx.convert.from_keras(model, input_signature=signature, opset=13)
    except Exception as e:  # the exporter's own errors, named as such
        raise ModelError(f"tf2onnx could not export Keras model {model.name}: {e}") from e
    return proto.SerializeToString(), f"{model.name}.onnx"


def _source(model, example_input):
    """What the native module takes for ``model``: a path or name, or ONNX bytes and a name."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model), None
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model), "model.onnx"
    if type(model).__name__ == "ModelProto" and hasattr(model, "SerializeToString"):
        name = getattr(getattr(model, "graph", None), "name", "") or "model"
        return model.SerializeToString(), f"{name}.onnx"
    if _is_instance_of(model, ("torch",), "Module"):
        return _from_torch(model, example_input)
    if _is_instance_of(model, ("keras", "tf_keras", "tensorflow"), "Model"):
        return _from_keras(model, example_input)
    raise TypeError(
        "model: expected a path, a shipped model's name, ONNX bytes, an onnx.ModelProto, "
        f"a torch.nn.Module or a Keras model; got {type(model).__name__}"
    )


class Estimate:
    """An estimate: fit, cycles, throughput, memory per IPU and category, per-layer rows and,
    for an ONNX model split automatically, the split. ``to_dict()`` is what
    ``tessera estimate --json`` prints."""

    def __init__(self, native, command="tessera.estimate(...)"):
        self._native = native
        self._command = command
        self._dict = json.loads(native.json())

    # The summary's figures.
    @property
    def model(self):
        """The model's name."""
        return self._dict["model"]

    @property
    def fits(self):
        """Whether every tile of every IPU fits."""
        return self._dict["fits"]

    @property
    def samples_per_second(self):
        """Samples per second of the whole system (all replicas)."""
        return self._dict["samples_per_second"]

    @property
    def steady_samples_per_second(self):
        """Samples per second at steady state: the limit as the micro-batches per weight update
        (M) grow, where the pipeline's fill and drain, the all-reduce and the weight update
        spread over ever more micro-batches."""
        return self._dict["steady_samples_per_second"]

    @property
    def cycles_per_step(self):
        """Average cycles per micro-batch step (cycles per weight update / M)."""
        return self._dict["cycles_per_step"]

    @property
    def cycles_per_weight_update(self):
        """Cycles per weight update."""
        return self._dict["cycles_per_weight_update"]

    @property
    def seconds_per_weight_update(self):
        """Seconds per weight update."""
        return self._dict["seconds_per_weight_update"]

    @property
    def cycles_by_phase(self):
        """Cycles by phase (compute, exchange, sync, ...) of one update's runs."""
        return dict(self._dict["cycles_by_phase"])

    @property
    def ipus(self):
        """IPUs in all (over the replicas)."""
        return self._dict["ipus_total"]

    @property
    def system(self):
        """The system the IPUs need: one IPU-Machine, or the smallest IPU-POD or Bow Pod that
        holds them (``"IPU-POD128"``); ``None`` for PCIe cards (``ipu="mk1"`` or ``"c600"``)."""
        return self._dict.get("system")

    @property
    def ipu_link_domains(self):
        """IPU-Link domains (POD64 racks) the IPUs span; above 1 the all-reduce crosses the
        gateways between them."""
        return self._dict.get("ipu_link_domains", 1)

    @property
    def replicas(self):
        """Replicas."""
        return self._dict["replicas"]

    @property
    def gradient_accumulation_count(self):
        """Micro-batches per weight update (M)."""
        return self._dict["gradient_accumulation_count"]

    @property
    def schedule(self):
        """The pipeline schedule."""
        return self._dict["schedule"]

    @property
    def memory(self):
        """Memory per IPU of one replica: a list of dicts with ``ipu``, ``bytes_used``,
        ``max_tile_bytes``, ``max_tile``, ``tiles_used`` and ``categories`` (bytes by
        category over the IPU's tiles)."""
        return [dict(i) for i in self._dict["ipus"]]

    @property
    def memory_by_category(self):
        """Bytes by category, per IPU: ``{ipu: {category: bytes}}``."""
        return {i["ipu"]: dict(i["categories"]) for i in self._dict["ipus"]}

    @property
    def stages(self):
        """Per pipeline stage: its IPU, cycles, stash and idle share."""
        return [dict(s) for s in self._dict["stages"]]

    @property
    def split(self):
        """The automatic split (its IPUs, stage boundaries, per-IPU cycles and weights), when
        the estimate is of one, else None."""
        onnx = self._dict.get("onnx") or {}
        return onnx.get("split")

    @property
    def fewest_ipus(self):
        """The search for the fewest IPUs an automatic split fits on, when the model did not
        fit and the search ran, else None."""
        onnx = self._dict.get("onnx") or {}
        return onnx.get("fewest_ipus")

    @property
    def layers(self):
        """Memory and cycles per ONNX node: a pandas DataFrame when pandas is installed,
        else a list of dicts (empty for model files)."""
        onnx = self._dict.get("onnx") or {}
        return _frame([dict(r) for r in onnx.get("layers", [])])

    @property
    def out_of_memory(self):
        """Why the model does not fit (an :class:`OutOfMemory`), or None."""
        oom = self._native.out_of_memory()
        if oom is None:
            return None
        return OutOfMemory(
            f"{self.model} does not fit: {self._dict['out_of_memory']}",
            model=self.model,
            oom=json.loads(oom),
            estimate=self,
        )

    def raise_if_out_of_memory(self):
        """Raises :class:`OutOfMemory` when the model does not fit."""
        oom = self.out_of_memory
        if oom is not None:
            raise oom

    def to_dict(self):
        """The estimate as ``tessera estimate --json`` prints it (a copy: changing it leaves
        the estimate as it is)."""
        return copy.deepcopy(self._dict)

    def to_json(self):
        """The estimate as the JSON ``tessera estimate --json`` prints."""
        return self._native.json()

    def save_report(self, directory):
        """Writes the report (index.html, memory.svg, timeline.svg, trace.json,
        estimate.json) into ``directory``; returns the files' paths."""
        return _native_call(self._native.save_report, os.fspath(directory), self._command)

    def _repr_html_(self):
        return self._native.html(self._command)

    def __str__(self):
        return self._native.text()

    def __repr__(self):
        fit = "fits" if self.fits else "does not fit"
        return (
            f"<tessera.Estimate {self.model}: {fit}, {self.samples_per_second:,.1f} samples/s, "
            f"{self.cycles_per_step:,} cycles per step on {self.ipus} IPU(s)>"
        )


def _command(model, options):
    """How the call reads, for the report."""
    shown = model if isinstance(model, (str, os.PathLike)) else type(model).__name__
    words = [repr(os.fspath(shown) if isinstance(shown, os.PathLike) else shown)]
    words += [f"{k}={v!r}" for k, v in options.items()]
    return f"tessera.estimate({', '.join(words)})"


def estimate(model, example_input=None, *, must_fit=False, **options):
    """Estimates ``model`` with ``options`` (``tessera estimate``'s, in snake_case).

    ``model`` is a path (ONNX, a model file) or a shipped model's name; ONNX bytes or an
    ``onnx.ModelProto``; a ``torch.nn.Module`` (with ``example_input``, exported by
    ``torch.onnx``) or a Keras model (exported by tf2onnx; ``example_input``, or its shape,
    fixes an open input signature). A model that does not fit is an estimate with ``fits``
    False, unless ``must_fit`` asks for :class:`OutOfMemory` to be raised instead.

    The GIL is released while the estimate runs.
    """
    source, name = _source(model, example_input)
    native = _native_call(_native.estimate, source, _options(options), name)
    result = Estimate(native, _command(model, options))
    if must_fit:
        result.raise_if_out_of_memory()
    return result


def options():
    """Every option of :func:`estimate` and of sweep specs, with what it does.

    A dict of option name to its description, in the order ``tessera estimate --help``
    lists them: the library's own text, with the names a choice takes, its default and what
    TensorFlow for the IPU, PopART and PopTorch call it.
    """
    out = {}
    for name, help_text, values, default, frameworks in _native.options_help():
        text = help_text
        if values:
            text += f" Values: {', '.join(values)}."
        if default is not None:
            text += f" Default: {default}."
        if frameworks is not None:
            text += f" In Graphcore's frameworks: {frameworks}."
        out[name] = _keywords(text)
    return out


def _keywords(text):
    """``text`` with the command's flags (``--batch-size``) named as keywords (``batch_size``)."""
    return _native.as_keywords(text)


def _options_doc():
    """The options as reStructuredText, for :func:`estimate`'s docstring."""
    lines = ["", "    Options (``tessera.options()`` gives them as a dict):", ""]
    for name, text in options().items():
        lines.append(f"    ``{name}``")
        lines.append(f"        {text}")
    return "\n".join(lines) + "\n"


estimate.__doc__ = (estimate.__doc__ or "") + _options_doc()


def _row(row_json):
    """A sweep row as a flat dict: the index, the configuration's options, the figures."""
    row = json.loads(row_json)
    flat = {"index": row["index"]}
    flat.update(row.get("config", {}))
    flat.update({k: v for k, v in row.items() if k not in ("index", "config")})
    return flat


def _spec_value(value, where):
    """A sweep spec's ``value`` at key path ``where`` as plain JSON values (paths and numpy
    values made plain), or an :class:`OptionError` naming the key whose value a spec cannot
    hold (``None``, NaN, an object of another kind)."""
    at = where or "the spec"
    value = _plain(value)
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise OptionError(f"{at}: key {k!r} is not a string")
            out[k] = _spec_value(v, f"{where}.{k}" if where else k)
        return out
    if isinstance(value, list):
        return [_spec_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None:
        raise OptionError(f"{at}: None is not a value; leave the key out for the default")
    if isinstance(value, float) and not math.isfinite(value):
        raise OptionError(f"{at}: {value} is not a finite number")
    if not isinstance(value, (str, bool, int, float)):
        raise OptionError(f"{at}: a {type(value).__name__} is not a value a sweep spec holds")
    return value


def sweep(spec, *, jobs=None, lowering_cache=8, progress=True):
    """Estimates every configuration of a sweep spec: a TOML file's path, or a dict of the
    same tables (``name``, ``base``, ``grid``, ``configs``). Returns the rows (a pandas
    DataFrame when pandas is installed, else a list of dicts), in configuration order.

    ``jobs`` configurations run at a time (the machine's cores by default); the last
    ``lowering_cache`` lowered IPU programs are kept for configurations that lower the same
    (0 turns that off). A tqdm progress bar shows when tqdm is installed and ``progress``.
    """
    if isinstance(spec, dict):
        tables = _spec_value(spec, "")
        native = _native_call(_native.Sweep.from_json, json.dumps(tables), spec.get("name", "sweep"))
    else:
        native = _native_call(_native.Sweep.load, os.fspath(spec))
    n = len(native)
    jobs = max(1, jobs or os.cpu_count() or 1)
    bar = None
    if progress:
        try:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc=native.name, unit="configuration")
        except ImportError:
            pass
    rows = [None] * n
    _native.set_lowering_cache(lowering_cache)
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(native.row, i): i for i in range(n)}
            for future in as_completed(futures):
                rows[futures[future]] = _row(future.result())
                if bar is not None:
                    bar.update(1)
    finally:
        # The cache holds lowered programs (a few hundred MB for BERT): freed once done.
        _native.set_lowering_cache(0)
        if bar is not None:
            bar.close()
    return _frame(rows)


def calibrate(ops=None, whole_models=None, *, ops_only=False):
    """``tessera calibrate``: every row of the IPU Model's figures for single ops (``ops``,
    a CSV; the bundled poplibs set by default) estimated beside them, and unless
    ``ops_only`` Graphcore's published whole-model runs and Poplar's memory profiles
    (``whole_models``, a TOML; the bundled set by default) beside their estimates.

    Returns a dict: ``rows`` (a DataFrame with pandas), ``summary`` (the medians),
    ``breaks`` (what falls outside the bounds), ``published_runs`` and ``profiles``.
    """
    out = json.loads(
        _native_call(
            _native.calibrate,
            None if ops is None else os.fspath(ops),
            None if whole_models is None else os.fspath(whole_models),
            ops_only,
        )
    )
    out["rows"] = _frame(out["rows"])
    return out
