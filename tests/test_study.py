"""Studies: the Fashion-MNIST study's cpu profile runs end to end through suite.submit and its
report sets the published figures beside ours; bad study input is one line."""
from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from suite import study
from suite.record.run_record import read_json
from tests.browser import assert_renders

STUDY = "recipes/studies/fashion_mnist_dp.yaml"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("studies")
    proc = subprocess.run([sys.executable, "-m", "suite.study", STUDY, "--repeats", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)  # 6 arms x 2; TF's import ~10 s per run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = Path(re.search(r"^study fashion_mnist_dp \(cpu\): (\S+)$", proc.stdout, re.M).group(1))
    return report.parent, report, proc


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_cpu_profile_runs_every_arm_and_repeat_through_submit(finished):
    folder, report, _ = finished
    assert report == folder / "report.html" and report.is_file()
    runs = sorted((folder / "runs").glob("*/summary.json"))
    arms = sorted(yaml.safe_load((p.parent / "recipe.yaml").read_text())["arm"] for p in runs)
    assert arms == sorted(2 * ["allreduce", "ddp", "single", "tf_mirrored", "tf_mirrored_loop", "tf_single"])
    for p in runs:  # 7 epochs of 1,438 digits // 32 per step (the last partial batch is dropped)
        s = read_json(p)
        assert s["status"] == "completed" and s["data"] == "digits" and s["steps"] == 7 * 44
    assert sorted(p.name for p in (folder / "recipes").iterdir()) == [
        "allreduce.yaml", "ddp.yaml", "single.yaml", "tf_mirrored.yaml", "tf_mirrored_loop.yaml", "tf_single.yaml"]


@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_report_lists_every_run_with_the_published_figures_beside_ours(finished):
    folder, report, _ = finished
    page = report.read_text()
    for p in (folder / "runs").glob("*/summary.json"):
        assert read_json(p)["run_id"] in page
    rows = _csv(folder / "published_vs_ours.csv")
    assert [r["published"] for r in rows] == ["46.18 s", "35.49 s", "29.21 s", "17.46 s", "0.8922 fraction",
                                              "0.2878 nats", "0.8753 fraction",
                                              "46.18 s", "29.21 s", "17.46 s", "0.8753 fraction"]  # TensorFlow's
    for row in rows:
        assert row["published"] in page
    by_arm = {(r["published_arm"], r["published"]): r for r in rows[:7]}  # the PyTorch analogues
    mpi = by_arm[("S2 with MPI", "35.49 s")]
    assert mpi["differs"].startswith("not run by this suite yet: MPI") and mpi["published_compared"] == "1.3x"
    summaries = {}
    for p in (folder / "runs").glob("*/summary.json"):
        arm = yaml.safe_load((p.parent / "recipe.yaml").read_text())["arm"]
        summaries.setdefault(arm, []).append(read_json(p)["train_time_s"])
    mean = {arm: sum(v) / len(v) for arm, v in summaries.items()}
    ddp = by_arm[("S3 MirroredStrategy", "29.21 s")]
    assert ddp["ours"].startswith(f"{mean['ddp']:.4g} s (mean of 2")
    assert ddp["published_compared"] == f"{46.18 / 29.21:.3g}x"
    assert ddp["ours_compared"] == f"{mean['single'] / mean['ddp']:.3g}x"
    assert "speed-up is" in ddp["differs"] and "why: our global batch stays 32" in ddp["differs"]
    tf_rows = {r["ours_arm"].split()[0]: r for r in rows[7:]}  # TensorFlow's arms, against tf_single
    assert tf_rows["tf_mirrored"]["ours_compared"] == f"{mean['tf_single'] / mean['tf_mirrored']:.3g}x"
    assert tf_rows["tf_mirrored_loop"]["compare"].endswith("ours vs tf_single")
    # The cpu profile trains on digits: the accuracy reached is not set beside Fashion-MNIST's.
    assert by_arm[("S1 without MPI", "0.8922 fraction")]["differs"].startswith("not comparable: ours trained on digits")


@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_tables_and_plots_name_the_arm(finished):
    folder, _, _ = finished
    throughput = _csv(folder / "throughput.csv")
    assert {r["arm"] for r in throughput} == {"single", "ddp", "allreduce", "tf_single", "tf_mirrored", "tf_mirrored_loop"}
    assert {r["runs"] for r in throughput} == {"2"}  # the two seeds are repeats of one experiment
    assert {r["arm"] for r in _csv(folder / "runs.csv")} == {"single", "ddp", "allreduce", "tf_single", "tf_mirrored",
                                                             "tf_mirrored_loop"}
    assert len(list((folder / "plots").glob("steps-*.png"))) == 1


@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_the_study_report_renders_in_a_browser(finished):
    _, report, _ = finished
    seen = assert_renders(report)
    assert len(seen["images"]) >= 3 and seen["tables"]


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(baseline="mpi"), "baseline='mpi' must name one of the arms: single, ddp, allreduce"),
    (lambda s: s["reference"]["figures"][0].update(unit="parsecs"),
     "reference.figures.0.unit='parsecs' does not fit measure train_time_s; use one of s, ms, min, h"),
    (lambda s: s["reference"]["figures"][1].pop("not_run"), "reference.figures.1: give ours"),
    (lambda s: s["reference"]["figures"][2].update(ours="fsdp"), "reference.figures.2.ours='fsdp' is not an arm"),
    (lambda s: s["reference"].update(sauce="x"), "unknown key reference.sauce; accepted here: source,"),
    (lambda s: s["reference"].pop("source"), "reference.source is required (the title of the paper"),
    (lambda s: s["arms"]["ddp"].update({"strategy.bucket_cap": 1}), "arm ddp: unknown recipe key strategy.bucket_cap"),
    (lambda s: s.update(repeats=0), "repeats=0 must be a whole number >= 1"),
])
def test_bad_study_input_is_one_line(tmp_path, capsys, edit, message):
    raw = yaml.safe_load(Path(STUDY).read_text())
    edit(raw)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert study.main([str(path), "--dry-run", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_an_unknown_profile_names_the_known_ones(capsys):
    assert study.main([STUDY, "--profile", "gpu", "--dry-run"]) == 2
    assert capsys.readouterr().err == "error: --profile gpu: the study has no such profile; its profiles: cpu, full\n"


def _run(arm, data, train_time_s, train_accuracy):
    from analysis.runs import Run

    summary = {"data": data, "train_time_s": train_time_s, "final": {"train_accuracy": train_accuracy},
               "ranks": [{"rank": 0, "peak_memory_bytes": 1}]}
    return Run(Path(arm), summary, {"arm": arm})


def test_published_vs_ours_ratios_absolutes_and_directions():
    from analysis.study import check_reference, comparison_rows

    figures = [
        {"published": "one", "ours": "single", "measure": "train_time_s", "value": 40.0, "unit": "s",
         "what": "time", "compare": "ratio"},
        {"published": "two", "ours": "ddp", "measure": "train_time_s", "value": 0.5, "unit": "min",
         "what": "time", "compare": "ratio", "why": "we share cores"},
        {"published": "one", "ours": "single", "measure": "final_train_accuracy", "value": 80.0, "unit": "%",
         "what": "accuracy", "compare": "absolute"},
        {"published": "mpi", "measure": "train_time_s", "value": 1.0, "unit": "s", "what": "time",
         "compare": "absolute", "not_run": "no MPI here"},
    ]
    reference = {"source": "A title", "hardware": "a GPU", "data": "fashion_mnist", "baseline": "one",
                 "figures": figures}
    check_reference(reference, ["single", "ddp"])
    spec = {"reference": reference, "baseline": "single", "profile": "full"}
    runs = [_run("single", "fashion_mnist", 10.0, 0.8), _run("single", "fashion_mnist", 14.0, 0.9),
            _run("ddp", "fashion_mnist", 8.0, 0.85)]
    base, ddp, acc, mpi = comparison_rows(spec, runs)
    assert base["ours"] == "12 s (mean of 2, min-max 10-14)" and base["ours_compared"] == "1x"
    # theirs: 40 s / 30 s = 1.33x; ours: 12 s / 8 s = 1.5x, higher
    assert ddp["published_compared"] == "1.33x" and ddp["ours"] == "0.1333 min"
    assert ddp["ours_compared"] == "1.5x"
    assert ddp["differs"] == "our speed-up is higher (1.12x theirs); why: we share cores"
    assert acc["ours"] == "85 % (mean of 2, min-max 80-90)" and acc["differs"] == "ours is higher (1.06x theirs)"
    assert mpi["differs"] == "not run by this suite yet: no MPI here" and mpi["ours"] == ""
    digits = [_run("single", "digits", 10.0, 0.8)]
    assert comparison_rows(spec, digits)[2]["differs"].startswith("not comparable: ours trained on digits")


def test_missing_data_is_one_line_and_leaves_no_study_folder(tmp_path, capsys):
    out = tmp_path / "studies"
    code = study.main([STUDY, "--profile", "full", f"data.root={tmp_path / 'empty'}", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: data set fashion_mnist not found in "), err
    assert not list(out.iterdir())
