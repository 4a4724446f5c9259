"""suite.record.allocated: the bytes a rank allocated at once, counted from its start."""
import torch

from suite.record.allocated import AllocatedPeak


def test_a_freed_tensor_still_counts_at_its_peak_and_what_was_there_before_does_not():
    """Run first in its process: the measurement's own first use (26 MiB) must not be counted."""
    before = torch.ones(8 * 2**20)  # 32 MiB allocated before the start: not counted
    peak = AllocatedPeak(torch.device("cpu"))
    peak.start()
    a = torch.ones(16 * 2**20)  # 64 MiB
    b = a * 2  # another 64 MiB: 128 MiB at once
    del a, b
    torch.ones(4 * 2**20)  # 16 MiB after both were freed: the peak stays
    measured = peak.stop()
    assert 128 * 2**20 <= measured < 128 * 2**20 + 8 * 2**20, measured
    assert peak.stop() == measured  # stopping again changes nothing
    del before


def test_garbage_from_before_the_start_freed_inside_the_window_does_not_lower_the_peak():
    """A reference cycle holding 32 MiB, left by earlier work and collected during the window (as
    DeepSpeed's gc.collect() does in its engine's build), must not come off the window's peak."""
    import gc

    class Cycle:
        pass

    gc.disable()  # as if the collector had not come round to it yet
    try:
        garbage = Cycle()
        garbage.me, garbage.tensor = garbage, torch.ones(8 * 2**20)  # 32 MiB
        del garbage
        peak = AllocatedPeak(torch.device("cpu"))
        peak.start()
        gc.collect()  # inside the window
        a = torch.ones(16 * 2**20)  # 64 MiB
        measured = peak.stop()
        del a
    finally:
        gc.enable()
    assert 64 * 2**20 <= measured < 64 * 2**20 + 8 * 2**20, measured


def test_a_compiled_run_is_not_measured():
    peak = AllocatedPeak(torch.device("cpu"), compiled=True)
    peak.start()
    torch.ones(2**20)
    assert peak.stop() is None
