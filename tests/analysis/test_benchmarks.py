"""benchmarks/compare.py runs a section end to end and writes its results; the numbers themselves
are measured by the full benchmark on a quiet machine, never in tests (they would be flaky)."""
import subprocess
import sys

import pytest

COMPARE = ["benchmarks/compare.py"]


@pytest.mark.slow
def test_a_quick_section_writes_results_with_the_machine_and_its_targets(tmp_path):
    out = tmp_path / "bench"
    history = tmp_path / "history"
    proc = subprocess.run([sys.executable, *COMPARE, "--only", "tracking", "--repeats", "1", "--quick",
                           "--out", str(out), "--history", str(history)], capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed, which a loaded test machine may do
    results = (out / "results.md").read_text()
    assert "CPU:" in results and "Load average" in results and "torch" in results
    assert "## Tracking cost" in results and "default tracking / disabled <= 1.02" in results
    # a pair at 2 ranks and one at 1: the run records stay with the results
    assert len(list(out.glob("tracking/*/*/summary.json"))) == 4
    import json
    rows = [json.loads(line) for line in (history / "tracking.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["section"] == "tracking" and rows[0]["quick"] is True
    targets = [t["target"] for t in rows[0]["targets"]]  # one per world: every core busy, and a core spare
    assert len(targets) == 2 and all(t.endswith("median epoch-time ratio, default tracking / disabled <= 1.02")
                                     for t in targets), targets
    assert rows[0]["tables"] and rows[0]["tables"][0]["header"] and rows[0]["command"].startswith("python benchmarks")


def test_older_markdown_results_fold_into_the_history(tmp_path):
    import importlib
    import json
    from pathlib import Path
    sys.path.insert(0, str(Path("benchmarks").resolve()))
    try:
        fold = importlib.import_module("fold_history")
    finally:
        sys.path.pop(0)
    results, history = tmp_path / "results", tmp_path / "history"
    results.mkdir()
    (results / "2026-11-24-cpu-overhead.md").write_text(
        "# Benchmark results\n\nCommand: `python benchmarks/compare.py --only overhead`\n\n"
        "Taken 2026-11-24 10:05 UTC on:\n- CPU: AMD EPYC, 2 cores usable\n\n## Targets\n\n"
        "- met: single step-time ratio <= 1.03 (measured 0.98)\n\n"
        "## Harness overhead: suite vs a hand-written loop\n\n| strategy | ratio |\n|---|---|\n| single | 0.98 |\n\n"
        "- Target single step-time ratio <= 1.03: measured 0.98 — **met**\n")
    history.mkdir()
    (history / "overhead.jsonl").write_text(json.dumps({"section": "overhead", "taken": "2026-12-01T00:00:00Z"}) + "\n")
    assert fold.main(["--results", str(results), "--history", str(history)]) == 0
    assert fold.main(["--results", str(results), "--history", str(history)]) == 0  # again: no duplicates
    rows = [json.loads(line) for line in (history / "overhead.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["taken"] == "2026-12-01T00:00:00Z"  # the appended row kept, last
    folded = rows[0]
    assert folded["folded"] and folded["source"] == "results/2026-11-24-cpu-overhead.md"
    assert folded["taken"] == "2026-11-24T10:05:00Z" and folded["machine"] == ["- CPU: AMD EPYC, 2 cores usable"]
    assert folded["targets"] == [{"target": "single step-time ratio <= 1.03", "measured": "0.98", "met": True}]
    assert folded["tables"] == [{"header": ["strategy", "ratio"], "rows": [["single", 0.98]]}]


@pytest.mark.slow
def test_an_unknown_section_or_a_used_folder_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, *COMPARE, "--only", "speed"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such section" in proc.stderr
    proc = subprocess.run([sys.executable, *COMPARE, "--only", "predict", "--families", "mlp,lstm"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--families lstm: no such model family" in proc.stderr
    (tmp_path / "old.md").write_text("x")
    proc = subprocess.run([sys.executable, *COMPARE, "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "not empty" in proc.stderr


def test_a_variants_file_sets_the_predict_sections_models_strategies_and_worlds(tmp_path):
    import importlib
    from pathlib import Path
    sys.path.insert(0, str(Path("benchmarks").resolve()))
    try:
        predict, common = importlib.import_module("sections.predict"), importlib.import_module("common")
    finally:
        sys.path.pop(0)
    spec = tmp_path / "mine.yaml"
    spec.write_text("families:\n  tiny: {model: {name: mlp, hidden: [8]}, data: {name: digits}, batch: 16}\n"
                    "strategies: [ddp, gpipe, hsdp]\nworlds: [4]\n")
    bench = common.Bench(tmp_path, None, False, variants=predict.load_variants(spec))
    configs = [(family, label, world) for family, label, _, world, _ in predict._configs(bench, False)]
    assert configs == [("tiny", "ddp", 4), ("tiny", "gpipe", 4), ("tiny", "hsdp", 4)]
    assert predict._families(bench)["tiny"][2] == 16
    import re
    shipped = sorted(Path("benchmarks/variants").glob("*.yaml"))
    assert shipped
    for variants in shipped:  # the files the README names load, each named by what it holds
        assert predict.load_variants(variants)["families"], variants
        assert not re.fullmatch(r"machine\d*(w4)?", variants.stem), f"{variants}: name it by the models it holds"


@pytest.mark.slow
def test_a_wrong_variants_file_is_refused_with_what_to_fix(tmp_path):
    spec = tmp_path / "bad.yaml"
    for text, message in (("families: {a: {model: {name: mlp}}}\n", "family 'a' needs exactly model"),
                          ("families: {a: {model: {}, data: {}, batch: 4}}\nstrategies: [ddpp]\n", "strategies ddpp"),
                          ("families: {a: {model: {}, data: {}, batch: 4}}\nworlds: [3]\n", "worlds [3]"),
                          ("famlies: {}\n", "needs a 'families' mapping")):
        spec.write_text(text)
        proc = subprocess.run([sys.executable, *COMPARE, "--only", "predict", "--variants", str(spec)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, (text, proc.stderr)


def test_the_predict_section_names_each_swapped_pair_and_whether_its_runs_overlap():
    """A pair predicted in the order opposite to its measured medians is named; marked ~ where the
    two measured ranges over the rounds overlap (the measurement does not settle their order),
    never with one run each (no spread known)."""
    import importlib
    from pathlib import Path
    sys.path.insert(0, str(Path("benchmarks").resolve()))
    try:
        predict = importlib.import_module("sections.predict")
    finally:
        sys.path.pop(0)
    items = [("ddp", 1.0, [1.0, 1.1, 1.2]),  # predicted fastest, measured fastest: agrees
             ("zero1", 2.0, [1.9, 2.0, 2.3]),  # predicted before gpipe, measured after it within their ranges
             ("gpipe", 2.5, [1.8, 1.95, 2.0]),
             ("fsdp", 1.5, [3.0, 3.1, 3.2])]  # predicted before zero1 and gpipe, measured well after both
    assert predict.swapped_pairs(items) == ["zero1/gpipe~", "zero1/fsdp", "gpipe/fsdp"]
    assert predict.swapped_pairs([("a", 1.0, [2.0]), ("b", 2.0, [1.9])]) == ["a/b"]
    assert predict.swapped_pairs(items[:2]) == []


def test_the_predict_section_runs_again_a_configuration_whose_median_rests_on_runs_that_disagree():
    """With rounds, a configuration whose median rests on runs 25 % or more apart (two rounds:
    those two; three: the median and its nearer neighbour) runs again, so that one slow spell of
    a shared machine does not set its measured step; one slow run of three is left out already."""
    import importlib
    from pathlib import Path
    sys.path.insert(0, str(Path("benchmarks").resolve()))
    try:
        predict = importlib.import_module("sections.predict")
    finally:
        sys.path.pop(0)
    assert predict.unsettled([0.078, 0.020])  # mlp640 DDP's two rounds on the Xeon VM
    assert not predict.unsettled([0.020, 0.022]) and not predict.unsettled([0.020])
    assert not predict.unsettled([0.020, 0.078, 0.021])  # the median leaves the slow one out
    assert predict.unsettled([0.020, 0.050, 0.078])  # no two runs near the median agree
    assert predict.unsettled([0.020, 0.050, 0.078, 0.075]) and not predict.unsettled([0.020, 0.070, 0.078, 0.075])
    assert predict.unsettled([0.020, None, 0.078])  # a failed run counts for nothing
