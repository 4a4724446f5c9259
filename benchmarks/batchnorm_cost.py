"""What synced batch norm (``suite.strategies.batchnorm``, CPU) costs against torch's native
``BatchNorm2d``: forward + backward of one layer in training mode on ResNet-18's feature-map
shapes at batch 32 (CIFAR-sized input), interleaved, median of repetitions; the synced layer
runs in a process group of one rank, so it pays its collectives' calls but no peer's time.
Prints one JSON object; ``sections/batchnorm.py`` judges it.

    python benchmarks/batchnorm_cost.py [--repeats 30]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

from suite.strategies import batchnorm  # noqa: E402
from suite.train import dist as sdist  # noqa: E402

SHAPES = [(32, 64, 32, 32), (32, 128, 16, 16), (32, 256, 8, 8), (32, 512, 4, 4)]  # ResNet-18's stages


def step_s(layer, x, grad) -> float:
    leaf = x.clone().requires_grad_()
    started = time.perf_counter()
    layer(leaf).backward(grad)
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sdist.free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rows = []
        for shape in SHAPES:
            g = torch.Generator().manual_seed(0)
            x, grad = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
            native = nn.BatchNorm2d(shape[1])
            synced = batchnorm.sync(nn.BatchNorm2d(shape[1]), dist.group.WORLD, torch.device("cpu"))
            times = {"native": [], "synced": []}
            for i in range(args.repeats + 3):  # interleaved; the first three warm up
                for name, layer in (("native", native), ("synced", synced)):
                    t = step_s(layer, x, grad)
                    if i >= 3:
                        times[name].append(t)
            rows.append({"shape": list(shape), **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()}})
        total = {k: sum(r[f"{k}_ms"] for r in rows) for k in ("native", "synced")}
        print(json.dumps({"rows": rows, "threads": torch.get_num_threads(), **{f"total_{k}_ms": v for k, v in total.items()},
                          "ratio": total["synced"] / total["native"]}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
