"""Batch norm whose statistics cover the global batch (``training.sync_batchnorm``).

Under data parallelism each rank sees only its share of the batch; a plain ``BatchNorm``
normalises by that share's mean and variance, so a data-parallel run computes a different
function than ``single`` does on the whole batch (and its losses differ from the first step).
Synced, every batch-norm layer all-reduces each channel's sum and count, then its sum of
squared deviations from the mean, over the data-parallel ranks, normalises by the statistics of the global batch and updates its
running statistics with them, exactly as one process would.

On CUDA that is ``torch.nn.SyncBatchNorm`` (``convert_sync_batchnorm``, fused kernels). On CPU
torch 2.14 has nothing that works: ``SyncBatchNorm.forward`` refuses CPU tensors ("SyncBatchNorm
expected input tensor to be on GPU") and ``DistributedDataParallel`` refuses any module holding
a ``SyncBatchNorm`` on CPU ("SyncBatchNorm layers only work with GPU modules"). So on CPU each
``BatchNorm1d/2d/3d`` keeps its class, parameters, buffers and ``state_dict`` keys and gets a
synced ``forward`` (set on the instance, as activation checkpointing does). It all-reduces with
``torch.distributed.nn.functional.all_reduce``, which is differentiable: its backward
all-reduces the gradients of the statistics, so backward runs through the other ranks' samples
as ``single``'s backward does. Sums are taken in float64. In eval the layer is unchanged (running
statistics, no communication).
"""
from __future__ import annotations

import types
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_reduce

# torch 2.14 deprecates this differentiable all_reduce for torch.distributed._functional_collectives,
# a private module; the public one works (tests/test_batchnorm.py) and warns once per process.
warnings.filterwarnings("ignore", message="torch.distributed.nn.functional.all_reduce is deprecated",
                        category=FutureWarning)

BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def sync(model: nn.Module, group, device: torch.device) -> nn.Module:
    """``model`` with every batch-norm layer computing its statistics over ``group`` (a process
    group, or ``dist.group.WORLD``) in training; the same module, or a new root where torch's
    ``convert_sync_batchnorm`` replaces it."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, group)
    for layer in model.modules():
        if isinstance(layer, BATCHNORMS):
            layer.synced_over = group
            layer.forward = types.MethodType(_synced_forward, layer)
    return model


def is_synced(layer: nn.Module) -> bool:
    return isinstance(layer, nn.SyncBatchNorm) or hasattr(layer, "synced_over")


def _synced_forward(self, x: torch.Tensor) -> torch.Tensor:
    if not self.training:
        return type(self).forward(self, x)  # the class's own: running statistics
    channels = x.shape[1]
    dims = [0, *range(2, x.dim())]
    shape = [1, channels] + [1] * (x.dim() - 2)
    group = self.synced_over
    # Two passes, two all-reduces: the mean, then the mean squared deviation from it. The one-pass
    # E[x^2] - E[x]^2 needs one all-reduce, but its backward subtracts two large float32 terms
    # where a channel's variance is small next to its mean (MobileNetV2 has such channels):
    # gradients then differ from single's by 1e-3 after one step.
    count = x.new_full((1,), x.numel() // channels, dtype=torch.float64)
    total = all_reduce(torch.cat([x.sum(dims, dtype=torch.float64), count]), group=group)
    n = total[-1]
    mean = total[:channels] / n
    centred = x - mean.to(x.dtype).view(shape)
    var = all_reduce((centred * centred).sum(dims, dtype=torch.float64), group=group) / n  # biased, as batch norm
    if self.track_running_stats:
        _update_running_stats(self, mean.detach(), var.detach(), n.detach())
    scale = torch.rsqrt(var + self.eps).to(x.dtype)
    if self.weight is not None:
        scale = scale * self.weight
    out = centred * scale.view(shape)
    return out + self.bias.view(shape) if self.bias is not None else out


@torch.no_grad()
def _update_running_stats(layer, mean, var, n) -> None:
    # As F.batch_norm: an exponential average (cumulative when momentum is None) of the mean
    # and of the unbiased variance.
    layer.num_batches_tracked.add_(1)
    factor = layer.momentum if layer.momentum is not None else 1.0 / layer.num_batches_tracked.item()
    unbiased = var * n / (n - 1).clamp(min=1)
    layer.running_mean.mul_(1 - factor).add_(mean.to(layer.running_mean.dtype), alpha=factor)
    layer.running_var.mul_(1 - factor).add_(unbiased.to(layer.running_var.dtype), alpha=factor)


def data_parallel_group(plan, rank: int):
    """The process group of this rank's data-parallel peers: the ranks that hold the same part
    of the model and read different samples (``plan.dp_groups()``). Every rank creates every
    group, in the same order (``new_group`` is collective); WORLD when all ranks are peers."""
    groups = plan.dp_groups()
    if len(groups) == 1:
        return dist.group.WORLD
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine
