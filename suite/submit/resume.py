"""What ``python -m suite.submit --resume RUN [strategy.*=... launch.*=...]`` may change, checked
before anything launches.

A resumed run continues the run's numbers, so everything that decides them stays: the model,
data, optimizer and training sections (global batch, seed, lr schedule, precision, steps). The
strategy and the launch (world size, executor, ...) may change where the last checkpoint can be
taken over (``suite.train.checkpoint``): one in the neutral format by any strategy that declares
``no_neutral_checkpoint = ""``; one in the per-rank format only by its own strategy, options and
world size. Anything else is refused in one line naming why.
"""
from __future__ import annotations

from suite.common.errors import SuiteError
from suite.strategies import STRATEGIES

CHANGEABLE = ("strategy.", "launch.")


def check_overrides(run: str, overrides: list[str]) -> None:
    """Refuse an override outside strategy.* and launch.*."""
    for item in overrides:
        key = item.partition("=")[0].strip()
        if not key.startswith(CHANGEABLE):
            section = key.split(".")[0]
            raise SuiteError(
                f"--resume {run} {item}: a resumed run keeps its {section} section as recorded (the model, data, "
                f"optimizer and training sections decide its numbers: global batch, seed, lr schedule); only "
                f"strategy.* and launch.* may change. To change {key}, start a new run from the recipe")


def convertible() -> list[str]:
    """The strategies whose checkpoints are neutral, at their defaults or, failing that, at the
    first variant of their search space that is (e.g. ``zero (stage=3)``)."""
    out = []
    for name, module in sorted(STRATEGIES.items()):
        space = module.Options.search_space
        variants = [{"name": name}] + (list(space(2)) if space else [])
        for variant in variants:
            if not module.Options(**variant).no_neutral_checkpoint:
                keys = ", ".join(f"{k}={v}" for k, v in variant.items() if k != "name")
                out.append(f"{name} ({keys})" if keys else name)
                break
    return out


def check_conversion(run: str, before, after, saved: dict | None) -> None:
    """Refuse a change of strategy or world size that the run's last checkpoint (``saved``, its
    ``latest.json``; None: none yet, the run starts over) cannot follow."""
    moved = (before.strategy.model_dump(mode="json") != after.strategy.model_dump(mode="json")
             or before.world_size != after.world_size)
    if saved is None or not moved:
        return
    was = f"strategy {before.strategy.name} at world size {before.world_size}"
    now = f"strategy {after.strategy.name} at world size {after.world_size}"
    if saved.get("format", "rank") != "neutral":
        reason = before.strategy.no_neutral_checkpoint or "it was saved before checkpoints were strategy-neutral"
        raise SuiteError(f"--resume {run}: the checkpoint at step {saved['step']} was saved by {was} in its own "
                         f"per-rank format ({reason}); it resumes only as it was, not as {now}: drop the "
                         f"strategy/launch overrides")
    if after.strategy.no_neutral_checkpoint:
        raise SuiteError(f"--resume {run}: {now} cannot take over the checkpoint of {was}: strategy "
                         f"{after.strategy.name} {after.strategy.no_neutral_checkpoint}; resume as one of "
                         f"{', '.join(convertible())}")
