"""FLOPs of one training step, counted once.

``train_step_flops(recipe)`` builds the recipe's model on the meta device (no memory, no
data), runs one forward and backward pass over a global batch under
``torch.utils.flop_counter.FlopCounterMode`` and returns the count. It is the model's
arithmetic, independent of how a strategy splits it: the optimizer update and the strategy's
communication are not counted, nor recomputation (activation checkpointing would add work
that is not counted either, which is the usual MFU convention).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.utils.flop_counter import FlopCounterMode

from suite.compat import torch as torch_compat
from suite.models import build as build_model
from suite.models.empty import as_fake, on_meta


def train_step_flops(recipe) -> int | None:
    """FLOPs of forward + backward over one global batch of the unwrapped model, or None
    (with the reason printed) for a model the counter cannot run on the meta device."""
    spec = recipe.data.spec()
    batch = recipe.training.batch_size
    dtype = getattr(torch, spec.input_dtype)
    try:
        with torch.random.fork_rng(devices=[]):
            try:
                return _count(on_meta(lambda: build_model(recipe.model, spec)), batch, spec, dtype, torch.device("meta"))
            except RuntimeError as e:
                if "meta" not in str(e):
                    raise
            # A forward that reads a value (Hugging Face's masks test theirs): fake tensors, which
            # such code knows to skip, on the CPU.
            with torch_compat.fake_tensor_mode(allow_non_fake_inputs=True) as mode:
                model = as_fake(lambda: build_model(recipe.model, spec), mode, torch_compat.unset_fake_temporarily)
                return _count(model, batch, spec, dtype, nullcontext())
    except Exception as e:  # noqa: BLE001 - counting is a measurement, never a reason to fail
        print(f"FLOPs per step not counted for model {recipe.model.name}: {type(e).__name__}: {e}", flush=True)
        return None


def _count(model, batch: int, spec, dtype, where) -> int:
    with where:
        inputs = torch.zeros(batch, *spec.input_shape, dtype=dtype)  # values do not matter
        counter = FlopCounterMode(display=False)
        with counter:
            # The loss reduction is negligible next to the model; a sum stands in for it.
            model(inputs).float().sum().backward()
    return int(counter.get_total_flops())
