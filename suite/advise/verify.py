"""``--verify K``: run the advisor's best K configurations for a few steps, as a user would run
them (``python -m suite.submit``, through ``suite.verify.runs.run_recipe``), and set the measured
median step time beside the prediction the advice was ranked by, so a user sees how far to trust
the order."""
from __future__ import annotations

import json
from pathlib import Path

import yaml


def _short(candidate, steps: int) -> dict:
    from suite import recipe as recipes

    raw = yaml.safe_load(recipes.dump(candidate.recipe))
    tr = raw["training"]
    tr.update(max_steps=steps, epochs=max(tr.get("epochs", 1), steps), eval_every_epochs=0, checkpoint_every_steps=0,
              keep_final_weights=False)
    raw["name"] = f"{raw['name']}-advise"
    raw.pop("arm", None)
    return raw


def run(candidates, raw: dict, steps: int, out: Path, progress=print) -> str:
    """Each candidate run for ``steps`` steps; the table of predicted against measured. Candidates
    that differ only in their strategy run as one sweep (``run_grouped``): one ``suite.submit``,
    whose points train one after another in the same warm ranks where their strategies allow,
    as a user's sweep would; the others one submit each."""
    from suite.common.errors import SuiteError
    from suite.verify.runs import run_grouped

    lines = [f"## Verified: the best {len(candidates)} run for {steps} steps", "",
             "| # | configuration | predicted step ms | measured step ms | measured / predicted | run |",
             "|---|---|---|---|---|---|"]
    progress(f"verify: the best {len(candidates)}, {steps} steps each: " + ", ".join(c.name for c in candidates))
    outcomes = run_grouped([f"advise-{i}" for i in range(1, len(candidates) + 1)],
                           [_short(c, steps) for c in candidates], "strategy", out / "verify", progress)
    rates = {}  # measured samples/s of each verified rank (the advice's order is by predicted samples/s)
    for i, (c, folder) in enumerate(zip(candidates, outcomes), 1):
        if isinstance(folder, SuiteError):  # RunFailed too: the point's own error line
            lines.append(f"| {i} | {c.name} | {c.step_s * 1e3:.3g} | failed | | {' '.join(str(folder).split())[:120]} |")
            continue
        summary = json.loads((Path(folder) / "summary.json").read_text())
        measured = summary.get("step_time_s")
        ratio = f"{measured / c.step_s:.2f}" if measured and c.step_s else ""
        lines.append(f"| {i} | {c.name} | {c.step_s * 1e3:.3g} | {measured * 1e3:.3g} | {ratio} | {folder} |")
        if measured and summary.get("global_batch"):
            rates[i] = summary["global_batch"] / measured
    if len(rates) > 1:
        order = sorted(rates, key=rates.get, reverse=True)
        lines += ["", "Measured, fastest first: " + ", ".join(f"#{i}" for i in order)
                  + (" (the advice's order)" if order == sorted(order) else
                     " (the advice's order differs: see ≈ in the table above for the pairs it could not settle)")]
    text = "\n".join(lines) + "\n"
    with open(out / "advice.md", "a") as f:
        f.write("\n" + text)
    return text
