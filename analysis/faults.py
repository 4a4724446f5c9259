"""Faults: what a rank's death cost a run that restarted (``launch.max_restarts``).

From ``summary.json``'s ``attempts`` (suite.record.run_record: each attempt's ``started_at`` and
``from_step``, a restart's ``cause``) and rank 0's step records (``step_time_s`` per step, the
latest record of each step). Per restart: the step the failed attempt died after (from the cause), the
checkpoint the restart resumed from, the steps redone, and the time lost to the fault:

    lost = restart's start - failed attempt's start - time of the steps the failed attempt kept

(the steps after the previous attempt's checkpoint up to the restart's ``from_step``). It holds the
steps redone, the time to notice the death and to launch again; the failed attempt's own start-up
stands in for the restart's. Torch-free.
"""
from __future__ import annotations

import re

_AFTER_STEP = re.compile(r"after step (\d+)")  # the restart's cause, e.g. "rank 1 killed by SIGKILL after step 37"

COLUMNS = {"run_id": "run", "arm": "arm", "restart": "restart", "cause": "cause",
           "last_logged_step": "died after step", "from_step": "resumed from step",
           "steps_redone": "steps redone", "lost_s": "time lost (s)", "wall_time_s": "run wall time (s)"}
NOTE = ("Per automatic restart: derived: time lost = the restart's start - the failed attempt's start - the "
        "time of the steps the failed attempt kept (up to the checkpoint the restart resumed from). It holds the "
        "redone steps, noticing the death and launching again; the failed attempt's start-up stands in for the "
        "restart's.")


def rows(runs) -> list[dict]:
    """One row per automatic restart of every run that had one."""
    out = []
    for run in runs:
        attempts = run.summary.get("attempts") or []
        steps = run.steps.get(0, [])
        for before, after in zip(attempts, attempts[1:]):
            if not after.get("restart") or before.get("started_at") is None or after.get("started_at") is None:
                continue
            start, resumed = int(before.get("from_step") or 0), int(after.get("from_step") or 0)
            kept_s = sum(r.get("step_time_s") or 0.0 for r in steps if start < r["step"] <= resumed)
            died = _AFTER_STEP.search(after.get("cause") or "")
            last = int(died.group(1)) if died else None
            out.append({"run_id": run.run_id, "arm": run.arm, "restart": after["restart"], "cause": after.get("cause"),
                        "last_logged_step": last, "from_step": resumed,
                        "steps_redone": (last - resumed) if last is not None else None,
                        "lost_s": after["started_at"] - before["started_at"] - kept_s,
                        "wall_time_s": (run.summary.get("finished_at") or 0) - (run.summary.get("started_at") or 0)})
    return out
