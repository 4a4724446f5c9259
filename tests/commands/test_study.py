"""Studies: the Fashion-MNIST study's cpu profile runs end to end through suite.submit and its
report sets the published figures beside ours; bad study input is one line."""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from analysis import wandb_runs
from suite.study import __main__ as study, arms
from suite.record.run_record import read_json
from tests.run_folders import rank_pids
from tests.browser import assert_renders

STUDY = "recipes/studies/fashion_mnist_dp.yaml"
# the arms on digits; the larger-data arms (large-single, large-ddp) train on synthetic 28x28 images
ARMS = ["allreduce", "ddp", "hogwild", "mpi", "single", "tf_mirrored", "tf_mirrored_loop", "tf_single"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("studies")
    # as a user runs it: W&B at its default (offline), not the test session's disabled
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    proc = subprocess.run([sys.executable, "-m", "suite.study", STUDY, "--repeats", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)  # 10 arms x 2; TF's import ~10 s per run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "W&B" not in proc.stderr, proc.stderr[-2000:]  # every arm's live run and the study's own run written
    report = Path(re.search(r"^study fashion_mnist_dp \(cpu\): (\S+)$", proc.stdout, re.M).group(1))
    return report.parent, report, proc


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_cpu_profile_runs_every_arm_and_repeat_through_submit(finished):
    folder, report, _ = finished
    assert report == folder / "report.html" and report.is_file()
    runs = sorted((folder / "runs").glob("*/summary.json"))
    arms = sorted(yaml.safe_load((p.parent / "recipe.yaml").read_text())["arm"] for p in runs)
    assert arms == sorted(2 * [*ARMS, "large-ddp", "large-single"])
    for p in runs:
        s, arm = read_json(p), yaml.safe_load((p.parent / "recipe.yaml").read_text())["arm"]
        assert s["status"] == "completed", arm
        if arm.startswith("large-"):  # the larger-data arms: 1 epoch of 2,816 synthetic 28x28 images // 32
            assert s["data"] == "synthetic" and s["steps"] == 88
        else:  # 7 epochs of 1,438 digits // 32 per step (the last partial batch is dropped)
            assert s["data"] == "digits" and s["steps"] == 7 * 44
    # An arm's repeats train in one warm process, TensorFlow's too (its import is most of a run)
    pids: dict = {}
    for p in runs:
        arm = yaml.safe_load((p.parent / "recipe.yaml").read_text())["arm"]
        pids.setdefault(arm, set()).add(tuple(rank_pids(p.parent)))
    assert all(len(pids[arm]) == 1 for arm in ("tf_single", "tf_mirrored", "tf_mirrored_loop", "single")), pids
    assert sorted(p.name for p in (folder / "recipes").iterdir()) == sorted(
        f"{arm}.yaml" for arm in [*ARMS, "large-ddp", "large-single"])
    # the study's own W&B run, in its arms' group, holds the report's tables
    (own,) = [d for d in wandb_runs.run_dirs(folder) if wandb_runs.read(d)["id"] == folder.name]
    logged = {k.split(".")[0] for row in wandb_runs.read(own)["history"] for k in row if k.endswith(".path")}
    assert {"published_vs_ours", "throughput", "runs"} <= logged, logged


@pytest.mark.slow
@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_report_lists_every_run_with_the_published_figures_beside_ours(finished):
    folder, report, _ = finished
    page = report.read_text()
    for p in (folder / "runs").glob("*/summary.json"):
        assert read_json(p)["run_id"] in page
    rows = _csv(folder / "published_vs_ours.csv")
    assert [r["published"] for r in rows] == ["46.18 s", "35.49 s", "29.21 s", "17.46 s", "0.8922 fraction",
                                              "0.2878 nats", "0.8753 fraction", "0.3565 nats",
                                              "46.18 s", "29.21 s", "17.46 s", "0.8753 fraction"]  # TensorFlow's
    for row in rows:
        assert row["published"] in page
    by_arm = {(r["published_arm"], r["published"]): r for r in rows[:8]}  # the PyTorch analogues
    mpi = by_arm[("S2 with MPI", "35.49 s")]
    assert mpi["ours_arm"] == "mpi" and mpi["published_compared"] == "1.3x"
    assert "syncs the model parameters" in mpi["because"] and "through MPI" in mpi["because"]
    assert mpi["because"].endswith("[source: FM-S2-code, FM-S2-log; our assumption]") and mpi["source"] == "FM-S2-time"
    summaries = {}
    for p in (folder / "runs").glob("*/summary.json"):
        arm = yaml.safe_load((p.parent / "recipe.yaml").read_text())["arm"]
        summaries.setdefault(arm, []).append(read_json(p)["train_time_s"])
    mean = {arm: sum(v) / len(v) for arm, v in summaries.items()}
    ddp = by_arm[("S3 MirroredStrategy", "29.21 s")]
    assert ddp["ours"].startswith(f"{mean['ddp']:.4g} s (mean of 2")
    assert ddp["published_compared"] == f"{46.18 / 29.21:.3g}x"
    assert ddp["ours_compared"] == f"{mean['single'] / mean['ddp']:.3g}x"
    assert "speed-up is" in ddp["differs"] and ddp["because"].startswith("their batch is not stated (FM-S3); ours: the global batch stays 32")
    assert ddp["because"].endswith("[source: FM-S3; our assumption]")
    tf_rows = {r["ours_arm"].split()[0]: r for r in rows[8:]}  # TensorFlow's arms, against tf_single
    assert tf_rows["tf_mirrored"]["ours_compared"] == f"{mean['tf_single'] / mean['tf_mirrored']:.3g}x"
    assert tf_rows["tf_mirrored_loop"]["compare"].endswith("ours vs tf_single")
    # The cpu profile trains on digits: the accuracy reached is not set beside Fashion-MNIST's.
    assert by_arm[("S1 without MPI", "0.8922 fraction")]["differs"].startswith("not comparable: ours trained on digits")
    assert by_arm[("S1 without MPI", "0.3565 nats")]["source"] == "FM-S1-test-loss"  # the published test loss


@pytest.mark.slow
@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_tables_and_plots_name_the_arm(finished):
    folder, _, _ = finished
    throughput = _csv(folder / "throughput.csv")
    arms = {*ARMS, "large-single", "large-ddp"}
    assert {r["arm"] for r in throughput} == arms
    assert {r["runs"] for r in throughput} == {"2"}  # the two seeds are repeats of one experiment
    assert {r["arm"] for r in _csv(folder / "runs.csv")} == arms
    # epochs to the study's thresholds: one row per arm and threshold; the torch arms take the same steps
    reached = {(r["arm"], r["threshold"]): r for r in _csv(folder / "epochs_to_threshold.csv")}
    assert {arm for arm, _ in reached} == arms and {t for _, t in reached} == {"0.8", "0.9"}
    assert len({reached[(arm, "0.8")]["epochs"] for arm in ("single", "ddp", "allreduce", "mpi")}) == 1
    # one plot per baseline arm: the torch arms beside single, the TensorFlow arms beside tf_single
    assert sorted(p.name for p in (folder / "plots").glob("steps-*.png")) == [
        "steps-large-single.png", "steps-single.png", "steps-tf_single.png"]


@pytest.mark.slow
@pytest.mark.timeout(1000)  # the first to run runs the study (module fixture)
def test_the_study_report_renders_in_a_browser(finished):
    _, report, _ = finished
    seen = assert_renders(report)
    assert len(seen["images"]) >= 3 and seen["tables"]


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(baseline="zero"), "baseline='zero' must name one of the arms: single, ddp, allreduce, mpi"),
    (lambda s: s["reference"]["figures"][0].update(unit="parsecs"),
     "reference.figures.0.unit='parsecs' does not fit measure train_time_s; use one of s, ms, min, h"),
    (lambda s: s["reference"]["figures"][1].pop("ours"), "reference.figures.1: give ours"),
    (lambda s: s["reference"]["figures"][2].update(ours="fsdp"), "reference.figures.2.ours='fsdp' is not an arm"),
    (lambda s: s["reference"].update(sauce="x"), "unknown key reference.sauce; accepted here: source,"),
    (lambda s: s["reference"].pop("source"), "reference.source is required (the title of the paper"),
    (lambda s: s["arms"]["ddp"].update({"strategy.bucket_cap": 1}), "arm ddp: unknown recipe key strategy.bucket_cap"),
    (lambda s: s.update(repeats=0), "repeats=0 must be a whole number >= 1"),
    (lambda s: s.update(prices="nowhere.yaml"), "prices='nowhere.yaml': no such price table"),
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
         "what": "time", "compare": "ratio", "source": "X-one"},
        {"published": "two", "ours": "ddp", "measure": "train_time_s", "value": 0.5, "unit": "min",
         "what": "time", "compare": "ratio", "why": "we share cores", "assumption": True, "source": "X-two"},
        {"published": "one", "ours": "single", "measure": "final_train_accuracy", "value": 80.0, "unit": "%",
         "what": "accuracy", "compare": "absolute", "source": "X-one-acc"},
        {"published": "mpi", "measure": "train_time_s", "value": 1.0, "unit": "s", "what": "time",
         "compare": "absolute", "not_run": "no MPI here", "source": "X-mpi"},
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
    assert ddp["differs"] == "our speed-up is higher (1.12x theirs)"
    assert ddp["because"] == "we share cores [our assumption]" and ddp["source"] == "X-two"
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


