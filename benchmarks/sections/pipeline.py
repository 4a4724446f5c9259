"""Pipeline bubble: GPipe and 1F1B at K = 2 stages and M = 1, 2, 4, 8 micro-batches on balanced
blocks (an MLP of four 1024-wide blocks): each stage's measured idle fraction (summary
ranks[].strategy_metrics.bubble_fraction: 1 - time in its forward/backward / wall time of the
schedule) next to (K-1)/(M+K-1), step time against M, and the parts that explain the excess
(``benchmarks/pipeline_parts.py``)."""
from __future__ import annotations

import json

from common import HERE, Bench, Section, median

K, WIDTH, BATCH = 2, 1024, 128
RUNS = [("gpipe", 1), ("gpipe", 2), ("gpipe", 4), ("gpipe", 8), ("1f1b", 2), ("1f1b", 4), ("1f1b", 8)]


def formula(m: int) -> float:
    return (K - 1) / (m + K - 1)


def run(bench: Bench) -> Section:
    s = Section("Pipeline bubble: GPipe and 1F1B, 2 stages")
    shape = [f"model={{name: mlp, hidden: [{WIDTH}, {WIDTH}, {WIDTH}, {WIDTH}]}}", "data.shape=[1, 32, 32]",
             f"training.batch_size={BATCH}", "training.epochs=1", f"training.max_steps={6 if bench.quick else 24}",
             "launch.tasks_per_node=2", "launch.cpus_per_task=1", "tracking.wandb=disabled"]
    results = {}
    for schedule, m in RUNS:
        per_rep = [bench.submit(f"pipeline/{schedule}-m{m}-{rep}", [
            *shape, f"strategy={{name: pipeline, schedule: {schedule}, stages: {K}, micro_batches: {m}}}"])
            for rep in range(bench.times())]
        results[schedule, m] = {
            "bubble": [median(r["ranks"][k]["strategy_metrics"]["bubble_fraction"] for r in per_rep) for k in range(K)],
            "busy_s": [median(r["ranks"][k]["strategy_metrics"]["stage_busy_s"] for r in per_rep) for k in range(K)],
            "step_s": median(r["step_time_s"] for r in per_rep)}
    parts_json = bench.out / "pipeline" / "parts.json"
    bench.torchrun(HERE / "pipeline_parts.py", 2, [parts_json, BATCH, WIDTH, 1, 2, 4, 8])
    parts = json.loads(parts_json.read_text())
    stage_s = {int(b): v for b, v in parts["stage_s"].items()}
    send_s = {int(b): v for b, v in parts["send_s"].items()}

    s.lines += [f"MLP of four {WIDTH}-wide blocks cut into {K} balanced stages (two blocks each), global batch "
                f"{BATCH}, one thread per rank; idle fraction per stage = 1 - (time in its forward/backward) / "
                f"(wall time of the schedule), median over steps (the first left out) and {bench.times()} "
                f"repetition(s). 1F1B needs M >= K, so it has no M = 1 row.", ""]
    rows = []
    for (schedule, m), r in results.items():
        excess = sum(r["bubble"]) / K - formula(m)
        comm_share = 2 * m * send_s[BATCH // m] / r["step_s"]
        rows.append([schedule, m, formula(m), *r["bubble"], excess, comm_share, 1000 * r["step_s"]])
    s.table(["schedule", "M", "(K-1)/(M+K-1)", "stage 0 idle", "stage 1 idle", "excess (mean - formula)",
             "send/recv share (2M sends / step)", "step (ms)"], rows)

    s.lines += ["What a micro-batch costs, measured apart (`benchmarks/pipeline_parts.py`, both ranks at once):", ""]
    t_full = stage_s[BATCH]
    s.table(["micro-batch (samples)", "M", "stage forward+backward (ms)", "M x t(B/M) / t(B)", "one send (ms)"],
            [[BATCH // m, m, 1000 * stage_s[BATCH // m], m * stage_s[BATCH // m] / t_full, 1000 * send_s[BATCH // m]]
             for m in (1, 2, 4, 8)])
    g8, g1 = results["gpipe", 8], results["gpipe", 1]
    s.lines += [
        "Why the measured idle time exceeds the formula: (K-1)/(M+K-1) assumes equal stage times and free "
        "communication. Each stage sends or receives one activation per micro-batch forward and one gradient per "
        f"micro-batch backward: 2M transfers a step, each of which the stage spends waiting rather than computing "
        f"(at M = 8: {1000 * send_s[BATCH // 8]:.2f} ms each, about {2 * 8 * send_s[BATCH // 8] / g8['step_s']:.0%} "
        f"of a GPipe step). The second stage also holds the loss and the last (small) layer, so the stages are "
        f"not exactly equal, and the schedule's own Python work between chunks counts as idle too.",
        f"Smaller micro-batches make smaller GEMMs: a stage's forward+backward at B/8 costs "
        f"{8 * stage_s[BATCH // 8] / t_full:.2f}x the full-batch time when done 8 times, so the busy time per step "
        f"grows with M ({1000 * median(g1['busy_s']):.1f} ms at M = 1, {1000 * median(g8['busy_s']):.1f} ms at M = 8, "
        f"median of stages). That lengthens the step rather than the idle fraction, and is why step time does not "
        f"fall as fast as the formula's bubble does: GPipe step {1000 * g1['step_s']:.1f} ms at M = 1, "
        f"{1000 * g8['step_s']:.1f} ms at M = 8.", ""]
    return s
