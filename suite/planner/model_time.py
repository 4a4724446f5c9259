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
of collectives sees, and which can be a third of the step on a CPU (figures:
benchmarks/results/code-rules.md). The time model adds it to the rank's compute whole: it does not shrink with the
rank's share of the FLOPs. One rank's collectives return at once, so neither timing holds any
communication of the predicted world. A pipeline, which cannot run as one rank, is timed stage by
stage through its own schedule, with and without the wrapper its stages carry (``stage_time``).

A strategy that splits the model's layers over ranks (a tensor degree > 1) is timed otherwise:
as rank 0 of its own world, its degrees kept, on a fake process group (``at_world``: its
collectives return at once, untouched). Its degrees dropped, tensor parallelism timed the whole
width and the time model took 1/tp of it; but a rank at tp 2 computes half of each split layer and
all of the replicated rest (norms, embeddings, the head, DTensor's redistributions), which no
FLOP count sees, so 1/tp of the whole width predicts a tensor rank short. What a data-parallel
rank computes is the whole model at its batch, which the one-rank timings hold (figures for both:
benchmarks/results/code-rules.md). The fake group is torch's own, from its
test utilities (``suite.compat.torch.fake_store``, as the planner's fake run uses it); should a
torch lack it, the timing fails and the prediction falls back to the FLOP share, as for any
strategy whose own timing fails (``model_rate.with_model_rate``).

Never the measured steps of the configuration being predicted: one rank, no peers. The
strategy's costs at the predicted world (collectives, copies, bubble) are added by the time model
(``suite.planner.timing``). The result is a rate, FLOP/s of the model's step as
``torch.utils.flop_counter`` counts it, so that a strategy whose rank computes a part of the
model (tensor ranks, pipeline stages: the profile's ``flops``) is timed at the same rate. A model
whose step counts no FLOPs (embedding-bag only) has no rate; the peak is used and the
prediction says so.

Run, cached and batched by ``suite.planner.model_rate`` (in a fresh process, per host).
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time

WARMUP_STEPS = 2  # the first steps allocate and warm the allocator and the thread pool
MIN_STEPS = 5
MIN_WINDOW_S = 0.3  # at least this long, for models whose step is a millisecond


# Strategies never timed as one rank of their own: they need peers (a server, other replicas
# stepping asynchronously) or another framework's process model.
DEGREES = ("replicate", "dp", "tp")
NOT_ALONE = ("hogwild", "param_server", "horovod", "tf_mirrored", "tf_mirrored_loop", "tf_multiworker", "tf_single")


def at_world(recipe) -> bool:
    """Whether the recipe's own strategy is timed as rank 0 of its world on a fake process group
    (module doc): it splits layers over ranks (a tensor degree > 1)."""
    return recipe.layout().degree("tensor") > 1


def one_rank_recipe(recipe, own_strategy: bool = False):
    """The recipe as one rank at the batch a rank of ``recipe`` computes at once: strategy
    ``single``, or with ``own_strategy`` the recipe's own where it runs as one rank (no pipeline
    stages; its degrees, HSDP's replicas and tensor parallelism's, dropped) and validates."""
    from suite import recipe as recipes
    import yaml
    from suite.common.errors import SuiteError

    layout = recipe.layout()
    raw = yaml.safe_load(recipes.dump(recipe))
    single = {"name": "single"}
    pipeline = layout.degree("pipeline") > 1
    # A pipeline whose stages the planner cannot time one by one (no ``stage_schedule``:
    # DeepSpeed's engine) as one stage on one rank, its micro-batches kept: what its engine's
    # schedule costs a step; untimed, it was predicted well short of its runs
    # (benchmarks/results/code-rules.md).
    one_stage = own_strategy and pipeline and recipe.strategy.stage_schedule(layout) is None
    alone = own_strategy and recipe.strategy.name not in NOT_ALONE and (not pipeline or one_stage)
    # Its degrees dropped: one rank of each (tensor parallelism's machinery runs at tp 1 too).
    strategy = {k: v for k, v in raw["strategy"].items() if k not in DEGREES} if alone else single
    if one_stage:
        stages_key = next(axis.key for axis in recipe.strategy.mesh_axes() if axis.name == "pipeline")
        strategy[stages_key.removeprefix("strategy.")] = 1
    raw["launch"] = {**raw["launch"], "executor": "local", "nodes": 1, "tasks_per_node": 1}
    # A pipeline's stage runs its chunks one after another (forward and backward of chunk_batch
    # samples each) and steps once: timed so, as accumulation passes, the per-call cost of a small
    # chunk (a model of a few ms: 2-3x its share of the whole batch's time) and the efficiency of a
    # convolution at the chunk's batch are the stage's, not those of the whole batch at once. A
    # pipeline's own engine at one stage splits the batch into its micro-batches itself.
    chunks = layout.pipeline_chunks if pipeline and not one_stage else 1
    _one_step(raw, layout.accumulation_batch, chunks)
    try:
        return recipes.validate({**raw, "strategy": strategy})
    except SuiteError:  # the strategy refuses one rank
        return recipes.validate({**raw, "strategy": single})


def world_recipe(recipe):
    """The recipe as its ranks compute one accumulation batch each and step (``at_world``): its
    strategy and world kept, ``grad_accumulation`` 1, the per-rank batch shares dropped."""
    from suite import recipe as recipes
    import yaml

    layout = recipe.layout()
    raw = yaml.safe_load(recipes.dump(recipe))
    raw["launch"] = {**raw["launch"], "executor": "local"}
    _one_step(raw, layout.accumulation_batch * layout.dp_size, 1)
    return recipes.validate(raw)


def _one_step(raw: dict, batch_size: int, passes: int) -> None:
    """``raw``'s training as the step timed: ``batch_size`` samples in ``passes`` accumulation
    passes; the per-rank batch shares (``balance``) dropped, they do not apply to the rank timed."""
    training = {k: v for k, v in raw["training"].items() if k not in ("balance", "balance_shares")}
    raw["training"] = {**training, "batch_size": batch_size, "grad_accumulation": passes}


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
    if own_strategy and at_world(recipe):  # its own options and world decide what rank 0 computes
        timed_as = {"at_world": recipe.strategy.model_dump(mode="json"), "axes": layout.axes}
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
    if own_strategy and at_world(recipe):
        return _time_engine(world_recipe(recipe), threads, ready, world=recipe.world_size)
    return _time_engine(one_rank_recipe(recipe, own_strategy), threads, ready)


def _rank_zero_of(world: int, device) -> None:
    """This process as rank 0 of a process group of ``world`` ranks: a group of this rank alone
    (a strategy's own code as one rank), or with ``world`` > 1 torch's fake group, whose
    collectives return at once, untouched (what a rank computes at that world, none of what it
    sends). A group of one an earlier timing in this process left is kept for another, replaced
    by a fake world (which ``_time_engine`` ends after its timing)."""
    import torch.distributed as dist

    if dist.is_initialized():
        if world == 1:
            return
        dist.destroy_process_group()
    os.environ.update(RANK="0", WORLD_SIZE=str(world), LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")  # read by DeepSpeed's own set-up, never connected to
    if world == 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)
    else:
        from suite.compat import torch as torch_compat

        dist.init_process_group("fake", store=torch_compat.fake_store(), rank=0, world_size=world)


def _time_stages(recipe, threads: int, ready=None) -> dict:
    import torch

    from suite.planner import stage_time
    from suite.strategies import prepare

    one = one_rank_recipe(recipe)
    device = torch.device("cuda" if one.launch.device == "cuda" else "cpu")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    _rank_zero_of(1, device)
    if ready:
        ready()
    try:
        with torch.random.fork_rng(devices=[]), prepare.default_dtype(one.training.precision):
            got = stage_time.stage_times(one, recipe.strategy, recipe.layout(), device)
    finally:
        torch.set_num_threads(before)
    return {**got, "step_s": got["wrapped_s"], "threads": threads, "batch": one.training.batch_size,
            "strategy": recipe.strategy.name, "flops": None, "flops_per_s": None}


def _time_engine(one, threads: int, ready=None, world: int = 1) -> dict:
    import torch

    from suite import strategies
    from suite.planner import analytic
    from suite.planner.counting import fake_batch
    from suite.strategies import prepare
    from suite.strategies.context import DistContext
    from suite.train.rank import make_setup

    device = torch.device("cuda" if one.launch.device == "cuda" else "cpu")
    flops = analytic.model_step(one)["flops"] if world == 1 else None  # at its world: a rank's step, not the model's
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    alone = one.strategy.name != "single"
    if alone:
        _rank_zero_of(world, device)
    try:
        with torch.random.fork_rng(devices=[]), prepare.default_dtype(one.training.precision):
            ctx = DistContext(0, world, 0, world, device, "gloo" if alone else "none", (device,))
            engine = strategies.build(one.strategy, make_setup(one, ctx))
            batch = one.layout().rank_batch  # a step's samples on this rank (the engine splits accumulation passes)
            inputs, targets = fake_batch(one, batch)
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
        if world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
    step_s = statistics.median(times)
    return {"step_s": step_s, "flops": flops, "flops_per_s": flops / step_s if flops else None,
            "batch": batch, "threads": threads, "steps": len(times), "strategy": one.strategy.name,
            **({"at_world": world} if world > 1 else {})}
