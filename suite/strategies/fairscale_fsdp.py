"""fairscale's FullyShardedDataParallel: refused, with the reason and what to use instead.

On CPU it cannot run on current torch: it needs CUDA ("Found no NVIDIA driver"; with
``compute_device=cpu`` it fails with ``KeyError: 'all_gather'``), see docs/strategies.md.
It is untested here on GPUs and superseded by torch's own FSDP (strategy ``fsdp``), which shards
parameters, gradients and optimizer state the same way and runs on CPU and GPU.
"""
from typing import ClassVar, Literal

from suite.common.errors import SuiteError
from suite.strategies import costs
from suite.strategies.base import StrategyOptions


class Options(costs.ShardedUnits, StrategyOptions):
    name: Literal["fairscale_fsdp"] = "fairscale_fsdp"
    # FSDP's rules (strategy fsdp1), flat parameters: no copies of their own counted.
    overlap: ClassVar = costs.PREFETCHED_UNITS
    cannot_fake: ClassVar = ""  # refused before any plan: check() says why

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose

    def check(self, layout, model) -> None:
        raise SuiteError("strategy.name=fairscale_fsdp is not supported: fairscale's FullyShardedDataParallel "
                         "needs CUDA and fails on current torch without it (no NVIDIA driver; with "
                         "compute_device=cpu: KeyError 'all_gather'); use strategy.name=fsdp (torch FSDP2, "
                         "same sharding, CPU and GPU)")


def build(opts: Options, setup):
    Options.check(opts, None, None)
