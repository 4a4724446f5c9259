"""The one results file of ``benchmarks/gpu_check.sh``: ``python benchmarks/gpu_check_report.py OUT
--results benchmarks/results`` reads what each check left in OUT (its exit code and seconds,
``suite.doctor``'s JSON, the calibration kept as a hardware profile, ``suite.verify``'s
certificates, the bf16 and fp16 runs' summaries) and writes ``<date>-gpu-<card>.md`` there: the
card, every check's outcome, each certificate's verdict line, and for each run its measured peak
memory (allocated and reserved) and step time beside the planner's prediction, with fp16's
skipped steps."""
from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.tables import prediction_rows  # noqa: E402  (the repository root on the path first)
from analysis.runs import Run, find_run_dirs, load  # noqa: E402


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def card(doctor: dict) -> str:
    gpus = (doctor.get("cuda") or {}).get("gpus") or []
    return gpus[0]["name"] if gpus else "unknown GPU"


def checks_table(out: Path) -> list[str]:
    lines = ["| check | exit | seconds | command |", "|---|---|---|---|"]
    tsv = out / "checks.tsv"
    for row in (tsv.read_text().splitlines() if tsv.exists() else []):
        name, code, seconds, command = row.split("\t", 3)
        outcome = {"0": "0", "124": "124 (timed out)"}.get(code, code)
        lines.append(f"| {name} | {outcome} | {seconds} | `{command}` |")
    return lines


def doctor_lines(doctor: dict) -> list[str]:
    return [f"- {c['name']}: **{c['status']}** {c['detail']}" for c in doctor.get("checks", [])]


def verify_lines(out: Path) -> list[str]:
    return [f"- {_json(p).get('verdict_line', '?')}" for p in sorted((out / "verify").rglob("verify.json"))]


def run_lines(out: Path, precision: str) -> list[str]:
    runs = [r for r in (load(d) for d in find_run_dirs([out / precision])) if isinstance(r, Run)]
    rows = {row["run_id"]: row for row in prediction_rows(runs)}
    lines = [f"| strategy | world | status | skipped steps | peak allocated MiB (predicted) | peak reserved MiB | "
             f"step ms (predicted) |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        ranks = r.summary.get("ranks") or []
        row = rows.get(r.run_id, {})
        skipped = ",".join(str(x.get("skipped_steps")) for x in ranks) if precision == "fp16" else "-"
        reserved = max((x.get("peak_reserved_bytes") or 0 for x in ranks), default=0)
        lines.append(f"| {r.label} | {r.world_size} | {r.summary.get('status')} | {skipped} | "
                     f"{_mib(row.get('peak_measured'))} ({_mib(row.get('peak_predicted'))}) | {_mib(reserved)} | "
                     f"{_ms(row.get('step_measured'))} ({_ms(row.get('step_predicted'))}) |")
    return lines


def _mib(value) -> str:
    return f"{value / 2**20:.1f}" if value else "-"


def _ms(value) -> str:
    return f"{value * 1e3:.1f}" if value else "-"


def report(out: Path) -> tuple[str, str]:
    doctor = _json(out / "doctor.json")
    name = card(doctor)
    profile = out / "hardware-profile.json"
    parts = [f"# GPU check: {name}", "",
             f"`bash benchmarks/gpu_check.sh` on {doctor.get('host', '?')}, {datetime.date.today()}; "
             f"torch {(doctor.get('software') or {}).get('torch', '?')}, NCCL {(doctor.get('cuda') or {}).get('nccl')}.",
             "", "## Checks", "", *checks_table(out), "", "## suite.doctor", "", *doctor_lines(doctor), "",
             "## Hardware profile", "",
             f"`{profile}` ({'written' if profile.exists() else 'missing'}): use it with `--hardware {profile.name}`.",
             "", "## suite.verify on CUDA", "", *(verify_lines(out) or ["- no certificate"]), ""]
    for precision in ("bf16", "fp16"):
        parts += [f"## {precision}, 20 steps: measured (predicted)", "", *run_lines(out, precision), ""]
    return name, "\n".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    name, text = report(args.out)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    path = args.results / f"{datetime.date.today()}-gpu-{slug}.md"
    path.write_text(text)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
