"""Tracking cost: the default tracking (the job's live W&B run, offline: rank 0's thread reading
the run record every ``tracking.wandb_every_s``; W&B's system monitor; the utilisation thread; the
run record) against ``tracking.wandb=disabled``, same run shape (ddp on base.yaml with epochs
long enough for the live run to log several times), interleaved pairs, median of the ratios of
epoch time (the run's training time: its epochs summed) and of median step time. Two shapes: 2
ranks on 2 cores (every core trains: W&B's thread and services take theirs from the ranks) and 1
rank of one thread (``launch.cpus_per_task=1``: a core to spare, as on a node whose data loaders and
services have cores of their own). A rank alone takes every core by default, so the second shape
must say so."""
from __future__ import annotations

import os

from common import Bench, Section, median

TARGET = 1.02
REPEATS = 9  # pairs: single pairs spread by 10 % and more (0.85-1.29 seen); see benchmarks/README.md
# 1,024 steps an epoch: ~30 s of training over 2 epochs on 2 cores, so the live run logs during it
# (every tracking.wandb_every_s = 10 s) and not only once at the end (16,384 samples trained for
# 3.5 s: shorter than one interval)
SHAPE = ["strategy={name: ddp}", "data.n_train=131072"]
SHAPES = {"every core busy": ("2 ranks", ["launch.tasks_per_node=2"]),
          "a core spare": ("1 rank of 1 thread", ["launch.tasks_per_node=1", "launch.cpus_per_task=1"])}


def run(bench: Bench) -> Section:
    s = Section("Tracking cost: default tracking (live W&B) vs W&B disabled")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # the recipe decides
    s.lines += ["ddp on `base.yaml` with `data.n_train=131072` (1,024 steps an epoch, 2 epochs); epoch time = the "
                "run's training time (`train_time_s`), step time = its median step; pairs interleaved, alternating "
                "which mode runs first.", ""]
    for label, (who, keys) in SHAPES.items():
        shape = [*SHAPE, *keys] + (["training.max_steps=12"] if bench.quick else [])
        tag = who.split()[0]
        epoch_ratios, step_ratios, rows = [], [], []
        for i in range(bench.times(REPEATS)):
            order = ("offline", "disabled") if i % 2 == 0 else ("disabled", "offline")  # alternate who goes first
            runs = {mode: bench.submit(f"tracking/{tag}r{len(keys)}-{i}-{mode}", [*shape, f"tracking.wandb={mode}"], env=env)
                    for mode in order}
            on, off = runs["offline"], runs["disabled"]
            epoch_ratios.append(on["train_time_s"] / off["train_time_s"])
            step_ratios.append(on["step_time_s"] / off["step_time_s"])
            rows.append([i, on["train_time_s"], off["train_time_s"], epoch_ratios[-1], step_ratios[-1]])
        s.lines += [f"**{who}, {label}**", ""]
        s.table(["pair", "tracking on: epochs (s)", "off: epochs (s)", "epoch-time ratio", "step-time ratio"], rows)
        m = median(epoch_ratios)
        s.lines += [f"median step-time ratio {median(step_ratios):.3f}", ""]
        s.check(f"{label}: median epoch-time ratio, default tracking / disabled <= {TARGET}", f"{m:.3f}", m <= TARGET)
    return s
