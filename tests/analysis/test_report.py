"""The comparison report on small real runs: its numbers are the run records' numbers, bad runs
are skipped with a reason, and analysis never imports torch."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import pytest

from analysis import render, tables
from suite.train import rank as train_rank
from suite.record.run_record import read_json, read_metrics
from tests import browser
from tests.parity import make_recipe, step_losses

SMALL = {"data": {"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 128, "n_val": 64},
         "training": {"epochs": 2, "batch_size": 32, "seed": 1, "log_every_steps": 4}}


def _run(strategy, world, out):
    recipe = make_recipe({"name": strategy}, world, **SMALL)
    run_dir = train_rank.new_run_dir(recipe, out)
    step_losses(recipe, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """single x1 from 'machine a', ddp x2 from 'machine b', and broken copies beside them."""
    root = tmp_path_factory.mktemp("runs")
    single = _run("single", 1, root / "machine_a")
    ddp = _run("ddp", 2, root / "machine_b")
    bad = root / "machine_c"
    shutil.copytree(single, bad / "single-copy")  # a repeat: kept
    shutil.copytree(single, bad / "other-recipe")
    s = read_json(single / "summary.json")
    (bad / "other-recipe" / "summary.json").write_text(json.dumps({**s, "recipe_fingerprint": "000000000000"}))
    shutil.copytree(ddp, bad / "truncated")
    text = (ddp / "metrics.jsonl").read_text()
    (bad / "truncated" / "metrics.jsonl").write_text(text[: len(text) // 2])
    shutil.copytree(ddp, bad / "corrupt")
    (bad / "corrupt" / "summary.json").write_text('{"status": "compl')
    shutil.copytree(ddp, bad / "running")
    (bad / "running" / "summary.json").write_text(json.dumps({"status": "running", "name": "parity"}))
    shutil.copytree(ddp, bad / "no-metrics")
    (bad / "no-metrics" / "metrics.jsonl").unlink()
    return root, single, ddp


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    root, single, _ = runs
    out = tmp_path_factory.mktemp("report")
    target = read_json(single / "summary.json")["final"]["val_accuracy"]
    # Run the CLI's main in a fresh interpreter and prove it never imported torch.
    code = ("import sys; from analysis import report; rc = report.main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'analysis imported torch'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(root), "--out", str(out), "--target-accuracy", str(target),
                           "--wandb-report"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_report_writes_html_with_plots_and_tables(report):
    out, _ = report
    page = (out / "report.html").read_text()
    images = [p.split("'")[0] for p in page.split("<img src='")[1:]]
    assert len(images) >= 2
    for image in images:
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("throughput", "time_to_target", "verdicts", "cost", "runs", "skipped"):
        assert (out / f"{name}.csv").exists()
    assert "Throughput and memory: mlp" in (out / "tables.md").read_text()


@pytest.mark.slow
def test_report_renders_in_a_browser_every_image_loaded_every_table_with_rows(report):
    out, _ = report
    seen = browser.assert_renders(out / "report.html")
    assert len(seen["images"]) >= 3 and all(i["width"] > 0 for i in seen["images"])
    assert len(seen["tables"]) >= 4


@pytest.mark.slow
def test_the_browser_check_sees_a_broken_image_and_an_empty_table(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<html><body><h2>t</h2><img src='plots/missing.png'><table><thead><tr><th>a</th></tr></thead>"
                    "<tbody></tbody></table></body></html>")
    seen = browser.render(page)
    assert seen["images"] == [{"src": "plots/missing.png", "width": 0, "loaded": False}]
    assert seen["tables"] == [{"caption": "t", "rows": 0}]
    with pytest.raises(AssertionError, match="did not load in chromium"):
        browser.assert_renders(page)


@pytest.mark.slow
def test_throughput_table_numbers_are_the_run_records(runs, report):
    _, single, ddp = runs
    out, _ = report
    s1, s2 = read_json(single / "summary.json"), read_json(ddp / "summary.json")
    rows = {r["strategy"]: r for r in _csv(out / "throughput.csv")}
    assert float(rows["single"]["samples_per_s"]) == s1["samples_per_s"]
    assert rows["single"]["runs"] == "2"  # the copy from machine c counts as a repeat
    assert float(rows["ddp"]["samples_per_s"]) == s2["samples_per_s"]
    speedup = s2["samples_per_s"] / s1["samples_per_s"]
    assert float(rows["ddp"]["speedup"]) == pytest.approx(speedup, rel=1e-12)
    assert float(rows["ddp"]["scaling_efficiency"]) == pytest.approx(speedup / 2, rel=1e-12)
    assert [float(x) for x in rows["ddp"]["peak_memory_bytes_per_rank"].split(";")] == \
        [r["peak_memory_bytes"] for r in s2["ranks"]]
    assert [float(x) for x in rows["ddp"]["held_bytes_per_rank"].split(";")] == \
        [sum(r["held_bytes"].values()) for r in s2["ranks"]]
    md = (out / "tables.md").read_text()
    assert render.per_rank_bytes([r["peak_memory_bytes"] for r in s2["ranks"]]) in md
    util = sum(r["cpu_percent_mean"] for r in s2["ranks"]) / 2
    assert float(rows["ddp"]["utilisation_percent"]) == pytest.approx(util, rel=1e-12)


@pytest.mark.slow
def test_time_to_target_and_verdicts_follow_the_records(runs, report):
    _, single, ddp = runs
    out, _ = report
    target = read_json(single / "summary.json")["final"]["val_accuracy"]
    for row in _csv(out / "time_to_target.csv"):
        run = single if row["strategy"] == "single" else ddp
        epochs = read_metrics(run, kind="epoch", rank=0)
        first = next(e for e in epochs if e["val_accuracy"] >= target)
        assert int(row["epochs"]) == first["epoch"] + 1
        assert float(row["time_s"]) == pytest.approx(sum(e["epoch_time_s"] for e in epochs[: first["epoch"] + 1]))
    verdicts = {r["strategy"]: r for r in _csv(out / "verdicts.csv")}
    # ddp matches the baseline step for step (tests/strategies/test_data_parallel.py): accuracy and loss unchanged
    assert verdicts["ddp"]["accuracy"] == "unchanged" and verdicts["ddp"]["loss"] == "unchanged"
    assert verdicts["ddp"]["time"] in ("better", "unchanged", "worse")


@pytest.mark.slow
def test_broken_runs_are_skipped_with_their_reason_not_a_crash(report):
    out, proc = report
    reasons = {r["path"].rsplit("/", 1)[1]: r["reason"] for r in _csv(out / "skipped.csv")}
    assert set(reasons) == {"other-recipe", "truncated", "corrupt", "running", "no-metrics"}
    assert "different recipe" in reasons["other-recipe"]
    assert reasons["truncated"].startswith("missing metrics")
    assert "corrupt" in reasons["corrupt"]
    assert reasons["running"].startswith("lost")  # says running, but no rank process is alive
    assert reasons["no-metrics"].startswith("missing metrics")
    assert proc.stderr.count("skipped ") == 5
    assert "Skipped runs" in (out / "report.html").read_text()


@pytest.mark.slow
def test_mfu_is_labelled_with_where_its_peak_came_from(runs, report):
    _, _, ddp = runs
    out, _ = report
    rows = {r["strategy"]: r for r in _csv(out / "throughput.csv")}
    s = read_json(ddp / "summary.json")
    assert s["peak_flops_source"] == "measured"  # CPU runs: MFU against the node's measured peak
    assert float(rows["ddp"]["mfu"]) == s["mfu"] and rows["ddp"]["peak_source"] == "measured"
    assert "| MFU (measured peak) |" in (out / "tables.md").read_text()
    assert "<th>MFU (measured peak)</th>" in (out / "report.html").read_text()


@pytest.mark.slow
def test_mfu_cells_say_their_peak_when_a_table_mixes_sources():
    from analysis import report

    rows = [{"mfu": 0.5, "peak_source": "measured"}, {"mfu": 0.25, "peak_source": "recipe"},
            {"mfu": None, "peak_source": None}]
    assert report.mfu_column(rows) == "MFU"
    assert [r["mfu_shown"] for r in rows] == ["0.5 (measured peak)", "0.25 (recipe peak)", None]
    alike = [{"mfu": 0.5, "peak_source": "vendor table"}, {"mfu": None, "peak_source": None}]
    assert report.mfu_column(alike) == "MFU (vendor peak)" and alike[0]["mfu_shown"] == 0.5


@pytest.mark.slow
@pytest.mark.parametrize("folder", ["empty", "missing"])
def test_a_folder_without_runs_is_one_line_and_exit_code_2(folder, tmp_path, capsys):
    """Not an empty report that looks like a comparison of nothing: the folder given is wrong."""
    from analysis import report as report_cli

    runs = tmp_path / folder
    if folder == "empty":
        (runs / "not-a-run").mkdir(parents=True)
    code = report_cli.main([str(runs), "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert (f"no run folders under {runs}" if folder == "empty" else f"{runs} does not exist") in err, err
    assert "--out, default runs/" in err and not (tmp_path / "report").exists()


def test_verdict_rule():
    assert tables.verdict("accuracy", [0.90], [0.80])[0] == "better"
    assert tables.verdict("accuracy", [0.802], [0.80])[0] == "unchanged"  # within the 0.005 floor
    assert tables.verdict("loss", [1.004], [1.0])[0] == "unchanged"  # within 1%
    assert tables.verdict("time", [1.2], [1.0])[0] == "worse"
    # repeats widen the band: 2 x the standard error of the difference
    assert tables.verdict("time", [1.0, 1.4], [1.0, 1.0])[0] == "unchanged"


@pytest.mark.slow
def test_a_resumed_run_counts_each_step_once_the_later_attempt_winning(runs, tmp_path):
    from analysis.runs import Run, load

    _, single, _ = runs
    resumed = tmp_path / "resumed"
    shutil.copytree(single, resumed)
    lines = (resumed / "metrics.jsonl").read_text().splitlines()
    first_attempt = [json.dumps({**json.loads(ln), "attempt": 0, "global_loss": 99.0}) for ln in lines
                     if json.loads(ln)["kind"] == "step" and json.loads(ln)["step"] >= 2]
    (resumed / "metrics.jsonl").write_text("\n".join(first_attempt + lines) + "\n")
    run = load(resumed)
    assert isinstance(run, Run), run
    assert len(run.steps[0]) == read_json(resumed / "summary.json")["steps"]
    assert all(s["global_loss"] != 99.0 for s in run.steps[0])


@pytest.mark.slow
def test_other_seeds_are_repeats_of_one_experiment_other_strategy_options_are_not(runs, tmp_path):
    import yaml

    from analysis.runs import load_all

    _, _, ddp = runs
    for name, edit in (("seed7", lambda r: r["training"].update(seed=7)),
                       ("buckets", lambda r: r["strategy"].update(bucket_cap_mb=1))):
        shutil.copytree(ddp, tmp_path / name)
        recipe = yaml.safe_load((tmp_path / name / "recipe.yaml").read_text())
        edit(recipe)
        (tmp_path / name / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    shutil.copytree(ddp, tmp_path / "original")
    kept, skipped = load_all([tmp_path])
    assert sorted(r.path.name for r in kept) == ["original", "seed7"]
    assert len({r.experiment for r in kept}) == 1
    assert [s.path.name for s in skipped] == ["buckets"] and "strategy options" in skipped[0].reason


@pytest.mark.slow
def test_the_parity_table_names_a_models_dropout_from_its_certificate(tmp_path):
    """suite.verify keeps the model's dropout in verify.json (a reason the verdict differs that
    is no bug); the report's parity row shows it, and nothing where the model has none."""
    from types import SimpleNamespace

    from analysis.report import PARITY_NOTE, parity_rows
    from suite.verify import Certificate, judge

    runs = []
    for name, dropout in (("with", "1 dropout module"), ("without", "")):
        folder = tmp_path / name
        folder.mkdir()
        steps = judge([2.0, 1.9], [2.0, 1.5], [2.0, 1.9], "fp64")
        Certificate("ddp", 2, "fp64", "float64", steps, dropout=dropout).write(folder)
        runs.append(SimpleNamespace(path=folder, run_id=name))
    rows = {r["run_id"]: r for r in parity_rows(runs)}
    assert rows["with"]["dropout"] == "1 dropout module" and rows["with"]["verdict"] == "differs"
    assert rows["without"]["dropout"] == ""
    assert "set its rate to 0" in PARITY_NOTE


