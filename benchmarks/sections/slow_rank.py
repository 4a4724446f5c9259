"""Slow rank: ddp at world size 2 with rank 1 capped at 50% of its core (launch.rank_cpu, cgroup v1),
the equal batch split against training.balance=speed, interleaved. Theory: with the equal split
each step waits for the slow rank's half of the batch at half speed (B/2 / (v/2) = B / v); split
2:1 by speed, both finish B/3 / (v/2) = 2B / 3v: 1.5x. Also reported: each rank's compute and
collective time per step, the shares chosen, and the straggler each run names; and, under the same
slow rank, the time the asynchronous strategies (hogwild, param_server) take to reach an accuracy
against ddp's (not judged)."""
from __future__ import annotations

from common import Section, median, steps

TARGET = 1.3  # step-time ratio equal / speed
SHAPE = ["strategy={name: ddp}", "launch.tasks_per_node=2", "launch.cpus_per_task=1", "launch.rank_cpu=[100%, 50%]",
         "tracking.wandb=disabled"]
ASYNC = ["ddp", "hogwild", "param_server"]
ASYNC_EPOCHS = 4  # base.yaml's data, evaluated after each epoch: the times to target are epoch ends
TARGET_SHARE = 0.95  # the accuracy to reach: this share of ddp's final one under the same slow rank
SKIP = 2  # steps left out of the mean: the first (allocations) and the one after the speed probe


def mean_step_s(run_dir) -> float:
    """Mean (not median: a CFS-capped rank stalls in some steps of each 100 ms period) step time
    of rank 0 after the first SKIP steps; the ranks are synchronous, so any rank's is the step's."""
    times = [s["step_time_s"] for s in steps(run_dir) if s["step"] >= SKIP]
    return sum(times) / len(times)


def run(bench) -> Section:
    s = Section("Slow rank: balance by speed vs equal split")
    shape = SHAPE + (["training.max_steps=12"] if bench.quick else [])
    times = {"equal": [], "speed": []}
    last = {}
    for rep in range(bench.times()):
        for balance in ("equal", "speed"):  # interleaved: a change in the machine's load hits both
            summary = bench.submit(f"slow_rank/{balance}-{rep}", [*shape, f"training.balance={balance}"])
            times[balance].append(mean_step_s(summary["run_dir"]))
            last[balance] = summary
    equal, speed = median(times["equal"]), median(times["speed"])
    s.lines += ["ddp, 2 ranks of one thread each, rank 1 capped at 50% of its core (`launch.rank_cpu=[100%, 50%]`); "
                f"`base.yaml` (CNN, synthetic 3x32x32, global batch 128, Adam). Mean step time after step {SKIP} "
                f"(median of {bench.times()} interleaved runs each). Theory: 1.5x.", ""]
    rows = []
    for balance, summary in last.items():
        for r in summary["ranks"]:
            rows.append([balance, r["rank"], r.get("cpu_quota"), r.get("batch_share"), r.get("compute_s"),
                         r.get("collective_s"), (summary.get("straggler") or {}).get("rank") == r["rank"]])
    s.table(["balance", "rank", "CPU quota", "samples/step", "compute (s/step)", "in collectives (s/step)",
             "straggler"], rows)
    s.table(["balance", "mean step (s)", "runs"], [["equal", equal, times["equal"]], ["speed", speed, times["speed"]]])
    ratio = equal / speed
    s.check(f"balance=speed steps >= {TARGET}x faster than the equal split with one rank at 50% CPU",
            f"{ratio:.2f}x (shares {last['speed'].get('balance', {}).get('shares')})", ratio >= TARGET)
    asynchronous(bench, s)
    return s


def asynchronous(bench, s: Section) -> None:
    """Under the same slow rank, equal split: ddp, hogwild and param_server, time to an accuracy."""
    from suite.record import run_record  # late: as common.steps, once compare.py has put the repository on the path

    epochs = 2 if bench.quick else ASYNC_EPOCHS
    curves = {}
    for name in ASYNC:
        shape = [o for o in SHAPE if not o.startswith("strategy=")]
        summary = bench.submit(f"slow_rank/async-{name}", [*shape, f"strategy={{name: {name}}}",
                                                           f"training.epochs={epochs}"])
        records = run_record.read_metrics(summary["run_dir"], kind="epoch", rank=0)
        elapsed, curve = 0.0, []
        for e in sorted(records, key=lambda e: e["epoch"]):
            elapsed += e["epoch_time_s"]
            curve.append((elapsed, e.get("val_accuracy")))
        curves[name] = curve
    final = curves["ddp"][-1][1] if curves["ddp"] else None
    target = TARGET_SHARE * final if final else None
    rows = []
    for name, curve in curves.items():
        reached = next((t for t, acc in curve if target is not None and acc is not None and acc >= target), None)
        rows.append([name, curve[-1][1] if curve else None, curve[-1][0] if curve else None, reached])
    s.lines += ["", f"Asynchronous vs synchronous under the same slow rank (rank 1 at 50%, equal split, {epochs} "
                f"epochs, one run each): training time until the validation accuracy first reaches {TARGET_SHARE:.0%} "
                f"of ddp's final ({target if target is None else f'{target:.3f}'}), at epoch ends. Reported, not judged.", ""]
    s.table(["strategy", "final val accuracy", "training time (s)", "time to target (s)"], rows)
