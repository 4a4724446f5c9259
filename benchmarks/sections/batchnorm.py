"""Synced batch norm's cost on CPU: one layer's forward + backward against native ``BatchNorm2d``
(``batchnorm_cost.py``, in its own process with one thread, as a rank of a 2-rank run on 2 cores has)."""
from __future__ import annotations

from common import Section, script_json

RATIO = 1.3  # synced / native, forward + backward, summed over ResNet-18's stage shapes


def run(bench) -> Section:
    s = Section("Synced batch norm cost")
    m = script_json("batchnorm_cost.py", "--repeats", "5" if bench.quick else "30")
    s.lines += ["One batch-norm layer in training, forward + backward, on ResNet-18's feature maps at batch 32 "
                "(CIFAR-sized input): torch's native `BatchNorm2d` against the suite's synced layer in a process "
                "group of one (its two collectives called, no peer to wait for); medians of interleaved "
                f"repetitions, {m['threads']} thread(s).", ""]
    s.table(["shape", "native (ms)", "synced (ms)", "synced / native"],
            [["x".join(map(str, r["shape"])), r["native_ms"], r["synced_ms"], r["synced_ms"] / r["native_ms"]]
             for r in m["rows"]] + [["all four", m["total_native_ms"], m["total_synced_ms"], m["ratio"]]])
    s.lines += ["Held out (not the shapes the layer was tuned on): a whole network's forward + backward at batch 32, "
                "every batch-norm layer synced against native.", ""]
    s.table(["model", "native (ms)", "synced (ms)", "synced / native"],
            [[f"{r['model']} (width {r['width']})", r["native_ms"], r["synced_ms"], r["ratio"]] for r in m["models"]])
    s.check(f"synced batch norm within {RATIO}x of native (forward + backward, all four shapes)",
            f"{m['ratio']:.2f}x", m["ratio"] <= RATIO)
    return s
