"""A run stopped by preemption (SIGUSR2) saves a checkpoint on every rank at the same step and a
second attempt resumes from it: the losses equal those of an uninterrupted run, step for step."""
import json
import signal

import pytest

from suite.record import run_record
from suite.tasks import train as rank_task
from suite.train import stop
from suite.strategies import base
from suite.record.run_record import read_metrics
from tests.harness import run_ranks
from tests.parity import make_recipe

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)

RESUMABLE = dict(training={"epochs": 2, "batch_size": 32, "seed": 1, "log_every_steps": 2},
                 data={"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 256, "n_val": 64})


def run_until_stopped(recipe, run_dir):
    try:
        rank_task.train(recipe, run_dir)
    except stop.Preempted:
        return "preempted"
    return "completed"


def crash_at_step_7_then_resume(recipe, run_dir, monkeypatch, match: str = "injected failure"):
    """Rank 0 fails after step 7 (``SCALESUITE_FAIL_AT``), then the run resumes in the same folder
    to completion; the step of the checkpoint that was the latest after the crash (None: none)."""
    world = recipe.world_size
    monkeypatch.setenv("SCALESUITE_FAIL_AT", "0:7")
    with pytest.raises(AssertionError, match=match):
        run_ranks(run_until_stopped, world, recipe, run_dir)
    saved = (run_record.latest_checkpoint(run_dir) or {}).get("step")
    monkeypatch.delenv("SCALESUITE_FAIL_AT")
    assert run_ranks(run_until_stopped, world, recipe, run_dir) == ["completed"] * world
    return saved


def steps_by_number(run_dir):
    latest = {}
    for rec in read_metrics(run_dir, kind="step", rank=0):  # a later attempt's line wins
        latest[rec["step"]] = rec["global_loss"]
    return [latest[k] for k in sorted(latest)]


@pytest.mark.parametrize("strategy, wandb", [("ddp", "offline"), ("allreduce", "disabled")])
def test_preempted_run_resumes_to_the_same_losses(strategy, wandb, tmp_path, monkeypatch):
    # offline: the default tracking users run (W&B offline), not switched off for the test
    monkeypatch.delenv("WANDB_MODE", raising=False)
    recipe = make_recipe({"name": strategy}, world_size=2, tracking={"wandb": wandb}, **RESUMABLE)
    whole = tmp_path / "whole"
    whole.mkdir()
    assert run_ranks(run_until_stopped, 2, recipe, whole) == ["completed"] * 2

    calls = {"n": 0}
    real_step = base.ModuleEngine.train_step

    def step_then_signal(self, inputs, targets):
        calls["n"] += 1
        if calls["n"] == 5 and self.setup.ctx.rank == 1:
            signal.raise_signal(signal.SIGUSR2)  # what Slurm sends before a time limit or on preemption
        return real_step(self, inputs, targets)

    monkeypatch.setattr(base.ModuleEngine, "train_step", step_then_signal)
    cut = tmp_path / "cut"
    cut.mkdir()
    assert run_ranks(run_until_stopped, 2, recipe, cut) == ["preempted"] * 2
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["steps"] == 6  # the next reduction after step 5
    monkeypatch.setattr(base.ModuleEngine, "train_step", real_step)
    assert run_ranks(run_until_stopped, 2, recipe, cut) == ["completed"] * 2

    expected, resumed = steps_by_number(whole), steps_by_number(cut)
    assert len(resumed) == len(expected) == 16
    assert resumed == expected  # exactly: same seed, same world size, same data order
    done = json.loads((cut / "summary.json").read_text())
    assert done["status"] == "completed" and [a["from_step"] for a in done["attempts"]] == [0, 6]
    assert done["final"] == json.loads((whole / "summary.json").read_text())["final"]
    if wandb == "offline":  # the job's one W&B run, continued by the second attempt (a folder each)
        from analysis import wandb_runs
        job = wandb_runs.read_job(wandb_runs.run_dirs(cut))
        assert job["attempts"] == 2 and job["ids"] == [cut.name]
        assert [r["global_loss"] for r in wandb_runs.step_metrics(job)] == resumed


def test_periodic_checkpoints_let_a_crashed_run_resume(tmp_path, monkeypatch):
    recipe = make_recipe({"name": "ddp"}, world_size=2, **{**RESUMABLE, "training": {
        **RESUMABLE["training"], "checkpoint_every_steps": 4}})
    assert crash_at_step_7_then_resume(recipe, tmp_path, monkeypatch, match="raised") == 4
    assert len(steps_by_number(tmp_path)) == 16
