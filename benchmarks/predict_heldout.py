"""Held-out check of the time model: the shipped recipes (and an MLP 2048x2048), which the
predict section of compare.py does not use and the time model was not developed on, each under
the strategies that fit it at world 2, 24 steps; each run's own predicted.step_time_s (needs a
calibration: python -m suite.calibrate --world-size 2) against its median step. ``--world 4``:
4 ranks on the node, with the sharded and hybrid strategies (ZeRO-1/3, HSDP, tensor x data
parallel, a 4-stage 1F1B) in place of zero2 and gpipe (calibrate with --world-size 2,4).

    python benchmarks/predict_heldout.py [OUT] [--world 4]    (about 5 min on 2 cores; 10 at world 4)
"""
import argparse
import glob
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path
parser = argparse.ArgumentParser(description="held-out check of the step-time prediction")
parser.add_argument("out", nargs="?", help="folder for the runs (default /tmp/predict-heldout-wN)")
parser.add_argument("--world", type=int, choices=(2, 4), default=2, help="ranks on this node")
cli = parser.parse_args()
WORLD = cli.world
OUT = cli.out or f"/tmp/predict-heldout-w{WORLD}"
R = str(Path(__file__).resolve().parent.parent / "recipes") + "/"
CASES = {
    "keras_mlp": (R + "keras_mlp.yaml", [], ["ddp", "fsdp", "zero2", "allreduce"]),
    "tensor_transformer": (R + "tensor_transformer.yaml", [], ["ddp", "fsdp", "zero2", "allreduce", "tensor"]),
    "gpipe_vgg": (R + "gpipe_vgg.yaml", [], ["ddp", "fsdp", "zero2", "allreduce", "gpipe"]),
    "mlp2048": (R + "keras_mlp.yaml", ["model={name: mlp, hidden: [2048, 2048]}"], ["ddp", "fsdp", "zero2", "allreduce"]),
    "cifar_cnn": (R + "cifar_cnn.yaml", [], ["ddp", "fsdp", "zero2", "allreduce"]),
}
if WORLD == 4:
    CASES = {
        "keras_mlp": (R + "keras_mlp.yaml", [], ["ddp", "zero1", "zero3", "hsdp", "tensor_dp"]),
        "tensor_transformer": (R + "tensor_transformer.yaml", [], ["ddp", "fsdp", "zero3", "hsdp", "tensor_dp"]),
        "gpipe_vgg": (R + "gpipe_vgg.yaml", [], ["ddp", "zero1", "zero3", "hsdp", "1f1b4"]),
        "mlp2048": (R + "keras_mlp.yaml", ["model={name: mlp, hidden: [2048, 2048]}"],
                    ["ddp", "allreduce", "zero1", "zero3", "hsdp", "tensor_dp"]),
        "cifar_cnn": (R + "cifar_cnn.yaml", [], ["ddp", "allreduce", "fsdp", "zero3", "hsdp"]),
    }
STRAT = {"zero1": "strategy={name: zero, stage: 1}", "zero3": "strategy={name: zero, stage: 3}",
         "hsdp": "strategy={name: fsdp, replicate: 2}", "tensor_dp": "strategy={name: tensor, dp: 2}",
         "1f1b4": "strategy={name: pipeline, schedule: 1f1b, stages: 4, micro_batches: 8}",
         "zero2": "strategy={name: zero, stage: 2}", "gpipe": "strategy={name: pipeline, schedule: gpipe, stages: 2, micro_batches: 4}",
         "tensor": "strategy={name: tensor}"}
rows = []
for name, (recipe, extra, strategies) in CASES.items():
    for s in strategies:
        out = f"{OUT}/{name}-{s}"
        args = [sys.executable, "-m", "suite.submit", recipe, *extra, STRAT.get(s, f"strategy={{name: {s}}}"),
                "training.max_steps=24", "training.epochs=100", "tracking.wandb=disabled", f"launch.tasks_per_node={WORLD}", "--out", out]
        proc = subprocess.run(args, capture_output=True, text=True)
        runs = glob.glob(out + "/*/summary.json")
        if proc.returncode or not runs:
            print(name, s, "FAILED", proc.stderr.strip().splitlines()[-1:], flush=True); continue
        summ = json.load(open(runs[0]))
        p, m = (summ.get("predicted") or {}).get("step_time_s"), summ["step_time_s"]
        rows.append((name, s, p, m))
        print(f"{name:20s}{s:10s} predicted {p*1e3 if p else float('nan'):8.2f} ms measured {m*1e3:8.2f} ms error {((p/m-1)*100 if p else float('nan')):+6.1f}%", flush=True)
errs = sorted(abs(p / m - 1) for _, _, p, m in rows if p)
print(f"runs {len(errs)}: median |error| {statistics.median(errs)*100:.0f}%, p90 {errs[int(0.9*(len(errs)-1)+0.5)]*100:.0f}%")
def tau(xs, ys):
    c = d = 0
    for i, j in itertools.combinations(range(len(xs)), 2):
        s = (xs[i] - xs[j]) * (ys[i] - ys[j])
        c += s > 0; d += s < 0
    return (c - d) / max(1, c + d)
for name in CASES:
    r = [(p, m) for n, _, p, m in rows if n == name and p]
    print(f"Kendall tau {name}: {tau([p for p, _ in r], [m for _, m in r]):.2f} ({len(r)} strategies)")
