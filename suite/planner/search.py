"""The advisor's search: every configuration worth trying on a cluster of ``nodes`` x ``per_node``
ranks, each validated, profiled and timed, ranked by predicted throughput (samples per second:
at the recipe's global batch, the order of step time).

Candidates. Every strategy, with each variant its own rules offer at that world size (its
``search_space``: data x tensor x pipeline degrees, HSDP replicas, micro-batches, ZeRO stages;
``suite.strategies.costs``), the recipe's own strategy as written first. Each is tried at the
recipe's global batch (``training.batch_size``; or ``weak_scaling``: the recipe's per-rank batch
kept, so the global batch grows with the data-parallel degree) and, where it does not fit in a
rank's memory, with selective activation checkpointing (torchtitan's: attention's and half the
matmuls' outputs kept), then full, then with gradient accumulation (micro-batch size against
accumulation steps, the smallest accumulation that fits), each costing more time than the last.

Each candidate is validated as a recipe at that launch (``launch.nodes``, ``tasks_per_node``:
the strategy's own checks refuse what cannot run there, e.g. hogwild beyond one node, a tensor
degree that does not divide the heads), sized exactly as ``suite.plan`` sizes it (``Sizer``: a
fake run of its real code in a forked child where the strategy allows it, else its analytic
rule), so the two tools give one memory for one configuration, and the fit is decided on that
figure; then timed (``suite.planner.timing``). (Deciding fits by the analytic rule on the bare
model, which applies neither activation checkpointing nor the precision, and profiling only the
best dozen again without deciding their fit again, gave a Llama-8B under FSDP several times the
plan's memory, and listed as fitting a configuration whose fake run peaked far over it.)

Tensor parallelism stays within a node unless asked (``tensor_across_nodes``): its all-reduces
sit inside every layer, and no practitioner runs them over the link between nodes. What does not
fit or cannot run is kept with its reason.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from suite.common.errors import SuiteError
from suite.planner.profile import StepProfile

FAKE_TIMEOUT_S = 300  # per configuration's fake run, as suite.plan's default


@dataclass
class Candidate:
    label: str  # "fsdp:replicate=2", as suite.plan names strategies
    section: dict  # the strategy section
    checkpointing: bool | str = False  # training.activation_checkpointing: False, "selective" or True
    accumulation: int = 1
    batch_size: int = 0
    overrides: list[str] = field(default_factory=list)  # what a user adds to the recipe to run it
    recipe: object = None
    profile: Optional[StepProfile] = None
    time: dict = field(default_factory=dict)  # timing.predict_step_time's result
    excluded: str = ""
    tries: list = field(default_factory=list, repr=False)  # (checkpointing, accumulation) still to size

    @property
    def step_s(self) -> float:
        return self.time.get("step_s", float("inf"))

    @property
    def name(self) -> str:
        extra = ([checkpointing_words(self.checkpointing)] if self.checkpointing else []) + (
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


def checkpointing_words(checkpointing: bool | str) -> str:
    return "selective activation checkpointing" if checkpointing == "selective" else "activation checkpointing"


def _overrides(section: dict, checkpointing: bool | str, accumulation: int, batch_size: int, raw: dict) -> list[str]:
    out = [f"strategy.name={section['name']}"] + [f"strategy.{k}={_text(v)}" for k, v in section.items() if k != "name"]
    if checkpointing:
        out.append(f"training.activation_checkpointing={_text(checkpointing)}")
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
           progress=print, device: str | None = None, fake: bool = True,
           tensor_across_nodes: bool = False, jobs: int = 2) -> list[Candidate]:
    """Every candidate (module doc), ranked: the fitting ones by predicted samples per second, then those
    that do not fit or cannot run, each with its reason. ``fake``: size each as ``suite.plan`` does
    (False: the analytic rule alone, quicker, for tests of the search's own logic);
    ``tensor_across_nodes``: also try tensor-parallel groups that span nodes."""
    world = nodes * per_node
    launch = {"executor": "slurm" if nodes > 1 else (raw.get("launch") or {}).get("executor", "local"),
              "nodes": nodes, "tasks_per_node": per_node}
    if device:
        launch["device"] = device
    per_rank = max(1, int((raw.get("training") or {}).get("batch_size", 1)) // _recipe_world(raw))
    sections = strategies if strategies is not None else strategy_sections(raw.get("strategy") or {}, world)
    out = []
    for label, section in sections:
        if strategies is None and (why := _left_out(section)):
            out.append(Candidate(label, section, excluded=why))
        else:
            out.append(_start(raw, label, section, launch, weak_scaling, per_rank))
    keep_within = None if tensor_across_nodes else per_node
    fit(out, raw, launch, memory_bytes, Sizer(fake, jobs, progress), keep_within)
    _time_all([c for c in out if not c.excluded], calibration, progress)
    return rank(out)


# Keys the search sets itself, or whose check depends on the world size it varies.
_SEARCHED = {"training": ("grad_accumulation", "balance", "balance_shares"),
             "launch": ("nodes", "tasks_per_node", "devices_per_task", "elastic")}


def check_recipe(raw: dict) -> None:
    """SuiteError, once and before any candidate is tried, for what none of them could run: the
    recipe's own keys and values (a bad ``key=value`` override), checked with the strategy and
    launch the search varies set to one process of ``single``, and the keys the search sets
    itself left out. Else each candidate would be refused for it in turn."""
    from suite import recipe as recipes

    probe = {**raw, "strategy": {"name": "single"}}
    for section, keys in _SEARCHED.items():
        probe[section] = {k: v for k, v in (raw.get(section) or {}).items() if k not in keys}
    recipes.validate(probe)


def one_device(raw: dict, memory_bytes: int, device: str | None = None, fake: bool = True,
               progress=print) -> Optional[Candidate]:
    """The recipe's model on one device (``single``) at its global batch, checkpointing and then
    accumulating where it must, sized as every candidate is: the candidate where it fits, else
    None. Not tried where what a single rank holds (parameters, gradients, optimizer state)
    already exceeds the memory."""
    from suite.planner.memory import predicted_held_bytes

    launch = {**({"device": device} if device else {}), "executor": "local", "nodes": 1, "tasks_per_node": 1}
    c = _start(raw, "single", {"name": "single"}, launch, False, 1)
    if c.excluded:
        return None
    held = predicted_held_bytes(_validate(raw, c.section, launch, {"grad_accumulation": 1}))["per_rank"]
    if sum(held.values()) > memory_bytes:
        return None
    fit([c], raw, launch, memory_bytes, Sizer(fake, 1, progress), None)
    return None if c.excluded or c.profile is None else c


def _start(raw, label, section, launch, weak_scaling, per_rank) -> Candidate:
    """The candidate before it is sized: its global batch and the tries ``fit`` walks through
    (as written, selectively then fully checkpointed, then accumulating), or the reason its
    batch is refused."""
    try:
        batch = _batch(raw, section, launch, weak_scaling, per_rank)
    except SuiteError as e:
        return Candidate(label, section, excluded=str(e))
    levels = [False, "selective", True]  # activation checkpointing, from none to every block
    own = (raw.get("training") or {}).get("activation_checkpointing", False)
    tries = [(level, 1) for level in levels[levels.index(own) if own in levels else 0:]]  # as written, then more
    tries += [(True, a) for a in (2, 4, 8, 16, 32, 64) if a <= batch]
    return Candidate(label, section, batch_size=batch, tries=tries)


def fit(candidates: list[Candidate], raw: dict, launch: dict, memory_bytes: int, sizer: "Sizer",
        within_node: Optional[int]) -> None:
    """Each candidate as written; where it does not fit, with selective then full activation
    checkpointing, then with the fewest accumulation steps that make it fit: round by round, each round's tries sized
    together. A try the recipe check refuses ends its candidate (more accumulation will not help a
    refused layout) with that reason, or the last try's "does not fit". ``within_node``: ranks per
    node, where a layout whose node-local axes (``StrategyOptions.within_node_axes``) would span
    nodes is left out."""
    trying = [c for c in candidates if c.tries and not c.excluded]
    while trying:
        sized = []
        for c in trying:
            checkpointing, accumulation = c.tries.pop(0)
            try:
                recipe = _validate(raw, c.section, launch, {"batch_size": c.batch_size, "grad_accumulation": accumulation,
                                                            "activation_checkpointing": checkpointing})
                why = _spans_nodes(recipe, within_node) if within_node else ""
            except SuiteError as e:
                why = str(e)
            if why:
                c.excluded = c.excluded if c.recipe is not None else why
                c.tries = []
                continue
            c.checkpointing, c.accumulation, c.recipe = checkpointing, accumulation, recipe
            c.overrides = _overrides(c.section, checkpointing, accumulation, c.batch_size, raw)
            sized.append(c)
        sizer.size(sized)
        for c in sized:
            fits = c.profile.fit_bytes <= memory_bytes
            what = "reserved" if c.profile.reserved_bytes is not None else "at its peak"
            c.excluded = "" if fits else (f"does not fit: {c.profile.fit_bytes / 2**30:.2f} GiB per rank {what}, "
                                          f"{memory_bytes / 2**30:.2f} GiB available")
            if fits:
                c.tries = []
        trying = [c for c in sized if c.tries]


def _spans_nodes(recipe, per_node: int) -> str:
    """Why this layout is left out: a mesh axis its strategy keeps within a node (tensor
    parallelism's, whose all-reduces sit inside every layer) would have groups crossing nodes."""
    layout = recipe.layout()
    for axis in recipe.strategy.within_node_axes:
        degree = layout.degree(axis)
        if degree > 1 and per_node % degree:
            return (f"its {axis}-parallel groups of {degree} ranks would span nodes of {per_node} ranks, and their "
                    f"collectives inside every layer would cross the link between nodes; left out unless asked "
                    f"(--tensor-across-nodes)")
    return ""


class Sizer:
    """A try's StepProfile, as ``suite.plan`` sizes that configuration: one fake step of the real
    code in a forked child where the strategy allows it, else the strategy's analytic rule
    (``fake_run.plan_point``, ``jobs`` at a time), so that the advisor and the planner give one
    answer for one configuration. ``fake=False``: the analytic rule alone (the bare model's step
    counted once per batch)."""

    def __init__(self, fake: bool = True, jobs: int = 2, progress=print):
        self.fake, self.jobs, self.progress = fake, jobs, progress
        self.steps: dict[tuple, dict] = {}
        self.rounds = 0

    def size(self, candidates: list[Candidate]) -> None:
        if not candidates:
            return
        started = time.monotonic()
        self.rounds += 1
        if not self.fake:
            for c in candidates:
                _size(c, self.steps)
        else:
            from suite.planner import analytic, fake_run

            fake_run.warm()
            start = lambda c: fake_run.Job(c.recipe, c.recipe.world_size, FAKE_TIMEOUT_S, quiet=True)  # noqa: E731
            for c, _, (status, payload) in fake_run.run_all(candidates, start, self.jobs):
                c.profile = payload if status == "ok" else analytic.profile(
                    fake_run.at_world(c.recipe, c.recipe.world_size), c.recipe.world_size, f"the fake run failed: {payload}")
        self.progress(f"round {self.rounds}: {len(candidates)} configuration(s) sized "
                      f"({time.monotonic() - started:.0f} s)")


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


def _size(c: Candidate, steps: dict) -> None:
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
