"""Tracking cost alone (a shortcut for ``python benchmarks/compare.py --only tracking``): the
default tracking (the job's live W&B run, offline; utilisation thread; run record) against
``tracking.wandb=disabled``, interleaved pairs at 2 ranks and at 1, median epoch-time ratio.
Target: at most 1.02. Run it on a quiet machine.

    python benchmarks/tracking_cost.py [--pairs 4] [--out /tmp/tracking-cost]
"""
from __future__ import annotations

import argparse
import shutil
import sys

from compare import main as compare

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--out", default="/tmp/tracking-cost")
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    sys.exit(compare(["--only", "tracking", "--repeats", str(args.pairs), "--out", args.out]))
