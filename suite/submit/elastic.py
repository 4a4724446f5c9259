"""Elastic shrink (``launch.elastic``): a run that lost a node continues on fewer nodes with the
same global batch, so its losses stay those of the run as started.

On ``n`` of its ``N`` nodes (``n`` the most nodes left that divide ``N``), every data-parallel
rank left reads ``N / n`` times the samples it read per step, in ``N / n`` times as many
accumulation steps of the same size: the global batch, the samples in it and the mean gradient
over them are unchanged, and so are the per-step losses (up to the summation order: float64
runs match to rounding). The ranks load the last checkpoint at the new world size, which needs
a strategy-neutral one (``launch.elastic`` is refused for strategies without: suite.recipe).
"""
from __future__ import annotations

import yaml

from suite import recipe as recipes
from suite.common.errors import SuiteError


def shrunk(recipe, nodes_left: int):
    """(the recipe on fewer nodes, the line saying so); SuiteError where it cannot shrink."""
    launch, training = recipe.launch, recipe.training
    nodes = max((n for n in range(1, min(nodes_left, launch.nodes - 1) + 1) if launch.nodes % n == 0), default=0)
    if not nodes:
        raise SuiteError("no usable node is left")
    factor = launch.nodes // nodes
    raw = yaml.safe_load(recipes.dump(recipe))
    raw["launch"] = {**raw["launch"], "nodes": nodes}
    raw["training"] = {**raw["training"], "grad_accumulation": training.grad_accumulation * factor}
    smaller = recipes.validate(raw)  # SuiteError: the strategy's degrees or the batch do not fit there
    if smaller.training.batch_size != training.batch_size or smaller.layout().dp_size * factor != recipe.layout().dp_size:
        raise SuiteError(f"on {nodes} node(s) strategy {recipe.strategy.name} does not keep its layout with "
                         f"{factor}x fewer data-parallel ranks")
    return smaller, (f"continuing on {nodes} of {launch.nodes} node(s) (launch.elastic) with "
                     f"training.grad_accumulation={smaller.training.grad_accumulation}: the same global batch "
                     f"of {training.batch_size}")
