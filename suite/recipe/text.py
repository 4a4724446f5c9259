"""Recipe text to a plain dict, before the schema sees it: reading the YAML file, ``key.path=value``
overrides, sweep expansion, and the checks the schema cannot make (plain JSON-like values, a
file-name slug for ``name``). Every problem is a one-line ``SuiteError``; ``suite.recipe`` validates.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import math
import re
from pathlib import Path

import yaml

from suite.common.errors import SuiteError


def read(path: str | Path) -> dict:
    """The recipe file as a dict (``name`` defaulting to the file's stem)."""
    path = Path(path)
    if path.is_dir():
        raise SuiteError(f"recipe {path} is a directory; give a YAML file, e.g. {path / 'quickstart.yaml'}")
    if not path.is_file():
        raise SuiteError(f"recipe {path} does not exist (recipes live in recipes/*.yaml)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SuiteError(f"recipe {path} is not UTF-8 text (byte {e.start}: {e.reason}); "
                         f"save it as UTF-8") from None
    except OSError as e:
        raise SuiteError(f"recipe {path} cannot be read: {e.strerror}") from None
    raw = parse_yaml(text, f"recipe {path}")
    if not isinstance(raw, dict):
        raise SuiteError(f"recipe {path} must be a mapping of keys (name, model, data, strategy, ...)")
    raw.setdefault("name", path.stem)
    return raw


class _Loader(yaml.SafeLoader):
    """safe_load's loader (a tag such as !!python/object is refused) that also refuses a key
    given twice in one mapping: PyYAML keeps the last silently, so a recipe would train with a
    value its author may believe they changed back (or forward) further up."""

    def construct_document(self, node):
        _refuse_duplicate_keys(node, [], set())
        return super().construct_document(node)


def _refuse_duplicate_keys(node, path: list[str], seen: set) -> None:
    if id(node) in seen:  # an alias: its node was checked where it was defined
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                where = ".".join([*path, key.value])
                if key.value in lines:
                    raise SuiteError(f"key {where} is given twice, at lines {lines[key.value]} and "
                                     f"{key.start_mark.line + 1}; keep one of them")
                lines[key.value] = key.start_mark.line + 1
            _refuse_duplicate_keys(value, [*path, str(getattr(key, "value", "?"))], seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, [*path, str(i)], seen)


def parse_yaml(text: str, what: str):
    """Plain YAML values only (safe_load: a tag such as !!python/object is refused), each key
    once per mapping."""
    try:
        return yaml.load(text, Loader=_Loader)
    except SuiteError as e:
        raise SuiteError(f"{what}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if isinstance(e, yaml.constructor.ConstructorError):
            problem = "YAML tags (!!...) are not accepted; write plain values"
        raise SuiteError(f"{what} is not valid YAML{where}: {problem}") from None


# Run folders are named <name>-<time>-<id>: the name must be safe in a path on any file system.
NAME_MAX_CHARS = 100
_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name) -> None:
    """Refuse a recipe ``name`` that is not a file-name slug (SuiteError saying what is allowed)."""
    if not isinstance(name, str) or not _SLUG.fullmatch(name) or len(name) > NAME_MAX_CHARS:
        shown = name if not isinstance(name, str) or len(name) <= 40 else name[:40] + "..."
        raise SuiteError(f"name={shown!r} must be a file-name slug: letters, digits, '.', '_' and '-', "
                         f"starting with a letter or digit, at most {NAME_MAX_CHARS} characters "
                         f"(set name: in the recipe or name=... on the command line)")


NAME_KEYS = ("model.name", "data.name", "strategy.name")
# Top-level keys of a study recipe (python -m suite.study), which no plain recipe has.
STUDY_KEYS = ("profiles", "repeats", "arms", "baseline", "reference", "thresholds", "prices")


def apply_override(raw: dict, item: str) -> None:
    if "=" not in item:
        raise SuiteError(f"override {item!r} must look like key.path=value (e.g. training.epochs=3)")
    key, _, text = item.partition("=")
    key = key.strip()
    if not key.isprintable():
        raise SuiteError(f"override {shown(item)}: the key must be a key path such as training.epochs")
    value = parse_yaml(text, f"override {key}={shown(text)}") if text else None
    check_plain(value, key)
    section = key.split(".")[0]
    if section == "sweep" and "." in key:  # sweep.<key path>=[values]: the key path stays whole
        sweep = raw.setdefault("sweep", {})
        if not isinstance(sweep, dict):
            raise SuiteError("sweep must map key paths to lists of values, e.g. sweep: {training.seed: [0, 1]}")
        sweep[key.partition(".")[2]] = value
        return
    if key in NAME_KEYS and isinstance(raw.get(section), dict) and raw[section].get("name") != value:
        raw[section] = {}
    set_path(raw, key, value)


def get_path(raw: dict, key: str):
    """The value at key path ``key`` (``training.seed``) of a raw recipe, or None where it is unset."""
    node = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def set_path(raw: dict, key: str, value) -> None:
    node = raw
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SuiteError(f"override {key}: {'.'.join(parts[:i + 1])} is a value, not a section")
        node = child
    node[parts[-1]] = value


def expand_sweep(raw: dict) -> list[dict]:
    sweep = raw.pop("sweep", None) or {}
    if not isinstance(sweep, dict):
        raise SuiteError("sweep must map key paths to lists of values, e.g. sweep: {launch.tasks_per_node: [1, 2]}")
    sweep = _flatten(sweep)
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise SuiteError(f"sweep.{key}={values!r} must be a non-empty list of values, e.g. sweep.{key}=[1, 2]")
    points = []
    for combo in itertools.product(*sweep.values()):
        point = copy.deepcopy(raw)
        for key, value in zip(sweep, combo):
            set_path(point, key, value)
        if sweep:
            point["name"] = _point_name(raw["name"], "-".join(_label(k, v, sweep[k]) for k, v in zip(sweep, combo)))
            # the sweep's points sit together in W&B (a study's arms keep the study's group)
            tracking = point["tracking"] = dict(point.get("tracking") or {})
            tracking["wandb_group"] = tracking.get("wandb_group") or raw["name"]
        points.append(point)
    return points


def _label(key: str, value, values: list) -> str:
    """A sweep value in a point's name: ``seed3`` for ``training.seed: 3``; a whole section
    (``strategy: [{name: ddp}, {name: zero, stage: 2}, {name: zero, stage: 3}]``) by its name and
    the entries that tell it from the others of that name (``ddp``, ``zero_stage2``, ``zero_stage3``)."""
    plain = _entry(key.split(".")[-1], value)
    if not (isinstance(value, dict) and all(isinstance(v, dict) for v in values)):
        return plain
    label = _section_label(value, values)
    clash = not label or sum(_section_label(v, values) == label for v in values) > 1
    return plain if clash else label


def _section_label(value: dict, values: list[dict]) -> str:
    kin = [v for v in values if v.get("name") == value.get("name")]  # the same strategy (model, ...), other options
    telling = [k for k in value if k != "name" and len({repr(v.get(k, "-")) for v in kin}) > 1]
    return "_".join([str(value.get("name", ""))] + [_entry(k, value[k]) for k in telling]).strip("_")


def _entry(key: str, value) -> str:
    """One key and its value in a point's name: ``seed3``, ``init_perturbation4.44089e-16`` (%g)."""
    return f"{key}{value:g}" if isinstance(value, float) else f"{key}{value}"


def _flatten(sweep: dict, prefix: str = "") -> dict:
    """``{training: {seed: [0, 1]}}`` and ``{training.seed: [0, 1]}`` alike -> ``{"training.seed": [0, 1]}``."""
    flat = {}
    for key, values in sweep.items():
        path = f"{prefix}{key}"
        flat.update(_flatten(values, path + ".") if isinstance(values, dict) and values else {path: values})
    return flat


def _point_name(name: str, suffix: str) -> str:
    """The recipe's name plus the sweep point, as a slug; a long suffix becomes its hash."""
    suffix = re.sub(r"[^A-Za-z0-9._-]+", "_", suffix).strip("_")
    if len(name) + 1 + len(suffix) > NAME_MAX_CHARS:
        suffix = hashlib.sha256(suffix.encode()).hexdigest()[:8]
    return f"{name[:NAME_MAX_CHARS - 1 - len(suffix)]}-{suffix}"


def named_targets(raw: dict) -> dict:
    """``model: {target: pkg.mod:fn, ...}`` without a ``name`` is a custom model, as Hydra's
    ``_target_`` reads: the recipe (a shallow copy) with ``model.name: custom`` filled in, so
    that the schema knows which options apply (``suite.models.custom``)."""
    model = raw.get("model")
    if isinstance(model, dict) and "target" in model and "name" not in model:
        return {**raw, "model": {"name": "custom", **model}}
    return raw


def check_plain(value, path: str = "recipe", depth: int = 0) -> None:
    """Only what JSON holds: mappings with text keys, lists, text, finite numbers, booleans, null
    (YAML also reads dates, binary and sets, which no recipe key takes), nested a few levels."""
    if depth > _MAX_DEPTH:
        raise SuiteError(f"{path} is nested more than {_MAX_DEPTH} levels deep (a YAML alias that refers "
                         f"to itself?); write the value out")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not key.isprintable():
                raise SuiteError(f"{path}: key {key!r} must be text (a key name such as epochs)")
            check_plain(item, key if path == "recipe" else f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_plain(item, f"{path}.{i}", depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise SuiteError(f"{path}={value!r} must be a finite number")
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise SuiteError(f"{path}={value!r} is a {type(value).__name__}; write a number, text, list or mapping")


_MAX_DEPTH = 20


def shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def raw_points(path: str | Path, overrides=()) -> list[dict]:
    """A recipe file with its overrides applied and its sweep expanded, not yet validated: one
    plain dict per point (``suite.recipe.load`` validates them)."""
    raw = read(path)
    study = [k for k in STUDY_KEYS if k in raw]
    if study:
        raise SuiteError(f"{path} is a study (it has {', '.join(study)}), which runs its arms through suite.submit; "
                         f"run it with python -m suite.study {path}")
    # Switching model/data/strategy by name starts that section afresh (its old keys belong to
    # the old choice); so name overrides go first and the section's other overrides apply after.
    for item in sorted(overrides, key=lambda o: o.split("=", 1)[0] not in NAME_KEYS):
        apply_override(raw, item)
    check_plain(raw)
    check_name(raw["name"])  # before the sweep appends to it
    return expand_sweep(raw)
