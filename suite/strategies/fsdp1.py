"""Fully sharded data parallel with torch's FSDP1 (``FullyShardedDataParallel``), still the most
deployed FSDP: each top-level block is wrapped in its own FSDP unit (one flat parameter per
block, all-gathered just before the block runs), the root wraps what is left.

- ``sharding: full`` (FULL_SHARD, ZeRO-3-like): parameters are freed after each block's forward
  and gathered again for its backward; gradients are reduce-scattered.
- ``sharding: grad_op`` (SHARD_GRAD_OP, ZeRO-2-like): the gathered parameters stay from forward
  to backward, saving an all-gather per block at the cost of memory.
(NO_SHARD, plain data parallelism, is deprecated in torch: use ddp.)

On CPU FSDP1 must be told ``device_id=cpu``, else it refuses ("FSDP needs a non-CPU accelerator
device"). ``use_orig_params``: the optimizer and ``held_bytes`` see the model's own parameters
(views of this rank's shard), which torch.compile also needs.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import ClassVar, Literal


from suite.compat import torch as torch_compat
from suite.models import units
from suite.strategies import costs, splitting
from suite.strategies.base import ModuleEngine, StrategyOptions
from suite.strategies.keys import Refused


class Options(costs.ShardedUnits, StrategyOptions):
    name: Literal["fsdp1"] = "fsdp1"
    warm_imports: ClassVar = (torch_compat.DYNAMO, "torch.distributed.fsdp")
    refuses: ClassVar = (Refused("training.precision", ("fp32", "bf16", "fp16"),
                                 "torch FSDP1's clip_grad_norm_ computes the norm in float32, refused for float64 gradients",
                                 when=lambda r: r.training.grad_clip_norm is not None),)
    reusable_process: ClassVar = True
    sharding: Literal["full", "grad_op"] = "full"
    overlap: ClassVar = costs.PREFETCHED_UNITS
    cannot_fake: ClassVar = ""

    def held_fraction(self, total: dict, layout) -> dict:
        held = {key: value // layout.dp_size for key, value in total.items()}
        if self.sharding == "grad_op":
            # Full parameters stay gathered from each block's forward to its backward.
            held["parameters"] = total["parameters"]
        return held

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # Gathered before each unit's forward, and again before its backward where full sharding
        # freed them after forward (grad_op keeps them: one gather); flat parameters: no copies counted.
        return costs.sharded_units(step, gathers=2 if self.sharding == "full" else 1)

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return [{"name": "fsdp1", "sharding": s} for s in ("full", "grad_op")]


class FSDP1Engine(ModuleEngine):
    sharded_scaler: ClassVar = True  # fp16: flat shards are plain tensors, the scaler reduces found-inf
    def sync_context(self, last: bool):
        # Accumulated micro-batches keep unsharded gradients; reduce-scatter on the last one.
        return nullcontext() if last else self.module.no_sync()

    def clip_grad_norm_(self, max_norm: float):
        # FSDP1's own: the norm of the flat-parameter shards, summed over the ranks.
        return self.module.clip_grad_norm_(max_norm)


def build(opts: Options, setup) -> FSDP1Engine:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

    device = setup.ctx.device
    model = setup.prepare(setup.build_model().to(device))
    sharding = {"full": ShardingStrategy.FULL_SHARD, "grad_op": ShardingStrategy.SHARD_GRAD_OP}[opts.sharding]
    kwargs = dict(sharding_strategy=sharding, device_id=device, use_orig_params=True)
    names = {id(m): name for name, m in model.named_modules()}
    shared = {id(model.get_submodule(name)) for name in splitting.shared_blocks(model)}  # a tied embedding and head: left to the root's unit
    for block in units(model):  # the top-level blocks, or an HF model's own (its _no_split_modules)
        if id(block) not in shared and any(p.requires_grad for p in block.parameters()):
            parent, _, name = names[id(block)].rpartition(".")
            model.get_submodule(parent).register_module(name, FSDP(block, **kwargs))
    # The root's full state_dict (FSDP1's default) has the model's own keys, gathered on every rank.
    return FSDP1Engine(setup, FSDP(model, **kwargs))
