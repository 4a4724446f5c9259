"""``python -m suite.advise RECIPE --nodes N --per-node G``: the best configurations of a recipe's
model for a cluster (``__main__``): searched and timed by ``suite.planner.search``, printed by
``output``, and optionally run for a few steps to show predicted against measured (``verify``)."""
