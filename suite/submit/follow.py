"""Follow submitted jobs to their end: rank 0's progress, job state changes, which ranks started,
the first failing rank's error. A job that fails, is cancelled or loses a rank ends the wait with
a message naming the job and the failing rank's log, within a bounded time: never a wait forever."""
from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import submitit

from suite.compat import submitit as submitit_compat
from suite.common.errors import RunCancelled, RunFailed
from suite.common.processes import alive
from suite.record import run_record
from suite.record.status import squeue
from suite.submit import restart, task_ends
from suite.submit.progress import Progress

# Slurm states after which the job will not run again (PREEMPTED/REQUEUED come back as PENDING).
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
          "DEADLINE", "FINISHED", "INTERRUPTED", "ENDED")  # ENDED: a local job (see _update_state)


# Slurm states of a job that ended because something under it broke (a task, a node, its memory),
# not because it was cancelled or ran out of time: an automatic restart may get through.
_BROKEN = ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")
# How a run's ranks can end on their own (summary.json's status), without a failure.
_STOPPED = ("completed", "cancelled", "preempted")
# summary.json's statuses once the ranks are through (their job ends a moment later).
_RANKS_DONE = (*_STOPPED, "failed")
# How long after submission (or after its ranks wrote their end) a Slurm job has its state asked at every poll.
QUICK_START_S = 10.0


@dataclass
class Failure:
    """Why a followed run failed, as automatic restarts (suite/submit/restart.py) judge it."""
    cause: str  # one line, e.g. "rank 1 killed by SIGKILL after step 37"
    restartable: bool  # a rank died or crashed, a node was lost; not bad input, not a cancel
    rank: int | None = None
    node: str | None = None  # Slurm's name of the node the failing rank ran on, where known
    waited_s: float = 0.0  # how long the follower already waited for a lost node to come back
    job_nodes: str = ""  # the Slurm job's nodes ("n[1-2]") as squeue listed them while it ran


# Reasons Slurm gives for a pending job that will never start as submitted.
_NEVER_STARTS = ("PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
                 "InvalidQOS", "ReqNodeNotAvail, UnavailableNodes", "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerJob",
                 "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit", "AssocMaxCpuPerJobLimit",
                 "AssocMaxNodesPerJobLimit", "AssocMaxWallDurationPerJobLimit", "AccountNotAllowed")


