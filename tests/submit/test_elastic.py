"""launch.elastic on the local Slurm: a node taken away mid-run (its slurmd killed, Slurm told it is
DOWN) ends the job NODE_FAIL (or Slurm requeues it, and the follower gives it up after
elastic_wait_s); the lost node does not come back within elastic_wait_s, so the restart continues
on the node left with twice the accumulation steps: the global batch, and so the per-step
losses, equal single's (float64)."""
import json
import os
import signal
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from suite import recipe as recipes
from suite.record import run_record
from tests.parity import make_recipe, tolerance

pytestmark = pytest.mark.skipif(shutil.which("sinfo") is None,
                                reason="no Slurm here (sinfo not found); .ci/run starts a local cluster")

SECTIONS = dict(training={"epochs": 1, "batch_size": 16, "seed": 2, "log_every_steps": 2, "checkpoint_every_steps": 4},
                data={"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 256, "n_val": 32})
PAUSE_AT = 9  # rank 0 stops here in the first attempt (the checkpoint of step 8 is saved): the node goes meanwhile


def _node_pid(node: str) -> int:
    return int(Path(f"/run/slurmd-{node}.pid").read_text().strip())


def _job_processes(job_id: str, node: str) -> list[int]:
    """The processes of ``job_id``'s step on ``node`` (left running when its slurmd is killed)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in env and f"SLURMD_NODENAME={node}".encode() in env:
            found.append(int(proc.name))
    return found


def _take_node_away(node: str, job_id: str) -> bool:
    """As a node that dies: its slurmd goes, Slurm marks it DOWN (the job ends NODE_FAIL or is
    requeued), and only then its processes go (killed first, srun would see a task killed)."""
    os.kill(_node_pid(node), signal.SIGKILL)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test_elastic"], check=True)
    deadline = time.time() + 30
    while time.time() < deadline and subprocess.run(["squeue", "-h", "-j", job_id, "-t", "RUNNING", "-o", "%i"],
                                                    capture_output=True, text=True).stdout.strip():
        time.sleep(0.2)
    ended_by_slurm = not subprocess.run(["squeue", "-h", "-j", job_id, "-t", "RUNNING", "-o", "%i"],
                                        capture_output=True, text=True).stdout.strip()
    for pid in _job_processes(job_id, node):  # the orphans of the dead slurmd
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return ended_by_slurm


def _bring_back(node: str) -> None:
    subprocess.run(["bash", "slurm/start.sh"], capture_output=True, text=True, timeout=120)
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)


def _slurm_state() -> str:
    """What Slurm says of its nodes and jobs, for a failure's message."""
    out = []
    for cmd in (["sinfo", "-N", "-o", "%N %t %E"], ["squeue", "-o", "%i %T %R %N"],
                ["sacct", "-X", "-n", "-o", "JobID,State,NodeList,ExitCode", "-S", "now-10minutes"]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        out.append("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    return "\n".join(out)


def _submit(path: Path, out: Path) -> subprocess.Popen:
    """suite.submit of the recipe at ``path``, its first attempt pausing at PAUSE_AT."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # as users run it: W&B offline
    env["SCALESUITE_FAIL_AT"] = f"0:{PAUSE_AT}:pause@1"
    return subprocess.Popen([sys.executable, "-m", "suite.submit", str(path), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _paused(out: Path, prefix: str, proc, deadline: float) -> Path | None:
    """The run folder once its checkpoint before the pause is saved (None: never by ``deadline``)."""
    while time.time() < deadline and proc.poll() is None:
        runs = [p for p in out.glob(f"{prefix}-*") if (p / "checkpoint" / "latest.json").exists()]
        if runs and json.loads((runs[0] / "checkpoint" / "latest.json").read_text())["step"] >= PAUSE_AT - 1:
            return runs[0]
        time.sleep(0.5)
    return None


def _finish(proc, until: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=max(10.0, until - time.time()))
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        pytest.fail(f"suite.submit still running; its output:\n{stdout[-3000:]}{stderr[-3000:]}\n{_slurm_state()}")


def _losses(run_dir):
    latest = {}
    for rec in run_record.read_metrics(run_dir, kind="step", rank=0):  # a later attempt's line wins
        latest[rec["step"]] = rec["global_loss"]
    return [latest[k] for k in sorted(latest)]


@pytest.mark.slow
@pytest.mark.parametrize("elastic", [True, False])
def test_a_lost_node_mid_run_ends_with_singles_losses(elastic, tmp_path, baseline_of):
    """Without elastic the restart keeps the node (the run needs both) and waits for it: brought
    back after the restart, the run finishes on both nodes, with the same losses."""
    if len(subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()) < 2:
        pytest.fail("the local Slurm has fewer than 2 nodes; start it with bash slurm/start.sh")
    recipe = make_recipe({"name": "ddp"}, **SECTIONS)
    raw = yaml.safe_load(recipes.dump(recipe))
    raw["name"] = "elastic"
    raw["launch"] = {**raw["launch"], "executor": "slurm", "nodes": 2, "tasks_per_node": 1, "max_restarts": 1,
                     "elastic": elastic, "elastic_wait_s": 3}
    path = tmp_path / "elastic.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "runs"
    proc = _submit(path, out)
    lost, started = None, time.time()
    try:
        deadline = started + 180
        paused = _paused(out, "elastic", proc, deadline)
        assert paused, "the run never reached its pause with a checkpoint"
        lost = "n2"  # rank 1's: the run asks for both nodes
        _take_node_away(lost, run_record.read_job(paused)["job_id"])
        while not elastic and time.time() < deadline and len(run_record.recorded_attempts(paused)) < 2:
            time.sleep(0.5)  # the restart is submitted, and waits for the node
        if not elastic:
            _bring_back(lost)
        stdout, stderr = _finish(proc, started + 270)
    finally:
        if proc.poll() is None:
            proc.kill()
        if lost:
            _bring_back(lost)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    (run_dir,) = out.glob("elastic-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    second = summary["attempts"][-1]
    # Slurm ends the job NODE_FAIL, or (a batch job it may requeue) puts it back to pending: either way lost.
    cause = summary["attempts"][1]["cause"]
    # The staging then kills the dead node's orphaned task (a real node's go with it), and the
    # follower may see that rank die before it polls Slurm's state, whether or not Slurm had ended
    # the job by then (seen in CI with the job already requeued): then the cause is the killed rank.
    # The follower cancels the old job either way (follow.Watch.outcome).
    assert "NODE_FAIL" in cause or "requeued" in cause or "killed" in cause, summary["attempts"]
    if elastic:
        assert "continuing on 1 of 2 node(s) (launch.elastic) with training.grad_accumulation=2" in stdout, stdout
        assert second.get("world_size") == 1 and summary["attempts"][1]["excluded_nodes"] == ["n2"]
    else:
        assert "node n2 not excluded: the run needs 2 node(s) and 1 usable would be left" in stdout, stdout
        assert second.get("world_size") == 2 and "excluded_nodes" not in summary["attempts"][1]
    single = baseline_of(make_recipe({"name": "single"}, **SECTIONS))
    got = _losses(run_dir)
    assert len(got) == len(single.losses)
    assert max(abs(a - b) for a, b in zip(got, single.losses)) <= tolerance(recipe), (got, single.losses)


class _RequeuedJob:
    """A Slurm job as the follower sees it: running on n[1-2], then back to pending (requeued)."""
    job_id, num_tasks, local = "77", 2, False

    def __init__(self):
        self.states, self.cancelled = ["RUNNING", "REQUEUED", "PENDING"], False  # seen as Slurm reports it

    def get_info(self, mode="force"):
        return {"State": self.states[0] if len(self.states) == 1 else self.states.pop(0)}

    def cancel(self, check=False):
        self.cancelled = True

    def task(self, k):
        return type("T", (), {"paths": type("P", (), {"stdout": Path("/nonexistent")})()})()


@pytest.mark.slow
def test_a_job_slurm_requeued_after_a_node_failed_is_given_up_after_elastic_wait_s(tmp_path, monkeypatch):
    from suite.common.errors import RunFailed
    from suite.submit import follow, restart

    monkeypatch.setattr(follow, "squeue", lambda job, field: "n[1-2]" if field == "%N" else "BeginTime")
    job = _RequeuedJob()
    watch = follow.Watch(job, tmp_path, 1, printer=lambda *a, **k: None, state_every_s=0, requeue_wait_s=0.2)
    assert not watch.poll()  # running
    assert not watch.poll()  # requeued
    assert not watch.poll()  # pending again: waiting for the node
    time.sleep(0.3)
    assert watch.poll() and job.cancelled  # given up after elastic_wait_s
    with pytest.raises(RunFailed, match="Slurm requeued the job after its node.s. n\\[1-2\\] failed"):
        watch.outcome()
    assert watch.failure.restartable and watch.failure.waited_s >= 0.2
    # The nodes to leave out: those of its list that Slurm now reports down.
    monkeypatch.setattr(restart, "_run", lambda *cmd: "n1 idle\nn2 down*\n" if cmd[0] == "sinfo" else None)
    assert restart._failed_nodes(watch.failure, "77") == ["n2"]


class _NodeFailedJob(_RequeuedJob):
    """A Slurm job that ran and ended NODE_FAIL (which Slurm may still requeue: JobRequeue)."""

    def __init__(self):
        super().__init__()
        self.states = ["RUNNING", "NODE_FAIL"]

    def task(self, k):
        none = Path("/nonexistent")
        paths = type("P", (), {"stdout": none, "stderr": none, "result_pickle": none, "folder": none})()
        return type("T", (), {"paths": paths})()


class _TaskKilledJob(_NodeFailedJob):
    """A Slurm job whose rank 1 was killed (its node lost), seen by the follower before Slurm's
    NODE_FAIL: the job ends FAILED, rank 1 leaves no word, rank 0 records its peer's loss."""

    def __init__(self):
        super().__init__()
        self.states = ["RUNNING", "FAILED"]


@pytest.mark.slow
@pytest.mark.parametrize("job, cause", [(_NodeFailedJob, "NODE_FAIL"), (_TaskKilledJob, "rank 1 died")])
def test_a_job_ended_by_a_node_failure_is_cancelled_so_slurm_cannot_run_it_again(job, cause, tmp_path, monkeypatch):
    """Seen in CI: the follower restarted a NODE_FAIL job as a new job, and Slurm requeued the old
    one and ran it again once the node was back, appending a third attempt to the finished run.
    Seen again where the follower saw the lost node's killed task before Slurm's NODE_FAIL: the
    old attempt ran again beside the restart. Either way the job is cancelled."""
    from suite.common.errors import RunFailed
    from suite.submit import follow

    monkeypatch.setattr(follow, "squeue", lambda job, field: "n[1-2]" if field == "%N" else "")
    if job is _TaskKilledJob:
        run_record.record_error(tmp_path, 0, "RuntimeError: Connection closed by peer")
    job = job()
    watch = follow.Watch(job, tmp_path, 1, printer=lambda *a, **k: None, state_every_s=0)
    while not watch.poll():
        pass
    with pytest.raises(RunFailed, match=cause):
        watch.outcome()
    assert watch.failure.restartable and job.cancelled


@pytest.mark.slow
def test_a_requeued_job_squeue_never_listed_is_given_the_nodes_its_ranks_recorded(tmp_path, monkeypatch):
    """squeue may not list a job's nodes when the follower first sees it running, and sacct shows a
    requeued job's NodeList as "None assigned": the nodes its ranks recorded stand in."""
    from suite.common.errors import RunFailed
    from suite.submit import follow, restart

    monkeypatch.setattr(follow, "squeue", lambda job, field: "" if field == "%N" else "BeginTime")
    job = _RequeuedJob()
    watch = follow.Watch(job, tmp_path, 1, printer=lambda *a, **k: None, state_every_s=0, requeue_wait_s=0.0)
    for rank, node in enumerate(("n1", "n2")):
        monkeypatch.setenv("SLURMD_NODENAME", node)
        run_record.record_rank_process(tmp_path, rank)
    while not watch.poll():
        pass
    with pytest.raises(RunFailed):
        watch.outcome()
    assert watch.failure.job_nodes == "n1,n2"
    monkeypatch.setattr(restart, "_run", lambda *cmd: "n1 idle\nn2 down*\n" if cmd[0] == "sinfo" else None)
    assert restart._failed_nodes(watch.failure, "77") == ["n2"]


@pytest.mark.slow
def test_an_elastic_run_shrinks_to_the_most_nodes_left_that_divide_its_own():
    from suite.common.errors import SuiteError
    from suite.submit import elastic

    def on(nodes, strategy=None, **training):
        raw = yaml.safe_load(recipes.dump(make_recipe(strategy or {"name": "ddp"}, **SECTIONS)))
        raw["training"].update(training)
        raw["launch"] = {**raw["launch"], "executor": "slurm", "nodes": nodes, "tasks_per_node": 2,
                         "max_restarts": 1, "elastic": True}
        return recipes.validate(raw)

    smaller, line = elastic.shrunk(on(4), 3)  # 3 left: 2 divides 4, 3 does not
    assert smaller.launch.nodes == 2 and smaller.training.grad_accumulation == 2
    assert smaller.training.batch_size == 16 and smaller.layout().dp_size == 4
    assert "continuing on 2 of 4 node(s)" in line
    smaller, _ = elastic.shrunk(on(4, grad_accumulation=2), 1)
    assert smaller.launch.nodes == 1 and smaller.training.grad_accumulation == 8
    with pytest.raises(SuiteError, match="no usable node is left"):
        elastic.shrunk(on(2), 0)
    # Degrees fixed in the recipe that the smaller world cannot hold: refused, the strategy's words.
    with pytest.raises(SuiteError, match="strategy.dp"):
        elastic.shrunk(on(4, {"name": "tensor", "dp": 2, "tp": 4}), 2)


def test_elastic_needs_slurm_restarts_and_a_neutral_checkpoint():
    from suite.common.errors import SuiteError

    raw = yaml.safe_load(recipes.dump(make_recipe({"name": "ddp"}, **SECTIONS)))
    with pytest.raises(SuiteError, match="launch.elastic=true .* launch.executor=local"):
        recipes.validate({**raw, "launch": {**raw["launch"], "elastic": True, "max_restarts": 1}})
    slurm = {**raw["launch"], "executor": "slurm", "elastic": True}
    with pytest.raises(SuiteError, match="launch.max_restarts=0"):
        recipes.validate({**raw, "launch": slurm})
    with pytest.raises(SuiteError, match="strategy allreduce's checkpoints resume only at their own"):
        recipes.validate({**raw, "strategy": {"name": "allreduce"}, "launch": {**slurm, "max_restarts": 1}})


@pytest.mark.slow
def test_a_down_node_of_the_job_is_the_one_lost_even_when_a_rank_on_a_live_node_reported_the_error(monkeypatch):
    """Rank 0 (on n1) fails in its collective because rank 1's node n2 died: the node to leave out
    is n2, which Slurm reports down, not the failing rank's n1."""
    from suite.submit import restart
    from suite.submit.follow import Failure

    monkeypatch.setattr(restart, "_run", lambda *cmd: "n1 idle\nn2 down*\n" if cmd[0] == "sinfo" else None)
    peer_gone = Failure("rank 0 failed after step 9: Connection closed by peer", restartable=True, rank=0, node="n1",
                        job_nodes="n[1-2]")
    assert restart._failed_nodes(peer_gone, "77") == ["n2"]
    # every node of the job up: the failing rank's own node
    monkeypatch.setattr(restart, "_run", lambda *cmd: "n1 idle\nn2 idle\n" if cmd[0] == "sinfo" else None)
    assert restart._failed_nodes(peer_gone, "77") == ["n1"]


@pytest.mark.slow
def test_an_elastic_run_with_too_few_usable_nodes_shrinks_even_when_no_node_is_named(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from suite.common.errors import RunFailed
    from suite.record import run_record as records
    from suite.submit import restart
    from suite.submit.follow import Failure

    monkeypatch.setattr(restart, "_run", lambda *cmd: "debug*\n" if cmd[:3] == ("sinfo", "-h", "-o") else
                        "n1 idle\nn2 down*\n" if cmd[0] == "sinfo" else None)
    raw = yaml.safe_load(recipes.dump(make_recipe({"name": "ddp"}, **SECTIONS)))
    raw["launch"] = {**raw["launch"], "executor": "slurm", "nodes": 2, "tasks_per_node": 1, "max_restarts": 1,
                     "elastic": True, "elastic_wait_s": 0}
    recipe = recipes.validate(raw)
    run_dir = records.new_run_dir(recipe.name, recipes.dump(recipe), tmp_path)
    budget = restart.Restarts(recipe, run_dir, printer=lambda *a, **k: None)
    unnamed = SimpleNamespace(failure=Failure("the job ended as FAILED", restartable=True), job=SimpleNamespace(job_id="9"))
    got = budget.next(unnamed, RunFailed("job 9 failed"))
    assert got.recipe.launch.nodes == 1 and got.recipe.training.grad_accumulation == 2
    assert got.note.startswith("1 usable node(s) left; continuing on 1 of 2 node(s)"), got.note


class _PendingRestart(_RequeuedJob):
    """A restart's job that never ran: pending from its submission, as Slurm holds it."""

    def __init__(self):
        super().__init__()
        self.states = ["PENDING"]


def _fake_slurm(monkeypatch, reason: str, n2: str):
    """squeue: the job asks 2 nodes of debug and pends with ``reason``; sinfo: n2 in state ``n2``."""
    from suite.submit import follow, restart

    monkeypatch.setattr(follow, "squeue", lambda job, field: reason if field == "%r" else "")
    monkeypatch.setattr(restart, "squeue", lambda job, field: f"2|debug|{reason}" if field == "%D|%P|%r" else None)
    monkeypatch.setattr(restart, "_run", lambda *cmd: "debug*\n" if cmd[:3] == ("sinfo", "-h", "-o") else
                        f"n1 idle\nn2 {n2}\n" if cmd[0] == "sinfo" else None)


def _elastic_recipe(max_restarts: int):
    raw = yaml.safe_load(recipes.dump(make_recipe({"name": "ddp"}, **SECTIONS)))
    raw["launch"] = {**raw["launch"], "executor": "slurm", "nodes": 2, "tasks_per_node": 1,
                     "max_restarts": max_restarts, "elastic": True, "elastic_wait_s": 0}
    return recipes.validate(raw)


@pytest.mark.parametrize("reason, n2", [
    ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions", "drain"),
    ("ReqNodeNotAvail, UnavailableNodes:n2", "down*"),
    ("Resources", "drng"),  # submitted before Slurm marked the node: its reason says nothing of it
])
def test_a_restart_that_cannot_start_on_the_nodes_left_shrinks_after_elastic_wait_s(reason, n2, tmp_path, monkeypatch):
    """The restart asked for both nodes in the moment before Slurm marked n2 down or drained: it
    pends, and after elastic_wait_s it is cancelled and the next restart continues on n1."""
    from types import SimpleNamespace

    from suite.common.errors import RunFailed
    from suite.submit import follow, restart

    _fake_slurm(monkeypatch, reason, n2)
    job = _PendingRestart()
    watch = follow.Watch(job, tmp_path, 1, printer=lambda *a, **k: None, state_every_s=0, requeue_wait_s=0.2)
    assert not watch.poll() and not job.cancelled  # within the wait: the node may come back
    time.sleep(0.3)
    assert watch.poll() and job.cancelled
    with pytest.raises(RunFailed, match="cannot start on the nodes left"):
        watch.outcome()
    assert watch.failure.restartable and watch.failure.waited_s >= 0.2
    recipe = _elastic_recipe(max_restarts=2)
    run_dir = run_record.new_run_dir(recipe.name, recipes.dump(recipe), tmp_path)
    budget = restart.Restarts(recipe, run_dir, printer=lambda *a, **k: None)
    got = budget.next(SimpleNamespace(failure=watch.failure, job=job), RunFailed("x"))
    assert got.recipe.launch.nodes == 1 and got.recipe.training.grad_accumulation == 2, got.note


def test_a_restart_pending_for_busy_nodes_waits(tmp_path, monkeypatch):
    """Both nodes usable, the job pends for resources others hold: not the lost-node case, it waits."""
    from suite.submit import follow

    _fake_slurm(monkeypatch, "Resources", "alloc")
    job = _PendingRestart()
    watch = follow.Watch(job, tmp_path, 1, printer=lambda *a, **k: None, state_every_s=0, requeue_wait_s=0.1)
    time.sleep(0.2)
    assert not watch.poll() and not watch.poll() and not job.cancelled


def test_without_restarts_left_the_run_ends_with_the_reason(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from suite.common.errors import RunFailed
    from suite.submit import follow, restart

    reason = "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"
    _fake_slurm(monkeypatch, reason, "drain")
    job = _PendingRestart()
    watch = follow.Watch(job, tmp_path, 1, printer=lambda *a, **k: None, state_every_s=0, requeue_wait_s=0.1)
    watch.poll()
    time.sleep(0.2)
    assert watch.poll()
    with pytest.raises(RunFailed) as failed:
        watch.outcome()
    recipe = _elastic_recipe(max_restarts=1)
    run_dir = run_record.new_run_dir(recipe.name, recipes.dump(recipe), tmp_path)
    budget = restart.Restarts(recipe, run_dir, printer=lambda *a, **k: None)
    budget.used = 1  # the one restart was this job
    assert budget.next(SimpleNamespace(failure=watch.failure, job=job), failed.value) is None
    line = budget.gave_up(failed.value)
    assert "\n" not in line and "DOWN, DRAINED" in line and "gave up after 1 automatic restart" in line


def test_a_node_set_down_then_drained_mid_run_finishes_on_the_node_left(tmp_path, baseline_of):
    """The scenario of a lost node whose state Slurm changes under the restart: n2 set DOWN, one
    second later DRAIN (its slurmd stays up). Whatever sinfo says at the moment of each restart,
    the run ends completed on n1 with single's losses, and no restart pends beyond
    elastic_wait_s: one that asked for both nodes is given up and the next continues on n1."""
    if len(subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True).stdout.split()) < 2:
        pytest.fail("the local Slurm has fewer than 2 nodes; start it with bash slurm/start.sh")
    wait_s = 10
    raw = yaml.safe_load(recipes.dump(make_recipe({"name": "ddp"}, **SECTIONS)))
    raw["name"] = "drained"
    raw["launch"] = {**raw["launch"], "executor": "slurm", "nodes": 2, "tasks_per_node": 1, "max_restarts": 2,
                     "elastic": True, "elastic_wait_s": wait_s}
    path = tmp_path / "drained.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = _submit(path, tmp_path / "runs")
    taken, started = False, time.time()
    try:
        assert _paused(tmp_path / "runs", "drained", proc, started + 180), "the run never reached its pause"
        subprocess.run(["scontrol", "update", "nodename=n2", "state=down", "reason=test_drained"], check=True)
        taken = True
        time.sleep(1)
        subprocess.run(["scontrol", "update", "nodename=n2", "state=drain", "reason=test_drained"], check=True)
        stdout, stderr = _finish(proc, started + 240)
    finally:
        if proc.poll() is None:
            proc.kill()
        if taken:
            subprocess.run(["scontrol", "update", "nodename=n2", "state=resume"], capture_output=True)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:] + _slurm_state()
    (run_dir,) = (tmp_path / "runs").glob("drained-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["attempts"][-1].get("world_size") == 1, summary["attempts"]
    assert "continuing on 1 of 2 node(s) (launch.elastic)" in stdout, stdout
    single = baseline_of(make_recipe({"name": "single"}, **SECTIONS))
    got = _losses(run_dir)
    assert len(got) == len(single.losses)
    assert max(abs(a - b) for a, b in zip(got, single.losses)) <= tolerance(make_recipe({"name": "ddp"}, **SECTIONS))
