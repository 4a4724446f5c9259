"""Hogwild! (Recht et al., 2011): the ranks of one machine train one model held in shared memory,
each on its own shard, each applying its optimizer step to the shared parameters without locks.

Our ranks are separate processes started by the launcher, not forked from one parent, so the
shared parameters live in a file-backed segment (under /dev/shm) that every rank maps: rank 0
creates it and copies the seeded model in, the others map it after a barrier, and once every
rank has mapped it rank 0 unlinks the file (the mapping stays valid while any rank holds it), so
nothing is left behind even when a rank is killed. Gradients and optimizer state (momentum,
Adam's moments) stay per process: each rank's momentum follows its own gradients only.
See docs/strategies.md ("Asynchronous training").
"""
from __future__ import annotations

import os
import tempfile
import uuid
from typing import ClassVar, Literal

import torch
import torch.distributed as dist

from suite.common.errors import SuiteError
from suite.strategies import costs
from suite.strategies.base import ModuleEngine, StrategyOptions

_ALIGN_BYTES = 64  # each tensor starts on a cache line: no two tensors share one


class Options(StrategyOptions):
    name: Literal["hogwild"] = "hogwild"
    reusable_process: ClassVar = True  # the shared segment belongs to the engine's tensors alone
    no_parity: ClassVar = "hogwild's ranks update shared weights without locks, asynchronously"
    overlap: ClassVar = costs.NO_COMMUNICATION
    # Tried; on fake tensors its shared segment fails today, and the plan falls back to the
    # analytic rule with that error in its notes.
    cannot_fake: ClassVar = ("its ranks share one model through shared memory (share_memory_), which a fake "
                             "tensor has no storage for")

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return {}  # the ranks share one copy of the parameters in memory: no collectives

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose

    def check_launch(self, launch) -> None:
        if launch.nodes != 1:
            raise SuiteError(f"strategy hogwild shares one model in one machine's memory, but launch.nodes="
                             f"{launch.nodes}; set launch.nodes=1 (more ranks: launch.tasks_per_node), "
                             f"or use strategy.name=param_server across nodes")
        if launch.device == "cuda":
            raise SuiteError("strategy hogwild keeps the shared model in host memory, but launch.device=cuda; "
                             "set launch.device=cpu, or use ddp on GPUs")


def shared_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """What the ranks share: parameters and floating-point buffers (batch norm's running
    statistics); integer buffers (batch norm's step count) stay per process."""
    return [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]


def segment_path() -> str:
    """A fresh file name in shared memory (/dev/shm where there is one)."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(folder, f"scalesuite-hogwild-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def _layout(tensors) -> tuple[list[int], int]:
    offsets, end = [], 0
    for t in tensors:
        start = -(-end // _ALIGN_BYTES) * _ALIGN_BYTES
        offsets.append(start)
        end = start + t.numel() * t.element_size()
    return offsets, max(end, 1)


def share(module: torch.nn.Module, ctx) -> int:
    """Move the module's shared tensors into one segment every rank maps; rank 0's values (the
    seeded model) are what all start from. Collective over the process group. Returns its bytes."""
    tensors = shared_tensors(module)
    offsets, nbytes = _layout(tensors)
    box = [segment_path() if ctx.is_main else None]
    if ctx.world_size > 1:
        dist.broadcast_object_list(box, src=0)
    path = box[0]
    try:
        if ctx.is_main:
            storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
            views = _views(storage, tensors, offsets)
            for view, t in zip(views, tensors):
                view.copy_(t.detach())
        if ctx.world_size > 1:
            dist.barrier()  # written: the others may map it
        if not ctx.is_main:
            storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
            views = _views(storage, tensors, offsets)
        if ctx.world_size > 1:
            dist.barrier()  # every rank has mapped it: the name is no longer needed
    finally:
        if ctx.is_main and os.path.exists(path):
            os.unlink(path)  # also when a peer failed before mapping: never a file left in /dev/shm
    with torch.no_grad():
        for view, t in zip(views, tensors):
            t.data = view  # the same Parameter objects, now backed by the shared pages
    return nbytes


def _views(storage, tensors, offsets) -> list[torch.Tensor]:
    out = []
    for t, offset in zip(tensors, offsets):
        view = torch.empty(0, dtype=t.dtype)
        view.set_(storage, offset // t.element_size(), t.shape)  # contiguous, in elements of its dtype
        out.append(view)
    return out


class HogwildEngine(ModuleEngine):
    """A plain module engine whose parameters are the shared ones: ``optimizer.step()`` writes
    into the pages every rank reads, with no reduction and no lock."""

    def __init__(self, setup, module, shared_bytes: int):
        super().__init__(setup, module)
        self.shared_bytes = shared_bytes

    def extra_metrics(self) -> dict:
        return {"shared_bytes": self.shared_bytes}  # one copy on the machine, mapped by every rank


def build(opts: Options, setup) -> HogwildEngine:
    ctx = setup.ctx
    if ctx.device.type != "cpu":
        raise SuiteError(f"strategy hogwild keeps the shared model in host memory, but this rank runs on "
                         f"{ctx.device}; set launch.device=cpu")
    if ctx.local_world_size != ctx.world_size:  # torchrun over several nodes
        raise SuiteError(f"strategy hogwild shares memory between the ranks of one machine, but only "
                         f"{ctx.local_world_size} of {ctx.world_size} ranks run on this one; use one node")
    module = setup.build_model()
    shared_bytes = share(module, ctx)
    return HogwildEngine(setup, setup.prepare(module), shared_bytes)
