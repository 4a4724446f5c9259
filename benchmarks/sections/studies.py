"""The study recipes' cpu profiles end to end: each study through ``python -m suite.study``, every
arm a completed run with a row in the report's runs table and every published figure a row in
"published vs ours". tests/commands/test_study.py runs the Fashion-MNIST study; the others take
54-141 s each on 2 cores (4.6 minutes for the three, 42 arms: 2026-11-26), too long for the
test suite, so they run here."""
from __future__ import annotations

import csv
import re
import subprocess
import sys
import time

import yaml
from common import ROOT, Section

STUDIES = ["six_models_ddp", "resnet18_dp_gpipe", "mobilenet_v2_hybrid"]


def run(bench) -> Section:
    s = Section("Studies: every arm of every study's cpu profile")
    rows = []
    for name in STUDIES:
        recipe = ROOT / "recipes" / "studies" / f"{name}.yaml"
        arms = list(yaml.safe_load(recipe.read_text())["arms"])
        figures = len(yaml.safe_load(recipe.read_text())["reference"]["figures"])
        started = time.time()
        proc = subprocess.run([sys.executable, "-m", "suite.study", str(recipe), "--out", str(bench.out / "studies")],
                              capture_output=True, text=True, cwd=ROOT)
        wall = time.time() - started
        found = re.search(rf"^study {name} \(cpu\): (\S+)$", proc.stdout, re.M)
        completed, published = set(), 0
        if found:
            folder = (ROOT / found.group(1)).parent
            with open(folder / "runs.csv") as f:
                completed = {r["arm"] for r in csv.DictReader(f)}
            with open(folder / "published_vs_ours.csv") as f:
                published = len(list(csv.DictReader(f)))
        missing = [a for a in arms if a not in completed]
        print(f"  {name}: {wall:.0f} s, exit {proc.returncode}, {len(completed)} of {len(arms)} arms", flush=True)
        rows.append([name, f"{wall:.0f}", proc.returncode, f"{len(completed)} of {len(arms)}", f"{published} of {figures}"])
        s.check(f"{name}: every arm completed and reported", ", ".join(missing) or "all",
                proc.returncode == 0 and not missing and published == figures)
    s.table(["study", "wall (s)", "exit", "arms with a completed run", "published figures in the report"], rows)
    return s
