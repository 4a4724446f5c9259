"""python -m suite.verify RECIPE [key=value ...] [--strategies all|ddp,zero:stage=3,...] [--steps N] [--out DIR]

A parity certificate for any recipe, the user's own model included: the recipe's strategy (or
each of ``--strategies``, at the recipe's launch) and ``single`` for N steps on the same data, in
float64 where the strategy can train in it, each step's difference judged against the noise
floor (``suite.verify``). Prints the per-step table and one verdict line per strategy; exit 0
when every one is equivalent, 1 when one differs (or a run failed), 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys

from suite.common.errors import SuiteError, one_line
from suite.verify import certify_each


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m suite.verify", description=__doc__.split("\n\n")[1])
    p.add_argument("recipe", help="recipe YAML, e.g. recipes/quickstart.yaml")
    p.add_argument("overrides", nargs="*", help="key.path=value, e.g. strategy.name=fsdp launch.tasks_per_node=2")
    p.add_argument("--strategies", help="certify these instead of the recipe's strategy: all (every strategy that "
                   "claims parity and can run this recipe), or comma-separated name[:key=value...]")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps compared (default 20)")
    p.add_argument("--out", default="runs", help="folder for the strategies' run records (default: runs/)")
    args = p.parse_intermixed_args(argv)
    if args.steps < 2:
        p.error("--steps must be 2 or more")
    try:
        return one_line(_main, args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(args) -> int:

    recipes = _recipes(args)
    outcomes = certify_each(recipes, args.steps, args.out)
    certificates = [o for o in outcomes if not isinstance(o, SuiteError)]
    failed = [(r, o) for r, o in zip(recipes, outcomes) if isinstance(o, SuiteError)]
    if failed and not certificates:
        raise failed[0][1]  # nothing to judge: the error, as one line (exit 1 for a failed run, 2 for bad input)
    for cert in certificates:
        print("\n".join(cert.lines()), flush=True)
    if len(outcomes) > 1:  # one line per strategy, a failed one's first line too
        print("\n".join(o.verdict_line() if not isinstance(o, SuiteError) else
                        f"{r.strategy.name} at world size {r.world_size}: did not run ({str(o).splitlines()[0]})"
                        for r, o in zip(recipes, outcomes)))
    for recipe, error in failed:
        print(f"error: {recipe.strategy.name}: {error}", file=sys.stderr)
    return 0 if not failed and all(c.verdict == "equivalent" for c in certificates) else 1


def _recipes(args) -> list:
    """The recipes to certify: the recipe's points, or the recipe once per ``--strategies`` entry;
    with ``all``, a strategy that cannot run this recipe (or claims no parity) is named and skipped."""
    from suite import recipe as recipes
    from suite.recipe.text import raw_points

    if not args.strategies:
        return recipes.load(args.recipe, args.overrides)
    from suite.planner.table import strategy_specs

    points = raw_points(args.recipe, args.overrides)
    if len(points) != 1:
        raise SuiteError(f"{args.recipe} sweeps {len(points)} points; --strategies certifies one recipe: drop the "
                         f"sweep or fix its keys with key=value")
    raw, chosen = points[0], []
    for label, section in strategy_specs(args.strategies, raw.get("strategy") or {}):
        if args.strategies == "all" and section["name"] == "single":
            continue  # the baseline itself
        try:
            recipe = recipes.validate({**raw, "strategy": section})
            if args.strategies == "all" and recipe.strategy.no_parity:
                print(f"verify: skipped {label}: it makes no parity claim ({recipe.strategy.no_parity})",
                      file=sys.stderr, flush=True)
                continue
        except SuiteError as e:
            if args.strategies != "all":
                raise
            print(f"verify: skipped {label}: {e}", file=sys.stderr, flush=True)
            continue
        chosen.append(recipe)
    if not chosen:
        raise SuiteError(f"--strategies {args.strategies}: no strategy can run this recipe (see the lines above)")
    return chosen


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
