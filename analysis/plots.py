"""PNG plots (matplotlib, Agg): per-epoch and per-step curves per experiment, throughput bars per model.

Curves: one colour per configuration (arm, strategy x world size); the thick line is the run's
value averaged over ranks (losses and accuracies are already global: all ranks reduced them),
thin lines are the individual ranks where ranks differ (epoch time, eval time, and the train
loss each rank computed on its own shard). Repeats of a configuration (seeds) are drawn as their
mean with a band from their minimum to their maximum.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

PANELS = [("train_loss", "train loss"), ("val_loss", "val loss"), ("train_accuracy", "train accuracy"),
          ("val_accuracy", "val accuracy"), ("epoch_time_s", "training time per epoch (s)"),
          ("eval_time_s", "evaluation time (s)"), ("val_miou", "val mean IoU")]
OPTIONAL = {"val_miou"}  # drawn only when a run of the experiment has it (segmentation)


def rank_train_loss(run, rank: int) -> dict:
    """epoch -> mean of the loss this rank computed on its own samples."""
    per_epoch = defaultdict(list)
    for s in run.steps.get(rank, []):
        if s.get("loss") is not None:
            per_epoch[s["epoch"]].append(s["loss"])
    return {e: sum(v) / len(v) for e, v in per_epoch.items()}


def series(run, key: str):
    """(averaged: {epoch: value}, per rank: [{epoch: value}, ...])."""
    ranks = sorted(run.epochs)
    if key == "train_loss":
        per_rank = [rank_train_loss(run, k) for k in ranks] if len(ranks) > 1 else []
    elif key in ("epoch_time_s", "eval_time_s"):
        per_rank = [{e["epoch"]: e[key] for e in run.epochs[k] if e.get(key) is not None} for k in ranks]
    else:
        per_rank = []
    if key in ("epoch_time_s", "eval_time_s") and per_rank:
        epochs = sorted(set().union(*per_rank))
        avg = {e: sum(p[e] for p in per_rank if e in p) / sum(e in p for p in per_rank) for e in epochs}
    else:
        avg = {e["epoch"]: e[key] for e in run.epochs.get(0, []) if e.get(key) is not None}
    return avg, (per_rank if len(per_rank) > 1 else [])


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def decorate(ax, title: str, xlabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def by_label(runs) -> dict:
    """label -> the runs (repeats) of that configuration, in order of first appearance."""
    groups: dict = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def mean_and_band(curves: list[dict]):
    """Repeats' curves ({x: value}) -> (xs, mean, min, max) over the x every repeat has."""
    xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    values = [[c[x] for c in curves] for x in xs]
    return xs, [sum(v) / len(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot_repeats(ax, curves: list[dict], colour: str, label: str, x_offset: int = 0, marker=None) -> None:
    """The mean of the repeats as a line and, with two or more repeats, their min-max as a band."""
    xs, avg, low, high = mean_and_band([c for c in curves if c])
    if not xs:
        return
    xs = [x + x_offset for x in xs]
    n = len([c for c in curves if c])
    ax.plot(xs, avg, color=colour, lw=2 if marker else 1.2, marker=marker, ms=3,
            label=f"{label} ({n} repeats)" if n > 1 else label)
    if n > 1:
        ax.fill_between(xs, low, high, color=colour, alpha=0.2, lw=0)


def title_names(experiment: str, groups: dict) -> str:
    return f"{experiment} [{', '.join(groups)}]"


def experiment_curves(experiment: str, runs, path: Path) -> Path:
    """Per-epoch panels of one experiment: per configuration (arm) the mean over its repeats with a
    min-max band; thin lines are each rank when the configuration ran once."""
    panels = [p for p in PANELS if p[0] not in OPTIONAL or any(series(run, p[0])[0] for run in runs)]
    columns = (len(panels) + 1) // 2
    fig, axes = plt.subplots(2, columns, figsize=(13 * columns / 3, 7))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    groups = by_label(runs)
    for n, (label, members) in enumerate(groups.items()):
        colour = f"C{n % 10}"
        for ax, (key, _) in zip(axes.flat, panels):
            averaged = [series(run, key) for run in members]
            if len(members) == 1:
                for p in averaged[0][1]:
                    ax.plot([e + 1 for e in sorted(p)], [p[e] for e in sorted(p)], color=colour, lw=0.8, alpha=0.4)
            plot_repeats(ax, [avg for avg, _ in averaged], colour, label, x_offset=1, marker="o")
    for ax, (_, title) in zip(axes.flat, panels):
        decorate(ax, title, "epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{title_names(experiment, groups)}\nthick = mean over repeats (band: min-max of repeats), "
                 "thin = each rank of a single run", fontsize=10)
    return save(fig, path)


def step_losses(run) -> dict:
    """step -> the global train loss (all ranks reduced, as rank 0 recorded it)."""
    return {s["step"]: s["global_loss"] for s in run.steps.get(0, []) if s.get("global_loss") is not None}


def step_curves(experiment: str, runs, path: Path) -> Path:
    """The train loss of every optimizer step, per configuration (arm): mean over repeats, band min-max."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    groups = by_label(runs)
    for n, (label, members) in enumerate(groups.items()):
        plot_repeats(ax, [step_losses(run) for run in members], f"C{n % 10}", label, x_offset=1)
    decorate(ax, f"{title_names(experiment, groups)}\nloss per step: line = mean over repeats, band = min-max "
             "of repeats", "optimizer step")
    ax.set_ylabel("train loss (global batch)")
    return save(fig, path)


def throughput_bars(model: str, rows, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows) + 2), 4))
    experiments = list(dict.fromkeys(r["experiment"] for r in rows))
    labels = [(f"{r['arm']}\n" if r.get("arm") else "") + f"{r['strategy']} x{r['world_size']}\nbatch {r['global_batch']}"
              + (f"\n{r['experiment']}" if len(experiments) > 1 else "") for r in rows]
    values = [r["samples_per_s"] or 0 for r in rows]
    bars = ax.bar(range(len(rows)), values, color=[f"C{i % 10}" for i in range(len(rows))])
    for bar, r in zip(bars, rows):
        if r["speedup"] is not None:
            ax.annotate(f"x{r['speedup']:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("samples/s (global)")
    ax.set_title(f"{model}: throughput of {', '.join(experiments)}\n(labels: speed-up over single, same experiment)",
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path)
