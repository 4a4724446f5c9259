"""Memory: the bytes of parameters, gradients and optimizer state each rank holds, measured
(summary ranks[].held_bytes) against the dry run's prediction (``suite.planner.memory``), for ZeRO-1/2/3
and FSDP at world size 2 and 4."""
from __future__ import annotations

from common import BASE, Bench, Section

LOW, HIGH = 0.95, 1.05
# An MLP with Adam, so that optimizer state (2x parameters) dominates what ZeRO shards.
SHAPE = ["model={name: mlp, hidden: [512, 512]}", "data.shape=[1, 28, 28]", "training.epochs=1",
         "training.max_steps=4", "tracking.wandb=disabled"]
STRATEGIES = {"zero1": "{name: zero, stage: 1}", "zero2": "{name: zero, stage: 2}",
              "zero3": "{name: zero, stage: 3}", "fsdp": "{name: fsdp}"}
KEYS = ("parameters", "gradients", "optimizer_state")


def predicted(overrides: list[str]) -> dict:
    from suite import recipe as recipes
    from suite.planner.memory import predicted_held_bytes

    (recipe,) = recipes.load(BASE, overrides)
    return predicted_held_bytes(recipe)["per_rank"]


def run(bench: Bench) -> Section:
    s = Section("Memory: held bytes per rank, measured vs predicted")
    rows, worst = [], {}
    for label, strategy in STRATEGIES.items():
        for world in (2, 4):
            overrides = [*SHAPE, f"strategy={strategy}", f"launch.tasks_per_node={world}"]
            want = predicted(overrides)
            got = bench.submit(f"memory/{label}-w{world}", overrides)
            ratios = {k: [r["held_bytes"][k] / want[k] for r in got["ranks"]] for k in KEYS if want[k]}
            far = max((r for rs in ratios.values() for r in rs), key=lambda r: abs(r - 1))
            worst[label, world] = far
            rows.append([label, world, *(f"{int(want[k]):,} / {max(r['held_bytes'][k] for r in got['ranks']):,}"
                                         for k in KEYS), far])
    s.lines += ["MLP 784-512-512-10, Adam, fp32. Each cell: predicted bytes per rank (`--dry-run`) / the most any "
                "rank measured; ratio = measured / predicted, the one farthest from 1 over ranks and kinds. World 4 "
                "runs 4 ranks on 2 cores (oversubscribed: fine for bytes).", ""]
    s.table(["strategy", "world", "parameters", "gradients", "optimizer state", "worst ratio"], rows)
    for (label, world), far in worst.items():
        s.check(f"{label} at world {world}: {LOW} <= measured / predicted <= {HIGH}", f"{far:.3f}", LOW <= far <= HIGH)
    return s
