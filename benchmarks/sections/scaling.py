"""Scaling: samples/s at world size 1 and 2 (one thread per rank, same global batch) and the
efficiency samples/s(2) / (2 x samples/s(1)) for each data-parallel strategy."""
from __future__ import annotations

from common import Bench, Section, median

STRATEGIES = {"ddp": "{name: ddp}", "allreduce": "{name: allreduce}", "zero1": "{name: zero, stage: 1}",
              "zero2": "{name: zero, stage: 2}", "zero3": "{name: zero, stage: 3}", "fsdp": "{name: fsdp}",
              "oss": "{name: oss}"}


def run(bench: Bench) -> Section:
    s = Section("Scaling: world size 1 and 2")
    shape = ["launch.cpus_per_task=1", "tracking.wandb=disabled"] + (["training.max_steps=12"] if bench.quick else [])
    rows = []
    for label, strategy in STRATEGIES.items():
        rate = {}
        for world in (1, 2):
            rate[world] = median(bench.submit(f"scaling/{label}-w{world}-{rep}", [
                f"strategy={strategy}", f"launch.tasks_per_node={world}", *shape])["samples_per_s"]
                for rep in range(bench.times()))
        rows.append([label, rate[1], rate[2], rate[2] / rate[1], rate[2] / (2 * rate[1])])
    s.lines += ["CNN on synthetic 3x32x32, global batch 128, Adam (`base.yaml`); one thread per rank, so world 2 "
                f"uses both cores; samples/s of the run (median of {bench.times()}). Efficiency = samples/s at 2 / "
                "(2 x samples/s at 1).", ""]
    s.table(["strategy", "samples/s, world 1", "samples/s, world 2", "speed-up", "efficiency"], rows)
    return s