class Watch:
    """One job and its run folder."""

    def __init__(self, job, run_dir: Path, total_epochs: int, printer=print, grace_s: float = 15.0,
                 state_every_s: float = 2.0, stop_timeout_s: float = 10.0, requeue_wait_s: float | None = None):
        self.job, self.run_dir, self.printer = job, Path(run_dir), printer
        self.progress = Progress(self.run_dir, total_epochs, printer, prefix=f"[{job.job_id}] ")
        self.grace_s, self.state_every_s, self.stop_timeout_s = grace_s, state_every_s, stop_timeout_s
        self.state, self._state_at, self._failed_at, self._started = None, 0.0, None, set()
        self._dead_at_failure: list[int] = []
        self.cancelled_by_us = False
        self.never_starts: str | None = None  # Slurm's reason, for a job that cannot start
        self._since = time.time()  # rank process records older than this are an earlier attempt's
        self.failure: Failure | None = None  # set by outcome() when the run did not complete
        # launch.elastic: a job Slurm requeued after a node failed, or one that never ran and cannot
        # start on the nodes usable, is given up after this long pending (the restart then
        # continues without the node); None: wait for Slurm to run it.
        self.requeue_wait_s, self._requeued_at, self._nodes, self.lost = requeue_wait_s, None, "", None
        self._ran = False  # seen RUNNING (on Slurm): pending after that means requeued
        self._pending_since: float | None = None  # first seen pending, before it ever ran
        self._placed_at = 0.0  # when _cannot_be_placed last asked Slurm
        self.local = isinstance(job, submitit.LocalJob) or getattr(job, "local", False)  # or mpirun's (submit/mpi.py)

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
        if self.state and self.state.split()[0] == "PENDING" and (
                self._cannot_start() or self._node_lost() or self._cannot_be_placed()):
            return True
        if self._failed_at is None:
            # The ranks gone without a word when the failure is first seen; one that recorded its
            # error is its cause, and ranks ending after it (its peers' connections closing) are echoes.
            dead = self._dead_ranks()
            if dead:  # the error files are read only when a rank is gone, not on every poll
                recorded = run_record.error_ranks(self.run_dir)
                dead = [k for k in dead if k not in recorded]
            if run_record.first_error(self.run_dir) or dead:
                self._failed_at, self._dead_at_failure = time.time(), dead
        if self._failed_at is not None and time.time() - self._failed_at > self.grace_s and not self.ended:
            self.kill()  # a rank failed or died and its peers did not follow within the grace time
            self.cancelled_by_us = True
            return True
        return self.ended

    @property
    def ended(self) -> bool:
        return bool(self.state) and self.state.split()[0] in _ENDED

    def _state_due(self) -> bool:
        """Whether this poll asks the job's state. A local job's is a look at its process: every
        poll. Slurm's (``sacct``, a query to its database) is asked every ``state_every_s``, except
        while a change is about to be seen: in the first ``QUICK_START_S`` after submission before
        the job is seen running (the local Slurm starts a job within a second of its submission,
        and a 2 s cadence saw it up to 2 s late), and once the ranks have written their final
        status (summary.json), for ``QUICK_START_S`` or until Slurm says the job ended (seen up to
        3 s after the ranks had finished: every short Slurm run, and every test of one, waited)."""
        now = time.time()
        if self.state is None or self.local or now - self._state_at >= self.state_every_s:
            return True
        if not self._ran and now - self._since < QUICK_START_S:
            return True
        try:  # this attempt's summary, written in the last QUICK_START_S (a requeued job may pend for long)
            written = run_record.summary_path(self.run_dir).stat().st_mtime
        except OSError:
            return False
        if written < self._since or now - written > QUICK_START_S:
            return False
        return run_record.summary_so_far(self.run_dir).get("status") in _RANKS_DONE

    def _update_state(self) -> None:
        if not self._state_due():
            return
        self._state_at = time.time()
        if self.local:
            # submitit calls any ended local job FINISHED, failed or not: outcome() names the real end.
            state = "RUNNING" if self.job.state == "RUNNING" else "ENDED"
        else:
            state = self.job.get_info(mode="force").get("State") or "UNKNOWN"  # asks Slurm now, not a cache
        if state.split()[0] == "RUNNING" and not self.local and not self._nodes and state == self.state:
            self._nodes = squeue(self.job.job_id, "%N") or ""  # not listed yet when first seen running
        if state != self.state:
            if self._ran_between_polls(state):  # a short job can pass PENDING -> COMPLETED between two polls
                self.printer(f"[{self.job.job_id}] RUNNING")
            if state != "ENDED":
                self.printer(f"[{self.job.job_id}] {state}")
            if state.split()[0] == "RUNNING" and not self.local:
                self._nodes = squeue(self.job.job_id, "%N") or self._nodes  # the nodes it runs on
                self._requeued_at, self._ran = None, True  # (again): Slurm reran it
            if state.split()[0] == "PENDING" and self._ran and self._requeued_at is None:
                # It ran and is back (through COMPLETING or REQUEUED, maybe between two polls):
                # Slurm requeued it, after a node failed or for preemption.
                self._requeued_at = time.time()
            self.state = state

    def _ran_between_polls(self, state: str) -> bool:
        """A Slurm job seen pending, then ended, whose tasks wrote their logs: it ran in between."""
        was = (self.state or "").split()[:1]
        return (not self.local and was in ([], ["PENDING"]) and state.split()[0] in _ENDED
                and any(self.job.task(k).paths.stdout.exists() for k in range(self.job.num_tasks)))

    def _report_started_ranks(self) -> None:
        started = {k for k in range(self.job.num_tasks) if self.job.task(k).paths.stdout.exists()}
        if started != self._started:
            self._started = started
            self.printer(f"[{self.job.job_id}] ranks started: {sorted(started)} of {self.job.num_tasks} "
                         f"(logs: {self.job.paths.folder})")

    def _cannot_start(self) -> bool:
        """A pending Slurm job whose reason says it can never run as asked: cancel it, say why."""
        reason = squeue(self.job.job_id, "%r")  # why it pends
        if reason and self.requeue_wait_s is not None and reason.startswith(restart.NODES_UNAVAILABLE):
            return False  # launch.elastic: its nodes may come back within the wait (_cannot_be_placed)
        if reason and any(reason.startswith(r) for r in _NEVER_STARTS):
            self.never_starts = reason
            self.job.cancel(check=False)
            return True
        return False

    def _node_lost(self) -> bool:
        """A job Slurm requeued after it ran (a node failed), pending longer than
        ``requeue_wait_s``: cancelled, and the run fails restartable naming the lost nodes."""
        if self._requeued_at is None or self.requeue_wait_s is None:
            return False
        waited = time.time() - self._requeued_at
        if waited < self.requeue_wait_s:
            return False
        return self._give_up(f"Slurm requeued the job after its node(s) {self._nodes or '?'} failed, and it did "
                             f"not start again within launch.elastic_wait_s={self.requeue_wait_s:g} s", waited)

    def _cannot_be_placed(self) -> bool:
        """launch.elastic: a job that never ran, pending for ``requeue_wait_s`` on nodes that are
        not usable (a restart asked for a node Slurm marked down or drained meanwhile): cancelled,
        and the run fails restartable with the reason, so the next restart fits the nodes left
        (or the run ends saying why) instead of pending until the node returns."""
        if self._ran or self.requeue_wait_s is None:
            return False
        now = time.time()
        self._pending_since = self._pending_since or now
        waited = now - self._pending_since
        if waited < self.requeue_wait_s or now - self._placed_at < self.state_every_s:
            return False
        self._placed_at = now  # sinfo and squeue once per state_every_s at most, not every poll
        why = restart.unplaceable(self.job.job_id)
        if why is None:
            return False
        return self._give_up(f"the job cannot start on the nodes left: {why}; it pended {waited:.0f} s "
                             f"(launch.elastic_wait_s={self.requeue_wait_s:g})", waited)

    def _give_up(self, why: str, waited: float) -> bool:
        """Cancel the pending job: the run fails restartable with ``why`` (``outcome``)."""
        self.job.cancel(check=False)
        self.cancelled_by_us = True
        self.lost = (why, waited)
        return True

    def _dead_ranks(self) -> list[int]:
        """Local ranks whose process is gone while the job runs and that left no result: killed."""
        if not self.local or self.state != "RUNNING":
            return []
        return [p["rank"] for p in run_record.rank_processes(self.run_dir)
                if p["started_at"] >= self._since - 1  # not an earlier attempt's (one machine: one clock)
                and not alive(p["pid"]) and not submitit_compat.left_result(self.job.task(p["rank"]))]

    # ---- stopping -------------------------------------------------------------------------
    def _rank_processes(self) -> list:
        """The local job's processes below submitit's controller (the ranks)."""
        try:
            return psutil.Process(int(self.job.job_id)).children(recursive=True)
        except (psutil.NoSuchProcess, ValueError):
            return []

    def interrupt(self) -> None:
        """Ask a local job's ranks to stop at their next agreed step (they save a checkpoint)."""
        for proc in self._rank_processes():
            try:
                proc.send_signal(signal.SIGINT)
            except psutil.NoSuchProcess:
                pass

    def kill(self) -> None:
        """End the job now: SIGKILL a local job's ranks and controller; scancel a Slurm job."""
        if not self.local:
            self.job.cancel(check=False)
            return
        for proc in self._rank_processes() + [_process(self.job.job_id)]:
            try:
                if proc is not None:
                    proc.kill()
            except psutil.NoSuchProcess:
                pass

    def stop(self) -> str:
        """On Ctrl-C: a local job stops (gracefully within ``stop_timeout_s``, else killed) and is
        marked cancelled; a Slurm job keeps running. Returns the line to print."""
        name = f"job {self.job.job_id} (run {self.run_dir.name})"
        if not self.local:
            return (f"{name} keeps running on the cluster; see it with python -m suite.status {self.run_dir}, "
                    f"cancel it with scancel {self.job.job_id}")
        self.interrupt()
        deadline = time.time() + self.stop_timeout_s
        while time.time() < deadline and self.job.state == "RUNNING":
            time.sleep(0.2)
        if self.job.state == "RUNNING":
            self.kill()
        summary = run_record.summary_so_far(self.run_dir)
        if summary.get("status") in ("running", None):
            run_record.update_summary(self.run_dir, status="cancelled", job_id=self.job.job_id,
                                      error="cancelled before the ranks agreed on a stop step")
            summary = run_record.summary_so_far(self.run_dir)
        if summary.get("status") == "completed":
            return f"{name} had completed"
        return (f"{name} cancelled at step {summary.get('steps', 0)}; steps so far are kept in {self.run_dir}; "
                f"continue it with python -m suite.submit --resume {self.run_dir}")

    # ---- the end --------------------------------------------------------------------------
    def outcome(self) -> dict:
        """The completed run's summary; RunFailed naming the job and the failing rank otherwise."""
        try:
            return self._outcome()
        finally:
            if self.failure is not None and not self.failure.job_nodes:
                # the restart looks for a lost node among them; where squeue never listed them,
                # the nodes this attempt's ranks recorded
                self.failure.job_nodes = self._nodes or ",".join(sorted({
                    p["node"] for p in run_record.rank_processes(self.run_dir)
                    if p.get("node") and p.get("started_at", 0) >= self._since - 1}))
            if self.failure is not None and self.failure.restartable and not self.local:
                # Slurm requeues a batch job whose node failed, and would start this attempt again
                # once the node is back, beside the restart or after the run has failed for good:
                # whether the follower saw the job end NODE_FAIL or, first, a task the dead node's
                # loss killed (seen in CI: two attempts of one run training at once).
                self.job.cancel(check=False)

    def _outcome(self) -> dict:
        self.progress.show()
        job = f"job {self.job.job_id}"
        if self.never_starts:
            why = f"cannot start: Slurm gives the reason {self.never_starts} (the request exceeds what the " \
                  f"partition, account or QoS allows: check launch.nodes, tasks_per_node, cpus_per_task, " \
                  f"mem_gb, gpus_per_node, timeout_min and partition against sinfo); the job was cancelled"
            run_record.update_summary(self.run_dir, status="failed", error=why, job_id=self.job.job_id)
            self.failure = Failure(why, restartable=False)
            raise RunFailed(f"{job} (run {self.run_dir.name}) {why}")
        if self.lost:
            why, waited = self.lost
            run_record.update_summary(self.run_dir, status="failed", error=why, job_id=self.job.job_id)
            self.failure = Failure(why, restartable=True, node=self._nodes or None, waited_s=waited)
            raise RunFailed(f"{job} (run {self.run_dir.name}) failed: {why}")
        error = run_record.first_error(self.run_dir) or task_ends.submitit_error(self.job)
        dead = self._dead_at_failure if self.cancelled_by_us else []
        silent = task_ends.silent_ranks(self.job, self.run_dir) if (error or dead) and not self.cancelled_by_us else dead
        srun_end = None if self.local else task_ends.srun_first_end(self.job)
        if silent and error and not self.local and task_ends.srun_first_bad_exit(self.job) == error[0]:
            silent = []  # srun ended them (--kill-on-bad-exit) after the erring rank exited: not a cause
        if not silent and not error and not self.cancelled_by_us:
            if (self.local and self.job.state != "RUNNING"
                    and run_record.summary_so_far(self.run_dir).get("status") not in _STOPPED):
                silent = task_ends.silent_ranks(self.job, self.run_dir)  # all killed, none said a word (rank 0 first)
            elif srun_end and srun_end[2] in task_ends.SIGNAL_WORDS and (self.state or "").split()[:1] == ["FAILED"]:
                silent = [srun_end[0]]  # srun saw a signal end it, and no rank said a word
        if srun_end and srun_end[0] in silent:  # the task srun saw killed first, not those it then ended
            silent = [srun_end[0]] + [k for k in silent if k != srun_end[0]]
        step = self._last_step_text()
        if silent:  # a rank vanished (killed, out of memory); its peers' errors only echo that
            rank = silent[0]
            killed_by = self._death_signal(rank)
            echo = f"; its peers then failed: rank {error[0]}: {error[1]}" if error else ""
            how = f"killed by {killed_by}" if killed_by else "killed by a signal or the OOM killer?"
            line = f"rank {rank} died without a Python error ({how}){echo}"
            self.failure = Failure(f"rank {rank} {f'killed by {killed_by}' if killed_by else 'died without a Python error'}"
                                   f"{step}", restartable=True, rank=rank, node=self._rank_node(rank))
            run_record.update_summary(self.run_dir, status="failed", error=line, failed_rank=rank, job_id=self.job.job_id)
            self._say_end("FAILED")
            raise RunFailed(f"{job} (run {self.run_dir.name}) failed: {line} "
                            f"(rank {rank}'s log: {self.job.task(rank).paths.stderr})")
        if error:
            rank, line, path = error
            # a SuiteError is bad input (a recipe, data or disk the run cannot use): a restart repeats it
            self.failure = Failure(f"rank {rank} failed{step}: {line}", restartable=not line.startswith("SuiteError"),
                                   rank=rank, node=self._rank_node(rank))
            run_record.update_summary(self.run_dir, status="failed", error=line, failed_rank=rank, job_id=self.job.job_id)
            self._say_end("FAILED")
            raise RunFailed(f"{job} (run {self.run_dir.name}) failed: rank {rank}: {line} "
                            f"(traceback: {path}; logs: {self.job.paths.folder})")
        summary = run_record.summary_so_far(self.run_dir)
        if summary.get("status") == "cancelled":
            self.failure = Failure("cancelled", restartable=False)
            self._say_end("CANCELLED")
            raise RunCancelled(f"{job} (run {self.run_dir.name}) was cancelled at step {summary.get('steps', 0)}; "
                               f"continue it with python -m suite.submit --resume {self.run_dir}")
        if summary.get("status") != "completed":
            why = f"ended as {self.state}" if self.state and self.state != "ENDED" else "ended without completing"
            state = (self.state or "").split()[0] if self.state else ""
            # NODE_FAIL: the nodes it ran on, as squeue said while it ran (the restart keeps those Slurm
            # now reports down out; sacct's record of them may lag behind)
            self.failure = Failure(f"the job {why}{step}", restartable=state in _BROKEN and not self.cancelled_by_us,
                                   node=(self._nodes or None) if state == "NODE_FAIL" else None)
            run_record.update_summary(self.run_dir, status="failed", error=why, job_id=self.job.job_id)
            self._say_end("FAILED")
            raise RunFailed(f"{job} (run {self.run_dir.name}) {why}; rank 0's log: "
                            f"{self.job.task(0).paths.stderr}")
        self._say_end("COMPLETED")
        return summary

    def _say_end(self, state: str) -> None:
        if self.local:
            self.printer(f"[{self.job.job_id}] {state}")

    # ---- what a failure was -----------------------------------------------------------------
    def _death_signal(self, rank: int) -> str | None:
        """The signal that ended a rank which left no word ("SIGKILL"), where it can be known:
        mpirun's log, srun's line in task 0's log (a local pool's: ``PoolWatch``)."""
        told = getattr(self.job, "death_signal", None)  # an MpiJob reads mpirun's log
        if told is not None:
            return told(rank)
        if self.local:
            return None
        end = task_ends.srun_first_end(self.job, rank)
        return task_ends.SIGNAL_WORDS.get(end[2]) if end else None

    def _rank_node(self, rank: int) -> str | None:
        """Slurm's name of the node a rank ran on (srun's line, else the rank's process record)."""
        if self.local:
            return None
        end = task_ends.srun_first_end(self.job, rank)
        if end:
            return end[1]
        return next((p.get("node") for p in run_record.rank_processes(self.run_dir) if p["rank"] == rank), None)

    def _last_step_text(self) -> str:
        """" after step N": the last step this attempt logged (what the records can tell)."""
        attempt = len(run_record.recorded_attempts(self.run_dir))
        steps = [r["step"] for r in run_record.read_metrics(self.run_dir, kind="step")
                 if r.get("attempt") == attempt and isinstance(r.get("step"), int)]
        return f" after step {max(steps) + 1}" if steps else ""


