"""``torchrun --nproc_per_node N -m suite.train RECIPE [key=value ...] [--out DIR] [--run-dir DIR]``:
the same per-rank code that submitit tasks run, started by torchrun, by ``mpirun -np N python -m
suite.train ...`` (the rendezvous is then agreed through mpi4py) or as one plain process."""
from __future__ import annotations

import argparse
import os
import sys

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.train.dist import adopt_mpi_environment
from suite.tasks.train import train


def main(argv=None) -> int:
    """``torchrun ... -m suite.train RECIPE [key=value ...] [--out DIR] [--run-dir DIR]``"""
    parser = argparse.ArgumentParser(prog="python -m suite.train", description=main.__doc__)
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--out", default="runs")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_intermixed_args(argv)
    try:
        # Started by mpirun: MPI's variables name the rank and world, and the ranks are MPI's.
        by_mpi = ["launch.executor=mpi"] if adopt_mpi_environment() else []
        points = recipes.load(args.recipe, args.overrides + by_mpi)
        if len(points) != 1:
            raise SuiteError("suite.train runs one recipe; a sweep is run by python -m suite.submit")
        world = int(os.environ.get("WORLD_SIZE", 1))
        recipe = points[0]
        if world != recipe.world_size:  # torchrun decides the world: take it, then re-check
            recipe = recipes.validate({**recipe.model_dump(mode="json"),
                                       "launch": {**recipe.launch.model_dump(mode="json"),
                                                  "nodes": 1, "tasks_per_node": world}})
        run_dir = train(recipe, args.run_dir, args.out)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"run record: {run_dir}")
    return 0
