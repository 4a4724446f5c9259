"""Third-party internals the suite relies on, quarantined: one module per library
(``deepspeed``, ``torch``, ``torchvision``, ``submitit``, ``transformers``). Every private or undocumented name the suite touches,
and every library method it patches or overrides, is reached only through these modules, each
access checked against the library versions in ``CHECKED`` (constraints.txt, the tested set).

A missing internal raises :class:`CompatError` naming the library, its installed version and
what was expected; nothing falls back to a default (a silent default once meant 0 bytes reported).
docs/compat.md lists every access and what to do when upgrading a library.
"""
from __future__ import annotations

import importlib
import types
from importlib import metadata

# The versions every access in suite/compat/ was checked on (in constraints.txt, the tested set).
CHECKED = {"torch": "2.14.1", "torchvision": "0.29.1", "deepspeed": "0.19.8", "submitit": "1.5.4",
           "transformers": "5.17.0"}
# The libraries a study leans on at the versions the test suite passed on (constraints.txt), and
# what is untested where another version is installed (pyproject.toml allows ranges).
TESTED = {**CHECKED, "fairscale": "0.4.13", "wandb": "0.31.0"}
UNTESTED = {
    "torch": "suite/compat/torch.py's internal reads and every strategy's parity",
    "torchvision": "suite/compat/torchvision.py's data-set reads and the torchvision models",
    "deepspeed": "suite/compat/deepspeed.py's ZeRO byte counts, strategies zero and ds_pipeline",
    "submitit": "suite/compat/submitit.py and the Slurm launcher",
    "fairscale": "strategies oss and fairscale_pipe",
    "wandb": "W&B export and the offline-run reader",
    "transformers": "suite/compat/transformers.py and the Hugging Face models (suite/models/hf.py)",
}
# Libraries only an extra installs (hf): absent is fine, another version is not.
OPTIONAL = {"transformers"}


class CompatError(RuntimeError):
    """A third-party internal the suite relies on is missing or has changed."""


NOT_INSTALLED = "(not installed)"


def installed_version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def release(version: str) -> str:
    """The release a version names, without a local build tag (2.14.1+cu130 is 2.14.1)."""
    return version.split("+")[0]


def untested(have: dict[str, str | None] | None = None) -> list[str]:
    """Each library of TESTED installed at another version (or missing): "torch 2.9.0 (tested
    2.14.1; untested: ...)". Reads package metadata only: cheap, imports nothing."""
    if have is None:
        have = {lib: (None if installed_version(lib) == NOT_INSTALLED else installed_version(lib)) for lib in TESTED}
    out = []
    for lib, tested in TESTED.items():
        version = have.get(lib)
        if version is None and lib in OPTIONAL:
            continue
        if version is None or release(version) != tested:
            out.append(f"{lib} {version or 'not installed'} (tested {tested}; untested: {UNTESTED[lib]})")
    return out


def untested_line() -> str:
    """One line naming every library outside the tested set, or "" when all match."""
    off = untested()
    if not off:
        return ""
    return (f"note: outside the tested set (constraints.txt): {'; '.join(off)}; "
            f"pip install -c constraints.txt -e . installs it")


def incompatible(lib: str, expected: str) -> CompatError:
    """The error for a changed internal of ``lib``: what was expected, the installed version and
    the version the access was checked on."""
    return CompatError(f"{lib} {installed_version(lib)} is not what suite/compat/{lib}.py was checked "
                       f"against ({lib} {CHECKED[lib]}): expected {expected}. Install {lib}=={CHECKED[lib]} "
                       f"(constraints.txt, the tested set), or update suite/compat/{lib}.py (docs/compat.md)")


def require_attr(obj, name: str, *, lib: str, what: str = ""):
    """``getattr(obj, name)``, or a :class:`CompatError` naming ``lib`` if the attribute is gone."""
    try:
        return getattr(obj, name)
    except AttributeError:
        owner = obj.__name__ if isinstance(obj, (type, types.ModuleType)) else type(obj).__name__
        raise incompatible(lib, f"{owner}.{name}" + (f" ({what})" if what else "")) from None


def import_internal(module: str, name: str | None = None, *, lib: str, what: str = ""):
    """Import an internal module (and take ``name`` from it), or raise a :class:`CompatError`."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if not (e.name and module.startswith(e.name)):
            raise  # a dependency of the module is missing, not the module itself
        raise incompatible(lib, f"module {module}" + (f" ({what})" if what else "")) from None
    return mod if name is None else require_attr(mod, name, lib=lib, what=what)
