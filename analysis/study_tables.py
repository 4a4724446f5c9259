"""Two more tables of a study's report (``python -m suite.study``), beside "published vs ours":

- **Verdicts**: ``reference.verdicts`` holds the source's own verdict matrix (improves / same /
  worse per model and metric, as the six-models slides print it); each row names the arm of ours
  it is set beside, and ours is that arm against its baseline arm by ``tables.verdict`` (the
  report's noise rule: ``tables.NOISE_RULE``). A row's ``why`` (with ``why_source`` or
  ``assumption: true``, as a figure's) says where our setup differs.
- **Epochs to threshold**: the study's ``thresholds`` (``{metric: [values]}``, e.g.
  ``{train_accuracy: [0.5, 0.8]}``) gives, per arm and threshold, the first epoch whose metric
  reaches it (accuracy: at or above; loss: at or below), mean over the repeats that reached it.

Torch-free.
"""
from __future__ import annotations

from analysis import tables
from suite.common.errors import SuiteError

VERDICT_METRICS = ("accuracy", "loss", "time")  # the slides' columns, as tables.NOISE names them
VERDICT_WORDS = ("improves", "same", "worse", "not listed")
OURS_WORD = {"better": "improves", "unchanged": "same", "worse": "worse", "n/a": "n/a (not measured)"}
THRESHOLD_METRICS = ("train_accuracy", "val_accuracy", "train_loss", "val_loss")


def check_verdicts(verdicts, arms, where: str = "reference.verdicts") -> None:
    """Refuse a malformed verdict matrix with one line naming the key."""
    if not isinstance(verdicts, list) or not verdicts:
        raise SuiteError(f"{where} must be a list of {{published, ours, source, accuracy, loss, time}}")
    allowed = {"published", "ours", "source", "why", "why_source", "assumption", *VERDICT_METRICS}
    for i, row in enumerate(verdicts):
        at = f"{where}.{i}"
        if not isinstance(row, dict) or set(row) - allowed:
            extra = sorted(set(row) - allowed) if isinstance(row, dict) else [row]
            raise SuiteError(f"{at}: unknown {extra[0]!r}; accepted here: {', '.join(sorted(allowed))}")
        for key in ("published", "ours", "source"):
            if not row.get(key):
                raise SuiteError(f"{at}.{key} is required (published: the model as the source names it; ours: "
                                 f"our arm; source: the reference-table row of docs/studies.md)")
        if row["ours"] not in arms:
            raise SuiteError(f"{at}.ours={row['ours']!r} is not an arm of the study; arms: {', '.join(arms)}")
        if row.get("why") and row.get("why_source") is None and row.get("assumption") is not True:
            raise SuiteError(f"{at}.why needs why_source (the reference-table rows it rests on) or assumption: true")
        for metric in VERDICT_METRICS:
            if row.get(metric, "not listed") not in VERDICT_WORDS:
                raise SuiteError(f"{at}.{metric}={row[metric]!r}: use one of {', '.join(VERDICT_WORDS)}")


def because(row: dict) -> str:
    """A verdict's ``why``, labelled as the figures' are: its reference-table rows, or ours."""
    if not row.get("why"):
        return ""
    sources = row.get("why_source")
    labels = ([f"source: {', '.join(sources if isinstance(sources, list) else [sources])}"] if sources else []) + \
        (["our assumption"] if row.get("assumption") else [])
    return f"{row['why']} [{'; '.join(labels)}]"


def verdict_rows(study: dict, runs, base_of: dict) -> list[dict]:
    """One row per published verdict: the source's word beside ours, per metric."""
    rows = []
    for v in study["reference"].get("verdicts") or []:
        arm, base = v["ours"], base_of.get(v["ours"])
        row = {"published": v["published"], "ours_arm": f"{arm} vs {base}", "source": v["source"],
               "because": because(v)}
        mine = [r for r in runs if r.arm == arm]
        theirs = [r for r in runs if r.arm == base]
        for metric in VERDICT_METRICS:
            row[f"{metric}_published"] = v.get(metric, "not listed")
            if not mine or not theirs:
                row[f"{metric}_ours"] = f"no completed run of {arm if not mine else base}"
                continue
            word, _, _ = tables.verdict(metric, [tables.final_metric(r, metric) for r in mine],
                                        [tables.final_metric(r, metric) for r in theirs])
            row[f"{metric}_ours"] = OURS_WORD[word]
        rows.append(row)
    return rows


