"""``python -m suite.export RUN_DIR [RUN_DIR ...] [--mode offline|online]``: write W&B runs (one
per rank, grouped by run id) from run records, e.g. for runs recorded with W&B disabled, or to
retry an export that failed. See suite/record/wandb_export.py."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from suite.record import run_record
from suite.record.wandb_export import export_rank


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.export", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (holding recipe.yaml and metrics.jsonl)")
    p.add_argument("--mode", choices=["offline", "online"], default="offline")
    args = p.parse_args(argv)
    failed = 0
    for folder in map(Path, args.runs):
        if not (folder / "recipe.yaml").is_file() or not (folder / "metrics.jsonl").is_file():
            print(f"error: {folder} is not a run folder with records (recipe.yaml and metrics.jsonl)", file=sys.stderr)
            return 2
        ranks = sorted({r.get("rank", 0) for r in run_record.iter_metrics(folder)})
        for rank in ranks:
            notice = export_rank(folder, rank, args.mode)
            if notice:
                print(notice, file=sys.stderr)
                failed += "failed" in notice
        print(f"{folder}: W&B runs of ranks {ranks} written ({args.mode}) to {folder / 'wandb'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
