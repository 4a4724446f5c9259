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
function whose forward all-reduces the statistics and whose backward all-reduces each channel's
sum of output gradients and their dot product with the centred input, the two sums the input
gradient needs over the global batch (torch's SyncBatchNorm's reference math,
torch/nn/modules/_functions.py). Its float32 arithmetic copies torch's CPU kernel's rounding
(see below why that is needed). In eval the layer is unchanged (running statistics, no
communication).
"""
from __future__ import annotations

import math
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
        mean, invstd, var_sum, n = _global_statistics(x, self.synced_over, self.eps)
        if self.track_running_stats:
            _update_running_stats(self, mean, var_sum, n)
    return _SyncedBatchNorm.apply(x, self.weight, self.bias, mean, invstd, n, self.synced_over)


# Why the arithmetic below copies torch's CPU batch-norm kernels (aten/src/ATen/native/cpu/
# batch_norm_kernel.cpp) operation for operation: MobileNetV2 (ReLU6) and ResNet-18 with 8-sample
# accumulation passes are so sensitive that ANY float32 rounding difference grows, within 3-6 SGD
# steps, to loss differences of 1e-4..3e-2 (measured: native batch norm against the same math in
# another rounding order, both in ONE process on the same samples; in float64 the synced runs
# equal single within 1e-11). A value that lands on the other side of a ReLU6 edge moves a whole
# gradient element. So the synced layer computes the bits native batch norm computes (checked on
# one rank for feature planes of 2x2 and more, tests/test_batchnorm.py; planes of one element,
# BatchNorm1d on (N, C), go another kernel path and agree to rounding only):
# - forward statistics: float64 sums of the float32 inputs and of the float32 squared deviations,
#   each rounded to float32 once (the all-reduce adds float64 partial sums: the float32 result is
#   the same whatever the split over ranks, but for a 1-in-10^8 rounding tie);
# - output x * alpha + beta with alpha = invstd * weight, beta = bias - mean * alpha, both fused
#   multiply-adds, as the compiled kernel does (float64 here: the float32 product is exact in it);
# - backward: per sample and channel, a float32 sum over the feature plane in the order of the
#   kernel's 8-lane AVX2 reduction (``_plane_sums``), those summed in float64 over samples and
#   then over ranks; grad_input = ((dy - sum_dy / N) - (x - mean) * k) * invstd * weight with the
#   inner multiply-add fused, k = dotp * invstd^2 / N in float32.
# On other CPUs (AVX-512, ARM) the lane order differs: the math stays exact, only the bits may not.
# This removes batch norm's share of the float32 differences, not the convolutions' (oneDNN rounds
# some per-sample outputs by batch size): tests/test_vision.py says where those still show.
LANES = 8


def _global_statistics(x: torch.Tensor, group, eps: float):
    """(mean, invstd, sum of squared deviations, count) per channel over the group, as float32
    values rounded as torch's kernel rounds them."""
    channels = x.shape[1]
    dims = [0, *range(2, x.dim())]
    count = x.new_full((1,), x.numel() // channels, dtype=torch.float64)
    total = torch.cat([x.sum(dims, dtype=torch.float64), count])
    dist.all_reduce(total, group=group)
    n = int(total[-1].item())
    dtype = _stat_dtype(x)
    mean = (total[:channels] / n).to(dtype)
    centred = x - mean.view(_shape(x))
    var_sum = (centred * centred).sum(dims, dtype=torch.float64)
    dist.all_reduce(var_sum, group=group)
    var_sum = var_sum.to(dtype)
    invstd = torch.rsqrt((var_sum / n).double() + eps).to(dtype)  # biased variance, as batch norm
    return mean, invstd, var_sum, n


class _SyncedBatchNorm(torch.autograd.Function):
    """Batch norm with given global statistics; backward all-reduces the two per-channel sums
    the input gradient needs (as torch's SyncBatchNorm does on CUDA). Weight and bias gradients
    stay this rank's own: the data-parallel wrapper averages them like any other gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, invstd, n, group):
        shape = _shape(x)
        alpha = invstd * weight if weight is not None else invstd
        b = bias.double() if bias is not None else 0.0
        beta = (b - mean.double() * alpha.double()).to(mean.dtype)
        out = (x.double() * alpha.double().view(shape) + beta.double().view(shape)).to(x.dtype)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.n, ctx.group = n, group
        return out

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd = ctx.saved_tensors
        n, shape, channels = ctx.n, _shape(x), x.shape[1]
        dy = dy.contiguous()
        centred = x - mean.view(shape)
        sums = _plane_sums(dy, centred).double().sum(0)
        local = sums.clone()
        dist.all_reduce(sums, group=ctx.group)
        sum_dy, dotp = sums[:channels], sums[channels:]
        dtype = invstd.dtype
        k = dotp.to(dtype) * invstd * invstd / n
        grad_mean = (sum_dy / n).to(dtype)
        w = weight if weight is not None else torch.ones_like(invstd)
        inner = (dy - grad_mean.view(shape)).double() - centred.double() * k.double().view(shape)
        grad_x = (inner.to(dtype) * invstd.view(shape) * w.view(shape)).to(x.dtype)
        grad_w = (local[channels:] * invstd.double()).to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        grad_b = local[:channels].to(dtype) if ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None, None, None, None


def _plane_sums(dy: torch.Tensor, centred: torch.Tensor) -> torch.Tensor:
    """Per sample, the float32 sums over each channel's feature plane of ``dy`` (channels 0..C-1
    of the result) and of ``centred * dy`` (C..2C-1), in the order of torch's vectorised CPU
    reduction: 8 lane-wise running sums (the last, partial block into the first lanes, its
    products fused into the sums), then halves added pairwise. Both in one loop over the blocks."""
    samples, channels, size = dy.shape[0], dy.shape[1], math.prod(dy.shape[2:])
    dy, centred = dy.reshape(samples, channels, size), centred.reshape(samples, channels, size)
    terms = torch.cat([dy, centred * dy], dim=1)
    if size < LANES:  # the kernel adds these few one by one (products unfused)
        acc = terms[..., 0]
        for i in range(1, size):
            acc = acc + terms[..., i]
        return acc
    full = size - size % LANES
    blocks = terms[..., :full].reshape(samples, 2 * channels, full // LANES, LANES).unbind(2)
    acc = blocks[0]
    for block in blocks[1:]:
        acc = acc + block
    rest = size - full
    if rest:
        acc = acc.clone()
        tail = slice(full, size)
        acc[:, :channels, :rest] += dy[..., tail]
        acc[:, channels:, :rest] = (acc[:, channels:, :rest].double()
                                    + centred[..., tail].double() * dy[..., tail].double()).to(acc.dtype)
    while acc.shape[-1] > 1:
        half = acc.shape[-1] // 2
        acc = acc[..., :half] + acc[..., half:]
    return acc[..., 0]


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    # float32 statistics for float32 and lower (autocast's bf16: batch norm runs in float32 there too)
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _shape(x: torch.Tensor) -> list[int]:
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


@torch.no_grad()
def _update_running_stats(layer, mean, var_sum, n) -> None:
    # As F.batch_norm: an exponential average (cumulative when momentum is None) of the mean
    # and of the unbiased variance, in float32 as its kernel computes the mean's.
    layer.num_batches_tracked.add_(1)
    factor = layer.momentum if layer.momentum is not None else 1.0 / layer.num_batches_tracked.item()
    unbiased = var_sum / max(n - 1, 1)
    layer.running_mean.copy_(factor * mean + (1 - factor) * layer.running_mean)
    layer.running_var.copy_(factor * unbiased + (1 - factor) * layer.running_var)


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
