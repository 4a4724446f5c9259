"""What one rank records while it trains, in one object, so that ``suite.train.rank`` stays short.

``RankLog.open`` starts this rank's ``MetricsLog`` (the run record), the utilisation thread
(``suite.record.utilisation``) and, in rank 0, the job's live W&B run (``suite.record.wandb_live``:
a thread that reads the run record, so no step waits for W&B). At the end:
- ``rank_fields``: this rank's entries of ``summary.json``'s ``ranks`` list: utilisation means
  and peaks, the rank's throughput, the device's name and the W&B mode asked for;
- ``run_fields``: run-wide entries: FLOPs per step, achieved FLOP/s, the peak per device and its
  source (``suite.record.peak``) and, when both are known, MFU; each rank's summary is also
  logged as a ``summary`` record (the W&B run summary).

The metrics themselves are defined in ``suite.record.metrics``.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from suite.models import flops as model_flops
from suite.record import flops, metrics, peak, run_record, wandb_export, wandb_live
from suite.record.utilisation import UtilisationSampler, probe_for


def node_threads_and_cores(ctx) -> tuple[int, int]:
    """Training threads on this node (its ranks x this rank's threads) and the cores the job has
    there (Slurm's allocation, else the cores this process may use)."""
    cores = int(os.environ.get("SLURM_CPUS_ON_NODE") or len(os.sched_getaffinity(0)))
    return ctx.local_world_size * torch.get_num_threads(), cores


def oversubscribed(ctx) -> bool:
    """More training threads on this node than cores: ranks then wait for each other's cores."""
    threads, cores = node_threads_and_cores(ctx)
    return threads > cores


class RankLog:
    """This rank's run-record writer, utilisation thread and (rank 0) live W&B run."""

    def __init__(self, records: run_record.MetricsLog, utilisation: UtilisationSampler, wandb_mode: str,
                 live: wandb_live.LiveRun | None = None, run_dir: Path | None = None):
        self.records, self.utilisation, self.wandb_mode, self.live = records, utilisation, wandb_mode, live
        self.run_dir = run_dir
        self._utilisation_summary = None

    @classmethod
    def open(cls, recipe, ctx, run_dir: Path) -> "RankLog":
        records = run_record.MetricsLog(run_dir, ctx.rank)
        utilisation = UtilisationSampler(probe_for(ctx.device), recipe.tracking.sample_interval_s,
                                         lambda **reading: records.log("utilisation", **reading)).start()
        mode = wandb_export.resolve_mode(recipe.tracking.wandb)
        live = None
        if mode != "disabled" and wandb_live.opens_wandb(ctx.rank):  # started before the barrier: not in a step
            live = wandb_live.LiveRun(run_dir, recipe.model_dump(mode="json"), mode, ctx.world_size,
                                      recipe.tracking.wandb_every_s, run_record.latest_checkpoint(run_dir)).start()
            threads, cores = node_threads_and_cores(ctx)
            if threads >= cores:  # W&B's thread and services then take their time from a rank's
                print(f"W&B: every core of this node trains ({threads} threads on {cores} cores); the live W&B run "
                      f"shares them, logging every {recipe.tracking.wandb_every_s:g} s (tracking.wandb_every_s; "
                      f"tracking.wandb=disabled, then python -m suite.export, keeps W&B off them)", flush=True)
        if ctx.world_size > 1:
            dist.barrier()  # ranks start timing together: a late rank's start is not its peers' first step
        return cls(records, utilisation, mode, live, run_dir)

    def log(self, kind: str, **fields) -> None:
        self.records.log(kind, **fields)

    def stop_utilisation(self) -> dict:
        """Stop the thread (once); means and peaks of its readings."""
        if self._utilisation_summary is None:
            self._utilisation_summary = self.utilisation.stop()
        return self._utilisation_summary

    def close(self) -> None:
        """Also on failure: the utilisation thread stops before the file it writes to closes; the
        live W&B run logs the rest of the record and finishes (a notice is said once, and kept
        in summary.json, which suite.submit prints)."""
        self.stop_utilisation()
        self.records.close()
        if self.live is not None:
            notice, self.live = self.live.close(), None
            if notice:
                print(notice, flush=True)
                run_record.update_summary(self.run_dir, wandb_notice=notice)

    def rank_fields(self, ctx, loop) -> dict:
        """This rank's utilisation and throughput (samples of its data shard)."""
        shard_samples = loop.samples // max(1, loop.engine.dp_size)
        return {"device_name": flops.device_name(ctx.device),
                "train_time_s": loop.train_time_s,
                "samples_per_s": metrics.rate(shard_samples, loop.train_time_s),
                "wandb_mode": self.wandb_mode,
                "wandb_live_every_s": self.live.every_s if self.live is not None else None,  # this rank logged live
                **self.stop_utilisation()}

    def run_fields(self, recipe, ctx, loop, ranks: list[dict]) -> dict:
        """Run-wide FLOPs and MFU (every rank calls this: it also logs each rank's summary record)."""
        devices = peak.devices(recipe, ctx)
        # After the timed loop, the ranks just gathered and their samplers stopped: on CPU, a collective
        # in which one rank per node measures the peak (or reads the cache) while the others wait.
        peak_per_device, source, measurement = peak.resolve(recipe, ctx)
        flops_per_step = model_flops.train_step_flops(recipe) if ctx.is_main else None
        out = {"flops_per_step": flops_per_step, "devices": devices, "oversubscribed": oversubscribed(ctx),
               "achieved_flops_per_s": metrics.rate((flops_per_step or 0) * loop.step, loop.train_time_s)
               if flops_per_step else None,
               "peak_flops_per_s": peak_per_device, "peak_flops_source": source, "peak_measurement": measurement}
        if peak_per_device and out["achieved_flops_per_s"]:
            out["mfu"] = metrics.mfu(out["achieved_flops_per_s"], peak_per_device, devices)
        summary = {**ranks[ctx.rank], **({k: v for k, v in out.items() if v is not None} if ctx.is_main else {})}
        self.log("summary", **summary)
        return out
