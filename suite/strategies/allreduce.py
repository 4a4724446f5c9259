"""Hand-written data parallelism ("custom data parallel" in the comparison studies): after the
backward pass each gradient is all-reduced on its own and divided by the world size. No buckets,
no overlap with backward, so the gap to DDP shows what DDP's bucketing buys.

``transport: mpi`` exchanges the gradients through MPI instead (mpi4py ``Allreduce`` on one flat
host buffer per step, summed, then divided by the world size), as MPI-based data-parallel codes
do; it needs ranks an MPI launcher started (``launch.executor: mpi``). torch.distributed (gloo)
still carries everything else: the initial broadcast, the loop's loss reduction, the summary."""
from typing import ClassVar, Literal

import torch
import torch.distributed as dist

from suite.strategies import costs
from suite.strategies.base import ModuleEngine, StrategyOptions


class Options(StrategyOptions):
    name: Literal["allreduce"] = "allreduce"
    reusable_process: ClassVar = True
    uneven_batches: ClassVar = True  # training.balance: a full replica per rank, gradients averaged
    transport: Literal["torch", "mpi"] = "torch"  # what carries the gradients
    overlap: ClassVar = costs.AFTER_BACKWARD
    cannot_fake: ClassVar = ""

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # Every gradient all-reduced on its own: a call per parameter tensor.
        return {"all_reduce": (step.gradient_bytes, step.parameter_tensors)}

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose: the transport is the launcher's (mpi needs an MPI launch)


class AllReduceEngine(ModuleEngine):
    splits_step_time: ClassVar = True  # reduce_gradients is its only collective
    def __init__(self, setup, module):
        super().__init__(setup, module)
        # Replicas must start equal: take rank 0's initial weights, as DDP does.
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)

    def reduce_gradients(self) -> None:
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad.div_(self.dp_size)


class MpiAllReduceEngine(AllReduceEngine):
    """Gradients through MPI: one flat float buffer on the host per step, reused every step."""

    def __init__(self, setup, module):
        super().__init__(setup, module)
        from suite.common import mpi

        self._comm = mpi.world("strategy.transport=mpi", setup.ctx.rank, setup.ctx.world_size)  # or why not
        from mpi4py import MPI
        self._in_place = MPI.IN_PLACE
        self._flat = None  # host buffer; sized at the first step (which gradients exist)

    def reduce_gradients(self) -> None:
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        total = sum(g.numel() for g in grads)
        if self._flat is None or self._flat.numel() != total or self._flat.dtype != grads[0].dtype:
            self._flat = torch.empty(total, dtype=grads[0].dtype)
        views, at = [], 0
        for g in grads:  # gather into the buffer (a device-to-host copy on GPU)
            view = self._flat[at:at + g.numel()]
            view.copy_(g.reshape(-1))
            views.append(view)
            at += g.numel()
        self._comm.Allreduce(self._in_place, self._flat.numpy())  # sum over ranks, in place
        self._flat.div_(self.dp_size)
        for g, view in zip(grads, views):
            g.copy_(view.view_as(g))


def build(opts: Options, setup) -> AllReduceEngine:
    engine = MpiAllReduceEngine if opts.transport == "mpi" else AllReduceEngine
    return engine(setup, setup.prepare(setup.build_model().to(setup.ctx.device)))
