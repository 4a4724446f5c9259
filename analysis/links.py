"""``python -m analysis.links FOLDER``: the link study's report (``slurm/link_study.sh``).

FOLDER holds one folder per link rate (``10gbit``, ``1gbit``, ``100mbit``), each with the study's
folder (``links-cpu-<time>/runs/``) and ``calibration.json`` (the links calibrated under Slurm on
both nodes). For every run: measured throughput (``summary.json``'s ``samples_per_s``) and the
predicted one the run recorded (``predicted.samples_per_s``, from that rate's calibration), and
scaling efficiency, measured and predicted: throughput / (world size x the same model's
one-device throughput at that rate, measured resp. predicted). Writes ``links.csv``, ``links.md``
and one PNG per measure (a panel per model: throughput or efficiency against link rate, measured
solid, predicted dashed) into FOLDER.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import yaml

from analysis import plots
from suite.common.errors import SuiteError, one_line

RATES_GBIT = {"100mbit": 0.1, "1gbit": 1.0, "10gbit": 10.0}
COLUMNS = ["link", "model", "arm", "strategy", "world_size", "samples_per_s", "predicted_samples_per_s",
           "efficiency", "predicted_efficiency", "step_time_s", "predicted_step_time_s", "interface"]


def rows(folder: Path) -> list[dict]:
    """One row per completed run under every rate's folder."""
    found = []
    for rate in sorted(RATES_GBIT, key=RATES_GBIT.get):
        for summary_path in sorted((folder / rate).glob("*/runs/*/summary.json")):
            summary = json.loads(summary_path.read_text())
            if summary.get("status") != "completed":
                continue
            arm = yaml.safe_load((summary_path.parent / "recipe.yaml").read_text()).get("arm") or summary["name"]
            predicted = summary.get("predicted") or {}
            found.append({"link": rate, "model": arm.split("-")[0], "arm": arm, "strategy": summary["strategy"],
                          "world_size": summary["world_size"], "samples_per_s": summary.get("samples_per_s"),
                          "predicted_samples_per_s": predicted.get("samples_per_s"),
                          "step_time_s": summary.get("step_time_s"), "predicted_step_time_s": predicted.get("step_time_s"),
                          "interface": _interface(summary)})
    for row in found:  # against the same model's one-device run at the same rate
        single = next((r for r in found if r["link"] == row["link"] and r["model"] == row["model"]
                       and r["world_size"] == 1), None)
        for measured, key in (("samples_per_s", "efficiency"), ("predicted_samples_per_s", "predicted_efficiency")):
            ok = single and single[measured] and row[measured]
            row[key] = row[measured] / (row["world_size"] * single[measured]) if ok else None
    return found


def _interface(summary: dict) -> str:
    """The interface rank 0 talked on (``summary.json``'s ``ranks[0].network``), '' if none (one rank)."""
    ranks = summary.get("ranks") or [{}]
    return (ranks[0].get("network") or {}).get("interface", "")


def _fmt(v) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def write(folder: Path, found: list[dict]) -> list[Path]:
    with open(folder / "links.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(found)
    lines = ["# Link study: throughput and scaling efficiency against link rate", "",
             "Measured beside predicted (each run's own prediction, from the calibration of its links). "
             "Efficiency = throughput / (world size x the same model's one-device throughput at that rate).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in COLUMNS) + " |" for r in found]
    (folder / "links.md").write_text("\n".join(lines) + "\n")
    paths = [folder / "links.csv", folder / "links.md"]
    for measure, label in (("samples_per_s", "samples/s"), ("efficiency", "scaling efficiency")):
        paths.append(_plot(folder / f"links-{measure.replace('_', '-')}.png", found, measure, label))
    return paths


def _plot(path: Path, found: list[dict], measure: str, label: str) -> Path:
    models = sorted({r["model"] for r in found})
    fig, axes = plots.plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        arms = sorted({r["arm"] for r in found if r["model"] == model and (measure != "efficiency" or r["world_size"] > 1)})
        for i, arm in enumerate(arms):
            pts = sorted((RATES_GBIT[r["link"]], r[measure], r["predicted_" + measure]) for r in found if r["arm"] == arm)
            colour = f"C{i}"
            ax.plot([x for x, y, _ in pts if y], [y for _, y, _ in pts if y], "o-", color=colour, label=arm)
            ax.plot([x for x, _, p in pts if p], [p for _, _, p in pts if p], "x--", color=colour, alpha=0.7)
        ax.set_xscale("log")
        ax.set_xlabel("link rate (Gbit/s); dashed: predicted")
        ax.set_ylabel(label)
        ax.set_title(model)
        ax.legend(fontsize=8)
    return plots.save(fig, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.links", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="slurm/link_study.sh's --out: one folder per link rate")
    args = p.parse_args(argv)

    def _run(args) -> int:
        folder = Path(args.folder)
        found = rows(folder)
        if not found:
            raise SuiteError(f"{folder}: no completed run under {', '.join(f'{r}/' for r in RATES_GBIT)}; "
                             f"run bash slurm/link_study.sh --out {folder}")
        for path in write(folder, found):
            print(path)
        return 0

    return one_line(_run, args)


if __name__ == "__main__":
    sys.exit(main())
