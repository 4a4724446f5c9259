"""The collective check: N local ranks join a process group the way a run's ranks do
(``suite.train.dist.init``: the one place that picks CPU+gloo or CUDA+NCCL), run each collective
once on known integers and compare the result exactly, then time it per message size and report
bandwidth as nccl-tests does (``PERFORMANCE.md`` of NVIDIA/nccl-tests):

    algbw = size / time
    busbw = algbw * factor: all_reduce 2(n-1)/n, all_gather (n-1)/n, reduce_scatter (n-1)/n

where size is the all-reduce's buffer, the all-gather's output and the reduce-scatter's input,
and time the slowest rank's median call. busbw is what a link must carry, so it can be set
against the link's rate whatever the collective and the number of ranks.

The rank's code has no branch on the backend: the device comes from ``dist.init`` and every
tensor is made on it.
"""
from __future__ import annotations

import re
import socket
import statistics
import time

from suite.doctor import ranks
from suite.doctor.report import Check, bandwidth_table, human_bytes

KINDS = ("all_reduce", "all_gather", "reduce_scatter")
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n}
# On one host the ranks' bytes never cross a NIC (loopback, shared memory, NVLink or PCIe), so
# any working path beats these; below them something is wrong, not merely slow. gloo: a gigabit
# link's rate. NCCL: well under what PCIe between two GPUs carries.
FLOOR_GB_S = {"gloo": 0.125, "nccl": 1.0}
VALUE_PERIOD = 97  # inputs are small integers (exact in float32 for sums over thousands of ranks)


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


def bus_bandwidth(kind: str, size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second, as nccl-tests)."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * BUS_FACTOR[kind](world)


# ---- on every rank -------------------------------------------------------------------------

def default_ops() -> dict:
    """Each collective as ``op(output, input)`` (all_reduce works in place: output is input)."""
    import torch.distributed as dist

    return {"all_reduce": lambda out, inp: dist.all_reduce(out),
            "all_gather": lambda out, inp: dist.all_gather_single(out, inp),
            "reduce_scatter": lambda out, inp: dist.reduce_scatter_single(out, inp)}


def buffers(kind: str, count: int, world: int, rank: int, device):
    """(output, input, expected output) for one exact check: rank r contributes r + 1 plus a
    pattern of its elements' positions, so a rank's missing or doubled share, a shifted or
    swapped chunk and a wrong operation all change the result."""
    import torch

    def values(start, stop, who):
        return (who + 1) + 2 * (torch.arange(start, stop, device=device) % VALUE_PERIOD).float()

    shard = count // world
    sum_of_ranks = world * (world + 1) / 2
    if kind == "all_reduce":
        inp = values(0, count, rank)
        return inp, inp, sum_of_ranks + world * 2 * (torch.arange(count, device=device) % VALUE_PERIOD).float()
    if kind == "all_gather":
        inp = values(rank * shard, (rank + 1) * shard, rank)
        owner = torch.arange(count, device=device) // shard
        return torch.empty(count, device=device), inp, values(0, count, 0) + owner.float()
    inp = values(0, count, rank)
    mine = torch.arange(rank * shard, (rank + 1) * shard, device=device)
    return (torch.empty(shard, device=device), inp,
            sum_of_ranks + world * 2 * (mine % VALUE_PERIOD).float())


def exact_check(out, expected) -> dict:
    """{"exact": bool, "wrong": elements off, "first": (index, expected, got)} comparing exactly."""
    wrong = (out != expected).nonzero()
    if len(wrong) == 0:
        return {"exact": True, "wrong": 0}
    i = int(wrong[0])
    return {"exact": False, "wrong": len(wrong), "first": [i, float(expected[i]), float(out[i])]}


