"""Automatic restarts (launch.max_restarts, suite/submit/restart.py) as users meet them: a run whose
rank dies is submitted again by suite.submit from its last complete checkpoint, up to N times, to
the same per-step losses as an uninterrupted run, each restart an attempt with its cause; more
failures than that, or bad input, end the run failed in one line; N=0 is the old behaviour; on
Slurm the new job leaves out the failed node where the run still fits without it."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suite.record import run_record

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)

# 2 epochs of 22 steps, a checkpoint every 4 steps: a kill loses at most 3 steps.
RUN = ["training.epochs=2", "training.checkpoint_every_steps=4", "training.log_every_steps=5"]
STEPS = 44
CAUSE = r"rank {rank} (killed by SIGKILL|died without a Python error)( after step \d+)?"  # the step once logged


def submit(out, *args, fail_at=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "SCALESUITE_FAIL_AT"}
    if fail_at:
        env["SCALESUITE_FAIL_AT"] = fail_at
    return subprocess.run([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(out),
                           *RUN, *args], capture_output=True, text=True, timeout=timeout, env=env)


def submit_here(out, *args, fail_at=None, monkeypatch=None):
    """``python -m suite.submit`` in this process (torch is imported already: a few seconds less of
    start-up on 2 cores per run); (exit code, stdout, stderr)."""
    import contextlib
    import io

    from suite.submit import cli

    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        if fail_at:
            mp.setenv("SCALESUITE_FAIL_AT", fail_at)
        else:
            mp.delenv("SCALESUITE_FAIL_AT", raising=False)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main(["recipes/quickstart.yaml", "--out", str(out), *RUN, *args])
    return subprocess.CompletedProcess(["suite.submit"], code, stdout.getvalue(), stderr.getvalue())


def restart_lines(proc) -> list[str]:
    return [ln for ln in proc.stdout.splitlines() if ln.startswith("restart ")]


def the_run(out) -> Path:
    (run_dir,) = [p.parent for p in Path(out).glob("*/recipe.yaml")]
    return run_dir


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def step_losses(run_dir) -> list:
    """Rank 0's step records in file order: each step once, in order, if the run record is right."""
    records = run_record.read_metrics(run_dir, kind="step", rank=0)
    assert [r["step"] for r in records] == list(range(len(records))), "a step is recorded twice or missing"
    return [r["global_loss"] for r in records]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    proc = submit_here(out)
    assert proc.returncode == 0, proc.stderr
    losses = step_losses(the_run(out))
    assert len(losses) == STEPS
    return losses


@st.composite
def kills(draw):
    """K kills (rank, step, attempt), one per attempt, at strictly later steps (each attempt
    resumes from a checkpoint at or before the last kill, so it reaches the next), and a
    max_restarts of at least K."""
    k = draw(st.integers(1, 2))
    steps = sorted(draw(st.sets(st.integers(1, STEPS), min_size=k, max_size=k)))
    ranks = [draw(st.integers(0, 1)) for _ in range(k)]
    return list(zip(ranks, steps, range(1, k + 1))), draw(st.integers(k, 3))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(plan=kills())
def test_a_run_whose_ranks_are_killed_restarts_to_the_losses_of_an_uninterrupted_run(uninterrupted, plan):
    killed, max_restarts = plan
    fail_at = ",".join(f"{rank}:{step}:kill@{attempt}" for rank, step, attempt in killed)
    with tempfile.TemporaryDirectory() as out:
        started = time.time()
        proc = submit_here(out, f"launch.max_restarts={max_restarts}", fail_at=fail_at)
        assert proc.returncode == 0, (fail_at, proc.stdout[-2000:], proc.stderr)
        run_dir = the_run(out)
        assert step_losses(run_dir) == uninterrupted  # exactly: the same steps on the same data and weights
        done = summary(run_dir)
        assert done["status"] == "completed" and done["steps"] == STEPS
        attempts = done["attempts"]
        assert len(attempts) == len(killed) + 1 and [a.get("restart") for a in attempts[1:]] == list(
            range(1, len(killed) + 1))
        lines = restart_lines(proc)
        assert len(lines) == len(killed), proc.stdout
        for (rank, step, _), attempt, line in zip(killed, attempts[1:], lines):
            assert re.fullmatch(CAUSE.format(rank=rank), attempt["cause"]), attempt
            assert 0 <= attempt["from_step"] <= step and "pending" not in attempt
            where = f"from checkpoint step {attempt['from_step']}" if attempt["from_step"] else "from the start"
            assert line.startswith(f"restart {attempt['restart']}/{max_restarts} {where}") and attempt["cause"] in line
        status = subprocess.run([sys.executable, "-m", "suite.status", str(run_dir)], capture_output=True, text=True)
        assert f"completed  step {STEPS}  attempt {len(killed) + 1} ({len(killed)} automatic restart" in status.stdout
        print(f"kills {fail_at}, max_restarts {max_restarts}: completed in {time.time() - started:.1f} s")


