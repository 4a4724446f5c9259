"""Data registry: recipe ``data.name`` -> options class + loader.

Every data set loads into memory as a ``TensorDataset`` of (inputs, targets); the training
loop shards it between data-parallel ranks with ``DistributedSampler``. Adding one is a
module here with ``Options`` classes (each with ``spec()`` and ``load()``) and a line in
``_MODULES``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about its data, known without loading it."""
    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    input_dtype: str = "float32"  # "int64" for token ids
    tokens_per_sample: int | None = None  # sequence data: tokens one sample trains on (tokens/s)


_MODULES = ["synthetic", "digits", "vision", "tokens"]
DATASETS = {}
for _m in _MODULES:
    _mod = importlib.import_module(f"suite.data.{_m}")
    for _opts in _mod.OPTIONS:
        DATASETS[_opts.model_fields["name"].default] = _opts