VERDICT_COLUMNS = {"published": "published model", "ours_arm": "our arm vs its baseline",
                   **{f"{m}_{side}": f"{m} ({'source' if side == 'published' else 'ours'})"
                      for m in VERDICT_METRICS for side in ("published", "ours")},
                   "source": "source (docs/studies.md)", "because": "differs because"}


def check_thresholds(thresholds, where: str = "thresholds") -> dict:
    """``{metric: [values]}``, checked."""
    if not isinstance(thresholds, dict) or not thresholds:
        raise SuiteError(f"{where} must map a metric ({', '.join(THRESHOLD_METRICS)}) to a list of values, "
                         f"e.g. thresholds: {{train_accuracy: [0.5, 0.8]}}")
    for metric, values in thresholds.items():
        if metric not in THRESHOLD_METRICS:
            raise SuiteError(f"{where}.{metric}: not a metric here; use one of {', '.join(THRESHOLD_METRICS)}")
        if (not isinstance(values, list) or not values
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values)):
            raise SuiteError(f"{where}.{metric}={values!r} must be a non-empty list of numbers, e.g. [0.5, 0.8]")
    return thresholds


def _first_epoch(run, metric: str, threshold: float):
    """(epochs, seconds of training) until the metric first reaches the threshold, or None."""
    elapsed = 0.0
    for e in sorted(run.epochs.get(0, []), key=lambda e: e["epoch"]):
        elapsed += e.get("epoch_time_s") or 0.0
        value = e.get(metric)
        if value is not None and (value >= threshold if metric.endswith("accuracy") else value <= threshold):
            return e["epoch"] + 1, elapsed
    return None


def threshold_rows(study: dict, runs) -> list[dict]:
    """Per arm, metric and threshold: epochs (and training time) to reach it, over the arm's repeats."""
    rows = []
    for metric, values in (study.get("thresholds") or {}).items():
        for arm in study["arms"]:
            mine = [r for r in runs if r.arm == arm]
            if not mine:
                continue
            trained = max(len(r.epochs.get(0, [])) for r in mine)
            for threshold in values:
                hits = [h for h in (_first_epoch(r, metric, threshold) for r in mine) if h is not None]
                row = {"arm": arm, "metric": metric, "threshold": threshold,
                       "reached": f"{len(hits)} of {len(mine)} run(s)",
                       "epochs": "", "time_s": ""}
                if hits:
                    row["epochs"] = f"{tables.mean([h[0] for h in hits]):.3g}"
                    row["time_s"] = f"{tables.mean([h[1] for h in hits]):.3g}"
                else:
                    row["epochs"] = f"not reached in {trained}"
                rows.append(row)
    return rows


THRESHOLD_COLUMNS = {"arm": "arm", "metric": "metric", "threshold": "threshold", "reached": "reached by",
                     "epochs": "epochs to reach it (mean of those that did)", "time_s": "training time to it (s)"}
THRESHOLD_NOTE = ("The first epoch whose metric reaches the threshold (accuracy: at or above; loss: at or below), "
                  "rank 0's per-epoch record; time is the training time of the epochs up to it, evaluation excluded.")


def cost_rows(study: dict, costs: list[dict], base_of: dict) -> list[dict]:
    """Per arm (a study with ``prices``): mean device-hours and cost over its repeats (the report's
    per-run cost rows, ``tables.cost_rows``), and the cost against its baseline arm's."""
    by_arm: dict = {}
    for row in costs:
        by_arm.setdefault(row["arm"], []).append(row)
    mean_cost = {arm: (tables.mean([r["cost"] for r in rows]) if all(r["cost"] is not None for r in rows) else None)
                 for arm, rows in by_arm.items()}
    out = []
    for arm in study["arms"]:
        rows = by_arm.get(arm)
        if not rows:
            continue
        base = mean_cost.get(base_of.get(arm))
        out.append({"arm": arm, "runs": len(rows), "device": rows[0]["device"],
                    "price_per_device_hour": rows[0]["price_per_device_hour"],
                    "wall_time_s": tables.mean([r["wall_time_s"] for r in rows]),
                    "device_hours": tables.mean([r["device_hours"] for r in rows]), "cost": mean_cost[arm],
                    "currency": rows[0]["currency"], "baseline": base_of.get(arm),
                    "cost_vs_baseline": (mean_cost[arm] / base) if mean_cost[arm] is not None and base else None})
    return out


COST_COLUMNS = {"arm": "arm", "runs": "runs", "device": "priced as", "price_per_device_hour": "price / device-hour",
                "wall_time_s": "wall time (s, mean)", "device_hours": "device-hours (mean)", "cost": "cost (mean)",
                "currency": "currency", "baseline": "baseline arm", "cost_vs_baseline": "cost / baseline's"}
