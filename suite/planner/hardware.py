"""Hardware profiles: what the time model (``suite.planner.timing``) knows of a cluster.

A profile is a calibration (``python -m suite.calibrate`` measures one: ``suite.planner.calibration``)
or a preset of public hardware built here from published specs, so that a cluster can be
planned from a laptop (``--hardware h100``). Both carry:

- ``compute``: the rate a rank computes at (a measured calibration: the matmul peak per thread
  count, and the model's own rate timed when a prediction is made, ``suite.planner.model_time``;
  a preset: the device's peak per precision, its memory bandwidth and multiprocessors, and what
  its kernels sustain, with which ``suite.planner.gpu_ops`` prices a step operator by operator;
  ``efficiency``, a flat share of the peak, only where a step's operators were not counted);
- ``links``: α-β fits per collective kind for each link class, ``intra`` (ranks of one node) and
  ``inter`` (ranks on different nodes); ``collectives`` (the fits of the ranks the calibration
  ran, the older name) stands for whichever it measured.

A variant of a preset (other memory, another link) is a profile file a user writes: the preset's
JSON with those fields changed (``benchmarks/profiles/h100_96gb_500w.json``: torchtitan's H100s),
passed as ``--hardware FILE``.

A preset says so: ``from_specs`` is true and ``source`` names the specs; every output planned
on it says its figures are from specs, not measured.

Presets (NVIDIA's data sheets; DGX/HGX node layout: 8 GPUs on NVSwitch, one InfiniBand
adapter per GPU):

- ``h100``: H100 SXM5 80 GB. Dense BF16/FP16 tensor core 989 TFLOP/s, FP64 67, FP32 67 (CUDA
  cores); HBM3 3.35 TB/s, 132 SMs; NVLink 4 900 GB/s per GPU in both directions (450 GB/s each
  way); NDR InfiniBand 400 Gb/s per GPU (50 GB/s).
- ``h200``: H200 SXM 141 GB: H100's compute, HBM3e 4.8 TB/s; the same links.
- ``a100``: A100 SXM4 80 GB. Dense BF16/FP16 312 TFLOP/s, FP64 19.5, FP32 19.5; HBM2e 2,039 GB/s,
  108 SMs; NVLink 3 600 GB/s per GPU (300 GB/s each way); HDR InfiniBand 200 Gb/s per GPU (25 GB/s).
- ``a100_40gb``: A100 SXM4 40 GB: the same, HBM2 1,555 GB/s.

Not in the data sheets, and so assumptions, stated in ``assumptions``: what a GPU's kernels
sustain (``_AMPERE``, ``_HOPPER``, ``_KERNELS`` below), the latency per message step α
(NVLink/NVSwitch 10 µs, InfiniBand 20 µs: NCCL's small-message all-reduce takes tens of µs), and
that NCCL's rings reach the link's one-way bandwidth (its "bus bandwidth").
"""
from __future__ import annotations

import json
from pathlib import Path

from suite.common.errors import SuiteError
from suite.planner.alpha_beta import BORROWED, FORMULAS, MEASURED

EFFICIENCY = 0.4  # share of the dense peak a training step achieves on a preset (an assumption)
GB = 1e9

# What a GPU's kernels sustain (suite.planner.gpu_ops), assumptions from public microbenchmarks,
# not data sheets: cuBLAS's large bf16 GEMMs reach about 80 % of the dense peak on A100 and H100
# (NVIDIA's and others' published GEMM sweeps); FlashAttention-2 reaches 50-70 % of A100's peak
# forward and 40-60 % backward (Dao 2023, fig. 4-5), 35-40 % and 30 % on H100 (Shah et al. 2024,
# FlashAttention-3, fig. 4-6: FA2's rows); elementwise kernels about 80 % of HBM bandwidth; a
# kernel takes at least 4 µs (launch and tail).
_AMPERE = {"gemm_efficiency": 0.80, "attention_efficiency": {"forward": 0.60, "backward": 0.45}}
_HOPPER = {"gemm_efficiency": 0.80, "attention_efficiency": {"forward": 0.38, "backward": 0.30}}
_KERNELS = {"memory_efficiency": 0.80, "kernel_s": 4e-6}
_H100_PEAK = {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12, "fp64": 67e12}
_A100_PEAK = {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12, "fp64": 19.5e12}
_NVLINK4, _NVLINK3 = ("NVLink 4 / NVSwitch", 450 * GB, 10e-6), ("NVLink 3 / NVSwitch", 300 * GB, 10e-6)
_NDR, _HDR = ("InfiniBand NDR 400 Gb/s", 50 * GB, 20e-6), ("InfiniBand HDR 200 Gb/s", 25 * GB, 20e-6)


