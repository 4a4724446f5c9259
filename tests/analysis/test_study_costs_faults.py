"""The study report's "Cost per arm" (a study's `prices`) and "Faults: time lost" (automatic
restarts), from hand-made run records; and the recipe's planned fault (training.fail_at)."""
from __future__ import annotations

from pathlib import Path

import pytest

from analysis import faults, study_tables, tables
from analysis.runs import Run
from suite.common.errors import SuiteError
from suite.recipe import validate
from suite.train.loop import _maybe_fail


def _run(arm: str, wall_s: float, nodes: int = 1, **summary) -> Run:
    return Run(path=Path(f"/runs/{arm}"), recipe={"arm": arm, "launch": {"nodes": nodes}, "strategy": {"name": "ddp"}},
               summary={"run_id": f"{arm}-{wall_s}", "started_at": 100.0, "finished_at": 100.0 + wall_s,
                        "world_size": 2, "device": "cpu", "ranks": [{}], "strategy": "ddp", "model": "mlp",
                        "global_batch": 32, **summary})


def test_cost_per_arm_is_the_mean_over_repeats_and_divides_by_the_baseline_arms():
    runs = [_run("single", 3600.0), _run("single", 1800.0), _run("ddp", 900.0, nodes=2)]
    costs = tables.cost_rows(runs, {"cpu_node": 0.2, "currency": "USD", "source": "placeholders"})
    study = {"arms": {"single": {}, "ddp": {}, "unrun": {}}}
    rows = study_tables.cost_rows(study, costs, {"single": "single", "ddp": "single", "unrun": "single"})
    assert [r["arm"] for r in rows] == ["single", "ddp"]  # an arm without runs has no row
    single, ddp = rows
    assert single["runs"] == 2 and single["device_hours"] == pytest.approx(0.75) and single["cost"] == pytest.approx(0.15)
    assert ddp["device_hours"] == pytest.approx(0.5) and ddp["cost_vs_baseline"] == pytest.approx(0.1 / 0.15)


def test_time_lost_to_a_restart_is_the_gap_between_starts_less_the_steps_kept():
    steps = [{"step": s, "attempt": 1 if s <= 2 else 2, "step_time_s": 1.5} for s in range(1, 7)]
    attempts = [{"attempt": 1, "started_at": 100.0, "from_step": 0},
                {"attempt": 2, "restart": 1, "started_at": 140.0, "from_step": 2,
                 "cause": "rank 1 killed by SIGKILL after step 4"}]
    run = _run("hybrid2x2-fault", 60.0, attempts=attempts)
    run.steps = {0: steps}
    assert faults.rows([_run("hybrid2x2", 30.0, attempts=attempts[:1])]) == []  # no restart, no row
    (row,) = faults.rows([run])
    assert row["last_logged_step"] == 4 and row["from_step"] == 2 and row["steps_redone"] == 2
    assert row["lost_s"] == pytest.approx(40.0 - 2 * 1.5)  # steps 1-2 were kept


def test_a_recipe_plans_a_fault_and_a_malformed_plan_is_refused():
    with pytest.raises(RuntimeError, match="injected failure at rank 1, step 3"):
        _maybe_fail(1, 3, 1, "0:9:kill@2,1:3")
    _maybe_fail(1, 3, 2, "1:3@1")  # another attempt's: nothing
    recipe = {"name": "planned", "model": {"name": "mlp", "hidden": [8]}, "data": {"name": "digits"},
              "strategy": {"name": "ddp"}, "training": {"epochs": 1, "batch_size": 16, "fail_at": "1:4:kill@1"},
              "launch": {"tasks_per_node": 2}}
    assert validate(recipe).training.fail_at == "1:4:kill@1"
    recipe["training"]["fail_at"] = "rank 1 at step 4"
    with pytest.raises(SuiteError, match="fail_at"):
        validate(recipe)


def test_a_why_of_ours_alone_needs_no_row_and_is_labelled_ours():
    from analysis.study import because, check_sourcing, sentences

    fig = {"source": "ASU-T1-gpipe-mem", "why": "ours: resident memory on CPU; ours: not the device allocator's"}
    assert sentences(fig["why"]) == ["ours: resident memory on CPU", "ours: not the device allocator's"]
    check_sourcing(fig, "reference.figures.0")
    assert because(fig).endswith("[ours]")
    with pytest.raises(SuiteError, match="why needs why_source"):
        check_sourcing({**fig, "why": fig["why"] + "; theirs recomputed nothing"}, "reference.figures.0")
