"""DeepSpeed internals the zero and ds_pipeline strategies rely on. Every access was checked on
deepspeed 0.19.8 (constraints.txt, the tested set; ``suite.compat.CHECKED``) and only that version;
docs/compat.md says what each is for. DeepSpeed is imported inside the functions, as in
suite/strategies/_deepspeed.py.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import NamedTuple

from suite.compat import import_internal, incompatible, require_attr

LIB = "deepspeed"

# Modules deepspeed.initialize imports lazily (its Muon optimizer module pulls in torch._inductor,
# ~7 s); a parent about to fork ranks imports them once. Checked on 0.19.8.
PRELOAD_MODULES = ("deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.runtime.pipe.engine",
                   "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.stage_1_and_2")


def preload_modules() -> None:
    for name in PRELOAD_MODULES:
        import_internal(name, lib=LIB, what="imported ahead of forking ranks")


def config_class():
    """``DeepSpeedConfig``, the parser ``deepspeed.initialize`` runs on a config dict (no public
    entry point parses a config without building an engine). Checked on 0.19.8."""
    return import_internal("deepspeed.runtime.config", "DeepSpeedConfig", lib=LIB,
                           what="the config parser strategy.config is checked with")


# ---- start-up patches -----------------------------------------------------------------------

def skip_shm_op_build() -> None:
    """Make ``init_distributed`` skip compiling the shared-memory collective op (CPU inference
    all-reduce; 60-80 s on 2 cores; training does not use it): ``deepspeed.comm.torch.build_shm_op``
    returns None, which TorchBackend takes as "op not available". Checked on 0.19.8.

    (The module must be imported by name: the attribute path deepspeed.comm.torch is the torch
    package.)"""
    module = import_internal("deepspeed.comm.torch", lib=LIB, what="TorchBackend's module")
    require_attr(module, "build_shm_op", lib=LIB, what="called by TorchBackend to compile its shm op")
    module.build_shm_op = lambda: None


def announce_op_builds() -> None:
    """Say once per op when DeepSpeed compiles one of its C++ ops at run time (minutes on a few
    cores) and where the result is cached, by wrapping ``OpBuilder.jit_load`` (every run-time
    build goes through it). Checked on 0.19.8."""
    op_builder = import_internal("deepspeed.ops.op_builder.builder", "OpBuilder", lib=LIB,
                                 what="base class of DeepSpeed's C++ op builders")
    real = require_attr(op_builder, "jit_load", lib=LIB, what="compiles an op at run time")
    if getattr(real, "announces", False):  # our own marker: already wrapped in this process
        return
    told = set()

    def jit_load(self, verbose=True):
        if self.name not in told:
            told.add(self.name)
            cache = os.environ.get("TORCH_EXTENSIONS_DIR", "~/.cache/torch_extensions")
            print(f"DeepSpeed op {self.name}: loading, compiled on first use (can take minutes), then "
                  f"cached in {cache} (set TORCH_EXTENSIONS_DIR to keep it elsewhere)", flush=True)
        return real(self, verbose)

    jit_load.announces = True
    op_builder.jit_load = jit_load


# ---- what a rank holds ----------------------------------------------------------------------

class _Wrapper(NamedTuple):
    module: str
    name: str
    stages: frozenset  # ZeRO stages with which DeepSpeed 0.19.8 builds this wrapper
    master: str  # attribute: the rank's fp32 master weights
    gradients: tuple  # attributes: gradient buffers it holds besides p.grad


# The optimizer wrappers DeepSpeed 0.19.8 puts around a torch optimizer (engine._configure_optimizer).
# Stage 0 fp32 has none: engine.optimizer is the torch optimizer itself.
_WRAPPERS = (
    _Wrapper("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", frozenset({1, 2}),
             "single_partition_of_fp32_groups", ("averaged_gradients",)),
    _Wrapper("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", frozenset({3}),
             "fp32_partitioned_groups_flat", ("averaged_gradients", "grad_partitions_flat_buffer")),
    # bf16 with fp32 gradient accumulation: pipeline engine (stage 0/1), ZeRO-1 without offload.
    _Wrapper("deepspeed.runtime.bf16_optimizer", "BF16_Optimizer", frozenset({0, 1}),
             "fp32_groups_flat_partition", ("fp32_groups_gradients_flat",)),
    # bf16/fp16 without ZeRO around a torch (not fused) optimizer.
    _Wrapper("deepspeed.runtime.fp16.unfused_optimizer", "FP16_UnfusedOptimizer", frozenset({0}),
             "fp32_groups", ()),
)


# ZeRO-3's modules that check, by broadcasting rank 0's list and reading it back, that every rank
# traced the same modules and parameters. Checked on 0.19.8.
_RANKS_AGREE = ("deepspeed.runtime.zero.partitioned_param_coordinator", "deepspeed.runtime.zero.partition_parameters",
                "deepspeed.runtime.zero.stage3")


@contextmanager
def fake_friendly():
    """ZeRO-3's checks that the ranks agree (``assert_ints_same_as_other_ranks``: rank 0's list
    broadcast and read back) skipped for the planner's fake run: it runs rank 0 alone under the
    fake process group, so rank 0 agrees with itself, and the value read back from a fake tensor
    is not the one broadcast. Checked on 0.19.8."""
    modules = [import_internal(name, lib=LIB, what="ZeRO-3's rank agreement check") for name in _RANKS_AGREE]
    saved = [(m, require_attr(m, "assert_ints_same_as_other_ranks", lib=LIB)) for m in modules]
    for m, _ in saved:
        m.assert_ints_same_as_other_ranks = lambda ints: None
    try:
        yield
    finally:
        for m, fn in saved:
            m.assert_ints_same_as_other_ranks = fn


def zero_stage(engine) -> int:
    return int(require_attr(engine, "zero_optimization_stage", lib=LIB, what="DeepSpeedEngine method")())


def _wrapper(engine):
    """The known wrapper around ``engine.optimizer``, checked against the engine's ZeRO stage;
    None for a bare torch optimizer (stage 0, fp32)."""
    import torch

    optimizer, stage = engine.optimizer, zero_stage(engine)
    if isinstance(optimizer, torch.optim.Optimizer):
        if stage != 0:
            raise incompatible(LIB, f"a ZeRO optimizer wrapper at stage {stage}, not the bare "
                                    f"{type(optimizer).__name__}")
        return None
    for known in _WRAPPERS:
        if isinstance(optimizer, import_internal(known.module, known.name, lib=LIB)):
            if stage not in known.stages:
                raise incompatible(LIB, f"{known.name} only at ZeRO stage(s) {sorted(known.stages)}, "
                                        f"but the engine is at stage {stage}")
            return known
    raise incompatible(LIB, f"one of the optimizer wrappers {', '.join(w.name for w in _WRAPPERS)} at "
                            f"ZeRO stage {stage}, not {type(optimizer).__module__}.{type(optimizer).__name__}")


def inner_optimizer(engine):
    """The torch optimizer the engine steps (the recipe's): ``engine.optimizer`` itself without
    a wrapper, else the wrapper's ``optimizer``. Checked on 0.19.8."""
    if _wrapper(engine) is None:
        return engine.optimizer
    return require_attr(engine.optimizer, "optimizer", lib=LIB, what="the wrapped torch optimizer")


def link_optimizer_state(engine) -> None:
    """ZeRO-1/2 link each parameter's fragment to its torch optimizer's state (what
    ``deepspeed.utils.safe_*_full_optimizer_state`` read and write) only in their first step;
    state made before it (``suite.strategies.neutral.make_state``) is linked here. ZeRO-3 needs
    nothing. Checked on 0.19.8."""
    if zero_stage(engine) in (1, 2):
        require_attr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", lib=LIB,
                     what="links the parameters' fragments to the optimizer state")()


