"""What ``data.augment`` costs per training batch: fetching one epoch's batches of ``base.yaml``'s
data (CIFAR-shaped synthetic images, global batch 128, normalised) without and with random crop
(padding 4) and flip, interleaved, next to the cnn's train step on such a batch (``single``, one
thread). Prints one JSON object; ``sections/augment.py`` judges it.

    python benchmarks/augment_cost.py [--repeats 5]
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
from torch.utils.data import DistributedSampler  # noqa: E402

from suite import recipe as recipes, strategies  # noqa: E402
from suite.common.ports import free_port  # noqa: E402
from suite.train import dist as sdist, rank as train_rank  # noqa: E402

AUGMENT = "data.augment={crop_padding: 4, hflip: true}"


def fetch_ms(recipe, epoch: int) -> float:
    """Mean wall time per batch of one epoch of this rank's training loader (fetch only)."""
    train, _ = recipe.data.load()
    sampler = DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True)
    sampler.set_epoch(epoch)
    loader = recipe.data.train_loader(train, sampler, recipe.training.batch_size, recipe.training.seed)
    started, batches = time.perf_counter(), 0
    for _ in loader:
        batches += 1
    return (time.perf_counter() - started) / batches * 1e3


def step_ms(recipe, steps: int) -> float:
    """Median time of the cnn's train step on one augmented batch."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    ctx = sdist.init("cpu")
    try:
        engine = strategies.build(recipe.strategy, train_rank.make_setup(recipe, ctx))
        train, _ = recipe.data.load()
        x, y = train.tensors[0][:recipe.training.batch_size], train.tensors[1][:recipe.training.batch_size]
        times = []
        for _ in range(steps + 2):  # the first two warm up
            started = time.perf_counter()
            engine.train_step(x, y)
            times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times[2:])
    finally:
        sdist.close()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    base = str(ROOT / "benchmarks" / "base.yaml")
    plain, = recipes.load(base, ["data.normalize=true"])
    augmented, = recipes.load(base, ["data.normalize=true", AUGMENT])
    pairs = [(fetch_ms(plain, rep), fetch_ms(augmented, rep)) for rep in range(args.repeats)]
    out = {"batch": plain.training.batch_size, "fetch_plain_ms": statistics.median(p for p, _ in pairs),
           "fetch_augmented_ms": statistics.median(a for _, a in pairs), "step_ms": step_ms(augmented, 8)}
    out["added_share_of_step"] = (out["fetch_augmented_ms"] - out["fetch_plain_ms"]) / out["step_ms"]
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
