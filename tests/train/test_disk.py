"""Disk space (issue #28): a submission whose checkpoints cannot fit in --out is refused before
launch; a disk that fills during a save ends the run with one line, the last checkpoint intact."""
import json
import os
import subprocess
import sys
from collections import namedtuple

import pytest

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.submit import preflight
from tests.recipe.test_recipe_errors import QUICKSTART

Usage = namedtuple("Usage", "total used free")


def _points(*overrides):
    return recipes.load(QUICKSTART, list(overrides))


def test_the_checkpoint_size_is_every_rank_s_parameters_and_optimizer_state():
    (r,) = _points("launch.tasks_per_node=2", "optimizer.name=adam")
    est = preflight.estimate(r)
    n = est["parameters_count"]
    assert preflight.checkpoint_bytes(r, est) == 2 * (4 * n + 4 * 2 * n)  # 2 ranks x (weights + Adam's 2 moments)


def test_an_out_folder_too_small_for_two_checkpoints_is_refused_naming_both_figures(tmp_path, monkeypatch):
    points = _points("launch.tasks_per_node=2")
    need = 2 * preflight.checkpoint_bytes(points[0], preflight.estimate(points[0]))
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: Usage(10 * need, 9 * need, need - 1))
    with pytest.raises(SuiteError) as refused:
        preflight.check(points, tmp_path)
    line = str(refused.value)
    assert refused.value.exit_code == 2 and "\n" not in line
    assert f"--out {tmp_path} has" in line and "free space there or give --out" in line
    assert f"{(need - 1) / 2**20:.1f} MiB free" in line and f"need {need / 2**20:.1f} MiB" in line, line
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: Usage(10 * need, 9 * need, need))
    preflight.check(points, tmp_path)  # exactly enough passes


@pytest.mark.slow
def test_a_disk_that_fills_during_a_save_ends_the_run_in_one_line_with_the_last_checkpoint_intact(tmp_path):
    args = [sys.executable, "-m", "suite.submit", QUICKSTART, "--out", str(tmp_path), "training.epochs=1",
            "training.checkpoint_every_steps=4", "training.log_every_steps=2", "launch.tasks_per_node=2"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SCALESUITE_FAIL_AT": "1:8:disk-full"})
    assert proc.returncode == 1, proc.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (f"rank 1: SuiteError: the disk of {run_dir / 'checkpoint'} is full (or over quota): rank 1 could not "
            f"save the checkpoint of step 8; the last good checkpoint (step 4,") in err[0], err[0]
    assert f"--resume {run_dir}" in err[0]
    latest = json.loads((run_dir / "checkpoint" / "latest.json").read_text())
    assert latest["step"] == 4
    assert not list((run_dir / "checkpoint").rglob("*.tmp"))  # the half-written file is gone
    resumed = subprocess.run([sys.executable, "-m", "suite.submit", "--resume", str(run_dir)],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["attempts"][-1]["from_step"] == 4
