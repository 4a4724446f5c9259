"""The peak FLOP/s per device that MFU divides by, and where it came from.

Three sources, first that knows wins (``resolve``):
- ``recipe``: ``tracking.peak_flops_per_s``;
- ``vendor table``: GPUs, from the datasheet table in ``suite.record.flops``;
- ``measured``: CPUs (``tracking.measure_peak``, on by default): the best rate of square matmuls
  in the training precision at the thread count a rank computes with (``torch.get_num_threads()``,
  set by ``suite.train.dist``). On CPU a device is one rank with its threads, so
  ``mfu = achieved / (measured peak x ranks)`` compares the run with what its ranks could do.

Measurements are cached per machine in ``$XDG_CACHE_HOME/scalesuite/peak_flops.json`` (default
``~/.cache/scalesuite``), keyed by CPU model, thread count, torch version and precision, so only
the first run on a machine pays for one (at most ~1 s). A measurement during which other work held
the cores (the process got less CPU time than its threads x wall time) is low: it is used, and the
next run measures again, keeping the better, until one had its cores (or 3 tries). A corrupt or unwritable
cache is measured over quietly: it costs time, never a run. ``python -m suite.record.peak [--remeasure]`` prints (and
refreshes) this machine's figures.

When: after the timed training loop, before the summary is written (``RankLog.run_fields``).
Not before training, because the first step would then wait for a cold measurement; not inside
the loop, because it would be timed. One rank per node (local rank 0) measures while the node's
other ranks wait in a collective, since ranks measuring together on shared cores would each see a
fraction of the peak; a file lock keeps concurrent runs on one node from measuring at once too.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import socket
import time
from pathlib import Path

import torch

from suite.common.cache import suite_cache
from suite.record import flops
import fcntl
import torch.distributed as dist
import argparse

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
SIZES = (256, 512, 1024, 2048, 4096)  # square matmul sides tried, each double the last
TARGET_S = 0.2  # largest size whose one matmul is predicted to take at most this: near peak, total ~1 s at most
REPEATS = 3  # best of at least this many: a late thread wake-up or a neighbour's burst only lowers one
# Operand layouts, as a model's matmuls meet them (nn.Linear: forward a @ b.T, weight gradient
# a.T @ b, input gradient a @ b). Their rates differ: bf16 on a CPU without bf16 instructions by
# up to 30x, so the peak is that of the fastest layout, found on the smallest size.
LAYOUTS = {"a@b": lambda a, b: (a, b), "a@b.T": lambda a, b: (a, b.t()), "a.T@b": lambda a, b: (a.t(), b)}
SIZE_BUDGET_S = 0.1  # small sizes repeat until this is spent: more chances of an unhindered product
BUDGET_S = 1.0  # no new size or repeat starts after this: busy cores make every product slower than predicted
FULL_SHARE = 0.9  # the measurement had its cores when its CPU time >= this x threads x wall time
MAX_MEASUREMENTS = 3  # a machine that is always busy stops paying for new tries after this many
CACHE_FILE = "peak_flops.json"


def _cpu_time_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _best_rate(n: int, dtype: torch.dtype, generator: torch.Generator, deadline: float,
               layout: str) -> tuple[float, float]:
    """(best FLOP/s, mean seconds) of n x n matmuls (2 n^3 FLOPs each), ``REPEATS`` or more
    (``SIZE_BUDGET_S``), fewer (at least one) past ``deadline`` (a ``time.perf_counter()`` value)."""
    a, b = LAYOUTS[layout](torch.randn(n, n, generator=generator).to(dtype),
                           torch.randn(n, n, generator=generator).to(dtype))
    out = torch.empty(n, n, dtype=dtype)
    best_s, spent_s = float("inf"), 0.0
    for repeat in range(1, 50):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        took_s = time.perf_counter() - t0
        best_s, spent_s = min(best_s, took_s), spent_s + took_s
        if (repeat >= REPEATS and spent_s >= SIZE_BUDGET_S) or time.perf_counter() > deadline:
            break
    return 2 * n ** 3 / max(best_s, 1e-9), spent_s / repeat


def measure(precision: str) -> tuple[float, int, float]:
    """(peak FLOP/s, matrix side, cpu share) of this process's threads in ``precision``: growing
    square matmuls in the fastest of ``LAYOUTS``, up to the largest predicted to take ``TARGET_S`` and within ``BUDGET_S``; the
    best rate seen. The cpu share is the CPU time the process got over threads x wall time: below
    ``FULL_SHARE``, other work held the cores and the peak is low. Uses its own random generator:
    the training RNG is left as it was."""
    dtype, threads = DTYPES[precision], torch.get_num_threads()
    generator = torch.Generator().manual_seed(0)
    cpu0_s, wall0_s = _cpu_time_s(), time.perf_counter()
    deadline = wall0_s + BUDGET_S
    with torch.no_grad():
        best, mean_s, layout = max(_best_rate(SIZES[0], dtype, generator, deadline, name) + (name,)
                                   for name in LAYOUTS)
        side = SIZES[0]
        for n in SIZES[1:]:
            # SIZES double the side: 8x the work. From the mean time, not the best: on busy cores
            # the products take longer than the best one.
            predicted_s = 8 * mean_s
            if predicted_s > TARGET_S or time.perf_counter() + predicted_s > deadline:
                break
            rate, mean_s = _best_rate(n, dtype, generator, deadline, layout)
            if rate > best:
                best, side = rate, n
    share = (_cpu_time_s() - cpu0_s) / max((time.perf_counter() - wall0_s) * threads, 1e-9)
    return best, side, min(share, 1.0)


# ---- the cache -----------------------------------------------------------------------------

def cache_path() -> Path:
    return suite_cache(CACHE_FILE)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown cpu"


def cache_key(precision: str, threads: int) -> str:
    return f"{cpu_model()} | {threads} thread(s) | torch {torch.__version__} | {precision}"


def _read_cache(path: Path) -> dict:
    """The cache's entries; {} when it is missing, unreadable or not what this module writes."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _usable(entry) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("peak_flops_per_s"), (int, float)) \
        and entry["peak_flops_per_s"] > 0


