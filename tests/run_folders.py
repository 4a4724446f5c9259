"""What the tests read of the run folders ``suite.submit`` wrote: the runs in the order they were
handed to their ranks, and the processes each rank trained in (warm ranks: suite/submit/pool.py)."""
import json
from pathlib import Path


def in_order(out: Path) -> list[Path]:
    """Run folders in the order they were handed to the ranks (job.json is written then)."""
    found = [p for p in Path(out).iterdir() if (p / "job.json").exists()]
    return sorted(found, key=lambda p: json.loads((p / "job.json").read_text())["submitted_at"])


def rank_pids(run_dir: Path) -> list[int]:
    """Each rank's process id, in rank order."""
    return [json.loads(p.read_text())["pid"] for p in sorted((Path(run_dir) / "ranks").glob("rank*.json"))]
