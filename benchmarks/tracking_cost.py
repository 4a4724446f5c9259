"""Tracking cost: default tracking (W&B offline, utilisation thread, run record) against
``tracking.wandb=disabled``, same run shape (ddp, base.yaml, 2 ranks), interleaved pairs, median of
the step-time ratios. Target: at most 1.02.

    python benchmarks/tracking_cost.py [--pairs 4] [--out /tmp/tracking-cost]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

TARGET = 1.02


def step_time_s(folder: Path, mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # the recipe decides
    proc = subprocess.run([sys.executable, "-m", "suite.submit", str(Path(__file__).with_name("base.yaml")),
                           "strategy={name: ddp}", "launch.tasks_per_node=2", f"tracking.wandb={mode}",
                           "--out", str(folder)], capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.exit(f"{mode} run failed:\n{proc.stderr.strip()}")
    (summary,) = [json.loads(p.read_text()) for p in folder.glob("*/summary.json")]
    return summary["step_time_s"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--out", default="/tmp/tracking-cost")
    args = p.parse_args(argv)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    ratios = []
    for i in range(args.pairs):
        order = ("offline", "disabled") if i % 2 == 0 else ("disabled", "offline")  # alternate who goes first
        times = {mode: step_time_s(out / f"{i}-{mode}", mode) for mode in order}
        ratios.append(times["offline"] / times["disabled"])
        print(f"pair {i}: offline {1000 * times['offline']:.2f} ms, disabled {1000 * times['disabled']:.2f} ms, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    median = statistics.median(ratios)
    met = median <= TARGET
    print(f"median step-time ratio, default tracking / disabled: {median:.3f} (target <= {TARGET}) — "
          f"{'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
