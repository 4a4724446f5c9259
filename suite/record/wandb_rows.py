"""Run-record records as W&B data, without importing wandb: history rows, config, names, summary.

One W&B run per job holds every rank's records. A row per training step (W&B step = the step):
- ``<kind>/<field>``: rank 0's ``step`` and ``epoch`` records (the job's loss, lr, epoch results);
- ``rank<N>/<kind>/<field>``: each rank's own fields (its loss, step time, utilisation, ...);
  fields every rank records alike (``SHARED``) are not repeated per rank, so a 1,024-rank job
  keeps to ~10 keys a rank.
A record without a step of its own (utilisation, balance) joins the row of its rank's last step
(readings within one step share that row: the last wins; the run record keeps them all).
Used alike by the live writer (``suite.record.wandb_live``) and the export from the record
(``suite.record.wandb_export``), so a run logged live and one exported afterwards look the same.
"""
from __future__ import annotations

from pathlib import Path

from suite.record import run_record

# The same on every rank: logged once, under <kind>/<field>, from rank 0.
SHARED = frozenset({"step", "epoch", "attempt", "global_loss", "lr", "grad_norm"})
# The run-wide summary fields copied from summary.json into the W&B run's summary.
SUMMARY_KEYS = ("status", "steps", "samples", "samples_per_s", "tokens_per_s", "step_time_s", "train_time_s",
                "achieved_flops_per_s", "peak_flops_per_s", "mfu", "world_size", "strategy")
# Per rank, from summary.json's ranks: rank<N>/<key>.
RANK_SUMMARY_KEYS = ("peak_memory_bytes", "held_bytes", "step_time_s", "samples_per_s", "compute_s", "collective_s",
                     "cpu_percent_mean", "rss_bytes_peak", "gpu_util_percent_mean", "gpu_memory_used_bytes_peak")
# History keys and what W&B's summary keeps of them (W&B's globs are suffixes only: the per-rank
# peaks and medians come from summary.json instead, see run_summary).
DEFINED = {"step/global_loss": "min,last", "step/step_time_s": "mean", "epoch/train_loss": "min,last",
           "epoch/val_loss": "min,last", "epoch/val_accuracy": "max,last", "epoch/epoch_time_s": "mean"}


def scalars(fields: dict, prefix: str = "") -> dict:
    """Flatten nested dicts to ``a.b`` keys; keep numbers, strings and booleans."""
    out = {}
    for k, v in fields.items():
        if isinstance(v, dict):
            out.update(scalars(v, f"{prefix}{k}."))
        elif v is None or isinstance(v, (int, float, str, bool)):
            out[f"{prefix}{k}"] = v
    return out


class Rows:
    """Records in, W&B rows out, in step order. A step's row is given out once every rank of the
    world has recorded a later step (ranks write a step's records at about the same time, after
    the loop's reduction), so a late rank's fields still reach it: W&B drops a row logged at a
    step below one it has. ``drain(everything=True)`` gives out the rest (the job's end)."""

    def __init__(self, world_size: int, first_step: int = 0):
        self.world_size, self.first_step = world_size, first_step  # a resumed attempt's: its checkpoint's
        self._rows: dict[int, dict] = {}
        self._rank_step: dict[int, int] = {}
        self.summaries: dict[int, dict] = {}  # rank -> its summary record

    def add(self, rec: dict) -> None:
        kind, rank = rec.get("kind", "record"), int(rec.get("rank", 0))
        fields = scalars({k: v for k, v in rec.items() if k not in ("kind", "rank")})
        if kind == "summary":
            self.summaries[rank] = fields
            return
        if kind == "step" and isinstance(fields.get("step"), int):
            self._rank_step[rank] = fields["step"]
        row = self._rows.setdefault(self._rank_step.get(rank, self.first_step), {})
        if rank == 0 and kind in ("step", "epoch"):
            row.update({f"{kind}/{k}": v for k, v in fields.items()})
        row.update({f"rank{rank}/{kind}/{k}": v for k, v in fields.items() if k not in SHARED})

    def drain(self, everything: bool = False) -> list[tuple[int, dict]]:
        """(step, row) pairs that are complete, in step order, each given out once."""
        if everything:
            through = max(self._rows, default=-1)
        else:
            through = min((self._rank_step.get(r, -1) for r in range(self.world_size)), default=-1) - 1
        out = [(s, self._rows.pop(s)) for s in sorted(s for s in self._rows if s <= through)]
        return [(s, row) for s, row in out if row]


def run_summary(run_dir: Path, rows: Rows) -> dict:
    """The W&B summary: summary.json's run-wide results, final losses and each rank's peaks and
    medians (``rank<N>/...``); for a run with no summary.json yet, the ranks' summary records."""
    path = run_record.summary_path(run_dir)
    try:
        summary = run_record.read_json(path) if path.exists() else {}
    except ValueError:
        summary = {}
    out = {k: summary[k] for k in SUMMARY_KEYS if summary.get(k) is not None}
    out.update({f"final/{k}": v for k, v in (summary.get("final") or {}).items()})
    ranks = summary.get("ranks") or [{"rank": r, **s} for r, s in sorted(rows.summaries.items())]
    for entry in ranks:
        if isinstance(entry, dict):
            out.update({f"rank{entry.get('rank', 0)}/{k}": entry[k] for k in RANK_SUMMARY_KEYS
                        if isinstance(entry.get(k), (int, float))})
    return out


def names(recipe: dict, run_id: str) -> dict:
    """W&B's group, job type, tags and name for the job: grouped by study or sweep
    (``tracking.wandb_group``, set by ``suite.study`` and sweeps), else by the recipe's name."""
    tracking = recipe.get("tracking") or {}
    strategy = (recipe.get("strategy") or {}).get("name", "?")
    launch = recipe.get("launch") or {}
    world = int(launch.get("nodes", 1)) * int(launch.get("tasks_per_node", 1))
    arm = recipe.get("arm")
    tags = [f"strategy:{strategy}", f"world:{world}"] + ([f"arm:{arm}"] if arm else [])
    return {"group": tracking.get("wandb_group") or recipe.get("name") or run_id,
            "job_type": arm or strategy, "tags": tags,
            "name": f"{recipe.get('name') or run_id} {strategy} x{world}"}


def config(recipe: dict, run_id: str) -> dict:
    """The resolved recipe, flattened (``training.batch_size``), so W&B's group-by and filters work."""
    launch = recipe.get("launch") or {}
    return {**scalars({k: v for k, v in recipe.items() if k != "sweep"}), "run_id": run_id,
            "world_size": int(launch.get("nodes", 1)) * int(launch.get("tasks_per_node", 1))}