def test_more_failures_than_max_restarts_end_the_run_failed_naming_the_last_cause(tmp_path):
    # attempt 1: rank 1 raises (a crash: restarted); attempt 2: rank 1 is killed (no restart left)
    proc = submit(tmp_path, "launch.max_restarts=1", fail_at="1:6@1,1:9:kill@2")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(r"gave up after 1 automatic restart\(s\) \(launch.max_restarts=1\), last cause: "
                     r"rank 1 killed by SIGKILL after step \d+$", proc.stderr.strip()), proc.stderr
    assert "restart 1/1 from checkpoint step 4: rank 1 failed after step" in proc.stdout, proc.stdout
    run_dir = the_run(tmp_path)
    s = summary(run_dir)
    assert s["status"] == "failed" and s["failed_rank"] == 1
    assert len(s["attempts"]) == 2 and "RuntimeError: injected failure at rank 1, step 6" in s["attempts"][1]["cause"]


def test_max_restarts_0_fails_the_run_as_before(tmp_path):
    proc = submit(tmp_path, fail_at="1:5:kill")  # the default: launch.max_restarts=0
    assert proc.returncode == 1
    assert "rank 1 died without a Python error" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not restart_lines(proc) and "gave up" not in proc.stderr
    s = summary(the_run(tmp_path))
    assert s["status"] == "failed" and s["failed_rank"] == 1 and len(s["attempts"]) == 1


def test_bad_input_in_a_rank_is_never_restarted(tmp_path):
    # a disk that fills during a save is a SuiteError (one line, the fix named): a restart would repeat it
    proc = submit(tmp_path, "launch.max_restarts=2", fail_at="1:8:disk-full")
    assert proc.returncode == 1 and "is full" in proc.stderr, proc.stderr
    assert not restart_lines(proc) and "gave up" not in proc.stderr
    assert len(summary(the_run(tmp_path))["attempts"]) == 1


def test_the_restart_line_says_where_it_resumes():
    from suite.submit.restart import Restart

    assert Restart(1, 3, "rank 1 killed by SIGKILL after step 37", 30, None).line() == \
        "restart 1/3 from checkpoint step 30: rank 1 killed by SIGKILL after step 37"
    assert Restart(2, 2, "rank 0 died without a Python error", 0, None, note="excluding node n1").line() == \
        "restart 2/2 from the start (no checkpoint yet): rank 0 died without a Python error; excluding node n1"


# ---- Slurm ---------------------------------------------------------------------------------

