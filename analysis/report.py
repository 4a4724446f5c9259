"""Compare runs: ``python -m analysis.report RUNS... --out DIR [--target-accuracy A] [--target-loss L] [--study F]``

RUNS are run folders or folders holding them at any depth (e.g. runs copied from several
machines into one place). Writes ``DIR/report.html`` with PNG plots under ``DIR/plots/``,
Markdown tables in ``DIR/tables.md`` and CSV tables (raw numbers) beside them. Runs that
cannot be compared are listed with the reason and skipped. ``--study`` (a study folder's
``study.yaml``, see ``python -m suite.study``) adds the published figures beside ours
(``analysis.study``). Never imports torch.
"""
from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path

import yaml

from analysis import faults, plots, ranks as rank_times, render, study as studies, study_tables, tables, wandb_report, wandb_runs
from analysis.runs import RECORD_FILES, find_run_dirs, load_all
from suite.record import run_record
from suite.common.errors import SuiteError, one_line

DEFAULT_PRICES = Path(__file__).with_name("prices.yaml")

THROUGHPUT = {"experiment": "experiment", "arm": "arm", "strategy_shown": "strategy", "world_size": "world size", "global_batch": "global batch",
              "runs": "runs", "samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "speedup": "speed-up",
              "scaling_efficiency": "scaling efficiency", "utilisation": "mean utilisation",
              "peak_memory": "peak memory per rank", "held": "held bytes per rank",
              "achieved_flops_per_s": "achieved FLOP/s", "mfu_shown": "MFU"}
TARGET = {"experiment": "experiment", "arm": "arm", "strategy": "strategy", "world_size": "world size", "run_id": "run",
          "metric": "metric", "target": "target", "reached": "reached", "epochs": "epochs", "time_s": "time (s)"}
VERDICT = {"experiment": "experiment", "arm": "arm", "strategy": "strategy", "world_size": "world size",
           "accuracy": "accuracy", "loss": "loss", "time": "time per epoch", "miou": "mean IoU"}
COST = {"experiment": "experiment", "arm": "arm", "strategy": "strategy", "world_size": "world size", "run_id": "run", "device": "priced as",
        "devices": "devices", "wall_time_s": "wall time (s)", "device_hours": "device-hours",
        "price_per_device_hour": "price / device-hour", "cost": "cost", "currency": "currency"}
WANDB = {"run_id": "run", "experiment": "experiment", "arm": "arm", "name": "W&B run", "group": "group", "attempts": "attempts",
         "history_rows": "history rows",
         "matches_record": "steps match record", "system_samples": "system samples",
         "cpu_percent_mean": "cpu % mean", "rss_mb_peak": "RSS peak (MB)"}
PREDICTED = {"experiment": "experiment", "strategy": "strategy", "world_size": "world size", "run_id": "run",
             "source": "profile", **{f"{k}_{part}": f"{label} {part}" for k, label in
                                     (("held", "held bytes"), ("peak", "peak memory"), ("step", "step time (s)"),
                                      ("rate", "samples/s")) for part in ("predicted", "measured", "error")}}
SKIPPED = {"path": "run folder", "reason": "why skipped"}
PARITY = {"run_id": "run", "strategy": "strategy", "world_size": "world size", "precision": "precision",
          "steps": "steps", "verdict": "verdict", "first_bad_step": "differs from step", "largest": "largest difference",
          "of_bound": "of its bound", "telling_through": "telling through step", "dropout": "dropout"}
PARITY_NOTE = ("Certificates of `python -m suite.verify`: the run's strategy against single on the same data, each step's "
               "loss difference judged against the noise floor (single with its weights nudged by a few rounding "
               "errors); float64 where the strategy can train in it. Written as verify.json in the run's folder. Telling through "
               "step K: after K the floor passes 1 % of the loss (the run amplifies rounding that far) and a bug could "
               "hide in it. Dropout: the model's dropout with a non-zero rate, where it has any; each rank draws its own "
               "masks, so such a model differs from single from step 1 under any data-parallel strategy: set its rate to 0 "
               "to certify the strategy.")
