"""A model built without its weights' memory: on the meta device (shapes only), or as fake tensors
in the planner's fake run.

The quick way, building under ``torch.device("meta")`` (or a ``FakeTensorMode``), makes every
tensor the constructor creates a tensor without values. A constructor that computes with tensors
then fails: torchvision's RegNet sizes its blocks with ``torch.arange(...).tolist()``, and timm's
models spread their drop-path rates with ``torch.linspace(...).item()`` ("Cannot copy out of meta
tensor"). Then the model is built again with the constructor's arithmetic on real tensors, and
each parameter and buffer turned into one without values as the module registers it
(``weights_as``; the same trick as Accelerate's ``init_empty_weights``): one layer's weights exist
at a time, uninitialised, and the initialisation that follows runs on the empty ones, for nothing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch
from torch import nn


@contextmanager
def weights_as(convert: Callable[[torch.Tensor], torch.Tensor]):
    """Every parameter and buffer a module registers inside, replaced by ``convert`` of it."""
    register_parameter, register_buffer = nn.Module.register_parameter, nn.Module.register_buffer

    def parameter(module, name, param):
        if param is not None and type(param) is nn.Parameter:  # not a lazy module's placeholder
            param = nn.Parameter(convert(param.data), requires_grad=param.requires_grad)
        register_parameter(module, name, param)

    def buffer(module, name, tensor, persistent=True):
        register_buffer(module, name, None if tensor is None else convert(tensor), persistent)

    nn.Module.register_parameter, nn.Module.register_buffer = parameter, buffer
    try:
        yield
    finally:
        nn.Module.register_parameter, nn.Module.register_buffer = register_parameter, register_buffer


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with its parameters and buffers on the meta device (see the module doc)."""
    try:
        with torch.device("meta"):
            return build()
    except (NotImplementedError, RuntimeError) as e:
        if "meta" not in str(e):
            raise
    with weights_as(lambda t: t.to("meta")):
        return build()


def as_fake(build: Callable[[], nn.Module], mode, real_values) -> nn.Module:
    """``build()`` under the fake tensor ``mode``; where the constructor needs real values, built
    again outside it (``real_values``: a context that suspends the mode) with each parameter and
    buffer made a fake tensor of ``mode`` as it is registered."""
    try:
        return build()
    except Exception:  # noqa: BLE001 - a value the fake mode cannot give: build with real arithmetic
        pass
    with real_values(), weights_as(mode.from_tensor):
        return build()
