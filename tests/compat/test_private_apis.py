"""Private names of torch, deepspeed, submitit, fairscale, torchvision and transformers are reached
only through suite/compat/ (docs/compat.md): every other module of suite/ and analysis/ is parsed and any
private name of those libraries fails the test, listed as file:line and the name. Caught:

- importing a module path with a private component (``import torch._dynamo``,
  ``from torch.utils._python_dispatch import TorchDispatchMode``), and any string that is such a
  path (``importlib.import_module("torch._dynamo")``, a strategy's ``warm_imports``);
- importing a private name (``from torch import _C``);
- a private attribute reached from a name bound to one of the libraries or their modules
  (``torch._C``, ``dist._x`` after ``import torch.distributed as dist``, ``nn.modules._x`` after
  ``from torch import nn``), also through ``getattr(torch, "_x")`` with a literal string.

Dunders (``torch.__version__``) are public. Private attributes of objects the libraries return
(``tensor._cdata``) cannot be told apart by name; those are kept in compat by review."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIBRARIES = frozenset({"torch", "deepspeed", "submitit", "fairscale", "torchvision", "transformers"})
SCANNED = ("suite", "analysis")
QUARANTINE = REPO / "suite" / "compat"
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def private(name: str) -> bool:
    """A single-underscore name (``_C``, ``_x``); dunders are public."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _library_path(path: str) -> bool:
    return path.split(".")[0] in LIBRARIES


def _private_path(path: str) -> bool:
    return _library_path(path) and any(private(part) for part in path.split("."))


def _chain(node: ast.Attribute) -> tuple[ast.AST, list[str]]:
    """``a.b.c`` -> (the node of ``a``, ["b", "c"])."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return node, attrs[::-1]


def violations(source: str, filename: str = "<string>") -> list[str]:
    """Every private name of LIBRARIES that ``source`` reaches, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    found: list[tuple[int, str]] = []
    bound: dict[str, str] = {}  # local name -> the library path it is bound to (any scope)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _library_path(alias.name):
                    continue
                if _private_path(alias.name):
                    found.append((node.lineno, f"import {alias.name}"))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _library_path(node.module):
            if _private_path(node.module):
                found.append((node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"))
            for alias in node.names:
                if private(alias.name):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    outer = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in outer:  # a whole chain, once
            root, attrs = _chain(node)
            if isinstance(root, ast.Name) and root.id in bound and any(private(a) for a in attrs):
                found.append((node.lineno, f"{bound[root.id]} as {root.id}: {root.id}.{'.'.join(attrs)}"))
        elif isinstance(node, ast.Call) and node.args:
            func, args = node.func, node.args
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            literal = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in args]
            if (called in ("getattr", "hasattr", "setattr") and len(args) > 1 and isinstance(args[0], ast.Name)
                    and args[0].id in bound and literal[1] and private(literal[1])):
                found.append((node.lineno, f"{called}({args[0].id}, {literal[1]!r})"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value)
              and _private_path(node.value)):
            found.append((node.lineno, f"the module path {node.value!r}"))
    return [f"{filename}:{line}: {what}" for line, what in sorted(set(found))]


def scanned_files() -> list[Path]:
    return sorted(p for top in SCANNED for p in (REPO / top).rglob("*.py")
                  if QUARANTINE not in p.parents and "__pycache__" not in p.parts)


def test_private_names_of_the_libraries_are_only_in_suite_compat():
    files = scanned_files()
    assert any(p.parts[-2:] == ("planner", "counting.py") for p in files)  # the scan sees suite/
    found = [v for p in files for v in violations(p.read_text(), str(p.relative_to(REPO)))]
    assert not found, ("private names of " + ", ".join(sorted(LIBRARIES)) + " outside suite/compat/ "
                       "(move each behind a function there; docs/compat.md):\n" + "\n".join(found))


# ---- the checker itself catches what it should, and nothing else --------------------------------

VIOLATING = {
    "import torch._dynamo": "import torch._dynamo",
    "import torch.distributed._composable as c": "import torch.distributed._composable",
    "from torch.utils._python_dispatch import TorchDispatchMode": "from torch.utils._python_dispatch",
    "from deepspeed.runtime.zero._x import y": "from deepspeed.runtime.zero._x",
    "from torch import _C": "from torch import _C",
    "from fairscale.optim import _helper": "from fairscale.optim import _helper",
    "import torch\ntorch._C._nn": "torch as torch: torch._C._nn",
    "import torch.distributed\nx = torch.distributed._functional": "torch as torch: torch.distributed._functional",
    "import torch.distributed as dist\ndist._something()": "torch.distributed as dist: dist._something",
    "from torch import nn\nnn.modules._x": "torch.nn as nn: nn.modules._x",
    "def f():\n    from deepspeed.runtime import zero\n    return zero._y": "deepspeed.runtime.zero as zero: zero._y",
    "import submitit as s\ns.core._z = 1": "submitit as s: s.core._z",
    "import torchvision\ntorchvision.datasets.CIFAR10._check_integrity":
        "torchvision as torchvision: torchvision.datasets.CIFAR10._check_integrity",
    "import importlib\nimportlib.import_module('torch._dynamo')": "the module path 'torch._dynamo'",
    "class Options:\n    warm_imports = ('deepspeed', 'torch._dynamo')": "the module path 'torch._dynamo'",
    "import torch\ngetattr(torch, '_C')": "getattr(torch, '_C')",
}

CLEAN = """
import os
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from suite.common import _private_of_ours
from . import _sibling

torch.__version__
dist.all_reduce(torch.ones(1))
nn.Module.__init__
tensor = torch.ones(1)
tensor._cdata  # an object's attribute: not a library's name
os._exit
_private_of_ours._x
importlib.import_module("suite._x")
getattr(tensor, "_x")
warm_imports = ("torch.distributed.fsdp", "suite._x", "torch._dynamo and more words")
"""


def test_the_checker_catches_each_kind_of_private_name():
    for source, expected in VIOLATING.items():
        found = violations(source)
        assert len(found) == 1 and expected in found[0], (source, found)


def test_the_checker_passes_public_names():
    assert violations(CLEAN) == []


def test_a_violation_names_its_file_and_line():
    assert violations("import os\n\nimport torch\nx = torch._C", "suite/x.py") == [
        "suite/x.py:4: torch as torch: torch._C"]
