"""Model registry: recipe ``model.name`` -> options class + factory.

Every model is an ``nn.Sequential`` of coarse blocks so that pipeline and layer-wise
strategies can split it between top-level children. Adding a model is one module here
with an ``Options`` class (a pydantic model whose ``name`` is a Literal) and a
``build(options, data_spec) -> nn.Sequential``, plus one line in ``_MODULES``.
"""
from __future__ import annotations

import importlib

from suite.data import DataSpec
from suite.errors import SuiteError

_MODULES = ["mlp", "cnn", "vgg", "autoencoder", "transformer"]
MODELS = {}
for _m in _MODULES:
    _mod = importlib.import_module(f"suite.models.{_m}")
    for _opts in _mod.OPTIONS:
        MODELS[_opts.model_fields["name"].default] = (_opts, _mod.build)


def build(options, spec: DataSpec):
    """Build the model the recipe names for data of the given spec."""
    check_fits(options, spec)
    _, factory = MODELS[options.name]
    return factory(options, spec)


_INPUTS = {"features": ("float inputs", "data.name=digits, mnist, cifar10 or synthetic"),
           "images": ("float images (channels x height x width)", "data.name=digits, mnist, cifar10 or synthetic"),
           "tokens": ("token ids", "data.name=synthetic_tokens")}


def check_fits(options, spec: DataSpec) -> None:
    """SuiteError when the data's inputs are not of the kind the model takes (``ModelOptions.inputs``)."""
    needs = type(options).inputs
    tokens = spec.input_dtype == "int64"
    fits = {"features": not tokens, "images": not tokens and len(spec.input_shape) == 3,
            "tokens": tokens and len(spec.input_shape) == 1, None: True}[needs]
    if not fits:
        what, use = _INPUTS[needs]
        shape = "x".join(map(str, spec.input_shape))
        raise SuiteError(f"model.name={options.name} needs {what}, but data.name={spec.name} gives "
                         f"{spec.input_dtype} inputs of shape {shape}; use {use}, or another model")
