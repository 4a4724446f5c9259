"""The planner's output: Markdown (printed and ``plan.md``), ``plan.csv``, ``plan.png`` (peak
bytes per rank against world size, one line per strategy) and ``profiles.json``."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from suite.planner.profile import COLLECTIVE_KINDS

HELD = ("parameters", "gradients", "optimizer_state")


def rank_memory_bytes(raw: dict) -> tuple[int, str]:
    """What one rank may use: its GPU's memory, or on CPU this machine's RAM shared by the
    recipe's ranks per node (launch.tasks_per_node)."""
    import torch

    device = (raw.get("launch") or {}).get("device", "auto")
    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, "GPU memory"
    import psutil

    per_node = max(int((raw.get("launch") or {}).get("tasks_per_node", 1)), 1)
    return psutil.virtual_memory().total // per_node, f"host RAM / {per_node} rank(s) per node"


def _mib(n) -> str:
    return f"{n / 2**20:.2f}"


def rows(points) -> list[dict]:
    out = []
    for p in points:
        if not p.profile:
            continue
        prof = p.profile
        row = {"strategy": p.label, "world_size": p.world_size, "source": prof.source}
        row.update({f"{k}_bytes": prof.held_bytes.get(k, 0) for k in HELD})
        row["peak_bytes"] = prof.peak_bytes
        row["reserved_bytes"] = prof.reserved_bytes
        row["fit_bytes"] = prof.fit_bytes
        kinds = [k for k in COLLECTIVE_KINDS if k in prof.comm_bytes] + sorted(set(prof.comm_bytes) - set(COLLECTIVE_KINDS))
        row["comm_bytes"] = sum(prof.comm_bytes.values())
        row["comm"] = "; ".join(f"{k} {_mib(prof.comm_bytes[k])} MiB x{prof.comm_calls.get(k, 0)}" for k in kinds)
        row["flops"] = prof.flops
        row["notes"] = prof.notes
        out.append(row)
    return out


def write(points, raw: dict, out: Path) -> str:
    """Write every output; return the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    table = rows(points)
    budget, what = rank_memory_bytes(raw)
    for row in table:
        row["fits"] = row["fit_bytes"] <= budget
    with open(out / "plan.csv", "w", newline="") as f:
        fields = ["strategy", "world_size", "source", *(f"{k}_bytes" for k in HELD), "peak_bytes", "reserved_bytes", "comm_bytes",
                  "comm", "flops", "fits", "notes"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table)
    (out / "profiles.json").write_text(json.dumps([p.profile.to_dict() for p in points if p.profile], indent=1))
    _plot(table, out / "plan.png", budget)
    text = _markdown(points, table, raw, budget, what)
    (out / "plan.md").write_text(text)
    return text


def _markdown(points, table, raw, budget, what) -> str:
    model = raw.get("model", {}).get("name", "?")
    lines = [f"# Plan: {raw.get('name', '')} (model {model}, global batch "
             f"{(raw.get('training') or {}).get('batch_size', '?')})", "",
             "Per rank per optimizer step, rank 0. MiB = 2^20 bytes. Communication: message bytes per "
             "collective kind (docs/plan.md).", "",
             "Peak: allocated bytes; reserved: what the CUDA caching allocator holds for them (GPU recipes).", "",
             "| strategy | world | source | params MiB | grads MiB | optim MiB | peak MiB | reserved MiB | comm MiB | "
             "collectives | GFLOP |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['strategy']} | {r['world_size']} | {r['source']} | {_mib(r['parameters_bytes'])} | "
                     f"{_mib(r['gradients_bytes'])} | {_mib(r['optimizer_state_bytes'])} | {_mib(r['peak_bytes'])} | "
                     f"{_mib(r['reserved_bytes']) if r['reserved_bytes'] is not None else '-'} | "
                     f"{_mib(r['comm_bytes'])} | {r['comm'] or '-'} | {r['flops'] / 1e9:.3f} |")
    lines += ["", f"## Ranked (fits {_mib(budget)} MiB per rank ({what}), then least communication)", ""]
    for world in sorted({r["world_size"] for r in table}):
        ranked = sorted((r for r in table if r["world_size"] == world), key=lambda r: (not r["fits"], r["comm_bytes"]))
        lines.append(f"- world {world}: " + ", ".join(
            f"{i}. {r['strategy']} ({_mib(r['fit_bytes'])} MiB{'' if r['fits'] else ', does not fit'}, "
            f"{_mib(r['comm_bytes'])} MiB sent)" for i, r in enumerate(ranked, 1)))
    notes = [(r["strategy"], r["world_size"], r["notes"]) for r in table if r["notes"]]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {s} @ {w}: {n}" for s, w, n in notes]
    left_out = [p for p in points if not p.profile]
    if left_out:
        lines += ["", "## Excluded", ""]
        for p in left_out:
            lines.append(f"- {p.label} @ {p.world_size}: {p.excluded or 'failed: ' + p.error}")
    return "\n".join(lines) + "\n"


def _plot(table, path: Path, budget: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["strategy"] for r in table):
        mine = sorted((r for r in table if r["strategy"] == name), key=lambda r: r["world_size"])
        ax.plot([r["world_size"] for r in mine], [r["peak_bytes"] / 2**20 for r in mine], marker="o", label=name)
    ax.axhline(budget / 2**20, color="grey", linestyle="--", label="memory per rank")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("peak MiB per rank")
    ax.set_title("Memory per rank")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
