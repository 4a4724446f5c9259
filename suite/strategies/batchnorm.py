"""Batch norm whose statistics cover the global batch (``training.sync_batchnorm``).

Under data parallelism each rank sees only its share of the batch; a plain ``BatchNorm``
normalises by that share's mean and variance, so a data-parallel run computes a different
function than ``single`` does on the whole batch (and its losses differ from the first step).
Synced, every batch-norm layer all-reduces each channel's sum and count, then its sum of
squared deviations from the mean, over the data-parallel ranks, normalises by the statistics
of the global batch and updates its running statistics with them, exactly as one process would.

On CUDA that is ``torch.nn.SyncBatchNorm`` (``convert_sync_batchnorm``, fused kernels). On CPU
torch 2.14 has nothing that works: ``SyncBatchNorm.forward`` refuses CPU tensors ("SyncBatchNorm
expected input tensor to be on GPU") and ``DistributedDataParallel`` refuses any module holding
a ``SyncBatchNorm`` on CPU ("SyncBatchNorm layers only work with GPU modules"). So on CPU each
``BatchNorm1d/2d/3d`` keeps its class, parameters, buffers and ``state_dict`` keys and gets a
synced ``forward`` (set on the instance, as activation checkpointing does): an autograd
function built from torch's own native CPU kernels, so it runs at about native speed
(benchmarks/sections/batchnorm.py):

- forward: each rank's per-channel mean and biased variance (two-pass, from native reductions:
  ``_local_statistics``; ``torch.batch_norm_update_stats`` takes 3x as long, ``torch.var_mean``
  over dims (0, 2, 3) 12x), one
  all-gather of (count, mean, variance) over the group, combined exactly (Chan's parallel
  formula: no E[x^2] - E[x]^2 cancellation), then the output through native batch norm in eval
  form with those global statistics;
- backward: each rank's per-channel sums of dy and of dy * x_hat in one native pass
  (``native_batch_norm_backward`` in eval form returns exactly these as its weight and bias
  gradients), one all-reduce of them, then grad_x = w * invstd * (dy - sum(dy) / N - x_hat *
  sum(dy * x_hat) / N), torch's SyncBatchNorm's math (torch/nn/modules/_functions.py), as one
  native per-channel multiply-add of x and one in-place multiply-add of dy.

It computes what one batch norm computes on the whole batch, up to rounding order: nothing here
copies a kernel's summation order, so in float32 the bits may differ from native batch norm's
(as they differ between CPUs with other vector widths). Parity with ``single`` is therefore
tested in float64 (``training.precision=fp64``), where rounding cannot decide it. In eval the
layer is unchanged (running statistics, no communication).
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch import nn

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
    x = x.contiguous()
    with torch.no_grad():
        mean, var, n = _global_statistics(x, self.synced_over)
        if self.track_running_stats:
            _update_running_stats(self, mean, var, n)
    return _SyncedBatchNorm.apply(x, self.weight, self.bias, mean, var, n, self.eps, self.synced_over)


def _global_statistics(x: torch.Tensor, group):
    """(mean, biased variance, count) per channel over the group's samples, in the statistics'
    dtype (float32 for float32 and lower, float64 for float64). One all-gather of each rank's
    (count, mean, variance), combined in float64: count-weighted mean, and the sum of squared
    deviations as each rank's own plus its count times its mean's squared distance from the
    global one."""
    mean, var = _local_statistics(x)
    count = x.numel() // x.shape[1]
    mine = torch.cat([mean.new_full((1,), count), mean, var]).double()
    parts = mine.new_empty(dist.get_world_size(group) * mine.numel())
    dist.all_gather_single(parts, mine, group=group)
    parts = parts.view(-1, mine.numel())
    counts, means, variances = parts[:, :1], parts[:, 1:1 + x.shape[1]], parts[:, 1 + x.shape[1]:]
    n = counts.sum()
    global_mean = (counts * means).sum(0) / n
    squares = (counts * (variances + (means - global_mean) ** 2)).sum(0)
    dtype = _stat_dtype(x)
    return global_mean.to(dtype), (squares / n).to(dtype), int(n.item())


def _local_statistics(x: torch.Tensor):
    """This rank's per-channel mean and biased variance, two-pass as native batch norm computes
    them (the squared deviations from the rounded mean: no E[x^2] - E[x]^2 cancellation), from
    torch's fast native reductions: the channel sums, then the sum of (x - mean)^2 through the
    eval-form batch-norm backward kernel (its weight gradient is sum(dy * (x - mean) * invstd);
    dy = input = x - mean, mean 0 and invstd 1 make it the sum of squares), in 0.3 of the time of
    ``torch.batch_norm_update_stats`` over the same values."""
    dims = [0, *range(2, x.dim())]
    n = x.numel() // x.shape[1]
    mean = x.sum(dims, dtype=_stat_dtype(x)) / n  # float32 statistics for bf16 inputs too (autocast)
    shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
    centred = x - mean.view(shape)  # in the statistics' dtype (bf16 inputs: float32)
    _, squares, _ = torch.ops.aten.native_batch_norm_backward(
        centred, centred, None, torch.zeros_like(mean), torch.ones_like(mean), None, None, False, 0.0,
        [False, True, False])
    return mean, squares / n


class _SyncedBatchNorm(torch.autograd.Function):
    """Batch norm with given global statistics; backward all-reduces the two per-channel sums
    the input gradient needs (as torch's SyncBatchNorm does on CUDA). Weight and bias gradients
    stay this rank's own: the data-parallel wrapper averages them like any other gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, var, n, eps, group):
        ctx.save_for_backward(x, weight, mean, var)
        ctx.n, ctx.eps, ctx.group = n, eps, group
        return torch.batch_norm(x, weight, bias, mean, var, False, 0.0, eps, False)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, var = ctx.saved_tensors
        dy = dy.contiguous()
        # Eval-form backward: its "weight gradient" is sum(dy * x_hat) and its "bias gradient"
        # sum(dy), per channel over this rank's samples, in one native pass.
        _, dotp, sum_dy = torch.ops.aten.native_batch_norm_backward(
            dy, x, None, mean, var, None, None, False, ctx.eps, [False, True, True])
        sums = torch.cat([sum_dy, dotp]).double()
        dist.all_reduce(sums, group=ctx.group)
        channels, n = x.shape[1], ctx.n
        total_dy, total_dotp = sums[:channels], sums[channels:]
        invstd = torch.rsqrt(var.double() + ctx.eps)
        a = invstd * weight.double() if weight is not None else invstd  # grad_x = a*dy + b*x + c
        b = -a * invstd * total_dotp / n
        c = -a * total_dy / n - b * mean.double()
        # b*x + c through the native eval-form kernel (mean 0, variance 1, eps 0: x_hat is x
        # exactly), a fused per-channel multiply-add; then + a*dy in place.
        zeros, ones = torch.zeros_like(var), torch.ones_like(var)
        grad_x = torch.batch_norm(x, b.to(var.dtype), c.to(var.dtype), zeros, ones, False, 0.0, 0.0, False)
        grad_x.addcmul_(dy, a.to(x.dtype).view([1, channels] + [1] * (x.dim() - 2)))
        grad_w = dotp if ctx.needs_input_grad[1] else None  # this rank's own sums: see the class docstring
        grad_b = sum_dy if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None, None, None, None, None


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    # float32 statistics for float32 and lower (autocast's bf16: batch norm runs in float32 there too)
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.no_grad()
def _update_running_stats(layer, mean, var, n) -> None:
    # As F.batch_norm: an exponential average (cumulative when momentum is None) of the mean
    # and of the unbiased variance.
    layer.num_batches_tracked.add_(1)
    factor = layer.momentum if layer.momentum is not None else 1.0 / layer.num_batches_tracked.item()
    unbiased = var * (n / max(n - 1, 1))
    layer.running_mean.copy_(factor * mean + (1 - factor) * layer.running_mean)
    layer.running_var.copy_(factor * unbiased + (1 - factor) * layer.running_var)


def data_parallel_group(layout, rank: int):
    """The process group of this rank's data-parallel peers: the ranks that hold the same part
    of the model and read different samples (``layout.dp_groups()``). Every rank creates every
    group, in the same order (``new_group`` is collective); WORLD when all ranks are peers."""
    groups = layout.dp_groups()
    if len(groups) == 1:
        return dist.group.WORLD
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine
