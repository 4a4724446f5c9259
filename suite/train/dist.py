"""Rank, world, device and backend: the one place that chooses CUDA+NCCL or CPU+gloo.

The environment comes from whoever started the rank: submitit (``suite.submit.launch`` exports
MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK from the job), torchrun, or nothing at all
(a single process, world size 1).
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from suite.errors import SuiteError


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(device: str = "auto", devices_per_task: int = 1, cpus_per_task=None,
         collective_timeout_s: int = 300) -> DistContext:
    """Join (or create) the process group and pick this rank's device(s) and thread count."""
    if "WORLD_SIZE" not in os.environ:  # a plain `python -m suite.train`: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))

    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        have = torch.cuda.device_count()
        first = local_rank * devices_per_task
        if first + devices_per_task > have:
            raise SuiteError(f"rank {rank} needs GPUs {first}..{first + devices_per_task - 1} but this node "
                             f"has {have}; lower launch.tasks_per_node or launch.devices_per_task")
        devices = tuple(torch.device("cuda", first + i) for i in range(devices_per_task))
        torch.cuda.set_device(devices[0])
        backend = "nccl"
    else:
        # Several "devices" of one CPU process are the same device; the split stays real in code.
        devices = tuple(torch.device("cpu") for _ in range(devices_per_task))
        backend = "gloo"
    threads = cpus_per_task or max(1, len(os.sched_getaffinity(0)) // local_world)
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=timedelta(seconds=collective_timeout_s))
    return DistContext(rank, world, local_rank, local_world, devices[0], backend, devices)


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
