"""The three runs a certificate compares, each through ``python -m suite.submit`` as a user runs it."""
from __future__ import annotations

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
    ``single`` and the floor run once per precision and serve every strategy judged in it."""
    for recipe in recipes:
        _check_claims(recipe.strategy)
    baselines: dict[str, tuple[dict, dict]] = {}  # the single recipe (as YAML text) -> its two runs
    dropout = dropout_of(recipes[0]) if recipes else ""  # one model: the recipes differ in strategy and launch
    certificates = []
    for recipe in recipes:
        precision, why = _precision(recipe)
        raw = _short(recipe, steps, precision)
        progress(f"verify: {recipe.strategy.name} at world size {recipe.world_size} against single, {steps} "
                 f"steps, {precision} ({why})")
        runs = {"strategy": run_recipe("strategy", raw, Path(out), progress)}
        one = _as_single(raw)
        key = yaml.safe_dump({**one, "name": None}, sort_keys=True)
        if key not in baselines:
            base = Path(runs["strategy"]) / "verify"
            floor = {**one, "name": one["name"] + "-floor",
                     "training": {**one["training"], "init_perturbation": NUDGE_ULPS * UNIT_ROUNDOFF[precision]}}
            found = {"single": run_recipe("single", one, base / "single", progress),
                     "floor": run_recipe("floor", floor, base / "floor", progress)}
            baselines[key] = (found, {role: _losses(Path(folder)) for role, folder in found.items()})
        found, base_losses = baselines[key]
        runs.update(found)
        losses = {**base_losses, "strategy": _losses(Path(runs["strategy"]))}
        n = min(len(v) for v in losses.values())
        if n < steps:
            raise RunFailed(f"verify: the runs recorded {n} of {steps} steps ({runs}); the data set may be "
                            f"too small for {steps} steps at this batch: lower --steps")
        checks = judge(losses["single"][:steps], losses["strategy"][:steps], losses["floor"][:steps], precision)
        cert = Certificate(strategy=recipe.strategy.name, world_size=recipe.world_size, precision=precision,
                           why_precision=why, steps=checks, runs={k: str(v) for k, v in runs.items()},
                           dropout=dropout if recipe.world_size > 1 else "")
        cert.write(runs["strategy"])
        progress(cert.verdict_line())
        certificates.append(cert)
    return certificates


def dropout_of(recipe) -> str:
    """The model's dropout with a non-zero rate, in words ("2 dropout modules"), or "" (none, or
    a model that cannot be built here). Each rank draws its own masks, so its samples are dropped
    otherwise than in one process: the losses part from the first step, as a bug's would."""
    from torch import nn  # start-up: loads torch only when this runs

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
    # start-up: loads torch, numpy, pydantic, suite.common, suite.compat, suite.data, suite.models, suite.recipe, suite.record, suite.strategies only when this runs
    from suite import recipe as recipes

    raw = yaml.safe_load(recipes.dump(recipe))
    tr = raw["training"]
    tr.update(max_steps=steps, epochs=max(tr.get("epochs", 1), steps), precision=precision,
              eval_every_epochs=0, checkpoint_every_steps=0, log_every_steps=min(tr.get("log_every_steps", 10), steps))
    raw["name"] = f"{raw['name']}-verify"
    raw.pop("arm", None)
    return raw


def _as_single(raw: dict) -> dict:
    launch = {**raw["launch"], "nodes": 1, "tasks_per_node": 1, "devices_per_task": 1}
    if launch.get("executor") == "mpi":
        launch["executor"] = "local"
    return {**raw, "name": raw["name"] + "-single", "strategy": {"name": "single"}, "launch": launch}


def run_recipe(role: str, raw: dict, out: Path, progress) -> str:
    """One run through ``python -m suite.submit`` into ``out``; its run folder. The recipe it ran
    and the command's output are kept in the run's ``verify/`` (the output is shown where it fails)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="scalesuite-verify-") as scratch:
        path = Path(scratch) / f"{role}.yaml"
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "suite.submit", str(path), "--out", str(out)],
                              capture_output=True, text=True)
        found = re.findall(r"run record: (\S+)", proc.stdout)
        if found:
            keep = Path(found[-1]) / "verify"
            keep.mkdir(exist_ok=True)
            (keep / f"submit-{role}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        cause = RunFailed if proc.returncode == 1 else SuiteError
        raise cause(f"verify: the {role} run failed (exit {proc.returncode}):\n{tail}")
    if not found:
        raise RunFailed(f"verify: the {role} run named no run folder:\n{(proc.stdout + proc.stderr)[-2000:]}")
    progress(f"  {role:<8} done in {time.perf_counter() - t0:.1f} s: {found[-1]}")
    return found[-1]


def _losses(run_dir: Path) -> list[float]:
    # start-up: loads pydantic, suite.record only when this runs
    from suite.record.run_record import latest_per_key, read_metrics

    steps = latest_per_key(read_metrics(run_dir, kind="step", rank=0), "step")
    return [s["global_loss"] for s in steps]
