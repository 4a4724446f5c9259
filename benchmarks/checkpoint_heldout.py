"""Checkpoint cost on a model the checkpoint section was not tuned on: any recipe, N interleaved
pairs with ``training.checkpoint_every_steps=20`` and without, the ratio of training time per step.

    python benchmarks/checkpoint_heldout.py recipes/quickstart.yaml 9 training.epochs=40

Runs should be long (hundreds of steps): the quickstart MLP's 2.5 ms steps vary by 30 % between
runs of 176 steps on 2 cores, more than the cost measured."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def per_step_s(folder: Path) -> tuple[float, int]:
    summary = json.loads(next(folder.rglob("summary.json")).read_text())
    return summary["train_time_s"] / summary["steps"], summary["steps"]


def main(recipe: str, pairs: int, overrides: list[str]) -> float:
    out, ratios = Path(tempfile.mkdtemp(prefix="checkpoint-heldout-")), []
    for i in range(pairs):
        times = {}
        for mode in (("saves", "none") if i % 2 == 0 else ("none", "saves")):  # alternate who goes first
            every = ["training.checkpoint_every_steps=20"] if mode == "saves" else []
            folder = out / f"{mode}-{i}"
            subprocess.run([sys.executable, "-m", "suite.submit", recipe, "--out", str(folder), "tracking.wandb=disabled",
                            *overrides, *every], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[mode], steps = per_step_s(folder)
        ratios.append(times["saves"] / times["none"])
        print(f"pair {i}: saves {1000 * times['saves']:.2f} ms/step, none {1000 * times['none']:.2f} ms/step, "
              f"ratio {ratios[-1]:.3f} ({steps} steps)", flush=True)
    print(f"median {statistics.median(ratios):.3f}")
    return statistics.median(ratios)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
