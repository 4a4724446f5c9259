"""Hand recipes to submitit, one task per rank: local processes, a Slurm cluster (a sweep becomes
one job array per launch shape), or in-process debug. ``suite.submit.follow`` watches the jobs."""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

import submitit

from suite.compat import submitit as submitit_compat
from suite.common.errors import SuiteError
from suite.common.ports import free_port
from suite.record import run_record
from suite.tasks.train import TrainTask


@contextmanager
def starting_local_job(folder: Path):
    """Around submitit's start of a local job (its controller process, which starts the ranks):

    - SIGINT ignored: a Ctrl-C in the terminal then reaches this process alone (submitit's local
      controller would otherwise die with a traceback and SIGKILL the ranks a second later).
      ``suite.submit`` forwards it to the ranks, which install their own handler and stop at a
      step they agree on (``suite.train.stop``).
    - stdout and stderr pointed at ``<folder>/controller.log``: the controller would otherwise
      hold this process's own output open until its ranks have exited, and a program that reads
      ``suite.submit``'s output to its end (``subprocess.run(..., capture_output=True)``, as
      ``suite.verify`` does) would wait there for the ranks' interpreter teardown, about a second
      per run after the run has ended. The ranks write to their own log files either way.
    """
    folder.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(folder / "controller.log", "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        signal.signal(signal.SIGINT, previous)


def make_executor(launch, folder: Path):
    if launch.executor == "debug":
        return submitit.DebugExecutor(folder)
    if launch.executor == "local":
        ex = submitit.LocalExecutor(folder)
        ex.update_parameters(tasks_per_node=launch.tasks_per_node, timeout_min=launch.timeout_min,
                             gpus_per_node=launch.gpus_per_node, signal_delay_s=launch.signal_delay_s)
        return ex
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    params = dict(nodes=launch.nodes, tasks_per_node=launch.tasks_per_node, timeout_min=launch.timeout_min,
                  gpus_per_node=launch.gpus_per_node, cpus_per_task=launch.cpus_per_task, mem_gb=launch.mem_gb,
                  slurm_partition=launch.partition, slurm_account=launch.account, slurm_qos=launch.qos,
                  slurm_constraint=launch.constraint, slurm_signal_delay_s=launch.signal_delay_s,
                  slurm_array_parallelism=launch.array_parallelism,
                  slurm_additional_parameters=dict(launch.sbatch_extra) or None,
                  # MPI ranks: srun hands each task its MPI identity through PMIx (suite/submit/mpi.py
                  # says why PMIx and not PMI-2 with Debian's Open MPI)
                  # --kill-on-bad-exit: a rank that exits with an error (before or after the
                  # process group formed) ends the job's other tasks at once, not at a timeout
                  slurm_srun_args=["--kill-on-bad-exit=1"] + (["--mpi=pmix"] if launch.mpi else []))
    ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return ex


def submit(recipes_and_dirs: list, folder: Path | None = None, watched: bool = False) -> list:
    """Submit runs (recipe, run_dir); on Slurm, runs of one launch shape go as one job array.

    Each run's submitit files go to ``<run_dir>/submitit`` (an array's to ``folder``).
    ``watched``: this process follows local runs to their end; they stop if it goes away.
    """
    try:
        return _submit(recipes_and_dirs, folder, watched)
    except submitit_compat.failed_job_error() as e:
        # sbatch refused: no run of this submission started, so none is left looking under way.
        why = " ".join(str(e).split())[-300:]
        for _, run_dir in recipes_and_dirs:
            if not (Path(run_dir) / "job.json").exists():
                run_record.update_summary(run_dir, status="failed", error=f"not submitted: {why}")
        raise SuiteError(f"sbatch refused the job ({why}); check launch.partition, account, qos, "
                         f"gpus_per_node and sbatch_extra") from None


def _submit(recipes_and_dirs: list, folder: Path | None, watched: bool) -> list:
    if len(recipes_and_dirs) > 1 and recipes_and_dirs[0][0].launch.executor == "slurm":
        return _submit_arrays(recipes_and_dirs, folder)
    jobs = []
    for recipe, run_dir in recipes_and_dirs:
        if recipe.launch.executor == "mpi":
            from suite.submit import mpi

            jobs.append(mpi.submit(recipe, run_dir, os.getpid() if watched else None, free_port()))
            continue
        ex = make_executor(recipe.launch, run_dir / "submitit")
        local = recipe.launch.executor == "local"
        task = TrainTask(recipe.model_dump(mode="json"), str(run_dir),
                         watcher_pid=os.getpid() if local and watched else None)
        if local:
            with starting_local_job(run_dir / "submitit"):
                jobs.append(ex.submit(task))
        else:
            jobs.append(ex.submit(task))
    return jobs


def _submit_arrays(recipes_and_dirs, folder: Path) -> list:
    groups: dict[str, list[int]] = {}
    for i, (recipe, _) in enumerate(recipes_and_dirs):
        groups.setdefault(recipe.launch.model_dump_json(), []).append(i)
    jobs = [None] * len(recipes_and_dirs)
    for members in groups.values():
        ex = make_executor(recipes_and_dirs[members[0]][0].launch, folder)
        with ex.batch():
            submitted = [ex.submit(TrainTask(recipes_and_dirs[i][0].model_dump(mode="json"),
                                             str(recipes_and_dirs[i][1]))) for i in members]
        for i, job in zip(members, submitted):
            jobs[i] = job
    return jobs
