"""Predict: the step-time prediction on models it was never fitted to. Every built-in model family
x the strategies that fit it, at world 2 and 4 on this machine (and 2 Slurm nodes with
``--slurm``), each run's ``predicted.step_time_s`` (made after training from a calibration of the
machine alone, ``python -m suite.calibrate`` with no recipe, and the model's own one-rank step
timed when predicting) against its measured ``step_time_s``. Targets: median |error| <= 15 %,
90th percentile <= 30 %, and per model the predicted order of strategies agrees with the measured
one (Kendall tau >= 0.8). Each group's table row names the pairs its prediction orders wrongly,
marked ~ where, over ``--repeats`` rounds, their measured ranges overlap (a swap the measurement
itself does not settle; the target still counts it).

``--variants FILE`` swaps the families (and, where the file names them, the strategies and worlds)
for a YAML file's, to check the time model on models of one's own (``benchmarks/variants/``):

    families:            # name: the model and data sections of a recipe, and the batch per rank
      mlpdeep: {model: {name: mlp, hidden: [384, 384]}, data: {name: digits}, batch: 64}
    strategies: [ddp, fsdp, gpipe, hsdp]   # optional: labels of DATA_PARALLEL, MODEL_PARALLEL, HYBRID
    worlds: [4]                            # optional: 2 and/or 4 (the hybrids run at 4 only)
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from common import BASE, ROOT, Bench, Section
from suite.advise import trust

MEDIAN, P90, TAU = 0.15, 0.30, 0.8

# One small configuration per family: CPU-sized, each with the data its task reads.
IMAGES = "{name: synthetic, shape: [3, 32, 32], classes: 10, n_train: 4096, n_val: 64}"
FAMILIES = {
    "mlp": ("{name: mlp, hidden: [512, 512]}", "{name: synthetic, shape: [1, 28, 28], classes: 10, n_train: 4096, n_val: 64}", 64),
    "cnn": ("{name: cnn}", IMAGES, 64),
    "vgg11": ("{name: vgg11, width: 0.25, classifier_hidden: 128}", IMAGES, 64),
    "resnet18": ("{name: resnet18, width: 0.25}", IMAGES, 32),
    "mobilenet_v2": ("{name: mobilenet_v2, width: 0.5}", IMAGES, 32),
    "transformer": ("{name: transformer, dim: 64, heads: 4, layers: 2}",
                    "{name: synthetic_tokens, vocab: 64, seq_len: 32, branching: 4, n_train: 4096, n_val: 64}", 32),
    "nbow": ("{name: nbow, embedding: 64, pooling: mean}",
             "{name: synthetic_sentiment, vocab: 2000, seq_len: 64, min_len: 32, planted: 3, n_train: 8192, n_val: 64}", 128),
    "seq2seq": ("{name: seq2seq, cell: lstm, layers: 2, embedding: 32, hidden: 64, dropout: 0.0}",
                "{name: synthetic_seq2seq, task: reverse, vocab: 16, n_train: 4096, n_val: 64}", 64),
    "unet": ("{name: unet, base_channels: 8, depth: 3}", "{name: shapes, size: [32, 32], classes: 3, n_train: 1024, n_val: 32}", 16),
    "segnet": ("{name: segnet, base_channels: 8}", "{name: shapes, size: [32, 32], classes: 3, n_train: 1024, n_val: 32}", 16),
    "autoencoder": ("{name: autoencoder, base_channels: 16}", "{name: digits}", 64),
}
DATA_PARALLEL = {"ddp": "{name: ddp}", "allreduce": "{name: allreduce}", "fsdp": "{name: fsdp}",
                 "zero1": "{name: zero, stage: 1}", "zero2": "{name: zero, stage: 2}", "zero3": "{name: zero, stage: 3}"}
# Where the model allows them (the strategy's own checks refuse the rest before launch: skipped).
MODEL_PARALLEL = {"tensor": "{name: tensor}", "gpipe": "{name: pipeline, micro_batches: 4}",
                  "1f1b": "{name: pipeline, schedule: 1f1b, micro_batches: 4}"}
HYBRID = {"hsdp": "{name: fsdp, replicate: 2}", "tensor_dp": "{name: tensor, dp: 2}", "pipeline_dp": "{name: pipeline, dp: 2}"}
QUICK_STRATEGIES = ("ddp", "fsdp", "zero2", "allreduce", "tensor", "gpipe")


def load_variants(path: Path) -> dict:
    """A ``--variants`` file, checked: {"families": {name: (model, data, batch)}, "strategies":
    [label, ...] or None, "worlds": (2, 4) or fewer}. A ValueError names what is wrong and how to
    fix it."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: cannot read it as YAML ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("families"), dict) or not doc["families"]:
        raise ValueError(f"{path}: needs a 'families' mapping, e.g. families: {{mlp2: {{model: {{name: mlp}}, "
                         "data: {name: digits}, batch: 64}}")
    unknown = sorted(set(doc) - {"families", "strategies", "worlds"})
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}; use families, strategies, worlds")
    families = {}
    for name, spec in doc["families"].items():
        if not isinstance(spec, dict) or set(spec) != {"model", "data", "batch"} or not isinstance(spec["model"], dict) \
                or not isinstance(spec["data"], dict) or not isinstance(spec["batch"], int) or spec["batch"] < 1:
            raise ValueError(f"{path}: family {name!r} needs exactly model (a mapping), data (a mapping) and batch "
                             "(a positive integer)")
        families[str(name)] = (json.dumps(spec["model"]), json.dumps(spec["data"]), spec["batch"])  # JSON is YAML
    known = {**DATA_PARALLEL, **MODEL_PARALLEL, **HYBRID}
    strategies = doc.get("strategies")
    if strategies is not None:
        bad = [s for s in strategies if s not in known] if isinstance(strategies, list) else [str(strategies)]
        if bad or not strategies:
            raise ValueError(f"{path}: strategies {', '.join(map(str, bad)) or '[]'}: choose from {', '.join(known)}")
    worlds = doc.get("worlds", [2, 4])
    if not isinstance(worlds, list) or not worlds or any(w not in (2, 4) for w in worlds):
        raise ValueError(f"{path}: worlds {worlds}: a list of 2 and/or 4 (the ranks on this node)")
    return {"families": families, "strategies": strategies, "worlds": tuple(sorted(set(worlds)))}


