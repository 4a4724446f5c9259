"""Fold the markdown results written before the history existed (``benchmarks/results/2026-*.md``)
into each section's JSONL history (``benchmarks/history.py``), converting what it can:

    python benchmarks/fold_history.py [--results DIR] [--history DIR]

Per file: its command, when it was taken, the machine lines, and per section (matched by the
section's title, else by the file's name) its targets (target, measured, met) and its tables.
The markdown files stay where they are, with every figure; a row says which file it came from
(``source``) and that it was folded (``folded: true``). Running it again replaces the folded rows
and keeps those compare.py appended."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import history  # noqa: E402

# A section's title as compare.py writes it (and the older titles it had), first words first.
TITLES = [("Harness overhead", "overhead"), ("Tracking cost", "tracking"), ("Pipeline bubble", "pipeline"),
          ("Scaling", "scaling"), ("Speed (world size 2", "scaling"), ("Memory", "memory"),
          ("Bytes held per rank", "memory"), ("Start-up", "startup"), ("Augmentation cost", "augment"),
          ("Synced batch norm", "batchnorm"), ("Plan:", "plan"), ("Slow rank", "slow_rank"),
          ("Checkpoint cost", "checkpoint"), ("Predict", "predict"), ("Studies", "studies")]
# Else the file's name says which section it holds.
NAMES = [("predict", "predict"), ("overhead", "overhead"), ("startup", "startup"), ("plan", "plan"),
         ("checkpoint", "checkpoint"), ("tracking", "tracking"), ("studies", "studies"), ("batchnorm", "batchnorm"),
         ("slow-rank", "slow_rank"), ("links", "links")]
TARGET = re.compile(r"^- Target (?P<target>.+?): measured (?P<measured>.+?) — \*\*(?P<met>met|NOT met)\*\*")
OLD_TARGET = re.compile(r"^Target:? (?P<target>.+?): measured (?P<measured>.+?) — (?P<met>met|NOT met)")
LISTED = re.compile(r"^- (?P<met>met|\*\*NOT met\*\*): (?P<target>.+) \(measured (?P<measured>.+)\)$")


def _section_of_title(title: str) -> str | None:
    return next((name for prefix, name in TITLES if title.startswith(prefix)), None)


def _section_of_file(path: Path) -> str:
    return next((name for key, name in NAMES if key in path.stem), "all")


def _number(text: str):
    try:
        return float(text.replace(",", "")) if re.fullmatch(r"-?[\d,]*\.?\d+(e[-+]?\d+)?", text.strip()) else text
    except ValueError:
        return text


def tables(lines: list[str]) -> list[dict]:
    """The Markdown tables among ``lines``: {header, rows}, numbers as numbers."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$", lines[i + 1].strip()):
            header = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([_number(c.strip()) for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out.append({"header": header, "rows": rows})
        else:
            i += 1
    return out


def targets(lines: list[str]) -> list[dict]:
    out = []
    for line in lines:
        m = TARGET.match(line) or OLD_TARGET.match(line) or LISTED.match(line)
        if m:
            out.append({"target": m["target"], "measured": m["measured"], "met": m["met"].strip("*") == "met"})
    return out


def fold(path: Path) -> list[dict]:
    """The history rows of one markdown results file."""
    text = path.read_text()
    lines = text.splitlines()
    command = next((m[1] for m in (re.search(r"Command: `(.+?)`", line) for line in lines) if m), None)
    when = re.search(r"Taken (\d{4}-\d{2}-\d{2})(?: (\d{2}:\d{2}))?", text)
    day = when[1] if when else re.match(r"\d{4}-\d{2}-\d{2}", path.name)[0]
    taken = f"{day}T{when[2] if when and when[2] else '00:00'}:00Z"
    machine = [line for line in lines if line.startswith(("- CPU:", "- Load average", "- Python", "Machine:"))]
    parts, current = {}, None  # section name -> its lines; the file's "## Targets" list apart
    listed = []
    for line in lines:
        if line.startswith("## "):
            title = line[3:].strip()
            current = "__targets__" if title == "Targets" else (_section_of_title(title) or current)
            if current and current != "__targets__":
                parts.setdefault(current, {"title": title, "lines": []})
            continue
        if current == "__targets__":
            listed.append(line)
        elif current:
            parts[current]["lines"].append(line)
    if not parts:  # no section title it knows: the whole file, by its name
        parts = {_section_of_file(path): {"title": lines[0].lstrip("# ").strip() if lines else path.stem, "lines": lines}}
    rows = []
    for name, part in parts.items():
        found = targets(part["lines"]) or (targets(listed) if len(parts) == 1 else [])
        rows.append({"section": name, "title": part["title"], "taken": taken, "command": command, "machine": machine,
                     "targets": found, "tables": tables(part["lines"]), "duration_s": None,
                     "quick": bool(command and "--quick" in command), "source": f"results/{path.name}",
                     "folded": True})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--history", type=Path, default=history.FOLDER)
    args = p.parse_args(argv)
    folded = [row for path in sorted(args.results.glob("20*.md")) for row in fold(path)]
    by_section: dict[str, list[dict]] = {}
    for path in args.history.glob("*.jsonl"):  # the rows compare.py appended stay
        kept = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        by_section[path.stem] = [r for r in kept if not r.get("folded")]
    for row in folded:
        by_section.setdefault(row["section"], []).append(row)
    args.history.mkdir(parents=True, exist_ok=True)
    for name, rows in sorted(by_section.items()):
        rows.sort(key=lambda r: r.get("taken") or "")
        (args.history / f"{name}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        print(f"{name}: {len(rows)} row(s), {sum(1 for r in rows if r.get('folded'))} folded from markdown")
    return 0


if __name__ == "__main__":
    sys.exit(main())
