"""The model's step timed when a prediction is made (``suite.planner.model_time`` times one step):
the timings a prediction asks for (``rate_jobs``), run where none is cached, and the rate they give
the calibration (``with_model_rate``).

Timed in a fresh interpreter (``time_in_fresh_process``: the predicting process may be a rank
whose thread pools make a new engine hang), whose freed memory stays in its heap as a CPU rank's
does (``suite.common.heap``): with glibc's defaults the same step varies by half from one fresh
process to the next (benchmarks/results/code-rules.md). The result is cached per host in the calibration folder
(``model-times.json``), keyed by the model section, the strategy timed, the batch, the precision
and the threads: a sweep or the advisor times each model, strategy and batch once. The timings
a prediction needs (the model's, its strategy's) run one after another in one fresh process
(``time_all``; the advisor's, every candidate's at once), each strategy after one that leaves
no process-wide state: the same step timed so and each in its own process agree within the
noise between processes (benchmarks/results/code-rules.md).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import time

from suite.common import heap, threads
from suite.planner import compute
from suite.planner.calibration import cache_dir
from suite.planner.model_time import cache_key, one_rank_recipe, time_step
from suite.record.run_record import write_json_atomic

CACHE_FILE = "model-times.json"


def timed(recipe, threads: int, together: int = 1, use_cache: bool = True, own_strategy: bool = False,
          stages: bool = False) -> dict:
    """``time_step`` with ``together`` copies stepping at once (as many as the node's ranks that
    have a core: they share its memory bandwidth and caches), from this host's cache where it
    timed the same model and batch before; RuntimeError where timing it failed."""
    return _result(Job(recipe, threads, together, own_strategy, stages), use_cache)


def _result(job: "Job", use_cache: bool = True) -> dict:
    """``job``'s timing: from the cache where it is there (``time_all`` put it there), else timed
    now; RuntimeError where timing it failed."""
    cached = _read_cache()
    if use_cache and job.key in cached:
        return {**cached[job.key], "cached": True}
    time_all([job], use_cache=False)
    if job.key in _FAILED:
        raise RuntimeError(_FAILED[job.key])
    return {**_read_cache()[job.key], "cached": False}


@dataclasses.dataclass
class Job:
    """One timing ``timed`` makes: the recipe's model as one rank (``single``), or with
    ``own_strategy`` its strategy as one rank, or with ``stages`` its pipeline's stages."""
    recipe: object
    threads: int
    together: int = 1
    own_strategy: bool = False
    stages: bool = False

    @functools.cached_property
    def key(self) -> str:
        return cache_key(self.recipe, self.threads, self.together, self.own_strategy, self.stages)

    @functools.cached_property
    def reusable(self) -> bool:
        """Whether another timing may follow it in the same process: the strategy it builds
        leaves no process-wide state (``reusable_process``, as a sweep's warm ranks ask)."""
        timed_as = self.recipe.strategy if self.stages else one_rank_recipe(self.recipe, self.own_strategy).strategy
        return timed_as.reusable_process

    def request(self) -> dict:
        from suite import recipe as recipes

        return {"recipe": recipes.dump(self.recipe), "threads": self.threads, "own_strategy": self.own_strategy,
                "stages": self.stages}


_FAILED: dict[str, str] = {}  # a timing's cache key -> why it failed: not tried again by this process


