"""What each rank of a calibration times (``suite.calibrate.measure`` runs them and fits the
results): collectives after a barrier over message sizes (``time_collectives``), over groups of
the ranks calling at once (``time_in_groups``), small calls between slices of compute
(``time_in_step``) and calls back to back after compute (``time_burst``).
"""
from __future__ import annotations

import os
import statistics
import time

MIN_BYTES = 4096
MAX_BYTES = 64 * 2**20
WARMUP = 3  # untimed calls per size: the first calls of a kind are several times slower
ROUNDS = 7  # timed calls per size (lower quartile taken), interleaved over sizes (time_collectives)
SMALL_CALLS = 3  # messages under SMALL_BYTES get this many per round: latency-bound, noisy, cheap
SMALL_BYTES = 2**20
IN_STEP_CALLS = 24  # small calls, each after a slice of compute, per timed round (time_in_step)
IN_STEP_ROUNDS = 5
# Between calls: a 3x3 convolution's forward and backward (channels, batch of 32x32 images), a
# short and a long slice: autograd's work, allocations included, as a step's layers do it (matmuls
# alone cost a call less; benchmarks/results/code-rules.md).
IN_STEP_SLICES = ((8, 4), (16, 16))
IN_STEP_BYTES = 4096
BURST_CALLS = 8  # calls one after another after a slice of compute, per burst (time_burst)
BURST_ROUNDS = 6  # bursts per timed round
# A long burst, timed too where each rank has a core: a call's cost falls with the burst's length
# (the ranks stay awake in step). Not where ranks share cores: there the cost does not fall and a
# long burst would take seconds (benchmarks/results/code-rules.md).
BURST_LONG_CALLS = 256
POOLED = ("all_reduce", "all_gather", "reduce_scatter")


def sizes(min_bytes: int = MIN_BYTES, max_bytes: int = MAX_BYTES) -> list[int]:
    out, n = [], min_bytes
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


# ---- on every rank -------------------------------------------------------------------------

