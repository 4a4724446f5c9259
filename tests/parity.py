"""The correctness check every strategy must pass: with the same seed, data and global batch,
its per-step losses equal those of the single-process baseline.

In float64 (``training.precision=fp64``, the default here): rounding differences are then ~1e-16
relative, so a correct strategy matches ``single`` within 1e-10 over these few steps whatever
the CPU's vector kernels (``ATEN_CPU_CAPABILITY``) or thread count, and a wrong one (a missing
average, a skipped shard, batch norm over the wrong samples) differs by 1e-3 or more. A float32
comparison at 1e-5 is kept only where float64 cannot run (DeepSpeed keeps float32 master
weights; TensorFlow's strategies train in float32) and only for models where it holds under
every kernel set (the parity runs of tests/run_kernel_sets.sh check that)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from suite import recipe as recipes
from suite.tasks import train as rank_task
from suite.train import rank as train_rank
from suite.record.run_record import read_json, read_metrics
from tests.harness import run_ranks

TOLERANCE = 1e-10  # fp64, absolute, per step
# Set by tests/run_kernel_sets.sh for the other kernel sets: only the float32 comparisons run again.
FP32_ONLY = "SCALESUITE_PARITY_FP32_ONLY"
FP32_TOLERANCE = 1e-5  # fp32, absolute, per step: only where it holds under every CPU kernel set
# The strategies that split the model over devices in one process (layer_split, fairscale_pipe) at world
# size 1, or under DDP at world size 2: make_recipe(strategy, world_size, **TWO_DEVICES).
TWO_DEVICES = {"launch": {"devices_per_task": 2}}

BASE = {
    "name": "parity",
    "model": {"name": "mlp", "hidden": [32, 32]},
    "data": {"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 512, "n_val": 64},
    "strategy": {"name": "single"},
    "optimizer": {"name": "sgd", "lr": 0.2, "momentum": 0.9},
    "training": {"epochs": 1, "max_steps": 8, "batch_size": 32, "seed": 1, "log_every_steps": 4},
    "tracking": {"wandb": "disabled"},
}


def make_recipe(strategy: dict, world_size: int = 1, precision: str | None = None, **sections) -> recipes.Recipe:
    """A parity recipe: BASE with ``sections`` over it, in ``precision`` unless the training
    section names one (the bf16 tests); by default fp64, or fp32 for a strategy that cannot train
    in float64 (its ``no_fp64``, or a key it refuses with fp64), whose baseline must then ask
    for fp32 (``make_recipe({"name": "single"}, precision=recipe.training.precision)``)."""
    from suite.common.errors import SuiteError

    if precision is None:
        try:
            return make_recipe(strategy, world_size, "fp64", **sections)
        except SuiteError as e:
            if "training.precision=fp64" not in str(e):  # the strategy's no_fp64, or a key it refuses with fp64
                raise
            precision = "fp32"
    raw = {**BASE, **sections, "strategy": strategy}
    raw["training"] = {"precision": precision, **raw["training"]}
    if os.environ.get(FP32_ONLY) and raw["training"]["precision"] == "fp64":
        import pytest  # only under pytest: this module also serves the benchmarks

        pytest.skip("float64 at 1e-10: no kernel set's rounding moves it (run on the CPU's own kernels)")
    raw["launch"] = {**raw.get("launch", {}), "tasks_per_node": world_size}
    return recipes.validate(raw)


def tolerance(recipe) -> float:
    """The parity tolerance of the recipe's precision (fp64, or fp32 where float64 cannot run)."""
    return TOLERANCE if recipe.training.precision == "fp64" else FP32_TOLERANCE


