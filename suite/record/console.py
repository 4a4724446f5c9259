"""The console lines the submitting side (``suite.submit``) and rank 0 (``suite.train``) print,
in one place so that both say the same: what a job will run, an epoch, a step, and a finished
run's summary (from its ``summary.json``, ``suite.record.run_record``)."""
from __future__ import annotations

from pathlib import Path

from suite.record.run_record import PEAK_LABELS


def job_line(recipe) -> str:
    """What a job will run: strategy, world and how the global batch splits (``suite.strategies.layout``)."""
    l, layout = recipe.launch, recipe.layout()
    split = [f"{layout.dp_size} data-parallel rank(s)"]
    if layout.accumulation_steps > 1:
        split.append(f"{layout.accumulation_steps} accumulation step(s)")
    if layout.pipeline_chunks > 1:
        split.append(f"{layout.pipeline_chunks} pipeline chunk(s)")
    mesh = f", mesh {' x '.join(f'{n} {d}' for n, d in layout.axes.items())}" if len(layout.axes) > 1 else ""
    return (f"{recipe.name}: {recipe.strategy.name} on {l.nodes} node(s) x {l.tasks_per_node} task(s) = world size "
            f"{recipe.world_size} ({l.executor}){mesh}; global batch {layout.batch_size} = {' x '.join(split)} x "
            f"{layout.chunk_batch} samples")


def epoch_line(rec: dict, epochs: int) -> str:
    parts = [f"epoch {rec['epoch'] + 1}/{epochs}", f"train_loss {rec['train_loss']:.4f}"]
    for key in ("val_loss", "val_accuracy", "val_miou", "val_perplexity"):
        if rec.get(key) is not None:
            parts.append(f"{key} {rec[key]:.4f}")
    parts.append(f"{rec['epoch_time_s']:.2f} s")
    return "  ".join(parts)


def step_line(step: int, total_steps: int, loss: float, samples_per_s: float) -> str:
    return f"step {step}/{total_steps} loss {loss:.4f} {samples_per_s:.0f} samples/s"


def summary_text(s: dict, run_dir: Path) -> str:
    """The lines printed when a run completes."""
    final = s.get("final") or {}
    epochs = s.get("epoch_time_s") or [0.0]
    lines = [f"done: {s['name']} ({s['strategy']}, world size {s['world_size']}) in {s['train_time_s']:.1f} s of training",
             f"  throughput {s['samples_per_s']:.0f} samples/s, median step {1000 * s['step_time_s']:.1f} ms, "
             f"epoch {sum(epochs) / len(epochs):.2f} s (mean)"]
    if final:
        lines.append("  final " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    if s.get("mfu") is not None:
        lines.append(f"  MFU {100 * s['mfu']:.2f} % of {s['devices']} x {s['peak_flops_per_s'] / 1e9:.4g} GFLOP/s "
                     f"({PEAK_LABELS.get(s.get('peak_flops_source'), 'peak')} per device)")
    mem = " + ".join(f"{r['peak_memory_bytes'] / 2**30:.2f}" for r in s["ranks"]) + " GiB resident"
    allocated = [r.get("peak_allocated_bytes") for r in s["ranks"]]
    if all(a is not None for a in allocated):  # the part training allocated, beside the whole process
        mem += "; training allocated " + " + ".join(f"{a / 2**20:.1f}" for a in allocated) + " MiB"
    lines.append(f"  peak memory per rank: {mem}")
    if s.get("wandb_notice"):
        lines.append(f"  {s['wandb_notice']}")
    lines.append(f"run record: {run_dir}")
    return "\n".join(lines)
