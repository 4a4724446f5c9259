"""The advisor's search: every configuration worth trying on a cluster of ``nodes`` x ``per_node``
ranks, each validated, profiled and timed, ranked by predicted throughput (samples per second:
at the recipe's global batch, the order of step time).

Candidates. Every strategy, with each variant its own rules offer at that world size (its
``search_space``: data x tensor x pipeline degrees, HSDP replicas, micro-batches, ZeRO stages;
``suite.strategies.costs``), the recipe's own strategy as written first. Each is tried at the
recipe's global batch (``training.batch_size``; or ``weak_scaling``: the recipe's per-rank batch
kept, so the global batch grows with the data-parallel degree) and, where it does not fit in a
rank's memory, with activation checkpointing and then with gradient accumulation (micro-batch
size against accumulation steps, the smallest accumulation that fits), since both cost time.

Each candidate is validated as a recipe at that launch (``launch.nodes``, ``tasks_per_node``:
the strategy's own checks refuse what cannot run there, e.g. hogwild beyond one node, a tensor
degree that does not divide the heads), sized by the analytic rule (``suite.planner.analytic``;
the bare model's step counted once per batch) and timed (``suite.planner.timing``). The best
ones are then profiled again by a fake run of their real code (``suite.planner.fake_run``, in
forked children) where the strategy allows it: it counts what the analytic rule leaves out
(tensor parallelism's all-reduces inside the layers). What does not fit or cannot run is kept
with its reason.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from suite.common.errors import SuiteError
from suite.planner.profile import StepProfile

REFINED = 12  # the best candidates (by the analytic rule) that a fake run profiles again


@dataclass
class Candidate:
    label: str  # "fsdp:replicate=2", as suite.plan names strategies
    section: dict  # the strategy section
    checkpointing: bool = False
    accumulation: int = 1
    batch_size: int = 0
    overrides: list[str] = field(default_factory=list)  # what a user adds to the recipe to run it
    recipe: object = None
    profile: Optional[StepProfile] = None
    time: dict = field(default_factory=dict)  # timing.predict_step_time's result
    excluded: str = ""

    @property
    def step_s(self) -> float:
        return self.time.get("step_s", float("inf"))

    @property
    def name(self) -> str:
        extra = (["activation checkpointing"] if self.checkpointing else []) + (
            [f"{self.accumulation} accumulation steps"] if self.accumulation > 1 else [])
        return self.label + (f" ({', '.join(extra)})" if extra else "")


def strategy_sections(raw_strategy: dict, world: int) -> list[tuple[str, dict]]:
    """(label, section) of every strategy variant to try: the recipe's own first."""
    from suite.strategies import STRATEGIES, costs

    out = [(_label(raw_strategy), dict(raw_strategy))] if raw_strategy.get("name") else []
    for name, module in STRATEGIES.items():
        costs.require(module.Options)
        variants = module.Options.search_space(world) or [{"name": name}]
        out += [(_label(v), v) for v in variants]
    seen, unique = set(), []
    for label, section in out:
        if label not in seen:
            seen.add(label)
            unique.append((label, section))
    return unique


def _label(section: dict) -> str:
    keys = [f"{k}={v}" for k, v in section.items() if k != "name"]
    return ":".join([section["name"], *keys])  # as --strategies takes it: zero:stage=3:offload=cpu


def _overrides(section: dict, checkpointing: bool, accumulation: int, batch_size: int, raw: dict) -> list[str]:
    out = [f"strategy.name={section['name']}"] + [f"strategy.{k}={_text(v)}" for k, v in section.items() if k != "name"]
    if checkpointing:
        out.append("training.activation_checkpointing=true")
    if accumulation > 1:
        out.append(f"training.grad_accumulation={accumulation}")
    if batch_size != (raw.get("training") or {}).get("batch_size"):
        out.append(f"training.batch_size={batch_size}")
    return out


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _validate(raw: dict, section: dict, launch: dict, training: dict):
    from suite import recipe as recipes

    return recipes.validate({**raw, "strategy": section, "launch": {**(raw.get("launch") or {}), **launch},
                             "training": {**(raw.get("training") or {}), **training}})


def _batch(raw: dict, section: dict, launch: dict, weak_scaling: bool, per_rank: int) -> int:
    """The global batch of this candidate: the recipe's, or (weak scaling) its per-rank batch
    times the candidate's data-parallel degree."""
    batch = int((raw.get("training") or {}).get("batch_size", 1))
    if not weak_scaling:
        return batch
    world = launch["nodes"] * launch["tasks_per_node"]
    # The data-parallel degree does not depend on the batch: validate at a batch every degree divides.
    recipe = _validate(raw, section, launch, {"batch_size": per_rank * world, "grad_accumulation": 1})
    return per_rank * recipe.layout().dp_size


