import atexit
import os
import shutil
import tempfile

import pytest

# Tests that do not test tracking run with W&B disabled; one thread per rank on 2 cores.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# The suite's caches in the user's ~/.cache (calibrations, model timings, matmul peaks) must not
# change what the tests do (on a calibrated machine every run would time its model for its
# prediction) nor be written by them: the session, and every process it starts, has its own.
_CACHE = tempfile.mkdtemp(prefix="scalesuite-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


def pytest_sessionstart(session):
    """Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE, set on this project's CI image),
    every process the tests start (submit, ranks, timing children: thousands) would compile the
    suite's modules from source again, ~0.1 s each: compile them once, here. Python still checks
    each file's timestamp, so an edited module is never run stale."""
    import compileall
    import sys
    from pathlib import Path

    if sys.flags.dont_write_bytecode or sys.dont_write_bytecode:
        root = Path(__file__).resolve().parent.parent
        for folder in ("suite", "analysis", "benchmarks"):
            compileall.compile_dir(root / folder, quiet=2)


@pytest.fixture(scope="session")
def machine_calibration(tmp_path_factory):
    """``python -m suite.calibrate --max-bytes 262144 --out HOME/c.json``, as a user calibrates
    a machine once (no recipe; small messages), in its own cache (``HOME/cache``), run once a
    session: (HOME, the finished process). tests/planner/test_calibrate.py checks what it
    measured; the advisor's tests plan from it (a run of its own each cost ~11 s)."""
    import subprocess
    import sys

    home = tmp_path_factory.mktemp("machine-calibration")
    env = {**os.environ, "XDG_CACHE_HOME": str(home / "cache")}
    proc = subprocess.run([sys.executable, "-m", "suite.calibrate", "--max-bytes", str(256 * 2**10),
                           "--out", str(home / "c.json")], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return home, proc


def pytest_report_header(config):
    """Which of torch's CPU kernel sets this run uses: parity must hold under each
    (tests/run_kernel_sets.sh). torch ignores an ATEN_CPU_CAPABILITY the CPU lacks, silently."""
    import torch

    got = torch.backends.cpu.get_cpu_capability()
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    return f"torch CPU kernel set: {got}" + (f" (ATEN_CPU_CAPABILITY={asked})" if asked else " (the CPU's own)")


@pytest.fixture(scope="session")
def baseline_of(tmp_path_factory):
    """single's run of a recipe, once per test session (tests/parity.py's ``Baselines``):
    ``baseline_of(make_recipe({"name": "single"}, **sections))`` runs it the first time any module
    asks and hands every later one the same ``Baseline``: ``.losses``, ``.run_dir``, ``.summary``.
    The recipe must be single on one process: a strategy is compared against one process, never
    against a run of itself."""
    from tests.parity import Baselines

    return Baselines(lambda: tmp_path_factory.mktemp("single"))


@pytest.fixture
def baseline(baseline_of):
    """The baseline most parity tests compare against: the per-step losses of single on
    tests/parity.py's BASE recipe in float64, run once per session. A module whose baseline is
    another recipe, or that needs more of the run (its summary, its folder), overrides this with
    its own fixture built from ``baseline_of``."""
    from tests.parity import make_recipe

    return baseline_of(make_recipe({"name": "single"})).losses


@pytest.fixture
def baseline_and_summary(baseline_of):
    """``baseline``'s run with its summary: (per-step losses, summary.json), for the modules that
    also compare what the run recorded (held bytes, peak memory)."""
    from tests.parity import make_recipe

    single = baseline_of(make_recipe({"name": "single"}))
    return single.losses, single.summary
