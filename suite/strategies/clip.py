"""Gradient clipping by global norm (recipe key ``training.grad_clip_norm``).

What ``torch.nn.utils.clip_grad_norm_`` does in one process: ``total`` is the L2 norm of all the
model's gradients taken as one vector, and every gradient is scaled by
``min(1, max_norm / (total + 1e-6))``. Under a strategy the model's gradients are spread over
ranks, so ``total`` must be the norm of the WHOLE model's gradients on every rank:
- replicas (single, ddp, allreduce, layer_split's MP-DDP, fairscale_pipe) hold equal full
  gradients after the reduction: a rank's own norm is the global one, computed exactly as torch
  computes it in one process;
- DTensor gradients (fsdp's shards, tensor's slices, a pipeline stage made data-parallel with
  ``fully_shard``/``replicate``): each mesh's norm is a DTensor whose ``full_tensor()`` combines
  the shards' partial norms and does not count a replicated dimension twice. Plain and DTensor
  gradients (tensor parallelism leaves unsplit layers plain) and DTensors on different meshes
  cannot be stacked together, so each kind is normed apart and the squares are added;
- a pipeline stage holds only its blocks: the squared stage norms are summed over the
  pipeline group (``stage_group``) only, so data-parallel replicas of a stage count once.
Strategies with a library's own global clip (fsdp1, fairscale OSS, DeepSpeed) use that instead
(``ModuleEngine.clip_grad_norm_`` and ``suite.strategies._deepspeed``).

Under fp16, ``ModuleEngine.clip_gradients`` unscales the gradients (``suite.strategies.scaling``)
before they are clipped here; DeepSpeed's fp16 loss scaler unscales before DeepSpeed clips.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _by_kind(params) -> dict:
    """Parameters whose gradients are plain tensors under None, DTensors under their device
    mesh: kinds that torch's norm and its ``_foreach`` scaling cannot mix."""
    from torch.distributed.tensor import DTensor

    kinds: dict = {}
    for p in params:
        kinds.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    return kinds


def total_norm(kinds: dict, stage_group=None) -> torch.Tensor:
    """L2 norm of the gradients of ``kinds`` (``_by_kind``) taken as one vector, over the whole
    model (see the module docstring)."""
    norms = []
    for mesh, params in kinds.items():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        norms.append(norm.full_tensor() if mesh is not None else norm)
    if len(norms) == 1 and stage_group is None:
        return norms[0]  # the one-process computation, bit for bit
    device = norms[0].device if norms else _device(stage_group)
    # float64: the squares of fp64 runs' norms keep their digits, fp32 ones lose none in the sum
    square = sum((n.to(device, torch.float64) ** 2 for n in norms), torch.zeros((), dtype=torch.float64, device=device))
    if stage_group is not None:
        dist.all_reduce(square, group=stage_group)
    return square.sqrt().to(norms[0].dtype if norms else torch.get_default_dtype())


def _device(group) -> torch.device:
    """A stage with no gradients still joins the all-reduce, on the group's device."""
    backend = dist.get_backend(group)
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def clip_grad_norm_(parameters, max_norm: float, stage_group=None) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so that the whole model's gradient norm is at most
    ``max_norm``; returns the norm before clipping (a 0-d tensor, equal on every rank)."""
    kinds = _by_kind(p for p in parameters if p.grad is not None)
    norm = total_norm(kinds, stage_group)
    for params in kinds.values():
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
