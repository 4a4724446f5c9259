"""The planner's prediction for one run, recorded in its ``summary.json`` (``predicted``) so that the
report can set it beside what the run measured.

Made by rank 0 after training (``suite.train.rank``; kept in the run folder's ``predicted.json``):
counting the model's FLOPs takes seconds, which neither the timed loop nor the submitting side,
before the first step, should pay. A failure to predict is recorded as ``predicted.error``, never
a failed run.

The profile is the analytic one (``suite.planner.analytic.profile``: held bytes from
``suite.planner.memory``, a fake step of the bare model at the rank's batch for FLOPs and activations,
the strategy's collectives and buffers by its rule), not the fake run of the whole strategy that
``python -m suite.plan`` makes (``suite.planner.fake_run``): that needs a process of its own
(it joins a fake process group and patches globals) and takes seconds per point, which every
run and every point of a sweep would pay. ``source`` says which. The step time needs a
calibration of this host (``python -m suite.calibrate``, once, no recipe); without one only bytes
are predicted and ``notes`` says so. The model's compute is timed here: a few steps of its
one-rank step at the rank's batch (``suite.planner.model_time``; cached per host: ``model_rate``), never the
run's own steps.
"""
from __future__ import annotations

PREDICTED_FILE = "predicted.json"


def prediction(recipe, calibration: dict | None = None) -> dict:
    """held_bytes (per rank), peak_bytes (and on a GPU reserved_bytes), step_time_s, samples_per_s and their sources, or an error."""
    try:
        return _prediction(recipe, calibration)
    except Exception as e:  # noqa: BLE001 - a prediction is a comparison aid, never a reason to fail a run
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"}


def _prediction(recipe, calibration):
    from suite.planner import analytic, calibration as stored, hardware, model_rate, timing

    # Not the fake run: see the module's docstring.
    profile = analytic.profile(recipe, recipe.world_size, "the run's own prediction (no fake run of the strategy)")
    out = {"source": profile.source, "held_bytes": profile.held_bytes,
           "peak_bytes": profile.peak_bytes or None, "reserved_bytes": profile.reserved_bytes, "notes": [profile.notes] if profile.notes else []}
    backend = "nccl" if recipe.launch.device == "cuda" else None
    calibration = calibration or stored.load(backend=backend)
    if calibration is None:
        out["notes"].append("no calibration of this host: run python -m suite.calibrate for step times")
        return out
    options = timing.options_of(recipe)
    # The model's own compute, timed now at this rank's batch and threads (never this run's steps).
    calibration = model_rate.with_model_rate(calibration, recipe, options["model"], options["ranks_per_node"])
    t = timing.predict_step_time(profile, calibration, options)
    out.update(step_time_s=t["step_s"], samples_per_s=t["samples_per_s"], compute_s=t["compute_s"],
               copy_s=t["copy_s"], comm_s=t["comm_s"], exposed_comm_s=t["exposed_comm_s"], calibration=calibration.get("key"),
               rate=t["rate"])
    if (busy := hardware.busy_load(calibration)) is not None:
        out["calibration_busy_load"] = busy
        out["calibration_busy_note"] = (f"the calibration began on a busy machine (load average {busy:.2f}): its "
                                        "times, and this prediction, may be slow; calibrate again when it is quiet")
        out["notes"].append(out["calibration_busy_note"])
    if (spread := hardware.speed_spread(calibration)) is not None:
        out["calibration_speed_spread"] = spread
        out["calibration_speed_note"] = (f"this machine's speed changed by {spread:.0%} while it was calibrated: a "
                                         f"step measured here can differ from another run of it, and from this "
                                         f"prediction, by as much")
        out["notes"].append(out["calibration_speed_note"])
    return out
