"""Recipes: the YAML that names model, data, strategy, optimizer, training, launch and tracking.

``load(path, overrides)`` reads a recipe, applies ``a.b=c`` overrides, expands its ``sweep``
block into one recipe per point and validates each. Every error names the key path, the bad
value and what would be accepted, as a ``SuiteError``.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt,
                      ValidationError)

from suite.data import DATASETS
from suite.errors import SuiteError
from suite.models import MODELS
from suite.strategies import STRATEGIES


def _union(options_classes):
    classes = tuple(options_classes)
    return Annotated[Union[classes], Field(discriminator="name")] if len(classes) > 1 else classes[0]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Optimizer(Strict):
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: PositiveFloat = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: Annotated[list[float], Field(min_length=2, max_length=2)] = [0.9, 0.999]


class Training(Strict):
    epochs: PositiveInt = 1
    max_steps: Optional[PositiveInt] = None  # stop after this many optimizer steps in all
    batch_size: PositiveInt = 64  # global: samples per optimizer step, summed over data-parallel ranks
    grad_accumulation: PositiveInt = 1  # micro-batches per optimizer step on each rank
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0  # what torch.manual_seed takes
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    eval_every_epochs: NonNegativeInt = 1  # 0: never evaluate
    log_every_steps: PositiveInt = 10
    checkpoint_every_steps: NonNegativeInt = 0  # 0: only when preempted or timed out


class Launch(Strict):
    executor: Literal["local", "slurm", "debug"] = "local"
    nodes: PositiveInt = 1
    tasks_per_node: PositiveInt = 1  # one task per rank
    devices_per_task: PositiveInt = 1  # devices one rank drives (layer-wise model parallel)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA when the rank has a GPU
    cpus_per_task: Optional[PositiveInt] = None  # default: the node's cores / tasks_per_node
    gpus_per_node: NonNegativeInt = 0
    mem_gb: Optional[PositiveFloat] = None
    timeout_min: PositiveInt = 60
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    sbatch_extra: dict[str, Any] = {}
    array_parallelism: PositiveInt = 16  # sweep points running at once on Slurm
    signal_delay_s: PositiveInt = 90  # SIGUSR2 this long before the time limit: checkpoint, requeue
    collective_timeout_s: PositiveInt = 300  # a rank stuck this long in a collective fails the run

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node


class Tracking(Strict):
    wandb: Literal["offline", "online", "disabled"] = "offline"  # $WANDB_MODE overrides
    project: str = "scalesuite"
    entity: Optional[str] = None
    sample_interval_s: PositiveFloat = 1.0  # utilisation sampler and W&B system metrics
    peak_flops_per_s: Optional[PositiveFloat] = None  # per device, for MFU where suite.record.flops has no entry


class Recipe(Strict):
    """One run: what to train, how to split it, how to launch it."""
    name: str  # names the run folder: load() refuses what is not a file-name slug (check_name)
    model: _union(o for o, _ in MODELS.values())
    data: _union(DATASETS.values())
    strategy: _union(s.Options for s in STRATEGIES.values())
    optimizer: Optimizer = Optimizer()
    training: Training = Training()
    launch: Launch = Launch()
    tracking: Tracking = Tracking()
    sweep: dict[str, list[Any]] = {}  # key path -> values; expanded before validation

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    def dp_size(self) -> int:
        return self.strategy.dp_size(self.world_size)

    def micro_batch_size(self) -> int:
        return self.training.batch_size // (self.dp_size() * self.training.grad_accumulation)

    def fingerprint(self) -> str:
        """Hash of what determines the numbers (everything but launch and tracking)."""
        d = self.model_dump(mode="json", exclude={"launch", "tracking", "sweep", "name"})
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


# ---- loading -----------------------------------------------------------------------------

def load(path: str | Path, overrides: list[str] = ()) -> list[Recipe]:
    """Read a recipe file, apply ``key.path=value`` overrides, expand the sweep, validate."""
    raw = read(path)
    # Switching model/data/strategy by name starts that section afresh (its old keys belong to
    # the old choice); so name overrides go first and the section's other overrides apply after.
    for item in sorted(overrides, key=lambda o: o.split("=", 1)[0] not in _NAME_KEYS):
        apply_override(raw, item)
    _check_plain(raw)
    check_name(raw["name"])  # before the sweep appends to it
    return [validate(point) for point in expand_sweep(raw)]


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
    raw = _yaml(text, f"recipe {path}")
    if not isinstance(raw, dict):
        raise SuiteError(f"recipe {path} must be a mapping of keys (name, model, data, strategy, ...)")
    raw.setdefault("name", path.stem)
    return raw


def _yaml(text: str, what: str):
    """Plain YAML values only (safe_load: a tag such as !!python/object is refused)."""
    try:
        return yaml.safe_load(text)
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


_NAME_KEYS = ("model.name", "data.name", "strategy.name")


def apply_override(raw: dict, item: str) -> None:
    if "=" not in item:
        raise SuiteError(f"override {item!r} must look like key.path=value (e.g. training.epochs=3)")
    key, _, text = item.partition("=")
    key = key.strip()
    if not key.isprintable():
        raise SuiteError(f"override {_shown(item)}: the key must be a key path such as training.epochs")
    value = _yaml(text, f"override {key}={_shown(text)}") if text else None
    _check_plain(value, key)
    section = key.split(".")[0]
    if section == "sweep" and "." in key:  # sweep.<key path>=[values]: the key path stays whole
        sweep = raw.setdefault("sweep", {})
        if not isinstance(sweep, dict):
            raise SuiteError("sweep must map key paths to lists of values, e.g. sweep: {training.seed: [0, 1]}")
        sweep[key.partition(".")[2]] = value
        return
    if key in _NAME_KEYS and isinstance(raw.get(section), dict) and raw[section].get("name") != value:
        raw[section] = {}
    set_path(raw, key, value)


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
            point["name"] = _point_name(raw["name"], "-".join(f"{k.split('.')[-1]}{v}" for k, v in zip(sweep, combo)))
        points.append(point)
    return points


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


def validate(raw: dict) -> Recipe:
    _check_plain(raw)
    try:
        # Strict: true is not 1 and 1.5 is not 1; JSON mode still reads a list as a tuple, an int as a float.
        recipe = Recipe.model_validate_json(json.dumps(raw), strict=True)
    except ValidationError as e:
        raise SuiteError(format_error(e.errors()[0], raw)) from None
    check(recipe)
    return recipe


def check(recipe: Recipe) -> None:
    """Checks that need more than one key: degrees against world size, batch divisibility."""
    recipe.strategy.check(recipe)
    dp, acc, batch = recipe.dp_size(), recipe.training.grad_accumulation, recipe.training.batch_size
    if batch % (dp * acc):
        raise SuiteError(
            f"training.batch_size={batch} must divide into {dp} data-parallel ranks x "
            f"{acc} accumulation steps; use a multiple of {dp * acc}")
    launch = recipe.launch
    if launch.executor == "local" and launch.nodes != 1:
        raise SuiteError(f"launch.executor=local runs on this machine only, but launch.nodes={launch.nodes}; "
                         "set launch.nodes=1, or use launch.executor=slurm")
    if launch.executor == "debug" and launch.world_size != 1:
        raise SuiteError(f"launch.executor=debug runs one rank in this process, but the recipe asks for "
                         f"world size {launch.world_size}; use launch.executor=local, or tasks_per_node=1")
    if recipe.training.precision == "fp16" and recipe.launch.device == "cpu":
        raise SuiteError("training.precision=fp16 needs a GPU; use bf16 on CPU")


def _check_plain(value, path: str = "recipe", depth: int = 0) -> None:
    """Only what JSON holds: mappings with text keys, lists, text, finite numbers, booleans, null
    (YAML also reads dates, binary and sets, which no recipe key takes), nested a few levels."""
    if depth > _MAX_DEPTH:
        raise SuiteError(f"{path} is nested more than {_MAX_DEPTH} levels deep (a YAML alias that refers "
                         f"to itself?); write the value out")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not key.isprintable():
                raise SuiteError(f"{path}: key {key!r} must be text (a key name such as epochs)")
            _check_plain(item, key if path == "recipe" else f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_plain(item, f"{path}.{i}", depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise SuiteError(f"{path}={value!r} must be a finite number")
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise SuiteError(f"{path}={value!r} is a {type(value).__name__}; write a number, text, list or mapping")


_MAX_DEPTH = 20


# ---- error messages -----------------------------------------------------------------------

_TAGGED = {"model": MODELS, "data": DATASETS, "strategy": STRATEGIES}


def format_error(err: dict, raw: dict) -> str:
    loc = [str(p) for p in err["loc"]]
    # Drop the union tag pydantic puts in the location (model.mlp.hidden -> model.hidden).
    if len(loc) > 1 and loc[0] in _TAGGED and loc[1] in _TAGGED[loc[0]]:
        loc.pop(1)
    path = ".".join(loc) or "recipe"
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], raw)
        return f"unknown recipe key {path}; accepted here: {', '.join(allowed)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        section = loc[0]
        names = ", ".join(_TAGGED[section])
        got = (raw.get(section) or {}).get("name") if isinstance(raw.get(section), dict) else None
        if got is None:
            return f"{section}.name is missing; choose one of: {names}"
        return f"{section}.name={got!r} is not a known {section}; choose one of: {names}"
    if kind == "missing":
        return f"recipe key {path} is required"
    msg = " ".join(err["msg"].split())
    return f"{path}={_shown(err.get('input'))}: {msg[:1].lower() + msg[1:]}"


def _shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _allowed_keys(loc: list[str], raw: dict) -> list[str]:
    cls = Recipe
    for i, part in enumerate(loc):
        if part in _TAGGED and cls is Recipe:
            section = raw.get(part)
            entry = _TAGGED[part].get(section.get("name")) if isinstance(section, dict) else None
            cls = entry[0] if isinstance(entry, tuple) else getattr(entry, "Options", entry)
            if cls is None:
                return []
            continue
        if part not in cls.model_fields:
            return []
        ann = cls.model_fields[part].annotation
        cls = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if cls is None:
            return []
    return sorted(cls.model_fields)


def dump(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.model_dump(mode="json", exclude={"sweep"}), sort_keys=False)
