"""Find and read run records (``summary.json``, ``metrics.jsonl``, ``recipe.yaml``) through
``suite.record.run_record`` (the one reader of that format, torch-free); never torch.

A folder may hold runs copied from several machines, at any depth. A run that cannot be
compared is *skipped* with a reason, never a crash: no, corrupt or foreign ``summary.json``, a
status other than completed, a missing or truncated ``metrics.jsonl``, an unreadable recipe, or
a ``recipe_fingerprint`` that differs from the other runs of its group. Groups are experiments
(``Run.experiment``: same model, data, optimizer and training sections but the seed) x arm x
strategy x world size: repeats of one configuration (other seeds, or copies) must have trained the same thing.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from suite.record import run_record
from suite.record import status as run_status

RECORD_FILES = ("summary.json", "metrics.jsonl", "recipe.yaml")
_NEEDED = ("strategy", "model", "world_size", "global_batch", "samples_per_s", "epoch_time_s", "ranks")


@dataclass
class Skipped:
    path: Path
    reason: str


@dataclass
class Run:
    path: Path
    summary: dict
    recipe: dict
    epochs: dict = field(default_factory=dict)  # rank -> epoch records, in order
    steps: dict = field(default_factory=dict)  # rank -> step records, in order
    utilisation: dict = field(default_factory=dict)  # rank -> sampler readings

    @property
    def run_id(self) -> str:
        return self.summary.get("run_id") or self.path.name

    @property
    def strategy(self) -> str:
        return self.summary["strategy"]

    @property
    def world_size(self) -> int:
        return int(self.summary["world_size"])

    @property
    def arm(self) -> str | None:
        """The study arm the run belongs to (recipe key ``arm``, set by ``python -m suite.study``)."""
        return self.recipe.get("arm")

    @property
    def label(self) -> str:
        """How plots and tables name the configuration: its arm (if any), strategy and world size."""
        shape = f"{self.strategy} x{self.world_size}"
        return f"{self.arm}: {shape}" if self.arm else shape

    @property
    def seed(self):
        return (self.recipe.get("training") or {}).get("seed")

    @property
    def experiment(self) -> str:
        """Runs with equal model, data, optimizer and training sections train the same problem
        at the same global batch; only strategy and world size differ between them, and the seed
        between repeats."""
        part = {k: self.recipe.get(k) for k in ("model", "data", "optimizer", "training")}
        part["training"] = {k: v for k, v in (part["training"] or {}).items() if k not in ("log_every_steps", "seed")}
        digest = hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()[:8]
        return f"{self.summary['model']}-{self.summary.get('data', '?')}-b{self.summary['global_batch']}-{digest}"


def find_run_dirs(paths) -> list[Path]:
    """Every folder under ``paths`` holding one of the record files (W&B/submitit folders excluded,
    and the baselines ``suite.verify`` keeps in a run's ``verify/``: its certificate is the run's)."""
    found = set()
    for root in map(Path, paths):
        if not root.exists():
            continue
        candidates = [root] + [p for p in root.rglob("*") if p.is_dir()]
        for d in candidates:
            if {"wandb", "submitit", "errors", "verify"} & set(d.relative_to(root).parts):
                continue
            if any((d / f).exists() for f in RECORD_FILES):
                found.add(d.resolve())
    return sorted(found)


def load(path: Path) -> Run | Skipped:
    path = Path(path)
    try:
        summary = run_record.read_summary(path)
    except run_record.BadSummary as e:
        return Skipped(path, str(e))
    status = summary.get("status")
    if status in ("running", "preempted"):
        seen = run_status.state(path)  # is anything still running it?
        if seen["state"] == "lost":
            return Skipped(path, f"lost: {seen['detail']}")
    if status != "completed":
        why = f": {summary['error']}" if summary.get("error") else ""
        return Skipped(path, f"incomplete: status is {status!r}, not 'completed'{why}")
    missing = [k for k in _NEEDED if summary.get(k) is None]
    if missing:
        return Skipped(path, f"summary.json lacks {', '.join(missing)}")
    try:
        recipe = yaml.safe_load((path / "recipe.yaml").read_text())
    except FileNotFoundError:
        return Skipped(path, "no recipe.yaml")
    except yaml.YAMLError as e:
        return Skipped(path, f"recipe.yaml is corrupt ({str(e).splitlines()[0]})")
    run = Run(path, summary, recipe if isinstance(recipe, dict) else {})
    torn = _read_metrics(run)
    epochs0 = run.epochs.get(0, [])
    if not epochs0 or not run.steps.get(0):
        return Skipped(path, "missing metrics: metrics.jsonl has no step or epoch records of rank 0")
    expected = len(summary["epoch_time_s"])
    if len(epochs0) != expected or len(run.steps[0]) != summary.get("steps", len(run.steps[0])):
        return Skipped(path, f"missing metrics: metrics.jsonl has {len(epochs0)} epoch and {len(run.steps[0])} "
                             f"step records of rank 0, summary.json says {expected} and {summary.get('steps')}"
                             f"{f' ({torn} unreadable lines: truncated?)' if torn else ''}")
    return run


def _read_metrics(run: Run) -> int:
    """Fill run.epochs/steps/utilisation from metrics.jsonl; returns the number of unreadable lines."""
    stats = {}
    by_kind = {"epoch": run.epochs, "step": run.steps, "utilisation": run.utilisation}
    for rec in run_record.iter_metrics(run.path, stats):
        target = by_kind.get(rec.get("kind"))
        if target is not None:
            target.setdefault(int(rec.get("rank", 0)), []).append(rec)
    for store, key in ((run.steps, "step"), (run.epochs, "epoch")):
        for rank, records in store.items():
            store[rank] = run_record.latest_per_key(records, key)
    return stats.get("torn", 0)


def load_all(paths) -> tuple[list[Run], list[Skipped]]:
    """Every run under ``paths``: the comparable ones, and the skipped ones with reasons."""
    runs, skipped = [], []
    for d in find_run_dirs(paths):
        item = load(d)
        (runs if isinstance(item, Run) else skipped).append(item)
    # Repeats of one configuration (same experiment, arm, strategy, world size; seeds may differ)
    # must have trained the same thing: runs of one seed the same recipe fingerprint, all of them
    # the same strategy options. A minority is set aside.
    groups = defaultdict(list)
    for r in runs:
        groups[(r.experiment, r.arm, r.strategy, r.world_size)].append(r)
    kept = []
    for (name, _, strategy, world), members in groups.items():
        members.sort(key=lambda r: r.run_id)
        same_options, odd = _majority(members, lambda r: json.dumps(r.recipe.get("strategy"), sort_keys=True))
        skipped += [Skipped(r.path, f"different recipe: strategy options {r.recipe.get('strategy')} differ from "
                                    f"the other runs of {name} ({strategy} x{world})") for r in odd]
        by_seed = defaultdict(list)
        for r in same_options:
            by_seed[r.seed].append(r)
        for seed_runs in by_seed.values():
            same, odd = _majority(seed_runs, lambda r: r.summary.get("recipe_fingerprint"))
            kept += same
            best = same[0].summary.get("recipe_fingerprint")
            skipped += [Skipped(r.path, f"different recipe: recipe_fingerprint {r.summary.get('recipe_fingerprint')} "
                                        f"but {len(same)} other run(s) of {name} ({strategy} x{world}) have {best}")
                        for r in odd]
    return sorted(kept, key=lambda r: (r.experiment, r.world_size, r.strategy, r.arm or "", r.run_id)), skipped


def _majority(runs: list[Run], key) -> tuple[list[Run], list[Run]]:
    """(runs whose key is the most common one, the others); on a tie, the earliest run's key wins."""
    keys = [key(r) for r in runs]
    counts = Counter(keys)
    best = max(counts, key=lambda k: (counts[k], -keys.index(k)))
    return [r for r, k in zip(runs, keys) if k == best], [r for r, k in zip(runs, keys) if k != best]
