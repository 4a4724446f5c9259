"""The reference for harness overhead: a minimal hand-written training loop doing what a suite run
did, on the same data, so that compare.py can hold the suite's step times and losses against it.

    torchrun --standalone --nproc_per_node N benchmarks/hand_loop.py RUN_DIR OUT_JSON

It reads the suite run's resolved recipe (model, data, optimizer, batch, seed, steps, threads)
and, for ZeRO, the DeepSpeed config the run recorded; the model and data come from the suite's
registries (they are the work, not the harness). Everything else is plain torch / DeepSpeed
written out here: sharding the data, wrapping the model, the step, its clock, the loss.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler


def wrap(strategy: dict, model, optimizer, run_dir: Path, world: int):
    """(module, step function) for the strategy the suite ran."""
    name = strategy["name"]
    if name == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=strategy.get("bucket_cap_mb", 25.0))
    elif name == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for block in model.children():
            if any(p.requires_grad for p in block.parameters()):
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = optimizer(model.parameters())
    elif name == "zero":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import importlib

        import deepspeed

        # As the suite does: DeepSpeed would compile its CPU shared-memory op (not used in training).
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        config = json.loads((run_dir / "deepspeed_config.json").read_text())
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer(model.parameters()), config=config)

        def ds_step(loss):
            engine.backward(loss)
            engine.step()
        return engine, ds_step
    elif name != "single":
        raise SystemExit(f"hand_loop.py has no loop for strategy {name}")
    if callable(optimizer):
        optimizer = optimizer(model.parameters())

    def step(loss):
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, step


def main(run_dir: Path, out: Path) -> None:
    import yaml

    from suite import recipe as recipes
    from suite.common import heap
    from suite.models import build as build_model

    recipe = recipes.Recipe.model_validate(yaml.safe_load((run_dir / "recipe.yaml").read_text()))
    tr, opt = recipe.training, recipe.optimizer
    torch.set_num_threads(recipe.launch.cpus_per_task or 1)
    # The machine's conditions, not the loop: a suite rank keeps freed memory in its heap
    # (suite/common/heap.py), which halves some models' CPU steps; so does this loop, so that the
    # ratio measures the loop. SCALESUITE_KEEP_FREED_MEMORY=0 turns it off on both sides.
    heap.keep_freed_memory()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(tr.seed)
    train, _ = recipe.data.load()
    torch.manual_seed(tr.seed)
    model = build_model(recipe.model, recipe.data.spec())
    make_opt = lambda params: torch.optim.Adam(params, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay)  # noqa: E731
    model, step = wrap(recipe.strategy.model_dump(), model, make_opt if recipe.strategy.name != "ddp"
                       else make_opt(model.parameters()), run_dir, world)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=tr.seed, drop_last=True)
    loader = DataLoader(train, batch_size=tr.batch_size // world, sampler=sampler, drop_last=True)
    total = min(tr.epochs * len(loader), tr.max_steps or 10**9)
    times, losses = [], []
    for epoch in range(tr.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(inputs).float(), targets)
            step(loss)
            times.append(time.perf_counter() - t0)
            losses.append(loss.detach() * len(inputs))
            if len(times) == total:
                break
        if len(times) == total:
            break
    # The global loss of a step, as the suite reduces it: sample-weighted mean over ranks.
    sums = torch.stack(losses)
    dist.all_reduce(sums)
    medians = [None] * world
    dist.all_gather_object(medians, statistics.median(times))
    if rank == 0:
        out.write_text(json.dumps({"global_loss": [v / tr.batch_size for v in sums.tolist()],
                                   "step_time_s": statistics.median(medians), "steps": len(times)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    # Ended before the interpreter's teardown, where a gloo or FSDP worker thread that drops a
    # tensor can abort a rank that finished (SIGABRT, "terminate called without an active
    # exception": seen once in an overhead run); the suite's commands end the same way.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
