"""Model registry: recipe ``model.name`` -> options class + factory.

Every model is an ``nn.Sequential`` of coarse blocks so that pipeline and layer-wise
strategies can split it between top-level children. Adding a model is one module here
with an ``Options`` class (a pydantic model whose ``name`` is a Literal) and a
``build(options, data_spec) -> nn.Sequential``, plus one line in ``_MODULES``.
"""
from __future__ import annotations

import importlib

from suite.data import DataSpec

_MODULES = ["mlp", "cnn", "vgg", "autoencoder", "transformer"]
MODELS = {}
for _m in _MODULES:
    _mod = importlib.import_module(f"suite.models.{_m}")
    for _opts in _mod.OPTIONS:
        MODELS[_opts.model_fields["name"].default] = (_opts, _mod.build)


def build(options, spec: DataSpec):
    """Build the model the recipe names for data of the given spec."""
    _, factory = MODELS[options.name]
    return factory(options, spec)
