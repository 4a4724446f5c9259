"""PyTorch DistributedDataParallel: a full replica per rank, gradients averaged in buckets that
overlap with the backward pass."""
from typing import ClassVar, Literal

from pydantic import PositiveFloat
from torch.nn.parallel import DistributedDataParallel

from suite.compat import torch as torch_compat
from suite.strategies import costs
from suite.strategies.base import ModuleEngine, StrategyOptions

DDP_SHARE = 0.5  # of the all-reduce's time, assumed hidden under backward (the planner's overlap rule)


class Options(StrategyOptions):
    name: Literal["ddp"] = "ddp"
    warm_imports: ClassVar = (torch_compat.DYNAMO,)
    reusable_process: ClassVar = True
    uneven_batches: ClassVar = True  # training.balance: a full replica per rank, gradients averaged
    bucket_cap_mb: PositiveFloat = 25.0
    static_graph: bool = False
    overlap: ClassVar = costs.Overlap(
        {"all_reduce": DDP_SHARE}, "backward",
        "gradient buckets are all-reduced while backward computes the next ones; the last bucket "
        "always waits, and on CPU gloo's threads share the cores with backward: half assumed hidden "
        "(on a GPU's collective stream: all but the last bucket)", gpu_stream=("all_reduce",))
    no_neutral_checkpoint: ClassVar = ""  # torch DCP maps its state (suite.strategies.neutral)
    cannot_fake: ClassVar = ""

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # One all-reduce per bucket of bucket_cap_mb over the data-parallel ranks.
        g, bucket = step.gradient_bytes, int(self.bucket_cap_mb * 2**20)
        return {"all_reduce": (g, max(1, -(-g // bucket)))} if step.layout.dp_size > 1 else {}

    def persistent_buffer_bytes(self, step: costs.StepSizes) -> int:
        # Its buckets: a copy of every gradient (gradient_as_bucket_view off), where there are peers.
        return step.gradient_bytes if step.layout.world_size > 1 else 0

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose


class DDPEngine(ModuleEngine):
    splits_step_time: ClassVar = True  # its backward returns once the buckets are all-reduced
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