def step_losses(recipe, run_dir: Path, timeout_s: float = 240, start: str = "fork") -> list[float]:
    """Run the recipe on forked ranks (``start="spawn"``: fresh ones); the global loss of each step,
    as the run record has it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_ranks(rank_task.train, recipe.world_size, recipe, run_dir, timeout_s=timeout_s, start=start)
    return step_losses_of(run_dir)


def step_losses_of(run_dir: Path) -> list[float]:
    """The global loss of each step a run recorded (rank 0's step records)."""
    steps = read_metrics(run_dir, kind="step", rank=0)
    return [s["global_loss"] for s in sorted(steps, key=lambda s: s["step"])]


@dataclass(frozen=True)
class Baseline:
    """One run of ``single`` on one process: its per-step global losses and its run folder
    (summary.json, the step and epoch records, checkpoints when the recipe asks for them)."""
    run_dir: Path
    steps: tuple[float, ...]

    @property
    def losses(self) -> list[float]:
        """The per-step losses, as ``step_losses`` returns them: a new list each time, so that no
        test can change the baseline another test compares against."""
        return list(self.steps)

    @property
    def summary(self) -> dict:
        return read_json(self.run_dir / "summary.json")


class Baselines:
    """The single-process baselines of a test session, each run once: ``baselines(recipe)`` runs
    ``recipe`` (strategy single, world size 1) the first time any module asks for it and hands the
    same :class:`Baseline` to every later one. Keyed by what decides the run: the recipe's
    fingerprint, and the launch and tracking sections it leaves out (they decide the run folder's
    contents). tests/conftest.py makes one per session (the ``baseline_of`` fixture)."""

    def __init__(self, make_dir: Callable[[], Path]):
        self._make_dir = make_dir
        self._runs: dict[str, Baseline] = {}

    def __call__(self, recipe: recipes.Recipe) -> Baseline:
        if recipe.strategy.name != "single" or recipe.world_size != 1:
            raise ValueError(f"a baseline is strategy single on one process, not strategy {recipe.strategy.name} "
                             f"on {recipe.world_size}: make_recipe({{'name': 'single'}}, ...)")
        key = json.dumps([recipe.fingerprint(), recipe.launch.model_dump(mode="json"),
                          recipe.tracking.model_dump(mode="json")], sort_keys=True)
        if key not in self._runs:
            run_dir = self._make_dir()
            self._runs[key] = Baseline(run_dir, tuple(step_losses(recipe, run_dir)))
        return self._runs[key]


def assert_matches(losses: list[float], baseline: list[float], tolerance: float = TOLERANCE, learns: bool = True) -> None:
    """``learns=False``: for a model that does not learn within these few steps (MobileNetV2 on
    random-ish images); its baseline must still move, or the comparison would prove little."""
    assert len(losses) == len(baseline) >= 5, (len(losses), len(baseline))
    if learns:
        assert baseline[-1] < baseline[0], "the baseline does not learn: the comparison would prove little"
    else:
        assert max(abs(b - baseline[0]) for b in baseline) > 1e-2, "the baseline does not move: it would prove little"
    worst = max(abs(a - b) for a, b in zip(losses, baseline))
    assert worst <= tolerance, f"per-step losses differ from the baseline by up to {worst:.3g}:\n{losses}\n{baseline}"


def assert_holds_share(summary: dict, baseline_summary: dict, predicted: dict, share: float) -> None:
    """Every rank of ``summary`` holds ``share`` of the baseline's parameters, gradients and
    optimizer state, as ``predicted`` (``suite.planner.memory``) says, within 2% (padding, small tensors)."""
    whole = baseline_summary["ranks"][0]["held_bytes"]
    for rank in summary["ranks"]:
        for kind in ("parameters", "gradients", "optimizer_state"):
            assert whole[kind] > 0
            assert math.isclose(rank["held_bytes"][kind], whole[kind] * share, rel_tol=0.02), (kind, rank, whole)
            assert math.isclose(rank["held_bytes"][kind], predicted[kind], rel_tol=0.02), (kind, rank, predicted)


def per_rank_batchnorm_losses(recipe) -> list[float]:
    """What data parallelism with per-rank batch norm (``training.sync_batchnorm: false``) must
    compute, worked out in one process in the recipe's precision: each step, each data-parallel
    rank's samples (as its DistributedSampler and loader give them) through the model in training
    mode, normalised by their own batch statistics, the ranks' mean losses' gradients averaged,
    one optimizer step. The global loss of each step, as the
    run record has it. A strategy equal to this is what plain DDP is; its distance from
    ``single`` is then a computed quantity, not noise."""
    import torch
    from torch.utils.data import DistributedSampler

    from suite.models import build as build_model
    from suite.models.task import Task
    from suite.strategies.prepare import default_dtype, input_dtype

    tr, opt, layout = recipe.training, recipe.optimizer, recipe.layout()
    assert layout.accumulation_steps == 1 and opt.schedule.name == "constant" and not opt.schedule.warmup_steps, \
        "the reference covers neither accumulation nor lr schedules"
    train_set, _ = recipe.data.load()
    loaders = []
    for rank in range(layout.dp_size):
        sampler = DistributedSampler(train_set, num_replicas=layout.dp_size, rank=rank, shuffle=True, seed=tr.seed,
                                     drop_last=True)
        loaders.append(recipe.data.train_loader(train_set, sampler, layout.rank_batch, tr.seed))
    task, dtype = Task(recipe.model.task, recipe.data.spec().num_classes), input_dtype(tr.precision)
    with default_dtype(tr.precision):
        torch.manual_seed(tr.seed)
        model = build_model(recipe.model, recipe.data.spec())
        model.train()
        optimizer = train_rank.make_optimizer(opt, model.parameters())
        losses = []
        for batches in zip(*loaders):
            if len(losses) == tr.max_steps:
                break
            step_loss = 0.0
            for x, y in batches:
                x = x.to(dtype) if dtype is not None and x.is_floating_point() else x
                loss = task.loss(model(x), x, y)
                (loss / layout.dp_size).backward()
                step_loss += loss.item() / layout.dp_size
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(step_loss)
    return losses
