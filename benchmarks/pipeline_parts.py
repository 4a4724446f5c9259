"""What a pipeline step is made of, measured apart (for compare.py's pipeline section):

- one stage's forward + backward at the full batch B and at each micro-batch B/M (smaller GEMMs
  run less efficiently: M x t(B/M) > t(B));
- one point-to-point send of a micro-batch's activations between the two ranks (gloo), as
  ping-pong round trips halved: the schedule sends activations forward and gradients backward
  once per micro-batch, and a stage waiting for one is idle.

    torchrun --standalone --nproc_per_node 2 benchmarks/pipeline_parts.py OUT_JSON BATCH WIDTH M [M ...]
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def stage_time_s(width: int, batch: int, repeats: int = 20) -> float:
    """Median forward + backward of one stage: two width x width Linear + ReLU blocks."""
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())
    x = torch.randn(batch, width)
    times = []
    for _ in range(repeats + 3):
        t0 = time.perf_counter()
        stage(x).sum().backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def send_time_s(width: int, batch: int, rank: int, repeats: int = 30) -> float:
    """Median one-way time of sending a batch x width fp32 tensor to the other rank."""
    buf = torch.zeros(batch, width)
    times = []
    for _ in range(repeats + 3):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times[3:])


def main(out: str, batch: int, width: int, micro_batches: list[int]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sizes = sorted({batch} | {batch // m for m in micro_batches}, reverse=True)
    compute = {b: stage_time_s(width, b) for b in sizes}  # both ranks at once, as in the pipeline
    comm = {b: send_time_s(width, b, rank) for b in sizes}
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"stage_s": {str(b): v for b, v in compute.items()},
                       "send_s": {str(b): v for b, v in comm.items()}}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(m) for m in sys.argv[4:]])