def test_a_node_fail_restarts_without_the_nodes_slurm_reports_down_while_the_run_fits(monkeypatch, tmp_path):
    """NODE_FAIL cannot be staged on the local cluster without taking a node away from the other
    tests: Slurm's answers are given here (sacct: the job's nodes; sinfo: which are down)."""
    from types import SimpleNamespace

    from suite import recipe as recipes
    from suite.common.errors import RunFailed
    from suite.submit import restart
    from suite.submit.follow import Failure

    answers = {("sinfo", "-h", "-o", "%P"): "debug*\n",
               ("sinfo", "-h", "-N", "-o", "%N %t", "-p", "debug"): "n1 down*\nn2 idle\nn3 drain\n",
               ("sinfo", "-h", "-N", "-o", "%N %t"): "n1 down*\nn2 idle\nn3 drain\n",
               ("sacct", "-j", "7", "-X", "-n", "-P", "-o", "NodeList"): "n[1-2]\n",
               ("sinfo", "-h", "-N", "-o", "%N %t", "-n", "n[1-2]"): "n1 down*\nn2 idle\n"}
    monkeypatch.setattr(restart, "_run", lambda *cmd: answers.get(cmd))
    (recipe,) = recipes.load("recipes/quickstart.yaml", ["launch.executor=slurm", "launch.max_restarts=2"])
    run_dir = run_record.new_run_dir(recipe.name, recipes.dump(recipe), tmp_path)
    lines = []
    budget = restart.Restarts(recipe, run_dir, printer=lambda line, **_: lines.append(line))
    node_fail = SimpleNamespace(failure=Failure("the job ended as NODE_FAIL", restartable=True), job=SimpleNamespace(job_id="7"))
    first = budget.next(node_fail, RunFailed("job 7 ended as NODE_FAIL"))
    assert first.excluded == ["n1"] and first.recipe.launch.sbatch_extra == {"exclude": "n1"}
    assert lines == ["restart 1/2 from the start (no checkpoint yet): the job ended as NODE_FAIL; excluding node n1"]
    # the next failure on n2: leaving it out too would leave no usable node, so it stays in
    killed = SimpleNamespace(failure=Failure("rank 0 killed by SIGKILL", restartable=True, rank=0, node="n2"),
                             job=SimpleNamespace(job_id="8"))
    second = budget.next(killed, RunFailed("rank 0 died"))
    assert second.excluded == ["n1"] and "node n2 not excluded: the run needs 1 node(s) and 0 usable" in second.note
    attempts = run_record.recorded_attempts(run_dir)
    assert [a.get("restart") for a in attempts] == [None, 1, 2]  # the first attempt died before its ranks said so
    assert attempts[1]["excluded_nodes"] == ["n1"] and attempts[2]["cause"] == "rank 0 killed by SIGKILL"
    assert budget.next(killed, RunFailed("rank 0 died")) is None  # none left
    assert budget.gave_up(RunFailed("rank 0 died")).endswith("last cause: rank 0 killed by SIGKILL")



def slurm_jobs(run_dir) -> list[str]:
    """The run's Slurm jobs, in order of submission."""
    return sorted((p.name.split("_")[0] for p in (run_dir / "submitit").glob("*_submission.sh")), key=int)


def job_nodes(job_id) -> str:
    return subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "NodeList"], capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm here (sinfo not found); slurm/start.sh")
@pytest.mark.parametrize("shape", [["launch.tasks_per_node=2"], ["launch.nodes=2", "launch.tasks_per_node=1"]],
                         ids=["1node-x-2tasks", "2nodes-x-1task"])
def test_a_slurm_run_whose_rank_is_killed_restarts_without_the_failed_node_where_it_fits(shape, uninterrupted,
                                                                                         tmp_path):
    from suite.submit.restart import usable_nodes

    nodes = usable_nodes(None)
    if len(nodes or []) < 2:
        pytest.skip(f"the local cluster has {len(nodes or [])} usable node(s); slurm/start.sh starts 2")
    started = time.time()
    proc = submit(tmp_path, "--executor", "slurm", "launch.max_restarts=1", *shape, fail_at="1:25:kill@1",
                  timeout=300)
    took = time.time() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    run_dir = the_run(tmp_path)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["world_size"] == 2
    assert step_losses(run_dir) == pytest.approx(uninterrupted, abs=1e-6)  # as test_slurm: Slurm against local
    first, second = slurm_jobs(run_dir)
    (line,) = restart_lines(proc)
    cause = s["attempts"][1]["cause"]
    assert re.fullmatch(r"rank 1 killed by SIGKILL after step \d+", cause), cause
    # The save at step 24 is written beside training (suite.train.checkpoint) and began one step before
    # the kill: the last complete checkpoint is that one, or step 20's if its writes had not finished.
    resumed = s["attempts"][1]["from_step"]
    assert resumed in (20, 24), resumed
    assert line.startswith(f"restart 1/1 from checkpoint step {resumed}: {cause}"), line
    failed = s["attempts"][1]["failed_job_id"]
    assert failed == first
    script = (run_dir / "submitit" / f"{second}_submission.sh").read_text()
    if shape == ["launch.tasks_per_node=2"]:  # one node is enough: the failed one is left out
        node = re.search(r"; excluding node (\S+)$", line).group(1)
        assert node == job_nodes(first) and s["attempts"][1]["excluded_nodes"] == [node]
        assert f"--exclude={node}" in script and job_nodes(second) != node
    else:  # two nodes needed, two in the cluster: the node is kept, and the line says why
        assert re.search(r"; node n\d not excluded: the run needs 2 node\(s\) and 1 usable would be left", line), line
        assert "--exclude" not in script and "excluded_nodes" not in s["attempts"][1]
    print(f"{' '.join(shape)}: {line} (jobs {first} -> {second} on {job_nodes(second)}; {took:.1f} s)")
