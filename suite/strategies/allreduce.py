"""Hand-written data parallelism ("custom data parallel" in the comparison studies): after the
backward pass each gradient is all-reduced on its own and divided by the world size. No buckets,
no overlap with backward, so the gap to DDP shows what DDP's bucketing buys."""
from typing import ClassVar, Literal

import torch.distributed as dist

from suite.strategies.base import ModuleEngine, StrategyOptions


class Options(StrategyOptions):
    name: Literal["allreduce"] = "allreduce"
    reusable_process: ClassVar = True


class AllReduceEngine(ModuleEngine):
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


def build(opts: Options, setup) -> AllReduceEngine:
    return AllReduceEngine(setup, setup.prepare(setup.build_model().to(setup.ctx.device)))
