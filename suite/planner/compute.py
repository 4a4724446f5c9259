"""The compute side of a calibration (``python -m suite.calibrate``, ``suite.calibrate.measure``):
the matmul peak at each thread count a rank may get, and the rate a recipe's model achieves in
a training step with 1..N ranks stepping at once on this node."""
from __future__ import annotations

import functools
import os
import statistics
import time
import multiprocessing
from suite.common.threads import rank_threads


def compute_rates(precision: str = "fp32") -> dict:
    """The measured matmul peak per thread count 1 .. cores (``suite.record.peak``, cached), the
    peak of the other precisions (bf16, fp64) at all the cores, and the memory-copy rate of one
    thread (``copy_rate``)."""
    import torch

    from suite.record import peak

    before, by_threads = torch.get_num_threads(), {}
    try:
        for threads in range(1, len(os.sched_getaffinity(0)) + 1):
            torch.set_num_threads(threads)
            by_threads[str(threads)] = peak.cpu_peak(precision)["peak_flops_per_s"]
        # The other precisions a recipe may train in, at all the cores (op class: matmul).
        by_precision = {precision: by_threads[str(len(os.sched_getaffinity(0)))]}
        for other in ("bf16", "fp64"):
            if other != precision:
                by_precision[other] = peak.cpu_peak(other)["peak_flops_per_s"]
        torch.set_num_threads(1)
        copy = copy_rate()  # op class: memory-bound copies
    finally:
        torch.set_num_threads(before)
    return {"precision": precision, "cores": len(os.sched_getaffinity(0)), "peak_flops_per_s_by_threads": by_threads,
            "peak_flops_per_s_by_precision": by_precision, "copy_bytes_per_s": copy}


SPEED_SIDE = 384  # a product of 384 x 384 matrices: ~0.1 GFLOP, about a millisecond on one core


def speed_sample(window_s: float = 0.3) -> float:
    """FLOP/s of one thread repeating one float32 matmul for ``window_s``: a fixed piece of work
    timed at moments through the calibration (its ranks' start and end, its own end), to see
    whether the machine kept its speed while measured (``suite.planner.hardware.speed_spread``).
    On a shared VM it may not, by up to 2x a second apart (benchmarks/results/code-rules.md)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(SPEED_SIDE, SPEED_SIDE, generator=generator)
        a @ a  # warm
        count, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < window_s:
            a @ a
            count += 1
        return 2 * SPEED_SIDE ** 3 * count / elapsed
    finally:
        torch.set_num_threads(before)


COPY_BYTES = 16 * 2**20


def copy_rate(n_bytes: int = COPY_BYTES, repeats: int = 9) -> float:
    """Bytes per second one thread copies into a freshly allocated tensor (median of
    ``repeats``): what FSDP2 does around each gather and reduce-scatter, into buffers it
    allocates each time, so the first touch of their pages is part of the cost (a reused buffer
    copies faster: benchmarks/results/code-rules.md)."""
    import torch

    source = torch.ones(n_bytes // 4)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        torch.empty_like(source).copy_(source)
        times.append(time.perf_counter() - t0)
    return n_bytes / statistics.median(times[1:])


def model_rate(recipe, world: int, threads: int, steps: int = 5, step_flops: int | None = None,
               ready=None, window_s: float | None = None) -> dict | None:
    """The FLOP rate the recipe's model achieves in a training step (forward, backward, optimizer)
    at the rank batch of a data-parallel run at ``world`` ranks, on ``threads`` threads, in this
    process. ``step_flops``: the global step's FLOPs, if counted already; ``ready()``: called once
    the model is built, just before the timed steps. ``window_s``: time steps for that long (at
    least ``steps``) and take their mean, rather than the median of ``steps``: ranks sharing
    cores get their fair share only over many of the scheduler's slices."""
    import torch

    from suite.models import build as build_model
    from suite.models import flops

    spec = recipe.data.spec()
    batch = max(1, recipe.training.batch_size // world)
    step_flops = step_flops if step_flops is not None else flops.train_step_flops(recipe)
    if not step_flops:
        if ready:
            ready()
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            model = build_model(recipe.model, spec)
            dtype = getattr(torch, spec.input_dtype)
            inputs = (torch.randint(0, 2, (batch, *spec.input_shape)) if dtype == torch.int64
                      else torch.randn(batch, *spec.input_shape))
            optimizer = torch.optim.Adam(model.parameters())
            if ready:
                ready()
            times = []
            start = time.perf_counter()
            while len(times) < steps + 1 or (window_s and time.perf_counter() - start < window_s):
                t0 = time.perf_counter()
                optimizer.zero_grad()
                model(inputs).float().sum().backward()
                optimizer.step()
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    step_s = statistics.fmean(times[1:]) if window_s else statistics.median(times[1:])
    rank_flops = step_flops * batch / recipe.training.batch_size
    return {"model": recipe.model.name, "recipe": recipe.name, "rank_batch": batch, "threads": threads,
            "step_s": step_s, "flops_per_s": rank_flops / step_s}


WINDOW_S = 3.0  # how long the ranks stepping at once are timed


def _rate(recipe, ranks: int, threads: int, step_flops: int, ready):
    return model_rate(recipe, ranks, threads, step_flops=step_flops, ready=ready, window_s=WINDOW_S)


def at_once(run, copies: int) -> list:
    """``run(ready)`` in ``copies`` forked processes, each calling ``ready()`` just before its timed
    steps so that they all time together; their results, in the order they ended. Fork before
    this process has computed anything: a child inherits no running thread pool."""
    context = multiprocessing.get_context("fork")
    queue, barrier = context.SimpleQueue(), context.Barrier(copies)
    procs = [context.Process(target=_put, args=(run, barrier.wait, queue)) for _ in range(copies)]
    for proc in procs:
        proc.start()
    results = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
    return results


def _put(run, ready, queue) -> None:
    queue.put(run(ready))


def model_rates(recipe, ranks_per_node: list[int], cores: int) -> dict:
    """{ranks: rate}: for each count of ranks sharing this node, the rate one rank's model step
    achieves at its rank batch while that many ranks step at once (forked processes, each with
    ``cores // ranks`` threads, at least one), so that the threads' scaling, the batch size and
    the ranks' contention for the cores are measured rather than assumed. The ranks' mean step
    over ``WINDOW_S`` seconds, averaged over the ranks: the slowest rank's median of a few steps
    swings between calibrations where ranks share cores (benchmarks/results/code-rules.md).
    The FLOPs are counted once, here (on the meta device: no thread pool is started before the
    forks), and the ranks start their timed steps together, none while another still builds."""

    from suite.models import flops

    step_flops = flops.train_step_flops(recipe)
    if not step_flops:
        return {}
    out = {}
    for ranks in ranks_per_node:
        threads = rank_threads(cores, ranks, recipe.launch.cpus_per_task)
        rates = at_once(functools.partial(_rate, recipe, ranks, threads, step_flops), ranks)
        rates = [r for r in rates if r]
        if rates:
            step_s = statistics.fmean(r["step_s"] for r in rates)
            rank_flops = rates[0]["flops_per_s"] * rates[0]["step_s"]
            out[str(ranks)] = {**rates[0], "step_s": step_s, "flops_per_s": rank_flops / step_s, "ranks_per_node": ranks}
    return out
