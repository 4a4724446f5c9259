"""Hand a recipe to submitit (local processes, Slurm, or in-process debug), one task per rank,
and follow the job to its end: progress, the first failing rank's error, never a wait forever."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import submitit

from suite import tracking
from suite.errors import RunFailed, SuiteError
from suite.train import epoch_line


class TrainTask(submitit.helpers.Checkpointable):
    """What each submitit task runs: join the job's process group and train one rank."""

    def __init__(self, recipe_json: dict, run_dir: str):
        self.recipe_json = recipe_json
        self.run_dir = run_dir

    def __call__(self):
        env = submitit.JobEnvironment()
        if env.num_tasks > 1 or "WORLD_SIZE" not in os.environ:
            # Rendezvous from the job itself: first node's name, a port seeded by the job id.
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        from suite import recipe as recipes, train

        recipe = recipes.Recipe.model_validate(self.recipe_json)
        train.run(recipe, self.run_dir)
        return env.global_rank


def make_executor(recipe, folder: Path):
    launch = recipe.launch
    if launch.executor == "debug":
        ex = submitit.DebugExecutor(folder)
    elif launch.executor == "local":
        ex = submitit.LocalExecutor(folder)
        ex.update_parameters(tasks_per_node=launch.tasks_per_node, timeout_min=launch.timeout_min,
                             gpus_per_node=launch.gpus_per_node)
    else:
        raise SuiteError("launch.executor=slurm is not available yet; use local")
    return ex


def submit(recipe, run_dir: Path):
    """Start the job for one run folder; returns the submitit job."""
    executor = make_executor(recipe, run_dir / "submitit")
    return executor.submit(TrainTask(recipe.model_dump(mode="json"), str(run_dir)))


def follow(job, run_dir: Path, total_epochs: int, printer=print, poll_s: float = 0.5,
           grace_s: float = 15.0) -> None:
    """Wait for the job, printing rank 0's progress; raise RunFailed naming the failing rank.

    When a rank records an error, the others get ``grace_s`` to finish failing on their own
    (gloo notices a dead peer quickly); then the job is cancelled, so nothing hangs.
    """
    progress = _Progress(run_dir, total_epochs, printer)
    failed_at = None
    while not _job_done(job):
        progress.show()
        if failed_at is None and _first_error(run_dir):
            failed_at = time.time()
        if failed_at is not None and time.time() - failed_at > grace_s:
            job.cancel()
            break
        time.sleep(poll_s)
    progress.show()
    error = _first_error(run_dir) or _submitit_error(job)
    if error:
        rank, line, path = error
        _mark(run_dir, "failed", error=line, failed_rank=rank)
        raise RunFailed(f"run {run_dir.name} failed: rank {rank}: {line} (traceback: {path}; "
                        f"logs: {run_dir / 'submitit'})")
    summary = tracking.read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    if summary.get("status") != "completed":
        _mark(run_dir, "failed", error="the job ended without completing")
        raise RunFailed(f"run {run_dir.name} ended without completing; logs: {run_dir / 'submitit'}")


def _job_done(job) -> bool:
    if isinstance(job, submitit.DebugJob):
        return True
    return job.done()


def _first_error(run_dir: Path):
    """(rank, message, path) of the earliest error any rank recorded, or None."""
    found = []
    for path in (run_dir / "errors").glob("rank*.txt"):
        try:
            stamp, message = path.read_text().split("\n", 2)[:2]
            found.append((float(stamp), int(path.stem[4:]), message, path))
        except (OSError, ValueError):
            continue
    if not found:
        return None
    _, rank, message, path = min(found)
    return rank, message, path


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


def _mark(run_dir: Path, status: str, **fields) -> None:
    path = run_dir / "summary.json"
    summary = tracking.read_json(path) if path.exists() else {}
    summary.update(status=status, **fields)
    tracking.write_json_atomic(path, summary)


class _Progress:
    """Prints rank 0's epoch records as they land, and a step line at most every few seconds."""

    def __init__(self, run_dir, total_epochs, printer, every_s: float = 5.0):
        self.path = run_dir / "metrics.jsonl"
        self.total_epochs = total_epochs
        self.printer = printer
        self.every_s = every_s
        self.offset = 0
        self.last_print = 0.0
        self.last_step = None

    def show(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind("\n") + 1  # only whole lines
        self.offset += len(chunk[:end].encode())
        for line in chunk[:end].splitlines():
            rec = json.loads(line)
            if rec.get("rank") != 0:
                continue
            if rec["kind"] == "epoch":
                self.printer(epoch_line(rec, self.total_epochs))
                self.last_print = time.time()
            elif rec["kind"] == "step" and rec.get("global_loss") is not None:
                self.last_step = rec
        if self.last_step and time.time() - self.last_print > self.every_s:
            s = self.last_step
            self.printer(f"  step {s['step'] + 1}  epoch {s['epoch'] + 1}  loss {s['global_loss']:.4f}")
            self.last_print, self.last_step = time.time(), None
