"""``torchrun --nproc_per_node N -m suite.train RECIPE [key=value ...] [--out DIR] [--run-dir DIR]``:
the same per-rank code that submitit tasks run, started by torchrun (on one node, or on several:
``torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:PORT``, whose
nodes and ranks per node the run records as ``launch.nodes`` and ``tasks_per_node``, with
``launch.executor: torchrun``), by ``mpirun -np N python -m suite.train ...`` (the rendezvous is
then agreed through mpi4py) or as one plain process."""
from __future__ import annotations

import argparse
import os
import sys

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.train.dist import adopt_mpi_environment
from suite.tasks.train import train


def launcher_layout(executor: str) -> dict | None:
    """The launch keys the launcher decided, from its environment: torchrun's agents (one per
    node) set WORLD_SIZE, LOCAL_WORLD_SIZE (ranks of this node) and GROUP_WORLD_SIZE (agents,
    i.e. nodes); mpirun's (``adopt_mpi_environment``) the first two. None without a launcher."""
    if "WORLD_SIZE" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", world // per_node))
    if nodes * per_node != world:
        raise SuiteError(f"suite.train needs the same ranks on every node, but the launcher gives {world} ranks "
                         f"over {nodes} nodes with {per_node} on this one; give every node the same --nproc-per-node")
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's agents started the ranks
        executor = "torchrun"
    return {"executor": executor, "nodes": nodes, "tasks_per_node": per_node}


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
        recipe = points[0]
        launch = launcher_layout(recipe.launch.executor)
        if launch is not None:  # torchrun (or mpirun) decided the world: take it, then re-check
            recipe = recipes.validate({**recipe.model_dump(mode="json"),
                                       "launch": {**recipe.launch.model_dump(mode="json"), **launch}})
        run_dir = train(recipe, args.run_dir, args.out)
    except SuiteError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"run record: {run_dir}")
    return 0
