"""W&B as its users use it: one run per job, written live by rank 0 from the run record while the
job trains, grouped by study or sweep, system metrics on, the same run across attempts, and an
export from the record that makes no duplicate. Default tracking settings throughout (W&B offline)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis import report, runs as analysis_runs, wandb_runs
from suite.recipe.text import expand_sweep
from suite.record import run_record, wandb_export, wandb_live, wandb_rows
from suite.record.run_record import read_json, read_metrics
from suite.study.arms import arm_recipes, grouped
from suite.train import loop as loop_module, rank as train_rank
from tests.harness import run_ranks
from tests.parity import make_recipe, step_losses
from tests.train.test_resume import RESUMABLE, crash_at_step_7_then_resume

pytestmark = pytest.mark.slow  # starts ranks or fake runs: not in the fast tier


def _records(run_dir, kind, rank):
    return [{k: v for k, v in r.items() if k not in ("kind", "rank")} for r in read_metrics(run_dir, kind, rank)]


def _history_while_paused(run_dir: Path, seen: Path, at_step: int, wait_s: float = 90) -> None:
    """Run in rank 0 at ``at_step`` (training paused there): wait until the job's offline W&B run
    has history rows, and write the steps they hold to ``seen``."""
    deadline = time.time() + wait_s
    steps = []
    while time.time() < deadline and not steps:
        time.sleep(2)
        for d in wandb_runs.run_dirs(run_dir):
            steps = [row.get("step/step") for row in wandb_runs.read(d)["history"]]
    seen.write_text(" ".join(map(str, steps)) or "none")


def test_a_two_rank_job_is_one_wandb_run_that_grows_while_it_trains(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # the default: offline
    monkeypatch.chdir(tmp_path)  # W&B must write into the run folder, not ./wandb
    seen = tmp_path / "seen.txt"
    real = loop_module._maybe_fail

    def pause_rank0(rank, step, attempt=1, planned=""):
        if rank == 0 and step == 5:  # steps 0-3 are in the record (log_every_steps=4)
            _history_while_paused(run_dir, seen, step)
        real(rank, step, attempt, planned)

    monkeypatch.setattr(loop_module, "_maybe_fail", pause_rank0)
    recipe = make_recipe({"name": "ddp"}, 2, tracking={"wandb": "offline"}, precision="fp32")
    run_dir = train_rank.new_run_dir(recipe, tmp_path / "runs")  # with its recipe.yaml, as submit makes it
    step_losses(recipe, run_dir)

    during = seen.read_text().split()
    assert during != ["none"], "the W&B run had no history row while the job trained"
    assert {int(s) for s in during} <= {0, 1, 2, 3}, "rows of steps not trained yet"

    (folder,) = wandb_export.offline_runs(run_dir)  # one W&B run for the job, not one per rank
    info = wandb_runs.read_job([folder])
    assert info["ids"] == [run_dir.name] and info["group"] == "parity" and info["job_type"] == "ddp"
    assert set(info["tags"]) == {"strategy:ddp", "world:2"}
    assert info["config"]["training.batch_size"] == 32 and info["config"]["strategy.name"] == "ddp"
    for rank in (0, 1):
        steps = _records(run_dir, "step", rank)
        assert len(steps) == 8 and wandb_runs.step_metrics(info, rank) == steps
        assert any(f"rank{rank}/utilisation/rss_bytes" in row for row in info["history"])
    summary = read_json(run_dir / "summary.json")
    assert [r.get("wandb_live_every_s") for r in summary["ranks"]] == [10.0, None]  # the default; rank 0 logged
    assert info["summary"]["step_time_s"] == summary["step_time_s"]  # the run record's median
    assert info["summary"]["samples_per_s"] == summary["samples_per_s"] and info["summary"]["mfu"] == summary["mfu"]
    assert info["summary"]["final/train_loss"] == summary["final"]["train_loss"]
    for rank in (0, 1):
        assert info["summary"][f"rank{rank}/peak_memory_bytes"] == summary["ranks"][rank]["peak_memory_bytes"]
    # W&B's system monitor is on: the report's system columns have values
    assert info["stats"], "no W&B system samples"
    loaded = analysis_runs.load(run_dir)
    (row,) = report.wandb_rows([loaded])
    assert row["matches_record"] and row["system_samples"] >= 1
    assert row["cpu_percent_mean"] is not None and row["rss_mb_peak"] > 0
    assert not (tmp_path / "wandb").exists()


def test_1024_ranks_over_128_nodes_open_at_most_one_wandb_connection_per_node():
    ranks_per_node = 8
    world = [(rank, f"node{rank // ranks_per_node:03d}") for rank in range(1024)]
    per_node: dict[str, int] = {}
    for rank, node in world:
        per_node[node] = per_node.get(node, 0) + wandb_live.opens_wandb(rank)
    assert len(per_node) == 128 and max(per_node.values()) <= 1
    assert sum(per_node.values()) == 1, "the job's one W&B run has one writer"


def test_a_studys_arms_and_a_sweeps_points_share_one_wandb_group():
    raw = {"name": "fig3", **{k: v for k, v in make_recipe({"name": "ddp"}, 2).model_dump(mode="json").items()
                              if k not in ("name", "arm", "sweep")}}
    study = {"arms": {"ddp": {"strategy.name": "ddp"}, "zero2": {"strategy.name": "zero", "strategy.stage": 2}},
             "profiles": {"cpu": {}}}
    arms = grouped(arm_recipes(raw, study, "cpu", repeats=2), "fig3-cpu-20260101-000000")
    points = [p for recipe in arms.values() for p in expand_sweep(dict(recipe))]
    names = [wandb_rows.names(p, "id") for p in points]
    assert len(points) == 4 and {n["group"] for n in names} == {"fig3-cpu-20260101-000000"}
    assert sorted(n["job_type"] for n in names) == ["ddp", "ddp", "zero2", "zero2"]
    assert all("arm:ddp" in n["tags"] or "arm:zero2" in n["tags"] for n in names)
    sweep = expand_sweep({**raw, "sweep": {"training.seed": [1, 2]}})
    assert {wandb_rows.names(p, "id")["group"] for p in sweep} == {"fig3"}
    assert len({p["name"] for p in sweep}) == 2


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    recipe = make_recipe({"name": "ddp"}, 2, tracking={"wandb": "offline"},
                         **{**RESUMABLE, "training": {**RESUMABLE["training"], "checkpoint_every_steps": 4}})
    run_dir = train_rank.new_run_dir(recipe, tmp_path)
    saved = crash_at_step_7_then_resume(recipe, run_dir, monkeypatch)
    first, second = wandb_export.offline_runs(run_dir)  # one folder per attempt, one W&B run id
    job = wandb_runs.read_job([first, second])
    assert job["ids"] == [run_dir.name] and job["attempts"] == 2
    resumed = [row["step/step"] for row in wandb_runs.read(second)["history"] if "step/step" in row]
    assert resumed[0] == saved and resumed == list(range(saved, resumed[-1] + 1))
    record = {r["step"]: r["global_loss"] for r in _records(run_dir, "step", 0)}  # a later line wins
    assert {r["step"]: r["global_loss"] for r in wandb_runs.step_metrics(job)} == record


def _export(run_dir, *extra):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    return subprocess.run([sys.executable, "-m", "suite.export", str(run_dir), *extra], capture_output=True,
                          text=True, timeout=180, env=env)


def test_export_writes_one_wandb_run_from_a_run_recorded_with_wandb_off_and_again_makes_no_duplicate(tmp_path):
    recipe = make_recipe({"name": "ddp"}, 2, tracking={"wandb": "disabled"}, precision="fp32")
    run_dir = train_rank.new_run_dir(recipe, tmp_path)
    step_losses(recipe, run_dir)
    assert not wandb_runs.run_dirs(run_dir)
    proc = _export(run_dir)
    assert proc.returncode == 0, proc.stderr
    (written,) = wandb_export.offline_runs(run_dir)
    info = wandb_runs.read(written)
    for rank in (0, 1):
        assert wandb_runs.step_metrics(info, rank) == _records(run_dir, "step", rank)
    again = _export(run_dir)
    assert again.returncode == 0 and "already has its W&B run" in again.stderr
    assert wandb_export.offline_runs(run_dir) == [written]
    forced = _export(run_dir, "--force")
    assert forced.returncode == 0, forced.stderr
    (rewritten,) = wandb_export.offline_runs(run_dir)
    assert wandb_runs.step_metrics(wandb_runs.read(rewritten), 1) == _records(run_dir, "step", 1)


def test_a_failing_wandb_leaves_the_run_completed_and_says_so(tmp_path, monkeypatch, capfd):
    import wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)

    def broken(*args, **kwargs):
        raise RuntimeError("W&B is broken today")

    monkeypatch.setattr(wandb, "init", broken)
    step_losses(make_recipe({"name": "single"}, tracking={"wandb": "offline"}), tmp_path)
    summary = read_json(tmp_path / "summary.json")
    assert summary["status"] == "completed"
    assert "W&B live logging failed (RuntimeError: W&B is broken today)" in summary["wandb_notice"]
    assert capfd.readouterr().out.count("W&B live logging failed") == 1


def test_rows_wait_for_every_rank_before_giving_a_step_out():
    rows = wandb_rows.Rows(2)
    rows.add({"kind": "step", "rank": 0, "step": 0, "global_loss": 1.0, "loss": 0.9})
    rows.add({"kind": "step", "rank": 0, "step": 1, "global_loss": 0.8, "loss": 0.7})
    assert rows.drain() == [], "rank 1 has not recorded step 0 yet"
    rows.add({"kind": "utilisation", "rank": 1, "cpu_percent": 50.0})
    rows.add({"kind": "step", "rank": 1, "step": 0, "global_loss": 1.0, "loss": 1.1})
    rows.add({"kind": "step", "rank": 1, "step": 1, "global_loss": 0.8, "loss": 0.9})
    ((step, row),) = rows.drain()
    assert step == 0 and row == {"step/step": 0, "step/global_loss": 1.0, "step/loss": 0.9, "rank0/step/loss": 0.9,
                                 "rank1/utilisation/cpu_percent": 50.0, "rank1/step/loss": 1.1}
    assert [s for s, _ in rows.drain(everything=True)] == [1]


def _study_run(folder, tables):
    return wandb_export.study_run(folder, {"name": "fig3", "tracking": {"wandb": "offline"}}, tables)


def test_a_study_logs_its_comparison_as_a_wandb_table_in_its_own_run_in_the_arms_group(tmp_path, monkeypatch):
    import json

    monkeypatch.delenv("WANDB_MODE", raising=False)
    folder = tmp_path / "fig3-cpu-20260101-000000"  # the study's folder: its arms' W&B group
    folder.mkdir()
    # per-rank figures: a number for a one-rank arm, "a;b" text for a two-rank one, as the report writes them
    rows = [{"arm": "ddp", "published": 1.9, "ours": 1.85, "peak": "7.1;4.6"},
            {"arm": "zero2", "published": 1.7, "ours": None, "peak": 7.4}]
    assert run_ranks(_study_run, 1, folder, {"published_vs_ours": rows}, timeout_s=120) == [None]
    (written,) = wandb_runs.run_dirs(folder)
    info = wandb_runs.read(written)
    assert info["id"] == folder.name and info["group"] == folder.name and info["job_type"] == "study"
    (row,) = [r for r in info["history"] if "published_vs_ours.path" in r]
    assert row["published_vs_ours._type"] == "table-file"
    table = json.loads((written / "files" / row["published_vs_ours.path"]).read_text())
    assert table["columns"] == ["arm", "published", "ours", "peak"]
    assert table["data"] == [["ddp", 1.9, 1.85, "7.1;4.6"], ["zero2", 1.7, None, 7.4]]
