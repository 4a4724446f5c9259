"""``python -m suite.calibrate``: measure this cluster's compute rate and collective costs once,
so that the planner can turn a ``StepProfile`` into seconds (``suite.planner.timing``).

    python -m suite.calibrate [RECIPE [key=value ...]] [--world-size N[,N...]] [--max-bytes B] [--out FILE]

- compute (``suite.planner.compute``): the measured matmul peak (``suite.record.peak``) at each
  thread count a rank may get on a node (1 .. cores), and, given a RECIPE, the rate its model
  achieves in a forward, backward and optimizer step with 1 and with each world size's ranks
  stepping at once on this node, FLOPs counted as the runs count them (``suite.record.flops``)
  over the median time.
- collectives: every kind of ``alpha_beta.MEASURED`` at each ``--world-size`` (default 2) over
  message sizes 4 KB .. ``--max-bytes`` (x4 apart), the lower quartile of repetitions of each, then
  alpha and beta fitted per kind (``alpha_beta.fit``; the formulas and their assumption there);
  at a world size with divisors from 2, the collectives of ``POOLED`` again over groups of each
  divisor, every group at once (``time_in_groups``: ``collectives_in_groups``).

Ranks: local (the default, and a RECIPE with launch.executor=local) start as plain processes
on this machine; launch.executor=slurm submits one job of ``--world-size`` tasks through the
suite's executor (``suite.submit.launch.make_executor``) with the recipe's launch settings (submitit's
files under the cache folder below; tested on the local Slurm of ``slurm/``). Each
rank chooses its device, backend and threads in the one place runs do (``suite.train.dist.init``).

Saved to ``$XDG_CACHE_HOME/scalesuite/calibration/<key>.json`` (key: hosts, backend, threads per
rank; ``load`` finds it) and to ``--out``; a table is printed.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from suite.planner import alpha_beta, hardware, timing
from suite.planner.calibration import cache_dir, key
from suite.planner.compute import compute_rates, model_rates, speed_sample
import warnings
import multiprocessing
from suite.common import network
from suite.common.errors import SuiteError
from suite.calibrate.rank_timings import (MAX_BYTES, MIN_BYTES, POOLED, sizes,
                                          time_burst, time_collectives, time_in_groups, time_in_step)

MAX_PASSES = 3  # passes of the collectives' timing where the machine's speed swings (calibrate, combined)




def combined(passes: list[dict]) -> dict:
    """Several passes of ``rank_main``'s measurements as one: each size's, slice's and burst's time
    the median over the passes (the first pass's hosts, backend and threads). A calibration whose
    speed samples swing (``hardware.speed_spread``) times its collectives again, so that one slow
    spell does not set them (benchmarks/results/code-rules.md)."""
    if len(passes) == 1:
        return passes[0]
    first = passes[0]
    median = statistics.median
    points = {kind: [(n, median(p["points"][kind][i][1] for p in passes)) for i, (n, _) in enumerate(pts)]
              for kind, pts in first["points"].items()}
    in_step = {kind: [[median(p["in_step"][kind][j][0] for p in passes), median(p["in_step"][kind][j][1] for p in passes)]
                      for j in range(len(v))] for kind, v in (first.get("in_step") or {}).items()}
    grouped = {g: {kind: [(n, median(p["grouped"][g][kind][i][1] for p in passes)) for i, (n, _) in enumerate(pts)]
                   for kind, pts in by_kind.items()} for g, by_kind in (first.get("grouped") or {}).items()}
    bursts = [p["burst"] for p in passes if p.get("burst")]
    burst = {calls: median(b[calls] for b in bursts) for calls in bursts[0]} if bursts else None
    return {**first, "points": points, "grouped": grouped, "in_step": in_step, "burst": burst, "passes": len(passes)}


def pooled(in_step: dict) -> dict:
    """``time_in_step``'s costs with the collectives' pooled: at each slice, the median of the
    all-reduce's, all-gather's and reduce-scatter's per-call cost stands for all three. What a
    call waits for in a step is a core for the collective's threads, once per call whatever its
    kind (the three agree within their noise: benchmarks/results/code-rules.md); send and broadcast, which wake
    fewer threads, keep their own."""
    kinds = [k for k in POOLED if k in in_step]
    if len(kinds) < 2:
        return in_step
    slices = len(in_step[kinds[0]])
    common = [[statistics.median(in_step[k][j][0] for k in kinds), statistics.median(in_step[k][j][1] for k in kinds)]
              for j in range(slices)]
    return {**in_step, **{k: common for k in kinds}}


def rank_main(world: int, message_sizes: list[int], kinds=alpha_beta.MEASURED, device: str = "cpu") -> dict | None:
    """One rank of the calibration (its environment set by the launcher): rank 0 returns the
    measurements, the others None."""

    import torch.distributed as dist

    from suite.train import dist as suite_dist

    # torch 2.14 calls reduce_scatter_tensor deprecated (for a name no older torch has); the call is the same.
    warnings.filterwarnings("ignore", message=".*is deprecated.*", category=FutureWarning)
    ctx = suite_dist.init(device)
    try:
        progress = (lambda line: print(line, flush=True)) if ctx.rank == 0 else None
        speed = [(time.time(), speed_sample())] if ctx.rank == 0 else []  # the others wait in the first call
        points = time_collectives(kinds, message_sizes, ctx.world_size, ctx.rank, progress)
        grouped = time_in_groups(message_sizes, ctx.world_size, ctx.rank, progress)
        in_step = time_in_step(kinds, ctx.world_size, ctx.rank)
        burst = time_burst(ctx.world_size, ctx.rank)
        if ctx.rank == 0:
            speed.append((time.time(), speed_sample()))
        if progress:
            progress("  in a step      " + "  ".join(f"{k} " + "/".join(f"{t * 1e3:.2f}" for _, t in v) + " ms"
                                                     for k, v in in_step.items())
                     + " (between " + "/".join(f"{s * 1e3:.2f}" for s, _ in next(iter(in_step.values()))) + " ms of compute)")
            progress("  in a burst     all_reduce " + ", ".join(f"{t * 1e3:.2f} ms a call in {n}" for n, t in burst.items())
                     + " after compute")
        hosts = [None] * ctx.world_size
        dist.all_gather_object(hosts, network.node_name())  # Slurm's node names where it runs there
        import torch

        return {"points": points, "grouped": grouped, "in_step": in_step, "burst": burst, "speed": speed, "hosts": sorted(set(hosts)), "backend": ctx.backend,
                "threads": torch.get_num_threads(), "world_size": ctx.world_size} if ctx.rank == 0 else None
    finally:
        suite_dist.close()


def _spawned(index: int, world: int, port: int, message_sizes, queue) -> None:
    os.environ.update(RANK=str(index), WORLD_SIZE=str(world), LOCAL_RANK=str(index),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    result = rank_main(world, message_sizes)
    if result is not None:
        queue.put(result)


def run_local(world: int, message_sizes: list[int]) -> dict:
    """``world`` ranks as processes on this machine; rank 0's measurements. Forked where the
    platform can (a spawned rank imports torch again: ~5 s on 2 busy cores), before this process
    has run any torch operation, so no thread pool is forked half-way."""

    import torch.multiprocessing as mp

    from suite.common.ports import free_port

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    queue = mp.get_context(method).SimpleQueue()
    mp.start_processes(_spawned, args=(world, free_port(), message_sizes, queue), nprocs=world,
                       join=True, start_method=method)
    return queue.get()


class CalibrateTask:
    """What each submitit task of a Slurm calibration runs (rendezvous as a run's ranks do)."""

    def __init__(self, world: int, message_sizes: list[int], device: str):
        self.world, self.message_sizes, self.device = world, message_sizes, device

    def __call__(self):
        import submitit

        from suite.tasks.train import join_rendezvous

        join_rendezvous(submitit.JobEnvironment(), None)
        return rank_main(self.world, self.message_sizes, device=self.device)


def run_slurm(launch, world: int, message_sizes: list[int], folder: Path) -> dict:
    """One Slurm job of ``world`` tasks with the recipe's launch settings; rank 0's measurements."""
    from suite.submit.launch import make_executor

    from suite.compat import submitit as submitit_compat

    nodes = max(1, -(-world // launch.tasks_per_node))
    launch = launch.model_copy(update={"nodes": nodes, "tasks_per_node": world // nodes})
    try:
        job = make_executor(launch, folder).submit(CalibrateTask(world, message_sizes, launch.device))
    except submitit_compat.failed_job_error() as e:  # the controller is down, or refuses the shape
        why = " ".join(str(e).split())[-300:]
        raise SuiteError(f"sbatch refused the calibration job ({why}); check that Slurm is up (sinfo) and "
                         f"launch.partition, account, qos and sbatch_extra") from None
    print(f"submitted Slurm job {job.job_id} ({nodes} node(s), {world} task(s)); waiting", flush=True)
    return next(r for r in job.results() if r is not None)


def calibrate(world: int | list[int] = 2, max_bytes: int = MAX_BYTES, recipe=None, min_bytes: int = MIN_BYTES,
              folder: Path | None = None) -> dict:
    """Measure and fit; the calibration as a dict (not yet saved). ``world``: the world size(s)
    to time collectives at; the first gives ``collectives``, each its own ``collectives_by_world``
    (the time model takes the fit of a run's own world size where there is one: at more ranks
    than cores, peers wait for each other's turn on a core, which one fit cannot carry)."""
    started = time.perf_counter()
    load_at_start = os.getloadavg()[0] if recipe is None or recipe.launch.executor != "slurm" else None
    worlds = [world] if isinstance(world, int) else list(world)
    message_sizes = sizes(min_bytes, max_bytes)
    by_world, by_group, measured, speed, passes_by_world = {}, {}, None, [], {}
    for w in worlds:
        print(f"timing {', '.join(alpha_beta.MEASURED)} at {w} ranks, {len(message_sizes)} sizes "
              f"{min_bytes / 2**10:.0f} KiB .. {max_bytes / 2**20:.1f} MiB", flush=True)
        passes = []
        while True:
            if recipe is not None and recipe.launch.executor == "slurm":
                passes.append(run_slurm(recipe.launch, w, message_sizes, folder or cache_dir() / "submitit"))
            else:
                passes.append(run_local(w, message_sizes))
            speed += passes[-1].get("speed") or []
            spread = hardware.samples_spread(speed)
            if spread is None or len(passes) >= MAX_PASSES:
                break
            print(f"the machine's speed changed by {spread:.0%} while timing (one thread's matmul); timing the "
                  f"collectives at {w} ranks again, pass {len(passes) + 1} of up to {MAX_PASSES}, median taken", flush=True)
        got = combined(passes)
        passes_by_world[str(w)] = len(passes)
        measured = measured or got
        in_step = pooled(got.get("in_step") or {})
        # A burst's cost, like a call's in a step, is the wait for a core: the collectives share it.
        by_world[str(w)] = {kind: alpha_beta.fit(kind, w, [tuple(p) for p in points], in_step=in_step.get(kind),
                                                 burst=got.get("burst") if kind in POOLED else None)
                            for kind, points in got["points"].items()}
        if got.get("grouped"):
            by_group[str(w)] = {str(g): {kind: alpha_beta.fit(kind, int(g), [tuple(p) for p in points])
                                         for kind, points in kinds.items()} for g, kinds in got["grouped"].items()}
    print("measuring compute", flush=True)
    cores = len(os.sched_getaffinity(0))
    models = {}
    # Before compute_rates: its matmuls start this process's thread pool, which a forked child
    # inherits without its threads and can hang on.
    if recipe is not None:
        # A local run's ranks all share this node; a Slurm run's share theirs tasks_per_node at a
        # time (its model rate is measured here, on the submitting host, as one of its nodes).
        local = sorted({1, *worlds} if recipe.launch.executor != "slurm" else {1, recipe.launch.tasks_per_node})
        rates = model_rates(recipe, local, cores)
        if rates:
            first = rates.get(str(local[-1] if recipe.launch.executor == "slurm" else worlds[0])) or next(iter(rates.values()))
            models = {timing.model_key(recipe): {**first, "by_ranks_per_node": rates}}
    compute = compute_rates()
    compute["models"] = models
    if load_at_start is not None:  # this host ran the ranks: its own speed now is one more sample
        speed.append((time.time(), speed_sample()))
    compute["speed_samples"] = [[round(at - speed[0][0], 1), rate] for at, rate in speed] if speed else []  # [s, FLOP/s]
    return {"key": key(measured["hosts"], measured["backend"], measured["threads"]), "hosts": measured["hosts"],
            "backend": measured["backend"], "threads": measured["threads"], "world_size": worlds[0],
            "measured_at": time.time(), "load_average_1m": os.getloadavg()[0], "load_average_at_start": load_at_start,
            "took_s": time.perf_counter() - started,
            "compute": compute, "collectives": by_world[str(worlds[0])], "collectives_by_world": by_world,
            # {world: {group size: fits}}: groups of that size, every group of the world calling at once
            "collectives_in_groups": by_group,
            "collective_passes": passes_by_world,  # more than 1 where the machine's speed swung (combined)
            # The link class the timed ranks crossed: between nodes where they ran on several.
            "links": {"inter" if len(measured["hosts"]) > 1 else "intra": by_world[str(worlds[0])]},
            "borrowed": dict(alpha_beta.BORROWED)}


def busy_warning(calibration: dict) -> str | None:
    """One line where the machine was busy when the calibration began (``hardware.busy_load``),
    else None; the load it records over its own run counts its own ranks and is not used."""
    load = hardware.busy_load(calibration)
    if load is None:
        return None
    cores = calibration["compute"].get("cores") or 1
    return (f"calibrate: the machine was busy when this began (load average {load:.2f} over the last minute, "
            f"{cores} cores): other work slows what it times, and every step time predicted from it (one taken so "
            "priced calls inside a step at 2 ranks 29-38 % dearer). Calibrate again when the machine is quiet.")


def speed_warning(calibration: dict) -> str | None:
    """One line where the machine's speed changed while it was calibrated (``hardware.speed_spread``)."""
    spread = hardware.speed_spread(calibration)
    if spread is None:
        return None
    rates = [r for _, r in calibration["compute"]["speed_samples"]]
    return (f"calibrate: this machine's speed changed while it was measured: one thread's matmul ran "
            f"{min(rates) / 1e9:.0f} to {max(rates) / 1e9:.0f} GFLOP/s ({spread:.0%} apart) within "
            f"{calibration['compute']['speed_samples'][-1][0]:.0f} s. Steps measured here differ from run to run by as "
            f"much, and from their predictions; a shared or throttled machine does this. Calibrate again to see if it holds.")


def table(calibration: dict) -> str:
    lines = [f"{'kind':<15} {'α (µs)':>9} {'β (MB/s)':>10} {'median/max error':>17}  "
             f"formula (N = world size, n = bytes)"]
    for kind, f in calibration["collectives"].items():
        lines.append(f"{kind:<15} {f['alpha_s'] * 1e6:>9.1f} {f['beta_bytes_per_s'] / 1e6:>10.0f} "
                     f"{f['median_relative_error'] * 100:>8.0f}% {f['max_relative_error'] * 100:>6.0f}%  {f['formula']}")
    c = calibration["compute"]
    lines.append("compute peak: " + ", ".join(f"{t} thread(s) {r / 1e9:.1f} GFLOP/s"
                                              for t, r in c["peak_flops_per_s_by_threads"].items()))
    if c.get("copy_bytes_per_s"):
        lines.append(f"memory copy: 1 thread {c['copy_bytes_per_s'] / 1e9:.1f} GB/s into a fresh buffer")
    for w, fits in (calibration.get("collectives_by_world") or {}).items():
        if str(w) != str(calibration.get("world_size")):
            lines.append(f"at {w} ranks: " + _fits_text(fits))
    for w, by_size in (calibration.get("collectives_in_groups") or {}).items():
        for g, fits in by_size.items():
            lines.append(f"at {w} ranks in groups of {g}, all at once: " + _fits_text(fits))
    for m in c.get("models", {}).values():
        for r in (m.get("by_ranks_per_node") or {"": m}).values():
            who = f"{r['ranks_per_node']} rank(s) at once, " if "ranks_per_node" in r else ""
            lines.append(f"model {r['model']}: {who}rank batch {r['rank_batch']}, {r['threads']} thread(s): "
                         f"{r['flops_per_s'] / 1e9:.2f} GFLOP/s achieved ({r['step_s'] * 1e3:.1f} ms per step)")
    return "\n".join(lines)


def _fits_text(fits: dict) -> str:
    """Each kind's fit on one line: "all_reduce α 515 µs β 1150 MB/s, all_gather ..."."""
    return ", ".join(f"{kind} α {f['alpha_s'] * 1e6:.0f} µs β {f['beta_bytes_per_s'] / 1e6:.0f} MB/s"
                     for kind, f in fits.items())
