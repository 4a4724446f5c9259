"""The model's compute, timed when a prediction is made: a few training steps of the user's own
model at the batch one rank computes at once (the layout's accumulation batch; a pipeline's in its
chunks, one after another), on the threads one
rank gets, through the suite's own Engine of one rank. What Alpa, Galvatron and DeepSpeed's
autotuner do: time the compute of the model at hand rather than assume a share of the machine's
peak.

Two timings: strategy ``single`` (the model's own step: its rate in FLOP/s), and the recipe's own
strategy as one rank of a process group of one where it runs so (no pipeline stages; its degrees
dropped: HSDP's replicas, tensor parallelism's tp). The difference is what the strategy's own
code costs a rank each step besides the model (``overhead_s``: DDP's bucket copies, FSDP's
per-unit hooks and copies, DeepSpeed's flat buffers and norm, DTensor's dispatch), which no count
of collectives sees: on a CPU, FSDP2 stepped ResNet-18 (width 0.25, batch 16) in 46 ms as one
rank against 34 ms for ``single``, and tensor parallelism a 2-layer transformer in 15.5 ms
against 9.6 ms. The time model adds it to the rank's compute whole: it does not shrink with the
rank's share of the FLOPs. One rank's collectives return at once, so neither timing holds any
communication of the predicted world. A pipeline, which cannot run as one rank, is timed stage by
stage through its own schedule, with and without the wrapper its stages carry (``stage_time``).

Never the measured steps of the configuration being predicted: one rank, no peers. The
strategy's costs at the predicted world (collectives, copies, bubble) are added by the time model
(``suite.planner.timing``). The result is a rate, FLOP/s of the model's step as
``torch.utils.flop_counter`` counts it, so that a strategy whose rank computes a part of the
model (tensor ranks, pipeline stages: the profile's ``flops``) is timed at the same rate. A model
whose step counts no FLOPs (embedding-bag only) has no rate; the peak is used and the
prediction says so.

Timed in a fresh interpreter (``time_in_fresh_process``: the predicting process may be a rank
whose thread pools make a new engine hang), whose freed memory stays in its heap as a CPU rank's
does (``suite.common.heap``): with glibc's defaults the same MLP step (784-1152-576-288, batch 20,
one thread) timed 9-13 ms from one fresh process to the next, 6-15 ms from step to step; kept,
6.2-6.4 ms. The result is cached per host in the calibration folder
(``model-times.json``), keyed by the model section, the strategy timed, the batch, the precision
and the threads: a sweep or the advisor times each model, strategy and batch once. The timings
a prediction needs (the model's, its strategy's) run one after another in one fresh process
(``time_all``; the advisor's, every candidate's at once), each strategy after one that leaves
no process-wide state: the same step timed so and each in its own process agreed within the
noise between processes (6 models, 0.1-1.5 ms on steps of 5-63 ms).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

from suite.common import heap, threads
from suite.planner import compute
from suite.planner.calibration import cache_dir
from suite.record.run_record import write_json_atomic

CACHE_FILE = "model-times.json"
WARMUP_STEPS = 2  # the first steps allocate and warm the allocator and the thread pool
MIN_STEPS = 5
MIN_WINDOW_S = 0.3  # at least this long, for models whose step is a millisecond


# Strategies never timed as one rank of their own: they need peers (a server, other replicas
# stepping asynchronously) or another framework's process model.
DEGREES = ("replicate", "dp", "tp")
NOT_ALONE = ("hogwild", "param_server", "horovod", "tf_mirrored", "tf_mirrored_loop", "tf_multiworker", "tf_single")


def one_rank_recipe(recipe, own_strategy: bool = False):
    """The recipe as one rank at the batch a rank of ``recipe`` computes at once: strategy
    ``single``, or with ``own_strategy`` the recipe's own where it runs as one rank (no pipeline
    stages; its degrees, HSDP's replicas and tensor parallelism's, dropped) and validates."""
    # start-up: loads pydantic, yaml, suite.recipe, suite.strategies only when this runs
    from suite import recipe as recipes
    import yaml  # start-up: loads yaml only when this runs
    from suite.common.errors import SuiteError

    layout = recipe.layout()
    raw = yaml.safe_load(recipes.dump(recipe))
    single = {"name": "single"}
    alone = own_strategy and recipe.strategy.name not in NOT_ALONE and layout.degree("pipeline") == 1
    # Its degrees dropped: one rank of each (tensor parallelism's machinery runs at tp 1 too).
    strategy = {k: v for k, v in raw["strategy"].items() if k not in DEGREES} if alone else single
    raw["launch"] = {**raw["launch"], "executor": "local", "nodes": 1, "tasks_per_node": 1}
    # A pipeline's stage runs its chunks one after another (forward and backward of chunk_batch
    # samples each) and steps once: timed so, as accumulation passes, the per-call cost of a small
    # chunk (a model of a few ms: 2-3x its share of the whole batch's time) and the efficiency of a
    # convolution at the chunk's batch are the stage's, not those of the whole batch at once.
    chunks = layout.pipeline_chunks if layout.degree("pipeline") > 1 else 1
    raw["training"] = {**raw["training"], "batch_size": layout.accumulation_batch, "grad_accumulation": chunks}
    for key in ("balance", "balance_shares"):  # per-rank batch shares do not apply to one rank
        raw["training"].pop(key, None)
    try:
        return recipes.validate({**raw, "strategy": strategy})
    except SuiteError:  # the strategy refuses one rank
        return recipes.validate({**raw, "strategy": single})


def cache_key(recipe, threads: int, together: int = 1, own_strategy: bool = False, stages: bool = False) -> str:
    single = one_rank_recipe(recipe, own_strategy)
    # With stages: the pipeline's own options (split, micro-batches, dp mode) and its degrees as
    # the layout resolves them decide what is timed. The options alone are the same for 2 and 4
    # stages where the degree follows the world size (strategy.stages unset): a 4-stage run then
    # found the 2-stage run's timing and fell back to its FLOP share. (A timing from before each
    # stage's own step was kept, "stage_s", is not found again.)
    layout = recipe.layout()
    timed_as = {"stages": recipe.strategy.model_dump(mode="json"), "keeps": "stage_s",
                "degrees": [layout.degree("pipeline"), layout.dp_size]} if stages else {}
    text = json.dumps({**timed_as, "model": recipe.model.model_dump(mode="json"), "data": single.data.model_dump(mode="json"),
                       "strategy": single.strategy.model_dump(mode="json"),
                       "optimizer": single.optimizer.model_dump(mode="json"),
                       "batch": single.training.batch_size, "passes": single.training.grad_accumulation,
                       "precision": single.training.precision,
                       "checkpointing": single.training.activation_checkpointing,
                       "device": single.launch.device, "threads": threads, "together": together}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def time_step(recipe, threads: int, ready=None, own_strategy: bool = False, stages: bool = False) -> dict:
    """Time a few training steps of ``recipe``'s model as one rank computes them (module doc):
    {"step_s", "flops", "flops_per_s" (None without FLOPs), "batch", "threads", "steps",
    "strategy" (the one timed)}: ``single``'s engine, or with ``own_strategy`` the recipe's own
    as one rank (``one_rank_recipe``). With ``stages``, the recipe's pipeline stages with and
    without their wrapper (``stage_time``): {"step_s", "overhead_s", "strategy", ...}."""
    if stages:
        return _time_stages(recipe, threads, ready)
    return _time_engine(one_rank_recipe(recipe, own_strategy), threads, ready)


def _group_of_one(device) -> None:
    """A process group of this rank alone, in this process (a strategy's own code as one rank)."""
    import torch.distributed as dist  # start-up: loads torch, numpy only when this runs

    if dist.is_initialized():
        return
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")  # read by DeepSpeed's own set-up, never connected to
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)


