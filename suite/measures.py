"""What the loop hands to tracking, in three calls, so that ``suite.train`` stays short.

- ``open_log``: this rank's ``MetricsLog`` with its sinks (W&B unless disabled) and the
  utilisation sampler started (``suite.sampler``).
- ``rank_fields``: this rank's entries of ``summary.json``'s ``ranks`` list: utilisation means
  and peaks, the rank's throughput, the device's name and the W&B mode actually used.
- ``run_fields``: run-wide entries: FLOPs per step, achieved FLOP/s and, when the peak is known,
  MFU; it also sends each rank's summary to its sinks (the W&B run summary).

The metrics themselves are defined in ``suite.metrics``.
"""
from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from suite import flops, metrics, tracking, wandb_sink
from suite.sampler import UtilisationSampler, probe_for


def open_log(recipe, ctx, run_dir: Path) -> tracking.MetricsLog:
    sinks = wandb_sink.open_sinks(recipe, ctx.rank, run_dir)
    log = tracking.MetricsLog(run_dir, ctx.rank, sinks=sinks)
    log.wandb_mode = sinks[0].mode if sinks else "disabled"
    log.utilisation = UtilisationSampler(probe_for(ctx.device), recipe.tracking.sample_interval_s,
                                         lambda **reading: log.log("utilisation", **reading)).start()
    if ctx.world_size > 1:
        # W&B starts in 1-3 s, unevenly: without this, a late rank's start is timed as its peers' first step.
        dist.barrier()
    return log


def rank_fields(recipe, ctx, loop) -> dict:
    """Stops the sampler; this rank's utilisation and throughput (samples of its data shard)."""
    log = loop.log
    shard_samples = loop.samples // max(1, loop.engine.dp_size)
    out = {"device_name": flops.device_name(ctx.device),
           "train_time_s": loop.train_time_s,
           "samples_per_s": metrics.rate(shard_samples, loop.train_time_s),
           "wandb_mode": getattr(log, "wandb_mode", "disabled")}
    sampler = getattr(log, "utilisation", None)
    if sampler is not None:
        out.update(sampler.stop())
    return out


def run_fields(recipe, ctx, loop, ranks: list[dict]) -> dict:
    """Run-wide FLOPs and MFU (every rank calls this: it also fills each rank's W&B summary)."""
    devices = recipe.world_size * recipe.launch.devices_per_task
    flops_per_step = flops.train_step_flops(recipe) if ctx.is_main else None
    out = {"flops_per_step": flops_per_step, "devices": devices,
           "achieved_flops_per_s": metrics.rate((flops_per_step or 0) * loop.step, loop.train_time_s)
           if flops_per_step else None}
    peak = recipe.tracking.peak_flops_per_s or flops.peak_flops_per_s(
        flops.device_name(ctx.device), recipe.training.precision)
    if peak and out["achieved_flops_per_s"]:
        out["peak_flops_per_s"] = peak
        out["mfu"] = metrics.mfu(out["achieved_flops_per_s"], peak, devices)
    summary = {**ranks[ctx.rank], **({k: v for k, v in out.items() if v is not None} if ctx.is_main else {})}
    loop.log.log("summary", **summary)
    return out
