"""training.balance: how the global batch is split over the data-parallel ranks.

The global batch of each step holds the same samples whatever the split: the ones the equal
split's ranks would read together (``DistributedSampler``'s order, drop_last: step t's global
batch is that order's slice [t x B, (t + 1) x B)). Only their assignment to ranks changes: rank r
reads the slice's part at offset sum(shares[:r]), of length shares[r]. The engine weighs each
rank's loss by its share (``ModuleEngine.pass_weight``) so the averaged gradient is the global
batch's mean, and the losses are single's.

``speed``: every rank starts with an equal share. After the first step (which pays for one-time
allocations and DDP's first-iteration set-up), each rank times forward passes of its own replica
on that step's inputs (``Engine.local_forward``: eval mode, no gradients, no collectives) until at
least ``MEASURE_S`` seconds and ``MIN_PASSES`` passes have gone by; its speed is samples per second
of them. The speeds are exchanged in one all-reduce, every rank computes the same shares from them
(in proportion, whole samples, ``proportional_shares``), and they hold from the second step to the
end of the run. Forward passes stand for the whole step's compute: the model and the hardware
kind are the same on every rank, so forward and backward scale together.

Why not time the training steps themselves: a CPU capped by a cgroup's CFS quota (launch.rank_cpu,
slurm/start.sh --node-cpu) runs at full speed until its quota of each 100 ms period is spent and
then stalls wherever it is: in its backward, but also in its collectives or while it loads the
next batch, where a stall looks like waiting for peers. Measured on the loaded 2-core machine with
one rank at 25% of a core: the step's busy time (step less waiting) came out equal for both ranks;
the rank's own compute inside the steps came out 2x its peer's, as did this probe (the load of
other work slows the uncapped rank too: a bare loop ran 2.5x slower capped at 25% there). A probe
that does nothing but compute takes every stall in its own time, wherever the training step
would have put it. It lasts at least ``MEASURE_S``, ten CFS periods, so the throttling averages
out; about a second of every rank's time once per run.

A resumed run measures again from its first step after the checkpoint.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from suite.common.errors import SuiteError

MEASURE_S = 1.0  # seconds each rank times its forward passes: ten 100 ms CFS periods
MIN_PASSES = 3
WARMUP_STEPS = 1  # training steps before the probe


class SharedBatches:
    """A batch sampler: this rank's part of each step's global batch, by ``shares`` (read at
    every batch, so a change applies from the next step: the loader fetches lazily, no workers)."""

    def __init__(self, dataset_size: int, dp_size: int, dp_rank: int, batch_size: int, seed: int, shares: list[int]):
        self.dp_size, self.dp_rank, self.batch_size, self.seed = dp_size, dp_rank, batch_size, seed
        self.shares = list(shares)
        # the equal split's sampler of rank 0, for its order and length (every rank's is the same order)
        self._order = DistributedSampler(range(dataset_size), num_replicas=dp_size, rank=0, shuffle=True,
                                         seed=seed, drop_last=True)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._order.set_epoch(epoch)

    def __len__(self) -> int:
        return self._order.num_samples // (self.batch_size // self.dp_size)  # the equal split's steps

    def __iter__(self):
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)  # DistributedSampler's permutation, before it deals it out
        order = torch.randperm(len(self._order.dataset), generator=g).tolist()[:self._order.total_size]
        for step in range(len(self)):
            start = step * self.batch_size + sum(self.shares[:self.dp_rank])
            yield order[start:start + self.shares[self.dp_rank]]


def equal_shares(batch_size: int, dp_size: int) -> list[int]:
    return [batch_size // dp_size] * dp_size


def proportional_shares(speeds: list[float], batch_size: int, least: int = 1) -> list[int]:
    """Whole samples per rank, in proportion to ``speeds``, summing to ``batch_size``, each at
    least ``least`` (one per accumulation pass): largest remainders get the leftover samples."""
    n = len(speeds)
    if batch_size < least * n:
        raise SuiteError(f"training.batch_size={batch_size} cannot give each of {n} ranks {least} samples")
    spare = batch_size - least * n
    ideal = [spare * s / sum(speeds) for s in speeds]
    shares = [int(x) for x in ideal]
    by_remainder = sorted(range(n), key=lambda i: ideal[i] - shares[i], reverse=True)
    for i in by_remainder[:spare - sum(shares)]:
        shares[i] += 1
    return [least + s for s in shares]


class SpeedBalancer:
    """training.balance=speed: after the warm-up step, time this rank's forward passes, exchange
    the speeds and set the batches' shares in proportion (see the module's docstring)."""

    def __init__(self, batches: SharedBatches, least: int, device):
        self.batches, self.least, self.device = batches, least, device
        self.seen_steps = 0
        self.record: dict | None = None  # what was measured and decided, for the run record

    def after_step(self, engine, inputs) -> dict | None:
        """Called by every rank after every step with the step's inputs; returns the decision once,
        when it is made (a collective then: every rank calls this after the same step)."""
        self.seen_steps += 1
        if self.record is not None or self.seen_steps < WARMUP_STEPS:
            return None
        passes, started = 0, time.perf_counter()
        while passes < MIN_PASSES or time.perf_counter() - started < MEASURE_S:
            engine.local_forward(inputs)
            passes += 1
        elapsed = time.perf_counter() - started
        ranks, me = self.batches.dp_size, self.batches.dp_rank
        speeds = torch.zeros(ranks, dtype=torch.float64, device=self.device)
        speeds[me] = passes * len(inputs) / elapsed  # samples per second of forward passes
        if ranks > 1:
            dist.all_reduce(speeds)  # every rank's speed: the same numbers everywhere
        shares = proportional_shares(speeds.tolist(), self.batches.batch_size, self.least)
        self.batches.shares = shares
        self.record = {"after_step": self.seen_steps, "probe_s": elapsed, "passes": passes,
                       "samples_per_s": speeds.tolist(), "shares": shares}
        return self.record