def master_weights(engine) -> list:
    """The fp32 master weights this rank keeps besides the module (its partition from ZeRO-1 on;
    a full copy for bf16/fp16 without ZeRO); none for plain fp32 stage 0. Checked on 0.19.8."""
    known = _wrapper(engine)
    if known is None:
        return []
    return _tensors(require_attr(engine.optimizer, known.master, lib=LIB,
                                 what=f"fp32 master weights of {known.name}"), known.master)


def gradient_buffers(engine) -> list:
    """Gradient buffers the optimizer wrapper holds besides ``p.grad`` (ZeRO-1/2: the averaged
    partition; ZeRO-3: also the flat partition buffer; bf16: fp32 accumulation buffers); views
    of one buffer may repeat. Checked on 0.19.8."""
    known = _wrapper(engine)
    if known is None:
        return []
    out = []
    for name in known.gradients:
        out += _tensors(require_attr(engine.optimizer, name, lib=LIB, what=f"gradients of {known.name}"), name)
    return out


def parameter_partitions(engine, params) -> list:
    """The parameter tensors this rank holds: at ZeRO-3 each parameter's ``ds_tensor`` (its own
    partition; the parameter itself is an empty placeholder between uses), else the parameters.
    Checked on 0.19.8."""
    params = list(params)
    if zero_stage(engine) != 3:
        return params
    return [require_attr(p, "ds_tensor", lib=LIB, what="a ZeRO-3 parameter's partition") for p in params]


def _tensors(value, name: str) -> list:
    """Tensors in a wrapper attribute: a tensor, or lists/dicts of them (None: freed)."""
    import torch

    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item, name)]
    raise incompatible(LIB, f"{name} to hold tensors (lists or dicts of them), not {type(value).__name__}")


# ---- pipeline engine --------------------------------------------------------------------------

def owns_layer(pipe, index: int) -> bool:
    """Whether this rank's stage of a ``PipelineModule`` builds layer ``index`` (through
    ``stage_owner`` and ``stage_id``, public names, instead of ``_local_start/_local_stop``)."""
    owner = require_attr(pipe, "stage_owner", lib=LIB, what="PipelineModule's stage of a layer")
    return owner(index) == require_attr(pipe, "stage_id", lib=LIB, what="this rank's pipeline stage")


def reset_activation_shapes(engine) -> None:
    """Drop the pipeline engine's cached activation and gradient shapes (to be called when the
    micro-batch shape changes). Checked on 0.19.8."""
    require_attr(engine, "reset_activation_shape", lib=LIB, what="PipelineEngine method")()


def replica_loss(engine):
    """This data-parallel replica's mean loss over the last ``train_batch``'s micro-batches
    (``train_batch`` returns the mean over replicas). Checked on 0.19.8."""
    return require_attr(engine, "dp_group_loss", lib=LIB, what="set by PipelineEngine.train_batch")


def pipe_group(engine):
    """The process group of this rank's pipeline (one rank per stage), from the engine's
    ``PipelineParallelGrid``. Checked on 0.19.8."""
    grid = require_attr(engine, "grid", lib=LIB, what="PipelineEngine's process grid")
    return require_attr(grid, "get_pipe_parallel_group", lib=LIB, what="PipelineParallelGrid method")()
