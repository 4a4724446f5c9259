"""How far apart two predictions must be before their order means something.

The time model's error is not the same for every strategy: on the suite's own benchmark
(``benchmarks/compare.py --only predict``, 14 sets of runs on a 2-core CPU VM), of the pairs of
strategies of one model and world predicted under 10 % apart, 84 of 236 ran in the other order;
of those predicted 30 % or more apart, 3 of 1,295. The advisor therefore marks a configuration whose
predicted throughput lies within a *band* of a better-ranked one as not settled against it.

The band is the median, over pairs of runs of one model, data, batch and world on this host's
calibration, of how much further one run's prediction was off than the other's
(``|log(p_a/m_a) - log(p_b/m_b)|``, p predicted, m measured): what the ratio of two predictions
may be off by. It comes from the runs a user has made (every run records its own prediction
beside what it measured: ``summary.json`` ``predicted.step_time_s`` and ``step_time_s``;
``--verify`` adds to them), else from the benchmark's runs (``DEFAULT_BAND``), and the advice says which.
"""
from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path

import yaml

# The median of that pairwise error over 1,960 pairs of runs in the 14 stored sets of the predict
# benchmark on the 2-core VM (benchmarks/README.md), each set's own median 7-22 %.
DEFAULT_BAND = 0.11
MIN_PAIRS = 5  # fewer pairs of the user's own runs say little: the default stands
MAX_RUNS = 400  # the newest runs: the machine and the time model as they are now


def _group(run: Path, summary: dict) -> str | None:
    """What two runs must share for their predictions to be compared: the model, the data, the
    batch, the world, the precision and the device (the strategy may differ)."""
    try:
        recipe = yaml.safe_load((run / "recipe.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    return json.dumps([recipe.get("model"), recipe.get("data"), summary.get("world_size"), summary.get("global_batch"),
                       summary.get("precision"), summary.get("device")], sort_keys=True, default=str)


def recorded_errors(runs: Path, calibration_key: str | None) -> dict[str, list[float]]:
    """log(predicted / measured) step time of the newest ``MAX_RUNS`` runs under ``runs`` whose
    prediction was made on the calibration ``calibration_key``, grouped by ``_group``."""
    found = []
    for path in Path(runs).rglob("summary.json") if Path(runs).is_dir() else []:
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:
            continue
    groups: dict[str, list[float]] = {}
    for _, path in sorted(found, reverse=True)[:MAX_RUNS]:
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        predicted = summary.get("predicted") or {}
        p, m = predicted.get("step_time_s"), summary.get("step_time_s")
        if not (isinstance(p, (int, float)) and isinstance(m, (int, float)) and p > 0 and m > 0):
            continue
        if calibration_key is None or predicted.get("calibration") != calibration_key:
            continue
        if (key := _group(path.parent, summary)) is not None:
            groups.setdefault(key, []).append(math.log(p / m))
    return groups


def band(runs: Path, profile: dict) -> tuple[float, str]:
    """The band (a fraction of throughput) and where it comes from, in words (without the figure)."""
    if profile.get("from_specs"):
        return DEFAULT_BAND, "the suite's own benchmark on a 2-core CPU VM, not measured on this hardware"
    groups = recorded_errors(runs, profile.get("key"))
    pairs = [abs(a - b) for errors in groups.values() for a, b in itertools.combinations(errors, 2)]
    if len(pairs) < MIN_PAIRS:
        return DEFAULT_BAND, (f"the suite's own benchmark on a 2-core CPU VM; {len(pairs)} pair(s) of runs of one model "
                              f"under {runs}/ on this calibration are too few to measure it here (--verify adds some)")
    measured = math.exp(statistics.median(pairs)) - 1
    runs_used = sum(len(e) for e in groups.values())
    return measured, (f"measured: the median pairwise error of {runs_used} recorded runs under {runs}/ on this "
                      f"calibration ({len(pairs)} pairs of one model and world)")


def not_settled(rates: list[float], within: float) -> list[int | None]:
    """For each configuration (ranked best first by ``rates``, samples/s), the best-ranked one
    (0-based) whose rate it comes within ``within`` of, if that is another: their order is not
    settled by the time model; None where every better one is clear of it."""
    out: list[int | None] = []
    for i, rate in enumerate(rates):
        j = next((j for j in range(i) if rates[j] <= rate * (1 + within)), None)
        out.append(j)
    return out
