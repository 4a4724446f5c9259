"""Every benchmark in one command, measured side by side so the ratios compare like with like.

    python benchmarks/compare.py [--out DIR] [--only NAME[,NAME]] [--repeats N] [--quick] [--strategies S[,S]]

Sections (``--only``): overhead (suite vs a hand-written loop, and equal losses), tracking (default
tracking vs W&B disabled), pipeline (GPipe/1F1B bubble vs the formula), scaling (world 1 vs 2),
memory (held bytes vs the dry run's prediction), startup (first step after the command, sweep cost
per point), plan (the prediction each run records vs what it measured: held bytes, peak memory,
step time), checkpoint (time per step with a save every 20 steps vs none), predict (step time on every model family, the calibration taken without a recipe), published (published GPU training runs beside the planner's prediction on their hardware's profile). Targets are in ``benchmarks/README.md``; a missed one makes the exit code 1. ``--out``
receives results.md (with the machine it ran on), every run record and the analysis report; each
section's result is also appended to its history, ``benchmarks/history/<section>.jsonl`` (``history.py``).
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py and sections/ beside this file

import history  # noqa: E402
from common import ROOT, Bench, machine  # noqa: E402

SECTIONS = ["overhead", "tracking", "pipeline", "scaling", "memory", "startup", "augment", "batchnorm", "plan",
            "slow_rank", "checkpoint"]
# Only when --only names them: three studies' cpu profiles (about 25 min on 2 cores); the step-time
# prediction over every model family and strategy (predict: about 2 hours, 13 min with --quick).
# published: published GPU runs predicted on their hardware's profile (no run here; a few minutes).
OPTIONAL = ["studies", "predict", "published"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/results/latest", help="folder for results.md, runs and report")
    p.add_argument("--only", default=",".join(SECTIONS),
                   help=f"comma-separated sections: {', '.join(SECTIONS)} (default: all of them), {', '.join(OPTIONAL)}")
    p.add_argument("--repeats", type=int, help="repetitions of each measurement (median taken); by default 15 for "
                   "overhead and 9 for tracking (2-3 %% targets; single runs spread by about 10 %% on a small "
                   "machine), 1 for predict (each configuration's runs in rounds over all of them), 3 for the others")
    p.add_argument("--quick", action="store_true", help="few steps per run: checks the benchmark, measures little "
                   "(not appended to the history unless --history is given)")
    p.add_argument("--history", type=Path, help="folder of the sections' JSONL history (default: benchmarks/history; "
                   "each run appends one row per section)")
    p.add_argument("--strategies", help="overhead section: only these (single, ddp, zero2, fsdp), e.g. to rerun one target")
    p.add_argument("--slurm", action="store_true", help="predict section: also 2 nodes of the local Slurm (slurm/start.sh)")
    p.add_argument("--no-local", action="store_true", help="predict section: only the Slurm runs (with --slurm)")
    p.add_argument("--families", help="predict section: only these model families (e.g. seq2seq,unet), to run its "
                   "full profile (about 2 hours on 2 cores) in parts")
    p.add_argument("--variants", type=Path, help="predict section: its model families (and strategies, worlds) from "
                   "this YAML file instead, e.g. benchmarks/variants/hybrids.yaml: a held-out check on models of "
                   "one's own (the format: benchmarks/sections/predict.py)")
    args = p.parse_args(argv)
    args.only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in args.only if name not in SECTIONS + OPTIONAL]
    if unknown:
        p.error(f"--only {','.join(unknown)}: no such section; choose from {', '.join(SECTIONS + OPTIONAL)}")
    if args.no_local and not args.slurm:
        p.error("--no-local leaves the predict section nothing to run without --slurm")
    if args.variants and "predict" not in args.only:
        p.error("--variants sets the predict section's models; add --only predict")
    if args.variants:
        try:
            args.variants = importlib.import_module("sections.predict").load_variants(args.variants)
        except ValueError as e:
            p.error(f"--variants {e}")
    if args.families:
        args.families = [name.strip() for name in args.families.split(",") if name.strip()]
        known = args.variants["families"] if args.variants else importlib.import_module("sections.predict").FAMILIES
        unknown = [name for name in args.families if name not in known]
        if unknown:
            p.error(f"--families {','.join(unknown)}: no such model family; choose from {', '.join(known)}")
    if args.strategies:
        args.strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        sys.exit(f"{out} is not empty; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out, args.repeats, args.quick, args.strategies, slurm=args.slurm, families=args.families,
                  no_local=args.no_local, variants=args.variants)
    command = "python benchmarks/compare.py " + " ".join(sys.argv[1:] if argv is None else argv)
    taken, where = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), machine()
    head = ["# Benchmark results", "", f"Command: `{command}`", "",
            f"Taken {time.strftime('%Y-%m-%d %H:%M %Z')} on:", *where, ""]
    sections, rows = [], []
    for name in args.only:
        print(f"{name}:", flush=True)
        started = time.time()
        sections.append(importlib.import_module(f"sections.{name}").run(bench))
        duration_s = time.time() - started
        sections[-1].lines.append(f"\n({duration_s:.0f} s)")
        rows.append(history.row(name, sections[-1], taken=taken, command=command, machine=where,
                                duration_s=round(duration_s, 1), quick=args.quick, source=str(out)))
    checks = [c for s in sections for c in s.checks]
    lines = head + ["## Targets", ""]
    lines += [f"- {'met' if met else '**NOT met**'}: {target} (measured {measured})" for target, measured, met in checks]
    lines += [f"\n{sum(met for *_, met in checks)} of {len(checks)} targets met.", ""]
    for s in sections:
        lines += [f"## {s.title}", "", *s.lines, ""]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    if args.history or not args.quick:  # a quick run checks the benchmark: no figure worth keeping
        history.append(rows, args.history or history.FOLDER)
    subprocess.run([sys.executable, "-m", "analysis.report", str(out), "--out", str(out / "report"), "--no-wandb"],
                   check=False, capture_output=True, cwd=ROOT)
    print("\n".join(lines))
    print(f"results: {out / 'results.md'}; report: {out / 'report'}")
    return 0 if all(met for *_, met in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
