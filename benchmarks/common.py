"""What the benchmark sections share: running the suite and reading its records, the machine
description, and the Section a part of results.md is built in."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASE = HERE / "base.yaml"
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"


@dataclass
class Section:
    """One part of results.md: its text and the targets it checked."""
    title: str
    lines: list[str] = field(default_factory=list)
    checks: list[tuple[str, str, bool]] = field(default_factory=list)  # (target, measured, met)
    tables: list[dict] = field(default_factory=list)  # {"header": [...], "rows": [[...], ...]}: for the history

    def check(self, target: str, measured: str, met: bool) -> bool:
        self.checks.append((target, measured, met))
        self.lines.append(f"- Target {target}: measured {measured} — **{'met' if met else 'NOT met'}**")
        return met

    def table(self, header: list[str], rows: list[list]) -> None:
        self.tables.append({"header": [str(h) for h in header], "rows": [[_plain(v) for v in row] for row in rows]})
        self.lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        self.lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
        self.lines.append("")


def _plain(v):
    """A table cell as JSON holds it: numbers and None as they are, anything else as its text."""
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


@dataclass
class Bench:
    """Settings of one compare.py invocation and the runs it makes."""
    out: Path
    repeats: Optional[int]  # --repeats; None: each section's own default (``times``)
    quick: bool
    strategies: Optional[list[str]] = None  # --strategies: the overhead section measures only these
    slurm: bool = False  # --slurm: the predict section also runs on 2 nodes of the local Slurm
    families: Optional[list[str]] = None  # --families: the predict section runs only these model families
    no_local: bool = False  # --no-local: the predict section runs on Slurm only (with --slurm)
    variants: Optional[dict] = None  # --variants: the predict section's families, strategies, worlds (load_variants)
    log: list[str] = field(default_factory=list)

    def times(self, default: int = 3) -> int:
        """Repetitions for a section: --repeats if given, else the section's default (1 with --quick)."""
        return self.repeats or (1 if self.quick else default)

    def submit(self, folder: str, overrides: list[str], recipe: Path = BASE, env: dict | None = None,
               check: bool = True) -> dict:
        """``python -m suite.submit`` one recipe into ``out/folder``; its summary, with ``run_dir``,
        ``wall_s`` (the command's wall time) and ``command_started_at``."""
        target = self.out / folder
        command = [sys.executable, "-m", "suite.submit", str(recipe), *overrides, "--out", str(target)]
        started = time.time()
        proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
        wall_s = time.time() - started
        if proc.returncode and check:
            raise SystemExit(f"{folder} failed ({' '.join(command)}):\n{proc.stderr.strip()}")
        runs = sorted(p.parent for p in target.glob("*/summary.json"))
        summaries = [dict(json.loads((d / "summary.json").read_text()), run_dir=d) for d in runs]
        print(f"  {folder}: {wall_s:.1f} s", flush=True)
        result = summaries[-1] if len(summaries) == 1 else {"points": summaries}
        result.update(wall_s=wall_s, command_started_at=started, returncode=proc.returncode)
        return result

    def torchrun(self, script: Path, ranks: int, args: list[str]) -> None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
                   str(script), *map(str, args)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
        if proc.returncode:
            raise SystemExit(f"{script.name} failed:\n{proc.stderr.strip()[-3000:]}")


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def steps(run_dir: Path, rank: int = 0) -> list[dict]:
    from suite.record import run_record

    return run_record.read_metrics(run_dir, kind="step", rank=rank)


def machine() -> list[str]:
    """Where the numbers were taken: CPU, cores, memory, load, versions."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else "?"
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = []
    for name in ("torch", "deepspeed", "fairscale", "submitit", "wandb"):
        try:
            from importlib.metadata import version

            versions.append(f"{name} {version(name)}")
        except Exception:  # noqa: BLE001 - not installed: say nothing
            pass
    return [f"- CPU: {cpu}, {len(os.sched_getaffinity(0))} cores usable, {mem_gib:.0f} GiB memory, no GPU used",
            f"- Load average when the benchmark started: {' '.join(f'{v:.2f}' for v in os.getloadavg())} "
            f"(other work on the machine moves the numbers)",
            f"- Python {platform.python_version()}, {', '.join(versions)}; {platform.platform()}"]


def script_json(script: str, *args: str) -> dict:
    """Run a measuring script beside this file in its own process with one thread (as one rank of
    a 2-rank run on 2 cores has) and read the JSON object its last line prints."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])