def search(raw: dict, nodes: int, per_node: int, calibration: dict, memory_bytes: int,
           weak_scaling: bool = False, strategies: Optional[list[tuple[str, dict]]] = None,
           refine: int = REFINED, progress=print, device: str | None = None) -> list[Candidate]:
    """Every candidate (module doc), ranked: the fitting ones by predicted samples per second, then those
    that do not fit or cannot run, each with its reason."""
    world = nodes * per_node
    launch = {"executor": "slurm" if nodes > 1 else (raw.get("launch") or {}).get("executor", "local"),
              "nodes": nodes, "tasks_per_node": per_node}
    if device:
        launch["device"] = device
    recipe_world = _recipe_world(raw)
    per_rank = max(1, int((raw.get("training") or {}).get("batch_size", 1)) // recipe_world)
    sections = strategies if strategies is not None else strategy_sections(raw.get("strategy") or {}, world)
    steps: dict[tuple, dict] = {}
    started, out = time.monotonic(), []
    for i, (label, section) in enumerate(sections, 1):
        if strategies is None and (why := _left_out(section)):
            out.append(Candidate(label, section, excluded=why))
            continue
        candidate = _first_fit(raw, label, section, launch, weak_scaling, per_rank, calibration, memory_bytes, steps)
        out.append(candidate)
        if i % 10 == 0 or i == len(sections):
            progress(f"[{i}/{len(sections)}] candidates sized ({time.monotonic() - started:.0f} s)")
    _time_all([c for c in out if not c.excluded], calibration, progress)
    _refine(out, calibration, refine, progress)
    return rank(out)


def _left_out(section: dict) -> str:
    """Why the strategy's predicted step time does not compare with the others', or "": it is
    asynchronous (its ``no_parity``: it does not train what the others train), or it brings its
    own training loop (``owns_training``: TensorFlow's), whose step the time model cannot time."""
    from suite.strategies import STRATEGIES

    options = STRATEGIES[section["name"]].Options
    if options.no_parity:
        return (f"asynchronous ({options.no_parity}): it does not train what the others train, so a step time "
                f"does not compare; rank it by time to accuracy, or name it with --strategies to see its step time")
    if options.owns_training:
        return ("brings its own training loop (TensorFlow's, on the model's Keras twin): its step is not timed, "
                "the torch model's stands in for it, so its predicted time does not compare; name it with "
                "--strategies to see that estimate")
    return ""


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Fitting first, by predicted samples per second (at the recipe's global batch the same order
    as step time; under weak scaling the global batches differ, and throughput compares them)."""
    return sorted(candidates, key=lambda c: (bool(c.excluded), -(c.time.get("samples_per_s") or 0), c.step_s, c.label))


def _recipe_world(raw: dict) -> int:
    launch = raw.get("launch") or {}
    return max(1, int(launch.get("nodes", 1)) * int(launch.get("tasks_per_node", 1)))


def _first_fit(raw, label, section, launch, weak_scaling, per_rank, calibration, memory_bytes, steps) -> Candidate:
    """The candidate as written; where it does not fit, with activation checkpointing, then with
    the fewest accumulation steps that make it fit."""
    try:
        batch = _batch(raw, section, launch, weak_scaling, per_rank)
    except SuiteError as e:
        return Candidate(label, section, excluded=str(e))
    tries = [(False, 1), (True, 1)] + [(True, a) for a in (2, 4, 8, 16, 32, 64) if a <= batch]
    last = None
    for checkpointing, accumulation in tries:
        c = Candidate(label, section, checkpointing, accumulation, batch,
                      _overrides(section, checkpointing, accumulation, batch, raw))
        try:
            c.recipe = _validate(raw, section, launch, {"batch_size": batch, "grad_accumulation": accumulation,
                                                        "activation_checkpointing": checkpointing})
            _size(c, calibration, steps)
        except SuiteError as e:
            c.excluded = str(e)
            return c if last is None else last  # more accumulation will not help a refused layout
        if c.profile.peak_bytes <= memory_bytes:
            return c
        c.excluded = (f"does not fit: {c.profile.peak_bytes / 2**30:.2f} GiB per rank at its peak, "
                      f"{memory_bytes / 2**30:.2f} GiB available")
        last = c
    return last


def _size(c: Candidate, calibration: dict, steps: dict) -> None:
    """The analytic profile of ``c`` (``steps``: the bare model's step by batch, counted once);
    ``_time_all`` times it."""
    from suite.planner import analytic

    recipe = c.recipe
    layout = recipe.layout()
    key = (layout.accumulation_batch, recipe.training.activation_checkpointing)
    if key not in steps:
        steps[key] = analytic.model_step(recipe)
    c.profile = analytic.profile(recipe, recipe.world_size, "the advisor's search", step=steps[key])


def _time_all(candidates: list[Candidate], calibration: dict, progress) -> None:
    """Time the candidates that fit: their models' and strategies' one-rank steps first, all in
    as few fresh processes as they allow (``model_rate.time_all``), then each prediction; one
    its time model refuses is excluded with the reason."""
    from suite.planner import model_rate

    jobs = [job for c in candidates for job in model_rate.rate_jobs(calibration, c.recipe, c.recipe.launch.tasks_per_node)]
    if jobs:
        started = time.monotonic()
        model_rate.time_all(jobs)
        progress(f"the models' and strategies' steps timed as one rank ({time.monotonic() - started:.0f} s)")
    for c in candidates:
        try:
            _time(c, calibration)
        except SuiteError as e:
            c.excluded = str(e)


def _time(c: Candidate, calibration: dict) -> None:
    from suite.planner import model_rate, timing

    options = timing.options_of(c.recipe)
    options["ranks_per_node"] = c.recipe.launch.tasks_per_node
    calibration = model_rate.with_model_rate(calibration, c.recipe, options["model"], options["ranks_per_node"])
    c.time = timing.predict_step_time(c.profile, calibration, options)


def _refine(candidates: list[Candidate], calibration: dict, count: int, progress) -> None:
    """Profile the best ``count`` fitting candidates again by a fake run of their real code, two
    at a time, where their strategy allows it; keep the analytic profile where it fails."""
    from suite.planner import fake_run

    best = [c for c in rank(candidates) if not c.excluded and c.recipe.strategy.cannot_fake == ""][:count]
    if not best:
        return
    fake_run.warm()
    start = lambda c: fake_run.Job(c.recipe, c.recipe.world_size, 120, quiet=True)  # noqa: E731
    for done, (c, _, (status, payload)) in enumerate(fake_run.run_all(best, start), 1):
        if status == "ok":
            c.profile = payload
            _time(c, calibration)
        progress(f"[{done}/{len(best)}] fake run of {c.name}: {'ok' if status == 'ok' else payload}")