class PoolWatch(Watch):
    """One point of a local pool (``suite.submit.pool``): it has ended when every rank is through
    it (the ranks go on to the next point) or when the pool's job has ended."""

    def __init__(self, pool, index: int, run_dir: Path, total_epochs: int, **kwargs):
        super().__init__(pool.job, run_dir, total_epochs, **kwargs)
        self.pool, self.index = pool, index

    def _update_state(self) -> None:
        ended = self.pool.ranks_done(self.index) or self.job.state != "RUNNING"
        if self.state is None:
            self.printer(f"[{self.job.job_id}] RUNNING")
        self.state = "ENDED" if ended else "RUNNING"

    def _death_signal(self, rank: int) -> str | None:
        """Rank k > 0 is a child of task 0, which says which signal ended it (suite/tasks/pool.py)."""
        path = self.pool.points / f"rank{rank}.exit.json"
        try:
            ended = run_record.read_json(path) if path.exists() else {}
        except (OSError, ValueError):
            return None
        return ended.get("message") if ended.get("status") == "killed" else None


SLOWEST_POLL_S = 0.5


def poll_interval_s(first_s: float, elapsed_s: float) -> float:
    """How long to sleep between polls, ``elapsed_s`` into the wait: ``first_s`` at first (a short
    point of a local sweep is seen to end at once), then longer, up to ``SLOWEST_POLL_S`` after
    10 s. Each poll costs about 2 ms of a core, which the ranks share on a small machine: polling
    every 50 ms throughout took about 4 % of a core from them (profiled on a 2-rank FSDP run)."""
    return min(SLOWEST_POLL_S, max(first_s, elapsed_s / 20))


