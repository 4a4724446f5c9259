"""A run checkpointed under one strategy and world size resumes under another (issue #28 item 3):
run A trains, saves at step 4 (checkpoint_every_steps) and dies at step 6; run B resumes from the
checkpoint in the same folder and finishes. Every step's loss, A's before the checkpoint and B's
after it, equals single's on one process (which every strategy here matches step for step: the
parity tests), in float64 where the strategies can run it; ZeRO cannot (float32 master weights),
so its pair runs in float32 at the float32 tolerance (tests/parity.py). Adam, so that the moments
and the step count (its bias correction) must carry over too.

``suite.submit --resume RUN strategy.name=fsdp launch.tasks_per_node=1`` does the same end to end, and
what cannot convert is refused by it before anything launches."""
import json
import os
import subprocess
import sys

import pytest

from suite import recipe as recipes
from suite.record import run_record
from suite.record.run_record import read_metrics
from suite.strategies import _deepspeed
from suite.tasks import train as rank_task
from tests.harness import run_ranks
from tests.parity import TWO_DEVICES, assert_matches, make_recipe, tolerance

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)

SECTIONS = {"optimizer": {"name": "adam", "lr": 0.01},
            "training": {"epochs": 1, "max_steps": 8, "batch_size": 32, "seed": 1, "log_every_steps": 2,
                         "checkpoint_every_steps": 4}}

CASES = {  # id: (strategy A, world A, strategy B, world B)
    "zero3@4->fsdp@2": ({"name": "zero", "stage": 3}, 4, {"name": "fsdp"}, 2),  # out of ZeRO-3's partitions
    "fsdp@2->zero3@2": ({"name": "fsdp"}, 2, {"name": "zero", "stage": 3}, 2),  # into ZeRO-3's partitions
    "single->zero2@2": ({"name": "single"}, 1, {"name": "zero", "stage": 2}, 2),
    "zero1@2->single": ({"name": "zero", "stage": 1}, 2, {"name": "single"}, 1),
    "fsdp@2->ddp@4": ({"name": "fsdp"}, 2, {"name": "ddp"}, 4),
    "ddp@2->single": ({"name": "ddp"}, 2, {"name": "single"}, 1),
    "tensor@2->single": ({"name": "tensor"}, 2, {"name": "single"}, 1),
    "pipeline@2->ddp@2": ({"name": "pipeline"}, 2, {"name": "ddp"}, 2),
    # layer_split: one rank splitting the model over launch.devices_per_task (all the cpu here)
    "layer_split@1x2->ddp@2": ({"name": "layer_split"}, 1, {"name": "ddp"}, 2),
}
LAUNCH = {"layer_split": TWO_DEVICES}  # what a strategy needs beside its world size


def steps_by_number(run_dir):
    latest = {}
    for rec in read_metrics(run_dir, kind="step", rank=0):  # a later attempt's line wins
        latest[rec["step"]] = rec["global_loss"]
    return [latest[k] for k in sorted(latest)]


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_resumes_under_another_strategy_and_world(case, tmp_path, monkeypatch, baseline_of):
    first, world_a, then, world_b = CASES[case]
    if "zero" in (first["name"], then["name"]):
        _deepspeed.preload()  # once here, not once per forked rank (~7 s each)
    pair = [(first, world_a), (then, world_b)]
    # float64 unless one side cannot run it (ZeRO): the training section, precision too, stays as it was
    precision = "fp32" if any(make_recipe(s, w, **LAUNCH.get(s["name"], {}), **SECTIONS).training.precision == "fp32"
                              for s, w in pair) else "fp64"
    a, b = (make_recipe(s, w, precision, **LAUNCH.get(s["name"], {}), **SECTIONS) for s, w in pair)
    single = baseline_of(make_recipe({"name": "single"}, precision=precision, **SECTIONS))

    monkeypatch.setenv("SCALESUITE_FAIL_AT", "0:6")
    with pytest.raises(AssertionError, match="injected failure"):
        run_ranks(rank_task.train, world_a, a, tmp_path)
    saved = run_record.latest_checkpoint(tmp_path)
    assert (saved["step"], saved["format"], saved["strategy"], saved["world_size"]) == (4, "neutral", first["name"],
                                                                                       world_a)
    # how the model was written: DCP where ranks hold DTensors, else one torch file per rank that holds
    # entries no lower rank holds (data-parallel replicas once, a pipeline's two stages each)
    model = run_record.checkpoint_folder(tmp_path) / saved["folder"] / "model"
    files = sorted(p.name for p in model.glob("rank*.pt"))
    if first["name"] in ("fsdp", "tensor"):
        assert (model / ".metadata").exists() and files == [], files
    else:
        assert files == (["rank0.pt", "rank1.pt"] if first["name"] == "pipeline" else ["rank0.pt"]), files
    monkeypatch.delenv("SCALESUITE_FAIL_AT")
    run_ranks(rank_task.train, world_b, b, tmp_path)

    losses = steps_by_number(tmp_path)
    assert len(losses) == 8
    assert_matches(losses, single.losses, tolerance(a))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert [(x["strategy"], x["world_size"], x["from_step"]) for x in summary["attempts"]] == [
        (first["name"], world_a, 0), (then["name"], world_b, 4)]


