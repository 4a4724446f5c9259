"""Learning-rate schedules (recipe ``optimizer.schedule``): the lr of every optimizer step as a
closed-form function of the step number, so that every strategy, and a resumed run, uses exactly
the same lr at the same step.

- ``constant``: ``optimizer.lr`` throughout.
- ``step``: ``lr x gamma^k``, where k counts the decays passed: one every ``step_size_epochs``
  epochs (or ``step_size_steps`` steps), or one at each of ``milestones_epochs`` (or
  ``milestones_steps``), as in the ResNet and large-batch SGD studies (x0.1 at epochs 30, 60, 80).
  Counted from the run's first step, warm-up included.
- ``cosine``: from ``lr`` right after the warm-up down to ``min_lr`` at the run's last step,
  half a cosine wave (SGDR without restarts).
- ``warmup_steps`` W (any schedule): steps 0..W-1 take the schedule's lr x (step + 1) / W, a
  linear ramp reaching the full value at step W-1 (Goyal et al.'s gradual warm-up).

Steps count optimizer steps from 0; an epoch is ``steps_per_epoch`` optimizer steps (the training
loader's batches), and the run's last step is ``total_steps`` - 1. Torch-free: the submitting side
validates recipes with it. The training loop (``suite.train.loop``) sets the lr before each step.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from suite.common.errors import SuiteError

# Keys that decide when a step schedule decays: exactly one is set.
_WHEN = ("step_size_epochs", "step_size_steps", "milestones_epochs", "milestones_steps")
# Which schedule each optional key belongs to.
_OWNER = {**{k: "step" for k in _WHEN}, "gamma": "step", "min_lr": "cosine"}


class Schedule(BaseModel):
    """Recipe ``optimizer.schedule``; see the module docstring for the formulas."""
    model_config = ConfigDict(extra="forbid")
    name: Literal["constant", "step", "cosine"] = "constant"
    warmup_steps: NonNegativeInt = 0
    step_size_epochs: Optional[PositiveInt] = None
    step_size_steps: Optional[PositiveInt] = None
    milestones_epochs: Optional[list[PositiveInt]] = None
    milestones_steps: Optional[list[PositiveInt]] = None
    gamma: Optional[Annotated[float, Field(gt=0, le=1)]] = None  # step: factor per decay (default 0.1)
    min_lr: Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]] = None  # cosine: the lr at the last step (default 0)

    def check(self, lr: float) -> None:
        """Keys that do not belong together: SuiteError naming the key and the fix."""
        for key, owner in _OWNER.items():
            value = getattr(self, key)
            if value is not None and owner != self.name:
                raise SuiteError(f"optimizer.schedule.{key}={value} applies to schedule {owner} only, but "
                                 f"optimizer.schedule.name={self.name}; drop it or set name: {owner}")
        if self.name == "step":
            given = [k for k in _WHEN if getattr(self, k) is not None]
            if len(given) != 1:
                got = " and ".join(given) if given else "none of them"
                raise SuiteError(f"optimizer.schedule.name=step needs exactly one of {', '.join(_WHEN)} (when "
                                 f"to decay), but the recipe sets {got}")
            milestones = getattr(self, given[0])
            if given[0].startswith("milestones") and sorted(set(milestones)) != milestones:
                raise SuiteError(f"optimizer.schedule.{given[0]}={milestones} must be increasing, without "
                                 f"repeats, e.g. [30, 60, 80]")
        if self.name == "cosine" and (self.min_lr or 0.0) >= lr:
            raise SuiteError(f"optimizer.schedule.min_lr={self.min_lr} must be below optimizer.lr={lr}: the "
                             f"cosine schedule decays from lr to min_lr")

    def rate(self, lr: float, steps_per_epoch: int, total_steps: int):
        """step -> lr for a run of ``total_steps`` steps of which ``steps_per_epoch`` make an epoch."""
        return lambda step: lr_at(self, lr, step, steps_per_epoch, total_steps)


def lr_at(s: Schedule, lr: float, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """The lr of optimizer step ``step`` (from 0)."""
    if s.name == "step":
        epochs = s.step_size_epochs is not None or s.milestones_epochs is not None
        t = step // steps_per_epoch if epochs else step
        size = s.step_size_epochs or s.step_size_steps
        decays = t // size if size else sum(t >= m for m in (s.milestones_epochs or s.milestones_steps))
        value = lr * (0.1 if s.gamma is None else s.gamma) ** decays
    elif s.name == "cosine":
        low = s.min_lr or 0.0
        progress = min(1.0, max(0.0, (step - s.warmup_steps) / max(1, total_steps - 1 - s.warmup_steps)))
        value = low + (lr - low) * (1 + math.cos(math.pi * progress)) / 2
    else:
        value = lr
    if step < s.warmup_steps:
        value *= (step + 1) / s.warmup_steps
    return value