def _read_cache() -> dict:
    try:
        return json.loads((cache_dir() / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}


def time_all(jobs: list[Job], use_cache: bool = True) -> None:
    """Time each of ``jobs`` not in this host's cache, in as few fresh processes as they allow,
    and cache the results (a failure is kept in ``_FAILED``). A fresh process costs an import
    of torch, ~2 s on 2 cores: a prediction that timed the model and its strategy in two spent
    4-5 s, and the advisor one per strategy (17 s for 4 on the quickstart). Jobs with as many
    copies stepping at once share a process, those whose strategy leaves process-wide state
    (``Job.reusable``) each last in theirs."""
    cached = _read_cache() if use_cache else {}
    todo: dict[str, Job] = {}
    for job in jobs:
        if job.key not in cached and job.key not in _FAILED:
            todo.setdefault(job.key, job)
    batches: list[list[Job]] = []
    for together in sorted({job.together for job in todo.values()}):
        same = sorted((j for j in todo.values() if j.together == together), key=lambda j: not j.reusable)
        batch: list[Job] = []
        for job in same:
            batch.append(job)
            if not job.reusable:
                batches.append(batch)
                batch = []
        if batch:
            batches.append(batch)
    for batch in batches:
        results = time_in_fresh_process(batch)
        cached = _read_cache()
        for job, result in zip(batch, results):
            if "error" in result:
                _FAILED[job.key] = result["error"]
            else:
                cached[job.key] = {**result, "model": job.recipe.model.name, "timed_at": time.time()}
        try:
            (cache_dir() / CACHE_FILE).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(cache_dir() / CACHE_FILE, cached)
        except OSError:  # a read-only cache costs a re-timing next time, never the prediction
            pass


TIMEOUT_S = 300
RESULT = "model_rate result: "  # a result line of the child's stdout, which libraries print to as well


def time_in_fresh_process(jobs: list[Job]) -> list[dict]:
    """``time_step`` of each job, one after another, in a new interpreter: the process predicting
    may be a rank that trained, or one forked from a process whose thread pools were already
    running, where a new engine's first parallel region can wait forever (seen: rank 0's
    prediction after training, in ranks forked by the tests' harness); a fresh process has no
    such state, and is killed after ``TIMEOUT_S``. Each job's result, or {"error": why}; a job
    the process did not reach (it died, or ran out of time) gets the process's error."""
    request = json.dumps({"together": jobs[0].together, "jobs": [job.request() for job in jobs]})
    code = "from suite.planner import model_rate; model_rate.child()"
    try:
        proc = subprocess.run([sys.executable, "-c", code], input=request, capture_output=True, text=True,
                              timeout=TIMEOUT_S, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        out, error = proc.stdout, (proc.stderr.strip().splitlines() or ["no output"])[-1]
    except subprocess.TimeoutExpired as e:
        out, error = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            f"took over {TIMEOUT_S} s"
    results = [json.loads(line[len(RESULT):]) for line in out.splitlines() if line.startswith(RESULT)]
    left = {"error": f"timing the model failed: {error}"}
    return (results + [left] * len(jobs))[:len(jobs)]


def child() -> None:
    """The fresh process's side of ``time_in_fresh_process``: the request on stdin, each job's
    result as a line of stdout as it ends."""
    from suite import recipe as recipes
    import yaml

    request = json.loads(sys.stdin.read())
    jobs = request["jobs"]
    recipes_ = [recipes.validate(yaml.safe_load(job["recipe"])) for job in jobs]
    if any(r.launch.device != "cuda" for r in recipes_):  # as a CPU rank allocates (suite.train.dist)
        heap.keep_freed_memory()
    together = request.get("together", 1)
    if together <= 1:
        for recipe, job in zip(recipes_, jobs):
            print(RESULT + json.dumps(_step_or_error(recipe, job, None)), flush=True)
        return
    # Forked before any compute in this fresh process (nothing to inherit but the imports); each
    # copy times every job in turn, the copies starting each job's timed steps together.
    copies = compute.at_once(functools.partial(_every_job, recipes_, jobs), together)
    for i in range(len(jobs)):
        results = [copy[i] for copy in copies]
        failed = next((r for r in results if "error" in r), None)
        if failed:
            print(RESULT + json.dumps(failed), flush=True)
            continue
        step_s = statistics.fmean(r["step_s"] for r in results)
        first = dict(results[0])
        if jobs[i].get("stages"):
            first["overhead_s"] = statistics.fmean(r["overhead_s"] for r in results)
        print(RESULT + json.dumps({**first, "step_s": step_s, "flops_per_s": first["flops"] / step_s if first["flops"] else None,
                          "together": together}), flush=True)


def _step_or_error(recipe, job: dict, ready) -> dict:
    try:
        return time_step(recipe, job["threads"], ready=ready, own_strategy=job["own_strategy"], stages=job["stages"])
    except Exception as e:  # noqa: BLE001 - the job's error is its result; the others still run
        return {"error": f"timing the model failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"}


def _every_job(recipes_, jobs, ready) -> list[dict]:
    return [_step_or_error(recipe, job, ready) for recipe, job in zip(recipes_, jobs)]


def rate_jobs(calibration: dict, recipe, ranks_per_node: int) -> list[Job]:
    """The timings ``with_model_rate`` asks for (none on a preset of other hardware): the model's
    step as one rank, and the strategy's as one rank where it runs so, or a pipeline's stages."""
    if calibration.get("from_specs"):
        return []
    cores = calibration["compute"].get("cores") or len(os.sched_getaffinity(0))
    n_threads = threads.rank_threads(cores, ranks_per_node, recipe.launch.cpus_per_task)  # suite.train.dist's rule
    together = max(1, min(ranks_per_node, cores // n_threads, 8))  # the ranks that have a core; more share it (timing)
    jobs = [Job(recipe, n_threads, together)]
    if one_rank_recipe(recipe, own_strategy=True).strategy.name != "single":
        jobs.append(Job(recipe, n_threads, together, own_strategy=True))
    elif recipe.strategy.stage_schedule(recipe.layout()) is not None:
        jobs.append(Job(recipe, n_threads, together, stages=True))
    return jobs


def with_model_rate(calibration: dict, recipe, model_key: str, ranks_per_node: int) -> dict:
    """A copy of ``calibration`` carrying the model's timed rate (``timing.compute_rate`` reads
    ``compute.models[model_key]``); unchanged where the model counts no FLOPs or the calibration
    is a preset of other hardware (``from_specs``: the model cannot be timed on it from here).
    Its timings (``rate_jobs``) run in one fresh process where none is cached (``time_all``)."""
    jobs = rate_jobs(calibration, recipe, ranks_per_node)
    if not jobs:
        return calibration
    time_all(jobs)
    single, *own = jobs
    result = _result(single)
    if not result.get("flops_per_s"):
        return calibration
    overhead_s, strategy, stage_s, rank_step_s = 0.0, "single", None, None
    for job in own:
        try:
            got = _result(job)
        except RuntimeError:  # the strategy fails as one rank: its rules alone say what it costs
            continue
        if job.stages:  # a pipeline: its stages, and their wrapper, timed stage by stage (stage_time)
            overhead_s, strategy, stage_s = got["overhead_s"], recipe.strategy.name, got.get("stage_s")
        elif got.get("at_world"):  # rank 0 of its world timed whole (model_time.at_world): its compute
            strategy, rank_step_s = got["strategy"], got["step_s"]
        else:
            overhead_s, strategy = max(0.0, got["step_s"] - result["step_s"]), got["strategy"]
    compute = dict(calibration["compute"])
    models = dict(compute.get("models") or {})
    models[model_key] = {"flops_per_s": result["flops_per_s"], "threads": single.threads, "step_s": result["step_s"],
                         "rank_batch": result["batch"], "timed": "when predicted", "together": single.together,
                         "strategy": strategy, "overhead_s": overhead_s, "stage_s": stage_s,
                         **({"rank_step_s": rank_step_s} if rank_step_s is not None else {})}
    compute["models"] = models
    return {**calibration, "compute": compute}
