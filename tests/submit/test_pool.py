"""Local runs train in warm ranks (suite/submit/pool.py): the points of a sweep run one after another
in the same rank processes, each with its own run folder and record, and learn exactly as they do
when run alone; a strategy that keeps process-wide state, or a point that fails, gets new ranks for
the points after it. Runs with the recipe's own tracking (W&B offline), as users run it."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from suite.strategies import STRATEGIES
from tests.parity import step_losses_of
from tests.run_folders import in_order, rank_pids

DEFAULT_TRACKING = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
SHORT = ["training.max_steps=5", "training.log_every_steps=1"]


def submit(out: Path, *args, recipe="recipes/quickstart.yaml", timeout=300):
    return subprocess.run([sys.executable, "-m", "suite.submit", recipe, "--out", str(out), *SHORT, *args],
                          capture_output=True, text=True, timeout=timeout, env=DEFAULT_TRACKING)


def status(run_dir: Path) -> str | None:
    """The run's status, or None before its summary is written (a --no-wait run still training)."""
    path = run_dir / "summary.json"
    return json.loads(path.read_text())["status"] if path.exists() else None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sweeps_points_run_in_the_same_warm_ranks_and_learn_as_when_run_alone(tmp_path):
    proc = submit(tmp_path / "sweep", "sweep.training.seed=[3,4,5]")
    assert proc.returncode == 0, proc.stderr
    points = in_order(tmp_path / "sweep")
    assert len(points) == 3 and all(status(p) == "completed" for p in points)
    assert len({tuple(rank_pids(p)) for p in points}) == 1, "every point should reuse the same two rank processes"
    assert len(set(rank_pids(points[0]))) == 2

    alone = submit(tmp_path / "alone", "training.seed=5")
    assert alone.returncode == 0, alone.stderr
    (single_run,) = in_order(tmp_path / "alone")
    (seed5,) = [p for p in points if yaml.safe_load((p / "recipe.yaml").read_text())["training"]["seed"] == 5]
    # Nothing of the earlier points (RNG, process group, optimizer) leaks into the last one.
    assert step_losses_of(seed5) == step_losses_of(single_run) and len(step_losses_of(single_run)) == 5
    assert set(rank_pids(single_run)).isdisjoint(rank_pids(seed5))


@pytest.mark.slow
def test_after_a_strategy_with_process_wide_state_the_next_point_gets_new_ranks(tmp_path):
    assert not STRATEGIES["zero"].Options.reusable_process  # DeepSpeed keeps module-level state
    proc = submit(tmp_path, "sweep.strategy.name=[zero,ddp]", "training.max_steps=3")
    assert proc.returncode == 0, proc.stderr
    zero, ddp = in_order(tmp_path)
    assert json.loads((zero / "summary.json").read_text())["strategy"] == "zero"
    assert status(zero) == status(ddp) == "completed"
    assert set(rank_pids(zero)).isdisjoint(rank_pids(ddp))


@pytest.mark.slow
def test_a_point_that_asks_a_process_for_other_fixed_settings_gets_new_ranks(tmp_path):
    """TensorFlow fixes its threads and logical devices when it starts: a TF point after one with
    other settings goes to a new pool, one with the same settings (or a torch point) to this one."""
    from types import SimpleNamespace

    from suite.recipe import validate
    from suite.submit.pool import _SHAPE, Pool

    def recipe(strategy: dict):
        return validate({"name": "p", "model": {"name": "mlp", "hidden": [8]}, "data": {"name": "digits"},
                         "training": {"epochs": 1, "batch_size": 32}, "strategy": strategy,
                         "launch": {"executor": "local", "tasks_per_node": 1}})

    mirrored = recipe({"name": "tf_mirrored"})
    shape = {k: mirrored.launch.model_dump()[k] for k in _SHAPE}
    pool = Pool(SimpleNamespace(state="RUNNING"), tmp_path / "submitit" / "points", shape, timeout_min=10**6)
    pool.points.mkdir(parents=True)
    (tmp_path / "run0").mkdir()
    pool.hand_over(mirrored, tmp_path / "run0")
    assert pool.open and pool.state == mirrored.strategy.process_state(mirrored.launch)
    assert pool.takes(recipe({"name": "tf_mirrored_loop"}))  # the same 2 logical devices
    assert pool.takes(recipe({"name": "single"}))  # torch fixes nothing
    assert not pool.takes(recipe({"name": "tf_mirrored", "cpu_replicas": 4}))
    assert not pool.takes(recipe({"name": "tf_single"}))  # 1 device
    assert not STRATEGIES["tf_multiworker"].Options.reusable_process  # its cluster is set once per process


