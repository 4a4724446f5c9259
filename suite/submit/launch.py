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
from suite.errors import SuiteError
from suite.record import run_record


class TrainTask(submitit.helpers.Checkpointable):
    """What each submitit task runs: join the job's process group and train one rank.

    On requeue (time limit, preemption) submitit runs this same object again; ``suite.train.rank.run``
    finds the checkpoint in the run folder and resumes from it.

    ``master_port``: a fixed rendezvous port, or None (local and Slurm jobs): rank 0 then picks one
    outside the ephemeral range, seeded by the job id, and announces it in the run folder
    (``suite.train.rendezvous``). A MASTER_PORT exported in the submitting shell is never reused
    (two runs at once would join each other's rendezvous).
    ``watcher_pid``: the local ``suite.submit`` following the run (the run stops if it goes away).
    """

    def __init__(self, recipe_json: dict, run_dir: str, master_port: int | None = None,
                 watcher_pid: int | None = None):
        self.recipe_json = recipe_json
        self.run_dir = run_dir
        self.master_port, self.watcher_pid = master_port, watcher_pid

    def __call__(self):
        env = submitit.JobEnvironment()
        if env.cluster == "local":
            own_session()
        join_rendezvous(env, self.master_port, self.run_dir)
        ended = train_point(self.recipe_json, self.run_dir, self.watcher_pid)
        return env.global_rank if ended == "completed" else None


def own_session() -> None:
    """Make this local rank a session of its own, as torchrun does for its workers.

    Linux's autogroup scheduler (``/proc/sys/kernel/sched_autogroup_enabled``, on in many kernels)
    puts each session's processes in one scheduling group. submitit's local controller starts
    every task in the submitting shell's session, so the ranks (each a main, a gloo and an
    autograd thread) shared one group. Measured on 2 cores, the same hand-written FSDP loop at
    2 ranks: rank 0's median step was 7 % slower when both ranks ran in one session than in one
    session each, and a hand-written loop under torchrun matched the suite's ranks only once
    they had sessions of their own. What else changes: a Ctrl-C in the terminal no longer reaches
    the ranks directly; ``suite.submit`` catches it and forwards it to each rank by process id
    (``suite.submit.follow``), as it did before, and a rank stops if ``suite.submit`` is gone."""
    if os.getsid(0) == os.getpid():
        return
    try:
        os.setsid()
    except PermissionError:  # a process-group leader cannot start a session; it keeps its own
        pass


def join_rendezvous(env, master_port: int | None, run_dir: str | None = None) -> None:
    """Export RANK, WORLD_SIZE, MASTER_ADDR/PORT for this task (``master_port``: see TrainTask).
    With ``run_dir`` and no ``master_port``, SCALESUITE_RENDEZVOUS names the file where rank 0
    announces the port it listens on (``suite.train.dist.init`` reads it)."""
    os.environ.pop("SCALESUITE_RENDEZVOUS", None)
    if master_port:
        os.environ["MASTER_PORT"] = str(master_port)
    else:
        os.environ.pop("MASTER_PORT", None)
    if run_dir and not master_port and env.num_tasks > 1:
        from suite.train import rendezvous

        attempt = int(os.environ.get("SLURM_RESTART_COUNT", 0))  # a requeued job announces afresh
        os.environ["SCALESUITE_RENDEZVOUS"] = str(rendezvous.announcement(run_dir, env.job_id, attempt))
    if env.num_tasks > 1 or "WORLD_SIZE" not in os.environ:
        # Rendezvous from the job itself: first node's name and the port above.
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def train_point(recipe_json: dict, run_dir: str, watcher_pid: int | None) -> str:
    """Train this rank of one run: "completed", "cancelled" or "preempted" (the rank submitit
    asked to exit for the requeue exits here)."""
    from suite import recipe as recipes
    from suite.train import rank, stop

    recipe = recipes.Recipe.model_validate(recipe_json)
    try:
        rank.run(recipe, run_dir, watcher_pid=watcher_pid)
    except stop.Preempted as stopped:
        if stopped.exit_code is not None:
            sys.exit(stopped.exit_code)  # submitit has requeued the job; the next attempt resumes
        return "preempted"
    except stop.Cancelled:
        return "cancelled"
    return "completed"


def free_port() -> int:
    """A free port outside the ephemeral range (for mpirun's ranks and a warm pool's points)."""
    from suite.train import rendezvous

    return rendezvous.free_port()


@contextmanager
def ctrl_c_reaches_only_us():
    """Start local jobs with SIGINT ignored: a Ctrl-C in the terminal then reaches this process
    alone (submitit's local controller would otherwise die with a traceback and SIGKILL the ranks
    a second later). ``suite.submit`` forwards it to the ranks, which install their own handler
    and stop at a step they agree on (``suite.train.stop``)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
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
            with ctrl_c_reaches_only_us():
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
