"""Fake-run results kept on disk, so that a configuration sized once is not sized again.

A fake run (``suite.planner.fake_run``) of one configuration takes seconds for a small model and
minutes for a billion-parameter one, and its answer is the same every time for the same inputs
(its child runs with the garbage collector off for that reason). ``suite.plan`` and the advisor
size the same configurations again and again: the advisor's rounds try a candidate as written,
then checkpointed, then accumulating; a user reruns the advisor with ``--verbose`` or other
hardware; ``suite.plan`` asks for a configuration the advisor sized.

A result is kept under ``$XDG_CACHE_HOME/scalesuite/fake_runs/<key>.json``. The key is a hash of
everything the answer depends on: the recipe (less its name, arm, sweep and tracking), the world
size, the depth the model ran at, whether a strategy that cannot fake was tried anyway, the suite's
own source files and the versions of the libraries whose code runs (torch, DeepSpeed, fairscale,
transformers), and what the recipe names outside the suite: the source file of a ``target:``
factory's module (found on the section's ``pythonpath`` first, as the run finds it) and the size and
time of every file in a folder or file a path in the recipe points to (a checkpoint folder's config,
a tokenizer, the ``pythonpath`` folders themselves). Changing any of them asks again; nothing goes
stale. (A module a user's factory imports from outside those folders is not followed:
``SCALESUITE_PLAN_CACHE=0`` while editing one.)
Only answers are kept, never failures (a timeout on a loaded machine is not the configuration's).
``SCALESUITE_PLAN_CACHE=0`` turns it off."""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import itertools
import json
import os
import sys
from importlib import metadata
from pathlib import Path

from suite.common.cache import suite_cache
from suite.record.run_record import write_json_atomic

CACHE_DIR = "fake_runs"
LIBRARIES = ("torch", "deepspeed", "fairscale", "transformers")
NOT_ASKED = {"name", "arm", "sweep", "tracking"}  # recipe sections a fake step does not read
MAX_FILES = 1000  # the entries of a folder taken into the key


def enabled() -> bool:
    return os.environ.get("SCALESUITE_PLAN_CACHE", "1") != "0"


def cache_dir() -> Path:
    return suite_cache(CACHE_DIR)


def key(recipe, world_size: int, layers: int | None, try_fake: bool) -> str | None:
    """The cache key of one fake run, or None where the recipe cannot be written down."""
    try:
        asked = recipe.model_dump(mode="json", exclude=NOT_ASKED)
        text = json.dumps({"recipe": asked, "world_size": world_size, "layers": layers, "try_fake": try_fake,
                           "code": _code_fingerprint(), "named": _named_things(asked)}, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def get(cache_key: str | None) -> dict | None:
    if cache_key is None or not enabled():
        return None
    try:
        return json.loads((cache_dir() / f"{cache_key}.json").read_text())
    except (OSError, ValueError):
        return None


def put(cache_key: str | None, payload: dict) -> None:
    """Keep ``payload`` (a StepProfile's dict) where it survives JSON unchanged; a write that fails
    (a read-only or full disk) is skipped: the cache only saves time."""
    if cache_key is None or not enabled():
        return
    try:
        text = json.dumps(payload)
        if json.loads(text) != payload:
            return  # tuples or non-text keys: what comes back would not be what went in
        cache_dir().mkdir(parents=True, exist_ok=True)
        write_json_atomic(cache_dir() / f"{cache_key}.json", payload)  # whole or not at all, two advisors at once
    except (OSError, TypeError, ValueError):
        pass


def _named_things(value, folders: tuple = ()) -> list:
    """What the recipe's strings name outside the suite, as it is now: a ``module:attr`` factory's
    source file (its hash), an existing path's files (name, size, modification time). ``folders``:
    the enclosing section's ``pythonpath``, searched first, as the run will."""
    found = []
    if isinstance(value, dict):
        paths = value.get("pythonpath")
        inner = tuple(paths) if isinstance(paths, list) else folders
        for item in value.values():
            found += _named_things(item, inner)
    elif isinstance(value, list):
        for item in value:
            found += _named_things(item, folders)
    elif isinstance(value, str) and value:
        found += _factory_source(value, folders) + _path_state(value)
    return found


def _factory_source(text: str, folders: tuple = ()) -> list:
    module = text.split(":", 1)[0] if ":" in text and "/" not in text else ""
    if not module or not all(part.isidentifier() for part in module.split(".")):
        return []
    try:
        origin = _module_file(module, [*folders, *sys.path])
        return [[text, hashlib.sha256(Path(origin).read_bytes()).hexdigest()]]
    except (ImportError, AttributeError, ValueError, TypeError, OSError):
        return []


def _module_file(module: str, search: list) -> str:
    """The file ``module`` would import from on ``search``, found on disk as a fresh process would:
    not the copy already in ``sys.modules``, which may come from another folder or be older."""
    spec = None
    for part in module.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            raise ImportError(module)
        search = list(spec.submodule_search_locations or [])
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        raise ImportError(module)  # a built-in or namespace package: no one source file
    return spec.origin


def _path_state(text: str) -> list:
    try:
        path = Path(text).expanduser()
        if not path.exists():
            return []
        # a data root may hold millions of files: the first MAX_FILES found, not a walk of them all
        files = [path] if path.is_file() else sorted(p for p in itertools.islice(path.rglob("*"), MAX_FILES)
                                                      if p.is_file())
        return [[str(f), (stat := f.stat()).st_size, stat.st_mtime_ns] for f in files]
    except (OSError, ValueError):
        return []


@functools.cache
def _code_fingerprint() -> str:
    """A hash of the suite's source files and the versions of the libraries a fake run executes."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    for name in LIBRARIES:
        try:
            digest.update(f"{name}=={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} absent".encode())
    return digest.hexdigest()
