"""Tessera from Python: memory and cycle estimates of neural networks on Graphcore-style IPUs.

>>> import tessera
>>> e = tessera.estimate("data/onnx/bert_base.stripped.onnx", batch_size=8, pipeline_ipus=4,
...                      dtype="f16", recompute_checkpoints="auto")
>>> e.fits, round(e.samples_per_second)
(True, 1497)

``estimate`` takes a path (ONNX, a model file, or a shipped model's name), ONNX bytes, an
``onnx.ModelProto``, a ``torch.nn.Module`` with an example input or a Keras model, and the
options of ``tessera estimate`` in snake_case. The result has typed attributes, ``.layers`` (a
pandas DataFrame when pandas is installed), ``.to_dict()``, ``.save_report(dir)`` and an HTML
view for notebooks; ``options()`` describes every option. ``sweep`` estimates a sweep spec's configurations, ``calibrate`` compares
the estimates with Graphcore's published figures.

The figures are those of the ``tessera`` command: both call the same library entry.
"""

from ._api import (
    Estimate,
    EstimateError,
    ModelError,
    OptionError,
    OutOfMemory,
    TesseraError,
    calibrate,
    estimate,
    options,
    sweep,
)
from ._native import __version__

__all__ = [
    "Estimate",
    "EstimateError",
    "ModelError",
    "OptionError",
    "OutOfMemory",
    "TesseraError",
    "__version__",
    "calibrate",
    "estimate",
    "options",
    "sweep",
]
