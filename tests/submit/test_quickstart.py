"""The README's main job, end to end as a user runs it: submitit's local executor, 2 ranks."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from suite.record.run_record import read_metrics

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)


# What users run: the recipe's own tracking (W&B offline), not the tests' WANDB_MODE=disabled.
DEFAULT_TRACKING = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}


def submit(tmp_path, *args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(tmp_path),
                           *args], capture_output=True, text=True, timeout=timeout,
                          env={**DEFAULT_TRACKING, **(env or {})})


def only_run(tmp_path) -> Path:
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return run_dir


def test_quickstart_trains_ddp_on_two_ranks_and_writes_the_run_record(tmp_path):
    proc = submit(tmp_path, "training.epochs=3")
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run(tmp_path)
    assert f"run record: {run_dir}" in proc.stdout
    assert "epoch 3/3" in proc.stdout and "samples/s" in proc.stdout

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert (summary["strategy"], summary["world_size"]) == ("ddp", 2)
    assert summary["samples_per_s"] > 0 and summary["step_time_s"] > 0
    assert len(summary["epoch_time_s"]) == 3 and len(summary["eval_time_s"]) == 3
    assert summary["final"]["val_accuracy"] > 0.85  # real digits, 3 epochs
    for rank in summary["ranks"]:
        assert rank["peak_memory_bytes"] > 0
        # 26,122 fp32 parameters in [64-128-128-10]; SGD momentum: one buffer per parameter
        assert rank["held_bytes"] == {"parameters": 26122 * 4, "gradients": 26122 * 4, "optimizer_state": 26122 * 4}
    assert (run_dir / "recipe.yaml").read_text().startswith("name: quickstart")
    steps = read_metrics(run_dir, kind="step")
    assert {s["rank"] for s in steps} == {0, 1}
    assert len(read_metrics(run_dir, kind="step", rank=0)) == summary["steps"]


def test_a_rank_that_raises_fails_the_job_promptly_with_its_error(tmp_path):
    """At 4 ranks the raising rank's peers end after it (their connections close): the rank that
    recorded its error is the cause, not a peer that died after it, nor itself "without a Python
    error" (both were said before: the follower counted every rank gone at the end as killed)."""
    started = time.time()
    proc = submit(tmp_path, "training.epochs=50", "launch.tasks_per_node=4", env={"SCALESUITE_FAIL_AT": "0:5"},
                  timeout=120)
    elapsed = time.time() - started
    assert proc.returncode == 1
    assert "rank 0: RuntimeError: injected failure at rank 0, step 5" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "without a Python error" not in proc.stderr, proc.stderr
    assert elapsed < 90, f"took {elapsed:.0f} s to report the failure"
    run_dir = only_run(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_rank"] == 0
    assert len(read_metrics(run_dir, kind="step", rank=0)) >= 4  # what was logged is kept
    # Its peers failed on their own as its connections closed (each recorded why), rather than wait
    # in their collective until the follower's grace time ran out and it killed them: the failed
    # rank's process lives on in the warm-ranks pool, and used to hold its process group open.
    assert sorted(p.name for p in (run_dir / "errors").iterdir()) == [f"rank{k}.txt" for k in range(4)]


def test_a_rank_that_is_killed_is_named_as_the_cause_not_its_peers(tmp_path):
    started = time.time()
    proc = submit(tmp_path, "training.epochs=50", env={"SCALESUITE_FAIL_AT": "1:5:kill"}, timeout=120)
    assert proc.returncode == 1
    assert "rank 1 died without a Python error" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert time.time() - started < 90
    assert json.loads((only_run(tmp_path) / "summary.json").read_text())["failed_rank"] == 1


def test_torchrun_runs_the_same_loop_and_takes_its_world_size(tmp_path):
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node", "2", "-m", "suite.train",
                           "recipes/quickstart.yaml", "launch.tasks_per_node=1", "training.epochs=1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    # the head too: a rank that aborts (SIGABRT) says why near the start, torchrun sums up at the end
    assert proc.returncode == 0, proc.stderr[:3000] + "\n...\n" + proc.stderr[-2000:]
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["dp_size"] == 2


def test_two_torchrun_agents_are_two_nodes(tmp_path):
    """torchrun --nnodes 2 --nproc-per-node 1: two agents meet at a c10d rendezvous on this
    machine, as two nodes would; the run records 2 nodes of 1 rank each, not 1 node of 2."""
    from suite.common.ports import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    agents = [subprocess.Popen(["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes", "-m", "suite.train",
                                "recipes/quickstart.yaml", "training.epochs=1", "training.max_steps=4",
                                "--out", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}) for _ in range(2)]
    try:
        outputs = [agent.communicate(timeout=240) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    for agent, (_, err) in zip(agents, outputs):
        assert agent.returncode == 0, err[:3000] + "\n...\n" + err[-2000:]
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2 and summary["dp_size"] == 2
    recipe = (run / "recipe.yaml").read_text()
    assert "nodes: 2" in recipe and "tasks_per_node: 1" in recipe and "executor: torchrun" in recipe


def test_torchrun_s_nodes_bring_the_node_rules_with_them(monkeypatch, capsys):
    """hogwild shares memory between the ranks of one node: refused in one line over two agents."""
    from suite.tasks import torchrun

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    assert torchrun.main(["recipes/quickstart.yaml", "strategy.name=hogwild"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "hogwild" in err and "launch.nodes=2" in err
