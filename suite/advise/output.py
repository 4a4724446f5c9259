"""The advisor's output: the ranked table (printed, ``advice.md``, ``advice.csv``) with the
overrides to run each configuration, and every configuration left out with its reason."""
from __future__ import annotations

import csv
from pathlib import Path

from suite.advise import trust
from suite.planner import hardware


def memory_per_rank(profile: dict, raw: dict, per_node: int) -> tuple[int, str]:
    """What one rank may use: a preset's device memory, else this host's (``suite.planner.report``)."""
    if profile.get("memory_bytes"):
        return profile["memory_bytes"], f"{profile['device']} memory (from specs)"
    from suite.planner import report

    return report.rank_memory_bytes({**raw, "launch": {**(raw.get("launch") or {}), "tasks_per_node": per_node}})


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def rows(candidates, within: float) -> list[dict]:
    """The ranked configurations; ``not_settled_with``: the best-ranked configuration whose
    predicted throughput this one comes within ``within`` of (``suite.advise.trust``)."""
    fitting = [c for c in candidates if not c.excluded]
    marks = trust.not_settled([c.time.get("samples_per_s") or 0 for c in fitting], within)
    out = []
    for c, j in zip(fitting, marks):
        t = c.time
        out.append({"configuration": c.name, "step_ms": _ms(t["step_s"]),
                    "samples_per_s": f"{t['samples_per_s']:.4g}" if t.get("samples_per_s") else "",
                    "compute_ms": _ms(t["compute_s"]), "exposed_comm_ms": _ms(t["exposed_comm_s"]),
                    "bubble": f"{t['bubble']:.2f}", "peak_gib": f"{c.profile.peak_bytes / 2**30:.3g}",
                    "source": c.profile.source, "overrides": " ".join(c.overrides),
                    "launch": f"launch.nodes={c.recipe.launch.nodes} launch.tasks_per_node={c.recipe.launch.tasks_per_node}",
                    "not_settled_with": "" if j is None else str(j + 1)})
    return out


def write(candidates, raw: dict, profile: dict, args, per_node: int, memory_what: str, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    within, source = trust.band(Path(args.runs), profile)
    table = rows(candidates, within)
    with open(out / "advice.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["configuration"])
        writer.writeheader()
        writer.writerows(table)
    text = markdown(candidates, table, raw, profile, args, per_node, memory_what, within, source)
    (out / "advice.md").write_text(text)
    return text


def markdown(candidates, table, raw, profile, args, per_node, memory_what, within: float, band_source: str) -> str:
    world = args.nodes * per_node
    batch = "the recipe's per-rank batch kept (weak scaling)" if args.weak_scaling else \
        f"global batch {(raw.get('training') or {}).get('batch_size', '?')}"
    lines = [f"# Advice: {raw.get('name', '')} (model {(raw.get('model') or {}).get('name', '?')}) on "
             f"{args.nodes} node(s) x {per_node} = {world} ranks, {batch}", "",
             f"Hardware: {hardware.describe(profile)}.", f"Memory per rank: {memory_what}.", ""]
    if profile.get("from_specs"):
        lines += ["**Figures from published specs, not measured**: calibrate the cluster "
                  "(python -m suite.calibrate under Slurm) before trusting the order.", ""]
    if table:
        lines += [f"## Best {min(args.top, len(table))} of {len(table)} that fit, by predicted samples/s", "",
                  "| # | configuration | step ms | samples/s | not settled against | compute ms | exposed comm ms | bubble "
                  "| peak GiB/rank | profile | run it with |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, r in enumerate(table[:args.top], 1):
            against = f"≈ #{r['not_settled_with']}" if r["not_settled_with"] else ""
            lines.append(f"| {i} | {r['configuration']} | {r['step_ms']} | {r['samples_per_s']} | {against} | {r['compute_ms']} | "
                         f"{r['exposed_comm_ms']} | {r['bubble']} | {r['peak_gib']} | {r['source']} | "
                         f"`{r['overrides']} {r['launch']}` |")
        lines += ["", f"≈ #k: predicted within {within:.0%} of #k's throughput, closer than the time model can order two "
                  f"configurations. That band: {band_source}. On the suite's benchmark a third of the pairs predicted "
                  "under 10 % apart ran the other way round. --verify K runs the best K and measures them."]
    else:
        lines += ["Nothing fits or runs here: see the reasons below (--weak-scaling keeps the per-rank batch; "
                  "more nodes or a larger device give each rank less to hold).", ""]
    left_out = [c for c in candidates if c.excluded]
    if left_out:
        lines += ["", f"## Left out ({len(left_out)})", ""]
        by_reason: dict[str, list[str]] = {}  # variants refused for the same reason share one line
        for c in left_out:
            by_reason.setdefault(" ".join(c.excluded.split()), []).append(c.name)
        lines += [f"- {', '.join(names)}: {reason}" for reason, names in by_reason.items()]
    analytic = [r for r in table[:args.top] if r["source"] == "analytic"]
    if analytic:
        lines += ["", "profile analytic: the strategy's rule, not a fake run of its real code (the strategy "
                  "declares why it cannot run on fake tensors, or its fake run failed)."]
    return "\n".join(lines) + "\n"
