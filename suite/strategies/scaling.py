"""Loss scaling for ``training.precision: fp16`` (torch's ``GradScaler``).

fp16 autocast computes the backward pass in float16, whose smallest normal number is 6e-5: small
gradients underflow to zero unless the loss is multiplied first. So every strategy that trains
through ``ModuleEngine``'s step scales: the loss is multiplied by the scale before backward, the
gradients are divided by it after the reduction (``unscale_``, before the clip, so the clip sees
true norms), and a step whose gradients hold an inf or NaN is skipped (the parameters and the
optimizer state stay as they were) and the scale halved; after 2000 clean steps it doubles.
Strategies whose steps do not pass through it refuse fp16 naming bf16 (their ``refuses``).

Where the gradients are sharded, every rank must agree on skipping:
- replicas (ddp, allreduce, ...): after the reduction every rank holds the same gradients, so
  each finds the same inf;
- DTensor gradients (fsdp): torch's DTensor dispatch reduces the found-inf flag of
  ``_amp_foreach_non_finite_check_and_unscale_`` over the mesh, so the plain scaler serves FSDP2;
- FSDP1's flat shards are plain tensors: its own ``ShardedGradScaler`` all-reduces the flag.

Under bf16, fp32 and fp64 the scaler is disabled: ``scale`` returns the loss itself and nothing
else runs. Under fp16 a step costs two host reads of the scale (whether it was skipped).
"""
from __future__ import annotations

import torch

from suite.strategies.keys import Refused

FP16_ONLY = "fp16"


def make_scaler(precision: str, device: torch.device, sharded: bool = False):
    """An enabled scaler under fp16, a disabled one otherwise; ``sharded``: FSDP1's."""
    enabled = precision == FP16_ONLY
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type, enabled=enabled)
    return torch.amp.GradScaler(device.type, enabled=enabled)


class LossScaling:
    """One engine's scaler and what it did: the steps it skipped and the scale now."""

    def __init__(self, precision: str, device: torch.device, sharded: bool = False):
        self.scaler = make_scaler(precision, device, sharded)
        self.enabled = self.scaler.is_enabled()
        self.skipped_steps = 0

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.enabled else loss

    def unscale_(self, optimizer) -> None:
        """Divide the gradients by the scale (once per step, before clipping)."""
        self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> bool:
        """The optimizer's step, or none where a gradient is inf/NaN; whether it stepped."""
        if not self.enabled:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        stepped = self.scaler.get_scale() >= before  # update() lowers the scale only after an inf
        self.skipped_steps += not stepped
        return stepped

    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.enabled else None

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps} if self.enabled else {}

    def load_state_dict(self, state: dict) -> None:
        if self.enabled and state:
            self.scaler.load_state_dict(state["scaler"])
            self.skipped_steps = state["skipped_steps"]


def refused(why: str):
    """The ``Refused`` entry of a strategy whose steps do not pass through the scaler."""
    return Refused("training.precision", ("bf16", "fp32", "fp64"),
                   f"fp16 needs loss scaling, and {why}; bf16 needs none")
