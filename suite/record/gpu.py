"""Which NVML device a rank's CUDA device is, and its readings.

CUDA numbers the devices a process may see (``CUDA_VISIBLE_DEVICES``, set by Slurm on a shared
node; in CUDA's own order, fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); NVML numbers
every device of the machine in PCI order. ``cuda:0`` of a job given GPUs 2 and 3 is NVML's 2, and
its entries may be indices or ``GPU-``/``MIG-`` UUIDs (whole or a unique prefix). Rather than
re-parse the mask, the rank asks the CUDA runtime for its device's UUID (resolved by CUDA itself,
whatever the mask and the order) and NVML for the device with that UUID. nvidia-ml-py is the
``gpu`` extra (``pip install -e ".[gpu]"``).
"""
from __future__ import annotations

import torch


class NoDevice(LookupError):
    """No NVML device has the CUDA device's UUID."""


def nvml_handle(nvml, cuda_index: int):
    """The NVML handle of CUDA device ``cuda_index`` of this process, by its UUID."""
    uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
    for name in (uuid, f"GPU-{uuid}", f"MIG-{uuid}"):  # torch gives the bare UUID, NVML the prefixed one
        try:
            return nvml.nvmlDeviceGetHandleByUUID(name)
        except nvml.NVMLError:
            continue
    raise NoDevice(f"no NVML device has the UUID of cuda:{cuda_index} ({uuid})")


def readings(nvml, handle) -> dict:
    """Utilisation %, memory used and power of one device; a reading the device does not
    support (a MIG slice has no utilisation or power of its own) is left out."""
    reads = {"gpu_util_percent": lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
             "gpu_memory_used_bytes": lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
             "gpu_power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0}
    out = {}
    for key, read in reads.items():
        try:
            out[key] = read()
        except nvml.NVMLError:
            continue
    return out


def peak_reserved_bytes(device: torch.device) -> int | None:
    """What the CUDA caching allocator held from the driver at most (allocated plus its cache:
    what the device had to have free), None off CUDA."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_reserved(device))
