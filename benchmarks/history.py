"""The machine-readable history of every benchmark section: ``benchmarks/history/<section>.jsonl``,
one JSON object a run of the section, appended by ``compare.py`` (and, for results written before
it did, by ``fold_history.py``). ``benchmarks/README.md`` shows each section's latest result; the
history keeps every earlier one, so a figure can be traced and compared without reading markdown.

A row: ``section``, ``title``, ``taken`` (UTC, ISO 8601), ``command``, ``machine`` (the lines
results.md prints), ``targets`` ([{target, measured, met}]), ``tables`` ([{header, rows}]),
``duration_s``, ``quick``, and ``source`` (the results folder or file it came from)."""
from __future__ import annotations

import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "history"


def row(name: str, section, *, taken: str, command: str, machine: list[str], duration_s: float | None,
        quick: bool, source: str) -> dict:
    """One history row for a section's run (``section`` is a ``common.Section``)."""
    return {"section": name, "title": section.title, "taken": taken, "command": command, "machine": machine,
            "targets": [{"target": t, "measured": m, "met": bool(met)} for t, m, met in section.checks],
            "tables": section.tables, "duration_s": duration_s, "quick": quick, "source": source}


def append(rows: list[dict], folder: Path = FOLDER) -> list[Path]:
    """Append each row to its section's file; the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for r in rows:
        path = folder / f"{r['section']}.jsonl"
        with path.open("a") as f:
            f.write(json.dumps(r, sort_keys=True) + "\n")
        written.append(path)
    return written


def read(section: str, folder: Path = FOLDER) -> list[dict]:
    """A section's rows, oldest first (by ``taken``)."""
    path = folder / f"{section}.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r.get("taken") or "")
