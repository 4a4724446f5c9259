"""Warm local ranks: the runs of a local ``suite.submit`` (one run, or every point of a sweep) go
to one submitit job whose ranks start while the recipe is still being checked, import torch and
the per-rank code once (in one process; the other ranks are forked from it: ``pool_task.py``),
then train the points handed to them one after another. Each point keeps its own run folder,
record, W&B runs and a process group of its own (a fresh rendezvous port).

Why: a rank's start-up (python, torch, torch._dynamo for DDP/FSDP: several seconds of CPU per
process) would otherwise start only after the checks, be paid by every rank on the same cores,
and again for every point of a sweep.

Its submitit folder is the first point's ``<run>/submitit``; the other points' ``submitit`` links
to it. Protocol, in that folder's ``points-<id>/`` (one per pool: a resumed run starts another):
- ``<i>.json``: the i-th point (recipe, run folder, rendezvous port), written by ``suite.submit``
  once the previous point has ended; ``end``: no more points.
- ``<i>.rank<k>.done``: rank k is through point i (completed, failed or cancelled).
A rank whose point fails or is cancelled ends the pool (a failed rank's peers may be stuck in a
collective, and the follower kills the job); so does a point of a strategy whose library keeps
process-wide state (DeepSpeed, fairscale), and a point that asks for what an earlier one fixed
for the process otherwise (``process_state``: TensorFlow's threads and logical devices).
``suite.submit`` then starts a new pool for the points left. The pool's time limit is the sum of its points' ``launch.timeout_min``. Modules an earlier
point imported stay loaded, so a later point's peak memory may include them (each point's peak
is otherwise its own: it is reset when the point starts).
"""
from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import psutil

from suite.record import run_record
from suite.common.ports import free_port
from suite.compat import submitit as submitit_compat
from suite.submit import launch
from suite.tasks.pool import PoolTask
from suite.recipe.text import raw_points

_POLL_S = 0.01
# Executor settings a pool is started with; a point runs in a pool only if its own are the same.
_SHAPE = ("executor", "nodes", "tasks_per_node", "gpus_per_node", "signal_delay_s")


class Pool:
    """The submitting side of a pool: started early, handed points one at a time, closed at the end."""

    def __init__(self, job, points: Path, shape: dict, timeout_min: int):
        self.job, self.points, self.shape, self.timeout_min = job, Path(points), shape, timeout_min
        self.folder = self.points.parent  # submitit's folder
        self.home = self.folder.parent  # the run folder it was started in
        self.handed = 0  # points handed over so far
        self.used_min = 0
        self.open = True  # False once a point ended it (failed, cancelled, not reusable)
        self.state: tuple = ()  # what a point fixed in the ranks' processes for good (``process_state``)

    @classmethod
    def start(cls, run_dir: Path, launches: list, strategies: list[str], modules: list = ()) -> "Pool":
        """Submit a pool, its files in ``run_dir/submitit``, for points with these launch sections
        (objects or plain dicts) and strategies; ``modules``: the points' target modules, which
        its ranks import while they wait (``target_modules``)."""
        first = _fields(launches[0])
        folder = Path(run_dir) / "submitit"
        points = folder / f"points-{uuid.uuid4().hex[:8]}"
        points.mkdir(parents=True)
        timeout_min = sum(_fields(each)["timeout_min"] for each in launches)
        ex = launch.make_executor(SimpleNamespace(**{**first, "timeout_min": timeout_min}), folder)
        with launch.starting_local_job(folder):
            job = ex.submit(PoolTask(str(points), sorted(set(strategies)), os.getpid(), list(modules)))
        return cls(job, points, {k: first[k] for k in _SHAPE}, timeout_min)

    def takes(self, recipe) -> bool:
        """Whether the next point can run in this pool (same launch shape, pool still serving)."""
        fields = _fields(recipe.launch)
        state = recipe.strategy.process_state(recipe.launch)
        return (self.open and self.job.state == "RUNNING" and {k: fields[k] for k in _SHAPE} == self.shape
                and self.used_min + fields["timeout_min"] <= self.timeout_min
                and not (self.state and state and state != self.state))

    def hand_over(self, recipe, run_dir: Path) -> int:
        """Give the ranks their next point; returns its index."""
        i = self.handed
        logs = Path(run_dir) / "submitit"
        if not logs.exists():  # the point's task logs are the pool's
            logs.symlink_to(os.path.relpath(self.folder, run_dir))
        run_record.write_json_atomic(self.points / f"{i}.json", {
            "recipe": recipe.model_dump(mode="json"), "run_dir": str(run_dir), "master_port": free_port()})
        self.handed += 1
        self.used_min += recipe.launch.timeout_min
        self.state = self.state or recipe.strategy.process_state(recipe.launch)
        if not recipe.strategy.reusable_process:
            self.open = False
        return i

    def ranks_done(self, i: int) -> bool:
        return all((self.points / f"{i}.rank{k}.done").exists() for k in range(self.job.num_tasks))

    def close(self, wait_s: float = 2.0) -> None:
        """No more points: the ranks return; a pool still running after ``wait_s`` is killed."""
        self.open = False
        (self.points / "end").touch()
        deadline = time.time() + wait_s
        while self.job.state == "RUNNING" and not self._results_left() and time.time() < deadline:
            time.sleep(_POLL_S)
        if self.job.state == "RUNNING" and not self._results_left():
            self.kill()

    def _results_left(self) -> bool:
        """Every task returned and wrote its result: its process is only exiting (an
        interpreter that imported torch takes ~0.9 s to tear down, which nothing waits on)."""
        return all(submitit_compat.left_result(self.job.task(k)) for k in range(self.job.num_tasks))

    def kill(self) -> None:
        try:
            controller = psutil.Process(int(self.job.job_id))
            procs = controller.children(recursive=True) + [controller]
        except (psutil.NoSuchProcess, ValueError):
            return
        for proc in procs:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=5)

    def discard(self) -> None:
        """Nothing was handed over (the checks refused the recipe, or it is not a local run):
        end the ranks and remove the run folder ``prestart`` made."""
        self.kill()
        shutil.rmtree(self.home, ignore_errors=True)


