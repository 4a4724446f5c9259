"""benchmarks/gpu_check.sh is ready before a GPU sees it: --dry-run lists every check, within the
10 minutes one GPU is lent, and every recipe it would run validates here (a refused sweep point
would cost the whole bf16 or fp16 check on the GPU); its report writes one results file."""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from suite import recipe as recipes
from suite.planner.table import strategy_specs
from suite.recipe.text import raw_points

SCRIPT = ["bash", "benchmarks/gpu_check.sh", "--dry-run"]


def overrides(command: list[str]) -> list[str]:
    """The key=value words between the recipe and the first option."""
    words = command[4:]
    return words[:next((i for i, w in enumerate(words) if w.startswith("--")), len(words))]


def checks(gpus: int) -> dict[str, tuple[int, list[str]]]:
    proc = subprocess.run([*SCRIPT, "--gpus", str(gpus), "--out", "OUT"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = {}
    for line in proc.stdout.splitlines():
        name, command = line.split(": ", 1)
        limit = int(name.split("(at most ")[1].split(" s)")[0]) if "(at most" in name else 0
        listed[name.split(" ")[0]] = (limit, shlex.split(command))
    return listed


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_dry_run_lists_every_check_within_ten_minutes(gpus):
    listed = checks(gpus)
    assert list(listed) == ["doctor", "calibrate", "verify", "bf16", "fp16", "report"]
    assert sum(limit for limit, _ in listed.values()) <= 600
    assert listed["doctor"][1][:3] == ["python", "-m", "suite.doctor"]
    assert "--out" in listed["calibrate"][1] or "--out" in " ".join(listed["calibrate"][1])
    for name in ("calibrate", "verify", "bf16", "fp16"):
        assert "launch.device=cuda" in listed[name][1] and f"launch.tasks_per_node={gpus}" in listed[name][1]
    assert "training.precision=bf16" in listed["bf16"][1] and "training.precision=fp16" in listed["fp16"][1]


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_run_it_would_start_is_a_valid_recipe(gpus):
    listed = checks(gpus)
    for name in ("bf16", "fp16"):
        command = listed[name][1]
        points = recipes.load(command[3], overrides(command))  # raises on a refused point (pipeline in fp16, single at 2)
        names = {p.strategy.name for p in points}
        assert {"ddp", "allreduce", "fsdp", "fsdp1", "oss", "zero"} <= names
        assert all(p.world_size == gpus for p in points)
    verify = listed["verify"][1]
    spec = verify[verify.index("--strategies") + 1]
    raw = raw_points(verify[3], overrides(verify))[0]
    for _, section in strategy_specs(spec, raw.get("strategy") or {}):
        recipes.validate({**raw, "strategy": section})


def test_a_bad_option_is_one_line():
    proc = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--fast"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--fast" in proc.stderr


def test_the_report_writes_one_results_file_named_after_the_card(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    out.mkdir()
    results.mkdir()
    (out / "checks.tsv").write_text("doctor\t0\t41\tpython -m suite.doctor\nverify\t124\t180\tpython -m suite.verify\n")
    (out / "doctor.json").write_text(json.dumps({
        "host": "gpu1", "software": {"torch": "2.14.1"}, "cuda": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}],
                                                                 "nccl": "2.27.3"},
        "checks": [{"name": "nccl all_reduce", "status": "pass", "detail": "exact"}]}))
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check_report.py", str(out), "--results", str(results)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (written,) = results.glob("*-gpu-nvidia-h100-80gb-hbm3.md")
    text = written.read_text()
    assert "# GPU check: NVIDIA H100 80GB HBM3" in text and "| verify | 124 (timed out) | 180 |" in text
    assert "nccl all_reduce: **pass**" in text and "## fp16, 20 steps" in text and Path(written).name in proc.stdout
