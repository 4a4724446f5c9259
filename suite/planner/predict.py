"""The plan's prediction for one run, recorded in its ``summary.json`` (``predicted``) so that the
report can set it beside what the run measured.

Made by rank 0 after training (``suite.train.rank``; kept in the run folder's ``predicted.json``):
counting the model's FLOPs takes seconds, which neither the timed loop nor the submitting side,
before the first step, should pay. A failure to predict is recorded as ``predicted.error``, never
a failed run.

The profile is what the dry run knows (``analytic_profile``: held bytes from ``suite.estimate``,
FLOPs from ``suite.record.flops``, the data-parallel strategies' collectives from the gradient and
parameter bytes, one call per phase), not the fake run of ``python -m suite.plan``
(``suite.planner.fake_run``): that forks a process and takes seconds per point, which every launch
and every point of a sweep would pay before its first step. ``source`` says which. The step
time needs a calibration of this host (``python -m suite.calibrate``); without one only bytes are
predicted and ``notes`` says so.
"""
from __future__ import annotations

import math

from suite.planner.profile import StepProfile

PREDICTED_FILE = "predicted.json"
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


def analytic_profile(recipe, flops_per_step: int | None = None) -> StepProfile:
    """A StepProfile from the dry run's estimate; no peak bytes (0), communication only for the
    data-parallel strategies, where it is the gradient (and parameter) bytes. ``flops_per_step``:
    the global step's FLOPs where the caller has counted them already (a run's summary has)."""
    from suite.estimate import predicted_held_bytes
    from suite.record import flops

    est = predicted_held_bytes(recipe)
    world, name = recipe.world_size, recipe.strategy.name
    grad_bytes = est["total"]["gradients"]
    param_bytes = est["total"]["parameters"]
    stage = getattr(recipe.strategy, "stage", None)
    comm: dict[str, tuple[int, int]] = {}  # kind -> (bytes, calls)
    if world > 1:
        if name in ("ddp", "allreduce") or (name == "zero" and stage == 0):
            calls = (math.ceil(grad_bytes / DDP_BUCKET_BYTES) if name == "ddp"
                     else sum(1 for _ in recipe.model_info().build_meta().parameters()))
            comm["all_reduce"] = (grad_bytes, calls)
        elif name == "zero" and stage in (1, 2):
            comm = {"reduce_scatter": (grad_bytes, 1), "all_gather": (param_bytes, 1)}
        elif (name == "zero" and stage == 3) or name in ("fsdp", "fsdp1"):
            comm = {"all_gather": (2 * param_bytes, 2), "reduce_scatter": (grad_bytes, 1)}  # forward and backward gathers
    total_flops = (flops_per_step if flops_per_step is not None else flops.train_step_flops(recipe)) or 0
    return StepProfile(strategy=name, world_size=world, held_bytes=est["per_rank"], peak_bytes=0,
                       flops=total_flops // world, samples=recipe.training.batch_size,
                       comm_bytes={k: b for k, (b, _) in comm.items()}, comm_calls={k: c for k, (_, c) in comm.items()},
                       source="analytic", notes="the dry run's estimate (python -m suite.plan runs the fake step); "
                       "no peak bytes; communication only for ddp/allreduce/zero/fsdp")


def prediction(recipe, calibration: dict | None = None, flops_per_step: int | None = None) -> dict:
    """held_bytes (per rank), peak_bytes, step_time_s, samples_per_s and their sources, or an error."""
    try:
        return _prediction(recipe, calibration, flops_per_step)
    except Exception as e:  # noqa: BLE001 - a prediction is a comparison aid, never a reason to fail a run
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}


def _prediction(recipe, calibration, flops_per_step):
    from suite.planner import calibrate, timing

    profile = analytic_profile(recipe, flops_per_step)  # not the fake run: see the module's docstring
    out = {"source": profile.source, "held_bytes": profile.held_bytes,
           "peak_bytes": profile.peak_bytes or None, "notes": [profile.notes] if profile.notes else []}
    backend = "nccl" if recipe.launch.device == "cuda" else None
    calibration = calibration or calibrate.load(backend=backend)
    if calibration is None:
        out["notes"].append("no calibration of this host: run python -m suite.calibrate for step times")
        return out
    t = timing.predict_step_time(profile, calibration, timing.options_of(recipe))
    out.update(step_time_s=t["step_s"], samples_per_s=t["samples_per_s"], compute_s=t["compute_s"],
               comm_s=t["comm_s"], exposed_comm_s=t["exposed_comm_s"], calibration=calibration.get("key"),
               rate=t["rate"])
    return out