def _preset(device: str, memory_bytes: int, hopper: bool, bandwidth: float, source: str) -> dict:
    """A DGX/HGX node of 8 GPUs of one generation: Hopper (H100, H200: NVLink 4, NDR) or Ampere
    (A100: NVLink 3, HDR)."""
    return {"device": device, "memory_bytes": memory_bytes, "per_node": 8,
            "peak": _H100_PEAK if hopper else _A100_PEAK,
            "gpu": {"memory_bytes_per_s": bandwidth, "sm_count": 132 if hopper else 108,
                    **(_HOPPER if hopper else _AMPERE), **_KERNELS},
            "intra": _NVLINK4 if hopper else _NVLINK3, "inter": _NDR if hopper else _HDR, "source": source}


PRESETS = {
    "h100": _preset("NVIDIA H100 SXM5 80 GB", 80 * 2**30, True, 3.35e12,
                    "NVIDIA H100 Tensor Core GPU data sheet (SXM5: HBM3 3.35 TB/s, 132 SMs); DGX H100 user guide"),
    "h200": _preset("NVIDIA H200 SXM 141 GB", 141 * 10**9, True, 4.8e12,
                    "NVIDIA H200 Tensor Core GPU data sheet (SXM: HBM3e 141 GB, 4.8 TB/s); HGX H200 (8 GPUs, NVSwitch)"),
    "a100": _preset("NVIDIA A100 SXM4 80 GB", 80 * 2**30, False, 2.039e12,
                    "NVIDIA A100 Tensor Core GPU data sheet (SXM4 80 GB: HBM2e 2,039 GB/s, 108 SMs); DGX A100 user guide"),
    "a100_40gb": _preset("NVIDIA A100 SXM4 40 GB", 40 * 2**30, False, 1.555e12,
                         "NVIDIA A100 Tensor Core GPU data sheet (SXM4 40 GB: HBM2 1,555 GB/s, 108 SMs); DGX A100 "
                         "user guide"),
}
LINK_CLASSES = ("intra", "inter")


def _fits(alpha_s: float, beta: float) -> dict:
    kinds = set(MEASURED) | set(BORROWED)
    return {k: {"alpha_s": alpha_s, "beta_bytes_per_s": beta, "formula": FORMULAS[k], "method": "from specs"}
            for k in sorted(kinds)}


def preset(name: str) -> dict:
    """The profile of a preset (module doc); SuiteError naming the presets for an unknown one."""
    spec = PRESETS.get(name.lower())
    if spec is None:
        raise SuiteError(f"--hardware {name}: no such preset or file; presets: {', '.join(PRESETS)}, "
                         f"or a profile written by python -m suite.calibrate --out FILE")
    (intra_name, intra_beta, intra_alpha), (inter_name, inter_beta, inter_alpha) = spec["intra"], spec["inter"]
    return {"key": f"preset-{name.lower()}", "from_specs": True, "source": spec["source"], "backend": "nccl",
            "device": spec["device"], "per_node": spec["per_node"], "memory_bytes": spec["memory_bytes"],
            "compute": {"per_device": True, "peak_flops_per_s_by_precision": spec["peak"], "efficiency": EFFICIENCY,
                        **spec["gpu"]},
            "links": {"intra": {**_fits(intra_alpha, intra_beta), "link": intra_name},
                      "inter": {**_fits(inter_alpha, inter_beta), "link": inter_name}},
            "assumptions": [f"operators priced one by one (suite.planner.gpu_ops): large GEMMs at "
                            f"{spec['gpu']['gemm_efficiency']:.0%} of the dense peak, attention forward/backward at "
                            f"{spec['gpu']['attention_efficiency']['forward']:.0%}/"
                            f"{spec['gpu']['attention_efficiency']['backward']:.0%}, other operators at "
                            f"{spec['gpu']['memory_efficiency']:.0%} of memory bandwidth; {EFFICIENCY:.0%} of the dense "
                            f"peak where a step's operators were not counted",
                            f"α {intra_alpha * 1e6:.0f} µs within a node, {inter_alpha * 1e6:.0f} µs across nodes",
                            "collectives reach the link's one-way bandwidth"]}


