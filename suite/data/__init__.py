"""Data registry: recipe ``data.name`` -> options class, each loaded through one contract
(``docs/plugins.md``), built-in or the user's:

- A **factory** is called as ``factory(**kwargs)``: a built-in's fields but ``name`` and the limits
  (its module's ``load``), or a custom data set's ``data.kwargs``.
- It returns ``(train, val)`` or ``(train, val, spec)``: each set a ``TensorDataset(inputs, targets)``
  (or that pair of tensors), inputs float32 (or int64 token ids), ``spec`` a ``DataSpec``. Without a
  spec the suite derives it from the tensors: input shape and dtype, classes = largest integer
  target + 1, tokens per sample = sequence length for int64 sequences, input vocabulary = largest
  input id + 1 for int64 inputs.
- It runs with torch's global generator seeded to 0 (and restored after), so every call, in the
  submitter or in any rank, gives the same data; a factory that draws from its own seeded
  generator does not depend on that.
- ``limit_train`` / ``limit_val`` are applied by the suite after the factory; the training loop
  shards the training set between data-parallel ranks with ``DistributedSampler``.

A built-in is a module here with ``OPTIONS`` (pydantic classes whose ``name`` is a Literal, with a
``spec()`` known without loading where possible) and ``load(**fields)``, plus a line in ``_MODULES``.
``data: {name: custom, target: "mypkg.data:load", kwargs: {...}}`` names a factory by import path
instead (``data/custom.py``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

# A target that is not scored (e.g. padding after a sentence's end): what cross_entropy ignores by
# default. The language task skips such tokens in its loss, accuracy and perplexity.
IGNORE = -100


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about its data, known without loading it."""
    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    input_dtype: str = "float32"  # "int64" for token ids
    tokens_per_sample: int | None = None  # sequence data: tokens one sample trains on (tokens/s)
    # Token inputs: how many ids they draw from (an embedding's rows) when that is not num_classes,
    # e.g. a text classifier's vocabulary, or a translation model's source language.
    input_vocab: int | None = None


_MODULES = ["synthetic", "digits", "vision", "tokens", "shapes", "segmentation_folder", "coco", "text", "text_synthetic",
            "text_files", "custom"]
DATASETS = {}
for _m in _MODULES:
    _mod = importlib.import_module(f"suite.data.{_m}")
    for _opts in _mod.OPTIONS:
        DATASETS[_opts.model_fields["name"].default] = _opts
