"""Predict a predict benchmark's stored runs again with the time model as it is now: each run from
its own recipe, with the calibration and model timings that benchmark made (its ``predict/cache``),
never its measured steps (runs on Slurm nodes are left out: their calibration is read by the node's
name, on the node); a configuration run in several rounds (``--repeats``) is compared by its
medians. For checking a change to the time model on runs already measured (those it was made on
are not held out: say so where the figures are quoted).

    python benchmarks/repredict.py BENCH_OUT [PATTERN]    (BENCH_OUT: a compare.py --out with a predict section)
"""
import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _where(name: str) -> str:
    """A run folder's placement: "2nodes" (Slurm), else its world ("w2", "w4")."""
    return "2nodes" if "@2nodes" in name else name.rsplit("-", 1)[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_out", type=Path)
    p.add_argument("pattern", nargs="?", default="", help="only runs whose folder name contains this")
    args = p.parse_args()
    os.environ["XDG_CACHE_HOME"] = str(args.bench_out / "predict" / "cache")  # before the suite reads it
    from sections.predict import kendall_tau, median_of, percentile, swapped_pairs
    from suite import recipe as recipes
    from suite.planner.predict import prediction

    runs: dict = {}  # a configuration's runs: the first round's folder, then predict/round<k>/ (--repeats)
    for summary_path in sorted(args.bench_out.glob("predict/*/*/summary.json")) + \
            sorted(args.bench_out.glob("predict/round*/*/*/summary.json")):
        runs.setdefault(summary_path.parent.parent.name, []).append(summary_path)
    rows = []
    for name, paths in runs.items():
        summaries = [json.loads(path.read_text()) for path in paths]
        measured = median_of([summary.get("step_time_s") for summary in summaries])
        if args.pattern not in name or not measured:
            continue
        if _where(name) == "2nodes":  # predicted on its Slurm node, from the calibration under that node's name
            continue
        recipe = recipes.validate(yaml.safe_load((paths[0].parent / "recipe.yaml").read_text()))
        new = prediction(recipe).get("step_time_s")
        old = median_of([(summary.get("predicted") or {}).get("step_time_s") for summary in summaries])
        if new:
            rows.append((name, new, measured, old, [summary["step_time_s"] for summary in summaries
                                                    if summary.get("step_time_s")]))
        print(f"{name:32s} measured {measured * 1e3:8.2f} ms  new {new * 1e3 if new else float('nan'):8.2f} ms  "
              f"old {(old / measured - 1) if old else float('nan'):+.2f} "
              f"new {(new / measured - 1) if new else float('nan'):+.2f}", flush=True)
    if not rows:
        sys.exit(f"no predict runs with a measured step under {args.bench_out}")
    for column, label in ((1, "new"), (3, "old")):
        have = [r for r in rows if r[column]]
        errors = [abs(r[column] / r[2] - 1) for r in have]
        print(f"{label}: {len(errors)} runs, median {percentile(errors, 0.5):.0%}, p90 {percentile(errors, 0.9):.0%}")
        for where in ("w2", "w4", "2nodes"):
            e = [abs(r[column] / r[2] - 1) for r in have if _where(r[0]) == where]
            if e:
                print(f"  {where}: {len(e)} runs, median {statistics.median(e):.0%}, p90 {percentile(e, 0.9):.0%}")
        groups: dict = {}  # "<family>-<where>": (strategy label, predicted, measured median, measured runs)
        for r in have:
            family, rest = r[0].split("-", 1)
            groups.setdefault(f"{family}-{_where(r[0])}", []).append((rest.rsplit("-", 1)[0], r[column], r[2], r[4]))
        taus = {k: kendall_tau([g[1] for g in v], [g[2] for g in v]) for k, v in groups.items() if len(v) > 1}
        print("  Kendall tau: " + ", ".join(f"{k} {t:.2f}" for k, t in sorted(taus.items())))
        swapped = {k: swapped_pairs([(g[0], g[1], g[3]) for g in groups[k]]) for k in sorted(taus) if taus[k] < 0.8}
        if swapped:
            print("  pairs swapped where tau < 0.8 (~: measured ranges overlap): "
                  + "; ".join(f"{k} {' '.join(v)}" for k, v in swapped.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
