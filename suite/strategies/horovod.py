"""Horovod: refused, with the reason and what to use instead.

Horovod 0.28.1 (its latest release) does not build against this suite's torch 2.14.1: its torch
extension needs the CUDA toolkit for a CUDA build of torch, and compiles as C++14 where torch's
headers require C++20 (the build attempt: benchmarks/results/code-rules.md).
What Horovod does here (one all-reduce of averaged gradients per step, ring over gloo) is what
``ddp`` (bucketed, overlapped with backward) and ``allreduce`` (one all-reduce per gradient) do.
"""
from typing import ClassVar, Literal

from suite.common.errors import SuiteError
from suite.strategies import costs
from suite.strategies.base import StrategyOptions

REASON = ("strategy.name=horovod is not supported: Horovod 0.28.1 does not build against torch 2.14.1 "
          "(its torch extension needs the CUDA toolkit for a CUDA build of torch, and compiles as C++14 "
          "where torch 2.14's headers require C++20); use strategy.name=ddp or strategy.name=allreduce "
          "(the same gradient all-reduce)")


class Options(StrategyOptions):
    name: Literal["horovod"] = "horovod"
    overlap: ClassVar = costs.NOTHING_HIDDEN
    cannot_fake: ClassVar = ""  # refused before any plan: check() says why

    def check(self, layout, model) -> None:
        raise SuiteError(REASON)

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return costs.data_parallel_all_reduce(step)  # what it would do: one all-reduce of the gradients

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose


def build(opts: Options, setup):
    raise SuiteError(REASON)
