"""PyTorch DistributedDataParallel: a full replica per rank, gradients averaged in buckets that
overlap with the backward pass."""
from typing import ClassVar, Literal

from pydantic import PositiveFloat
from torch.nn.parallel import DistributedDataParallel

from suite.compat import torch as torch_compat
from suite.strategies.base import ModuleEngine, StrategyOptions


class Options(StrategyOptions):
    name: Literal["ddp"] = "ddp"
    warm_imports: ClassVar = (torch_compat.DYNAMO,)
    reusable_process: ClassVar = True
    bucket_cap_mb: PositiveFloat = 25.0
    static_graph: bool = False


class DDPEngine(ModuleEngine):
    def sync_context(self, last: bool):
        # Skip the all-reduce on all but the last micro-batch of an accumulated step.
        return super().sync_context(last) if last else self.module.no_sync()

    def state_dict(self) -> dict:
        return {"model": self.module.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def build(opts: Options, setup) -> DDPEngine:
    ctx = setup.ctx
    model = setup.prepare(setup.build_model().to(ctx.device))
    ddp = DistributedDataParallel(
        model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        bucket_cap_mb=opts.bucket_cap_mb, static_graph=opts.static_graph)
    return DDPEngine(setup, ddp)