def test_offline_the_wandb_report_says_what_it_would_publish_and_the_html_report_is_written(report):
    out, proc = report
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("W&B report")]
    assert line.startswith("W&B report not published (W&B mode is disabled; tracking.wandb=online")
    assert "it would publish 'scalesuite report' to (default entity)/scalesuite" in line
    assert "group(s) parity" in line and "Throughput and memory: mlp" in line
    assert (out / "report.html").exists()


def test_the_wandb_report_has_the_html_reports_sections_and_panels_over_the_runs_groups(report):
    """Built, not saved: saving needs a server and a key."""
    import wandb_workspaces.reports.v2 as wr

    from analysis import wandb_report

    out, _ = report
    markdown = ["## " + part for part in (out / "tables.md").read_text().split("\n## ")[1:]]
    parts = wandb_report.sections(markdown)
    where = {"project": "scalesuite", "entity": "lab", "groups": ["fig3-cpu-20260101-000000"], "mode": "online"}
    built = wandb_report.build("scalesuite report", where, parts)
    assert isinstance(built, wr.Report) and (built.project, built.entity) == ("scalesuite", "lab")
    headings = [b.text for b in built.blocks if isinstance(b, wr.H2)]
    assert headings == [h for h, _ in parts] and "Throughput and memory: mlp" in headings
    tables_md = [b.text for b in built.blocks if isinstance(b, wr.MarkdownBlock)]
    assert len(tables_md) == len(headings) and not any("![" in t for t in tables_md)
    (grid,) = [b for b in built.blocks if isinstance(b, wr.PanelGrid)]
    (runset,) = grid.runsets
    assert "fig3-cpu-20260101-000000" in str(runset.filters) and runset.project == "scalesuite"
    assert [p.title for p in grid.panels] == [title for title, _, _ in wandb_report.PANELS]
