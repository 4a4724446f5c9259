"""The layers of docs/architecture.md, held: import-linter's contracts (pyproject.toml) pass, no
module of suite/ is on an import circle, suite/ has no loose modules, and every command is a package
with a ``__main__``. What an import inside a function buys (a command that answers fast, a
submitting side that loads nothing of a rank's) is held by test_import_cost.py, not by comments."""
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "suite"
COMMANDS = ["submit", "status", "export", "study", "plan", "calibrate", "verify", "doctor", "train"]
# The one import that runs up the layers, named in the contract too: `torchrun -m suite.train`
# keeps its name and hands over to the rank tasks.
ALLOWED_UP = {("suite.train.__main__", "suite.tasks.torchrun")}


@pytest.mark.slow
def test_the_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"  # import-linter's command, installed with the test extras
    proc = subprocess.run([str(lint) if lint.exists() else "lint-imports", "--config", str(REPO / "pyproject.toml")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def _cycle(graph) -> list[str] | None:
    """One import circle among suite's modules (function-level imports included), or None."""
    modules = sorted(graph.modules)
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m)
                       if i.startswith("suite") and (m, i) not in ALLOWED_UP) for m in modules}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in edges[m]:
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = "done"
        stack.pop()
        return None

    sys.setrecursionlimit(10000)
    for m in modules:
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_module_of_suite_is_on_an_import_circle():
    circle = _cycle(grimp.build_graph("suite"))
    assert circle is None, " -> ".join(circle)


def test_the_cycle_finder_finds_a_circle(tmp_path, monkeypatch):
    for name, body in {"a/__init__.py": "", "a/x.py": "from a import y\n", "a/y.py": "def f():\n    from a import x\n"}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("a", cache_dir=None)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert edges["a.y"] == {"a.x"}  # grimp sees an import inside a function too
    graph_like = type("G", (), {"modules": graph.modules,
                                "find_modules_directly_imported_by": lambda self, m: {i.replace("a", "suite", 1) for i in edges[m.replace("suite", "a", 1)]}})()
    graph_like.modules = {m.replace("a", "suite", 1) for m in graph.modules}
    circle = _cycle(graph_like)
    assert circle and circle[0] == circle[-1]


def test_suite_has_no_loose_modules_and_every_command_is_a_package():
    loose = sorted(p.name for p in SUITE.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"loose modules at suite/ top level: {loose}; put each in the package of its layer"
    for command in COMMANDS:
        assert (SUITE / command / "__main__.py").is_file(), f"python -m suite.{command} has no suite/{command}/__main__.py"


@pytest.mark.slow
def test_every_command_answers_help_from_its_package():
    """``python -m suite.X --help`` prints the command's usage: the package's ``__main__`` runs
    its command line (a module that only defines ``main`` would exit 0 and print nothing)."""
    for command in COMMANDS:
        proc = subprocess.run([sys.executable, "-m", f"suite.{command}", "--help"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (command, proc.stderr[-2000:])
        assert f"suite.{command}" in proc.stdout and "usage" in proc.stdout.lower(), (command, proc.stdout[:500])
