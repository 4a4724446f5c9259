"""``python -m suite.plan RECIPE``: the planning tool's command line (``__main__``): predicted memory
and step time per rank for every strategy and world size, from ``suite.planner``. (The parallel
layout a run's ranks take is ``suite.strategies.layout.Layout``; "plan" names the tool only.)"""
