"""submitit internals the launcher, the follower and the preemption handler rely on. Every access
was checked on submitit 1.5.4 (constraints.txt, the tested set; ``suite.compat.CHECKED``) and only that
version; docs/compat.md says what each is for. Everything else the suite uses is submitit's public
API (executors, ``Job.state``/``cancel``/``task``/``exception``, ``JobEnvironment``, ``helpers``).
"""
from __future__ import annotations

import signal

from suite.compat import import_internal, require_attr

LIB = "submitit"


def left_result(task) -> bool:
    """Whether a task (``job.task(k)``) wrote its result file, as every task that returns or raises
    does. A task killed by a signal (or the OOM killer) writes none, which is how the follower
    tells a killed rank from a failed one: the public ``done()`` cannot, since a local job's
    state is FINISHED either way and ``done`` falls back to that state."""
    paths = require_attr(task, "paths", lib=LIB, what="a task's file paths")
    return require_attr(paths, "result_pickle", lib=LIB, what="the file a task's outcome is pickled to").exists()


def task_error(task) -> str | None:
    """The traceback a task ended with (its result file says "error"), or None: read from the
    result file directly. The public ``exception()`` first waits for the job to be done, and a
    local job is done only when all its tasks are (a warm pool's rank 0 goes on serving points
    after another task failed): waiting there never ends."""
    if not left_result(task):
        return None
    load = import_internal("submitit.core.utils", "pickle_load", lib=LIB, what="reads a task's result file")
    outcome, payload = load(task.paths.result_pickle)
    return str(payload) if outcome == "error" else None


def task_paths(folder, job_id: str, task_id: int):
    """The log files submitit gives task ``task_id`` of a job (``.stdout``, ``.stderr``): a rank
    forked inside a pool writes its output to its own task's files (suite/tasks/pool.py)."""
    paths_class = import_internal("submitit.core.utils", "JobPaths", lib=LIB, what="where a task's files go")
    return paths_class(folder, job_id, task_id)


def write_result(task_paths, outcome: str, payload) -> None:
    """Write a task's result file as submitit's task wrapper does (``("success", result)`` or
    ``("error", traceback)``, pickled aside and moved in place): an MPI rank, which submitit did
    not start, ends this way so that ``left_result``/``task_error`` read it as any task's."""
    utils = import_internal("submitit.core.utils", "temporary_save_path", lib=LIB, what="writes a result file")
    dump = import_internal("submitit.core.utils", "cloudpickle_dump", lib=LIB, what="pickles a result")
    with utils(task_paths.result_pickle) as tmp:
        dump((outcome, payload), tmp)


def failed_job_error() -> type:
    """The exception an executor's ``submit`` raises when the scheduler refuses a job (sbatch's error)."""
    return import_internal("submitit.core.utils", "FailedJobError", lib=LIB, what="a refused submission")


def requeue_handler():
    """The SIGUSR2 handler submitit's task wrapper installs for a ``Checkpointable`` callable
    (checkpoint, requeue, exit), or None where the rank was not started by submitit (torchrun).
    The suite keeps it and calls it once its own checkpoint is safe (suite/train/stop.py)."""
    handler = signal.getsignal(signal.SIGUSR2)  # SIG_DFL / SIG_IGN (ints) where nobody installed one
    if not callable(handler):
        return None
    return handler if (handler.__module__ or "").startswith("submitit.") else None
