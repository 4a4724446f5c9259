"""A Slurm node slowed on purpose (slurm/start.sh --node-cpu n2=10%: its slurmd, and so its jobs, in a
cgroup v1 group with a CPU quota): a 2-node ddp run records the quota of the rank on n2, names that
rank the straggler, and shows it computing longer while rank 0 waits in collectives. The plain
cluster (slurm/stop.sh && slurm/start.sh) is started again at the end, for the other Slurm tests.
Needs root, Slurm and cgroup v1's cpu controller; skipped, saying so, elsewhere."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite.common import cpu_cap
from tests import cluster

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm here (sinfo not found); .ci/run starts one"),
    pytest.mark.skipif(not (cpu_cap.CPU_ROOT / "cpu.cfs_quota_us").exists() or os.geteuid() != 0,
                       reason="needs root and cgroup v1's cpu controller at /sys/fs/cgroup/cpu"),
]
pytestmark.append(pytest.mark.slow)  # and slow: every test here launches runs (docs/contributing.md)


@pytest.fixture(scope="module")
def slow_node():
    # 10 %: 0.2 CPU. At 25 % (0.5 CPU) the rank, which waits in collectives part of each step and so
    # needs ~0.6 CPU, was barely held back: its compute 1.15-1.4x rank 0's, under the straggler's 1.2x in CI
    with cluster.restarted("--node-cpu", "n2=10%"):
        yield


def test_a_run_on_a_capped_slurm_node_names_its_rank_the_straggler(slow_node, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "suite.submit", "benchmarks/base.yaml", "--out", str(tmp_path),
                           "--executor", "slurm", "strategy={name: ddp}", "launch.nodes=2", "launch.tasks_per_node=1",
                           "launch.cpus_per_task=1", "training.max_steps=12", "training.epochs=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "summary.json").exists()]
    summary = json.loads((run_dir / "summary.json").read_text())
    fast, slow = summary["ranks"]
    assert (fast["node"], slow["node"]) == ("n1", "n2")
    # 10 % of the node's CPUs (slurm.conf gives each node this machine's 2): under one CPU; n1 uncapped
    assert 0 < slow["cpu_quota"] < 1 and not fast.get("cpu_quota"), summary["ranks"]
    assert summary["straggler"]["rank"] == 1, summary["straggler"]
    # The quota is spent per 100 ms CFS period, so the capped rank stalls wherever it runs out, in its
    # compute or in a collective: its compute is longer, by a ratio the stalls' places decide
    assert slow["compute_s"] > fast["compute_s"] and fast["collective_s"] > slow["collective_s"], summary["ranks"]