# ---- several baselines: a study of several models, each against its own one-device arm ----

def _two_model_study(tmp_path, **arm_edits) -> Path:
    raw = yaml.safe_load(Path(STUDY).read_text())
    raw.pop("baseline")
    raw["arms"] = {"mlp-single": {"strategy.name": "single", "profiles": {"cpu": {"training.epochs": 2}}},
                   "mlp-ddp": {"baseline": "mlp-single", "strategy.name": "ddp", "launch.tasks_per_node": 2,
                               "training.batch_size": 64, "profiles": {"cpu": {"training.epochs": 2}}},
                   "cnn-single": {"model.name": "cnn", "data.name": "synthetic", "data.shape": [3, 32, 32]},
                   "cnn-ddp": {"baseline": "cnn-single", "model.name": "cnn", "data.name": "synthetic",
                               "data.shape": [3, 32, 32], "strategy.name": "ddp", "launch.tasks_per_node": 2}}
    for arm, edit in arm_edits.items():
        raw["arms"][arm].update(edit)
    figures = raw["reference"]["figures"]
    figures[3].update(ours="mlp-ddp")
    figures[2].update(ours="mlp-ddp")
    figures[1].update(ours="mlp-ddp")
    figures[0].update(ours="mlp-single")
    for fig in figures[4:]:
        fig.update(ours="mlp-single")
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_each_arm_divides_by_its_own_baseline_and_takes_its_own_profile(tmp_path):
    from analysis.study import baselines

    raw, spec = arms.split(_two_model_study(tmp_path))
    assert baselines(spec["arms"], spec.get("baseline")) == {
        "mlp-single": "mlp-single", "mlp-ddp": "mlp-single", "cnn-single": "cnn-single", "cnn-ddp": "cnn-single"}
    recipes = arms.arm_recipes(raw, spec, "cpu", 1)
    # the arm's own cpu profile wins over the study's (epochs 7) and sits beside the arm's keys
    assert recipes["mlp-ddp"]["training"]["epochs"] == 2 and recipes["mlp-ddp"]["training"]["batch_size"] == 64
    assert recipes["cnn-ddp"]["training"]["epochs"] == 7 and recipes["cnn-ddp"]["model"] == {"name": "cnn"}
    assert "baseline" not in recipes["mlp-ddp"] and "profiles" not in recipes["mlp-ddp"]
    full = arms.arm_recipes(raw, spec, "full", 1)
    assert full["mlp-ddp"]["training"]["epochs"] == 10  # the arm has no full profile of its own


