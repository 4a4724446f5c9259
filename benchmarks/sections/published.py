"""Published: training runs from papers and reports (``published_runs.py``), each predicted by the
planner on its hardware's profile (a preset from specs, or the profile file of the variant the
run used) with nothing measured here: tokens/s per GPU and peak memory per GPU (reserved by the
caching allocator or allocated, as the source counts it), or ZeRO's model states, beside what was
published. The rows looked at while the model was built (dev) and the
held-out rows are reported apart. Predictions only: no timing on this machine."""
from __future__ import annotations

import statistics

from common import Bench, Section

THROUGHPUT, MEMORY = 0.15, 0.10  # median |error| targets


def recipe_of(row: dict):
    from suite import recipe as recipes

    layout = {"nodes": max(1, row["gpus"] // 8), "tasks_per_node": min(8, row["gpus"]), "device": "cuda"}
    return recipes.validate({
        "name": "published", "model": row["model"], "strategy": row["strategy"],
        "data": {"name": "synthetic_tokens", "vocab": row["vocab"], "seq_len": row["seq"], "n_train": 64, "n_val": 16},
        "optimizer": {"name": "adamw", "lr": 3e-4},
        "training": {"batch_size": row["batch"], "grad_accumulation": row.get("accumulation", 1), "epochs": 1,
                     "precision": row["precision"],
                     "activation_checkpointing": row["checkpointing"]},
        "launch": {"executor": "slurm" if layout["nodes"] > 1 else "local", **layout}, "tracking": {"wandb": "disabled"}})


def predict(row: dict) -> dict:
    """The planner's figures for a row: tokens/s per GPU, peak GiB per GPU, model states GB."""
    from suite.planner import analytic, hardware, timing

    recipe = recipe_of(row)
    profile = analytic.profile(recipe, row["gpus"], "published row")
    step = timing.predict_step_time(profile, hardware.load(row["hardware"]), timing.options_of(recipe))
    reserved = row.get("memory_kind") == "reserved"  # compared like with like (published_runs' doc)
    if reserved and profile.reserved_bytes is None:
        raise SystemExit(f"published row {row['name']!r}: no reserved bytes predicted (a GPU profile predicts them)")
    return {"tokens_per_s_per_gpu": row["batch"] * row["seq"] / step["step_s"] / row["gpus"],
            "memory_gib": (profile.reserved_bytes if reserved else profile.peak_bytes) / 2**30,
            "allocated_gib": profile.peak_bytes / 2**30, "reserved_gib": (profile.reserved_bytes or 0) / 2**30,
            "states_gb": sum(profile.held_bytes.values()) / 1e9, "step": step}


def _error(predicted: float, published: float) -> float:
    return predicted / published - 1


def run(bench: Bench) -> Section:
    s = Section("Published runs: predicted vs published")
    errors = {}
    for group in ("dev", "held-out"):
        rows = [r for r in bench_rows() if r["group"] == group]
        table = []
        for row in rows:
            got = predict(row)
            cells = []
            for key, unit in (("tokens_per_s_per_gpu", "tok/s/GPU"), ("memory_gib", "GiB"), ("states_gb", "GB")):
                if key in row:
                    e = _error(got[key], row[key])
                    errors.setdefault((group, "memory" if key != "tokens_per_s_per_gpu" else "throughput"), []).append(e)
                    what = f"memory {row.get('memory_kind', 'allocated')}" if key == "memory_gib" else key.split('_')[0]
                    cells.append(f"{what}: {got[key]:,.{0 if got[key] > 100 else 2}f} {unit} vs "
                                 f"{row[key]:,.{0 if row[key] > 100 else 2}f} ({e:+.0%})")
            if "memory_gib" in row:  # both figures, whichever the source reports
                cells.append(f"predicted allocated {got['allocated_gib']:.2f} GiB, reserved {got['reserved_gib']:.2f} GiB")
            gpu = got["step"].get("gpu_s") or {}
            table.append([row["name"], row["precision"], _degrees(row), row["batch"], row["checkpointing"],
                          f"{row['gpus']} x {_hardware(row)}", row["published"], "; ".join(cells),
                          ", ".join(f"{k[:-2]} {v:.2f}" for k, v in gpu.items() if k.endswith("_s") and k != "passes_s")
                          + f", comm exposed {got['step']['exposed_comm_s']:.2f} s", row["source"]])
        s.lines += [f"### {group} rows", ""]
        s.table(["run", "precision", "degrees", "global batch", "checkpointing", "GPUs", "published",
                 "predicted vs published", "predicted step parts (s)", "source"], table)
        s.lines.append("")
    for (group, kind), es in sorted(errors.items()):
        target = THROUGHPUT if kind == "throughput" else MEMORY
        median = statistics.median(abs(e) for e in es)
        s.check(f"{group} rows: median |error| of {kind} <= {target:.0%}", f"{median:.1%} over {len(es)}",
                median <= target)
    return s


def bench_rows() -> list[dict]:
    from published_runs import ROWS

    return ROWS


def _degrees(row: dict) -> str:
    st = row["strategy"]
    if st["name"] == "tensor":
        return f"TP {row['gpus'] // st['dp']} x DP {st['dp']}"
    return f"{st['name']}{' stage ' + str(st['stage']) if 'stage' in st else ''} {row['gpus']}"


def _hardware(row: dict) -> str:
    return row["hardware"] if "/" not in row["hardware"] else "H100 96 GB 500 W (profile file)"
