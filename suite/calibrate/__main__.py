"""``python -m suite.calibrate [RECIPE [key=value ...]] [--world-size N[,N...]] [--max-bytes B] [--out FILE]``:
measure this cluster's compute rate and collective costs once (``suite.calibrate.measure``), so that
the planner can turn a step's profile into seconds; saved where the planner finds it
(``suite.planner.calibration``)."""
from __future__ import annotations


from suite.calibrate.measure import MAX_BYTES, MIN_BYTES, busy_warning, calibrate, speed_warning, table
from suite.planner.calibration import save
import argparse
import sys
from suite.common.errors import SuiteError, one_line


def main(argv=None) -> int:


    p = argparse.ArgumentParser(prog="python -m suite.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("recipe", nargs="?", help="a recipe: its launch settings and its model's achieved rate")
    p.add_argument("overrides", nargs="*", help="key.path=value")
    p.add_argument("--world-size", default=None, help="ranks to time collectives at, or several: 2,4 (default: "
                   "the recipe's world size, at least 2; 2 without a recipe)")
    p.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="largest message (default 64 MiB)")
    p.add_argument("--out", help="also write the calibration JSON here")
    args = p.parse_intermixed_args(argv)

    def _run(args) -> int:
        recipe = None
        if args.recipe:
            from suite import recipe as recipes

            recipe = recipes.load(args.recipe, args.overrides)[0]
        try:
            worlds = [int(w) for w in args.world_size.split(",")] if args.world_size else [max(2, recipe.world_size if recipe else 2)]
        except ValueError:
            raise SuiteError(f"--world-size {args.world_size}: give a number of ranks, or several: 2,4") from None
        if min(worlds) < 2:
            raise SuiteError(f"--world-size {args.world_size}: collectives need at least 2 ranks; use --world-size 2")
        if args.max_bytes < MIN_BYTES:
            raise SuiteError(f"--max-bytes {args.max_bytes}: below the smallest message ({MIN_BYTES}); "
                             f"use --max-bytes {MIN_BYTES} or more")
        c = calibrate(worlds, args.max_bytes, recipe)
        paths = save(c, args.out)
        print(table(c))
        print(f"took {c['took_s']:.1f} s; saved {', '.join(map(str, paths))}")
        for warning in (busy_warning(c), speed_warning(c)):
            if warning:
                print(warning, file=sys.stderr)
        return 0

    return one_line(_run, args)


if __name__ == "__main__":
    from suite.common.exit import run_command

    run_command(main)
