"""The peak-FLOPs table MFU is measured against, and the device's name to look it up by. The
FLOPs of a training step are counted once, in ``suite.models.flops``."""
from __future__ import annotations

import torch

# Dense peak FLOP/s per device from the vendors' datasheets (no sparsity). Keys are matched
# as substrings of torch.cuda.get_device_name(), first match wins: specific names first.
# fp32 is plain FP32 (not TF32). Add a row, or set tracking.peak_flops_per_s, for others.
PEAK_FLOPS_PER_S = [
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    ("H100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),  # SXM
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("A10G", {"bf16": 70e12, "fp16": 70e12, "fp32": 31.2e12}),
    ("A10", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    ("L4", {"bf16": 121e12, "fp16": 121e12, "fp32": 30.3e12}),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12}),
    ("T4", {"fp16": 65e12, "fp32": 8.1e12}),
]


def peak_flops_per_s(device_name: str, precision: str) -> float | None:
    """Per-device peak for this device and precision, or None when the table does not know it."""
    for key, peaks in PEAK_FLOPS_PER_S:
        if key.lower() in device_name.lower():
            return peaks.get(precision)
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"
