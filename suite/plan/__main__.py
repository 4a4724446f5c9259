"""``python -m suite.plan RECIPE [key=value ...] [--world 2,8,64,1024] [--strategies all|ddp,zero:stage=3,...] [--out DIR]``

Plans the recipe's model under every strategy (or those named) at every world size: each point
that the strategy admits runs as one fake step in a forked child (``suite.planner.fake_run``; the
analytic rule where the real code cannot run on fake tensors); the rest are listed with the
reason the strategy or the plan refuses them. Writes ``plan.md``, ``plan.csv``, ``plan.png`` and
``profiles.json`` (the StepProfiles) to ``--out`` and prints the Markdown.

A strategy is a name, optionally with its own keys: ``zero:stage=3``, ``tensor:tp=4``,
``fsdp:reshard_after_forward=false``. The recipe's own strategy keeps its keys. A data-parallel
degree left unset fills the rest of the world (``tensor:tp=4`` at world 64 is dp=16 x tp=4).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


from suite.common.errors import SuiteError
from suite.common.quiet import quiet_libraries
from suite.planner.table import plan, strategy_specs


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m suite.plan", description=__doc__.split("\n\n")[1])
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="key.path=value, as suite.submit takes them")
    p.add_argument("--world", default="2,8,64,1024", help="comma-separated world sizes")
    p.add_argument("--strategies", default="all", help="all, or comma-separated name[:key=value...]")
    p.add_argument("--out", default="runs/plan", help="folder for plan.md, plan.csv, plan.png, profiles.json")
    p.add_argument("--jobs", type=int, default=2, help="fake runs at once")
    p.add_argument("--timeout-s", type=float, default=300, help="per (strategy, world size)")
    p.add_argument("--try-fake", action="store_true",
                   help="also try the fake run for strategies known to need their analytic rule")
    p.add_argument("--verbose", action="store_true", help="show library warnings and what the fake runs print")
    return p.parse_intermixed_args(argv)


def _worlds(text: str) -> list[int]:
    try:
        worlds = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        worlds = []
    if not worlds or min(worlds) < 1:
        raise SuiteError(f"--world={text!r} must be comma-separated positive world sizes, e.g. 2,8,64,1024")
    return worlds


def main(argv=None) -> int:
    from suite.planner import report
    from suite.recipe.text import raw_points

    args = parse_args(argv)
    if not args.verbose:
        quiet_libraries()
    try:
        points_raw = raw_points(args.recipe, args.overrides)
        if len(points_raw) != 1:
            raise SuiteError(f"{args.recipe} sweeps {len(points_raw)} points; the planner plans one: "
                             f"drop the sweep or fix its keys with key=value")
        raw = points_raw[0]
        worlds = _worlds(args.world)
        specs = strategy_specs(args.strategies, raw.get("strategy") or {})
        points = plan(raw, specs, worlds, args.jobs, args.timeout_s, args.try_fake,
                      progress=lambda line: print(line, file=sys.stderr, flush=True), quiet=not args.verbose)
        text = report.write(points, raw, Path(args.out))
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0 if any(p.profile for p in points) else 1


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
