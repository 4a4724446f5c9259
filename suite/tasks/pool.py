"""What the tasks of a local pool run (``suite.submit.pool`` hands them points).

Task 0 imports torch and the per-rank code once, then forks ranks 1..N-1 from itself (as
``tests/harness.py`` does: copy-on-write, so N ranks cost one start-up) and is rank 0. Task k > 0
is the forked rank k's stand-in for submitit: it starts no torch, forwards the controller's
signals (time limit) to rank k and ends as rank k ended: a result when it returned, the error
when it raised (rank k records it in the run folder too), killed without a result when rank k
was killed, so that the follower tells a failed rank from a killed one as for any local job.
Rank k's output goes to task k's log files.

Files in the pool's ``points-<id>/`` besides the points: ``rank<k>.pid`` (the process that is rank
k) and ``rank<k>.exit.json`` (how rank k ended, written by it just before it exits; or, when a
signal ended it without a word, by task 0, its parent, which reaps it: ``killed`` and the signal,
which the follower names as the cause).
"""
from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import submitit

from suite.common.processes import alive
from suite.compat import submitit as submitit_compat
from suite.record import run_record
from suite.tasks import train as train_task
import select
from suite.strategies import STRATEGIES
from suite.strategies import import_early

_POLL_S = 0.01


class PoolTask(submitit.helpers.Checkpointable):
    """One task of a pool. On a requeue (time limit) submitit runs it again: points a rank is
    through are skipped and the current one resumes from its checkpoint."""

    def __init__(self, points: str, strategies: list[str], watcher_pid: int, modules: list = ()):
        # strategies: the names the recipe text gives (before it is checked; unknown ones are
        # ignored here and refused by the checks). modules: [module, pythonpath] of the recipe's
        # model.target and data.target (``suite.submit.pool.target_modules``), imported early
        # too: a torchvision model's import alone is 1.5 s of a rank's start.
        self.points, self.strategies, self.watcher_pid = points, strategies, watcher_pid
        self.modules = list(modules)

    def __call__(self):
        env = submitit.JobEnvironment()
        points = Path(self.points)
        if env.global_rank > 0:
            return _stand_in(points, env.global_rank)
        started = time.time()
        train_task.own_session()  # rank 0; each forked rank starts one of its own
        run_record.write_json_atomic(points / "rank0.pid", os.getpid())
        train_task.join_rendezvous(env, None)  # rank and world; the port comes with each point
        importlib.import_module("suite.train.rank")  # with torch and the recipe schema

        # a failing one is skipped: the point's own import fails, and says why in its run folder
        warm = import_early(self.strategies) + _import_targets(self.modules)
        print(f"warm after {time.time() - started:.1f} s (suite.train.rank, {', '.join(warm) or 'nothing else'})",
              flush=True)
        sys.stderr.flush()
        children = {self._fork(k, env): k for k in range(1, env.num_tasks)}
        try:
            return self._serve(points, 0)
        finally:
            _reap(children, points)

    def _fork(self, rank: int, env) -> int:
        pid = os.fork()
        if pid:
            return pid
        points, code = Path(self.points), 0
        try:
            _die_with_parent()
            train_task.own_session()
            paths = submitit_compat.task_paths(env.paths.folder, env.job_id, rank)
            for fd, path in ((1, paths.stdout), (2, paths.stderr)):
                target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.dup2(target, fd)
                os.close(target)
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), SUBMITIT_LOCAL_GLOBALID=str(rank),
                              SUBMITIT_LOCAL_LOCALID=str(rank))
            run_record.write_json_atomic(points / f"rank{rank}.pid", os.getpid())
            served = self._serve(points, rank)
            _write_exit(points, rank, "preempted" if served is None else "completed")
        except BaseException as e:  # noqa: BLE001 - told to the stand-in, which fails with it
            traceback.print_exc()
            _write_exit(points, rank, "error", f"{type(e).__name__}: {e}")
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # never back into submitit's code in the parent's stack

    def _serve(self, points: Path, rank: int):
        """Train each point handed over; the rank, or None when preempted (requeued)."""
        for i in range(10**9):
            spec = self._next(points, i)
            if spec is None:
                return rank
            done = points / f"{i}.rank{rank}.done"
            if done.exists():
                continue
            os.environ["MASTER_PORT"] = str(spec["master_port"])
            _reset_peak_memory()
            try:
                ended = train_task.train_point(spec["recipe"], spec["run_dir"], self.watcher_pid)
            except BaseException:
                done.touch()
                raise
            if ended == "preempted":  # requeued: the next attempt resumes this point
                return None
            done.touch()
            if ended != "completed" or not _options(spec["recipe"]["strategy"]["name"]).reusable_process:
                return rank

    def _next(self, points: Path, i: int) -> dict | None:
        """Point i once it is handed over; None when the pool is closed or its submitter is gone."""
        path = points / f"{i}.json"
        while not path.exists():
            if (points / "end").exists() or not alive(self.watcher_pid):
                return None
            time.sleep(_POLL_S)
        return run_record.read_json(path)


