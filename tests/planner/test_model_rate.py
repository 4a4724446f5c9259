"""The model's and its strategy's one-rank steps, timed when a prediction is made
(suite.planner.model_rate): all a prediction needs in one fresh process, a strategy that leaves
process-wide state last in its process, and a timing that fails named without losing the others."""
from __future__ import annotations

import subprocess

import pytest

from suite import recipe as recipes
from suite.planner import model_rate
from tests.planner.hand_calibration import hand_calibration

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)

RAW = {"name": "t", "model": {"name": "mlp", "hidden": [64]}, "data": {"name": "digits"},
       "optimizer": {"name": "sgd", "lr": 0.1}, "training": {"epochs": 1, "batch_size": 32, "seed": 0}}


def _recipe(strategy: dict, per_node: int = 2):
    return recipes.validate({**RAW, "strategy": strategy, "launch": {"executor": "local", "tasks_per_node": per_node}})


def _count_processes(monkeypatch) -> list:
    started = []
    real = subprocess.run

    def run(*args, **kwargs):
        started.append(kwargs.get("input"))
        return real(*args, **kwargs)

    monkeypatch.setattr(model_rate.subprocess, "run", run)
    return started


def test_a_predictions_timings_run_in_one_fresh_process_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    started = _count_processes(monkeypatch)
    recipe = _recipe({"name": "fsdp"})
    got = model_rate.with_model_rate(hand_calibration(cores=2), recipe, "m", 2)
    assert len(started) == 1  # the model's step and FSDP's as one rank, one torch import
    entry = got["compute"]["models"]["m"]
    assert entry["strategy"] == "fsdp" and entry["step_s"] > 0 and entry["overhead_s"] >= 0
    cached = model_rate._read_cache()
    assert {e["strategy"] for e in cached.values()} == {"single", "fsdp"}
    assert model_rate.with_model_rate(hand_calibration(cores=2), recipe, "m", 2) == got  # from the cache
    assert len(started) == 1


def _fake_batches(monkeypatch) -> list:
    batches = []

    def fake(jobs):
        batches.append([(j.together, "single" if not (j.own_strategy or j.stages) else j.recipe.strategy.name)
                        for j in jobs])
        return [{"step_s": 0.01, "flops": 1e6, "flops_per_s": 1e8, "batch": 16, "threads": j.threads,
                 "strategy": "x"} for j in jobs]

    monkeypatch.setattr(model_rate, "time_in_fresh_process", fake)
    return batches


def test_jobs_share_a_process_until_one_whose_strategy_leaves_process_wide_state(tmp_path, monkeypatch):
    """A strategy that leaves process-wide state (``reusable_process`` False: DeepSpeed's ZeRO)
    ends its process, as it ends a sweep's warm ranks; jobs with other copies stepping at once
    get their own process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    batches = _fake_batches(monkeypatch)
    ddp, zero2, zero3, fsdp = (_recipe(s) for s in ({"name": "ddp"}, {"name": "zero", "stage": 2},
                                                     {"name": "zero", "stage": 3}, {"name": "fsdp"}))
    Job = model_rate.Job
    model_rate.time_all([Job(ddp, 1, 2), Job(zero2, 1, 2, own_strategy=True), Job(ddp, 1, 2, own_strategy=True),
                         Job(zero3, 1, 2, own_strategy=True), Job(fsdp, 1, 2, own_strategy=True),
                         Job(ddp, 2, 1), Job(fsdp, 1, 2)])  # the last: ddp's single job again (same key)
    assert batches == [[(1, "single")],
                       [(2, "single"), (2, "ddp"), (2, "fsdp"), (2, "zero")],
                       [(2, "zero")]]
    model_rate.time_all([Job(ddp, 1, 2), Job(zero3, 1, 2, own_strategy=True)])  # all cached: no process
    assert len(batches) == 3


def test_a_timing_that_fails_is_named_and_the_others_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(model_rate, "_FAILED", {})  # this process's failures: the test's own
    recipe = _recipe({"name": "fsdp"})
    jobs = [model_rate.Job(recipe, 1, 2), model_rate.Job(recipe, 1, 2, own_strategy=True)]
    # the process timed the first, then died: the second gets the process's last words
    # (a library's own printing on the same stdout, a dict among it, is not taken for a result)
    done = subprocess.CompletedProcess([], 1, stdout="{'train_batch_size': 32}\n" + model_rate.RESULT +
                                       '{"step_s": 0.01, "flops": 1e6, "flops_per_s": 1e8, "batch": 32, '
                                       '"threads": 1, "strategy": "single"}\n', stderr="Traceback\nMemoryError: out\n")
    monkeypatch.setattr(model_rate.subprocess, "run", lambda *a, **k: done)
    model_rate.time_all(jobs)
    assert model_rate.timed(recipe, 1, 2)["step_s"] == 0.01
    with pytest.raises(RuntimeError, match="timing the model failed: MemoryError: out"):
        model_rate.timed(recipe, 1, 2, own_strategy=True)
    # with_model_rate keeps the model's rate and leaves the strategy's cost to its rules
    entry = model_rate.with_model_rate(hand_calibration(cores=2), recipe, "m", 2)["compute"]["models"]["m"]
    assert entry["strategy"] == "single" and entry["overhead_s"] == 0.0
