"""The three runs a certificate compares, each through ``python -m suite.submit`` as a user runs it."""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from suite.common.errors import RunFailed, SuiteError
from suite.verify.certificate import NUDGE_ULPS, UNIT_ROUNDOFF, Certificate, judge


def certify(recipe, steps: int = 20, out: str | Path = "runs", progress=print) -> Certificate:
    """Run ``recipe``'s strategy, ``single`` and the noise floor for ``steps`` steps and judge
    them (``suite.verify``). The strategy's run goes into ``out`` like any run, with the
    certificate (``verify.json``) in its folder; the two baselines go into its ``verify/``."""
    return certify_many([recipe], steps, out, progress)[0]


def certify_many(recipes, steps: int = 20, out: str | Path = "runs", progress=print) -> list[Certificate]:
    """``certify`` for several recipes that differ in strategy and launch only (``--strategies``):
    ``single`` and the floor run once per precision and serve every strategy judged in it. Runs
    that differ in one key only go to one ``suite.submit`` as the points of a sweep, so that they
    share its warm ranks (a rank's start-up is most of a short run's time). A run that fails
    raises (``certify_each`` judges the others)."""
    outcomes = certify_each(recipes, steps, out, progress)
    for outcome in outcomes:
        if isinstance(outcome, SuiteError):
            raise outcome
    return outcomes


def certify_each(recipes, steps: int = 20, out: str | Path = "runs", progress=print) -> list:
    """``certify_many``, where a recipe whose runs fail gets its error (a ``SuiteError``) in its
    place in the list and the others are still judged (``suite.doctor``'s parity smoke)."""
    for recipe in recipes:
        _check_claims(recipe.strategy)
    dropout = dropout_of(recipes[0]) if recipes else ""  # one model: the recipes differ in strategy and launch
    plans = []
    for recipe in recipes:
        precision, why = _precision(recipe)
        plans.append((recipe, precision, why, _short(recipe, steps, precision)))
        progress(f"verify: {recipe.strategy.name} at world size {recipe.world_size} against single, {steps} "
                 f"steps, {precision} ({why})")
    labels = [f"strategy {recipe.strategy.name}" for recipe, *_ in plans]
    strategy_runs = run_grouped(labels, [raw for *_, raw in plans], "strategy", Path(out), progress)
    singles = [_as_single(raw) for *_, raw in plans]
    ran = [not isinstance(run, SuiteError) for run in strategy_runs]
    # the single recipe (as YAML text) -> (its two runs, their losses), or their error
    baselines = _baselines([(one, precision) for one, (_, precision, *_), ok in zip(singles, plans, ran) if ok],
                           next((Path(r) / "verify" for r, ok in zip(strategy_runs, ran) if ok), None), progress)
    outcomes = []
    for (recipe, precision, why, raw), run, one in zip(plans, strategy_runs, singles):
        if isinstance(run, SuiteError):
            outcomes.append(run)
            continue
        base = baselines[_key(one)]
        if isinstance(base, SuiteError):
            outcomes.append(base)
            continue
        found, base_losses = base
        runs = {"strategy": run, **found}
        losses = {**base_losses, "strategy": _losses(Path(run))}
        n = min(len(v) for v in losses.values())
        if n < steps:
            outcomes.append(RunFailed(f"verify: the runs recorded {n} of {steps} steps ({runs}); the data set may "
                                      f"be too small for {steps} steps at this batch: lower --steps"))
            continue
        checks = judge(losses["single"][:steps], losses["strategy"][:steps], losses["floor"][:steps], precision)
        cert = Certificate(strategy=recipe.strategy.name, world_size=recipe.world_size, precision=precision,
                           why_precision=why, steps=checks, runs={k: str(v) for k, v in runs.items()},
                           dropout=dropout if recipe.world_size > 1 else "")
        cert.write(run)
        progress(cert.verdict_line())
        outcomes.append(cert)
    return outcomes


def _key(one: dict) -> str:
    return yaml.safe_dump({**one, "name": None}, sort_keys=True)


