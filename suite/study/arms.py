"""A study recipe, read: the recipe part and the study part (arms, profiles, repeats, reference),
checked; each arm's recipe built from them (``python -m suite.study``'s first half)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

from suite import recipe as schema
from suite.common.errors import SuiteError
from suite.recipe.text import NAME_KEYS, STUDY_KEYS, _flatten, apply_override, check_name, expand_sweep, read, set_path

DEFAULT_PROFILE = "cpu"


def split(path) -> tuple[dict, dict]:
    """(the recipe part, the study part) of a study recipe, the study part checked."""
    raw = read(path)
    study = {k: raw.pop(k) for k in STUDY_KEYS if k in raw}
    arms = study.get("arms")
    if not isinstance(arms, dict) or not arms:
        raise SuiteError(f"study {path}: arms must map arm names to override sets, e.g. arms: {{ddp: "
                         f"{{strategy.name: ddp}}}}")
    for arm, overrides in arms.items():
        try:
            check_name(arm)  # it names the arm's run folders
        except SuiteError:
            raise SuiteError(f"arms: {arm!r} must be a name of letters, digits, '.', '_' and '-'") from None
        if not isinstance(overrides, dict):
            raise SuiteError(f"arms.{arm} must be a mapping of key.path: value (e.g. strategy.name: ddp)")
    if study.get("baseline") is not None and study["baseline"] not in arms:
        raise SuiteError(f"baseline={study.get('baseline')!r} must name one of the arms: {', '.join(arms)}")
    profiles = study.setdefault("profiles", {})
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise SuiteError("profiles must map profile names to override sets, e.g. profiles: {cpu: {data.name: digits}}")
    for arm, spec in arms.items():
        own = spec.get("profiles", {})
        if not isinstance(own, dict) or not all(isinstance(v, dict) and k in profiles for k, v in own.items()):
            raise SuiteError(f"arms.{arm}.profiles must map profile names of the study ({', '.join(profiles)}) to "
                             f"override sets, e.g. profiles: {{full: {{data.name: cifar10}}}}")
    repeats = study.setdefault("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise SuiteError(f"repeats={repeats!r} must be a whole number >= 1")
    if "prices" in study:
        study["prices"] = _price_table(study["prices"])
    if "reference" not in study:
        raise SuiteError(f"study {path}: reference is required (the published figures per arm)")
    from analysis.study import baselines, check_reference
    from analysis.study_tables import check_thresholds

    baselines(arms, study.get("baseline"))
    check_reference(study["reference"], arms)
    if "thresholds" in study:
        check_thresholds(study["thresholds"])
    return raw, study


def _apply(raw: dict, overrides: dict) -> None:
    """``key.path: value`` pairs, as overrides: a changed model/data/strategy name starts its section afresh."""
    items = _flatten(overrides)
    for key in sorted(items, key=lambda k: k not in NAME_KEYS):
        apply_override(raw, f"{key}={json.dumps(items[key])}")


def arm_recipes(raw: dict, study: dict, profile: str, repeats: int, overrides=()) -> dict[str, dict]:
    """arm -> its recipe: the study's recipe, then the profile, the arm with its own profile's overrides
    (those win), the command line; repeats as a seed sweep."""
    from analysis.study import ARM_KEYS

    if profile not in study["profiles"]:
        known = ", ".join(study["profiles"]) or "none"
        raise SuiteError(f"--profile {profile}: the study has no such profile; its profiles: {known}")
    out = {}
    for arm, spec in study["arms"].items():
        recipe = json.loads(json.dumps(raw))
        _apply(recipe, study["profiles"][profile])
        own = {k: v for k, v in spec.items() if k not in ARM_KEYS}
        _apply(recipe, {**_flatten(own), **_flatten(spec.get("profiles", {}).get(profile, {}))})
        for item in overrides:
            apply_override(recipe, item)
        recipe["name"], recipe["arm"] = f"{raw['name']}-{arm}", arm
        if repeats > 1:
            seed = (recipe.get("training") or {}).get("seed", 0)
            set_path(recipe.setdefault("sweep", {}), "training.seed", [seed + i for i in range(repeats)])
        out[arm] = recipe
    return out


def grouped(recipes: dict, group: str) -> dict:
    """Every arm's runs (its repeats too) in one W&B group: the study's folder name."""
    for recipe in recipes.values():
        recipe["tracking"] = {**(recipe.get("tracking") or {}), "wandb_group": group}
    return recipes


def check_arms(recipes: dict) -> None:
    """Validate every arm's every point before anything runs; an error names the arm."""
    for arm, recipe in recipes.items():
        try:
            for point in expand_sweep(copy.deepcopy(recipe)):
                schema.validate(point)
        except SuiteError as e:
            raise SuiteError(f"arm {arm}: {e}") from None


def chosen(names: str, study: dict) -> list[str]:
    """``--arms a,b``: those arms and the baseline arms they divide by, in the study's order."""
    from analysis.study import baselines

    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in study["arms"]]
    if unknown or not wanted:
        raise SuiteError(f"--arms {names}: {', '.join(unknown) or 'no arm'} is not an arm of the study; its arms: "
                         f"{', '.join(study['arms'])}")
    base = baselines(study["arms"], study.get("baseline"))
    keep = set(wanted) | {base[n] for n in wanted}
    return [arm for arm in study["arms"] if arm in keep]


def _price_table(value) -> str:
    """A study's ``prices``: a price table (analysis/prices.yaml's format), as given or from the
    repository root (where the study recipes name it), made absolute for the report."""
    root = Path(__file__).resolve().parents[2]
    for path in (Path(str(value)), root / str(value)):
        if path.is_file():
            return str(path.resolve())
    raise SuiteError(f"prices={value!r}: no such price table; give a file like analysis/prices.yaml")
