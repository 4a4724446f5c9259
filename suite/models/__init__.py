"""Model registry: recipe ``model.name`` -> (options class, factory).

One contract for every model, built-in or the user's (``docs/plugins.md``):

- A **factory** is called as ``factory(spec, **kwargs)``: ``spec`` is the data's ``DataSpec``
  (input shape, classes, input dtype, tokens per sample), ``kwargs`` the recipe's model options
  (a built-in's fields but ``name``; a custom model's ``model.kwargs``).
- It returns an ``nn.Module``. Strategies that cut the model (pipeline, layer_split, ds_pipeline,
  fairscale_pipe) need an ``nn.Sequential`` of coarse blocks, cut between its top-level children;
  every built-in is one but unet and segnet, whose skip connections no cut between blocks carries
  (their ``not_splittable_because`` says why, in the refusal: ``strategies/splitting.py``).
- The suite seeds torch (``training.seed``) right before the call, so every rank and the
  single-process baseline build the same weights; the factory must not reseed.
- What the output trains against is the options' ``task``: classification (cross-entropy on the
  targets, accuracy), reconstruction (MSE against the input), language (next-token cross-entropy)
  or segmentation (per-pixel cross-entropy against integer masks, pixel accuracy, mean IoU);
  a custom model declares it as ``model.task`` (default classification).

A built-in is a module here with ``OPTIONS`` (pydantic classes whose ``name`` is a Literal) and
``build(spec, **fields)``, plus a line in ``_MODULES``. ``model: {target: "mypkg.nets:build",
...}`` names a factory by import path instead, or a library's constructor
(``torchvision.models:resnet18``), which takes the keyword arguments alone (``models/custom.py``).
"""
from __future__ import annotations

import importlib

from torch import nn

from suite.data import DataSpec
from suite.common.errors import SuiteError
from suite.models import hf

_MODULES = ["mlp", "cnn", "vgg", "resnet", "mobilenet", "autoencoder", "transformer", "llama", "unet", "segnet", "nbow", "seq2seq", "custom"]
MODELS = {}
for _m in _MODULES:
    _mod = importlib.import_module(f"suite.models.{_m}")
    for _opts in _mod.OPTIONS:
        MODELS[_opts.model_fields["name"].default] = (_opts, _mod.build)


def build(options, spec: DataSpec):
    """Build the model the recipe names for data of the given spec."""
    check_fits(options, spec)
    args = (spec,) if options.calls_with_spec() else ()  # a library's constructor takes no spec
    model = options.factory()(*args, **options.factory_kwargs())
    if not isinstance(model, nn.Module):
        raise SuiteError(f"{source(options)} returns {type(model).__name__}, not an nn.Module; "
                         f"return the model (an nn.Sequential of blocks if it is to be split)")
    if hf.is_hf(model):  # a transformers model: its forward returns the logits (suite.models.hf)
        model = hf.adapt(model)
    given = getattr(options, "tp_plan", None)
    if given:  # the recipe's tensor-parallel plan (model.tp_plan), read by strategy tensor
        model.suite_tp_plan = dict(given)
    return model


def units(model: nn.Module) -> list[nn.Module]:
    """The blocks FSDP shards one by one and activation checkpointing recomputes: an HF model's own
    transformer blocks (``suite.models.hf.units``), else the top-level children with parameters."""
    return hf.units(model) or [b for b in model.children() if any(True for _ in b.parameters())]


def source(options) -> str:
    """Where a model comes from, for messages: ``model.name=mlp`` or ``model.target=mypkg.nets:build``."""
    target = getattr(options, "target", None)
    return f"model.target={target}" if target else f"model.name={options.name}"


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
