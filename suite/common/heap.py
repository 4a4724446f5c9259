"""Freed memory kept in the process's heap, for a CPU rank: the one allocator rule the ranks follow
(``suite.train.dist``) and the planner's model timing copies (``suite.planner.model_rate``), so
that a prediction times the model as the run will step it.

glibc's malloc hands a large block back to the kernel when it is freed: anything of 128 KiB and up
is its own ``mmap``, and the heap's top is trimmed once it holds more than 128 KiB free. A training
step frees its gradients, activations and optimizer temporaries and allocates them again the next
step, so every step page-faults them back in and the kernel zeroes every page. On a VM each fault
also costs a trip to the hypervisor: keeping the heap halves a large MLP's step and steadies a
small one's (benchmarks/results/code-rules.md). PyTorch's CPU tuning guide makes the same point for jemalloc and
tcmalloc; this gets it from glibc itself, in a rank that was forked from a warm process, where
``LD_PRELOAD`` cannot reach.

``keep_freed_memory`` turns off ``mmap`` for allocations (``M_MMAP_MAX`` 0: every block comes from
the heap) and trimming (``M_TRIM_THRESHOLD`` 2 GiB): a rank's resident memory then stays at its
peak, which its next step reaches again anyway. Not on another C library (musl, macOS) or where
``SCALESUITE_KEEP_FREED_MEMORY=0`` asks for the allocator's defaults (to measure what this does).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: trim only past 2 GiB free at the heap's top

applied = False


def keep_freed_memory() -> bool:
    """Keep freed blocks in this process's heap (see the module doc); True where it applied."""
    global applied
    if applied:
        return True
    if os.environ.get("SCALESUITE_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or None).mallopt
    except (OSError, AttributeError):  # no glibc: its own allocator's rules stand
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM))
    return applied
