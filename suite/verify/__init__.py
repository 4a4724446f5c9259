"""Parity certificates: does a recipe's strategy compute what one process computes?

``certify(recipe, steps, out)`` runs three short runs of the recipe, each the way
``python -m suite.submit`` runs it (same executor, same run record):

1. the recipe's strategy at its world size;
2. ``single``: one process, the same model, seed, data and global batch;
3. the **noise floor**: ``single`` again with each initial weight moved by one rounding error
   (``training.init_perturbation`` = the precision's unit roundoff).

Per step, the strategy's distance from ``single`` is judged against the floor's: a correct
strategy differs from ``single`` only by rounding order, and a model amplifies a rounding-sized
difference at the same rate whichever rounding started it; a bug (a gradient not averaged, a
shard skipped, batch norm over the wrong samples) moves the losses by far more than rounding
from its first step. Step k passes when

    |strategy_k - single_k| <= MARGIN x max(floor_1 .. floor_k) + ULPS x unit_roundoff x |single_k|

(the second term: the loss itself, reduced in another order, may differ by a few ulps even where
the weights do not). The runs are float64 (``training.precision=fp64``) where the strategy can
train in it: rounding is then ~1e-16 relative and the floor tiny, so anything a bug does stands
out by ten orders of magnitude, whatever the CPU's vector kernels or thread count. A strategy
that cannot (DeepSpeed's, which keeps float32 master weights) is certified in float32 against
the float32 floor, which is said on the certificate.
"""
from __future__ import annotations

from suite.verify.certificate import Certificate, StepCheck, judge  # noqa: F401
from suite.verify.runs import certify, certify_each, certify_many  # noqa: F401
