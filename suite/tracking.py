"""The run record: ``recipe.yaml``, ``metrics.jsonl`` and ``summary.json`` in the run folder.

It is the source of truth; W&B gets the same metrics. Each metrics line is one JSON object
tagged with its rank, written with a single append so that ranks never interleave within a
line; ``summary.json`` is replaced atomically, so a killed run never leaves half a file.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_json_atomic(path: Path, obj) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def update_summary(run_dir: Path, **fields) -> None:
    """Set fields of ``summary.json`` (created if absent), atomically."""
    path = Path(run_dir) / "summary.json"
    summary = read_json(path) if path.exists() else {}
    summary.update(fields)
    write_json_atomic(path, summary)


class MetricsLog:
    """Appends records to ``metrics.jsonl``: one line per record, tagged with the rank."""

    def __init__(self, run_dir: Path, rank: int, sinks=()):
        self.rank = rank
        self.sinks = list(sinks)
        self._fd = os.open(Path(run_dir) / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, kind: str, **fields) -> None:
        record = {"kind": kind, "rank": self.rank, **fields}
        os.write(self._fd, (json.dumps(record) + "\n").encode())
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        sampler = getattr(self, "utilisation", None)  # set by suite.measures.open_log
        if sampler is not None:
            sampler.stop()  # before the file closes: it writes through this log
        os.close(self._fd)
        for sink in self.sinks:
            sink.close()


def read_metrics(run_dir: Path, kind: str | None = None, rank: int | None = None) -> list[dict]:
    """Records of ``metrics.jsonl``; a torn last line (a killed run) is skipped."""
    out = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (kind is None or rec.get("kind") == kind) and (rank is None or rec.get("rank") == rank):
            out.append(rec)
    return out
