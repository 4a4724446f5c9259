"""How many threads one rank computes with: the one rule the ranks follow (``suite.train.dist``)
and the planner predicts with (``suite.planner.timing``, ``model_time``, the calibration's model
rates), so that a prediction times the model at the threads the run will have."""
from __future__ import annotations

from typing import Optional


def rank_threads(cores: int, local_ranks: int, cpus_per_task: Optional[int] = None) -> int:
    """``launch.cpus_per_task`` where the recipe sets it, else an equal share of the node's
    ``cores`` among its ``local_ranks`` (at least one)."""
    return cpus_per_task or max(1, cores // max(1, local_ranks))