def _families(bench: Bench) -> dict:
    return bench.variants["families"] if bench.variants else FAMILIES


def _configs(bench: Bench, slurm: bool):
    worlds = (2,) if bench.quick else (2, 4)
    families = bench.families or list(_families(bench))  # --families: checked by compare.py
    strategies, hybrids = {**DATA_PARALLEL, **MODEL_PARALLEL}, HYBRID
    if bench.quick:
        strategies = {k: v for k, v in strategies.items() if k in QUICK_STRATEGIES}
    if bench.variants:
        worlds = tuple(w for w in bench.variants["worlds"] if w in worlds) or bench.variants["worlds"][:1]
        chosen = bench.variants["strategies"]
        if chosen:
            strategies = {k: v for k, v in strategies.items() if k in chosen}
            hybrids = {k: v for k, v in HYBRID.items() if k in chosen}
    for family, world in itertools.product(families, () if bench.no_local else worlds):
        for label, strategy in strategies.items():
            yield family, label, strategy, world, ["launch.tasks_per_node=" + str(world)]
        if world == 4 and not bench.quick:
            for label, strategy in hybrids.items():
                yield family, label, strategy, world, ["launch.tasks_per_node=4"]
    if slurm:  # 2 Slurm nodes of one rank each
        for family in families:
            for label in ("ddp", "fsdp", "zero2"):
                yield family, label + "@2nodes", DATA_PARALLEL[label], 2, SLURM_LAUNCH


# The local test cluster's two nodes share this machine's 2 cores, though each tells Slurm it has 2
# CPUs: a rank would take 2 threads and the job twice the cores there are, which no real cluster
# does and the time model (nodes are separate machines) cannot know. One thread per rank keeps the
# emulated nodes to a core each. Measured without it (2026-11-26, 33 runs): predicted 24-85 % fast,
# DDP 4x slow against FSDP's 2x (its gloo thread overlapping backward on oversubscribed cores).
SLURM_LAUNCH = ["launch.executor=slurm", "launch.nodes=2", "launch.tasks_per_node=1", "launch.cpus_per_task=1"]


def calibrate(bench: Bench, env: dict) -> str:
    """``python -m suite.calibrate`` of the machine alone (no recipe), into this section's cache;
    with ``--slurm`` also of the cluster's 2 nodes, through Slurm (a rank on a Slurm node reads the
    calibration taken under its node's name, as a user's would)."""
    size = ["--max-bytes", str(2**22 if bench.quick else 2**26)]
    commands = [] if bench.no_local else [["--world-size", "2,4", *size]]
    if bench.slurm:  # the base recipe only for its launch settings: each run times its own model
        commands.append([str(BASE), *SLURM_LAUNCH, "strategy.name=ddp", *size])
    out = []
    for args in commands:
        proc = subprocess.run([sys.executable, "-m", "suite.calibrate", *args], capture_output=True, text=True,
                              cwd=ROOT, env=env)
        if proc.returncode:
            raise SystemExit(f"calibration failed:\n{proc.stderr.strip()[-2000:]}")
        out += [line for line in proc.stdout.splitlines() if not line.startswith("  ")]
    return "\n".join(out)


