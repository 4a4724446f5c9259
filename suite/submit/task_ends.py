"""How a followed job's tasks ended, from what they left: srun's lines in task 0's log, the
ranks' error records and submitit's result files. The follower (``suite.submit.follow``) names
the failing rank and the signal from them."""
from __future__ import annotations

import re
import signal
from pathlib import Path

from suite.compat import submitit as submitit_compat
from suite.record import run_record


def silent_ranks(job, run_dir: Path) -> list[int]:
    """Ranks that left neither an error record nor a submitit result: they were killed."""
    recorded = run_record.error_ranks(run_dir)
    return [k for k in range(job.num_tasks)
            if k not in recorded and not submitit_compat.left_result(job.task(k))]


def srun_first_bad_exit(job) -> int | None:
    """The task srun saw exit with an error code first, from srun's own lines in task 0's log
    (``srun: error: n1: task 0: Exited with exit code 1``, then ``task 1: Killed`` for the task
    --kill-on-bad-exit ended); None when the first bad end was a kill, or srun said nothing."""
    try:
        text = Path(job.task(0).paths.stderr).read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"^srun: error: \S+: tasks? (\d+)[\d,-]*: (.*)$", text, re.MULTILINE)
    return int(found.group(1)) if found and found.group(2).startswith("Exited with exit code") else None


# srun's word for a task a signal ended ("Killed") -> the signal's name ("SIGKILL")
SIGNAL_WORDS = {signal.strsignal(s): s.name for s in signal.Signals if signal.strsignal(s)}


def srun_first_end(job, task: int | None = None):
    """(task, node, what) of srun's first line about a task that ended badly, in task 0's log
    (``srun: error: n1: task 1: Killed``), or of ``task``'s first; None when srun said nothing."""
    try:
        text = Path(job.task(0).paths.stderr).read_text(errors="replace")
    except OSError:
        return None
    for found in re.finditer(r"^srun: error: (\S+): tasks? ([\d,-]+): (.*)$", text, re.MULTILINE):
        tasks = task_list(found.group(2))
        if task is None or task in tasks:
            return (task if task is not None else tasks[0]), found.group(1), found.group(3).strip()
    return None


def task_list(text: str) -> list[int]:
    """srun's task list ("0", "0-1", "0,2-3") as numbers."""
    out = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        if first.isdigit():
            out.extend(range(int(first), int(last) + 1) if last.isdigit() else [int(first)])
    return out


def submitit_error(job):
    """A task that died before our loop could record anything (import error, bad pickle)."""
    for task_id in range(job.num_tasks):
        task = job.task(task_id)
        failure = submitit_compat.task_error(task)  # never waits (exception() would, for a pool)
        if failure is not None:
            last = [ln for ln in failure.strip().splitlines() if ln.strip()][-1]
            return task_id, last, task.paths.stderr
    return None
