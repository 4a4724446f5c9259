"""Checkpoint cost: training with a checkpoint every 20 steps (written beside training:
``suite.train.checkpoint``'s background saves) against no checkpoints, on ``base.yaml``'s CNN,
interleaved pairs, median of the ratios of time per step. Time per step = the run's training time
(its epochs' wall time, which includes the saves and the waits for them) / its steps: the median
step time would not see a save that falls between steps."""
from __future__ import annotations

from common import Bench, Section, median

TARGET = 1.05
EVERY = 20
REPEATS = 11
# 4 epochs of base.yaml: 128 steps, 6 saves a run, 11 pairs. At 2 epochs (64 steps, 3 saves) one pair's ratio
# moved 0.82-1.31 between pairs of the same setting on 2 cores: too short to judge 5 %.
EPOCHS = 4
SHAPES = {"single, 1 rank": [], "ddp, 2 ranks": ["strategy={name: ddp}", "launch.tasks_per_node=2"]}


def per_step_s(summary: dict) -> float:
    return summary["train_time_s"] / summary["steps"]


def run(bench: Bench) -> Section:
    s = Section(f"Checkpoint cost: a save every {EVERY} steps vs none")
    quick = ["training.max_steps=24", "training.epochs=1"] if bench.quick else [f"training.epochs={EPOCHS}"]
    rows, ratios = [], []
    for name, shape in SHAPES.items():
        mine = []
        for i in range(bench.times(REPEATS)):
            order = ("saves", "none") if i % 2 == 0 else ("none", "saves")  # alternate who goes first
            times = {}
            for mode in order:
                every = [f"training.checkpoint_every_steps={EVERY}"] if mode == "saves" else []
                folder = f"checkpoint/{name.split(',')[0]}-{i}-{mode}"
                summary = bench.submit(folder, [*shape, *quick, *every])
                times[mode] = per_step_s(summary)
            mine.append(times["saves"] / times["none"])
            rows.append([name, i, 1000 * times["saves"], 1000 * times["none"], mine[-1]])
        ratios.append((name, median(mine)))
    s.lines += [f"`base.yaml` (the cnn, synthetic 3x32x32, global batch 128, Adam, {EPOCHS} epochs: 128 steps); "
                "time per step = training "
                f"time / steps, with `training.checkpoint_every_steps={EVERY}` and without; pairs interleaved, "
                "alternating which runs first.", ""]
    s.table(["shape", "pair", f"saving every {EVERY} (ms/step)", "no checkpoints (ms/step)", "ratio"], rows)
    for name, m in ratios:
        s.check(f"{name}: time per step with a save every {EVERY} steps / none <= {TARGET}", f"{m:.3f}", m <= TARGET)
    return s