def _folder(family: str, label: str, world: int, round_: int) -> str:
    """A run's folder under the results: ``predict/<family>-<label>-w<world>`` in the first round,
    ``predict/round<k>/...`` in round k (``benchmarks/repredict.py`` reads both)."""
    name = f"{family}-{label}-w{world}"
    return f"predict/{name}" if round_ == 0 else f"predict/round{round_ + 1}/{name}"


def median_of(values: list) -> float | None:
    """The median of the values given (None and 0 left out: a run without them), or None."""
    have = [v for v in values if v]
    return statistics.median(have) if have else None


def kendall_tau(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-a of two orders (ties count as disagreement-free: neither concordant nor discordant)."""
    pairs = list(itertools.combinations(range(len(xs)), 2))
    if not pairs:
        return None
    score = sum((xs[i] - xs[j]) * (ys[i] - ys[j]) > 0 for i, j in pairs) - \
        sum((xs[i] - xs[j]) * (ys[i] - ys[j]) < 0 for i, j in pairs)
    return score / len(pairs)


def swapped_pairs(items: list[tuple]) -> list[str]:
    """The pairs of strategies a group's prediction orders against its measurement, each
    ``a/b``, with ``~`` after it where the two measured ranges (the lowest and highest step over
    the rounds, ``--repeats``) overlap: their measured order is within the runs' own spread.
    ``items``: (label, predicted, [measured step of each round])."""
    out = []
    for (a, pa, ma), (b, pb, mb) in itertools.combinations(items, 2):
        if (pa - pb) * (statistics.median(ma) - statistics.median(mb)) < 0:
            overlap = len(ma) > 1 and len(mb) > 1 and min(ma) <= max(mb) and min(mb) <= max(ma)
            out.append(f"{a}/{b}" + ("~" if overlap else ""))
    return out


def pairs_by_gap(groups, band: float) -> tuple[list[bool], list[bool]]:
    """For every pair of configurations within a group ((predicted, measured) of each), whether
    it ran in the other order than predicted: the pairs predicted less than ``band`` apart (the
    larger predicted step over the smaller, less 1), then the others."""
    near, far = [], []
    for group in groups:
        for (pa, ma), (pb, mb) in itertools.combinations(group, 2):
            (near if max(pa, pb) / min(pa, pb) - 1 < band else far).append((pa - pb) * (ma - mb) < 0)
    return near, far


# A configuration whose rounds (``--repeats`` >= 2) disagree by SPREAD or more runs up to
# SETTLE_ROUNDS times more, so that the median of its runs is not one slow spell's. On the 2-core
# Intel VM of 2026-11-27 two rounds of the same 32 configurations differed by a median 22 % (90th
# percentile 105 %): a run at a slow moment took up to 4x another's step (mlp640 DDP 78 and 20 ms).
SPREAD, SETTLE_ROUNDS = 0.25, 2


def unsettled(steps: list) -> bool:
    """Whether the median of a configuration's measured steps (one per run so far) rests on runs
    that disagree: the two middle runs (an even count), or the median and the nearer of its
    neighbours (an odd count), ``SPREAD`` or more apart. Two runs so apart have their mean as
    median, half a slow spell's; one slow run of three is left out by the median already."""
    steps = sorted(t for t in steps if t)
    n = len(steps)
    if n < 2:
        return False
    if n % 2 == 0:
        return steps[n // 2] / steps[n // 2 - 1] >= 1 + SPREAD
    m = steps[n // 2]
    return min(m / steps[n // 2 - 1], steps[n // 2 + 1] / m) >= 1 + SPREAD


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    k = (len(values) - 1) * q
    low, high = int(k), min(int(k) + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (k - low)


def run(bench: Bench) -> Section:
    s = Section("Predict: step time on models the time model was not fitted to")
    env = {**os.environ, "XDG_CACHE_HOME": str(bench.out / "predict" / "cache")}  # never the user's calibration
    table = calibrate(bench, env)
    steps = "training.max_steps=12" if bench.quick else "training.max_steps=24"
    rounds = bench.times(1)  # --repeats N: every configuration N times, in N rounds over all of them
    configs, skipped, got = list(_configs(bench, bench.slurm)), [], {}
    settled = []  # configurations run again because their rounds disagreed
    for r in range(rounds + (SETTLE_ROUNDS if rounds > 1 else 0)):
        for family, label, strategy, world, launch in configs:
            key = (family, label, world)
            if f"{family} {label}@{world}" in skipped:
                continue
            if r >= rounds:  # a settling round: only where the runs so far disagree
                if not unsettled([run.get("step_time_s") for run in got.get(key, [])]):
                    continue
                settled.append(f"{family} {label}@{world}")
            model, data, batch = _families(bench)[family]
            run = bench.submit(_folder(family, label, world, r), [
                f"model={model}", f"data={data}", f"training.batch_size={batch}", "training.epochs=100", steps,
                "training.eval_every_epochs=0", f"strategy={strategy}", *launch], recipe=BASE, env=env, check=False)
            if run.get("returncode") == 2:  # refused before launch (the model or world does not allow it)
                skipped.append(f"{family} {label}@{world}")
                continue
            got.setdefault(key, []).append(run)
    rows, errors, by_model, spread = [], [], {}, {}
    for (family, label, world), runs in got.items():
        predicted = median_of([(run.get("predicted") or {}).get("step_time_s") for run in runs])
        measured = median_of([run.get("step_time_s") for run in runs])
        error = predicted / measured - 1 if predicted and measured else None
        rows.append([family, label, world, predicted, measured, error,
                     "; ".join(sorted({e for run in runs if (e := (run.get("predicted") or {}).get("error"))}))])
        if error is not None:
            errors.append(abs(error))
            by_model.setdefault((family, world), []).append((predicted, measured))
            spread.setdefault((family, world), []).append(
                (label, predicted, [m for run in runs if (m := run.get("step_time_s"))]))
    taus = {key: kendall_tau([p for p, _ in v], [m for _, m in v]) for key, v in by_model.items() if len(v) > 1}
    s.lines += [f"Each run {steps.split('=')[1]} steps; predicted = the run's own `predicted.step_time_s` (calibration "
                "of the machine alone, no recipe; the model's one-rank step timed when predicting); measured = "
                "`step_time_s`, the median step. World 4 runs 4 ranks on 2 cores."
                + (f" Every configuration ran {rounds} times, in {rounds} rounds over all of them: both are the "
                   "medians of its runs." if rounds > 1 else ""), "", "```", table, "```", ""]
    s.table(["model", "strategy", "world", "predicted (s)", "measured (s)", "error", "prediction error"], rows)
    if skipped:
        s.lines += ["Refused before launch (the strategy's checks): " + ", ".join(skipped), ""]
    s.table(["model", "world", "strategies", "Kendall tau", "pairs swapped (~: measured ranges overlap)"],
            [[k[0], k[1], len(by_model[k]), t, " ".join(swapped_pairs(spread[k])) or "none"] for k, t in taus.items()])
    near, far = pairs_by_gap(by_model.values(), trust.DEFAULT_BAND)
    s.lines += [f"Pairs of strategies of one model and world predicted under {trust.DEFAULT_BAND:.0%} apart (the band "
                f"within which `suite.advise` marks two configurations as not settled, ≈): {sum(near)} of {len(near)} "
                f"ran in the other order; predicted farther apart: {sum(far)} of {len(far)}.", ""]
    if rounds > 1:
        s.lines += ["A pair marked ~ swapped within its runs' spread: its measured order is not settled by "
                    f"{rounds} runs. The target counts every swapped pair.", ""]
    if settled:
        s.lines += [f"Run again after the {rounds} rounds, where their median rested on runs {SPREAD:.0%} or more "
                    f"apart (`unsettled`; up to {SETTLE_ROUNDS} more runs; their median is of all their runs): "
                    + ", ".join(sorted(set(settled))), ""]
    if errors:
        med, p90 = percentile(errors, 0.5), percentile(errors, 0.9)
        s.check(f"median |error| <= {MEDIAN:.0%} ({len(errors)} runs)", f"{med:.0%}", med <= MEDIAN)
        s.check(f"90th percentile |error| <= {P90:.0%}", f"{p90:.0%}", p90 <= P90)
        worst = min(taus.values()) if taus else None
        s.check(f"per model and world, Kendall tau >= {TAU}", f"lowest {worst:.2f}" if worst is not None else "none",
                worst is not None and worst >= TAU)
    return s
