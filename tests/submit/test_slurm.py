"""Runs through a real Slurm (the local cluster .ci/run starts with slurm/start.sh): multi-task and
multi-node runs, preemption with requeue and exact resume, job arrays, cancelled jobs."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suite.record.run_record import read_metrics

pytestmark = pytest.mark.skipif(shutil.which("sinfo") is None,
                                reason="no Slurm here (sinfo not found); .ci/run starts a local cluster")
pytestmark = [pytestmark, pytest.mark.slow]  # and slow: every test here launches runs (docs/contributing.md)

SHORT = ["training.epochs=2"]


# What users run: the recipe's own tracking (W&B offline), not the tests' WANDB_MODE=disabled.
DEFAULT_TRACKING = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}


def submit(out, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, env=DEFAULT_TRACKING)


def start(out, *args):
    return subprocess.Popen([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=DEFAULT_TRACKING)


def runs(out):
    if not Path(out).is_dir():
        return []
    return sorted(p for p in Path(out).iterdir() if p.is_dir() and (p / "summary.json").exists())


def losses(run_dir):
    latest = {}
    for rec in read_metrics(run_dir, kind="step", rank=0):  # a later attempt's line wins
        latest[rec["step"]] = rec["global_loss"]
    return [latest[k] for k in sorted(latest)]


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def job_id(text):
    return re.search(r"job (\d+)", text).group(1)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    proc = submit(out, *SHORT)
    assert proc.returncode == 0, proc.stderr
    return runs(out)[0]


@pytest.mark.parametrize("shape", [["launch.tasks_per_node=2"], ["launch.nodes=2", "launch.tasks_per_node=1"]],
                         ids=["1node-x-2tasks", "2nodes-x-1task"])
def test_slurm_run_matches_the_local_executor(shape, local_run, tmp_path):
    proc = submit(tmp_path, "--executor", "slurm", *SHORT, *shape)
    assert proc.returncode == 0, proc.stderr
    assert "RUNNING" in proc.stdout and "COMPLETED" in proc.stdout
    (run_dir,) = runs(tmp_path)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["world_size"] == 2
    assert {r["rank"] for r in s["ranks"]} == {0, 1}
    assert losses(run_dir) == pytest.approx(losses(local_run), abs=1e-6)
    assert s["final"]["val_loss"] == pytest.approx(summary(local_run)["final"]["val_loss"], abs=1e-6)


def test_preempted_job_requeues_and_resumes_to_the_same_losses(tmp_path):
    longer = ["training.epochs=12", "training.log_every_steps=5"]
    whole = tmp_path / "whole"
    proc = submit(whole, *longer)
    assert proc.returncode == 0, proc.stderr

    cut = tmp_path / "cut"
    job = start(cut, "--executor", "slurm", *longer)
    deadline = time.time() + 180
    while time.time() < deadline:  # wait until the job is well into training
        done = runs(cut) and len(read_metrics(runs(cut)[0], kind="step", rank=0)) >= 40
        if done:
            break
        time.sleep(0.5)
    else:
        job.kill()
        pytest.fail("the Slurm job did not start training within 180 s")
    (run_dir,) = runs(cut)
    jid = summary_job_id(run_dir)
    subprocess.run(["scancel", "--signal=USR2", jid], check=True)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    s = summary(run_dir)
    assert s["status"] == "completed"
    assert len(s["attempts"]) == 2 and s["attempts"][1]["slurm_restart_count"] == 1
    assert 0 < s["attempts"][1]["from_step"] < s["steps"]
    (reference,) = runs(whole)
    assert losses(run_dir) == losses(reference)  # exactly
    assert s["final"] == summary(reference)["final"]


def summary_job_id(run_dir):
    names = [p.name for p in (run_dir / "submitit").glob("*_submitted.pkl")]
    return names[0].split("_")[0]


def test_a_sweep_runs_as_a_job_array(tmp_path):
    recipe = tmp_path / "sweep.yaml"
    recipe.write_text(Path("recipes/quickstart.yaml").read_text() + "sweep:\n  training.seed: [0, 1]\n")
    proc = subprocess.run([sys.executable, "-m", "suite.submit", str(recipe), "--out", str(tmp_path / "runs"),
                           "--executor", "slurm", *SHORT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ids = re.findall(r"job (\d+_\d+)", proc.stdout)
    assert len(ids) == 2 and len({i.split("_")[0] for i in ids}) == 1  # one array, two tasks
    done = runs(tmp_path / "runs")
    assert len(done) == 2 and all(summary(r)["status"] == "completed" for r in done)
    assert losses(done[0]) != losses(done[1])  # the seeds differ


def test_a_cancelled_job_fails_the_command_promptly_naming_the_job(tmp_path):
    job = start(tmp_path, "--executor", "slurm", "training.epochs=400")
    deadline = time.time() + 180
    while time.time() < deadline and not (runs(tmp_path) and read_metrics(runs(tmp_path)[0], kind="step")):
        time.sleep(0.5)
    (run_dir,) = runs(tmp_path)
    jid = summary_job_id(run_dir)
    cancelled = time.time()
    subprocess.run(["scancel", jid], check=True)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 1
    assert f"job {jid}" in err and "CANCELLED" in err, err
    assert "Traceback" not in err
    assert time.time() - cancelled < 90
    assert summary(run_dir)["status"] == "failed"


def test_a_job_that_can_never_start_fails_within_a_minute_with_slurms_reason(tmp_path):
    """64 CPUs per task on nodes that have far fewer: Slurm keeps the job pending for ever
    (Reason=PartitionConfig). The follower names the reason and cancels the job."""
    from suite import recipe as recipes
    from suite.common.errors import RunFailed
    from suite.record import run_record
    from suite.submit import follow, launch

    (recipe,) = recipes.load("recipes/quickstart.yaml", ["launch.executor=slurm", "launch.cpus_per_task=64"])
    run_dir = run_record.new_run_dir(recipe.name, recipes.dump(recipe), tmp_path)
    (job,) = launch.submit([(recipe, run_dir)])
    watch = follow.Watch(job, run_dir, recipe.training.epochs, printer=lambda *_: None)
    started = time.time()
    while not watch.poll():
        assert time.time() - started < 60, f"still waiting after 60 s (state {watch.state})"
        time.sleep(1)
    with pytest.raises(RunFailed, match="cannot start: Slurm gives the reason PartitionConfig"):
        watch.outcome()
    assert summary(run_dir)["status"] == "failed"
    deadline = time.time() + 30
    while time.time() < deadline and subprocess.run(["squeue", "-h", "-j", job.job_id], capture_output=True,
                                                    text=True).stdout.strip():
        time.sleep(1)
    assert not subprocess.run(["squeue", "-h", "-j", job.job_id], capture_output=True, text=True).stdout.strip()


def _held_two_node_job(tmp_path):
    """A 2-node quickstart job submitted on hold: its id (and so its rendezvous ports) is known
    before any rank starts."""
    from suite import recipe as recipes
    from suite.record import run_record
    from suite.submit import launch

    (recipe,) = recipes.load("recipes/quickstart.yaml", ["launch.executor=slurm", "launch.nodes=2",
                                                         "launch.tasks_per_node=1", "training.epochs=1"])
    recipe = recipe.model_copy(update={"launch": recipe.launch.model_copy(update={"sbatch_extra": {"hold": True}})})
    run_dir = run_record.new_run_dir(recipe.name, recipes.dump(recipe), tmp_path)
    (job,) = launch.submit([(recipe, run_dir)])
    return recipe, run_dir, job


def _occupy(ports):
    import socket

    held = []
    for port in ports:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))  # n1 is this machine (slurm/README.md)
        s.listen(4)
        held.append(s)
    return held


def _follow(job, run_dir, recipe, limit_s):
    from suite.submit import follow

    watch = follow.Watch(job, run_dir, recipe.training.epochs, printer=lambda *_: None)
    subprocess.run(["scontrol", "release", job.job_id], check=True)
    started = time.time()
    while not watch.poll():
        assert time.time() - started < limit_s, f"still waiting after {limit_s} s (state {watch.state})"
        time.sleep(0.5)
    return watch, time.time() - started


def test_a_taken_rendezvous_port_moves_rank_0_to_the_next_and_the_job_completes(tmp_path):
    from suite.common import ports as portlib

    recipe, run_dir, job = _held_two_node_job(tmp_path)
    first, second = portlib.candidate_ports(job.job_id)[:2]
    held = _occupy([first])
    try:
        watch, took_s = _follow(job, run_dir, recipe, 120)
        assert watch.outcome()["status"] == "completed"
    finally:
        for s in held:
            s.close()
    assert f"taken; listening on {second}" in job.task(0).stdout()
    print(f"occupied port {first}: rank 0 listened on {second}; the job completed {took_s:.1f} s after release")


def test_every_rendezvous_port_taken_ends_the_job_within_60_s_naming_rank_0_and_the_ports(tmp_path):
    from suite.common.errors import RunFailed
    from suite.common import ports as portlib

    recipe, run_dir, job = _held_two_node_job(tmp_path)
    ports = portlib.candidate_ports(job.job_id)
    held = _occupy(ports)
    try:
        watch, took_s = _follow(job, run_dir, recipe, 60)
        with pytest.raises(RunFailed) as failed:
            watch.outcome()
    finally:
        for s in held:
            s.close()
    message = str(failed.value)
    assert "\n" not in message and "failed: rank 0: SuiteError: rank 0 found every rendezvous port taken" in message, message
    assert "died without a Python error" not in message, message  # rank 1 was ended by srun, not a cause
    assert str(ports[0]) in message
    print(f"every port taken: the job ended {took_s:.1f} s after release: {message}")
