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
from suite.common.ports import free_port  # noqa: E402

SHAPES = [(32, 64, 32, 32), (32, 128, 16, 16), (32, 256, 8, 8), (32, 512, 4, 4)]  # ResNet-18's stages
# Whole networks, not tuned to: a train step's forward + backward with every batch-norm layer
# synced (group of one) against native; MobileNetV2 has 52 layers, many on small maps.
MODELS = {"resnet18": {"width": 0.5}, "mobilenet_v2": {"width": 0.5, "dropout": 0.0}}


def step_s(layer, x, grad) -> float:
    leaf = x.clone().requires_grad_()
    started = time.perf_counter()
    layer(leaf).backward(grad)
    return time.perf_counter() - started


def whole_model(name: str, repeats: int) -> dict:
    import copy

    from suite.data import DataSpec
    from suite.models import MODELS as REGISTRY, build

    torch.manual_seed(0)
    native = build(REGISTRY[name][0](**MODELS[name]), DataSpec("synthetic", (3, 32, 32), 10))
    synced = batchnorm.sync(copy.deepcopy(native), dist.group.WORLD, torch.device("cpu"))
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    times = {"native": [], "synced": []}
    for i in range(max(repeats // 3, 3) + 2):
        for label, net in (("native", native), ("synced", synced)):
            started = time.perf_counter()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            if i >= 2:
                times[label].append(time.perf_counter() - started)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"model": name, **MODELS[name], "native_ms": ms["native"], "synced_ms": ms["synced"],
            "ratio": ms["synced"] / ms["native"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
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
        models = [whole_model(name, args.repeats) for name in MODELS]
        print(json.dumps({"rows": rows, "threads": torch.get_num_threads(), **{f"total_{k}_ms": v for k, v in total.items()},
                          "ratio": total["synced"] / total["native"], "models": models}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