RUNS = {"run_id": "run", "experiment": "experiment", "arm": "arm", "strategy": "strategy", "world_size": "world size",
        "seed": "seed", "epochs": "epochs", "steps": "steps", "train_time_s": "training time (s)",
        "samples_per_s": "samples/s", "final_train_loss": "train loss", "final_train_accuracy": "train accuracy",
        "final_val_loss": "val loss", "final_val_accuracy": "val accuracy"}

PREDICTED_NOTE = ("The planner's prediction each run recorded (summary.json `predicted`) against what the run "
                  "measured; error = predicted / measured - 1. Held bytes and peak memory: the rank with most "
                  "(peak memory is the most bytes the rank had allocated at once from the model build on, "
                  "`peak_allocated_bytes`: on CPU what malloc handed out, not the resident set, which keeps freed "
                  "blocks and leaves untouched ones out). "
                  "Profile: fake (the fake run of the strategy) or analytic (its rule: suite/planner/analytic.py).")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders, or folders that hold them")
    p.add_argument("--out", required=True, help="folder for report.html, plots, CSV and Markdown tables")
    p.add_argument("--target-accuracy", type=float, help="report time/epochs to reach this accuracy")
    p.add_argument("--target-loss", type=float, help="report time/epochs to reach this loss")
    p.add_argument("--prices", default=str(DEFAULT_PRICES), help="price table (default: analysis/prices.yaml)")
    p.add_argument("--no-wandb", action="store_true", help="do not read the offline W&B runs (~1 s per rank)")
    p.add_argument("--wandb-report", action="store_true",
                   help="also publish the report's sections as a W&B Report (online, with the reports extra); "
                        "offline it says what it would publish")
    p.add_argument("--study", help="a study's study.yaml (python -m suite.study writes it): adds published vs ours")
    return p.parse_args(argv)


def mfu_column(rows) -> str:
    """MFU's header names the peak's source when the table's rows share one; else each cell does."""
    header = tables.mfu_label(rows)
    for row in rows:
        label = run_record.PEAK_LABELS.get(row["peak_source"])
        mixed = header == "MFU" and label and row["mfu"] is not None
        row["mfu_shown"] = f"{render.number(row['mfu'])} ({label})" if mixed else row["mfu"]
    return header


def wandb_rows(runs) -> list[dict]:
    """One row per job's offline W&B run (its attempts joined), checked against the run record."""
    rows = []
    for run in runs:
        dirs = wandb_runs.run_dirs(run.path)
        if not dirs:
            continue
        row = {"run_id": run.run_id, "experiment": run.experiment, "arm": run.arm}
        try:
            info = wandb_runs.read_job(dirs)
        except Exception as e:  # noqa: BLE001 - an unreadable W&B run is reported, not fatal
            rows.append({**row, "name": dirs[-1].name, "group": f"unreadable: {e}"})
            continue
        mine = [{k: s.get(k) for k in ("step", "global_loss")} for s in run.steps.get(0, [])]
        theirs = [{k: s.get(k) for k in ("step", "global_loss")} for s in wandb_runs.step_metrics(info)]
        rows.append({**row, "name": info["name"], "group": info["group"], "attempts": info["attempts"],
                     "history_rows": len(info["history"]), "matches_record": mine == theirs,
                     **wandb_runs.system_summary(info)})
    return rows


def parity_rows(runs) -> list[dict]:
    """One row per run that holds a suite.verify certificate (verify.json)."""
    import json

    rows = []
    for run in runs:
        path = run.path / "verify.json"
        if not path.exists():
            continue
        cert = json.loads(path.read_text())
        worst = max(cert["steps"], key=lambda c: c["difference"] / c["bound"] if c["bound"] else float("inf"))
        rows.append({"run_id": run.run_id, "strategy": cert["strategy"], "world_size": cert["world_size"],
                     "precision": cert["precision"], "steps": len(cert["steps"]), "verdict": cert["verdict"],
                     "first_bad_step": cert["first_bad_step"], "largest": worst["difference"],
                     "of_bound": worst["difference"] / worst["bound"] if worst["bound"] else None,
                     "telling_through": cert.get("telling_through"), "dropout": cert.get("dropout", "")})
    return rows


