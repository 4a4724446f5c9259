"""A hand-made calibration and step profile for the time model's tests: every kind fitted at
100 µs and 1 GB/s, matmul peaks of 10 and 16 GFLOP/s at 1 and 2 threads."""
from __future__ import annotations

from suite.planner import alpha_beta
from suite.planner.profile import StepProfile

ALPHA_S, BETA = 1e-4, 1e9  # a hand-made calibration: 100 µs, 1 GB/s, for every kind


def hand_calibration(peak_1=1e10, peak_2=1.6e10, cores=2, models=None, fits=None) -> dict:
    fits = fits or {k: {"alpha_s": ALPHA_S, "beta_bytes_per_s": BETA} for k in alpha_beta.MEASURED}
    return {"key": "hand", "compute": {"cores": cores, "models": models or {},
                                       "peak_flops_per_s_by_threads": {"1": peak_1, "2": peak_2}},
            "collectives": fits}


def step_profile(strategy="ddp", world=2, flops=10**9, comm=None, samples=64) -> StepProfile:
    comm = comm or {}
    return StepProfile(strategy=strategy, world_size=world, held_bytes={}, peak_bytes=0, flops=flops,
                       samples=samples, comm_bytes={k: b for k, (b, _) in comm.items()},
                       comm_calls={k: c for k, (_, c) in comm.items()})