def _baselines(singles: list[tuple[dict, str]], out: Path | None, progress) -> dict:
    """``single`` and its floor for each distinct (single recipe, precision) into ``out``: by the
    recipe's ``_key``, ({role: run folder}, {role: losses}) or the error that ended them. They
    differ in their ``training`` section only (precision, the floor's nudge): one sweep, one
    ``suite.submit``, whatever the precisions the strategies were judged in."""
    wanted = {_key(one): (one, precision) for one, precision in singles}
    labels, raws = [], []
    for one, precision in wanted.values():
        floor = {**one, "name": one["name"] + "-floor",
                 "training": {**one["training"], "init_perturbation": NUDGE_ULPS * UNIT_ROUNDOFF[precision]}}
        labels += [f"single {precision}", f"floor {precision}"] if len(wanted) > 1 else ["single", "floor"]
        raws += [one, floor]
    runs = run_grouped(labels, raws, "training", out, progress) if raws else []
    done = {}
    for i, key in enumerate(wanted):
        found = dict(zip(("single", "floor"), runs[2 * i:2 * i + 2]))
        error = next((f for f in found.values() if isinstance(f, SuiteError)), None)
        done[key] = error or (found, {role: _losses(Path(folder)) for role, folder in found.items()})
    return done


def dropout_of(recipe) -> str:
    """The model's dropout with a non-zero rate, in words ("2 dropout modules"), or "" (none, or
    a model that cannot be built here). Each rank draws its own masks, so its samples are dropped
    otherwise than in one process: the losses part from the first step, as a bug's would."""
    from torch import nn

    try:
        model = recipe.model_info().build_meta()
    except Exception:  # noqa: BLE001 - a note on the verdict, never a reason to fail it
        return ""
    kinds = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    n = sum(1 for m in model.modules() if (isinstance(m, kinds) and m.p > 0)
            or (isinstance(m, nn.MultiheadAttention) and m.dropout > 0))
    return f"{n} dropout module{'s' if n > 1 else ''}" if n else ""


def _check_claims(strategy) -> None:
    if strategy.name == "single":
        raise SuiteError("strategy single is the baseline itself; give a recipe with the strategy to certify "
                         "(e.g. strategy.name=ddp launch.tasks_per_node=2), or --strategies")
    if strategy.no_parity:
        raise SuiteError(f"strategy {strategy.name} makes no parity claim ({strategy.no_parity}): its losses "
                         f"are not meant to equal single's, so there is nothing to certify")


def _precision(recipe) -> tuple[str, str]:
    reason = recipe.strategy.no_fp64
    if not reason:
        return "fp64", "float64: rounding cannot decide the verdict"
    return "fp32", f"not float64: {reason}; judged against the float32 noise floor"


def _short(recipe, steps: int, precision: str) -> dict:
    """The recipe as a plain dict, cut to ``steps`` steps without evaluation or periodic checkpoints."""
    from suite import recipe as recipes

    raw = yaml.safe_load(recipes.dump(recipe))
    tr = raw["training"]
    tr.update(max_steps=steps, epochs=max(tr.get("epochs", 1), steps), precision=precision,
              eval_every_epochs=0, checkpoint_every_steps=0, keep_final_weights=False,
              log_every_steps=min(tr.get("log_every_steps", 10), steps))
    raw["name"] = f"{raw['name']}-verify"
    raw.pop("arm", None)
    return raw


def _as_single(raw: dict) -> dict:
    launch = {**raw["launch"], "nodes": 1, "tasks_per_node": 1, "devices_per_task": 1}
    if launch.get("executor") == "mpi":
        launch["executor"] = "local"
    return {**raw, "name": raw["name"] + "-single", "strategy": {"name": "single"}, "launch": launch}


