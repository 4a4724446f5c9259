"""torch internals the pipeline strategy, the planner, the CPU memory peak and a local pool's warm
start rely on. Every access was checked on torch 2.14.1 (constraints.txt, the tested set;
``suite.compat.CHECKED``) and only that version; docs/compat.md says what each is for.
"""
from __future__ import annotations

import functools
import time
from contextlib import contextmanager

from suite.compat import import_internal, incompatible, require_attr

LIB = "torch"

# PipelineStage methods every schedule (GPipe, 1F1B, interleaved, zero-bubble) calls once per
# micro-batch to compute: timing them gives a stage's busy time. Checked on 2.14.1.
STAGE_COMPUTE_METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


def replicate(module, mesh) -> None:
    """FSDP2-based ``replicate`` (data parallel with DTensor parameters, composable with
    pipelining, unlike DDP): torch 2.14 has it only under ``torch.distributed._composable``.
    Checked on 2.14.1."""
    fn = import_internal("torch.distributed._composable.replicate_with_fsdp", "replicate", lib=LIB,
                         what="FSDP2-based replicate")
    fn(module, mesh=mesh)


def timed_stage_class(synchronize):
    """``PipelineStage`` that adds up in ``busy_s`` the time spent computing (not waiting for
    neighbours), by overriding the per-micro-batch compute methods the schedules call;
    ``synchronize`` waits for the device (GPU work is asynchronous). Checked on 2.14.1."""
    from torch.distributed.pipelining import PipelineStage

    for name in STAGE_COMPUTE_METHODS:
        require_attr(PipelineStage, name, lib=LIB, what="called by the pipeline schedules per micro-batch")

    class TimedStage(PipelineStage):
        """A PipelineStage that adds up the time spent computing."""
        busy_s = 0.0

        def _timed(self, method, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                synchronize()
                self.busy_s += time.perf_counter() - t0

        def forward_one_chunk(self, *args, **kwargs):
            return self._timed(super().forward_one_chunk, *args, **kwargs)

        def backward_one_chunk(self, *args, **kwargs):
            return self._timed(super().backward_one_chunk, *args, **kwargs)

        def backward_weight_one_chunk(self, *args, **kwargs):
            return self._timed(super().backward_weight_one_chunk, *args, **kwargs)

    return TimedStage


def busy_s(stage) -> float:
    """A timed stage's busy time in the last schedule step; a step always computes, so 0 means the
    schedule no longer calls the timed methods (the bubble fraction would silently read 1)."""
    if stage.busy_s <= 0.0:
        raise incompatible(LIB, f"the pipeline schedule to call PipelineStage.{'/'.join(STAGE_COMPUTE_METHODS)} "
                                f"(a whole step ran without them)")
    return stage.busy_s


# ---- dispatch modes and fake tensors (the planner, the CPU memory peak) ---------------------------

# The module a local pool's ranks import early for the strategies whose first step imports it
# (their ``warm_imports``, suite/tasks/pool.py): torch._dynamo, seconds of CPU. Checked on 2.14.1.
DYNAMO = "torch._dynamo"


def dispatch_mode_class():
    """``TorchDispatchMode``, the base class of a Python dispatch mode (its ``__torch_dispatch__``
    sees every operator called under it): the planner's counters (suite/planner/counting.py) and
    the CPU allocation peak (suite/record/allocated.py). Described in torch's extending guide but
    kept in the private module ``torch.utils._python_dispatch``. Checked on 2.14.1."""
    return import_internal("torch.utils._python_dispatch", "TorchDispatchMode", lib=LIB,
                           what="the base class of Python dispatch modes")


def fake_tensor_mode(**kwargs):
    """A ``FakeTensorMode`` (``torch._subclasses.fake_tensor``: tensors with shapes and dtypes, no
    memory or values), built with ``kwargs``: the mode the planner's fake run builds and steps a
    strategy under. Checked on 2.14.1."""
    mode = import_internal("torch._subclasses.fake_tensor", "FakeTensorMode", lib=LIB,
                           what="the mode of fake tensors")
    return mode(**kwargs)


def unset_fake_temporarily():
    """A context in which no fake tensor mode is active (``torch._subclasses.fake_tensor``'s
    ``unset_fake_temporarily``): the planner's fake run builds there a model whose constructor
    computes with real values (``suite.models.empty.as_fake``). Checked on 2.14.1."""
    fn = import_internal("torch._subclasses.fake_tensor", "unset_fake_temporarily", lib=LIB,
                         what="suspending the fake tensor mode")
    return fn()


def storage_key(tensor):
    """What tells a tensor's storage apart from every other one alive (views share it): the
    address of its C++ StorageImpl, ``untyped_storage()._cdata``; None for a tensor without a
    storage of its own (``untyped_storage()`` raises: a subclass, whose parts have theirs).
    Checked on 2.14.1."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return require_attr(storage, "_cdata", lib=LIB, what="the address of a storage's StorageImpl")


def is_wrapper_subclass(tensor) -> bool:
    """Whether ``tensor`` is a wrapper subclass (DTensor and the like: ``torch.utils.
    _python_dispatch.is_traceable_wrapper_subclass``), whose memory is its parts', named by
    ``__tensor_flatten__``. Checked on 2.14.1. Found once: the planner asks it of every tensor of
    every operator."""
    return _wrapper_check()(tensor)


@functools.cache
def _wrapper_check():
    return import_internal("torch.utils._python_dispatch", "is_traceable_wrapper_subclass", lib=LIB,
                           what="telling a wrapper tensor subclass apart")


def functional_collectives():
    """The operator namespace of torch's functional collectives (``torch.ops._c10d_functional``):
    selective activation checkpointing keeps a reduce-scatter's output by naming its op there,
    as torchtitan's save list does."""
    import torch

    return require_attr(torch.ops, "_c10d_functional", lib=LIB, what="functional collectives' ops")


@contextmanager
def fused_attention():
    """``F.scaled_dot_product_attention`` (no mask, no dropout) run as one fused flash-attention
    operator, ``aten._scaled_dot_product_flash_attention_for_cpu``, whatever the device: on the
    meta device torch picks the math path, which materialises the sequence x sequence scores that
    a GPU's flash / memory-efficient kernels never hold. The fused operator keeps what they keep
    (the output and a float32 log-sum-exp per row, grouped key/value heads unexpanded) and counts
    as one kernel (``suite.planner.gpu_ops``). The planner enters it when it plans for a GPU. The
    module attribute is replaced, not a function mode's: checkpointing recomputes outside modes.
    Checked on 2.14.1."""
    import torch
    import torch.nn.functional as F

    flash, plain = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, F.scaled_dot_product_attention

    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p:
            return plain(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        return flash(query, key, value, 0.0, is_causal, scale=scale)[0]

    F.scaled_dot_product_attention = attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = plain


# ---- the planner's fake run (suite/planner/fake_run.py) ------------------------------------------

def fake_scalars():
    """A dispatch mode, entered inside the fake tensor mode, that answers a read of a fake
    tensor's value (``.item()``, ``bool(t)``: ``aten._local_scalar_dense``, which fake tensors
    refuse): False, 0 for an integer, 1.0 for a float. DeepSpeed reads values during its step to
    decide whether to skip it (a gradient norm that is not finite, an fp16 overflow flag) and by
    how much to clip, and Adam reads its step count (1.0: its bias correction divides by
    1 - beta ** step); these answers mean "finite, no overflow", the step a real run takes, so
    the step runs through and what it holds and sends is counted. Checked on 2.14.1."""
    import torch

    scalar = torch.ops.aten._local_scalar_dense.default

    class FakeScalars(dispatch_mode_class()):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is scalar:
                dtype = args[0].dtype
                return False if dtype == torch.bool else 1.0 if dtype.is_floating_point else 0
            return func(*args, **(kwargs or {}))

    return FakeScalars()



def fake_store():
    """The store of torch's ``fake`` process group backend (every collective returns at once,
    nothing is sent); it lives in torch's test utilities. Checked on 2.14.1."""
    return import_internal("torch.testing._internal.distributed.fake_pg", "FakeStore", lib=LIB,
                           what="the store of the fake process group")()


@contextmanager
def fake_friendly():
    """What the real strategy code does that fake tensors or the fake process group cannot take,
    worked around without changing what a rank holds, computes or sends. Checked on 2.14.1.

    - ``Module.to(device)`` of a module already there: a no-op; to another device: its fake
      parameters and buffers replaced by moved ones (torch swaps fake parameters in place,
      which fails for parameters fake mode keeps weak references to);
    - device meshes are built outside fake mode (they compute rank lists from real tensors);
    - FSDP2's ``_chunk_with_empty`` (a parameter cut into one chunk per rank, empty ones where
      dim 0 has fewer rows than ranks) shares one empty tensor among the empty chunks instead of
      making one per rank: each costs a fake op, thousands at world 1,024, and only their sizes
      are read (rank 0's own chunk is the first, never an empty one unless dim 0 is 0);
    - DDP's construction-time checks (parameter shapes across ranks, broadcast of rank 0's
      weights) are skipped: they move real data, which fake tensors have none of.
    """
    import torch
    import torch.distributed.device_mesh as device_mesh
    import torch.nn.parallel.distributed as ddp

    fsdp_param = import_internal("torch.distributed.fsdp._fully_shard._fsdp_param", lib=LIB, what="FSDP2 parameters")
    unset_fake = import_internal("torch._subclasses.fake_tensor", "unset_fake_temporarily", lib=LIB)
    fake_tensor = import_internal("torch._subclasses.fake_tensor", "FakeTensor", lib=LIB)
    parse_to = require_attr(torch._C._nn, "_parse_to", lib=LIB, what="Module.to's argument parser")
    names = [(torch.nn.Module, "to"), (device_mesh, "init_device_mesh"), (device_mesh.DeviceMesh, "__init__"),
             (fsdp_param, "_chunk_with_empty"), (ddp, "_verify_param_shape_across_processes"),
             (ddp, "_sync_module_states")]
    saved = [(owner, name, require_attr(owner, name, lib=LIB)) for owner, name in names]
    plain_to, plain_mesh, plain_mesh_init = (fn for _, _, fn in saved[:3])

    def to(self, *args, **kwargs):
        device = parse_to(*args, **kwargs)[0]
        same = device is not None and (device.type == "cpu" or device.index is not None)  # cpu:0 is cpu
        if same and len(args) + len(kwargs) == 1 and all(
                t.device.type == device.type and (device.type == "cpu" or t.device == device)
                for t in (*self.parameters(), *self.buffers())):
            return self
        if device is not None and len(args) + len(kwargs) == 1 and any(
                isinstance(t, fake_tensor) for t in (*self.parameters(), *self.buffers())):
            return _overwrite_to(self, device)
        return plain_to(self, *args, **kwargs)

    def init_device_mesh(*args, **kwargs):
        with unset_fake():
            return plain_mesh(*args, **kwargs)

    def mesh_init(self, *args, **kwargs):
        with unset_fake():
            plain_mesh_init(self, *args, **kwargs)

    def chunk_with_empty(tensor, num_chunks: int, dim: int):
        chunks = list(torch.chunk(tensor, num_chunks, dim=dim))
        if len(chunks) < num_chunks:
            chunks += [chunks[0].new_empty(0)] * (num_chunks - len(chunks))
        return chunks

    def skip(*args, **kwargs):
        return None

    for (owner, name, _), fn in zip(saved, (to, init_device_mesh, mesh_init, chunk_with_empty, skip, skip)):
        setattr(owner, name, fn)
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def _overwrite_to(module, device):
    """``module.to(device)`` by replacing each parameter and buffer (what torch does with
    ``torch.__future__.set_overwrite_module_params_on_conversion``, except for fake tensors)."""
    import torch

    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None:
                sub._parameters[name] = torch.nn.Parameter(param.detach().to(device), param.requires_grad)
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                sub._buffers[name] = buffer.to(device)
    return module


class _KeepBuckets:
    """DDP's reducer, except that it keeps its first buckets: the rebuild after the first step
    (same parameters, regrouped in the order their gradients arrived) broadcasts real tensors
    from C++, which fake tensors cannot be. Total bytes are the same either way."""

    def __init__(self, reducer):
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._reducer, name)


def keep_ddp_buckets(ddp_module) -> None:
    """Make a DistributedDataParallel module keep the buckets it starts with (``_KeepBuckets``):
    DDP's forward asks ``module.reducer._rebuild_buckets()``. Checked on 2.14.1."""
    reducer = require_attr(ddp_module, "reducer", lib=LIB, what="DDP's C++ reducer")
    require_attr(reducer, "_rebuild_buckets", lib=LIB, what="called by DDP's forward")
    ddp_module.reducer = _KeepBuckets(reducer)
