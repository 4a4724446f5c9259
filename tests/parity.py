"""The correctness check every strategy must pass: with the same seed, data and global batch,
its per-step losses equal those of the single-process baseline (fp32: within 1e-5)."""
from __future__ import annotations

import math
from pathlib import Path

from suite import recipe as recipes
from suite.train import rank as train_rank
from suite.record.run_record import read_metrics
from tests.harness import run_ranks

TOLERANCE = 1e-5  # fp32, absolute, per step

BASE = {
    "name": "parity",
    "model": {"name": "mlp", "hidden": [32, 32]},
    "data": {"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 512, "n_val": 64},
    "strategy": {"name": "single"},
    "optimizer": {"name": "sgd", "lr": 0.2, "momentum": 0.9},
    "training": {"epochs": 1, "max_steps": 8, "batch_size": 32, "seed": 1, "log_every_steps": 4},
    "tracking": {"wandb": "disabled"},
}


def make_recipe(strategy: dict, world_size: int = 1, **sections) -> recipes.Recipe:
    raw = {**BASE, **sections, "strategy": strategy}
    raw["launch"] = {**raw.get("launch", {}), "tasks_per_node": world_size}
    return recipes.validate(raw)


def step_losses(recipe, run_dir: Path, timeout_s: float = 240) -> list[float]:
    """Run the recipe on forked ranks; the global loss of each step, as the run record has it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_ranks(train_rank.run, recipe.world_size, recipe, run_dir, timeout_s=timeout_s)
    steps = read_metrics(run_dir, kind="step", rank=0)
    return [s["global_loss"] for s in sorted(steps, key=lambda s: s["step"])]


def assert_matches(losses: list[float], baseline: list[float], tolerance: float = TOLERANCE) -> None:
    assert len(losses) == len(baseline) >= 5, (len(losses), len(baseline))
    assert baseline[-1] < baseline[0], "the baseline does not learn: the comparison would prove little"
    worst = max(abs(a - b) for a, b in zip(losses, baseline))
    assert worst <= tolerance, f"per-step losses differ from the baseline by up to {worst:.3g}:\n{losses}\n{baseline}"


def assert_holds_share(summary: dict, baseline_summary: dict, predicted: dict, share: float) -> None:
    """Every rank of ``summary`` holds ``share`` of the baseline's parameters, gradients and
    optimizer state, as ``predicted`` (``suite.estimate``) says, within 2% (padding, small tensors)."""
    whole = baseline_summary["ranks"][0]["held_bytes"]
    for rank in summary["ranks"]:
        for kind in ("parameters", "gradients", "optimizer_state"):
            assert whole[kind] > 0
            assert math.isclose(rank["held_bytes"][kind], whole[kind] * share, rel_tol=0.02), (kind, rank, whole)
            assert math.isclose(rank["held_bytes"][kind], predicted[kind], rel_tol=0.02), (kind, rank, predicted)
