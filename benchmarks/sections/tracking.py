"""Tracking cost: the default tracking (W&B offline, utilisation thread, run record) against
``tracking.wandb=disabled``, same run shape (ddp, base.yaml, 2 ranks), interleaved pairs, median
of the step-time ratios."""
from __future__ import annotations

import os

from common import Bench, Section, median

TARGET = 1.02
REPEATS = 9  # pairs: single pairs spread by 10 % and more (0.85-1.29 seen); see benchmarks/README.md


def run(bench: Bench) -> Section:
    s = Section("Tracking cost: default tracking vs W&B disabled")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # the recipe decides
    shape = ["strategy={name: ddp}", "launch.tasks_per_node=2"] + (["training.max_steps=12"] if bench.quick else [])
    ratios, rows = [], []
    for i in range(bench.times(REPEATS)):
        order = ("offline", "disabled") if i % 2 == 0 else ("disabled", "offline")  # alternate who goes first
        times = {mode: bench.submit(f"tracking/{i}-{mode}", [*shape, f"tracking.wandb={mode}"], env=env)["step_time_s"]
                 for mode in order}
        ratios.append(times["offline"] / times["disabled"])
        rows.append([i, 1000 * times["offline"], 1000 * times["disabled"], ratios[-1]])
    s.lines += ["ddp on `base.yaml`, 2 ranks; step time = the run's median step time; pairs interleaved, "
                "alternating which mode runs first.", ""]
    s.table(["pair", "offline W&B step (ms)", "disabled step (ms)", "ratio"], rows)
    m = median(ratios)
    s.check(f"median step-time ratio, default tracking / disabled <= {TARGET}", f"{m:.3f}", m <= TARGET)
    return s