def _op(kind: str, n_bytes: int, world: int, rank: int, group=None):
    """A function making one call of ``kind`` with a message of ``n_bytes`` (fp32 elements), over
    ``group`` (of ``world`` ranks) where given, else over every rank."""
    import torch
    import torch.distributed as dist

    n = max(world, n_bytes // 4 // world * world)  # divisible by world: gather/scatter shards
    if kind == "all_reduce":
        buf = torch.ones(n)
        return lambda: dist.all_reduce(buf, group=group)
    if kind == "all_gather":  # message = the output buffer
        out, mine = torch.empty(n), torch.ones(n // world)
        return lambda: dist.all_gather_into_tensor(out, mine, group=group)
    if kind == "reduce_scatter":  # message = the input buffer
        inp, out = torch.ones(n), torch.empty(n // world)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if kind == "broadcast":
        buf = torch.ones(n)
        return lambda: dist.broadcast(buf, src=0)
    if kind == "send":  # ranks 0 and 1 ping-pong; a call = half the round trip (others wait)
        buf = torch.ones(n)

        def ping_pong():
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        return ping_pong
    raise ValueError(kind)


def time_collectives(kinds, message_sizes, world: int, rank: int, progress=None, group=None) -> dict:
    """{kind: [(bytes, seconds), ...]}: each size's per-call time, the lower quartile of its calls
    on the slowest rank (a collective ends for the job when its slowest rank is done).

    The lower quartile, not the median: on a machine with as many ranks as cores a call waits for
    its peer to be scheduled (a time slice) in up to half of the repetitions, so the median of a
    size flips between the link's time and a time slice from one calibration to the next
    (benchmarks/results/code-rules.md). These fits describe the link; what
    such waits add to a call inside a step is measured on its own (``time_in_step``).

    The sizes of a kind are timed in rounds (every size once per round, ``ROUNDS`` rounds) rather
    than one size after another, so that a busy spell of the machine slows one call of every size
    instead of all calls of one size; each call starts after a barrier."""
    import torch
    import torch.distributed as dist

    out = {}
    for kind in kinds:
        calls = [_op(kind, n_bytes, world, rank, group) for n_bytes in message_sizes]
        for call in calls:
            for _ in range(WARMUP):  # connections, buffers, the kind's first-call setup
                call()
        times = [[] for _ in message_sizes]
        for _ in range(ROUNDS):
            for i, (n_bytes, call) in enumerate(zip(message_sizes, calls)):
                for _ in range(SMALL_CALLS if n_bytes < SMALL_BYTES else 1):
                    dist.barrier()
                    t0 = time.perf_counter()
                    call()
                    times[i].append(time.perf_counter() - t0)
        quartiles = torch.tensor([sorted(t)[len(t) // 4] / (2 if kind == "send" else 1) for t in times], dtype=torch.float64)
        dist.all_reduce(quartiles, op=dist.ReduceOp.MAX)
        out[kind] = [(n, float(t)) for n, t in zip(message_sizes, quartiles)]
        if progress:
            progress(f"  {kind + (f' in {world}s' if group is not None else ''):<15} " + "  ".join(f"{n / 2**10:.0f} KiB {t * 1e3:.3f} ms" for n, t in out[kind]))
    return out


def group_sizes(world: int) -> list[int]:
    """The group sizes ``time_in_groups`` times at ``world`` ranks: each divisor from 2 below it."""
    return [g for g in range(2, world) if world % g == 0]


def time_in_groups(message_sizes, world: int, rank: int, progress=None) -> dict:
    """{group size: {kind: [(bytes, seconds), ...]}}: the collectives of ``POOLED`` over groups
    of each size of ``group_sizes(world)``, every group calling at once, as a hybrid's groups do
    (HSDP's shard and replica groups, tensor x data parallel's, a pipeline's stages' data-parallel
    groups): each rank is in one group of consecutive ranks. ``time_collectives`` over a group's
    ranks alone leaves the node's other cores idle; with every group calling, the groups share
    the cores, and on a node with fewer cores than ranks both a call's latency and its bytes'
    time grow, by more than the cores' ratio for the bytes (benchmarks/results/code-rules.md)."""
    import torch.distributed as dist

    out = {}
    for g in group_sizes(world):
        groups = [dist.new_group(list(range(first, first + g))) for first in range(0, world, g)]  # every rank makes each
        out[g] = time_collectives(POOLED, message_sizes, g, rank, progress, group=groups[rank // g])
    return out


def time_in_step(kinds, world: int, rank: int) -> dict:
    """{kind: [[slice_s, seconds], ...]}: what one small call of each kind adds to a step when
    it sits between slices of compute ``slice_s`` long (``IN_STEP_SLICES``), the slowest rank's
    median. Batch norm synced over the ranks, tensor parallelism's all-reduces, FSDP's per-unit
    gathers and a per-parameter all-reduce each call a collective between pieces of
    computation, not back to back after a barrier as ``time_collectives`` times them, and costs
    several times more there: the collective's threads wait for a core that a rank's compute
    holds, and longer slices hold it longer (benchmarks/results/code-rules.md). The time model interpolates at its own slice (``alpha_beta.step_alpha``)."""
    import torch
    import torch.distributed as dist

    def timed(compute, call):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(IN_STEP_CALLS):
            compute()
            if call:
                call()
        return time.perf_counter() - t0

    slices = [_compute_slice(*shape) for shape in IN_STEP_SLICES]
    out = []
    for kind in kinds:
        call = _op(kind, IN_STEP_BYTES, world, rank)
        for _ in range(WARMUP):
            call()
        for compute in slices:
            # Rounds with and without the calls side by side, the median of their differences:
            # a busy spell of the machine moves both of a pair.
            pairs = [(timed(compute, None), timed(compute, call)) for _ in range(IN_STEP_ROUNDS)]
            alone = statistics.median(a for a, _ in pairs) / IN_STEP_CALLS
            extra = statistics.median(b - a for a, b in pairs) / IN_STEP_CALLS
            out += [alone, max(0.0, extra) / (2 if kind == "send" else 1)]  # a ping-pong: two sends
    slowest = torch.tensor(out, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    values = slowest.tolist()
    per = 2 * len(slices)
    return {kind: [values[i * per + 2 * j: i * per + 2 * j + 2] for j in range(len(slices))]
            for i, kind in enumerate(kinds)}


def _compute_slice(channels: int, batch: int):
    import torch

    conv = torch.nn.Conv2d(channels, channels, 3, padding=1)
    images = torch.randn(batch, channels, 32, 32, requires_grad=True)
    return lambda: conv(images).sum().backward()


def time_burst(world: int, rank: int) -> dict[int, float]:
    """What one small all-reduce costs when ``calls`` follow one another after a slice of compute
    (the larger of ``IN_STEP_SLICES``), as a per-tensor all-reduce after backward issues them
    (``Overlap.back_to_back``): {calls: seconds a call}, the slowest rank's, for bursts of
    ``BURST_CALLS`` and, where no rank of this node shares a core, ``BURST_LONG_CALLS``. Neither
    the calls after a barrier (``time_collectives``) nor those between slices of compute
    (``time_in_step``) tell it: a call in a burst costs more than either
    (benchmarks/results/code-rules.md). Rounds with and without the calls
    side by side, the median of their differences; about as many calls or more in a long burst's
    rounds as in a short one's."""
    import torch
    import torch.distributed as dist

    compute, call = _compute_slice(*IN_STEP_SLICES[-1]), _op("all_reduce", IN_STEP_BYTES, world, rank)

    def timed(calls: int, rounds: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(rounds):
            compute()
            for _ in range(calls):
                call()
        return time.perf_counter() - t0

    timed(BURST_CALLS, BURST_ROUNDS)  # warm-up
    # Every rank must time the same bursts, or the long one's calls would wait for ranks that skip
    # it: the long burst only where every node has a core for each of its ranks.
    on_node = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
    core_each = torch.tensor([int(on_node <= len(os.sched_getaffinity(0)))])
    dist.all_reduce(core_each, op=dist.ReduceOp.MIN)
    lengths = (BURST_CALLS, BURST_LONG_CALLS) if core_each.item() else (BURST_CALLS,)
    out = {}
    for calls in lengths:
        rounds = max(1, BURST_ROUNDS * BURST_CALLS // calls)
        pairs = [(timed(0, rounds), timed(calls, rounds)) for _ in range(IN_STEP_ROUNDS)]
        per_call = max(0.0, statistics.median(b - a for a, b in pairs)) / (rounds * calls)
        slowest = torch.tensor([per_call], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[calls] = float(slowest)
    return out
