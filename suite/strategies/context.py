"""The distributed context a strategy builds its Engine in: this rank, the world, the device and the
backend. ``suite.train.dist.init`` makes it (the one place that chooses CUDA+NCCL or CPU+gloo)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    devices: tuple = ()  # every device this rank drives (layer-wise model parallel)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
