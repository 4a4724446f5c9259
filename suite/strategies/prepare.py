"""The one place a model is prepared for training, whatever the strategy: activation
checkpointing (``training.activation_checkpointing``), ``torch.compile`` (``training.compile``)
and the precision the forward pass computes in (``training.precision``, as autocast).

Every strategy calls ``setup.prepare(module)`` on the module it is about to wrap, in torchtitan's
order: tensor parallel -> activation checkpointing -> compile -> data parallel / FSDP. So:
- single, ddp, allreduce, oss, zero, fsdp, fsdp1, layer_split, fairscale_pipe: on the whole
  model, right before it is wrapped (DDP, FSDP, DeepSpeed, fairscale) or split over devices;
- tensor: after ``parallelize_module``, before FSDP over the data dimension;
- pipeline: on this rank's stage, before its data-parallel wrapper;
- ds_pipeline: on the blocks before they become the ``PipelineModule``'s layers.
Because it acts on the blocks themselves, before any wrapper, every strategy takes both options
(each was run against the baseline); fairscale_pipe's own ``strategy.checkpoint`` recomputes
its partitions on top.

Both act per block (``suite.models.units``: a top-level block with parameters, such as a
transformer block or an MLP layer, or a Hugging Face model's own decoder blocks), like torchtitan;
a Hugging Face model is checkpointed by its own switch (``gradient_checkpointing_enable``).
Both leave parameter names and ``state_dict`` keys unchanged, so checkpoints load either way:
checkpointing replaces the block's ``forward`` on the instance, compiling uses ``nn.Module.compile``
(in place; ``torch.compile(module)`` would prefix every key with ``_orig_mod.``).

``training.activation_checkpointing: selective`` is torchtitan's selective *op* checkpointing
(its default for the published Llama 3 runs): each block is still recomputed in backward, but the
outputs of the expensive operators are kept rather than recomputed: attention (every SDPA
kernel), every other matrix multiply, and reduce-scatters; the elementwise operators (norms,
activations, rotary positions) and the other half of the matmuls run again. It trades some of
full checkpointing's memory saving for about half its recomputation.

``training.sync_batchnorm`` (default true) comes first: with more than one data-parallel rank,
every batch-norm layer computes its statistics over the global batch
(``suite.strategies.batchnorm``; same parameters, buffers and keys), so that data-parallel runs
of models with batch norm match ``single``; the group is the rank's data-parallel peers
(``Setup.batchnorm_group``). With one data-parallel rank nothing changes.
"""
from __future__ import annotations

import os
import shutil
import types
from contextlib import contextmanager, nullcontext

from collections import defaultdict

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from suite.common.errors import SuiteError
from suite.compat import torch as torch_compat
from suite.models import hf, units


def prepare(model: nn.Module, *, activation_checkpointing: bool | str, compile: bool, device: torch.device,
            batchnorm_group=None) -> nn.Module:
    """``model`` with the cross-cutting options applied to each top-level block, in place;
    with a ``batchnorm_group``, its batch-norm layers first compute their statistics over that
    group (``suite.strategies.batchnorm``), before checkpointing and compile wrap the blocks."""
    if batchnorm_group is not None:
        from suite.strategies import batchnorm

        model = batchnorm.sync(model, batchnorm_group, device)
    blocks = units(model)
    if activation_checkpointing and not hf.gradient_checkpointing(model):  # HF's own switch where it has one
        for block in blocks:
            checkpoint_block(block, selective=activation_checkpointing == "selective")
    if compile:
        require_compiler(device.type)
        for block in blocks:
            block.compile()
    return model


def checkpoint_block(block: nn.Module, selective: bool = False) -> None:
    """Recompute the block's activations in backward instead of keeping them (``selective``: all
    but the operators ``SAVED`` keeps, see the module doc). Non-reentrant: the reentrant variant
    runs backward outside autograd's graph, which DDP's hooks miss (it fails, or with static
    graphs trains wrong) and which drops gradients of inputs without ``requires_grad``, and
    selective checkpointing needs it. A bound method, so ``copy.deepcopy`` of the model binds the copy."""
    block.forward = types.MethodType(_selective_forward if selective else _checkpointed_forward, block)


def _checkpointed_forward(self, *args, **kwargs):
    # type(self).forward: the class's own forward (FSDP2 swaps the class for a subclass of it).
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, **kwargs)


def _selective_forward(self, *args, **kwargs):
    return checkpoint(type(self).forward, self, *args, use_reentrant=False, context_fn=_selective_contexts, **kwargs)


def _saved_ops() -> set:
    """torchtitan's ``_save_list``: the operators whose outputs selective checkpointing keeps
    (those this torch has), the matmuls then every other one."""
    aten, c10d = torch.ops.aten, torch_compat.functional_collectives()
    names = [(aten, "mm"), (aten, "_scaled_dot_product_efficient_attention"),
             (aten, "_scaled_dot_product_flash_attention"), (aten, "_scaled_dot_product_cudnn_attention"),
             (aten, "_scaled_dot_product_flash_attention_for_cpu"), (c10d, "reduce_scatter_tensor"), (aten, "max")]
    return {getattr(ns, name).default for ns, name in names if hasattr(ns, name)}


SAVED = _saved_ops()


def _selective_contexts():
    """A fresh count of matmuls per checkpointed call (forward and recomputation counted apart,
    so both agree on which matmuls were kept): odd ones kept, even ones recomputed."""
    matmuls = defaultdict(int)

    def policy(ctx, op, *args, **kwargs):
        is_mm = op == torch.ops.aten.mm.default
        if is_mm:
            matmuls[ctx.is_recompute] += 1
        keep = op in SAVED and not (is_mm and matmuls[ctx.is_recompute] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def require_compiler(device_type: str) -> None:
    """torch.compile's code generator needs a C++ compiler for CPU code (inductor) and a C
    compiler for the GPU kernels' launchers (Triton); refuse in one line where there is none."""
    if device_type == "cpu":
        name, var = os.environ.get("CXX", "g++"), "CXX"
    else:
        name, var = os.environ.get("CC", "gcc"), "CC"
    if not shutil.which(name):
        raise SuiteError(f"training.compile=true needs the compiler {name} (${var}) for torch.compile's "
                         f"{device_type} code, and this machine has none; install it, or set training.compile=false")


def autocast(precision: str, device: torch.device):
    """The context a forward pass runs in: plain fp32 (or fp64), or autocast to bf16/fp16
    (parameters stay fp32). DeepSpeed's engines and FSDP's ``mixed_precision`` cast by themselves instead."""
    if precision in ("fp32", "fp64"):
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def input_dtype(precision: str):
    """The dtype floating-point inputs are cast to before a step: float64 under ``fp64``, else
    None (inputs keep the data set's dtype; autocast casts inside the forward pass)."""
    return torch.float64 if precision == "fp64" else None


@contextmanager
def default_dtype(precision: str):
    """``training.precision: fp64``: parameters, buffers and every tensor the model or the data
    creates without naming a dtype are float64 while the rank builds and trains, as if the model
    had been written in float64. Restored afterwards: a warm rank's next sweep point starts from
    float32 (the default dtype is one per process). Why float64 at all: rounding differences are
    then ~1e-16 relative, so a strategy that computes the same function as ``single`` matches it
    to ~1e-10 over tens of steps whatever the CPU's vector kernels or thread count, while a bug
    (a missing average, a skipped shard) shows at 1e-3 or more (``suite.verify``)."""
    if precision != "fp64":
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)
