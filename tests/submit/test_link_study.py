"""The link study end to end (slurm/link_study.sh, short): the local Slurm restarted behind 1 Gbit/s
links, the links calibrated under Slurm on both nodes, the MLP's ddp arm (and its one-device
baseline) run, and analysis.links' table and plots. At 1 Gbit/s the MLP's 6 MB of gradients take
~50 ms a step against ~5 ms of compute: 2 ranks must move fewer samples per second than one, its
recorded prediction (from the rate's calibration) must be within 2x of its step time, and its ranks
must have talked on the shaped veth. (One rate: each costs a minute; the script's loop over rates
is the same code for every rate.) (The calibration's largest message, 4 MiB, must pass the
token bucket's burst, 500 KB at 1 Gbit/s: with 1 MiB the fitted bandwidth came out 2x too high.) The script starts the plain cluster again at its end, for the other Slurm tests.
Needs root, `ip` and `tc` (as tests/submit/test_shaped_cluster.py)."""
import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(shutil.which("sinfo") is None, reason="no Slurm here (sinfo not found); .ci/run starts one"),
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
    pytest.mark.skipif(shutil.which("ip") is None or shutil.which("tc") is None,
                       reason="no `ip`/`tc` (iproute2) to make namespaces and shape links"),
]
pytestmark.append(pytest.mark.slow)  # and slow: every test here launches runs (docs/contributing.md)


@pytest.mark.timeout(600)
def test_the_link_study_measures_and_predicts_each_rate_and_restores_the_plain_cluster(tmp_path):
    out = tmp_path / "links"
    proc = subprocess.run(["bash", "slurm/link_study.sh", "--rates", "1gbit", "--arms", "mlp-ddp",
                           "--out", str(out), "training.max_steps=16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {(r["link"], r["arm"]): r for r in csv.DictReader((out / "links.csv").open())}
    assert set(rows) == {("1gbit", arm) for arm in ("mlp-single", "mlp-ddp")}
    row = rows["1gbit", "mlp-ddp"]
    assert row["interface"] == "veth-n1", row  # summary.json's ranks[0].network
    ratio = float(row["predicted_step_time_s"]) / float(row["step_time_s"])
    assert 0.5 < ratio < 2, row
    # Bandwidth-bound: 2 ranks move fewer samples per second than one device (efficiency < 0.5);
    # unshaped, the same arm scales (tests/submit/test_shaped_cluster.py measures the rates themselves).
    assert 0 < float(row["efficiency"]) < 0.5, row
    assert (out / "links-samples-per-s.png").stat().st_size > 0 and (out / "links-efficiency.png").stat().st_size > 0
    # The study's calibration is `suite.calibrate RECIPE launch.executor=slurm launch.nodes=2
    # launch.tasks_per_node=1`, as a user calibrates a cluster: one job of two tasks through the
    # suite's executor, one rank on each node (this is that command's test; it had its own run).
    c = json.loads((out / "1gbit" / "calibration.json").read_text())
    assert c["world_size"] == 2 and c["hosts"] == ["n1", "n2"], (c["world_size"], c["hosts"])
    assert all(f["alpha_s"] > 0 and f["beta_bytes_per_s"] > 0 for f in c["collectives"].values())
    sinfo = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    assert sinfo.stdout.split() and set(sinfo.stdout.split()) <= {"idle", "mixed", "allocated"}, sinfo.stdout
    assert not Path("/run/netns/slurm-n1").exists()  # the plain cluster: no namespaces left
