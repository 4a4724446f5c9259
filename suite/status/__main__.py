"""``python -m suite.status [RUNS ...]``: the state of each run under the given folders (default
``runs/``): running (with its progress), completed, failed, cancelled, preempted or lost, and the
attempt of a run started more than once (resumed, requeued, restarted: ``launch.max_restarts``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite.record.status import state


def run_dirs(paths) -> list[Path]:
    """Run folders (holding recipe.yaml) at or below ``paths``, sorted by name."""
    found = set()
    for root in map(Path, paths):
        if (root / "recipe.yaml").is_file():
            found.add(root.resolve())
        elif root.is_dir():
            found.update(p.parent.resolve() for p in root.glob("*/recipe.yaml"))
    return sorted(found, key=lambda p: p.name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.status", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", default=["runs"], help="run folders or folders holding them (default: runs/)")
    args = p.parse_args(argv)
    dirs = run_dirs(args.runs)
    if not dirs:
        print(f"error: no run folders in {', '.join(args.runs)} (a run folder holds recipe.yaml)", file=sys.stderr)
        return 2
    for d in dirs:
        s = state(d)
        step = f"step {s['step']}" if s["step"] is not None else "no steps yet"
        detail = f"  {s['detail']}" if s["detail"] else ""
        print(f"{d.name}  {s['state']}  {step}{_attempts(s)}{detail}")
    return 0


def _attempts(s: dict) -> str:
    """"  attempt 3 (2 automatic restarts)" once a run has started more than once."""
    if s["attempts"] < 2:
        return ""
    restarts = f" ({s['restarts']} automatic restart{'s' if s['restarts'] != 1 else ''})" if s["restarts"] else ""
    return f"  attempt {s['attempts']}{restarts}"


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
