"""Horovod: refused, with the reason and what to use instead.

Horovod 0.28.1 (its latest release) does not build against this suite's torch 2.14.1
(``HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 pip install horovod``):
- torch 2.14.1 is a CUDA build (+cu130), so Horovod's torch extension insists on CUDA even for a
  CPU-only build, and CMake stops: "Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR
  CUDA_CUDART)"; pointed at the toolkit (HOROVOD_CUDA_HOME), it then lacks ``FOUND_LIB_cudart``;
- given that too (CUDA_HOME, CMAKE_LIBRARY_PATH to the toolkit's lib), it configures and compiles
  its torch extension with ``-std=c++14`` (``CMAKE_CXX_STANDARD 14`` in horovod/torch/CMakeLists.txt),
  and torch 2.14's headers refuse anything below C++20: ``g++ -std=c++14`` on ``torch/extension.h``
  stops with "#error C++20 or later compatible compiler is required to use PyTorch." (that build
  was stopped after 25 min on 2 shared cores, before it reached the files that include torch).
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
