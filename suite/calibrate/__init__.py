"""Measuring a cluster for the planner: ``python -m suite.calibrate`` (``__main__``), the
measurements themselves (``measure``)."""