FAULTY = '''
import torch
from torch import nn


def build(spec, fail: bool = False):
    # Raises only when building for training, not on the meta device the checks build on.
    if fail and torch.empty(0).device.type != "meta":
        raise RuntimeError("planted failure in the model factory")
    return nn.Sequential(nn.Flatten(), nn.Linear(64, spec.num_classes))
'''


@pytest.mark.slow
def test_a_failed_point_ends_its_ranks_and_the_points_after_it_still_run(tmp_path):
    (tmp_path / "faulty_nets.py").write_text(FAULTY)
    recipe = yaml.safe_load(open("recipes/quickstart.yaml"))
    recipe["model"] = {"name": "custom", "target": "faulty_nets:build", "pythonpath": [str(tmp_path)]}
    recipe["sweep"] = {"model.kwargs.fail": [False, True, False]}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    proc = submit(tmp_path / "out", recipe=str(path))
    assert proc.returncode == 1, proc.stderr
    assert "planted failure" in proc.stdout + proc.stderr
    first, failed, last = in_order(tmp_path / "out")
    assert [status(first), status(failed), status(last)] == ["completed", "failed", "completed"]
    assert set(rank_pids(last)).isdisjoint(rank_pids(failed))


def test_every_strategy_declares_warm_imports_that_exist():
    for name, module in STRATEGIES.items():
        for warm in module.Options.warm_imports:
            assert importlib.util.find_spec(warm) is not None, (name, warm)


@pytest.mark.slow
def test_polls_slow_down_while_ranks_train_and_a_stand_in_waits_without_polling():
    """The submitter polls every 50 ms at first (a short sweep point ends promptly), then backs
    off to 0.5 s; a stand-in blocks on its rank's pidfd and still runs its signal handlers."""
    import signal
    import threading
    import time

    from suite.submit.follow import SLOWEST_POLL_S, poll_interval_s
    from suite.tasks.pool import wait_for_exit

    assert poll_interval_s(0.05, 0.0) == 0.05
    assert poll_interval_s(0.05, 4.0) == pytest.approx(0.2)
    assert poll_interval_s(0.05, 60.0) == SLOWEST_POLL_S

    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        started, cpu = time.monotonic(), time.process_time()
        wait_for_exit(rank.pid)
        assert 1.0 < time.monotonic() - started < 10  # it waited for the exit, no longer
        assert time.process_time() - cpu < 0.1  # without polling
        assert got == [signal.SIGUSR1]  # the handler ran while it waited
    finally:
        signal.signal(signal.SIGUSR1, previous)
        rank.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["warm ranks", "--no-wait"])
def test_local_ranks_each_lead_a_session_of_their_own_as_torchruns_workers_do(how, tmp_path):
    """Linux's autogroup scheduler groups a session's processes; ranks left in the submitting
    shell's session stepped 7 % slower (suite.tasks.train.own_session). Both ways local ranks
    start: the pool's (task 0 and the ranks it forks) and one submitit task per rank (--no-wait).
    Either way submitit's local controller writes to the run's controller.log, not to the
    command's own output: a caller that reads that output to its end (suite.verify) would
    otherwise wait for the ranks' exit, about a second after every run (suite.submit.launch)."""
    import time

    args = ["training.max_steps=400", "training.log_every_steps=50"]
    if how == "--no-wait":
        args.append("--no-wait")
    proc = subprocess.Popen([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(tmp_path),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, sessions, outputs = time.time() + 120, None, None
    while time.time() < deadline and sessions is None:
        pids = [pid for ranks in tmp_path.glob("*/ranks") for pid in rank_pids(ranks.parent)]
        if len(pids) == 2:
            sessions = {pid: os.getsid(pid) for pid in pids}  # the ranks still train: 400 steps
            (job,) = tmp_path.glob("*/job.json")  # a local job's id is its controller's pid
            controller = json.loads(job.read_text())["job_id"]
            outputs = [os.readlink(f"/proc/{controller}/fd/{fd}") for fd in (1, 2)]
        time.sleep(0.05)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert sessions is not None, "no two rank records within 120 s"
    assert all(sid == pid for pid, sid in sessions.items()), sessions
    (run_dir,) = [p.parent for p in tmp_path.glob("*/recipe.yaml")]
    assert outputs == [str(run_dir / "submitit" / "controller.log")] * 2
    while how == "--no-wait" and time.time() < deadline + 60 and status(run_dir) != "completed":
        time.sleep(0.2)
    assert status(run_dir) == "completed"
