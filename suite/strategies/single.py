"""The baseline: the whole model on one rank, no communication. Every other strategy's
per-step losses are checked against this one."""
from typing import ClassVar, Literal

from suite.strategies.base import ModuleEngine, StrategyOptions, refuse_world_size


class Options(StrategyOptions):
    name: Literal["single"] = "single"
    reusable_process: ClassVar = True

    def check(self, layout, model) -> None:
        if layout.world_size != 1:
            refuse_world_size("single", layout.world_size, "runs on exactly 1 rank",
                              "set launch.nodes=1 launch.tasks_per_node=1, or use ddp")


def build(opts: Options, setup) -> ModuleEngine:
    return ModuleEngine(setup, setup.prepare(setup.build_model().to(setup.ctx.device)))