def _submit(*args):
    return subprocess.run([sys.executable, "-m", "suite.submit", *args], capture_output=True, text=True, timeout=120)


def _stopped_run(tmp_path, strategy: dict, world: int, precision=None):
    """A run folder as a stopped run leaves it: its recipe, and a checkpoint at step 4 in the
    format the strategy saves (the ranks never ran: what --resume checks is the record)."""
    recipe = make_recipe(strategy, world, precision, **SECTIONS)
    run_dir = run_record.new_run_dir(recipe.name, recipes.dump(recipe), tmp_path)
    fmt = "rank" if recipe.strategy.no_neutral_checkpoint else "neutral"
    run_record.checkpoint_folder(run_dir).mkdir()
    run_record.write_json_atomic(run_record.checkpoint_folder(run_dir) / "latest.json", {
        "step": 4, "world_size": world, "folder": "step-4", "format": fmt, "strategy": strategy["name"],
        "metrics_bytes": 0})
    run_record.update_summary(run_dir, status="cancelled")
    return run_dir


@pytest.mark.parametrize("strategy, world, overrides, says", [
    ({"name": "hogwild"}, 2, ["strategy.name=ddp"], "per-rank format"),
    ({"name": "ddp"}, 2, ["strategy.name=hogwild"], "strategy hogwild its engine's state is not mapped"),
    ({"name": "ddp"}, 2, ["training.seed=3"], "keeps its training section"),
    ({"name": "ddp"}, 2, ["strategy.name=zero", "strategy.stage=0"], "strategy.stage=0 is not mapped"),
])
def test_a_pair_that_cannot_convert_is_refused_before_launch(strategy, world, overrides, says, tmp_path):
    run_dir = _stopped_run(tmp_path, strategy, world, "fp32")  # fp32: ZeRO would refuse fp64 first
    recipe_before = (run_dir / "recipe.yaml").read_text()
    done = _submit("--resume", str(run_dir), *overrides)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: --resume") and says in line, line
    assert (run_dir / "recipe.yaml").read_text() == recipe_before  # nothing changed, nothing launched
    assert not (run_dir / "ranks").exists()


def test_submit_resume_continues_a_run_under_another_strategy_and_world(tmp_path, baseline_of):
    recipe = make_recipe({"name": "ddp"}, 2, **SECTIONS)
    path = tmp_path / "recipe.yaml"
    path.write_text(recipes.dump(recipe))
    out = tmp_path / "runs"
    failed = subprocess.run([sys.executable, "-m", "suite.submit", str(path), "--out", str(out)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "SCALESUITE_FAIL_AT": "0:6"})
    assert failed.returncode == 1, failed.stderr
    (run_dir,) = [p for p in out.iterdir() if (p / "recipe.yaml").is_file()]
    done = _submit("--resume", str(run_dir), "strategy.name=fsdp", "launch.tasks_per_node=1")
    assert done.returncode == 0, done.stderr
    assert "resuming as strategy fsdp at world size 1 (was ddp at 2)" in done.stdout
    assert recipes.load(run_dir / "recipe.yaml")[0].strategy.name == "fsdp"  # later resumes and exports read it
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["strategy"], summary["world_size"]) == ("completed", "fsdp", 1)
    assert [(x["strategy"], x["world_size"], x["from_step"]) for x in summary["attempts"]] == [
        ("ddp", 2, 0), ("fsdp", 1, 4)]
    single = baseline_of(make_recipe({"name": "single"}, **SECTIONS))
    assert_matches(steps_by_number(run_dir), single.losses)
