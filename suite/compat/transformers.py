"""Hugging Face ``transformers`` internals the suite reads to train its models as they are
(``suite.models.hf``). Every access was checked on transformers 5.17.0 (the pin in pyproject.toml's
``hf`` extra; ``suite.compat.CHECKED``); docs/compat.md says what each is for.

Nothing here imports transformers unless the model in hand is one of its models (``is_model``
looks the class up by its module name), so the suite runs without the library installed.
"""
from __future__ import annotations

import sys

from suite.compat import require_attr

LIB = "transformers"


def _library():
    return sys.modules.get("transformers")


def is_model(module) -> bool:
    """Whether ``module`` is a transformers ``PreTrainedModel`` (any architecture). Only true where
    the library is already imported: a model of it cannot exist otherwise."""
    lib = _library()
    return lib is not None and isinstance(module, lib.PreTrainedModel)


def no_split_classes(model) -> tuple[str, ...]:
    """The class names of the model's transformer blocks (``_no_split_modules``: what accelerate
    keeps on one device, the unit FSDP wraps and activation checkpointing recomputes)."""
    return tuple(require_attr(model, "_no_split_modules", lib=LIB, what="the model's block classes") or ())


def tensor_parallel_plan(model) -> dict[str, str]:
    """The tensor-parallel plan the model publishes, as ``{module path (with * for any index):
    style}`` from the model's root: its config's ``base_model_tp_plan`` under the base model's
    prefix, and the head's own ``_tp_plan`` (``lm_head: colwise_gather_output``). Empty when the
    architecture publishes none (GPT-2)."""
    config = model.config
    base = dict(require_attr(config, "base_model_tp_plan", lib=LIB, what="the config's tensor-parallel plan") or {})
    prefix = require_attr(model, "base_model_prefix", lib=LIB, what="where the base model sits")
    plan = {}
    if base:
        inner = prefix if prefix and hasattr(model, prefix) and getattr(model, prefix) is not model else ""
        plan.update({f"{inner}.{path}" if inner else path: style for path, style in base.items()})
        plan.update(dict(require_attr(model, "_tp_plan", lib=LIB, what="the head's tensor-parallel plan") or {}))
    return plan


def tied_weights(model) -> dict[str, str]:
    """``{tied parameter name: the parameter it shares}`` when the model ties them
    (``tie_word_embeddings``), else {}."""
    keys = require_attr(model, "_tied_weights_keys", lib=LIB, what="which parameters share storage") or {}
    config = model.config
    if not getattr(config, "tie_word_embeddings", False):
        return {}
    return dict(keys) if isinstance(keys, dict) else {}


def enable_gradient_checkpointing(model) -> None:
    """HF's own switch, non-reentrant (reentrant checkpointing runs backward outside autograd's
    graph, which DDP's hooks miss; ``suite.strategies.prepare`` says more)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def loss_function(model):
    """The model's own loss (``model.loss_function``: what its ``.loss`` is computed with when
    labels are given), and its name (``config.loss_type`` or the class's default)."""
    fn = require_attr(model, "loss_function", lib=LIB, what="the loss its forward computes with labels")
    name = getattr(model.config, "loss_type", None) or getattr(fn, "__name__", type(fn).__name__)
    return fn, name
