"""Requests to stop a run early, agreed by every rank at the same step.

- Preemption: Slurm (or submitit's local executor) sends SIGUSR2 before a time limit or when
  it preempts. Every rank saves a checkpoint, then rank 0 hands over to submitit's own handler,
  which requeues the job; the next attempt resumes from the checkpoint.
- Cancellation: SIGINT (Ctrl-C, or ``suite.submit`` forwarding it), or the local ``suite.submit``
  that follows the run has gone away (killed: nobody would watch the run). Every rank saves a
  checkpoint and stops; the run is marked ``cancelled`` and ``suite.submit --resume`` continues it.

The signal handlers only raise a flag: a rank may be inside a collective when the signal
arrives. The loop adds the flags to the reduction it runs anyway (``suite.train.loop``), so all
ranks see the request at the same step, save there and stop together.
"""
from __future__ import annotations

import signal
import threading

from suite.common.processes import alive
from suite.compat import submitit as submitit_compat

_preempt = threading.Event()
_cancel = threading.Event()
_submitit_handler = None
_watcher_pid: int | None = None  # the local suite.submit following this run, if any


class Stopped(BaseException):
    """Raised on every rank after the stop checkpoint is saved (not an error)."""
    status = "stopped"


class Preempted(Stopped):
    """``exit_code`` is set on the rank whose process submitit asked to exit (after requeueing)."""
    status = "preempted"

    def __init__(self, exit_code=None):
        super().__init__("preempted: checkpoint saved")
        self.exit_code = exit_code


class Cancelled(Stopped):
    status = "cancelled"

    def __init__(self, why: str):
        super().__init__(why)


def install_handlers(watcher_pid: int | None = None) -> None:
    """Flag SIGUSR2 (keeping submitit's handler to call once the checkpoint is safe) and SIGINT."""
    global _submitit_handler, _watcher_pid
    _watcher_pid = watcher_pid
    if threading.current_thread() is not threading.main_thread():
        return
    _submitit_handler = submitit_compat.requeue_handler()
    signal.signal(signal.SIGUSR2, lambda signum, frame: _preempt.set())
    signal.signal(signal.SIGINT, lambda signum, frame: _cancel.set())


def requests() -> tuple[float, float]:
    """(preempt, cancel) as 0/1 for this rank, to be summed over ranks by the loop's reduction."""
    if _watcher_pid is not None and not alive(_watcher_pid):
        _cancel.set()
    return float(_preempt.is_set()), float(_cancel.is_set())


def hand_over_to_submitit(ctx) -> None:
    """Rank 0: let submitit requeue the job (it exits the process); others just stop."""
    _preempt.clear()
    if ctx.is_main and _submitit_handler is not None:
        try:
            _submitit_handler(signal.SIGUSR2, None)  # submitit: requeue, then sys.exit
        except SystemExit as e:
            raise Preempted(e.code) from None
    raise Preempted()


def cancel(ctx) -> None:
    _cancel.clear()
    why = "cancelled: Ctrl-C / SIGINT, or the suite.submit following the run went away"
    raise Cancelled(why)
