"""Horovod is refused with the reason it does not build here and what to use instead
(suite/strategies/horovod.py), at recipe time and as one line from the command line."""
import subprocess
import sys

import pytest

from suite.common.errors import SuiteError
from tests.parity import make_recipe


def test_horovod_is_refused_with_the_reason_and_the_alternative():
    with pytest.raises(SuiteError, match=r"strategy.name=horovod is not supported: Horovod 0.28.1 does not build "
                                         r"against torch 2.14.1 .*C\+\+20.*use strategy.name=ddp or strategy.name=allreduce"):
        make_recipe({"name": "horovod"}, 2)


@pytest.mark.slow
def test_horovod_on_the_command_line_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/quickstart.yaml", "strategy.name=horovod",
                           "--dry-run"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "strategy.name=horovod is not supported" in lines[0], lines

