"""Stopping and continuing runs as users do, with the default tracking (W&B offline): Ctrl-C on
suite.submit cancels a local run within 10 s and keeps its steps; --resume continues it to the same
per-step losses as an uninterrupted run; a crash in the middle of a checkpoint keeps the last good
one; two runs at once never share a rendezvous port; suite.status tells running, cancelled and lost."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suite.record import run_record
from tests.harness import interruptible, run_ranks
from tests.parity import make_recipe
from tests.train.test_resume import RESUMABLE, run_until_stopped, steps_by_number

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)

LONG = ["training.epochs=40", "training.log_every_steps=5"]  # 880 steps of ~5 ms: time to interrupt


@pytest.fixture(autouse=True)
def default_tracking(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # what users run: the recipe's offline W&B


def submit(out, *args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def the_run(out) -> Path:
    (run_dir,) = [p.parent for p in Path(out).glob("*/recipe.yaml")]
    return run_dir


def wait_for_steps(out, n, proc, timeout_s=120):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        runs = list(Path(out).glob("*/recipe.yaml"))
        if runs and len(run_record.read_metrics(runs[0].parent, kind="step", rank=0)) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"fewer than {n} steps within {timeout_s} s")


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    proc = submit(out, *LONG)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return the_run(out)


@pytest.mark.parametrize("how", ["terminal", "submit-only"])
def test_ctrl_c_cancels_the_run_keeps_its_steps_and_resume_matches_an_uninterrupted_run(how, uninterrupted, tmp_path):
    # "terminal": Ctrl-C reaches the whole foreground process group; "submit-only": kill -INT <pid>.
    proc = submit(tmp_path, *LONG, start_new_session=True, preexec_fn=interruptible)
    wait_for_steps(tmp_path, 40, proc)
    interrupted = time.time()
    if how == "terminal":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert time.time() - interrupted < 10, "the ranks did not stop within 10 s"
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume" in err, err
    run_dir = the_run(tmp_path)
    s = summary(run_dir)
    assert s["status"] == "cancelled" and s["steps"] >= 40
    assert len(run_record.read_metrics(run_dir, kind="step", rank=0)) >= s["steps"]  # steps so far kept
    time.sleep(1)
    assert subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True).returncode == 1, "ranks left running"

    resumed = subprocess.run([sys.executable, "-m", "suite.submit", "--resume", str(run_dir)],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"from its checkpoint at step {s['steps']}" in resumed.stdout
    done = summary(run_dir)
    assert done["status"] == "completed" and [a["from_step"] for a in done["attempts"]] == [0, s["steps"]]
    steps = run_record.read_metrics(run_dir, kind="step", rank=0)
    assert [r["step"] for r in steps] == list(range(done["steps"])), "a step is recorded twice or missing"
    assert [r["global_loss"] for r in steps] == steps_by_number(uninterrupted)  # exactly
    assert done["final"] == summary(uninterrupted)["final"]


def test_a_killed_submit_does_not_leave_the_ranks_training_unwatched(tmp_path):
    proc = submit(tmp_path, *LONG)
    wait_for_steps(tmp_path, 20, proc)
    proc.kill()  # kill -9: nothing of suite.submit runs any more
    proc.communicate()
    run_dir = the_run(tmp_path)
    deadline = time.time() + 20
    while time.time() < deadline and summary(run_dir)["status"] == "running":
        time.sleep(0.5)
    assert summary(run_dir)["status"] == "cancelled"
    status = subprocess.run([sys.executable, "-m", "suite.status", str(tmp_path)], capture_output=True, text=True)
    assert f"{run_dir.name}  cancelled" in status.stdout


def test_a_crash_in_the_middle_of_a_checkpoint_keeps_the_last_good_one(tmp_path, monkeypatch):
    recipe = make_recipe({"name": "ddp"}, world_size=2, **{**RESUMABLE, "training": {
        **RESUMABLE["training"], "checkpoint_every_steps": 4}})
    whole = tmp_path / "whole"
    whole.mkdir()
    assert run_ranks(run_until_stopped, 2, recipe, whole) == ["completed"] * 2
    cut = tmp_path / "cut"
    cut.mkdir()
    monkeypatch.setenv("SCALESUITE_FAIL_AT", "1:8:kill-in-save")  # SIGKILL while saving step 8
    with pytest.raises(AssertionError, match="died|raised"):  # rank 1 killed; rank 0 loses its peer
        run_ranks(run_until_stopped, 2, recipe, cut)
    assert run_record.latest_checkpoint(cut)["step"] == 4
    monkeypatch.delenv("SCALESUITE_FAIL_AT")
    assert run_ranks(run_until_stopped, 2, recipe, cut) == ["completed"] * 2
    assert steps_by_number(cut) == steps_by_number(whole)
    kept = [p.name for p in (cut / "checkpoint").iterdir() if p.is_dir()]
    assert kept == [run_record.latest_checkpoint(cut)["folder"]]  # older checkpoints are removed


def test_a_master_port_exported_in_the_shell_is_not_shared_by_two_runs_at_once(tmp_path):
    env = {**os.environ, "MASTER_PORT": "29533"}
    procs = [submit(tmp_path / str(i), "training.epochs=3", env=env) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err


def test_status_calls_a_run_whose_processes_are_gone_lost(tmp_path):
    run_dir = run_record.new_run_dir("gone", "name: gone\n", tmp_path)
    run_record.update_summary(run_dir, status="running", name="gone")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run_dir / "ranks").mkdir()
    run_record.write_json_atomic(run_dir / "ranks" / "rank0.json",
                                 {"rank": 0, "pid": dead.pid, "host": os.uname().nodename, "started_at": time.time()})
    out = subprocess.run([sys.executable, "-m", "suite.status", str(run_dir)], capture_output=True, text=True)
    assert out.returncode == 0 and f"{run_dir.name}  lost" in out.stdout and "--resume" in out.stdout
