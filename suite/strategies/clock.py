"""Where a data-parallel step's time goes on one rank: its own compute, and the time after its
backward spent in collectives (waiting for slower peers, then the transfer itself).

The moment this rank's own backward is done is the last moment a parameter's gradient is
computed: a tensor hook on every parameter notes it (the hook returns None, so the gradient is
unchanged). That works alike for the hand-written all-reduce, which reduces after backward, and
for DDP, whose bucket all-reduces start during backward and whose backward returns only once
they are done: the time from the last gradient to the end of the reduction is time in
collectives, the rest of the step (forward, backward, optimizer step) is compute. A rank that
is slower than its peers shows more compute and less collective time; its peers wait for it.

Measured on CPU only: on CUDA the host returns before the kernels run, so host time does not
split a step (the engine then records neither)."""
from __future__ import annotations

import time


class StepClock:
    """Notes when this rank's last gradient of a step was computed; splits the step's time."""

    def __init__(self, parameters):
        self.last_grad_at = 0.0
        self.handles = [p.register_hook(self._grad_ready) for p in parameters if p.requires_grad]

    def _grad_ready(self, grad) -> None:
        self.last_grad_at = time.perf_counter()

    def split(self, started: float, reduced: float, ended: float) -> tuple[float, float]:
        """(compute_s, collective_s) of a step that started, had its gradients reduced and ended
        at these ``time.perf_counter()`` readings."""
        backward_done = min(max(self.last_grad_at, started), reduced)
        return (backward_done - started) + (ended - reduced), reduced - backward_done
