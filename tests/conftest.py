import os

# Tests that do not test tracking run with W&B disabled; one thread per rank on 2 cores.
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def pytest_report_header(config):
    """Which of torch's CPU kernel sets this run uses: parity must hold under each
    (tests/run_kernel_sets.sh). torch ignores an ATEN_CPU_CAPABILITY the CPU lacks, silently."""
    import torch

    got = torch.backends.cpu.get_cpu_capability()
    asked = os.environ.get("ATEN_CPU_CAPABILITY")
    return f"torch CPU kernel set: {got}" + (f" (ATEN_CPU_CAPABILITY={asked})" if asked else " (the CPU's own)")
