"""``python -m analysis.report RUNS --out DIR --wandb-report``: the report's sections as a W&B
Report, beside the HTML one.

The Report holds the HTML report's sections in its order (throughput and memory, scaling,
verdicts, time to target, cost, utilisation, published vs ours for a study, ...) as Markdown
tables, under panels that W&B draws from the jobs' W&B runs (one per job, grouped by study or
sweep: ``suite.record.wandb_rows``): loss per step, validation accuracy per epoch, throughput,
peak memory, MFU, CPU and GPU utilisation. It needs the reports library (``pip install
scalesuite[reports]``: wandb-workspaces) and W&B online with a key; otherwise it says what it
would publish, and the HTML report is written as always.
"""
from __future__ import annotations

import os

from suite.record import wandb_export, wandb_rows

# (panel title, kind, metric): what W&B draws from the jobs' runs, over the sections' tables.
PANELS = (("loss per step", "line", "step/global_loss"), ("validation accuracy per epoch", "line", "epoch/val_accuracy"),
          ("throughput (samples/s)", "bar", "samples_per_s"), ("scaling: samples/s by world size", "bar", "samples_per_s"),
          ("peak memory, rank 0 (bytes)", "bar", "rank0/peak_memory_bytes"), ("MFU", "bar", "mfu"),
          ("CPU % (W&B system monitor)", "line", "system/cpu"), ("GPU utilisation %", "line", "system/gpu.0.gpu"))


def target(runs) -> dict:
    """Where the Report goes: the runs' W&B project and entity, their groups, and the mode."""
    recipes = [r.recipe for r in runs] or [{}]
    tracking = recipes[0].get("tracking") or {}
    return {"project": tracking.get("project", "scalesuite"), "entity": tracking.get("entity") or "",
            "groups": sorted({wandb_rows.names(r.recipe, r.run_id)["group"] for r in runs}),
            "mode": wandb_export.resolve_mode(tracking.get("wandb", "offline"))}


def sections(markdown_parts: list[str]) -> list[tuple[str, str]]:
    """(title, body) of each ``## title`` part of the report's Markdown; local images left out
    (the Report's panels draw the curves from the W&B runs)."""
    out = []
    for part in markdown_parts:
        if not part.startswith("## "):
            continue
        title, _, body = part[3:].partition("\n")
        lines = [line for line in body.strip().splitlines() if not line.startswith("![")]
        out.append((title.strip(), "\n".join(lines).strip()))
    return out


def build(title: str, where: dict, parts: list[tuple[str, str]]):
    """The W&B Report (not saved): a panel grid over the groups' runs, then every section."""
    import wandb_workspaces.reports.v2 as wr  # optional: wandb-workspaces, the reports extra

    groups = ", ".join(f"'{g}'" for g in where["groups"])
    runset = wr.Runset(entity=where["entity"], project=where["project"], name="these runs",
                       filters=f"Metric('Group') in [{groups}]", groupby=["Group"])
    panels = []
    for name, kind, metric in PANELS:
        if kind == "line":
            panels.append(wr.LinePlot(title=name, x="Step", y=[metric]))
        elif name.startswith("scaling"):
            panels.append(wr.BarPlot(title=name, metrics=[wr.SummaryMetric(metric)], groupby=wr.Config("world_size")))
        else:
            panels.append(wr.BarPlot(title=name, metrics=[wr.SummaryMetric(metric)]))
    blocks = [wr.P(f"The runs of W&B group(s) {groups or '(none)'}; the tables are python -m analysis.report's."),
              wr.PanelGrid(runsets=[runset], panels=panels)]
    for heading, body in parts:
        blocks += [wr.H2(heading), wr.MarkdownBlock(body or "(empty)")]
    return wr.Report(project=where["project"], entity=where["entity"], title=title, blocks=blocks)


def publish(title: str, runs, markdown_parts: list[str]) -> str:
    """Save the Report where W&B is online with a key; else say what would be published."""
    where, parts = target(runs), sections(markdown_parts)
    plan = (f"'{title}' to {where['entity'] or '(default entity)'}/{where['project']}: {len(PANELS)} panels over "
            f"group(s) {', '.join(where['groups']) or '(none)'}, sections: {'; '.join(h for h, _ in parts)}")
    why = _not_online(where["mode"])
    if why:
        return f"W&B report not published ({why}); it would publish {plan}"
    report = build(title, where, parts)
    report.save()
    return f"W&B report published: {report.url}"


def _not_online(mode: str) -> str | None:
    if mode != "online":
        return f"W&B mode is {mode}; tracking.wandb=online or WANDB_MODE=online publishes"
    try:
        import wandb_workspaces  # noqa: F401  # optional: the reports extra
    except ImportError:
        return "the reports library is not installed: pip install scalesuite[reports]"
    if not (os.environ.get("WANDB_API_KEY") or _netrc_key()):
        return "no W&B API key is configured (wandb login, or WANDB_API_KEY)"
    return None


def _netrc_key() -> bool:
    import netrc  # late: only where a report is to be published

    try:
        return bool(netrc.netrc().authenticators("api.wandb.ai"))
    except (OSError, netrc.NetrcParseError):
        return False
