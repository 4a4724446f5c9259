"""``python -m suite.study STUDY.yaml [key.path=value ...] [--profile P] [--repeats N] [--out DIR] [--dry-run] [--arms A,B]``

A study reruns a published comparison and sets the published figures beside ours. Its recipe
(``recipes/studies/*.yaml``) is a normal recipe (model, data, strategy, optimizer, training,
launch, tracking) plus:

- ``profiles``: named override sets (``key.path: value``, as on the command line). ``cpu`` (the
  default) uses synthetic or bundled data and sizes that finish in minutes on 2 cores; ``full``
  the real data sets and sizes, for a cluster.
- ``repeats``: runs per arm, seeds ``training.seed``, ``+1``, ... (``--repeats`` overrides).
- ``arms``: the experiments compared, by name, each an override set, which may also hold the
  arm's ``baseline`` (the arm its ratios divide by) and its own ``profiles`` (override sets applied
  after the arm's, e.g. each model's data set per profile); ``baseline``: the arm the ratios of
  arms naming none divide by.
- ``reference``: the published figures per arm (``analysis.study`` says what each key means), and
  optionally the source's verdict matrix (``verdicts``).
- ``thresholds``: optional, ``{metric: [values]}``: the report's epochs-to-threshold table
  (``analysis.study_tables``).

Every arm (or those ``--arms`` names, with the arms they divide by) runs through ``python -m suite.submit`` (one call per arm, its repeats a seed sweep),
into ``DIR/<name>-<profile>-<time>/runs/``; that folder also gets each arm's resolved recipe
(``recipes/<arm>.yaml``: rerun one with ``suite.submit``), ``study.yaml`` and the report
(``analysis.report --study``), whose path is printed last. Overrides apply to every arm, last.
Exit codes: 0 every run completed; 1 a run failed (the report lists it); 2 bad input.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import sys
import shutil
import tempfile
from pathlib import Path

import yaml

from suite.common.errors import SuiteError, one_line
from suite.record import wandb_export
from suite.study.arms import DEFAULT_PROFILE, arm_recipes, check_arms, chosen, grouped, split


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m suite.study",
                                description="Rerun a published comparison and set its figures beside ours.")
    p.add_argument("study", help="study recipe, e.g. recipes/studies/fashion_mnist_dp.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value for every arm, e.g. data.root=/data")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help=f"override set from profiles: (default {DEFAULT_PROFILE})")
    p.add_argument("--repeats", type=int, help="runs per arm (default: the recipe's repeats)")
    p.add_argument("--out", default="studies", help="folder that gets the study's folder (default: studies/)")
    p.add_argument("--dry-run", action="store_true", help="check every arm with suite.submit --dry-run; train nothing")
    p.add_argument("--arms", help="comma-separated arms to run (their baseline arms run too); default: all")
    return p.parse_intermixed_args(argv)


def main(argv=None) -> int:
    return one_line(_main, parse_args(argv))


def _main(args) -> int:
    raw, study = split(args.study)
    repeats = study["repeats"] if args.repeats is None else args.repeats
    if repeats < 1:
        raise SuiteError(f"--repeats {repeats} must be >= 1")
    recipes = arm_recipes(raw, study, args.profile, repeats, args.overrides)
    check_arms(recipes)
    if args.arms:
        recipes = {arm: recipes[arm] for arm in chosen(args.arms, study)}
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            return _submit_all(recipes, Path(tmp), ["--dry-run"])
    folder = _new_folder(Path(args.out), f"{raw['name']}-{args.profile}")
    spec = {"name": raw["name"], "profile": args.profile, "repeats": repeats, "baseline": study.get("baseline"),
            "arms": study["arms"], "reference": study["reference"], "thresholds": study.get("thresholds"),
            "prices": study.get("prices")}
    (folder / "study.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    code = _submit_all(grouped(recipes, folder.name), folder, ["--out", str(folder / "runs")])
    if code == 2 and not list(folder.glob("runs/*/summary.json")):
        shutil.rmtree(folder)  # refused before anything ran (e.g. data missing): the error line is all
        return code
    from analysis import report

    (folder / "runs").mkdir(exist_ok=True)
    report_code = report.main([str(folder / "runs"), "--out", str(folder), "--study", str(folder / "study.yaml")])
    notice = wandb_export.study_run(folder, raw, {name: _csv_rows(folder / f"{name}.csv") for name in STUDY_TABLES})
    if notice:
        print(notice, file=sys.stderr)
    print(f"study {raw['name']} ({args.profile}): {folder / 'report.html'}")
    return code or report_code


# The report's tables the study's own W&B run holds (analysis.report writes them as CSV).
STUDY_TABLES = ("published_vs_ours", "throughput", "cost", "runs")


def _csv_rows(path: Path) -> list[dict]:
    """A report CSV's rows, numbers as numbers and empty cells as None ([] where there is none)."""
    if not path.exists():
        return []

    def value(text: str):
        if text == "":
            return None
        try:
            return int(text)
        except ValueError:
            try:
                return float(text)
            except ValueError:
                return text

    with open(path, newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _new_folder(out: Path, name: str) -> Path:
    """``out/<name>-<time>``, created; a second study started in the same second gets ``-2``."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1, 100):
        folder = out / (f"{name}-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
        except OSError as e:
            raise SuiteError(f"--out {out}: cannot create the study's folder there ({e.strerror})") from None
    raise SuiteError(f"--out {out}: too many studies named {name} started this second")


def _submit_all(recipes: dict, folder: Path, extra: list[str]) -> int:
    """Each arm through ``python -m suite.submit``; bad input stops at once, a failed run does not
    stop the other arms. Returns the worst exit code."""
    from suite.submit import cli

    (folder / "recipes").mkdir(parents=True, exist_ok=True)
    worst = 0
    for arm, recipe in recipes.items():
        path = folder / "recipes" / f"{arm}.yaml"
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        print(f"arm {arm}: python -m suite.submit {path} {' '.join(extra)}", flush=True)
        code = cli.main([str(path), *extra])
        if code in (2, 130):  # bad input, or Ctrl-C: the other arms do not start
            return code
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
