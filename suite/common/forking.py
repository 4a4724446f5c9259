"""Forking a process that has already run torch's CPU kernels on several threads.

torch's CPU kernels (and MKL under them) run on GNU OpenMP, whose thread pool does not survive
``fork``: the child inherits the pool's bookkeeping but not its threads, and its first parallel
region on more than one thread waits for them forever. The suite forks in several places (the
planner's fake runs and calibration, the doctor's ranks, the warm pool, the test harness), and a
parent that measured or trained on all its cores before forking would hang every child that does
the same.

``install`` (run when ``suite`` is imported) registers a handler that hands the pool back to
OpenMP (``omp_pause_resource_all``, OpenMP 5.0) just before each fork; the next parallel region
on either side starts a new pool, at the cost of starting its threads again. It does nothing in a
process that has not loaded OpenMP, or whose OpenMP lacks the call (LLVM's and Intel's runtimes
survive a fork on their own)."""
from __future__ import annotations

import ctypes
import functools
import os
import sys

OMP_PAUSE_HARD = 2  # omp_pause_resource_t: release the threads and their memory
_installed = False


def install() -> None:
    """Release OpenMP's threads before every fork of this process (once per process)."""
    global _installed
    if not _installed:
        os.register_at_fork(before=release_openmp_threads)
        _installed = True


def release_openmp_threads() -> None:
    if "torch" not in sys.modules:
        return  # nothing has started a pool
    if (pause := _pause_call()) is not None:
        pause(OMP_PAUSE_HARD)


@functools.cache
def _pause_call():
    """``omp_pause_resource_all`` of the GNU OpenMP this process has loaded (torch's own copy,
    whatever its file is called), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return getattr(ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0)), "omp_pause_resource_all")
        except (OSError, AttributeError):
            continue
    return None