def _settled(entry) -> bool:
    """A usable entry measured with the cores to itself, or tried often enough: reused as it is."""
    return _usable(entry) and (entry.get("cpu_share", 1.0) >= FULL_SHARE
                               or entry.get("measurements", 1) >= MAX_MEASUREMENTS)


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock beside the cache (yields False, unlocked, when that is impossible)."""

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # releases the lock


def _write_cache(path: Path, entries: dict) -> None:
    """Atomically, or not at all (a read-only home, a full disk: the next run measures again)."""
    from suite.record.run_record import write_json_atomic

    with contextlib.suppress(OSError):
        write_json_atomic(path, entries)


def cpu_peak(precision: str, remeasure: bool = False) -> dict:
    """This CPU's peak at this process's thread count: the cached entry, or a new measurement
    (cached). The entry: peak_flops_per_s, cpu, threads, precision, torch, matrix_side, cpu_share,
    measured_at, load_average_1m, and cached (whether it came from the cache as it was).

    An entry measured while other work held the cores (cpu_share < FULL_SHARE) is measured again
    by the next call, which keeps the better of the two: a busy moment does not fix a low peak
    for good. Once one measurement had its cores, or after ``MAX_MEASUREMENTS`` tries, later calls
    only read."""
    threads, path = torch.get_num_threads(), cache_path()
    key = cache_key(precision, threads)
    entry = _read_cache(path).get(key)
    if _settled(entry) and not remeasure:
        return {**entry, "cached": True}
    with _locked(path) as locked:
        entries = _read_cache(path)
        old = entries.get(key) if _usable(entries.get(key)) and not remeasure else None
        if _settled(old):  # another run measured while this one waited
            return {**old, "cached": True}
        rate, side, share = measure(precision)
        entry = {"peak_flops_per_s": rate, "cpu": cpu_model(), "threads": threads, "precision": precision,
                 "torch": torch.__version__, "matrix_side": side, "cpu_share": share, "measured_at": time.time(),
                 "load_average_1m": os.getloadavg()[0], "measurements": 1}
        if old and old["peak_flops_per_s"] > rate and share < FULL_SHARE:
            entry = dict(old)  # both measured on busy cores: the higher is nearer the peak
        if old:
            entry["measurements"] = old.get("measurements", 1) + 1
        if locked:
            _write_cache(path, {**entries, key: entry})
    return {**entry, "cached": False}


# ---- the peak a run uses -------------------------------------------------------------------

def compute_precision(recipe) -> str:
    """The precision the matmuls run in: training.precision, or FSDP's ``mixed_precision``."""
    precision = recipe.training.precision
    if precision == "fp32":
        precision = getattr(recipe.strategy, "mixed_precision", None) or precision
    return precision