def _time_stages(recipe, threads: int, ready=None) -> dict:
    import torch  # start-up: loads torch, numpy only when this runs

    from suite.planner import stage_time  # start-up: loads suite.planner only when this runs
    from suite.strategies import prepare  # start-up: loads torch, suite.strategies only when this runs

    one = one_rank_recipe(recipe)
    device = torch.device("cuda" if one.launch.device == "cuda" else "cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    _group_of_one(device)
    if ready:
        ready()
    try:
        with torch.random.fork_rng(devices=[]), prepare.default_dtype(one.training.precision):
            got = stage_time.stage_times(one, recipe.strategy, recipe.layout(), device)
    finally:
        torch.set_num_threads(before)
    return {**got, "step_s": got["wrapped_s"], "threads": threads, "batch": one.training.batch_size,
            "strategy": recipe.strategy.name, "flops": None, "flops_per_s": None}


def _time_engine(one, threads: int, ready=None) -> dict:
    import torch  # start-up: loads torch, numpy only when this runs

    # start-up: loads torch, pydantic, suite.strategies only when this runs
    from suite import strategies
    # start-up: loads torch, suite.compat, suite.planner only when this runs
    from suite.planner import analytic
    # start-up: loads torch, suite.compat, suite.planner only when this runs
    from suite.planner.counting import fake_batch
    # start-up: loads torch, suite.strategies only when this runs
    from suite.strategies import prepare
    # start-up: loads torch, suite.strategies only when this runs
    from suite.strategies.context import DistContext
    # start-up: loads torch, pydantic, yaml, psutil, suite.train only when this runs
    from suite.train.rank import make_setup

    device = torch.device("cuda" if one.launch.device == "cuda" else "cpu")
    flops = analytic.model_step(one)["flops"]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    alone = one.strategy.name != "single"
    if alone:
        _group_of_one(device)
    try:
        with torch.random.fork_rng(devices=[]), prepare.default_dtype(one.training.precision):
            ctx = DistContext(0, 1, 0, 1, device, "gloo" if alone else "none", (device,))
            engine = strategies.build(one.strategy, make_setup(one, ctx))
            inputs, targets = fake_batch(one, one.training.batch_size)
            if (dtype := prepare.input_dtype(one.training.precision)) is not None and inputs.is_floating_point():
                inputs = inputs.to(dtype)
            inputs, targets = inputs.to(device), targets.to(device)
            for _ in range(WARMUP_STEPS):
                engine.train_step(inputs, targets)
            if ready:  # the ranks stepping at once start their timed steps together
                ready()
            times, start = [], time.perf_counter()
            while len(times) < MIN_STEPS or time.perf_counter() - start < MIN_WINDOW_S:
                t0 = time.perf_counter()
                engine.train_step(inputs, targets)
                ctx.synchronize()
                times.append(time.perf_counter() - t0)
            engine.close()
    finally:
        torch.set_num_threads(before)
    step_s = statistics.median(times)
    return {"step_s": step_s, "flops": flops, "flops_per_s": flops / step_s if flops else None,
            "batch": one.training.batch_size, "threads": threads, "steps": len(times), "strategy": one.strategy.name}


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
        # start-up: loads pydantic, yaml, suite.recipe only when this runs
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
RESULT = "model_time result: "  # a result line of the child's stdout, which libraries print to as well


def time_in_fresh_process(jobs: list[Job]) -> list[dict]:
    """``time_step`` of each job, one after another, in a new interpreter: the process predicting
    may be a rank that trained, or one forked from a process whose thread pools were already
    running, where a new engine's first parallel region can wait forever (seen: rank 0's
    prediction after training, in ranks forked by the tests' harness); a fresh process has no
    such state, and is killed after ``TIMEOUT_S``. Each job's result, or {"error": why}; a job
    the process did not reach (it died, or ran out of time) gets the process's error."""
    request = json.dumps({"together": jobs[0].together, "jobs": [job.request() for job in jobs]})
    code = "from suite.planner import model_time; model_time.child()"
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
    # start-up: loads pydantic, yaml, suite.recipe only when this runs
    from suite import recipe as recipes
    import yaml  # start-up: loads yaml only when this runs

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


def rank_threads(calibration: dict, ranks_per_node: int, cpus_per_task: int | None = None) -> int:
    """The threads one rank gets on a node of the calibration's cores (``suite.train.dist``'s rule)."""
    cores = calibration["compute"].get("cores") or len(os.sched_getaffinity(0))
    return threads.rank_threads(cores, ranks_per_node, cpus_per_task)


def rate_jobs(calibration: dict, recipe, ranks_per_node: int) -> list[Job]:
    """The timings ``with_model_rate`` asks for (none on a preset of other hardware): the model's
    step as one rank, and the strategy's as one rank where it runs so, or a pipeline's stages."""
    if calibration.get("from_specs"):
        return []
    n_threads = rank_threads(calibration, ranks_per_node, recipe.launch.cpus_per_task)
    cores = calibration["compute"].get("cores") or len(os.sched_getaffinity(0))
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
    overhead_s, strategy, stage_s = 0.0, "single", None
    for job in own:
        try:
            got = _result(job)
        except RuntimeError:  # the strategy fails as one rank: its rules alone say what it costs
            continue
        if job.stages:  # a pipeline: its stages, and their wrapper, timed stage by stage (stage_time)
            overhead_s, strategy, stage_s = got["overhead_s"], recipe.strategy.name, got.get("stage_s")
        else:
            overhead_s, strategy = max(0.0, got["step_s"] - result["step_s"]), got["strategy"]
    compute = dict(calibration["compute"])
    models = dict(compute.get("models") or {})
    models[model_key] = {"flops_per_s": result["flops_per_s"], "threads": single.threads, "step_s": result["step_s"],
                         "rank_batch": result["batch"], "timed": "when predicted", "together": single.together,
                         "strategy": strategy, "overhead_s": overhead_s, "stage_s": stage_s}
    compute["models"] = models
    return {**calibration, "compute": compute}