def main(argv=None) -> int:
    return one_line(_main, parse_args(argv))


def _main(args) -> int:
    study = studies.load(args.study) if args.study else None
    if not find_run_dirs(args.runs):  # an empty report would look like a comparison of nothing
        missing = [p for p in args.runs if not Path(p).exists()]
        where = (f"{missing[0]} does not exist" if missing else
                 f"no run folders under {', '.join(args.runs)} (a run folder holds {', '.join(RECORD_FILES)})")
        raise SuiteError(f"{where}; give the folder suite.submit wrote runs to (--out, default runs/) or a run folder")
    out = Path(args.out)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    runs, skipped = load_all(args.runs)
    for s in skipped:
        print(f"skipped {s.path}: {s.reason}", file=sys.stderr)
    prices_path = (study or {}).get("prices") or args.prices  # a study's own price table wins
    prices = yaml.safe_load(Path(prices_path).read_text()) or {}
    cost_note = (f"Prices from {prices_path} (their source: {prices.get('source') or 'not stated in the table'}); "
                 f"device-hours = devices x wall time.")

    configs = tables.configs(runs)
    throughput = tables.throughput_rows(configs)
    for row in throughput:
        row["peak_memory"] = render.per_rank_bytes(row["peak_memory_bytes_per_rank"])
        row["held"] = render.per_rank_bytes(row["held_bytes_per_rank"])
        # Ranks that shared cores: the row's times do not measure the strategy alone.
        row["strategy_shown"] = row["strategy"] + (" (oversubscribed)" if row["oversubscribed"] else "")
        if row["utilisation_percent"] is not None:
            row["utilisation"] = f"{row['utilisation_percent']:.0f} % {row['utilisation_device']}"
    targets = tables.time_to_target_rows(runs, args.target_accuracy, args.target_loss)
    verdicts = tables.verdict_rows(configs)
    costs = tables.cost_rows(runs, prices)
    predicted = tables.prediction_rows(runs)
    wandb = [] if args.no_wandb else wandb_rows(runs)
    parity = parity_rows(runs)
    slow = rank_times.rows(runs)  # where each rank's step went; the straggler named
    lost = faults.rows(runs)  # what each automatic restart cost
    run_rows = [{"run_id": r.run_id, "path": str(r.path), "experiment": r.experiment, "arm": r.arm,
                 "strategy": r.strategy, "world_size": r.world_size, "seed": r.seed,
                 "samples_per_s": r.summary["samples_per_s"], "train_time_s": r.summary.get("train_time_s"),
                 "epochs": r.summary.get("epochs"), "steps": r.summary.get("steps"),
                 **{f"final_{k}": v for k, v in r.summary.get("final", {}).items()}} for r in runs]

    render.write_csv(out / "throughput.csv", throughput, [k for k in throughput[0] if k not in ("peak_memory", "held", "utilisation", "strategy_shown")] if throughput else None)
    for name, rows in (("time_to_target", targets), ("verdicts", verdicts), ("parity", parity), ("ranks", slow), ("faults", lost), ("cost", costs), ("predicted", predicted), ("runs", run_rows),
                       ("wandb", wandb), ("skipped", [{"path": str(s.path), "reason": s.reason} for s in skipped])):
        render.write_csv(out / f"{name}.csv", rows)

    md, sections = [f"# scalesuite report\n\n{len(runs)} run(s) compared, {len(skipped)} skipped.\n"], []
    if study:
        published = studies.comparison_rows(study, runs)
        render.write_csv(out / "published_vs_ours.csv", published)
        intro = studies.header(study)
        md.append(f"## Published vs ours\n\n{intro}\n\n" + render.markdown(published, studies.COLUMNS))
        sections.append(("Published vs ours", f"<p>{html.escape(intro)}</p>" + render.html_table(published, studies.COLUMNS)))
        base_of = studies.baselines(study["arms"], study["baseline"])
        for title, rows, cols, note, csv_name in (
                ("Verdicts: the source's beside ours", study_tables.verdict_rows(study, runs, base_of),
                 study_tables.VERDICT_COLUMNS, tables.NOISE_RULE, "verdicts_published_vs_ours"),
                ("Epochs to threshold", study_tables.threshold_rows(study, runs), study_tables.THRESHOLD_COLUMNS,
                 study_tables.THRESHOLD_NOTE, "epochs_to_threshold"),
                ("Cost per arm", study_tables.cost_rows(study, costs, base_of) if study.get("prices") else [],
                 study_tables.COST_COLUMNS, cost_note + " Mean over each arm's repeats.", "cost_per_arm")):
            if rows:
                render.write_csv(out / f"{csv_name}.csv", rows)
                md.append(f"## {title}\n\n{note}\n\n" + render.markdown(rows, cols))
                sections.append((title, f"<p>{html.escape(note)}</p>" + render.html_table(rows, cols)))
    for model, rows in tables.by_model(throughput).items():
        png = plots.throughput_bars(model, rows, out / "plots" / f"throughput-{model}.png")
        columns = {**THROUGHPUT, "mfu_shown": mfu_column(rows)}
        md.append(f"## Throughput and memory: {model}\n\n" + render.markdown(rows, columns))
        sections.append((f"Throughput and memory: {model}", render.html_table(rows, columns)
                         + f"<img src='plots/{png.name}'>"))
    by_experiment: dict = {}
    for r in runs:
        by_experiment.setdefault(r.experiment, []).append(r)
    if study:  # one plot per baseline arm and the arms dividing by it, whatever their batch
        by_experiment = studies.plot_groups(study, runs)
    for experiment, members in by_experiment.items():
        png = plots.experiment_curves(experiment, members, out / "plots" / f"curves-{experiment}.png")
        steps = plots.step_curves(experiment, members, out / "plots" / f"steps-{experiment}.png")
        md.append(f"## Curves: {experiment}\n\n![curves](plots/{png.name})\n\n![loss per step](plots/{steps.name})\n")
        sections.append((f"Curves per epoch and loss per step: {experiment}",
                         f"<img src='plots/{png.name}'><img src='plots/{steps.name}'>"))
    for title, rows, cols, note in (
            ("Time to target", targets, TARGET, "" if targets else "Give --target-accuracy or --target-loss."),
            ("Verdicts against the baseline (strategy single, same experiment)", verdicts, VERDICT, tables.NOISE_RULE),
            ("Parity certificates", parity, PARITY, PARITY_NOTE if parity else "No run here was certified; "
             "python -m suite.verify RECIPE writes one."),
            ("Ranks: compute and collectives", slow, rank_times.COLUMNS,
             " ".join([rank_times.NOTE, *rank_times.stragglers(runs)]) if slow else
             "No run here split its steps (data-parallel strategies on CPU at world size 2 or more do)."),
            ("Faults: time lost", lost, faults.COLUMNS, faults.NOTE if lost else "No run here restarted."),
            ("Cost", costs, COST, cost_note),
            ("W&B offline runs", wandb, WANDB, "Read with `python -m wandb leet inspect --json`."),
            ("Predicted vs measured", predicted, PREDICTED, PREDICTED_NOTE),
            ("Runs", run_rows, RUNS, "Every compared run; the final values are the last epoch's."),
            ("Skipped runs", [{"path": str(s.path), "reason": s.reason} for s in skipped], SKIPPED, "")):
        md.append(f"## {title}\n\n{note}\n\n" + render.markdown(rows, cols))
        sections.append((title, (f"<p>{html.escape(note)}</p>" if note else "") + render.html_table(rows, cols)))
    (out / "tables.md").write_text("\n".join(md))
    title = f"scalesuite study {study['name']} ({study['profile']})" if study else "scalesuite report"
    (out / "report.html").write_text(render.html_page(title, sections))
    print(f"report: {out / 'report.html'} ({len(runs)} run(s), {len(skipped)} skipped)")
    if args.wandb_report:
        print(wandb_report.publish(title, runs, md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
