"""FLOPs of one training step, counted once, and the peak-FLOPs table MFU is measured against.

``train_step_flops(recipe)`` builds the recipe's model on the meta device (no memory, no
data), runs one forward and backward pass over a global batch under
``torch.utils.flop_counter.FlopCounterMode`` and returns the count. It is the model's
arithmetic, independent of how a strategy splits it: the optimizer update and the strategy's
communication are not counted, nor recomputation (activation checkpointing would add work
that is not counted either, which is the usual MFU convention).
"""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

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


def train_step_flops(recipe) -> int | None:
    """FLOPs of forward + backward over one global batch of the unwrapped model, or None
    (with the reason printed) for a model the counter cannot run on the meta device."""
    from suite.models import build as build_model

    spec = recipe.data.spec()
    batch = recipe.training.batch_size
    dtype = getattr(torch, spec.input_dtype)
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = build_model(recipe.model, spec)
            inputs = torch.zeros(batch, *spec.input_shape, dtype=dtype)  # values do not matter
            counter = FlopCounterMode(display=False)
            with counter:
                # The loss reduction is negligible next to the model; a sum stands in for it.
                model(inputs).float().sum().backward()
        return int(counter.get_total_flops())
    except Exception as e:  # noqa: BLE001 - counting is a measurement, never a reason to fail
        print(f"FLOPs per step not counted for model {recipe.model.name}: {type(e).__name__}: {e}", flush=True)
        return None