def run_grouped(labels: list[str], raws: list[dict], key: str, out: Path, progress) -> list:
    """Each of ``raws`` run into ``out``; their run folders, in order, or for a run that failed its
    error (a ``SuiteError``). Recipes equal but for ``key`` (a key path) and their names run as
    one sweep over ``key``: one ``suite.submit``, whose points share warm ranks where their
    launch allows, named after the members' common name."""
    from suite.recipe.text import get_path, set_path

    groups: dict[str, list[int]] = {}
    for i, raw in enumerate(raws):
        rest = copy.deepcopy(raw)
        rest["name"] = None
        set_path(rest, key, None)
        groups.setdefault(yaml.safe_dump(rest, sort_keys=True), []).append(i)
    outcomes: list = [None] * len(raws)
    for members in groups.values():
        if len(members) == 1:
            sweep = raws[members[0]]
        else:
            sweep = copy.deepcopy(raws[members[0]])
            sweep["name"] = os.path.commonprefix([raws[i]["name"] for i in members]).rstrip("-_.") or sweep["name"]
            sweep["sweep"] = {key: [get_path(raws[i], key) for i in members]}
            set_path(sweep, key, None)
        for i, outcome in zip(members, run_recipe([labels[i] for i in members], sweep, out, progress)):
            outcomes[i] = outcome
    return outcomes


def run_recipe(labels: list[str], raw: dict, out: Path, progress) -> list:
    """One ``python -m suite.submit`` of ``raw`` (one run, or one point per label of its sweep)
    into ``out``: each point's run folder in the sweep's order, or for a point that failed its
    error (``RunFailed``; a ``SuiteError`` for every point where the command itself refused). The
    recipe it ran and the command's output are kept in each run's ``verify/`` (the output is shown
    where it fails)."""
    out.mkdir(parents=True, exist_ok=True)
    what = " and ".join(labels)
    with tempfile.TemporaryDirectory(prefix="scalesuite-verify-") as scratch:
        path = Path(scratch) / "recipe.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "suite.submit", str(path), "--out", str(out)],
                              capture_output=True, text=True)
        found = list(dict.fromkeys(re.findall(r"run record: (\S+)", proc.stdout)))  # first mention of each, in order
        for folder in found:
            keep = Path(folder) / "verify"
            keep.mkdir(exist_ok=True)
            (keep / "submit.log").write_text(proc.stdout + proc.stderr)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
    if proc.returncode not in (0, 1) or len(found) != len(labels):
        cause = RunFailed if proc.returncode == 1 else SuiteError
        error = cause(f"verify: the {what} run{'s' if len(labels) > 1 else ''} failed (exit {proc.returncode}):\n{tail}")
        return [error] * len(labels)
    outcomes = [folder if _status(Path(folder)) == "completed" else _point_failed(label, folder, proc.stdout + proc.stderr)
                for label, folder in zip(labels, found)]
    if proc.returncode != 0 and not any(isinstance(o, SuiteError) for o in outcomes):  # failed, yet each completed
        outcomes = [RunFailed(f"verify: the {what} runs failed (exit {proc.returncode}):\n{tail}")] * len(labels)
    done = [folder for folder in outcomes if not isinstance(folder, SuiteError)]
    if done:
        progress(f"  {what} done in {time.perf_counter() - t0:.1f} s: {', '.join(done)}")
    return outcomes


def _point_failed(label: str, folder: str, output: str) -> RunFailed:
    """A sweep point's failure, in the words ``suite.submit`` used for it (its ``error:`` line
    naming the run), else the output's last lines."""
    name = Path(folder).name
    mine = [ln.strip() for ln in output.splitlines() if ln.startswith("error:") and name in ln]
    why = mine[-1].removeprefix("error:").strip() if mine else "\n" + "\n".join(output.strip().splitlines()[-8:])
    return RunFailed(f"verify: the {label} run failed: {why}")


def _status(run_dir: Path) -> str | None:
    from suite.record import run_record

    return run_record.summary_so_far(run_dir).get("status")


def _losses(run_dir: Path) -> list[float]:
    from suite.record.run_record import latest_per_key, read_metrics

    steps = latest_per_key(read_metrics(run_dir, kind="step", rank=0), "step")
    return [s["global_loss"] for s in steps]
