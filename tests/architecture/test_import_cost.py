"""What starting a command costs, pinned: which libraries a command's ``--help`` and the submitting
side import, and how long their own imports take against torch's.

A function-level import is how the commands stay fast (a library loaded only by the code that
uses it); these tests, not a comment beside each import, say whether they still do. Times are
ratios to importing torch, measured in the same rounds, so a loaded machine slows both sides."""
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Libraries only a rank, a strategy, a tracker or a report loads, never the submitting side before
# a job is launched (nor ``python -m suite.submit --help``).
LIBRARIES = ("deepspeed", "wandb", "transformers", "tensorflow", "fairscale", "torchvision", "mpi4py",
             "matplotlib", "sklearn", "safetensors")
RANK_SIDE = LIBRARIES + ("suite.train", "suite.planner")
# Commands whose ``--help`` answers without torch (nor any of LIBRARIES).
TORCH_FREE = ("status", "export", "verify", "doctor", "advise", "calibrate")

_DUMP = """
import atexit, runpy, sys
out = sys.argv[1]
atexit.register(lambda: print("\\n".join(sorted(sys.modules)), file=open(out, "w")))
sys.argv = [sys.argv[2], "--help"]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _loaded_by_help(command: str, tmp_path) -> set[str]:
    """The modules ``python -m suite.<command> --help`` has imported when it ends (the commands end
    through ``suite.common.exit``, which runs atexit handlers before leaving)."""
    out = tmp_path / f"{command}.modules"
    proc = subprocess.run([sys.executable, "-c", _DUMP, str(out), f"suite.{command}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(out.read_text().split())


def _heavy(loaded: set[str], names) -> list[str]:
    return sorted(n for n in names if n in loaded or any(m.startswith(n + ".") for m in loaded))


@pytest.mark.slow
def test_submit_help_imports_nothing_of_the_rank_side(tmp_path):
    loaded = _loaded_by_help("submit", tmp_path)
    assert "suite.submit.cli" in loaded  # the dump saw the command run
    assert not _heavy(loaded, RANK_SIDE), f"python -m suite.submit --help imported {_heavy(loaded, RANK_SIDE)}"


@pytest.mark.slow
def test_the_submitting_side_imports_nothing_of_the_rank_side_before_launch():
    code = ("import sys\nimport suite.submit.cli, suite.submit.launch, suite.submit.follow\n"
            "print('\\n'.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    heavy = _heavy(set(proc.stdout.split()), RANK_SIDE)
    assert not heavy, f"suite.submit's cli, launch and follow imported {heavy}"


@pytest.mark.slow
@pytest.mark.parametrize("command", TORCH_FREE)
def test_commands_answer_help_without_torch(command, tmp_path):
    loaded = _loaded_by_help(command, tmp_path)
    heavy = _heavy(loaded, ("torch", "numpy") + LIBRARIES)
    assert not heavy, f"python -m suite.{command} --help imported {heavy}"


def test_the_check_sees_a_heavy_import():
    assert _heavy({"torch", "torch.nn", "json"}, ("torch", "wandb")) == ["torch"]
    assert _heavy({"torchvision.models"}, ("torchvision",)) == ["torchvision"]
    assert _heavy({"torch_foo"}, ("torch",)) == []


_TIMED = """
import time
t0 = time.perf_counter()
import suite.record.status, suite.doctor.checkup, suite.advise
t1 = time.perf_counter()
import torch
t2 = time.perf_counter()
import suite.submit.cli, suite.submit.launch, suite.submit.follow
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


@pytest.mark.slow
def test_import_cost_against_torch():
    """In one fresh interpreter per round: the torch-free commands' modules (cold), then torch
    (cold), then the submitting side on top of torch. The torch-free ones must cost well under a
    torch import, and the suite's own submitting side (what it adds to torch, which its recipe
    schema loads) under half of one. Median of 3 rounds: one busy spell moves one round."""
    light, own = [], []
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", _TIMED], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        light_s, torch_s, submit_s = map(float, proc.stdout.split())
        light.append(light_s / torch_s)
        own.append(submit_s / torch_s)
    assert statistics.median(light) < 0.25, f"torch-free commands' imports cost {light} of torch's"
    assert statistics.median(own) < 0.5, f"the submitting side adds {own} of torch's import time"
