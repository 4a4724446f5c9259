"""PNG plots (matplotlib, Agg): per-epoch curves per experiment and throughput bars per model.

Curves: one colour per configuration (strategy x world size); the thick line is the run's
value averaged over ranks (losses and accuracies are already global: all ranks reduced them),
thin lines are the individual ranks where ranks differ (epoch time, eval time, and the train
loss each rank computed on its own shard).
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


def experiment_curves(experiment: str, runs, path: Path) -> Path:
    panels = [p for p in PANELS if p[0] not in OPTIONAL or any(series(run, p[0])[0] for run in runs)]
    columns = (len(panels) + 1) // 2
    fig, axes = plt.subplots(2, columns, figsize=(13 * columns / 3, 7))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    colours, labelled = {}, set()
    for run in runs:
        colour = colours.setdefault(run.label, f"C{len(colours) % 10}")
        for i, (ax, (key, title)) in enumerate(zip(axes.flat, panels)):
            avg, per_rank = series(run, key)
            for p in per_rank:
                ax.plot([e + 1 for e in sorted(p)], [p[e] for e in sorted(p)], color=colour, lw=0.8, alpha=0.4)
            if avg:
                xs = sorted(avg)
                first = (i, run.label) not in labelled  # repeats of a configuration share one legend entry
                labelled.add((i, run.label))
                ax.plot([e + 1 for e in xs], [avg[e] for e in xs], color=colour, lw=2, marker="o", ms=3,
                        label=run.label if first else None)
    for ax, (_, title) in zip(axes.flat, panels):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"{experiment}: thick = averaged over ranks, thin = each rank", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def throughput_bars(model: str, rows, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows) + 2), 4))
    labels = [f"{r['strategy']} x{r['world_size']}\nbatch {r['global_batch']}" for r in rows]
    values = [r["samples_per_s"] or 0 for r in rows]
    bars = ax.bar(range(len(rows)), values, color=[f"C{i % 10}" for i in range(len(rows))])
    for bar, r in zip(bars, rows):
        if r["speedup"] is not None:
            ax.annotate(f"x{r['speedup']:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("samples/s (global)")
    ax.set_title(f"{model}: throughput (labels: speed-up over {'single'})", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
