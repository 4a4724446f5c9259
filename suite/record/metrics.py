"""Every metric the suite reports, defined once, with its unit in its name.

- step_time_s: wall time of one optimizer step on one rank (device synchronised on GPU).
- samples_per_s: global training samples / wall time spent in training steps (eval excluded).
- tokens_per_s: samples_per_s x tokens per sample (sequence data only: DataSpec.tokens_per_sample).
- epoch_time_s: wall time of one epoch's training steps on rank 0 (eval excluded).
- eval_time_s: wall time of one full pass over the validation set.
- peak_memory_bytes: on GPU, the CUDA allocator's peak allocated bytes; on CPU, the process's
  peak resident set size (which includes the Python runtime and libraries).
- peak_memory_above_start_bytes: the resident memory the training itself took. On CPU,
  peak_memory_bytes minus the resident set when the rank began building its model (Python,
  torch, the strategy's libraries and the data set already loaded): parameters, gradients,
  optimizer state, activations, communication buffers, and what the allocators keep around
  them. On GPU, equal to peak_memory_bytes (the CUDA allocator counts tensors only).
- peak_allocated_bytes: the most bytes the rank had allocated at once from the model build on,
  what the planner predicts (suite.record.allocated). On GPU, torch.cuda.max_memory_allocated
  (tensors). On CPU, glibc malloc's bytes handed out and not yet freed, above its count at the
  build, read after each tensor operation through the first training steps: tensors, and what
  the libraries allocate beside them (gloo's scratch for a collective). Unlike the resident set it
  leaves out freed blocks the allocator keeps and counts allocated pages never touched
  (DeepSpeed's 1.9 GiB gradient bucket: resident only as far as the gradients fill it).
- bubble_fraction: share of a pipeline stage's schedule wall time spent not computing (waiting for
  neighbours): 1 - busy_s / wall_s, per rank; compare with (stages-1)/(micro_batches+stages-1).
- val_perplexity (language models): exp of the mean loss per scored token over the whole validation
  set (val_loss of a language model is that mean: padding not counted, sequences weighted by length).
- held_bytes: exact bytes (numel x element size) of the parameters, gradients and optimizer
  state tensors the rank holds; for sharded tensors, only the local shard.
Evaluation (epoch records val_*, summary.json ``final``; suite.models.task):
- val_loss: the task's loss, sample-weighted mean over the whole validation set (all ranks).
- val_accuracy: right predictions / samples; for segmentation, pixel accuracy (each image scored
  by its fraction of right pixels; images of a run have equally many pixels).
- val_miou (segmentation): mean intersection over union. Per class c, intersection = pixels
  predicted c and labelled c, union = pixels predicted c or labelled c, each summed over the
  whole validation set and all ranks first; IoU_c = intersection / union, averaged over the
  classes present (union > 0: labelled or predicted somewhere), as mmsegmentation's nan-mean does.
Per rank (summary.json ``ranks``; suite.train.tracking, suite.record.utilisation):
- samples_per_s (per rank): samples of the rank's data shard / the rank's training wall time.
- cpu_percent_{mean,peak}: the rank's process CPU % (100 = one core) sampled every
  tracking.sample_interval_s; rss_bytes_{mean,peak}: its resident set size, same samples.
- gpu_util_percent, gpu_memory_used_bytes, gpu_power_w (_mean, _peak): NVML, on GPU ranks.
Per run (suite.record.flops):
- flops_per_step: FLOPs (a multiply-add = 2) of forward + backward of the unwrapped model over
  one global batch, counted once by torch's FlopCounterMode; the optimizer update is not counted.
- achieved_flops_per_s: flops_per_step x steps / training wall time (all devices together).
- devices: GPUs (ranks x launch.devices_per_task); on CPU one per rank (a rank and its
  torch.get_num_threads() threads: the devices of a layer-wise split in one process share them).
- peak_flops_per_s: per device, in the precision the matmuls run in (training.precision, or FSDP's
  mixed_precision), from peak_flops_source (suite.record.peak): "recipe" (tracking.peak_flops_per_s,
  which wins), "vendor table" (GPUs: the datasheet table in suite.record.flops) or "measured" (CPUs:
  the best rate of square matmuls at the rank's thread count, cached per machine).
- mfu: achieved_flops_per_s / (peak_flops_per_s x devices), a fraction; absent when no peak is known.
"""
from __future__ import annotations

