"""Slow ranks: where each rank's step time went, and which rank the others waited for.

From ``summary.json``: each rank's median compute and collective seconds per step (``compute_s``,
``collective_s``: suite.strategies.clock; recorded by the data-parallel strategies that split their
step, on CPU), its CPU quota (``cpu_quota``: launch.rank_cpu or a capped Slurm node), its share of
the global batch (``batch_share``: training.balance) and the run's ``straggler``
(suite.record.metrics.straggler: the rank whose compute per step is at least 1.2x the fastest's)."""
from __future__ import annotations

COLUMNS = {"run_id": "run", "arm": "arm", "strategy": "strategy", "balance": "batch split", "rank": "rank",
           "cpu_quota": "CPU quota (CPUs)", "batch_share": "samples per step", "compute_s": "compute (s/step)",
           "collective_s": "in collectives (s/step)", "step_time_s": "step (s)", "straggler": "straggler"}
NOTE = ("Each rank's mean compute per step (its own forward, backward and optimizer step) and time in "
        "collectives after its backward (waiting for slower peers, then the transfer). The straggler is the rank "
        "whose compute is at least 1.2x the fastest rank's: a synchronous step goes at its pace, and its peers' "
        "collective time is mostly waiting for it. Batch split: training.balance (equal, or shares by speed).")


def rows(runs) -> list[dict]:
    """One row per rank of every run whose ranks recorded the split (others have nothing to show)."""
    out = []
    for run in runs:
        ranks = [r for r in run.summary.get("ranks", []) if r.get("compute_s") is not None]
        if len(ranks) < 2:
            continue
        slow = (run.summary.get("straggler") or {}).get("rank")
        balance = (run.recipe.get("training") or {}).get("balance", "equal")
        for r in ranks:
            out.append({"run_id": run.run_id, "arm": run.arm, "strategy": run.strategy, "balance": balance,
                        "rank": r["rank"], "cpu_quota": r.get("cpu_quota"), "batch_share": r.get("batch_share"),
                        "compute_s": r["compute_s"], "collective_s": r.get("collective_s"),
                        "step_time_s": r.get("step_time_s"), "straggler": "straggler" if r["rank"] == slow else ""})
    return out


def stragglers(runs) -> list[str]:
    """One sentence per run with a straggler, naming it."""
    lines = []
    for run in runs:
        slow = run.summary.get("straggler")
        if slow:
            waited = slow.get("peers_collective_s")
            lines.append(f"{run.run_id} ({run.strategy}): rank {slow['rank']} is the straggler, computing "
                         f"{slow['compute_s']:.3g} s per step against the fastest rank's "
                         f"{slow['fastest_compute_s']:.3g} s" + (f"; its peers spend {waited:.3g} s per step in "
                                                                  f"collectives" if waited is not None else "") + ".")
    return lines