@pytest.mark.parametrize("arm_edits, message", [
    ({"mlp-ddp": {"baseline": "tpu"}}, "arms.mlp-ddp.baseline='tpu' must name one of the arms: mlp-single,"),
    ({"cnn-single": {"baseline": "mlp-ddp"}},
     "arms.cnn-single.baseline='mlp-ddp', but mlp-ddp divides by mlp-single itself; name mlp-single"),
    ({"mlp-ddp": {"baseline": None}}, "arms.mlp-single: give its baseline (the arm its ratios divide by)"),
    ({"mlp-ddp": {"profiles": {"gpu": {"training.epochs": 1}}}},
     "arms.mlp-ddp.profiles must map profile names of the study (cpu, full) to override sets"),
])
def test_bad_arm_baseline_or_profile_is_one_line(tmp_path, capsys, arm_edits, message):
    assert study.main([str(_two_model_study(tmp_path, **arm_edits)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_ratios_divide_by_the_arms_baseline_and_the_figures_published_baseline():
    from analysis.study import check_reference, comparison_rows, header, plot_groups

    figures = [
        {"published": "A 1 GPU", "ours": "a-single", "measure": "epoch_time_s", "value": 20.0, "unit": "s",
         "what": "time", "compare": "ratio", "source": "X-a1"},
        {"published": "A 2 GPU", "ours": "a-ddp", "measure": "epoch_time_s", "value": 10.0, "unit": "s",
         "what": "time", "compare": "ratio", "source": "X-a2"},
        {"published": "B 1 GPU", "ours": "b-single", "measure": "epoch_time_s", "value": 6.0, "unit": "s",
         "what": "time", "compare": "ratio", "baseline": "B 1 GPU", "source": "X-b1"},
        {"published": "B 2 GPU", "ours": "b-ddp", "measure": "epoch_time_s", "value": 2.0, "unit": "s",
         "what": "time", "compare": "ratio", "baseline": "B 1 GPU", "why": "other GPUs", "why_source": "X-hw",
         "source": "X-b2"},
        {"published": "B 1 GPU", "ours": "b-single", "measure": "final_train_accuracy", "value": 0.5,
         "unit": "fraction", "what": "acc", "compare": "absolute", "data": "imdb", "source": "X-b1-acc"},
    ]
    arms = {"a-single": {}, "a-ddp": {"baseline": "a-single"}, "b-single": {}, "b-ddp": {"baseline": "b-single"}}
    reference = {"source": "T", "hardware": "h", "data": "not stated", "baseline": "A 1 GPU", "figures": figures}
    check_reference(reference, arms)
    spec = {"name": "s", "repeats": 1, "reference": reference, "baseline": None, "arms": arms, "profile": "full"}

    def run(arm, epoch_s, data="cifar10", accuracy=0.6):
        r = _run(arm, data, None, accuracy)
        r.summary["epoch_time_s"] = [epoch_s]
        return r

    runs = [run("a-single", 4.0), run("a-ddp", 2.0), run("b-single", 9.0, "imdb"), run("b-ddp", 6.0, "imdb")]
    a1, a2, b1, b2, acc = comparison_rows(spec, runs)
    assert a2["published_compared"] == "2x" and a2["ours_compared"] == "2x"
    # B's ddp divides by b-single (9 / 6 = 1.5x), theirs by "B 1 GPU" (6 / 2 = 3x), not by A's
    assert b2["published_compared"] == "3x" and b2["ours_compared"] == "1.5x"
    assert b2["compare"] == "ratio: speed-up vs B 1 GPU / ours vs b-single"
    assert b2["differs"] == "our speed-up is lower (0.50x theirs)" and b2["because"] == "other GPUs [source: X-hw]"
    assert b1["ours_compared"] == "1x" and a1["compare"].endswith("ours vs a-single")
    # the figure's own data set decides comparability, not reference.data
    assert acc["differs"] == "ours is higher (1.20x theirs)"
    assert "baseline arms a-single, b-single" in header(spec)
    groups = plot_groups(spec, runs)
    assert {k: [r.arm for r in v] for k, v in groups.items()} == {"a-single": ["a-single", "a-ddp"],
                                                                  "b-single": ["b-single", "b-ddp"]}
    bad = [dict(figures[3], baseline="C 1 GPU")]
    with pytest.raises(Exception, match=r"figures.0.compare=ratio needs a baseline \(the figure's or reference"):
        check_reference({**reference, "figures": bad}, arms)


def test_arms_runs_the_named_arms_with_their_baselines(capsys):
    raw, spec = arms.split("recipes/studies/six_models_ddp.yaml")
    assert arms.chosen("mlp-ddp,cnn-single", spec) == ["cnn-single", "mlp-single", "mlp-ddp"]
    assert study.main([STUDY, "--arms", "ddp", "--dry-run"]) == 0
    assert capsys.readouterr().out.count("nothing launched (--dry-run)") == 2  # single (its baseline) and ddp
    assert study.main([STUDY, "--arms", "ddp,tpu", "--dry-run"]) == 2
    assert capsys.readouterr().err == ("error: --arms ddp,tpu: tpu is not an arm of the study; its arms: single, ddp, "
                                       "allreduce, mpi, tf_single, tf_mirrored, tf_mirrored_loop, hogwild, large-single, "
                                       "large-ddp\n")
