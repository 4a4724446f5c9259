"""Start-up and sweep cost: how long after ``python -m suite.submit`` the first training step of a
2-rank local run is done, where that time goes, and what each point of a local sweep costs beyond
its training time."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from common import QUICKSTART, ROOT, Bench, Section, median, steps

FIRST_STEP_S = 6.0
PER_POINT_S = 2.0
IMPORTS = ["torch", "torch._dynamo", "suite.recipe", "suite.train.rank", "wandb"]


def import_s(module: str) -> float:
    """Cumulative import time of a module in a fresh interpreter (``python -X importtime``)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                          text=True, cwd=ROOT)
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return max(int(r[1]) for r in rows if r[2].strip() == module) / 1e6


def phases(run: dict) -> dict:
    """Seconds after the command started at which each phase of a one-run submission ended."""
    run_dir, t0 = run["run_dir"], run["command_started_at"]
    ranks = [json.loads(p.read_text())["started_at"] for p in (run_dir / "ranks").glob("rank*.json")]
    loop_at = run["attempts"][0]["started_at"]
    return {"checks done (recipe.yaml written)": (run_dir / "recipe.yaml").stat().st_mtime - t0,
            "handed to the ranks (job.json)": json.loads((run_dir / "job.json").read_text())["submitted_at"] - t0,
            "ranks start the run (ranks/*.json)": max(ranks) - t0,
            "loop starts (attempts[0].started_at)": loop_at - t0,
            "first step done": loop_at + steps(run_dir)[0]["step_time_s"] - t0,
            "summary written (finished_at)": run["finished_at"] - t0,
            "command returns": run["wall_s"]}


def run(bench: Bench) -> Section:
    s = Section("Start-up and sweep cost")
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}  # what users run: W&B offline
    runs = [bench.submit(f"startup/one-step-{rep}", ["training.max_steps=1"], recipe=QUICKSTART, env=env)
            for rep in range(bench.times())]
    table = [phases(r) for r in runs]
    s.lines += ["`python -m suite.submit recipes/quickstart.yaml training.max_steps=1` (ddp, 2 local ranks, "
                f"default tracking): seconds after the command started, median of {bench.times()}. The first "
                "step's end is the loop's start plus that step's own time.", ""]
    s.table(["phase", "s after the command", *(f"run {i}" for i in range(len(runs)))],
            [[name, median(t[name] for t in table), *(t[name] for t in table)] for name in table[0]])
    s.lines += ["Import times in a fresh interpreter (`python -X importtime`, cumulative), which the submitting "
                "side (suite.recipe: torch) and each rank (suite.train.rank, torch._dynamo for DDP/FSDP; wandb "
                "when the run ends) pay; the ranks' part runs while the submitting side checks the recipe "
                "(`suite/submit/pool.py`):", ""]
    s.table(["module", "import (s)"], [[m, import_s(m)] for m in IMPORTS])
    first = median(t["first step done"] for t in table)
    s.check(f"first training step of a 2-rank local run <= {FIRST_STEP_S} s after the command", f"{first:.2f} s",
            first <= FIRST_STEP_S)

    n = 4 if bench.quick else 20
    sweep = bench.submit("startup/sweep", ["training.max_steps=1", f"sweep.training.seed=[{','.join(map(str, range(n)))}]"],
                         recipe=QUICKSTART, env=env)
    trained_s = sum(p["train_time_s"] for p in sweep["points"])
    per_point = (sweep["wall_s"] - trained_s) / n
    s.lines += ["", f"A local sweep of {n} one-step points (`sweep.training.seed=[0..{n - 1}]`): {sweep['wall_s']:.1f} s "
                f"in all, {trained_s:.2f} s of it training (summaries' train_time_s): {per_point:.2f} s per point "
                f"beyond its training time, the first point's start-up included. The points' ranks stay warm "
                f"from one point to the next; each point has its own run folder, process group and record.", ""]
    s.check(f"sweep cost per point beyond its training time <= {PER_POINT_S} s", f"{per_point:.2f} s",
            per_point <= PER_POINT_S)
    return s
