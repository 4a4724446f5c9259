"""FLOPs of one training step, counted once.

``train_step_flops(recipe)`` builds the recipe's model on the meta device (no memory, no
data), runs one forward and backward pass over a global batch under
``torch.utils.flop_counter.FlopCounterMode`` and returns the count. It is the model's
arithmetic, independent of how a strategy splits it: the optimizer update and the strategy's
communication are not counted, nor recomputation (activation checkpointing would add work
that is not counted either, which is the usual MFU convention).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from suite.models import build as build_model
from suite.models.empty import on_meta


def train_step_flops(recipe) -> int | None:
    """FLOPs of forward + backward over one global batch of the unwrapped model, or None
    (with the reason printed) for a model the counter cannot run on the meta device."""
    spec = recipe.data.spec()
    batch = recipe.training.batch_size
    dtype = getattr(torch, spec.input_dtype)
    try:
        with torch.random.fork_rng(devices=[]):
            model = on_meta(lambda: build_model(recipe.model, spec))
            with torch.device("meta"):
                inputs = torch.zeros(batch, *spec.input_shape, dtype=dtype)  # values do not matter
                counter = FlopCounterMode(display=False)
                with counter:
                    # The loss reduction is negligible next to the model; a sum stands in for it.
                    model(inputs).float().sum().backward()
        return int(counter.get_total_flops())
    except Exception as e:  # noqa: BLE001 - counting is a measurement, never a reason to fail
        print(f"FLOPs per step not counted for model {recipe.model.name}: {type(e).__name__}: {e}", flush=True)
        return None
