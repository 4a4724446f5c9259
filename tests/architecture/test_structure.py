"""The three sides of suite/ stay apart: the submitting side (suite.submit) and analysis never
import the per-rank code (suite.train), and the run record's reader imports no torch."""
import subprocess
import sys
from pathlib import Path

import pytest


def _modules_after_import(*names) -> set[str]:
    code = ("import sys\n" + "".join(f"import {n}\n" for n in names)
            + "print('\\n'.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.slow
def test_the_submitting_side_never_imports_the_per_rank_code():
    loaded = _modules_after_import("suite.submit.cli", "suite.submit.launch", "suite.submit.follow")
    per_rank = sorted(m for m in loaded if m == "suite.train" or m.startswith("suite.train."))
    assert not per_rank, f"the submitting side imported {per_rank}"


@pytest.mark.slow
def test_the_run_record_and_analysis_import_no_torch():
    loaded = _modules_after_import("suite.record.run_record", "analysis.report")
    assert "torch" not in loaded
    assert not [m for m in loaded if m.startswith("suite.train")]


def test_the_architecture_layout_names_every_module_outside_the_registries():
    """docs/architecture.md's Layout section names every top-level module and folder of suite/, and
    every file of the packages that are not one-file-per-entry registries (strategies, models, data)."""
    root = Path(__file__).resolve().parents[2]
    layout = (root / "docs" / "architecture.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    suite = root / "suite"
    wanted = [p for p in suite.iterdir() if p.suffix == ".py" and p.name != "__init__.py"]
    wanted += [p for p in suite.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    for package in ("submit", "tasks", "planner", "train", "recipe", "record", "compat", "common", "calibrate", "verify", "doctor"):
        wanted += [p for p in (suite / package).glob("*.py") if p.name != "__init__.py"]
    missing = sorted(str(p.relative_to(root)) for p in wanted
                     if f"`{p.name}" not in layout and f"{p.relative_to(root)}" not in layout)
    assert not missing, f"docs/architecture.md's Layout section does not name: {missing}"


def test_ci_runs_exactly_the_readmes_test_command():
    from pathlib import Path

    readme = Path("README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith('pip install -c constraints.txt -e ".[test]"'))
    assert command in Path(".ci/run").read_text().splitlines()
