"""The local Slurm started with other options for one test module (shaped links, capped nodes),
and the plain cluster started again afterwards, which the other Slurm tests need."""
import subprocess
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def slurm_script(*args, timeout=120):
    """``bash slurm/<script> ARGS`` in the repository root."""
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@contextmanager
def restarted(*start_args: str, after=None):
    """The cluster restarted as ``slurm/start.sh START_ARGS`` for the block; ``after()`` runs once
    it is stopped again, before the plain cluster starts (to check what stop.sh removed)."""
    stop = slurm_script("slurm/stop.sh")
    assert stop.returncode == 0, stop.stderr
    try:
        start = slurm_script("slurm/start.sh", *start_args)
        assert start.returncode == 0, f"slurm/start.sh {' '.join(start_args)} did not start: {start.stdout}{start.stderr}"
        yield start
    finally:
        slurm_script("slurm/stop.sh")
        failed = None
        try:
            if after:
                after()
        except AssertionError as e:  # raised once the plain cluster is back
            failed = e
        again = slurm_script("slurm/start.sh")
        assert again.returncode == 0, f"the plain cluster did not come back: {again.stderr}"
        if failed:
            raise failed
