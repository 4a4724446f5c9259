"""Hand recipes to submitit, one task per rank: local processes, a Slurm cluster (a sweep becomes
one job array per launch shape), or in-process debug. ``suite.submit.follow`` watches the jobs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import submitit


class TrainTask(submitit.helpers.Checkpointable):
    """What each submitit task runs: join the job's process group and train one rank.

    On requeue (time limit, preemption) submitit runs this same object again; ``suite.train.rank.run``
    finds the checkpoint in the run folder and resumes from it.
    """

    def __init__(self, recipe_json: dict, run_dir: str):
        self.recipe_json = recipe_json
        self.run_dir = run_dir

    def __call__(self):
        env = submitit.JobEnvironment()
        if env.num_tasks > 1 or "WORLD_SIZE" not in os.environ:
            # Rendezvous from the job itself: first node's name, a port seeded by the job id.
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        from suite import recipe as recipes
        from suite.train import checkpoint, rank

        recipe = recipes.Recipe.model_validate(self.recipe_json)
        try:
            rank.run(recipe, self.run_dir)
        except checkpoint.Preempted as stop:
            if stop.exit_code is not None:
                sys.exit(stop.exit_code)  # submitit has requeued the job; the next attempt resumes
            return None
        return env.global_rank


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
                  slurm_additional_parameters=dict(launch.sbatch_extra) or None)
    ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return ex


def submit(recipes_and_dirs: list, folder: Path | None = None) -> list:
    """Submit runs (recipe, run_dir); on Slurm, runs of one launch shape go as one job array.

    Each run's submitit files go to ``<run_dir>/submitit`` (an array's to ``folder``).
    """
    if len(recipes_and_dirs) > 1 and recipes_and_dirs[0][0].launch.executor == "slurm":
        return _submit_arrays(recipes_and_dirs, folder)
    jobs = []
    for recipe, run_dir in recipes_and_dirs:
        ex = make_executor(recipe.launch, run_dir / "submitit")
        jobs.append(ex.submit(TrainTask(recipe.model_dump(mode="json"), str(run_dir))))
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
