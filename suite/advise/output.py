"""The advisor's output: the ranked table (printed, ``advice.md``, ``advice.csv``) with the
overrides to run each configuration, what it says plainly about a model that fits one device,
and the configurations left out: one line per reason with a count where printed, every one with
its reason in ``advice.md`` (and printed with ``--verbose``)."""
from __future__ import annotations

import csv
import re
from pathlib import Path

from suite.advise import trust
from suite.planner import hardware, search


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
                    "reserved_gib": "" if c.profile.reserved_bytes is None else f"{c.profile.reserved_bytes / 2**30:.3g}",
                    "source": c.profile.source, "overrides": " ".join(c.overrides),
                    "launch": f"launch.nodes={c.recipe.launch.nodes} launch.tasks_per_node={c.recipe.launch.tasks_per_node}",
                    "not_settled_with": "" if j is None else str(j + 1)})
    return out


def write(candidates, raw: dict, profile: dict, args, per_node: int, memory_what: str, out: Path, single=None) -> str:
    out.mkdir(parents=True, exist_ok=True)
    within, source = trust.band(Path(args.runs), profile)
    table = rows(candidates, within)
    with open(out / "advice.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["configuration"])
        writer.writeheader()
        writer.writerows(table)
    shown = lambda every: markdown(candidates, table, raw, profile, args, per_node, memory_what, within,  # noqa: E731
                                   source, single, every)
    (out / "advice.md").write_text(shown(True))  # the record keeps every configuration left out
    return shown(args.verbose)


def markdown(candidates, table, raw, profile, args, per_node, memory_what, within: float, band_source: str,
             single=None, every_left_out: bool = False) -> str:
    world = args.nodes * per_node
    batch = "the recipe's per-rank batch kept (weak scaling)" if args.weak_scaling else \
        f"global batch {(raw.get('training') or {}).get('batch_size', '?')}"
    lines = [f"# Advice: {raw.get('name', '')} (model {(raw.get('model') or {}).get('name', '?')}) on "
             f"{args.nodes} node(s) x {per_node} = {world} ranks, {batch}", "",
             f"Hardware: {hardware.describe(profile)}.", f"Memory per rank: {memory_what}.", ""]
    lines += fewer_devices(single, raw, world, per_node, args.weak_scaling)
    if profile.get("from_specs"):
        lines += ["**Figures from published specs, not measured**: calibrate the cluster "
                  "(python -m suite.calibrate under Slurm) before trusting the order.", ""]
    if table:
        lines += [f"## Best {min(args.top, len(table))} of {len(table)} that fit, by predicted samples/s", "",
                  "| # | configuration | step ms | samples/s | not settled against | compute ms | exposed comm ms | bubble "
                  "| peak GiB/rank | reserved GiB/rank | profile | run it with |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, r in enumerate(table[:args.top], 1):
            against = f"≈ #{r['not_settled_with']}" if r["not_settled_with"] else ""
            lines.append(f"| {i} | {r['configuration']} | {r['step_ms']} | {r['samples_per_s']} | {against} | {r['compute_ms']} | "
                         f"{r['exposed_comm_ms']} | {r['bubble']} | {r['peak_gib']} | {r['reserved_gib'] or '-'} | {r['source']} | "
                         f"`{r['overrides']} {r['launch']}` |")
        lines += ["", f"≈ #k: predicted within {within:.0%} of #k's throughput, closer than the time model can order two "
                  f"configurations. That band: {band_source}. On the suite's benchmark a third of the pairs predicted "
                  "under 10 % apart ran the other way round. --verify K runs the best K and measures them."]
    else:
        lines += ["Nothing fits or runs here: see the reasons below (--weak-scaling keeps the per-rank batch; "
                  "more nodes or a larger device give each rank less to hold).", ""]
    left_out = [c for c in candidates if c.excluded]
    if left_out:
        lines += ["", f"## Left out ({len(left_out)})", ""] + left_out_lines(left_out, every_left_out)
    analytic = [r for r in table[:args.top] if r["source"] == "analytic"]
    if analytic:
        lines += ["", "profile analytic: the strategy's rule, not a fake run of its real code (the strategy "
                  "declares why it cannot run on fake tensors, or its fake run failed)."]
    return "\n".join(lines) + "\n"


def left_out_lines(left_out, verbose: bool) -> list[str]:
    """One line per reason, with how many configurations it leaves out and the first few of them;
    reasons that differ only in their figures (a degree, a batch, GiB) are one reason, worded with
    the first configuration's figures. ``verbose``: every configuration, those refused for the
    very same words sharing a line."""
    exact: dict[str, list[str]] = {}
    for c in left_out:
        exact.setdefault(" ".join(c.excluded.split()), []).append(c.name)
    if verbose:
        return [f"- {', '.join(names)}: {reason}" for reason, names in exact.items()]
    kinds: dict[str, list[tuple[str, str]]] = {}
    for reason, names in exact.items():
        kinds.setdefault(re.sub(r"\d+(?:\.\d+)?", "#", reason), []).extend((name, reason) for name in names)
    lines = []
    for members in kinds.values():
        names = [name for name, _ in members]
        first_name, first_reason = members[0]
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        figures = f" (figures: {first_name}'s)" if len({r for _, r in members}) > 1 else ""
        count = f"{len(names)} configurations" if len(names) > 1 else "1 configuration"
        lines.append(f"- {count} ({shown}): {first_reason}{figures}")
    if len(lines) < len(left_out):
        lines += ["", "--verbose (and advice.md) lists every configuration left out."]
    return lines


def fewer_devices(single, raw: dict, world: int, per_node: int, weak_scaling: bool) -> list[str]:
    """Said plainly where the model fits one device (``single``: the search's candidate for
    ``single`` on one rank, or None): it needs no model parallelism; and, whether it fits or not,
    where the global batch cannot give every rank a sample: how many ranks it feeds and
    ``--weak-scaling``."""
    batch = int((raw.get("training") or {}).get("batch_size", 1))
    lines = []
    if single is not None:
        how = (f" with {search.checkpointing_words(single.checkpointing)}" if single.checkpointing else "") + (
            f" in {single.accumulation} accumulation steps" if single.accumulation > 1 else "")
        lines += [f"**The model fits one device**: on one rank at the global batch of {batch}{how} it peaks at "
                  f"{single.profile.peak_bytes / 2**30:.3g} GiB. It needs no model parallelism (tensor, pipeline): "
                  f"data parallelism is what to run on more devices, for a larger batch or a shorter epoch.", ""]
    ranks = fed_ranks(batch, world, per_node)
    if weak_scaling or ranks == world:
        return lines
    fed = f"**The global batch of {batch} feeds at most {ranks} data-parallel ranks of the {world} offered** (a sample or more each)"
    grow = "keep each rank's batch and let the global batch grow with the ranks: --weak-scaling"
    if single is not None:
        nodes, per = (ranks // per_node, per_node) if ranks >= per_node else (1, ranks)
        lines += [f"{fed}: run data parallel on {ranks} (--nodes {nodes} --per-node {per}), or {grow}.", ""]
    else:
        lines += [f"{fed}: layouts with more data-parallel ranks are left out; to use them all, {grow}.", ""]
    return lines


def fed_ranks(batch: int, world: int, per_node: int) -> int:
    """The most ranks, up to ``world``, that the global batch splits over evenly, filling whole
    nodes (or part of one)."""
    return max(r for r in range(1, world + 1)
               if batch % r == 0 and world % r == 0 and (r % per_node == 0 or per_node % r == 0))
