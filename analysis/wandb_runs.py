"""Read the offline W&B runs inside a run folder, with no server and without importing wandb here.

A job's W&B run (id = the run id) lives in ``<run folder>/wandb/offline-run-<time>-<id>/``, one
folder per attempt that wrote to it (a resumed attempt goes on in the same run: ``read_job``
joins them, the later attempt's row winning a step both logged). ``python -m wandb leet inspect
--json DIR`` (wandb 0.31, pinned) prints its records, one JSON object a line: ``run`` (name,
group, config), ``history`` (our ``<kind>/<field>`` rows), ``stats`` (W&B system metrics).
It runs in a subprocess, so this process never imports wandb (nor torch).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run_dirs(run_folder: Path) -> list[Path]:
    return sorted(Path(run_folder).glob("wandb/offline-run-*"))


def records(wandb_dir: Path, timeout_s: float = 120) -> list[dict]:
    """Every record of one offline run; raises RuntimeError when wandb cannot read it."""
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_dir)],
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"wandb leet inspect failed on {wandb_dir}: {proc.stderr.strip()[-300:]}")
    out = []
    for line in proc.stdout.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read(wandb_dir: Path) -> dict:
    """name, group, config, history rows (W&B's ``_`` keys dropped) and system-metric samples."""
    info = {"dir": str(wandb_dir), "name": None, "group": None, "config": {}, "history": [], "stats": [],
            "steps": [], "summary": {}, "job_type": None, "tags": []}
    for rec in records(wandb_dir):
        kind = rec.get("type")
        if kind == "run":
            run = rec["run"]
            info.update(name=run.get("display_name"), group=run.get("run_group"), job_type=run.get("job_type"),
                        tags=list(run.get("tags") or []), id=run.get("run_id"),
                        config={k: v for k, v in (run.get("config", {}).get("update") or {}).items()
                                if not k.startswith("_")})
        elif kind == "history":
            item = rec["history"]["item"]
            info["history"].append({k: v for k, v in item.items() if not k.startswith("_")})
            info["steps"].append(item.get("_step"))
        elif kind == "summary":
            info["summary"].update({k: v for k, v in rec["summary"].get("update", {}).items() if not k.startswith("_")})
        elif kind == "stats":
            info["stats"].append(rec["stats"]["item"])
    return info


def read_job(wandb_dirs: list[Path]) -> dict:
    """One job's W&B run from its attempts' folders (oldest first): ``read``'s fields, the
    history one row per step (a later attempt's row replaces an earlier one's), ``ids`` and
    ``attempts`` (how many folders)."""
    infos = [read(d) for d in wandb_dirs]
    by_step: dict = {}
    for info in infos:
        for step, row in zip(info["steps"], info["history"]):
            by_step[step] = row
    job = {**infos[-1], "history": [by_step[s] for s in sorted(by_step)], "stats": [s for i in infos for s in i["stats"]],
           "ids": sorted({i.get("id") for i in infos}), "attempts": len(infos)}
    return job


def step_metrics(info: dict, rank: int | None = None) -> list[dict]:
    """The ``step`` records as the run record has them, ordered by step: rank 0's (``step/x`` ->
    ``x``), or with ``rank`` that rank's own fields (``rank<N>/step/x``) with the shared ones."""
    own = f"rank{rank}/step/"
    rows = []
    for row in info["history"]:
        shared = {k[5:]: v for k, v in row.items() if k.startswith("step/")}
        if rank is None or rank == 0:
            rows.append(shared)
        else:
            keep = {k: shared[k] for k in ("step", "epoch", "attempt", "global_loss", "lr", "grad_norm") if k in shared}
            rows.append({**keep, **{k[len(own):]: v for k, v in row.items() if k.startswith(own)}})
    return sorted((r for r in rows if "step" in r), key=lambda r: r["step"])


def system_summary(info: dict) -> dict:
    """Means and peaks of W&B's system metrics for one rank (keys may carry a ``/l:label``)."""
    series: dict[str, list[float]] = {}
    for item in info["stats"]:
        for key, value in item.items():
            base = key.split("/l:")[0]
            if isinstance(value, (int, float)):
                series.setdefault(base, []).append(float(value))
    out = {"system_samples": len(info["stats"])}
    for key, name in (("cpu", "cpu_percent"), ("proc.memory.rssMB", "rss_mb"), ("gpu.0.gpu", "gpu_util_percent"),
                      ("gpu.0.memoryAllocated", "gpu_memory_percent"), ("gpu.0.powerWatts", "gpu_power_w")):
        values = series.get(key)
        if values:
            out[f"{name}_mean"] = sum(values) / len(values)
            out[f"{name}_peak"] = max(values)
    return out