def _fields(launch_section) -> dict:
    return launch_section if isinstance(launch_section, dict) else launch_section.model_dump()


def prestart(recipe_path: str, overrides: list[str], out: Path) -> Pool | None:
    """Start a pool for a local run before its recipe is validated, from the recipe text alone, so
    that the ranks warm up while the recipe is checked. None when the text does not say local
    (or cannot be read: the checks will say why). A guess, never trusted: each point is checked
    against the pool (``Pool.takes``) and a wrong guess only costs the warm start."""

    try:
        points = raw_points(recipe_path, overrides)
        launches = [{**_LAUNCH_GUESS, **(p.get("launch") or {})} for p in points]
        strategies = [str((p.get("strategy") or {}).get("name")) for p in points]
        same = [each for each in launches if {k: each[k] for k in _SHAPE} == {k: launches[0][k] for k in _SHAPE}]
        if launches[0]["executor"] != "local" or launches[0]["nodes"] != 1:
            return None
        home = run_record.new_run_dir(points[0]["name"], "", out)  # its recipe.yaml once validated
    except Exception:  # noqa: BLE001 - whatever is wrong, validation reports it properly
        return None
    try:
        return Pool.start(home, same, strategies, target_modules(points))
    except Exception:  # noqa: BLE001 - no warm start; the launch after the checks says what is wrong
        shutil.rmtree(home, ignore_errors=True)
        return None


def target_modules(points: list[dict]) -> list[list]:
    """[module, pythonpath] for each distinct ``model.target`` and ``data.target``
    (``pkg.mod:fn``) of the points (recipe text, or checked recipes dumped to dicts), with the
    folders its section's ``pythonpath`` puts on the import path."""
    found = set()
    for point in points:
        for section in ("model", "data"):
            options = point.get(section)
            if not isinstance(options, dict):  # recipe text the checks will refuse
                continue
            target, folders = options.get("target"), options.get("pythonpath") or []
            if isinstance(target, str) and ":" in target and isinstance(folders, list):
                found.add((target.split(":")[0], tuple(str(f) for f in folders)))
    return [[module, list(folders)] for module, folders in sorted(found)]


# Launch defaults (suite.recipe.Launch) for keys the recipe text leaves out; importing the schema
# would import torch, which is what the warm start runs beside.
_LAUNCH_GUESS = {"executor": "local", "nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "timeout_min": 60,
                 "signal_delay_s": 90}