def load(name_or_path: str | None, backend: str | None = None) -> dict | None:
    """A profile: a preset's name, a calibration file, or (None) this host's stored calibration."""
    from suite.planner import calibration

    if name_or_path is None:
        return calibration.load(backend=backend)
    path = Path(name_or_path)
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise SuiteError(f"--hardware {name_or_path}: not a profile (JSON: {e})") from None
    return preset(name_or_path)


def link_fits(calibration: dict, link: str) -> dict:
    """The α-β fits of a link class (``intra`` or ``inter``): the profile's own, else the
    measured ``collectives`` (what it measured stands for both, and ``describe`` says so)."""
    links = calibration.get("links") or {}
    return links.get(link) or links.get("intra") or calibration["collectives"]


# A calibration begun with the 1-minute load average at or above this many runnable processes per
# core is flagged (``busy_load``): other work slows what it times. Measured on 2 cores: begun at
# load 1.36, its costs of a call between slices of compute at 2 ranks came out 29-38 % above one begun
# at 0.22 (all_reduce 664-813 µs against 480-632 µs), and the predictions made from it -19 .. +40 %.
# Read on the calibrating host: none for a calibration whose ranks ran on Slurm nodes.
BUSY_LOAD_PER_CORE = 0.5


def busy_load(calibration: dict) -> float | None:
    """The load average when a measured calibration began, where the machine was busy then
    (``BUSY_LOAD_PER_CORE``); else None (a preset, a quiet machine, a calibration without it)."""
    load, cores = calibration.get("load_average_at_start"), (calibration.get("compute") or {}).get("cores") or 1
    return load if load is not None and load >= BUSY_LOAD_PER_CORE * cores else None


# A calibration whose fixed matmul (``compute.speed_sample``, at its ranks' start and end and at its
# own end) ran this much faster at best than at worst is flagged (``speed_spread``): the machine
# did not keep its speed, and steps measured there vary as much (benchmarks/results/code-rules.md).
SPEED_SPREAD = 0.25


def speed_spread(calibration: dict) -> float | None:
    """``samples_spread`` of the calibration's speed samples; None for a preset or a calibration
    from before the samples."""
    return samples_spread((calibration.get("compute") or {}).get("speed_samples") or [])


def samples_spread(samples) -> float | None:
    """max / min - 1 of speed samples ((when, FLOP/s) pairs), where it is ``SPEED_SPREAD`` or
    more; else None (a steady machine, fewer than two samples)."""
    rates = [r for _, r in samples if r > 0]
    if len(rates) < 2:
        return None
    spread = max(rates) / min(rates) - 1
    return spread if spread >= SPEED_SPREAD else None


def describe(calibration: dict) -> str:
    """One line saying what the figures rest on."""
    if calibration.get("from_specs"):
        return (f"{calibration['device']} preset: figures from published specs, not measured "
                f"({calibration['source']}); assumed: {'; '.join(calibration['assumptions'])}")
    links = calibration.get("links") or {}
    where = "within and across nodes" if "inter" in links else "within one node (across nodes assumed the same)"
    busy = busy_load(calibration)
    return (f"calibration {calibration.get('key', '?')} measured on {', '.join(calibration.get('hosts', []) or ['?'])}, "
            f"links {where}" + (f"; begun on a busy machine (load average {busy:.2f}): its times, and these "
                                "predictions, may be slow; calibrate again when it is quiet" if busy else "")
            + (f"; the machine's speed changed by {spread:.0%} while it was measured: steps here vary as much"
               if (spread := speed_spread(calibration)) else ""))
