"""The three sides of suite/ stay apart: the submitting side (suite.submit) and analysis never
import the per-rank code (suite.train), and the run record's reader imports no torch."""
import subprocess
import sys


def _modules_after_import(*names) -> set[str]:
    code = ("import sys\n" + "".join(f"import {n}\n" for n in names)
            + "print('\\n'.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_the_submitting_side_never_imports_the_per_rank_code():
    loaded = _modules_after_import("suite.submit.cli", "suite.submit.launch", "suite.submit.follow")
    per_rank = sorted(m for m in loaded if m == "suite.train" or m.startswith("suite.train."))
    assert not per_rank, f"the submitting side imported {per_rank}"


def test_the_run_record_and_analysis_import_no_torch():
    loaded = _modules_after_import("suite.record.run_record", "analysis.report")
    assert "torch" not in loaded
    assert not [m for m in loaded if m.startswith("suite.train")]


def test_ci_runs_exactly_the_readmes_test_command():
    from pathlib import Path

    readme = Path("README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith('pip install -e ".[test]"'))
    assert command in Path(".ci/run").read_text().splitlines()