import math
import os
import resource
import statistics
import time
from typing import Iterable

import torch


def tensor_bytes(tensors: Iterable) -> int:
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if hasattr(t, "to_local"):  # DTensor: count only this rank's shard
            t = t.to_local()
        total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizer) -> int:
    return sum(tensor_bytes(state.values()) for state in optimizer.state.values())


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def memory_start_bytes(device: torch.device) -> int:
    """What peak_memory_above_start_bytes is measured from: the resident set now on CPU (Linux:
    /proc/self/statm), 0 on GPU."""
    if device.type == "cuda":
        return 0
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Stopwatch:
    """Wall time of a block; synchronises the device first so GPU work is counted."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.elapsed_s = 0.0

    def __enter__(self):
        self.ctx.synchronize()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.ctx.synchronize()
        self.elapsed_s = time.perf_counter() - self._t0


def tokens_per_s(samples: int, seconds: float, tokens_per_sample: int | None) -> float | None:
    if not tokens_per_sample or not seconds:
        return None
    return samples * tokens_per_sample / seconds


def perplexity(mean_token_loss: float) -> float:
    """exp of the mean token loss (nats); inf where that overflows."""
    return math.exp(mean_token_loss) if mean_token_loss < 700 else math.inf


def bubble_fraction(busy_s: float, wall_s: float) -> float:
    """Idle share of a pipeline stage's wall time (see the module docstring)."""
    return max(0.0, 1.0 - busy_s / wall_s) if wall_s > 0 else 0.0


def rate(amount: float, seconds: float) -> float | None:
    """amount per second (samples/s, FLOP/s); None when no time was measured."""
    return amount / seconds if seconds else None


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float, devices: int) -> float:
    """Model FLOPs utilisation: achieved / (peak per device x devices), a fraction."""
    return achieved_flops_per_s / (peak_flops_per_s * devices)


def intersection_union(predicted: torch.Tensor, target: torch.Tensor, classes: int):
    """Per-class pixel counts (intersection, union), int64 tensors of length ``classes``."""
    predicted, target = predicted.flatten(), target.flatten()
    inter = torch.bincount(target[predicted == target], minlength=classes)[:classes]
    union = (torch.bincount(predicted, minlength=classes)[:classes]
             + torch.bincount(target, minlength=classes)[:classes] - inter)
    return inter, union


def mean_iou(intersection, union) -> float | None:
    """val_miou from per-class sums (see the module docstring); None when no class is present."""
    ious = [i / u for i, u in zip(intersection, union) if u > 0]
    return sum(ious) / len(ious) if ious else None


def median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


STRAGGLER_RATIO = 1.2  # compute per step this many times the fastest rank's: the others wait for it


def straggler(ranks: list[dict]) -> dict | None:
    """The rank whose compute per step (``compute_s``: its own forward, backward and optimizer
    step, suite.strategies.clock) is the largest, where it is at least ``STRAGGLER_RATIO`` times
    the smallest: a synchronous step goes at its pace, and its peers' ``collective_s`` is mostly
    waiting for it. None with one rank, without the split, or when no rank stands out."""
    timed = [r for r in ranks if r and r.get("compute_s")]
    if len(timed) < 2:
        return None
    slow = max(timed, key=lambda r: r["compute_s"])
    fast = min(timed, key=lambda r: r["compute_s"])
    if slow["compute_s"] < STRAGGLER_RATIO * fast["compute_s"]:
        return None
    return {"rank": slow["rank"], "compute_s": slow["compute_s"], "fastest_compute_s": fast["compute_s"],
            "peers_collective_s": median(r.get("collective_s") for r in timed if r is not slow
                                         and r.get("collective_s") is not None)}
