"""What a submitit task runs on each rank: join the job's process group, train this rank of one
run, and (rank 0, after training) record the planner's prediction for it beside what it measured."""
from __future__ import annotations

import os
import sys

import submitit

from suite import recipe as recipes


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
    if env.num_tasks == 1:
        # A group of one on its own host, whatever the environment held: a shell's or an outer
        # launcher's RANK, WORLD_SIZE or MASTER_ADDR name another group, on a node that may be gone.
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        if not master_port:
            # a port free here and outside the ephemeral range. submitit's own pick, seeded by the job
            # id in 20000-60000, can be one an outgoing connection holds (the local Slurm's job 179
            # drew 44591 and failed with EADDRINUSE).
            from suite.common.ports import free_port

            os.environ["MASTER_PORT"] = str(free_port())
    else:
        # Rendezvous from the job itself: first node's name and the port above.
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def train_point(recipe_json: dict, run_dir: str, watcher_pid: int | None) -> str:
    """Train this rank of one run: "completed", "cancelled" or "preempted" (the rank submitit
    asked to exit for the requeue exits here)."""
    from suite.train import stop

    recipe = recipes.Recipe.model_validate(recipe_json)
    try:
        train(recipe, run_dir, watcher_pid=watcher_pid)
    except stop.Preempted as stopped:
        if stopped.exit_code is not None:
            sys.exit(stopped.exit_code)  # submitit has requeued the job; the next attempt resumes
        return "preempted"
    except stop.Cancelled:
        return "cancelled"
    return "completed"


def train(recipe, run_dir=None, out="runs", watcher_pid: int | None = None):
    """Train this rank of ``recipe`` as every rank task does (``suite.train.rank.run``), rank 0
    recording the planner's prediction for the run after training. Returns the run folder."""
    from suite.planner.predict import prediction
    from suite.train import rank

    return rank.run(recipe, run_dir, out, watcher_pid=watcher_pid, predict=prediction)
