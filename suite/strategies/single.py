"""The baseline: the whole model on one rank, no communication. Every other strategy's
per-step losses are checked against this one."""
from typing import ClassVar, Literal

from suite.strategies import costs
from suite.strategies.base import ModuleEngine, StrategyOptions, refuse_world_size


class Options(StrategyOptions):
    name: Literal["single"] = "single"
    reusable_process: ClassVar = True
    overlap: ClassVar = costs.NO_COMMUNICATION
    no_neutral_checkpoint: ClassVar = ""  # torch DCP maps its state (suite.strategies.neutral)
    cannot_fake: ClassVar = ""

    def check(self, layout, model) -> None:
        if layout.world_size != 1:
            refuse_world_size("single", layout.world_size, "runs on exactly 1 rank",
                              "set launch.nodes=1 launch.tasks_per_node=1, or use ddp")

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return {}  # one rank: nothing to send

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose


def build(opts: Options, setup) -> ModuleEngine:
    return ModuleEngine(setup, setup.prepare(setup.build_model().to(setup.ctx.device)))
