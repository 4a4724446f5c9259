"""peak_allocated_bytes: the most bytes the rank had allocated at once, counted from the model build.

On GPU the CUDA allocator counts this itself (``torch.cuda.max_memory_allocated``). On CPU the
resident set is no substitute: glibc keeps freed blocks for reuse (a freed 16 MiB gradient stays
resident) and never makes resident the pages of a block nobody touched, so the resident set above
start was 0.2x (ZeRO's untouched bucket) to 4x (FSDP) the allocated peak in our runs. glibc does count the bytes it has handed out and
not had back, in all threads (``mallinfo2``: its arenas' in-use bytes plus its mmapped blocks;
about 2 us a call). ``AllocatedPeak`` reads that count after every tensor operation of the rank's
thread (a dispatch mode), from just before the model is built through the first ``STEPS`` training
steps, and keeps the most above its reading at the start. Later steps repeat the first ones'
allocations, so the window ends there and the mode costs nothing after. What it misses: a peak
inside one operation, or in another thread between two of this thread's operations.

Memory that was allocated before the start and is freed inside the window lowers the count
below the start, so the window's own allocations would read that much smaller. Garbage is the
case met: a rank forked from a process with uncollected reference cycles (a warm pool's earlier
point, a test process) frees them when the collector runs, and DeepSpeed calls ``gc.collect()``
while it builds its engine (a 26 MiB tensor in a cycle took 26 MiB off ZeRO-3's measured peak
per cycle). So the start collects garbage first (tens of milliseconds, once per rank, before the
model build); what a library frees of its own earlier memory is still not told apart.
A forked rank (the warm pool's, the test harness's) inherits its parent's heap, and what of it
is freed inside the window still lowers the count: a ZeRO-1 rank forked from a test process
that had run the rest of the suite read 161 MB where a fresh one read 179 MB. A peak compared
against a prediction is taken from a fresh process, as ``suite.submit`` starts its ranks.

PyTorch's profiler, which counts the CPU allocator's tensors alone, did not serve: it reports
blocks only in threads that carry its state, so a buffer a collective's worker thread frees stays
counted (FSDP's peaks then moved by two units from run to run). A compiled run is not measured
(None): the dispatch mode would change what ``torch.compile`` traces.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc

import torch

from suite.compat import torch as torch_compat

STEPS = 2  # the first step creates the optimizer's state; the second is a step like all later ones


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2  # glibc 2.33+
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _mallinfo2()


def allocated_bytes() -> int | None:
    """The bytes glibc's malloc has handed out and not had back, all threads; None without glibc 2.33+."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return info.uordblks + info.hblkhd


class _Sampler(torch_compat.dispatch_mode_class()):
    def __init__(self):
        super().__init__()
        self.start = allocated_bytes()
        self.peak = self.start

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        now = _MALLINFO2()
        self.peak = max(self.peak, now.uordblks + now.hblkhd)
        return out


_warm = False


def _warm_up() -> None:
    """The process's first op under a Python dispatch mode allocates 26 MiB of torch's own, kept
    for good: paid here, before the start, so that the measurement does not count itself."""
    global _warm
    if not _warm:
        with _Sampler():
            torch.ones(1) * 2
        _warm = True


class AllocatedPeak:
    def __init__(self, device: torch.device, compiled: bool = False):
        self.device = device
        self.peak: int | None = None
        self._measures = device.type == "cuda" or (_MALLINFO2 is not None and not compiled)
        self._sampler: _Sampler | None = None

    def start(self) -> None:
        if not self._measures:
            return
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        gc.collect()  # garbage from before the start is freed now, not inside the window (module doc)
        _warm_up()
        self._sampler = _Sampler()
        self._sampler.__enter__()

    def stop(self) -> int | None:
        """End the window (again is harmless); the peak in bytes, or None where it was not measured.
        On GPU it is read again at each call: the peak since the start."""
        if self.device.type == "cuda" and self._measures:
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        elif self._sampler is not None:
            sampler, self._sampler = self._sampler, None
            sampler.__exit__(None, None, None)
            self.peak = max(sampler.peak - sampler.start, 0)
        return self.peak