def wait(watches: list[Watch], poll_s: float = 0.5, on_done=None) -> None:
    """Poll every job until all have ended; ``on_done(watch)`` is called once per ended job, and
    a Watch it returns (the run submitted again: an automatic restart) is followed in its place.
    ``poll_s``: the first interval between polls (``poll_interval_s``).

    Ctrl-C stops the local jobs still running (they save a checkpoint and are marked cancelled)
    and leaves Slurm jobs running, saying how to follow or cancel them; then RunCancelled."""
    pending, started = list(watches), time.monotonic()
    try:
        while pending:
            for w in list(pending):
                if w.poll():
                    pending.remove(w)
                    again = on_done(w) if on_done else None
                    if isinstance(again, Watch):
                        pending.append(again)
            if pending:
                time.sleep(poll_interval_s(poll_s, time.monotonic() - started))
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stopping short
        if any(w.local for w in pending):
            print(f"stopping: the ranks save a checkpoint and end (at most {pending[0].stop_timeout_s:.0f} s)",
                  file=sys.stderr, flush=True)
        lines = [w.stop() for w in pending]
        raise RunCancelled("; ".join(lines)) from None


def _process(pid: str):
    try:
        return psutil.Process(int(pid))
    except (psutil.NoSuchProcess, ValueError):
        return None
