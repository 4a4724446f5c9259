"""A GPU's time per operator: each operator a step runs, counted on the meta device or on fake
tensors (``OpCosts``), priced on a GPU profile (``time_s``) by what bounds it there:

- matrix multiplies (``mm``, ``addmm``, ``bmm``, ``baddbmm``): 2·m·n·k FLOPs at the device's
  dense peak for the operands' dtype, times the share of it large GEMMs sustain
  (``gemm_efficiency``), times the share of the output tiles (128 x 128) a shape fills and of the
  last wave of tiles over the multiprocessors (``sm_count``) it fills: a skinny or ragged shape
  wastes tiles. Or its operands' bytes at the memory bandwidth, where that is longer (a
  matrix-vector product);
- attention (the fused kernels ``scaled_dot_product_attention`` picks: flash / memory-efficient):
  4·b·h·s_q·s_kv·d FLOPs forward (half of it causal), 2.5 x that backward (its five matmuls
  against the forward's two), at the peak times the kernel's sustained share
  (``attention_efficiency``: forward, backward);
- every other operator: the bytes it reads and writes at the memory bandwidth times
  ``memory_efficiency`` (elementwise, norms, softmax, the optimizer's update: memory-bound);
- each kernel at least ``kernel_s`` (a launch).

The counts come from ``suite.planner.counting.OpCosts``. The step's counts are per rank (its shards under tensor parallelism); ``StepProfile.ops`` holds
them (``summary``), the passes and the optimizer's update apart (a sharding strategy steps its
shard). The figures of each preset (``suite.planner.hardware``) are from data sheets and public
microbenchmarks, said so there; a measured profile replaces them.
"""
from __future__ import annotations

import math

TILE = 128  # a GEMM kernel's output tile, rows x columns


def _peak(device: dict, element: int, precision: str) -> float:
    peaks = device["peak_flops_per_s_by_precision"]
    name = {2: precision if precision in ("bf16", "fp16") else "bf16", 4: "fp32", 8: "fp64"}.get(element, "fp32")
    return peaks.get(name) or peaks["fp32"]


def matmul_s(device: dict, batch: int, m: int, n: int, k: int, element: int, precision: str) -> float:
    """One matmul's seconds on ``device`` (module doc)."""
    tiles_m, tiles_n = math.ceil(m / TILE), math.ceil(n / TILE)
    fill = (m * n) / (tiles_m * tiles_n * TILE * TILE)
    tiles = batch * tiles_m * tiles_n
    waves = math.ceil(tiles / device["sm_count"])
    rate = _peak(device, element, precision) * device["gemm_efficiency"] * fill * tiles / (waves * device["sm_count"])
    moved = batch * (m * k + k * n + m * n) * element
    return max(2 * batch * m * n * k / rate, moved / (device["memory_bytes_per_s"] * device["memory_efficiency"]),
               device["kernel_s"])


def attention_s(device: dict, b: int, heads: int, s_q: int, s_kv: int, d: int, causal: bool, backward: bool,
                element: int, precision: str) -> float:
    """One fused attention kernel's seconds (module doc)."""
    flops = 4 * b * heads * s_q * s_kv * d * (0.5 if causal else 1.0) * (2.5 if backward else 1.0)
    share = device["attention_efficiency"]["backward" if backward else "forward"]
    return max(flops / (_peak(device, element, precision) * share), device["kernel_s"])


def memory_s(device: dict, moved_bytes: int, ops: int) -> float:
    return moved_bytes / (device["memory_bytes_per_s"] * device["memory_efficiency"]) + ops * device["kernel_s"]


def time_s(ops: dict, device: dict, precision: str) -> dict:
    """Seconds by kind (matmul, attention, memory) and in all (``total``) of ``ops`` (``summary``'s
    form) on ``device`` (a GPU profile's ``compute``)."""
    parts = {"matmul": sum(calls * matmul_s(device, *key, precision) for *key, calls in ops.get("matmul", [])),
             "attention": sum(calls * attention_s(device, *key, precision) for *key, calls in ops.get("attention", [])),
             "memory": memory_s(device, *(ops.get("memory") or [0, 0]))}
    return {**parts, "total": sum(parts.values())}


def step_s(ops: dict, device: dict, precision: str) -> dict:
    """Seconds of a rank's step (``StepProfile.ops``): its share of the passes and of the update."""
    passes, update = time_s(ops["passes"], device, precision), time_s(ops["update"], device, precision)
    share, update_share = ops.get("passes_share", 1.0), ops.get("update_share", 1.0)
    return {"passes_s": passes["total"] * share, "update_s": update["total"] * update_share,
            "matmul_s": passes["matmul"] * share, "attention_s": passes["attention"] * share,
            "memory_s": passes["memory"] * share + update["total"] * update_share,
            "total": passes["total"] * share + update["total"] * update_share}
