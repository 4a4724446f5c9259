"""MPI as a launcher (``launch.executor: mpi``: the ranks under mpirun) and as the transport of the
hand-written all-reduce (``strategy.transport: mpi``). Needs Open MPI and mpi4py
(tests/install_mpi.sh, in the README's test command)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.record.run_record import read_metrics
from suite.submit import cli
from suite.common import mpi as rank_mpi
from suite.train import dist
from tests.parity import BASE, assert_matches, make_recipe
from tests.harness import interruptible


def write_recipe(tmp_path, strategy: dict, **launch) -> str:
    raw = {**BASE, "name": "mpi", "strategy": strategy, "training": {**BASE["training"], "precision": "fp64"},
           "launch": {"executor": "mpi", "tasks_per_node": 2, **launch}}  # fp64, as make_recipe's baseline
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def the_run(out):
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


# baseline: single's losses on the parity recipe (fp64, as write_recipe's), once per session (tests/conftest.py)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["mpi", "torch"])
def test_allreduce_under_mpirun_matches_single(transport, baseline, tmp_path):
    """Two ranks started by mpirun; the gradients through mpi4py's Allreduce or through gloo."""
    out = tmp_path / "runs"
    code = cli.main([write_recipe(tmp_path, {"name": "allreduce", "transport": transport}), "--out", str(out)])
    assert code == 0
    run_dir = the_run(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert json.loads((run_dir / "job.json").read_text())["executor"] == "mpi"
    steps = sorted(read_metrics(run_dir, kind="step", rank=0), key=lambda s: s["step"])
    assert {s["rank"] for s in read_metrics(run_dir, kind="step")} == {0, 1}  # both ranks are MPI's
    assert_matches([s["global_loss"] for s in steps], baseline)


@pytest.mark.slow
def test_a_bare_mpirun_of_suite_train_ends_cleanly(tmp_path):
    """``mpirun -np 2 python -m suite.train`` with MPI in use: the command ends without the
    interpreter's teardown (suite.common.exit), so MPI must be finalised before; mpirun reports a
    rank that ends without MPI_Finalize as failed (exit 1)."""
    recipe = write_recipe(tmp_path, {"name": "allreduce", "transport": "mpi"})
    proc = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-m",
                           "suite.train", recipe, "training.max_steps=3", "--out", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((the_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2


def submit(recipe: str, out, *args, env=None, **popen):
    return subprocess.Popen([sys.executable, "-m", "suite.submit", recipe, "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, **popen)


def mpi_ranks_of(run_dir) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"suite.tasks.mpi {run_dir}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


@pytest.mark.slow
def test_a_rank_killed_under_mpirun_ends_the_job_at_once_naming_it(tmp_path):
    recipe = write_recipe(tmp_path, {"name": "allreduce", "transport": "mpi"})
    proc = submit(recipe, tmp_path / "runs", "training.max_steps=400", "training.epochs=100",
                  "training.log_every_steps=1", env={"SCALESUITE_FAIL_AT": "1:3:kill"})
    _, err = proc.communicate(timeout=240)
    ended = time.time()
    assert proc.returncode == 1, err
    # Rank 0 either notices first (gloo: connection closed by peer) or is stopped by mpirun first.
    assert "rank 1 died without a Python error" in err and "its peers then failed: rank 0: " in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    run_dir = the_run(tmp_path / "runs")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_rank"] == 1
    assert len(read_metrics(run_dir, kind="step", rank=0)) >= 3  # what was logged is kept
    # From rank 1's death (its last step record) to the command's exit: no hang, no grace wait.
    last_step_at = (run_dir / "metrics.jsonl").stat().st_mtime
    assert ended - last_step_at < 10, f"{ended - last_step_at:.1f} s from the kill to the exit"
    assert not mpi_ranks_of(run_dir)


@pytest.mark.slow
def test_ctrl_c_stops_the_mpi_ranks_with_a_checkpoint(tmp_path):
    recipe = write_recipe(tmp_path, {"name": "allreduce", "transport": "mpi"})
    out = tmp_path / "runs"
    proc = submit(recipe, out, "training.max_steps=100000", "training.epochs=1000", "training.log_every_steps=1",
                  start_new_session=True, preexec_fn=interruptible)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        runs = [p for p in out.glob("*/metrics.jsonl")] if out.exists() else []
        if runs and len(read_metrics(runs[0].parent, kind="step", rank=0)) >= 3:
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[1]
    interrupted = time.time()
    os.killpg(proc.pid, signal.SIGINT)  # as a Ctrl-C in the terminal: the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert time.time() - interrupted < 15, "the ranks did not stop promptly"
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume" in err, err
    run_dir = the_run(out)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "cancelled" and summary["steps"] >= 3 and summary.get("error") is None
    assert (run_dir / "checkpoint" / "latest.json").exists()  # the ranks agreed on a step and saved it
    assert not mpi_ranks_of(run_dir), "mpi ranks left running"


# ---- what is missing, and where MPI is not there -------------------------------------------------

@pytest.mark.slow
def test_a_missing_mpirun_is_one_line_naming_the_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    code = cli.main([write_recipe(tmp_path, {"name": "allreduce"}), "--out", str(tmp_path / "runs"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "mpirun, which is not on PATH" in err and "apt-get install -y openmpi-bin libopenmpi-dev" in err


@pytest.mark.slow
def test_a_missing_mpi4py_is_one_line_naming_the_install_on_both_sides(tmp_path, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else find_spec(name, *a))
    code = cli.main([write_recipe(tmp_path, {"name": "allreduce", "transport": "mpi"}), "--out",
                     str(tmp_path / "runs"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "strategy.transport=mpi" in err and 'pip install -e ".[mpi]"' in err
    # The rank's side: mpi4py absent in a rank mpirun started.
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(SuiteError, match=r'mpi4py, which is not installed; pip install -e "\.\[mpi\]"'):
        rank_mpi.comm("strategy.transport=mpi")


def test_mpi_transport_is_refused_without_mpi_ranks(monkeypatch):
    with pytest.raises(SuiteError, match="strategy.transport=mpi .* launch.executor=local .* set launch.executor=mpi"):
        make_recipe({"name": "allreduce", "transport": "mpi"}, world_size=2)
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):  # e.g. under torchrun
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SuiteError, match="needs ranks an MPI launcher started"):
        rank_mpi.comm("strategy.transport=mpi")


def test_mpi_executor_is_one_node_and_transport_keeps_old_fingerprints():
    with pytest.raises(SuiteError, match="launch.executor=mpi .* launch.nodes=2"):
        recipes.validate({**BASE, "strategy": {"name": "allreduce"}, "launch": {"executor": "mpi", "nodes": 2}})
    plain = make_recipe({"name": "allreduce"}, world_size=2)
    torch_transport = make_recipe({"name": "allreduce", "transport": "torch"}, world_size=2)
    assert plain.fingerprint() == torch_transport.fingerprint()  # runs recorded before the key group with new ones
    assert make_recipe({"name": "allreduce", "transport": "mpi"}, world_size=2,
                       launch={"executor": "mpi"}).fingerprint() != plain.fingerprint()


@pytest.mark.parametrize("variables, expected", [
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, ("1", "4", "1", "2")),
    ({"PMIX_RANK": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2(x2)"},
     ("3", "4", "1", "2")),
    ({"PMI_RANK": "2", "PMI_SIZE": "3"}, ("2", "3", "2", "3")),
])
def test_rank_and_world_come_from_the_mpi_launchers_variables(variables, expected, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                 "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"):
        # set, then deleted: monkeypatch then removes what adopt_mpi_environment sets at teardown
        # (a WORLD_SIZE left in the test process reaches every later subprocess's ranks)
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert dist.adopt_mpi_environment()
    assert tuple(os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")) == expected
    assert not dist.adopt_mpi_environment()  # torch's variables, once set, win


# ---- Slurm: srun --mpi=pmix ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm here (sinfo not found); .ci/run starts a local cluster")
def test_allreduce_through_mpi_on_two_slurm_nodes_matches_single(baseline, tmp_path):
    """launch.mpi=true: submitit's srun starts the tasks with --mpi=pmix, one MPI world over 2 nodes."""
    out = tmp_path / "runs"
    recipe = write_recipe(tmp_path, {"name": "allreduce", "transport": "mpi"}, executor="slurm", mpi=True,
                          nodes=2, tasks_per_node=1)
    code = cli.main([recipe, "--out", str(out)])
    assert code == 0
    run_dir = the_run(out)
    steps = sorted(read_metrics(run_dir, kind="step", rank=0), key=lambda s: s["step"])
    assert_matches([s["global_loss"] for s in steps], baseline)


@pytest.mark.slow
def test_a_slurm_without_pmix_is_one_line(tmp_path, monkeypatch):
    from suite.submit import mpi

    monkeypatch.setattr(mpi.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, "MPI plugin types are...\n\tnone\n\tpmi2\n", ""))
    with pytest.raises(SuiteError, match=r"srun --mpi=pmix, but this Slurm offers no pmix plugin \(srun --mpi=list\)"):
        mpi.check_srun_pmix()


def test_launch_mpi_is_for_slurm():
    with pytest.raises(SuiteError, match="launch.mpi=true .* launch.executor=local; use launch.executor=mpi"):
        make_recipe({"name": "allreduce"}, world_size=2, launch={"mpi": True})


@pytest.mark.slow
def test_mpirun_failing_before_any_rank_is_one_line_with_its_words(tmp_path, monkeypatch, capsys):
    from suite.submit import mpi

    monkeypatch.setattr(mpi, "command", lambda *a: [mpi.mpirun_path(), "--no-such-option", "true"])
    code = cli.main([write_recipe(tmp_path, {"name": "allreduce"}), "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "rank 0: mpirun exited with code" in err and "no-such-option" in err, err
