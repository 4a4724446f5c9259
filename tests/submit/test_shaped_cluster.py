"""The local Slurm with shaped links (slurm/start.sh --link 1gbit): each node in its own network
namespace behind a tbf-shaped veth. A 2-node gloo all-reduce measures about the link's rate, and a
2-node run records that its ranks talked on the veths (launch.interface's default: the route).

Needs root and `ip` (iproute2) to make namespaces; without them it is skipped, saying why. Where
they are there and the shaped cluster cannot start, it fails with start.sh's reason. It restarts
the plain cluster (slurm/stop.sh && slurm/start.sh) at the end: the other Slurm tests need it, and
none may run while this one does (pytest runs them one after another)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite.record.run_record import rank_processes
from tests import cluster

ROOT = Path(__file__).resolve().parents[2]
RATE_GBIT = 1.0

pytestmark = [
    pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm here (sinfo not found); .ci/run starts one"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="no `ip`/`tc` (iproute2) to make namespaces and shape links"),
]
pytestmark.append(pytest.mark.slow)  # and slow: every test here launches runs (docs/contributing.md)

# A 2-rank all-reduce of 64 MiB, joined where every run joins (suite.train.dist.init); bus bandwidth
# 2(n-1)/n x bytes / time, the median of 4.
BANDWIDTH = r'''
import json, os, time
os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"], LOCAL_RANK="0",
                  LOCAL_WORLD_SIZE="1", MASTER_ADDR="n1", MASTER_PORT="29517")
import torch, torch.distributed as tdist
from suite.train import dist
ctx = dist.init("cpu")
x = torch.ones(16 * 2**20)
tdist.all_reduce(x)
times = []
for _ in range(4):
    t = time.perf_counter(); tdist.all_reduce(x); times.append(time.perf_counter() - t)
n = ctx.world_size
bus = 2 * (n - 1) / n * x.numel() * 4 / sorted(times)[len(times) // 2]
print(json.dumps({"rank": ctx.rank, "bus_gbit_s": bus * 8 / 1e9, "interface": os.environ["GLOO_SOCKET_IFNAME"]}), flush=True)
dist.close()
'''


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _no_namespaces_left():
    gone = _namespaces()
    assert "slurm-n" not in gone, f"stop.sh left namespaces: {gone}"


@pytest.fixture(scope="module")
def shaped_cluster():
    with cluster.restarted("--link", "1gbit", after=_no_namespaces_left):
        leftover = _namespaces()
        assert "slurm-n1" in leftover and "slurm-n2" in leftover
        yield


def test_a_2_node_all_reduce_measures_the_link_rate(shaped_cluster, tmp_path):
    script = tmp_path / "bandwidth.py"
    script.write_text(BANDWIDTH)
    proc = subprocess.run(["srun", "-N2", "-n2", f"--chdir={ROOT}", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted((json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")),
                     key=lambda r: r["rank"])
    print(results)
    assert [r["interface"] for r in results] == ["veth-n1", "veth-n2"]
    for r in results:
        assert r["bus_gbit_s"] == pytest.approx(RATE_GBIT, rel=0.15), results


def test_a_2_node_run_records_the_veth_each_rank_talked_on(shaped_cluster, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "--out", str(tmp_path),
                           "--executor", "slurm", "training.epochs=1", "launch.nodes=2", "launch.tasks_per_node=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "summary.json").exists()]
    networks = {r["rank"]: r["network"] for r in rank_processes(run_dir)}
    assert networks[0]["interface"] == "veth-n1" and networks[0]["address"] == "198.18.0.11"
    assert networks[1]["interface"] == "veth-n2" and networks[1]["address"] == "198.18.0.12"
    assert networks[0]["master"] == networks[1]["master"] == "198.18.0.11"
    # and summary.json's ranks[] says the same, with Slurm's node name
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(r["node"], r["network"]["interface"]) for r in summary["ranks"]] == [("n1", "veth-n1"), ("n2", "veth-n2")]
