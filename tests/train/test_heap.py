"""A CPU rank keeps freed memory in its heap (suite/common/heap.py): a step's buffers are not handed
back to the kernel and page-faulted in again every step. Each case runs in a fresh interpreter:
the allocator's settings are per process and cannot be undone."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)

FREE_AND_MEASURE = """
import json, psutil, torch
from suite.common import heap
{setup}
rss = lambda: psutil.Process().memory_info().rss
x = torch.ones(64 * 2**20 // 4)  # 64 MiB, written: resident
before_free = rss()
del x
print(json.dumps({{"applied": heap.applied, "returned_mib": (before_free - rss()) / 2**20}}))
"""


def _run(setup: str, env=None) -> dict:
    proc = subprocess.run([sys.executable, "-c", FREE_AND_MEASURE.format(setup=setup)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _glibc() -> bool:
    import platform

    return platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _glibc(), reason="the allocator's settings are glibc's (mallopt); another C library keeps its own")
def test_a_freed_buffer_stays_in_the_process_once_asked_and_goes_back_by_default():
    kept = _run("heap.keep_freed_memory()")
    assert kept["applied"] and kept["returned_mib"] < 8, kept
    default = _run("")
    assert not default["applied"] and default["returned_mib"] > 56, default  # glibc unmaps a block that large
    off = _run("heap.keep_freed_memory()", env={"SCALESUITE_KEEP_FREED_MEMORY": "0"})
    assert not off["applied"] and off["returned_mib"] > 56, off


@pytest.mark.skipif(not _glibc(), reason="the allocator's settings are glibc's (mallopt); another C library keeps its own")
def test_a_cpu_rank_keeps_freed_memory_from_when_it_joins():
    kept = _run("from suite.train import dist\ndist.init('cpu')")
    assert kept["applied"] and kept["returned_mib"] < 8, kept