def measure(kind: str, size_bytes: int, ctx, op, warmup: int, iters: int) -> dict:
    """One size of one collective on this rank: the exact check on its first call, then the
    median of ``iters`` timed calls after ``warmup`` untimed ones. Each timed call starts after
    a barrier (so it times the collective, not a late peer's earlier work) and ends when the
    device is done with it."""
    import torch
    import torch.distributed as dist

    world = ctx.world_size
    count = max(world, size_bytes // 4 // world * world)  # fp32 elements, divisible into shards
    out, inp, expected = buffers(kind, count, world, ctx.rank, ctx.device)
    op(out, inp)
    ctx.synchronize()
    result = exact_check(out, expected)
    # Timed calls run on zeros: the result of a sum fed back in would grow call by call.
    out, inp = torch.zeros_like(out), torch.zeros_like(inp)
    if kind == "all_reduce":
        inp = out
    barrier = ((lambda: dist.barrier(device_ids=[ctx.device.index])) if ctx.device.type == "cuda"
               else dist.barrier)
    for _ in range(warmup):
        op(out, inp)
    times = []
    for _ in range(iters):
        barrier()
        ctx.synchronize()
        t0 = time.perf_counter()
        op(out, inp)
        ctx.synchronize()
        times.append(time.perf_counter() - t0)
    return {**result, "bytes": count * 4, "count": count, "time_s": statistics.median(times)}


def rank_program(say, device: str, kinds, message_sizes, warmup: int, iters: int, timeout_s: float, ops=None):
    """What each rank runs (``suite.doctor.ranks``): join, then every size of every kind."""
    import torch

    from suite.train import dist as suite_dist

    say("step", what="rendezvous")
    ctx = suite_dist.init(device, collective_timeout_s=timeout_s)
    say("joined", backend=ctx.backend, device=str(ctx.device), threads=torch.get_num_threads(),
        host=socket.gethostname())
    ops = {**default_ops(), **(ops or {})}
    try:
        for kind in kinds:
            for size in message_sizes:
                say("step", what=f"{kind} of {human_bytes(size)}")
                say("point", kind=kind, **measure(kind, size, ctx, ops[kind], warmup, iters))
    finally:
        suite_dist.close()


# ---- on the doctor's side ------------------------------------------------------------------

def _plain(message: str) -> str:
    """A backend's message without its source location ("[.../unbound_buffer.cc:78] ")."""
    return re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", message)


def failure_check(name: str, backend: str, failure: ranks.RanksFailed, timeout_s: float) -> Check:
    """What a hang, an error or a dead rank means, and what to do."""
    ifname = "NCCL_SOCKET_IFNAME" if backend == "nccl" else "GLOO_SOCKET_IFNAME"
    said = f"rank {failure.rank}: {_plain(failure.message)}"
    data = {"kind": failure.kind, "rank": failure.rank, "step": failure.step, "message": failure.message,
            "steps": failure.steps, "traceback": failure.traceback}
    if failure.kind == "hang":
        return Check(name, "fail", f"{failure.step} did not finish within {timeout_s:g} s ({said})",
                     meaning=("the ranks could not meet at the rendezvous: a firewall, or an address the others cannot reach"
                              if failure.step in ("start", "rendezvous") else
                              "a collective hung: the ranks cannot reach each other over the interface the backend "
                              "chose, or a rank is stuck (a GPU in a bad state, far more ranks than cores)"),
                     fix=f"set {ifname} to the interface between the ranks and check the firewall; if the machine "
                         f"is only slow, give --timeout more seconds", data=data)
    if failure.kind == "died":
        return Check(name, "fail", f"rank {failure.rank} ended without an error in {failure.step} ({failure.message})",
                     meaning="killed from outside (the OOM killer) or a crash inside the backend or driver",
                     fix="dmesg names the OOM killer; try fewer --ranks; rerun with NCCL_DEBUG=INFO on GPUs", data=data)
    return Check(name, "fail", f"{failure.step} raised ({said})",
                 meaning="the backend refused or broke: the message says how (an unusable interface, "
                         "a CUDA or NCCL error, mismatched versions)",
                 fix=f"fix what the message names; {ifname} picks the interface; rerun with NCCL_DEBUG=INFO or "
                     f"TORCH_DISTRIBUTED_DEBUG=DETAIL for more", data=data)


def exact_result_check(name: str, kind: str, backend: str, points: list[dict]) -> Check:
    bad = [p for p in points if not p["exact"]]
    if not bad:
        return Check(name, "pass", f"every rank's result exact at {len(points)} size(s), "
                                   f"{human_bytes(points[0]['bytes'])} .. {human_bytes(points[-1]['bytes'])}")
    p = bad[0]
    index, expected, got = p["first"]
    return Check(name, "fail", f"wrong result at {len(bad)} of {len(points)} size(s); first at "
                               f"{human_bytes(p['bytes'])} on rank {p['rank']}: {p['wrong']} of {p['count']} "
                               f"elements off, element {index} is {got:g}, should be {expected:g}",
                 meaning=f"{kind.replace('_', '-')} returns wrong numbers: a broken transport (NIC, driver, shared "
                         f"memory) or ranks running mismatched torch / {backend} builds; every strategy's gradients "
                         f"would be wrong",
                 fix="run every rank from one environment (same torch, same NCCL) and rerun; if it persists, "
                     "report it with this output", data={"wrong_points": bad})


def bandwidth_check(name: str, kind: str, backend: str, world: int, points: list[dict], cores: int) -> Check:
    largest = points[-1]
    seen = (f"busbw {largest['busbw_gb_s']:.3f} GB/s (algbw {largest['algbw_gb_s']:.3f}) at "
            f"{human_bytes(largest['bytes'])}")
    if world < 2:
        return Check(name, "info", f"{seen}: one rank, nothing crosses a link (busbw is 0 by definition)")
    floor = FLOOR_GB_S[backend]
    if largest["busbw_gb_s"] >= floor:
        return Check(name, "pass", f"{seen}, above the {floor:g} GB/s any same-host path beats")
    crowded = backend == "gloo" and world > cores
    return Check(name, "fail", f"{seen}, below the {floor:g} GB/s any same-host path beats",
                 meaning=("the ranks' traffic takes a slow path: " +
                          (f"{world} ranks on {cores} cores wait for each other's turn on a core"
                           if crowded else
                           "NCCL fell back from P2P / shared memory to sockets" if backend == "nccl" else
                           "the ranks are starved of CPU (a busy machine) or their bytes leave the host "
                           "through a slow interface")),
                 fix=("use --ranks at most the number of cores" if crowded else
                      "NCCL_DEBUG=INFO names the transport; unset NCCL_P2P_DISABLE / NCCL_SHM_DISABLE and give "
                      "the container a larger /dev/shm" if backend == "nccl" else
                      "rerun on an idle machine; set GLOO_SOCKET_IFNAME=lo for ranks on one host (the interface "
                      "between the nodes for several)"))


def check_backend(backend: str, world: int, message_sizes, *, warmup: int, iters: int, timeout_s: float,
                  emit, line, kinds=KINDS, ops=None, cores: int = 1) -> dict:
    """Run the collective check of one backend on ``world`` local ranks: ``emit(check)`` each
    check as it is decided and ``line(text)`` each table row as every rank has measured it.
    The measurements, for the JSON."""
    device = "cuda" if backend == "nccl" else "cpu"
    found = {"world": world, "device": device, "ranks": {}, "points": {k: [] for k in kinds}}
    partial: dict = {}
    prefix = f"{backend} x{world}"

    def on_message(rank, kind, data):
        if kind == "joined":
            found["ranks"][rank] = data
            if len(found["ranks"]) == world:
                threads = sorted({r["threads"] for r in found["ranks"].values()})
                emit(Check(f"{prefix} rendezvous", "pass", f"{world} rank(s) joined on "
                           f"{', '.join(sorted({r['device'] for r in found['ranks'].values()}))}, "
                           f"{'/'.join(map(str, threads))} thread(s) each"))
        elif kind == "point":
            got = partial.setdefault((data["kind"], data["bytes"]), {})
            got[rank] = data
            if len(got) == world:
                finish_point(data["kind"], got)

    def finish_point(kind, per_rank):
        slowest = max(per_rank.values(), key=lambda d: d["time_s"])
        wrong = next((dict(d, rank=r) for r, d in sorted(per_rank.items()) if not d["exact"]), None)
        algbw, busbw = bus_bandwidth(kind, slowest["bytes"], slowest["time_s"], world)
        point = {"bytes": slowest["bytes"], "count": slowest["count"], "time_s": slowest["time_s"],
                 "algbw_gb_s": algbw, "busbw_gb_s": busbw, "exact": wrong is None}
        if wrong:
            point.update(rank=wrong["rank"], wrong=wrong["wrong"], first=wrong["first"])
        points = found["points"][kind]
        if not points:
            line(f"  {prefix} {kind}:")
            for text in bandwidth_table([])[:1]:
                line(text)
        points.append(point)
        line(bandwidth_table([point])[1])
        if len(points) == len(message_sizes):
            emit(exact_result_check(f"{prefix} {kind} exact", kind, backend, points))
            emit(bandwidth_check(f"{prefix} {kind} bandwidth", kind, backend, world, points, cores))

    try:
        ranks.run(rank_program, world, (device, kinds, message_sizes, warmup, iters, timeout_s, ops),
                  silence_s=timeout_s + 10, on_message=on_message)
    except ranks.RanksFailed as failure:
        step = failure.step
        name = f"{prefix} rendezvous" if step in ("start", "rendezvous") else f"{prefix} {step.split(' of ')[0]}"
        emit(failure_check(name, backend, failure, timeout_s))
        found["failure"] = {"kind": failure.kind, "rank": failure.rank, "step": step, "message": failure.message}
    return found
