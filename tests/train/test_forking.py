"""A process that ran torch on several threads can still fork ranks (``suite.common.forking``)."""
import os
import signal
import subprocess
import sys

_FORK_AFTER_THREADS = """
import os, sys
import torch
import suite  # noqa: F401  (installs the handler)

torch.set_num_threads(2)
torch.randn(400_000).exp().sum()  # a parallel region: OpenMP's pool now has a second thread
pid = os.fork()
if pid == 0:
    torch.set_num_threads(2)
    torch.randn(400_000).exp().sum()  # without the handler, GNU OpenMP waits here forever
    os._exit(0)
_, status = os.waitpid(pid, 0)
torch.randn(400_000).exp().sum()  # and the parent's next parallel region starts a new pool
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_after_a_parallel_region_runs_its_own_on_two_threads():
    proc = subprocess.Popen([sys.executable, "-c", _FORK_AFTER_THREADS], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the hung child too
        raise AssertionError("the forked child hung in its first parallel region") from None
    assert proc.returncode == 0 and out.strip() == "child 0", out + err[-2000:]
