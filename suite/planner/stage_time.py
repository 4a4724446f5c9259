"""A pipeline rank's compute, timed stage by stage as a process group of one
(``suite.planner.model_rate`` runs it in a fresh interpreter and caches it): each stage's own step,
and what the data-parallel wrapper on its stage (``strategy.stage_wrapper``: FSDP2's
``fully_shard`` or ``replicate`` with ``dp`` > 1) adds to it.

A stage's step is not its share of the FLOPs of the whole model's step. Its optimizer updates its
own weights only (ResNet-18's first stage holds 89 % of the FLOPs and few of the weights), and its
schedule costs what the whole model's step does not: GPipe keeps every chunk's activations until
its backward. Timed twice, a stage's step differs by a few per cent, as much as GPipe's cost
over 1F1B on most models: their order is often still a toss-up (figures:
benchmarks/results/code-rules.md).

The wrapper: a pipeline cannot run as one rank, so its ``overhead_s`` was 0 and a pipeline x
data-parallel run was predicted as if its stages were plain modules. They are not: each stage's
parameters are DTensors, its micro-batches pass the wrapper's hooks and its optimizer steps
sharded tensors: a cost per stage that the stage's share of the FLOPs does not tell (the light
stage pays as much as the heavy one; benchmarks/results/code-rules.md).

Each stage is cut as the pipeline cuts it, fed the activations the stages before it produce, and
stepped through a one-stage schedule of the run's own kind (``strategy.stage_schedule``: GPipe or
1F1B) over the run's micro-batches with its optimizer; with a wrapper, once plain and once wrapped
over a mesh of one rank, in alternating rounds, the wrapper's cost the median difference on the
stage whose wrapped step is the longest (the one that sets the pace)."""
from __future__ import annotations

import copy
import statistics
import time

ROUNDS = 7  # alternating plain / wrapped rounds
ROUNDS_PLAIN = 5  # rounds where there is no wrapper to set against the plain stage
STEPS = 3  # steps per round (after WARMUP)
WARMUP = 2


def stage_times(one, strategy, layout, device) -> dict:
    """{"stage_s": each stage's step alone, plain; "overhead_s", "stage", "plain_s", "wrapped_s":
    the wrapper's cost per step on the stage that steps longest wrapped (0 and the slowest plain
    stage without a wrapper)}. ``one``: the recipe as one rank (``model_time.one_rank_recipe``:
    strategy single at the data-parallel rank's batch, its chunks as passes); ``strategy``,
    ``layout``: the pipeline's options and layout; the process group of one is initialised."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage

    from suite.planner.counting import fake_batch
    from suite.strategies.pipeline import schedule_class
    from suite.strategies import prepare
    from suite.strategies.context import DistContext
    from suite.strategies.splitting import cut, resolve_split
    from suite.train.rank import make_setup

    wrap = strategy.stage_wrapper(layout)
    schedule_cls = schedule_class(strategy.stage_schedule(layout))
    chunks = layout.pipeline_chunks
    ctx = DistContext(0, 1, 0, 1, device, "gloo", (device,))
    setup = make_setup(one, ctx)
    model = setup.prepare(setup.build_model().to(device))
    parts = cut(model, resolve_split(strategy.split_at, model, layout.degree("pipeline"), own_optimizers=True))
    inputs, _ = fake_batch(one, one.training.batch_size)
    if (dtype := prepare.input_dtype(one.training.precision)) is not None and inputs.is_floating_point():
        inputs = inputs.to(dtype)
    feeds = [inputs.to(device)]
    with torch.no_grad():
        for part in parts[:-1]:
            feeds.append(part(feeds[-1]))
    mesh = init_device_mesh(device.type, (1,))

    def stepper(module, feed):
        stage = PipelineStage(module, 0, 1, device)
        schedule = schedule_cls(stage, n_microbatches=chunks, loss_fn=lambda out, target: out.float().mean())
        optimizer = setup.make_optimizer(module.parameters())
        target = torch.zeros(len(feed), device=device)

        def step():
            schedule.step(feed, target=target)
            optimizer.step()
            optimizer.zero_grad()
        return step

    results = []
    for index, (part, feed) in enumerate(zip(parts, feeds)):
        steps = {"plain": stepper(part, feed)}
        if wrap is not None:
            wrapped = copy.deepcopy(part)
            wrap(wrapped, mesh)
            steps["wrapped"] = stepper(wrapped, feed)
        for step in steps.values():
            for _ in range(WARMUP):
                step()
        times = {name: [] for name in steps}
        for _ in range(ROUNDS if wrap is not None else ROUNDS_PLAIN):
            for name, step in steps.items():
                ctx.synchronize()
                t0 = time.perf_counter()
                for _ in range(STEPS):
                    step()
                ctx.synchronize()
                times[name].append((time.perf_counter() - t0) / STEPS)
        plain = statistics.median(times["plain"])
        if wrap is None:
            results.append({"stage": index, "plain_s": plain, "wrapped_s": plain, "overhead_s": 0.0})
            continue
        cost = statistics.median(w - p for p, w in zip(times["plain"], times["wrapped"]))
        results.append({"stage": index, "plain_s": plain, "wrapped_s": statistics.median(times["wrapped"]),
                        "overhead_s": max(0.0, cost)})
    return {**max(results, key=lambda r: r["wrapped_s"]), "stage_s": [r["plain_s"] for r in results]}
