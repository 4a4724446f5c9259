"""The comparison tables, as lists of rows (dicts of raw numbers; formatting is ``analysis.render``).

- throughput: one row per configuration (experiment, arm, strategy, world size), repeats averaged.
  speed-up = samples/s / the baseline's samples/s, where the baseline is strategy ``single``
  on the same experiment (same model, data, optimizer, training, so the same global batch);
  scaling efficiency = speed-up / world size.
- time to target: the first epoch whose val metric (train metric when there is no evaluation)
  reaches the target; time = rank 0's training time summed up to and including that epoch.
- verdicts: each configuration against its baseline, per metric (NOISE_RULE).
- MFU: the runs' mean; its header names the peak's source ("MFU (measured peak)": run_record's
  PEAK_LABELS) when the table's rows share one, else each cell does.
- cost: device-hours = devices x run wall time (start to finish), priced from prices.yaml.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from suite.record import run_record

BASELINE = "single"

# metric: (better when, noise floor kind, floor)
NOISE = {"accuracy": ("higher", "absolute", 0.005), "loss": ("lower", "relative", 0.01),
         "time": ("lower", "relative", 0.05), "miou": ("higher", "absolute", 0.005)}
NOISE_RULE = (
    "A configuration is 'unchanged' on a metric when |its mean - the baseline's mean| <= the noise "
    "band, else 'better' or 'worse' (accuracy, mean IoU: higher is better; loss and time: lower is better). "
    "Noise band = max(floor, 2 x the standard error of the difference of means); the standard error "
    "counts only when both sides have >= 2 repeats. Floors: accuracy and mean IoU 0.005 absolute, loss 1% "
    "of the baseline, time per epoch 5% of the baseline. Metrics: final val accuracy and val loss (train "
    "ones when a run has no evaluation), val mean IoU (segmentation; n/a otherwise), mean training "
    "time per epoch.")


@dataclass
class Config:
    experiment: str
    strategy: str
    world_size: int
    arm: str | None = None  # the study arm (``Run.arm``); None outside studies
    runs: list = field(default_factory=list)

    @property
    def first(self):
        return self.runs[0]

    @property
    def label(self) -> str:
        return self.first.label


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def std(values):
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def configs(runs) -> list[Config]:
    groups: dict = {}
    for r in runs:
        key = (r.experiment, r.strategy, r.world_size, r.arm)
        groups.setdefault(key, Config(*key)).runs.append(r)
    return sorted(groups.values(),
                  key=lambda c: (c.experiment, c.world_size, c.strategy != BASELINE, c.strategy, c.arm or ""))


def baseline_of(config: Config, all_configs) -> Config | None:
    for c in all_configs:
        if c.experiment == config.experiment and c.strategy == BASELINE:
            return c
    return None


def final_metric(run, metric: str):
    final = run.summary.get("final", {})
    if metric == "time":
        times = run.summary["epoch_time_s"]
        return sum(times) / len(times) if times else None
    return final.get(f"val_{metric}", final.get(f"train_{metric}"))


def per_rank(run, key: str) -> list:
    return [r.get(key) for r in sorted(run.summary["ranks"], key=lambda r: r.get("rank", 0))]


def held_total(held) -> int | None:
    return sum(v for v in held.values() if isinstance(v, (int, float))) if isinstance(held, dict) else held


def utilisation(run):
    """(mean over ranks of the sampler's mean, what was sampled), or (None, None)."""
    ranks = run.summary["ranks"]
    for key, device in (("gpu_util_percent_mean", "gpu"), ("cpu_percent_mean", "cpu")):
        values = [r.get(key) for r in ranks if r.get(key) is not None]
        if values:
            return sum(values) / len(values), device
    return None, None


def peak_source(runs) -> str | None:
    """Where the peak MFU divides by came from (suite.record.peak), if the runs agree and say."""
    sources = {r.summary.get("peak_flops_source") for r in runs if r.summary.get("mfu") is not None}
    return sources.pop() if len(sources) == 1 else None


def mfu_label(rows) -> str:
    """The MFU column's header: 'MFU (measured peak)' when the rows' peaks share a known source."""
    sources = {row.get("peak_source") for row in rows if row.get("mfu") is not None}
    label = run_record.PEAK_LABELS.get(sources.pop()) if len(sources) == 1 else None
    return f"MFU ({label})" if label else "MFU"


def throughput_rows(all_configs) -> list[dict]:
    rows = []
    for c in all_configs:
        s0 = c.first.summary
        sps = mean(r.summary["samples_per_s"] for r in c.runs)
        base = baseline_of(c, all_configs)
        base_sps = mean(r.summary["samples_per_s"] for r in base.runs) if base else None
        speedup = sps / base_sps if (sps and base_sps) else None
        n_ranks = len(s0["ranks"])
        rank_mean = lambda key: [mean(per_rank(r, key)[i] for r in c.runs) for i in range(n_ranks)]  # noqa: E731
        util, device = zip(*(utilisation(r) for r in c.runs))
        rows.append({
            "model": s0["model"], "data": s0.get("data"), "experiment": c.experiment, "arm": c.arm,
            "strategy": c.strategy, "world_size": c.world_size, "global_batch": s0["global_batch"], "runs": len(c.runs),
            "samples_per_s": sps, "samples_per_s_std": std(r.summary["samples_per_s"] for r in c.runs),
            "tokens_per_s": mean(r.summary.get("tokens_per_s") for r in c.runs),
            "speedup": speedup, "scaling_efficiency": speedup / c.world_size if speedup else None,
            "utilisation_percent": mean(util), "utilisation_device": next((d for d in device if d), None),
            "peak_memory_bytes_per_rank": rank_mean("peak_memory_bytes"),
            "held_bytes_per_rank": [mean(held_total(per_rank(r, "held_bytes")[i]) for r in c.runs) for i in range(n_ranks)],
            "achieved_flops_per_s": mean(r.summary.get("achieved_flops_per_s") for r in c.runs),
            "mfu": mean(r.summary.get("mfu") for r in c.runs),
            "peak_flops_per_s": mean(r.summary.get("peak_flops_per_s") for r in c.runs),
            "peak_source": peak_source(c.runs),
            "oversubscribed": any(r.summary.get("oversubscribed") for r in c.runs),
        })
    return rows


def time_to_target_rows(runs, target_accuracy=None, target_loss=None) -> list[dict]:
    rows = []
    for r in runs:
        epochs = sorted(r.epochs.get(0, []), key=lambda e: e["epoch"])
        for metric, target, reached in (("accuracy", target_accuracy, lambda v, t: v >= t),
                                        ("loss", target_loss, lambda v, t: v <= t)):
            if target is None:
                continue
            row = {"experiment": r.experiment, "arm": r.arm, "strategy": r.strategy, "world_size": r.world_size,
                   "run_id": r.run_id, "metric": metric, "target": target, "reached": False,
                   "epochs": None, "time_s": None, "value": None}
            elapsed = 0.0
            for e in epochs:
                elapsed += e.get("epoch_time_s", 0.0)
                value = e.get(f"val_{metric}", e.get(f"train_{metric}"))
                if value is not None and reached(value, target):
                    row.update(reached=True, epochs=e["epoch"] + 1, time_s=elapsed, value=value)
                    break
            rows.append(row)
    return rows


def verdict(metric: str, values: list, base_values: list) -> tuple[str, float | None, float | None]:
    """(verdict, difference of means, noise band) for one metric, following NOISE_RULE."""
    better, kind, floor = NOISE[metric]
    m, b = mean(values), mean(base_values)
    if m is None or b is None:
        return "n/a", None, None
    band = floor * abs(b) if kind == "relative" else floor
    s, sb = std(values), std(base_values)
    if s is not None and sb is not None:
        band = max(band, 2 * math.sqrt(s ** 2 / len(values) + sb ** 2 / len(base_values)))
    diff = m - b
    if abs(diff) <= band:
        return "unchanged", diff, band
    improved = diff > 0 if better == "higher" else diff < 0
    return ("better" if improved else "worse"), diff, band


def verdict_rows(all_configs) -> list[dict]:
    rows = []
    for c in all_configs:
        base = baseline_of(c, all_configs)
        if base is None or base is c:
            continue
        row = {"experiment": c.experiment, "arm": c.arm, "strategy": c.strategy, "world_size": c.world_size}
        for metric in NOISE:
            v, diff, band = verdict(metric, [final_metric(r, metric) for r in c.runs],
                                    [final_metric(r, metric) for r in base.runs])
            row.update({metric: v, f"{metric}_diff": diff, f"{metric}_noise": band})
        rows.append(row)
    return rows


def cost_rows(runs, prices: dict) -> list[dict]:
    rows = []
    for r in runs:
        s = r.summary
        wall_s = (s.get("finished_at") or 0) - (s.get("started_at") or 0)
        launch = r.recipe.get("launch") or {}
        name = (s["ranks"][0].get("device_name") or s.get("device") or "cpu")
        if s.get("device") == "cuda":
            devices, unit = s["world_size"] * int(launch.get("devices_per_task", 1)), f"GPU ({name})"
            price = next((p for k, p in (prices.get("gpu") or {}).items() if k.lower() in name.lower()), None)
        else:
            devices, unit, price = int(launch.get("nodes", 1)), "CPU node", prices.get("cpu_node")
        hours = devices * wall_s / 3600
        rows.append({"experiment": r.experiment, "arm": r.arm, "strategy": r.strategy, "world_size": r.world_size,
                     "run_id": r.run_id, "device": unit, "devices": devices, "wall_time_s": wall_s,
                     "device_hours": hours, "price_per_device_hour": price,
                     "cost": hours * price if price is not None else None,
                     "currency": prices.get("currency", "")})
    return rows


def by_model(rows) -> dict:
    out = defaultdict(list)
    for row in rows:
        out[row["model"]].append(row)
    return dict(out)


def relative_error(predicted, measured):
    """predicted / measured - 1 (+0.10: predicted 10 % high), None when either is missing."""
    return predicted / measured - 1 if predicted and measured else None


def prediction_rows(runs) -> list[dict]:
    """The planner's prediction (summary ``predicted``, ``suite.planner.predict``) beside what the run
    measured: held bytes and peak memory of the rank that had most, median step time, samples/s."""
    rows = []
    for r in runs:
        s, p = r.summary, r.summary.get("predicted")
        if not p:
            continue
        ranks = s.get("ranks") or []
        # The peak the planner predicts: the bytes allocated from the model build on
        # (suite.record.allocated); older runs have only the resident set above start, or the whole one.
        peak_key = next((k for k in ("peak_allocated_bytes", "peak_memory_above_start_bytes")
                         if any(x.get(k) is not None for x in ranks)), "peak_memory_bytes")
        measured = {"held": max((held_total(x.get("held_bytes")) or 0 for x in ranks), default=None),
                    "peak": max((x.get(peak_key) or 0 for x in ranks), default=None),
                    "step": s.get("step_time_s"), "rate": s.get("samples_per_s")}
        predicted = {"held": held_total(p.get("held_bytes")), "peak": p.get("peak_bytes"),
                     "step": p.get("step_time_s"), "rate": p.get("samples_per_s")}
        row = {"experiment": r.experiment, "strategy": r.strategy, "world_size": r.world_size, "run_id": r.run_id,
               "source": p.get("source") or p.get("error")}
        for k in measured:
            row.update({f"{k}_predicted": predicted[k], f"{k}_measured": measured[k],
                        f"{k}_error": relative_error(predicted[k], measured[k])})
        rows.append(row)
    return rows
