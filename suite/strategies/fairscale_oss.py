"""fairscale's OSS optimizer: optimizer state sharded over the data-parallel ranks (ZeRO-1).
Each rank steps only the parameters it owns, then owners broadcast the new values.

``gradients`` chooses how gradients are combined:
- ``ddp`` (default): torch DDP all-reduces them; every rank holds every gradient.
- ``sharded_ddp``: fairscale ShardedDataParallel reduces each gradient to its owner only (ZeRO-2).
  On current torch it trains WRONG if gradients are cleared with ``set_to_none=True`` (torch's
  default): its grad buckets are not cleared and accumulate across steps (docs/strategies.md).
  This engine clears through ShardedDataParallel.zero_grad(set_to_none=False); a test proves
  both the fix and the failure.
"""
from __future__ import annotations

import inspect
from typing import ClassVar, Literal

import torch

from suite.compat import torch as torch_compat
from suite.record.metrics import optimizer_state_bytes
from suite.strategies import costs
from suite.strategies.base import ModuleEngine, StrategyOptions
from suite.strategies.keys import Refused
from torch.nn.parallel import DistributedDataParallel


class Options(StrategyOptions):
    name: Literal["oss"] = "oss"
    warm_imports: ClassVar = (torch_compat.DYNAMO, "fairscale.optim.oss")
    refuses: ClassVar = (Refused("training.precision", ("fp32", "bf16", "fp16"),
                                 "fairscale OSS's clip_grad_norm computes the norm in float32, refused for float64 gradients",
                                 when=lambda r: r.training.grad_clip_norm is not None),)
    gradients: Literal["ddp", "sharded_ddp"] = "ddp"
    overlap: ClassVar = costs.Overlap(why="gradients all-reduced, then each updated shard broadcast from its owner "
                                          "after the step: nothing assumed hidden")
    cannot_fake: ClassVar = ""

    def held_fraction(self, total: dict, layout) -> dict:
        out = dict(total)
        out["optimizer_state"] = total["optimizer_state"] // layout.dp_size
        if self.gradients == "sharded_ddp":
            out["gradients"] = total["gradients"] // layout.dp_size
        return out

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # Every gradient all-reduced (as DDP), then each updated shard broadcast by its owner.
        return {"all_reduce": (step.gradient_bytes, 1), "broadcast": (step.parameter_bytes, 1)}

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return [{"name": "oss", "gradients": g} for g in ("ddp", "sharded_ddp")]


class OSSEngine(ModuleEngine):
    def sync_context(self, last: bool):
        return super().sync_context(last) if last else self.module.no_sync()

    def zero_grad(self) -> None:
        if self.sharded_grads:
            # In place, through the wrapper: it also clears its reduce buckets.
            self.module.zero_grad(set_to_none=False)
        else:
            super().zero_grad()

    def clip_grad_norm_(self, max_norm: float):
        # OSS's own: each rank norms the parameters it owns, the squares summed over the ranks
        # (with sharded_ddp a rank holds reduced gradients of its own parameters only).
        return self.optimizer.clip_grad_norm(max_norm)

    def held_bytes(self) -> dict:
        held = super().held_bytes()
        held["optimizer_state"] = optimizer_state_bytes(self.optimizer.optim)  # this rank's shard
        return held

    def state_dict(self) -> dict:
        """This rank's own optimizer shard (checkpoints are per rank, at a fixed world size)."""
        return {"model": self.module.module.state_dict(), "optimizer_shard": self.optimizer.optim.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.module.load_state_dict(state["model"])
        self.optimizer.optim.load_state_dict(state["optimizer_shard"])


def sharded_optimizer(setup, params):
    """fairscale OSS around the recipe's optimizer: OSS wants the class and its settings, so
    read them from the optimizer the recipe would build."""
    from fairscale.optim import OSS

    probe = setup.make_optimizer([torch.nn.Parameter(torch.zeros(1))])
    # Only the settings the class takes: torch's AdamW records ``decoupled_weight_decay`` in its
    # defaults (it shares Adam's code) but its constructor refuses the keyword.
    accepted = inspect.signature(type(probe).__init__).parameters
    return OSS(params, optim=type(probe), **{k: v for k, v in probe.defaults.items() if k in accepted})


def build(opts: Options, setup) -> OSSEngine:

    ctx = setup.ctx
    model = setup.prepare(setup.build_model().to(ctx.device))
    if opts.gradients == "ddp":
        module = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        optimizer = sharded_optimizer(setup, module.parameters())
    else:
        from fairscale.nn.data_parallel import ShardedDataParallel
        optimizer = sharded_optimizer(setup, model.parameters())
        module = ShardedDataParallel(model, optimizer)
    engine = OSSEngine(setup, module)
    engine.optimizer = optimizer  # replaces the plain one ModuleEngine made (it holds no state yet)
    engine.sharded_grads = opts.gradients == "sharded_ddp"
    return engine
