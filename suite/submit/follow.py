"""Follow submitted jobs to their end: rank 0's progress, job state changes, which ranks started,
the first failing rank's error. A job that fails, is cancelled or loses a rank ends the wait with
a message naming the job and the failing rank's log, within a bounded time: never a wait forever."""
from __future__ import annotations

import json
import time
from pathlib import Path

import submitit

from suite.errors import RunFailed
from suite.record import run_record

# Slurm states after which the job will not run again (PREEMPTED/REQUEUED come back as PENDING).
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
          "DEADLINE", "FINISHED", "INTERRUPTED")


class Watch:
    """One job and its run folder."""

    def __init__(self, job, run_dir: Path, total_epochs: int, printer=print, grace_s: float = 15.0,
                 state_every_s: float = 2.0):
        self.job, self.run_dir, self.printer = job, Path(run_dir), printer
        self.progress = _Progress(self.run_dir, total_epochs, printer, prefix=f"[{job.job_id}] ")
        self.grace_s, self.state_every_s = grace_s, state_every_s
        self.state, self._state_at, self._failed_at, self._started = None, 0.0, None, set()
        self.cancelled_by_us = False

    def poll(self) -> bool:
        """Update and print; True when the job has ended."""
        if isinstance(self.job, submitit.DebugJob):
            try:
                self.job.results()  # runs the task in this process
            except Exception:  # noqa: BLE001 - the rank's error file says what happened
                pass
            self.progress.show()
            return True
        self.progress.show()
        self._update_state()
        if self.state and self.state.split()[0] in ("RUNNING", "COMPLETED", "FINISHED"):
            self._report_started_ranks()
        if self._failed_at is None and run_record.first_error(self.run_dir):
            self._failed_at = time.time()
        if self._failed_at is not None and time.time() - self._failed_at > self.grace_s and not self.ended:
            self.job.cancel()  # a rank failed and its peers did not follow within the grace time
            self.cancelled_by_us = True
            return True
        return self.ended

    @property
    def ended(self) -> bool:
        return bool(self.state) and self.state.split()[0] in _ENDED

    def _update_state(self) -> None:
        if time.time() - self._state_at < self.state_every_s and self.state is not None:
            return
        self._state_at = time.time()
        if isinstance(self.job, submitit.local.local.LocalJob):
            state = self.job.state
        else:
            state = self.job.watcher.get_state(self.job.job_id, mode="force")
        if state != self.state:
            self.printer(f"[{self.job.job_id}] {state}")
            self.state = state

    def _report_started_ranks(self) -> None:
        started = {k for k in range(self.job.num_tasks) if self.job.task(k).paths.stdout.exists()}
        if started != self._started:
            self._started = started
            self.printer(f"[{self.job.job_id}] ranks started: {sorted(started)} of {self.job.num_tasks} "
                         f"(logs: {self.job.paths.folder})")

    def outcome(self) -> dict:
        """The completed run's summary; RunFailed naming the job and the failing rank otherwise."""
        self.progress.show()
        error = run_record.first_error(self.run_dir) or _submitit_error(self.job)
        job = f"job {self.job.job_id}"
        silent = _silent_ranks(self.job, self.run_dir) if error and not self.cancelled_by_us else []
        if silent:  # a rank vanished (killed, out of memory); its peers' errors only echo that
            rank = silent[0]
            line = (f"rank {rank} died without a Python error (killed by a signal or the OOM killer?); "
                    f"its peers then failed: rank {error[0]}: {error[1]}")
            run_record.update_summary(self.run_dir, status="failed", error=line, failed_rank=rank, job_id=self.job.job_id)
            raise RunFailed(f"{job} (run {self.run_dir.name}) failed: {line} "
                            f"(rank {rank}'s log: {self.job.task(rank).paths.stderr})")
        if error:
            rank, line, path = error
            run_record.update_summary(self.run_dir, status="failed", error=line, failed_rank=rank, job_id=self.job.job_id)
            raise RunFailed(f"{job} (run {self.run_dir.name}) failed: rank {rank}: {line} "
                            f"(traceback: {path}; logs: {self.job.paths.folder})")
        summary = run_record.read_json(self.run_dir / "summary.json") if (self.run_dir / "summary.json").exists() else {}
        if summary.get("status") != "completed":
            why = f"ended as {self.state}" if self.state else "ended without completing"
            run_record.update_summary(self.run_dir, status="failed", error=why, job_id=self.job.job_id)
            raise RunFailed(f"{job} (run {self.run_dir.name}) {why}; rank 0's log: "
                            f"{self.job.task(0).paths.stderr}")
        return summary


def wait(watches: list[Watch], poll_s: float = 0.5, on_done=None) -> None:
    """Poll every job until all have ended; ``on_done(watch)`` is called once per ended job."""
    pending = list(watches)
    while pending:
        for w in list(pending):
            if w.poll():
                pending.remove(w)
                if on_done:
                    on_done(w)
        if pending:
            time.sleep(poll_s)


def _silent_ranks(job, run_dir: Path) -> list[int]:
    """Ranks that left neither an error record nor a submitit result: they were killed."""
    recorded = run_record.error_ranks(run_dir)
    return [k for k in range(job.num_tasks)
            if k not in recorded and not job.task(k).paths.result_pickle.exists()]


def _submitit_error(job):
    """A task that died before our loop could record anything (import error, bad pickle)."""
    for task_id in range(job.num_tasks):
        pickle = job.task(task_id).paths.result_pickle
        if pickle.exists():
            status, value = submitit.core.utils.pickle_load(pickle)
            if status == "error":
                last = [ln for ln in str(value).strip().splitlines() if ln.strip()][-1]
                return task_id, last, job.task(task_id).paths.stderr
    return None


class _Progress:
    """Prints rank 0's epoch records as they land, and a step line at most every few seconds."""

    def __init__(self, run_dir, total_epochs, printer, prefix="", every_s: float = 5.0):
        self.path = run_dir / "metrics.jsonl"
        self.total_epochs, self.printer, self.prefix, self.every_s = total_epochs, printer, prefix, every_s
        self.offset = 0
        self.last_print = time.time()
        self.last_step = None

    def show(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # only whole lines
        self.offset += end
        for line in chunk[:end].decode().splitlines():
            rec = json.loads(line)
            if rec.get("rank") != 0:
                continue
            if rec["kind"] == "epoch":
                self.printer(self.prefix + run_record.epoch_line(rec, self.total_epochs))
                self.last_print, self.last_step = time.time(), None
            elif rec["kind"] == "step" and rec.get("global_loss") is not None:
                self.last_step = rec
        if self.last_step and time.time() - self.last_print > self.every_s:
            s = self.last_step
            self.printer(f"{self.prefix}  step {s['step'] + 1}  epoch {s['epoch'] + 1}  loss {s['global_loss']:.4f}")
            self.last_print, self.last_step = time.time(), None
