"""The planner's table: a recipe's model under each strategy asked for at each world size, one
fake step each (``suite.planner.fake_run``; the analytic rule where the real code cannot run on
fake tensors), and the reason the strategy or the layout refuses the rest. ``python -m
suite.plan`` prints it; ``python -m suite.verify --strategies`` reads the same strategy list.

A strategy is a name, optionally with its own keys: ``zero:stage=3``, ``tensor:tp=4``,
``fsdp:reshard_after_forward=false``. The recipe's own strategy keeps its keys. A data-parallel
degree left unset fills the rest of the world (``tensor:tp=4`` at world 64 is dp=16 x tp=4).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import yaml

from suite.common.errors import SuiteError
from suite.planner.profile import StepProfile


@dataclass
class Point:
    label: str  # the strategy as asked for: "zero:stage=3"
    world_size: int
    profile: Optional[StepProfile] = None
    excluded: str = ""  # why the strategy or the layout refuses this world size
    error: str = ""  # the child failed (one line)


def strategy_specs(text: str, recipe_strategy: dict) -> list[tuple[str, dict]]:
    """(label, strategy section) per strategy asked for; SuiteError where one is unknown or
    declares not all of its rules (``suite.strategies.costs``)."""
    from suite.strategies import STRATEGIES, costs

    if text == "all":
        items = list(STRATEGIES)
    else:
        items = [s.strip() for s in text.split(",") if s.strip()]
    specs = []
    for item in items:
        name, *pairs = item.split(":")
        if name not in STRATEGIES:
            raise SuiteError(f"--strategies: {name!r} is not a strategy; choose from {', '.join(STRATEGIES)}")
        costs.require(STRATEGIES[name].Options)  # a strategy without its rules is refused, not given defaults
        section = dict(recipe_strategy) if name == recipe_strategy.get("name") and not pairs else {"name": name}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep:
                raise SuiteError(f"--strategies: {pair!r} in {item!r} must be key=value, e.g. zero:stage=3")
            section[key] = yaml.safe_load(value)
        specs.append((item, section))
    return specs


def _fill_data_degree(section: dict, world_size: int) -> dict:
    """A data-parallel degree the user left unset fills the world the other degrees leave."""
    from pydantic import ValidationError

    from suite.strategies import STRATEGIES

    try:
        options = STRATEGIES[section["name"]].Options(**section)
    except ValidationError:
        return section  # validation says what is wrong, with the recipe key
    axes = options.mesh_axes()
    if any(a.degree is None for a in axes):
        return section
    for axis in axes:
        field = axis.key.split(".")[-1]
        if axis.data and axis.key.startswith("strategy.") and field not in section:
            rest = math.prod(a.degree for a in axes if a is not axis)
            if world_size % rest == 0:
                return {**section, field: world_size // rest}
    return section


def recipe_at(raw: dict, section: dict, world_size: int):
    """The recipe with this strategy at this world size (SuiteError: refused, and why)."""
    from suite import recipe as recipes

    point = {**raw, "strategy": _fill_data_degree(section, world_size)}
    point["launch"] = {**raw.get("launch", {}), "executor": "local", "nodes": 1, "tasks_per_node": world_size}
    return recipes.validate(point)


def plan(raw: dict, specs, worlds, jobs: int = 2, timeout_s: float = 300, try_fake: bool = False,
         progress=print, quiet: bool = False) -> list[Point]:
    """Every (strategy, world size): profiled in forked children, ``jobs`` at a time (``quiet``:
    what the children print is dropped; a failure is reported in one line either way)."""
    from suite.planner import fake_run

    fake_run.warm()
    points, todo = [], []
    for label, section in specs:
        for world in worlds:
            point = Point(label, world)
            points.append(point)
            try:
                todo.append((point, recipe_at(raw, section, world)))
            except SuiteError as e:
                point.excluded = str(e)
    start = lambda item: fake_run.Job(item[1], item[0].world_size, timeout_s, try_fake, quiet)  # noqa: E731
    for done, ((point, _), job, (status, payload)) in enumerate(fake_run.run_all(todo, start, jobs), 1):
        if status == "ok":
            point.profile = payload
            what = f"{payload.source}, peak {_bytes(payload.peak_bytes)}"
        else:
            point.error = payload
            what = f"failed: {payload}"
        progress(f"[{done}/{len(todo)}] {point.label} @ {point.world_size}: {what} ({job.elapsed_s:.1f} s)")
    return points


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
