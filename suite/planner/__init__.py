"""Planning a run before it runs: memory, communication and time per rank for any world size.

- ``profile.StepProfile``: what one optimizer step of one strategy costs a rank (bytes held,
  peak bytes, bytes and calls of each collective kind, FLOPs), measured by running the real
  strategy code on fake tensors under a fake process group of the target world size.
- ``python -m suite.plan RECIPE``: the table of every strategy and world size.
- ``python -m suite.calibrate``: the compute rate and per-collective latency/bandwidth of the
  user's own nodes, from which a StepProfile becomes a predicted step time.
"""