def devices(recipe, ctx) -> int:
    """Devices MFU counts: GPUs (ranks x devices per task); on CPU one per rank, since the
    devices of a layer-wise split in one process share its threads, whose peak is measured."""
    if ctx.device.type == "cuda":
        return recipe.world_size * recipe.launch.devices_per_task
    return recipe.world_size


def resolve(recipe, ctx) -> tuple[float | None, str | None, dict | None]:
    """(peak FLOP/s per device, its source, the measurement entry) for this run; every rank calls
    it (on CPU it is a collective: each node's local rank 0 measures while the others wait)."""
    precision = compute_precision(recipe)
    if recipe.tracking.peak_flops_per_s:
        return recipe.tracking.peak_flops_per_s, "recipe", None
    if ctx.device.type == "cuda":
        peak = flops.peak_flops_per_s(flops.device_name(ctx.device), precision)
        return (peak, "vendor table", None) if peak else (None, None, None)
    if not recipe.tracking.measure_peak:
        return None, None, None
    mine = None
    if ctx.local_rank == 0:
        try:
            mine = cpu_peak(precision)
        except Exception as e:  # noqa: BLE001 - a peak is a measurement, never a reason to fail
            print(f"CPU peak not measured ({type(e).__name__}: {e}); MFU left out", flush=True)
    nodes = [(socket.gethostname(), mine)]
    if ctx.world_size > 1:

        nodes = [None] * ctx.world_size
        dist.all_gather_object(nodes, (socket.gethostname(), mine))
    by_host = {host: m for host, m in nodes if m}
    per_rank = [by_host.get(host) for host, _ in nodes]
    if not all(per_rank):
        return None, None, None
    # Nodes of one job are normally alike; if not, MFU divides by the sum of the ranks' peaks.
    peak = sum(m["peak_flops_per_s"] for m in per_rank) / len(per_rank)
    return peak, "measured", per_rank[0]


def main(argv=None) -> int:

    p = argparse.ArgumentParser(prog="python -m suite.record.peak", description="This CPU's measured peak FLOP/s.")
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    p.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    p.add_argument("--remeasure", action="store_true", help="measure again and replace the cached figures")
    args = p.parse_args(argv)
    for threads in args.threads:
        torch.set_num_threads(threads)
        for precision in args.precision:
            t0 = time.perf_counter()
            e = cpu_peak(precision, args.remeasure)
            how = "cached" if e["cached"] else f"measured in {time.perf_counter() - t0:.2f} s"
            print(f"{e['cpu']}, {threads} thread(s), {precision}: {e['peak_flops_per_s'] / 1e9:.1f} GFLOP/s "
                  f"({e['matrix_side']}x{e['matrix_side']} matmul, {100 * e.get('cpu_share', 1):.0f} % of its "
                  f"cores' time; {how})")
    print(f"cache: {cache_path()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