def _import_targets(modules) -> list[str]:
    """Import the recipe's target modules, each with its section's pythonpath on the import path
    as ``suite.common.factories.import_target`` puts it (the user's own code may fail or print:
    the point imports it again, through the checks that say what is wrong); those imported."""
    from suite.common.factories import import_module

    done = []
    for module, pythonpath in modules:
        try:
            import_module(module, pythonpath)
            done.append(module)
        except Exception:  # noqa: BLE001 - whatever the user's module raises, the point reports it
            pass
    return done


def _stand_in(points: Path, rank: int):
    """Task k > 0: wait for rank k (forked by task 0), forward signals to it, end as it ended."""
    pid_file, first = points / f"rank{rank}.pid", points / "rank0.pid"
    # The pid files appear whole (written aside, then renamed): a reader under load once saw an
    # empty one and failed the whole point.
    while not pid_file.exists():
        if first.exists() and not alive(run_record.read_json(first)):
            raise RuntimeError(f"rank 0 of the pool ended before it started rank {rank} (see task 0's log)")
        time.sleep(_POLL_S)
    pid = run_record.read_json(pid_file)
    for sig in (signal.SIGUSR2, signal.SIGTERM):  # the local controller's time limit and stop
        signal.signal(sig, lambda signum, frame: _send(pid, signum))
    wait_for_exit(pid)
    path = points / f"rank{rank}.exit.json"
    if not path.exists():  # killed without a word: so is its stand-in (no result, as for a killed task)
        os.kill(os.getpid(), signal.SIGKILL)
    ended = json.loads(path.read_text())
    if ended["status"] == "killed":  # task 0 reaped it first and said which signal: still no result
        os.kill(os.getpid(), signal.SIGKILL)
    if ended["status"] == "error":
        raise RuntimeError(f"rank {rank}: {ended['message']}")
    return rank if ended["status"] == "completed" else None


def _reap(children: dict[int, int], points: Path | None = None, timeout_s: float = 60.0) -> None:
    """Rank 0 ends last, so the job lasts as long as its ranks; but not forever: peers stuck after
    a failure (rank 0's process group is closed by then, which ends their collectives) are killed
    with it (``_die_with_parent``). ``children``: pid -> rank. A rank a signal ended without a
    word gets ``rank<k>.exit.json`` saying so (only its parent can know the signal)."""
    deadline = time.time() + timeout_s
    pending = dict(children)
    while pending and time.time() < deadline:
        for pid in list(pending):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pending.pop(pid)
                continue
            if done:
                rank = pending.pop(pid)
                if points is not None and os.WIFSIGNALED(status) and not (points / f"rank{rank}.exit.json").exists():
                    _write_exit(points, rank, "killed", _signal_name(os.WTERMSIG(status)))
        time.sleep(_POLL_S)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal
        return f"signal {number}"


def wait_for_exit(pid: int) -> None:
    """Block until process ``pid`` (not our child) has ended, using no CPU meanwhile: a pidfd
    (Linux 5.3+) becomes readable when it exits, and a signal's handler still runs while we wait
    (select is resumed after it, PEP 475). Elsewhere, polls every 0.5 s (a stand-in that polled
    every 50 ms took about 1 % of a core from the ranks it waits for)."""

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is None:
        while alive(pid):
            time.sleep(0.5)
        return
    try:
        while alive(pid):  # a zombie (exited, not yet reaped) is gone too
            select.select([fd], [], [], 5.0)
    finally:
        os.close(fd)


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _write_exit(points: Path, rank: int, status: str, message: str = "") -> None:
    run_record.write_json_atomic(points / f"rank{rank}.exit.json", {"status": status, "message": message})


def _die_with_parent() -> None:
    """Linux: a forked rank is killed when task 0 dies (else it would train on, unwatched)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _reset_peak_memory() -> None:
    """Each point's peak memory is its own: reset the process's peak RSS (Linux: VmHWM and
    getrusage's maxrss, which ``suite.record.metrics`` reads on CPU)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _options(strategy: str):
    """The options class of a strategy (its class-level declarations: ``warm_imports``,
    ``reusable_process``); the per-rank side, so importing the strategies costs nothing more here."""

    return STRATEGIES[strategy].Options
