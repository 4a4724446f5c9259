"""fairscale's Pipe in one process: the model's blocks are cut into ``len(balance)`` partitions on
the devices this rank drives (``launch.devices_per_task``) and every batch is split into
``micro_batches`` chunks that flow through them (GPipe; fairscale runs partitions on worker
threads). On CPU the devices must be named explicitly (all ``cpu``): fairscale otherwise
assumes CUDA. For pipelines across ranks use strategy ``pipeline``.
"""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import PositiveInt

from suite.strategies import costs
from suite.strategies.base import StrategyOptions, refuse_world_size
from suite.strategies.layer_split import SplitEngine
from suite.strategies.splitting import check_devices_per_task, check_recipe_split, resolve_split


class Options(StrategyOptions):
    name: Literal["fairscale_pipe"] = "fairscale_pipe"
    warm_imports: ClassVar = ("fairscale.nn",)
    micro_batches: PositiveInt = 4  # fairscale's `chunks`
    split_at: Optional[list[int]] = None  # block indices where partitions 2.. start; default: balanced
    # Recompute activations in backward: fairscale's default keeps the last micro-batch's.
    checkpoint: Literal["always", "except_last", "never"] = "except_last"
    overlap: ClassVar = costs.PIPELINED
    cannot_fake: ClassVar = ""

    def pipeline_chunks(self) -> int:
        return self.micro_batches

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return {}  # one process: its partitions pass activations between devices, not ranks

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return [{"name": "fairscale_pipe", "micro_batches": m} for m in (2, 4, 8)]  # the bubble against the chunk size

    def check(self, layout, model) -> None:
        if layout.world_size != 1:
            refuse_world_size("fairscale_pipe", layout.world_size, "runs in one process",
                              "set launch.tasks_per_node=1, or use strategy.name=pipeline across ranks")
        parts = check_devices_per_task(layout, "fairscale_pipe", "puts one partition on each of")
        check_recipe_split(model, self.split_at, parts, "fairscale_pipe")


def build(opts: Options, setup) -> SplitEngine:
    from fairscale.nn import Pipe

    devices = list(setup.ctx.devices)
    model = setup.prepare(setup.build_model())
    starts = [0, *resolve_split(opts.split_at, model, len(devices)), len(model)]
    balance = [b - a for a, b in zip(starts, starts[1:])]
    pipe = Pipe(model, balance=balance, devices=devices, chunks=setup.layout.pipeline_chunks, checkpoint=opts.checkpoint)
    return SplitEngine(setup, pipe, devices[0])
