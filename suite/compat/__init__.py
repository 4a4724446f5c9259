"""Third-party internals the suite relies on, quarantined: one module per library
(``deepspeed``, ``torch``, ``torchvision``, ``submitit``, ``transformers``). Every private or undocumented name the suite touches,
and every library method it patches or overrides, is reached only through these modules, each
access checked against the library versions in ``CHECKED`` (the pins in pyproject.toml).

A missing internal raises :class:`CompatError` naming the library, its installed version and
what was expected; nothing falls back to a default (a silent default once meant 0 bytes reported).
docs/compat.md lists every access and what to do when upgrading a library.
"""
from __future__ import annotations

import importlib
import types
from importlib import metadata

# The versions every access in suite/compat/ was checked on (pinned in pyproject.toml).
CHECKED = {"torch": "2.14.1", "torchvision": "0.29.1", "deepspeed": "0.19.8", "submitit": "1.5.4",
           "transformers": "5.17.0"}


class CompatError(RuntimeError):
    """A third-party internal the suite relies on is missing or has changed."""


def installed_version(lib: str) -> str:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def incompatible(lib: str, expected: str) -> CompatError:
    """The error for a changed internal of ``lib``: what was expected, the installed version and
    the version the access was checked on."""
    return CompatError(f"{lib} {installed_version(lib)} is not what suite/compat/{lib}.py was checked "
                       f"against ({lib} {CHECKED[lib]}): expected {expected}. Install {lib}=={CHECKED[lib]} "
                       f"(the pin in pyproject.toml), or update suite/compat/{lib}.py (docs/compat.md)")


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
