"""python -m suite.advise as a user runs it: on this host's calibration with --verify (the best
configurations run for a few steps, predicted beside measured), and on the H100 preset at 1,024
ranks (hybrid and sharded configurations ranked; everything left out says why; nothing ranks
that cannot run there; every figure said to come from specs)."""
import csv
import os
import re
import subprocess
import sys

import pytest

from suite.advise.trust import DEFAULT_BAND

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # W&B as the recipe says (offline)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # this test's own calibration and model times
    return env


def _run(args, tmp_path, timeout=600):
    # --runs: the run records that measure the advisor's band are this test's own, never the checkout's runs/.
    return subprocess.run([sys.executable, "-m", "suite.advise", *args, "--runs", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=timeout, env=_env(tmp_path))


def _clean(proc):
    """No library warning, log line or traceback reaches the user (without --verbose)."""
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "Warning" not in both and "WARNING" not in both, both[-3000:]


@pytest.fixture(scope="module")
def calibrated(machine_calibration):
    """A calibration of this host, as a user makes it once (no recipe), small messages only
    (tests/conftest.py: one a session)."""
    return machine_calibration[0]


def test_advise_verify_runs_the_best_and_sets_measured_beside_predicted(calibrated):
    out = calibrated / "advice"
    # key=value overrides anywhere on the line, before and after the options.
    proc = _run(["--nodes", "1", "recipes/quickstart.yaml", "training.batch_size=32", "--per-node", "2",
                 "--strategies", "ddp,allreduce,fsdp,zero:stage=2", "--top", "4", "training.epochs=2",
                 "--verify", "3", "--verify-steps", "6", "--out", str(out)], calibrated)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    _clean(proc)
    assert "on 1 node(s) x 2 = 2 ranks, global batch 32" in proc.stdout
    ranked = list(csv.DictReader(open(out / "advice.csv")))
    assert {r["configuration"] for r in ranked} == {"ddp", "allreduce", "fsdp", "zero:stage=2"}
    assert all("launch.tasks_per_node=2" in r["launch"] for r in ranked)
    steps = [float(r["step_ms"]) for r in ranked]
    assert steps == sorted(steps)  # one global batch: best throughput = shortest step
    # Each configuration predicted within the band (no runs recorded under --runs: the default) of a
    # better-ranked one names it; the advice says where the band came from.
    rates = [float(r["samples_per_s"]) for r in ranked]
    for i, r in enumerate(ranked):
        close = [j + 1 for j in range(i) if rates[j] <= rates[i] * (1 + DEFAULT_BAND)]
        assert r["not_settled_with"] == (str(close[0]) if close else ""), ranked
    assert "closer than the time model can order two configurations. That band: the suite's own benchmark on a " \
        "2-core CPU VM; 0 pair(s) of runs" in " ".join(proc.stdout.split())
    verified = re.findall(r"^\| (\d) \| (\S+) \| ([\d.e+-]+) \| ([\d.e+-]+) \| ([\d.]+) \| (\S+) \|$", proc.stdout, re.M)
    assert [v[1] for v in verified] == [r["configuration"] for r in ranked[:3]], proc.stdout
    for _, _, predicted, measured, ratio, folder in verified:
        assert float(measured) > 0 and abs(float(ratio) - float(measured) / float(predicted)) < 0.01 * float(ratio) + 0.01
        assert os.path.exists(os.path.join(folder, "summary.json"))
    assert "## Verified" in (out / "advice.md").read_text()
    # The measured order of the verified, against the advice's: every verified rank named once.
    order = re.search(r"^Measured, fastest first: (#\d(?:, #\d)*) \(the advice's order", proc.stdout, re.M)
    assert order and sorted(order.group(1).split(", ")) == ["#1", "#2", "#3"], proc.stdout[-1500:]


def test_advise_at_1024_ranks_on_the_h100_preset(tmp_path):
    out = tmp_path / "advice"
    proc = _run(["recipes/tensor_transformer.yaml", "--nodes", "128", "--per-node", "8", "--hardware", "h100",
                 "--weak-scaling", "--top", "40", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _clean(proc)
    text = proc.stdout
    assert "figures from published specs, not measured" in text and "Figures from published specs" in text
    ranked = list(csv.DictReader(open(out / "advice.csv")))
    names = [r["configuration"] for r in ranked]
    assert any(n.startswith("fsdp:replicate=") for n in names)  # hybrid sharding (HSDP)
    assert any(n.startswith("tensor:") for n in names)  # tensor x data parallel
    assert any(n.startswith(("fsdp", "zero:stage=3")) for n in names)  # sharded
    throughput = [float(r["samples_per_s"]) for r in ranked]
    assert throughput == sorted(throughput, reverse=True)
    # The record lists every configuration left out (the printed advice one line per reason).
    left_out = (out / "advice.md").read_text().split("## Left out")[1]
    lines = [line for line in left_out.splitlines() if line.startswith("- ")]
    assert lines and all(re.match(r"- .+?: \S.{20,}", line) for line in lines)  # every exclusion has its reason
    # Nothing ranks where it cannot run: one-process, one-node and asynchronous strategies are left out,
    # and TensorFlow's (its own loop, whose step the time model does not time).
    for name in ("single", "hogwild", "fairscale_pipe", "tf_single", "layer_split", "tf_multiworker"):
        assert not any(n == name or n.startswith(name + ":") for n in names), name
        assert re.search(rf"^- (.*, )?{name}[:, ]", left_out, re.M), name
    # A tensor degree that does not divide the model's 4 heads is left out, with that reason.
    assert re.search(r"tensor:dp=128:tp=8.*must divide model.heads=4", left_out)


def test_hogwild_beyond_one_node_is_left_out_with_the_reason(tmp_path):
    proc = _run(["recipes/quickstart.yaml", "--nodes", "2", "--per-node", "2", "--hardware", "a100",
                 "--strategies", "hogwild,ddp", "--out", str(tmp_path / "a")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"^- 1 configuration \(hogwild\): .*launch.nodes=2", proc.stdout, re.M)
    assert re.search(r"^- hogwild: .*launch.nodes=2", (tmp_path / "a" / "advice.md").read_text(), re.M)
    assert "| 1 | ddp |" in proc.stdout


def test_no_calibration_and_no_preset_is_one_line_naming_the_fix(tmp_path):
    proc = _run(["recipes/quickstart.yaml", "--nodes", "1", "--per-node", "2"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "python -m suite.calibrate" in proc.stderr
    proc = _run(["recipes/quickstart.yaml", "--hardware", "tpu9"], tmp_path)
    assert proc.returncode == 2 and "presets: h100, h200, a100, a100_40gb" in proc.stderr
