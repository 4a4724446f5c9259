"""torch internals the pipeline strategy relies on. Every access was checked on torch 2.14.1 (the
pin in pyproject.toml; ``suite.compat.CHECKED``) and only that version; docs/compat.md says what
each is for.
"""
from __future__ import annotations

import time

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
