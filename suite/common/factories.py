"""A user's factory named by import path (recipe ``model.target`` / ``data.target``, as Hydra's
``_target_``): found, imported and checked against its keyword arguments before anything launches.

The contract each factory follows is in ``docs/plugins.md``. Both custom sections share
``TargetOptions``: ``target`` ("package.module:function"), ``kwargs`` and ``pythonpath`` (folders
put in front of ``sys.path``, relative to the current directory: where ``suite.submit`` starts,
and where its local and Slurm ranks start too, so a rank imports the target as the submitter did).
A model target may also be a library's own constructor (``torchvision.models:resnet18``), called
with the recipe's keyword arguments alone (``suite.models.custom``; ``takes_spec`` tells them apart).
"""
from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, model_validator

from suite.common.errors import SuiteError

_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class TargetOptions(BaseModel):
    """Fields of a section built by a user's factory; ``section`` is the recipe key (model, data)."""
    section: ClassVar[str] = ""
    # Arguments the factory takes before its kwargs ("spec" for a model): never set from kwargs.
    fixed_args: ClassVar[tuple[str, ...]] = ()
    target: str
    kwargs: dict[str, Any] = {}
    pythonpath: list[str] = []

    @model_validator(mode="after")
    def _target_resolves(self):
        check_kwargs(self.factory(), self.factory_kwargs(), self.fixed(), self.section, self.target, self.beside(),
                     tuple(sorted(type(self).model_fields)))
        return self

    def factory(self) -> Callable:
        return import_target(self.target, f"{self.section}.target", self.pythonpath)

    def factory_kwargs(self) -> dict:
        return dict(self.kwargs)

    def fixed(self) -> tuple[str, ...]:
        """The arguments the suite passes before the keyword arguments (``fixed_args``)."""
        return self.fixed_args

    def beside(self) -> set[str]:
        """Keyword arguments written beside ``target`` rather than under ``kwargs`` (named so in errors)."""
        return set()


def import_module(module_name: str, pythonpath: list[str] = ()):
    """Import a module with the current folder and ``pythonpath``'s folders (relative to it) first
    on the import path, as a recipe's targets are imported."""
    for folder in [os.getcwd(), *reversed(pythonpath)]:
        folder = os.path.abspath(folder)
        if folder not in sys.path:
            sys.path.insert(0, folder)
    return importlib.import_module(module_name)


def import_target(target: str, key: str, pythonpath: list[str] = ()) -> Callable:
    """The callable ``module:attribute`` names; SuiteError naming ``key`` if it cannot be had."""
    if not _TARGET.match(target):
        raise SuiteError(f"{key}={target!r} is not an import path; write it as package.module:function, "
                         f"e.g. mypkg.nets:build")
    module_name, attribute = target.split(":")
    try:
        obj = import_module(module_name, pythonpath)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises, say it in one line
        where = f"{key.split('.')[0]}.pythonpath={list(pythonpath)}, " if pythonpath else ""
        raise SuiteError(f"{key}={target!r}: cannot import module {module_name} ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:160]}); {where}run from the folder that holds it, "
                         f"add that folder to {key.split('.')[0]}.pythonpath, or pip install it") from None
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise SuiteError(f"{key}={target!r}: module {module_name} has no attribute {attribute}; "
                             f"name a function defined there")
        obj = getattr(obj, part)
    if not callable(obj):
        raise SuiteError(f"{key}={target!r} names a value of type {type(obj).__name__}, not a callable; "
                         f"name the function (or class) that builds it")
    return obj


def takes_spec(factory: Callable) -> bool:
    """Whether a model target is a suite factory, called as ``factory(spec, **kwargs)``: its first
    parameter is named ``spec`` or annotated ``DataSpec``. Anything else (``torchvision.models:
    resnet18``, a module class) is a constructor, called with the keyword arguments alone. A
    callable without a signature (some builtins) is taken for a factory, as before constructors."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return True
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return False
    annotation = params[0].annotation
    named = getattr(annotation, "__name__", annotation if isinstance(annotation, str) else "")
    return params[0].name == "spec" or str(named).rsplit(".", 1)[-1] == "DataSpec"


def check_kwargs(factory: Callable, kwargs: dict, fixed: tuple[str, ...], section: str, target: str,
                 beside: set[str] = frozenset(), own_keys: tuple[str, ...] = ()) -> None:
    """SuiteError naming the key (``<section>.kwargs.<name>``, or ``<section>.<name>`` for one
    written beside ``target``, where a misspelt ``own_keys`` of the section may land too) when
    ``factory`` cannot be called with ``fixed`` + kwargs."""
    key = lambda name: f"{section}.{name}" if name in beside else f"{section}.kwargs.{name}"
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return  # some builtins have no signature: the call itself will tell
    takes = ", ".join(str(p) for p in params.values())
    taken = sorted(set(fixed) & set(kwargs))
    if taken:
        where = section if taken[0] in beside else f"{section}.kwargs"
        raise SuiteError(f"{where} sets {', '.join(taken)}, which the suite passes itself; remove it from {where}")
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [] if open_ended else sorted(set(kwargs) - set(named[len(fixed):]))
    if unknown:
        own = f" (and the suite's own keys {', '.join(own_keys)})" if unknown[0] in beside else ""
        raise SuiteError(f"{key(unknown[0])}: {target} does not accept {', '.join(unknown)}; "
                         f"it takes ({takes}){own}")
    try:
        inspect.signature(factory).bind(*(None for _ in fixed), **kwargs)
    except TypeError as e:
        raise SuiteError(f"{section}.kwargs: {target}({takes}) cannot be called with "
                         f"{', '.join([*fixed, *kwargs]) or 'no arguments'} ({e}); set the missing ones in "
                         f"{section}.kwargs") from None
