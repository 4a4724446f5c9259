"""Fully sharded data parallel with FSDP2 (``fully_shard`` on a device mesh).

Each rank keeps 1/N of every parameter, gradient and optimizer state; a block's full
parameters are all-gathered just before its forward (and again before its backward) and
gradients are reduce-scattered after it.
- ``reshard_after_forward: true``: full sharding (ZeRO-3-like): parameters are freed after
  each block's forward and gathered again for backward.
- ``reshard_after_forward: false``: "grad-op" sharding (ZeRO-2-like): the gathered parameters
  stay from forward to backward, saving one all-gather per block at the cost of memory.
- ``replicate: R`` (> 1): hybrid sharding (HSDP) on a 2-D mesh: R replicas, each sharded over
  world/R ranks; gradients are reduce-scattered within a replica then all-reduced across.
- ``mixed_precision: bf16``: parameters gathered and computed in bf16, gradients reduced in
  fp32, fp32 master shards updated by the optimizer.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import ClassVar, Literal

import torch
from pydantic import PositiveInt

from suite.compat import torch as torch_compat
from suite.models import units
from suite.strategies.layout import Axis
from suite.strategies import costs, splitting
from suite.strategies.base import ModuleEngine, StrategyOptions


class Options(costs.ShardedUnits, StrategyOptions):
    name: Literal["fsdp"] = "fsdp"
    warm_imports: ClassVar = (torch_compat.DYNAMO, "torch.distributed.fsdp")
    reusable_process: ClassVar = True
    reshard_after_forward: bool = True  # false: ZeRO-2-like grad-op sharding
    replicate: PositiveInt = 1  # hybrid sharding: replicas; each is sharded over world / replicate
    mixed_precision: Literal["fp32", "bf16"] = "fp32"
    overlap: ClassVar = costs.PREFETCHED_UNITS
    no_neutral_checkpoint: ClassVar = ""  # torch DCP maps its state (suite.strategies.neutral)
    cannot_fake: ClassVar = ""

    def mesh_axes(self) -> list[Axis]:
        # Replicas and shards alike read their own samples.
        return [Axis("replicate", self.replicate, "strategy.replicate", data=True),
                Axis("shard", None, "strategy.shard", data=True)]

    def held_fraction(self, total: dict, layout) -> dict:
        shard = layout.degree("shard")
        held = {key: value // shard for key, value in total.items()}
        if not self.reshard_after_forward:
            # Grad-op: full parameters stay gathered from each block's forward to its backward.
            held["parameters"] = total["parameters"]
        return held

    # Units gathered and reduce-scattered within a shard group; with replicas (HSDP) each shard's
    # gradients are then all-reduced across the replicas.
    comm_axes: ClassVar = {"all_gather": ("shard",), "reduce_scatter": ("shard",), "all_reduce": ("replicate",)}

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # Gathered before each unit's forward, and again before its backward where forward freed them.
        comm = costs.sharded_units(step, gathers=2 if self.reshard_after_forward else 1)
        if self.mixed_precision == "bf16":  # MixedPrecisionPolicy: gathers bf16 parameters, reduces in fp32
            gathered, calls = comm["all_gather"]
            comm["all_gather"] = (gathered // 2, calls)
        if self.replicate > 1:
            shard = step.layout.degree("shard")
            comm["all_reduce"] = (step.gradient_bytes // shard, len(step.units) or 1)
        return comm

    def copy_bytes(self, comm_bytes: dict[str, int], layout) -> int:
        """FSDP2 keeps each parameter's shard apart, so each gather of a unit copies the rank's
        shards into the gather's buffer (1/N of what it gathers) and the gathered result out into
        the parameters (all of it), and each reduce-scatter packs the unit's gradients into its
        input (all of it): profiled on a CPU at world 2, these copies took 8 % of the step."""
        gathered = comm_bytes.get("all_gather", 0)
        return gathered // layout.degree("shard") + gathered + comm_bytes.get("reduce_scatter", 0)

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        # Resharding after forward or not, and HSDP: replicas of shard groups of every size.
        return [{"name": "fsdp", "reshard_after_forward": r} for r in (True, False)] + [
            {"name": "fsdp", "replicate": world_size // shard} for shard in costs.divisors(world_size)[:-1]]


class FSDPEngine(ModuleEngine):
    _syncing = True  # FSDP2's default

    @contextmanager
    def sync_context(self, last: bool):
        # Accumulated micro-batches keep unsharded gradients; reduce-scatter on the last one.
        # Set only on a change: it walks every FSDP module, and most runs never accumulate.
        if last != self._syncing:
            self.module.set_requires_gradient_sync(last)
            self._syncing = last
        yield


def without_inplace(model: torch.nn.Module) -> None:
    """Every module's ``inplace`` flag off (ReLU, Dropout, Hardswish, ...): same values, one more
    buffer. FSDP2 hands a sharded block its input through an autograd Function, and an in-place op
    on it fails in backward ("Output 0 of RegisterPostBackwardFunction is a view and is being
    modified inplace": torchvision's MNASNet, whose classifier starts with Dropout(inplace=True));
    one on a block's output that is a view silently drops FSDP2's pre-backward hook, and with it
    the gather of the next block's parameters (torch's own warning says so)."""
    for module in model.modules():
        if getattr(module, "inplace", None) is True:
            module.inplace = False


def shard(model: torch.nn.Module, mesh, reshard_after_forward: bool, mp_policy) -> torch.nn.Module:
    """Shard each block (``suite.models.units``), then the root (which takes whatever is left: also
    blocks that share a parameter with another, such as a tied embedding and head, which no unit may
    own alone)."""
    from torch.distributed.fsdp import fully_shard

    without_inplace(model)
    shared = {id(model.get_submodule(name)) for name in splitting.shared_blocks(model)}
    for block in units(model):  # the top-level blocks, or an HF model's own (its _no_split_modules)
        if id(block) not in shared and any(p.requires_grad for p in block.parameters()):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp_policy)
    # A Linear on [B, T, D] returns a view, which FSDP2 warns about in case the caller edits it
    # in place; the next block no longer does (without_inplace) and the loss (suite.models.task)
    # only reads the output, so the warning is noise here.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    # The root keeps FSDP's default: its parameters are needed again at once for backward.
    return fully_shard(model, mesh=mesh, mp_policy=mp_policy)


def mixed_precision_policy(name: str):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if name == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def build(opts: Options, setup) -> FSDPEngine:
    ctx, layout = setup.ctx, setup.layout
    # Plain FSDP (replicate 1): a 1-D mesh over every rank.
    mesh = layout.device_mesh(ctx, *(("shard",) if opts.replicate == 1 else ()))
    model = setup.prepare(setup.build_model().to(ctx.device))
    model = shard(model, mesh, opts.reshard_after_forward, mixed_precision_policy(opts.mixed_precision))
    return FSDPEngine(setup, model)
