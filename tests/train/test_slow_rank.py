"""A rank slowed on purpose (launch.rank_cpu: cgroup v1's CPU quota): the run record shows each rank's
compute and collective time and its quota, names the straggler, and training.balance=speed gives
the slow rank the smaller share. Needs root and cgroup v1's cpu controller (this CI machine has
both); skipped, saying so, elsewhere."""
import json
import os

import pytest

from analysis import ranks as rank_times
from analysis.runs import load_all
from suite import recipe as recipes
from suite.common import cpu_cap
from suite.train import balance
from tests.parity import make_recipe, step_losses

pytestmark = pytest.mark.skipif(not (cpu_cap.CPU_ROOT / "cpu.cfs_quota_us").exists() or os.geteuid() != 0,
                                reason="needs root and cgroup v1's cpu controller at /sys/fs/cgroup/cpu")
pytestmark = [pytestmark, pytest.mark.slow]  # and slow: every test here launches runs (docs/contributing.md)


def slow_recipe(**training):
    """An MLP whose steps take a few ms on one thread, so 60 steps span many 100 ms CFS periods."""
    return make_recipe({"name": "ddp"}, world_size=2, precision="fp32", model={"name": "mlp", "hidden": [512, 512]},
                       data={"name": "synthetic", "shape": [1, 32, 32], "classes": 10, "n_train": 8192, "n_val": 64},
                       training={"epochs": 1, "max_steps": 60, "batch_size": 64, "seed": 1, "log_every_steps": 20,
                                 **training},
                       launch={"rank_cpu": ["100%", "25%"], "cpus_per_task": 1}, tracking={"wandb": "disabled"})


def test_a_capped_rank_is_named_the_straggler(tmp_path):
    recipe = slow_recipe()
    step_losses(recipe, tmp_path)
    (tmp_path / "recipe.yaml").write_text(recipes.dump(recipe))  # a submitted run's folder has it
    summary = json.loads((tmp_path / "summary.json").read_text())
    fast, slow = summary["ranks"]
    assert fast.get("cpu_quota") is None and slow["cpu_quota"] == pytest.approx(0.25)
    assert slow["compute_s"] > fast["compute_s"] and fast["collective_s"] > 0
    assert summary["straggler"]["rank"] == 1
    runs, skipped = load_all([str(tmp_path)])
    assert not skipped, skipped
    rows = rank_times.rows(runs)
    assert [r["straggler"] for r in rows] == ["", "straggler"]
    assert "rank 1 is the straggler" in rank_times.stragglers(runs)[0]
    pid = json.loads((tmp_path / "ranks" / "rank1.json").read_text())["pid"]
    assert not (cpu_cap.CPU_ROOT / cpu_cap.GROUPS / f"rank1-{pid}").exists()  # the rank removed its group


def test_speed_balance_gives_the_capped_rank_the_smaller_share(tmp_path, monkeypatch):
    monkeypatch.setattr(balance, "MEASURE_S", 0.3)  # three CFS periods: enough to tell 25% from the rest
    step_losses(slow_recipe(balance="speed"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    fast_speed, slow_speed = summary["balance"]["samples_per_s"]
    assert slow_speed < fast_speed and summary["balance"]["shares"][0] > summary["balance"]["shares"][1]
    assert [r["batch_share"] for r in summary["ranks"]] == summary["balance"]["shares"]
