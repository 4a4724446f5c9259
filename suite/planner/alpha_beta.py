"""The alpha-beta cost of one collective call, per kind, and its fit to measured times.

A call of kind k on N ranks with a message of n bytes (``StepProfile``'s convention: the buffer a
rank hands to the call; all_gather's output, reduce_scatter's input) takes

    t = a_k(N) * alpha + b_k(N) * n / beta

alpha: latency per message step (s); beta: bandwidth of one link (bytes/s). The factors are those
of the algorithm assumed for each kind (``FACTORS``):

    all_reduce      ring: reduce-scatter then all-gather   a = 2(N-1)       b = 2(N-1)/N
    all_gather      ring                                   a = N-1          b = (N-1)/N
    reduce_scatter  ring                                   a = N-1          b = (N-1)/N
    all_to_all      pairwise exchange                      a = N-1          b = (N-1)/N
    broadcast       binomial tree                          a = ceil(log2 N) b = ceil(log2 N)
    send, recv      one point-to-point message             a = 1            b = 1
    barrier         a one-element all_reduce               a = 2(N-1)       b = 0
    reduce          binomial tree (as broadcast)           a = ceil(log2 N) b = ceil(log2 N)
    gather, scatter the root exchanges with each peer      a = N-1          b = (N-1)/N

The calibration measures at one world size (2 on one machine) and fits alpha and beta of each
kind from it (``fit``); a call's bandwidth is that which the calibration's messages nearest its
size reached (``beta_at``), the line's beta where no message was timed (a preset); the planner then evaluates the formula at any N. That the backend uses these
algorithms at larger N, and that links between nodes are as fast as the ones measured, is an
assumption: calibrate on the nodes and world size you will use to remove it. Kinds the
calibration does not time borrow the fit of a measured kind (``BORROWED``).
"""
from __future__ import annotations

import math

FACTORS = {
    "all_reduce": lambda n: (2 * (n - 1), 2 * (n - 1) / n),
    "all_gather": lambda n: (n - 1, (n - 1) / n),
    "reduce_scatter": lambda n: (n - 1, (n - 1) / n),
    "all_to_all": lambda n: (n - 1, (n - 1) / n),
    "broadcast": lambda n: (math.ceil(math.log2(n)), math.ceil(math.log2(n))),
    "send": lambda n: (1, 1),
    "recv": lambda n: (1, 1),
    "barrier": lambda n: (2 * (n - 1), 0),
    "reduce": lambda n: (math.ceil(math.log2(n)), math.ceil(math.log2(n))),
    "gather": lambda n: (n - 1, (n - 1) / n),
    "scatter": lambda n: (n - 1, (n - 1) / n),
}
FORMULAS = {
    "all_reduce": "2(N-1)·α + 2(N-1)/N · n/β", "all_gather": "(N-1)·α + (N-1)/N · n/β",
    "reduce_scatter": "(N-1)·α + (N-1)/N · n/β", "all_to_all": "(N-1)·α + (N-1)/N · n/β",
    "broadcast": "⌈log2 N⌉·(α + n/β)", "send": "α + n/β", "recv": "α + n/β", "barrier": "2(N-1)·α",
    "reduce": "⌈log2 N⌉·(α + n/β)", "gather": "(N-1)·α + (N-1)/N · n/β", "scatter": "(N-1)·α + (N-1)/N · n/β",
}
# Timed by the calibration: send and recv are one measurement (a ping-pong, half the round trip).
MEASURED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send")
BURST_SHORT = 8  # the calls of the burst a calibration's one burst time was timed in (rank_timings.BURST_CALLS)
BORROWED = {"recv": "send", "all_to_all": "all_gather", "barrier": "all_reduce", "reduce": "broadcast",
            "gather": "all_gather", "scatter": "all_gather"}


def call_time_s(kind: str, world: int, n_bytes: float, alpha_s: float, beta_bytes_per_s: float,
                calls: int = 1, trees: bool = False) -> float:
    """Time of ``calls`` calls of ``kind`` on ``world`` ranks moving ``n_bytes`` in total.
    ``trees``: the backend may all-reduce by a double binary tree where that is faster (NCCL
    chooses per message size: 2⌈log2 N⌉·α + 2·n/β; at 1,024 ranks a ring's latency term is
    2,046 α, a tree's 20 α); gloo's rings are taken as rings."""
    if world <= 1 or calls <= 0:
        return 0.0  # one rank: torch.distributed returns without communicating
    a, b = FACTORS[kind](world)
    ring = calls * a * alpha_s + b * n_bytes / beta_bytes_per_s
    if trees and kind == "all_reduce":
        depth = math.ceil(math.log2(world))
        return min(ring, calls * 2 * depth * alpha_s + 2 * n_bytes / beta_bytes_per_s)
    return ring


def fit(kind: str, world: int, points: list[tuple[float, float]], in_step=None, burst: float | None = None) -> dict:
    """alpha_s, beta_bytes_per_s from (bytes, seconds) measured at ``world`` ranks; with
    ``in_step`` ([[slice_s, seconds], ...]: a small call's cost between slices of compute,
    ``rank_timings.time_in_step``), also ``step_alpha``: those costs as alpha (``/ a(world)``), which
    the time model takes where larger than alpha (``step_alpha``); with ``burst`` (seconds: a small
    call's cost among calls back to back after compute, ``rank_timings.time_burst``), ``burst_alpha``,
    taken for strategies whose calls follow one another so (``burst_alpha``).

    Least squares of t = c0 + c1 n weighted by 1/t, i.e. on relative error, so that the small
    messages (which fix alpha) count as much as the large ones (which fix beta). When noise (a
    busy machine) makes c0 or c1 non-positive, the Theil-Sen line (median of the pairwise slopes,
    median intercept) replaces it, robust to a few slow points; ``method`` says which was used.
    The line must not make the largest message faster than it was measured (more than 3 %): where
    it does, c1 is raised to meet it: a shaped link's token bucket lets a message's first bytes
    through at once, which the relative-error line alone takes for bandwidth (figures, and why not
    the larger sizes alone: benchmarks/results/code-rules.md).

    Fitted to the points' lower envelope from the right: a message cannot take less time than a
    larger one over the same link, so a small one measured slower than a larger one was held up by
    something else (the scheduler, another process) and counts with the larger one's time."""
    a, b = FACTORS[kind](world)
    fitted = _envelope(points)
    c0, c1, method = *_weighted_least_squares(fitted), "least squares (relative)"
    if c0 <= 0 or c1 <= 0:
        c0, c1, method = *_theil_sen(fitted), "Theil-Sen (least squares gave a non-positive term)"
    if c0 <= 0 or c1 <= 0:  # still: the smallest message is all latency, the largest all bandwidth
        c0, c1, method = min(t for _, t in fitted), max(fitted)[1] / max(fitted)[0], "bounds"
    n_max, t_max = max(fitted)
    if c0 + c1 * n_max < 0.97 * t_max:  # the bandwidth the largest message reached, not more
        c1, method = (t_max - c0) / n_max, method + "; bandwidth held to the largest message's"
    errors = [abs(c0 + c1 * n - t) / t for n, t in points]
    out = {"alpha_s": c0 / a, "beta_bytes_per_s": b / c1, "formula": FORMULAS[kind], "world_size": world,
           "method": method, "points": [[int(n), t] for n, t in points], "max_relative_error": max(errors),
           "median_relative_error": sorted(errors)[len(errors) // 2]}
    if in_step and a:
        out["step_alpha"] = [[slice_s, t / a] for slice_s, t in sorted(in_step)]
    # {calls: seconds a call} (rank_timings.time_burst); a number: a burst of 8, as timed before the long one
    bursts = {BURST_SHORT: burst} if isinstance(burst, (int, float)) else burst or {}
    lengths = sorted((int(n), t) for n, t in bursts.items())
    if lengths and a:
        out["burst_alpha"] = lengths[0][1] / a  # the shortest burst's: what a calibration with one length stored
        if len(lengths) > 1:
            out["burst_alpha_by_calls"] = [[n, t / a] for n, t in lengths]
    return out


def beta_at(f: dict, kind: str, message_bytes: float) -> float:
    """The bandwidth of one link for a call of ``kind`` moving ``message_bytes``: each timed
    message's own (its time less the fit's latency, ``_point_betas``), interpolated on log(size)
    between the two nearest, held at the ends; the fit's beta where no message was timed so that
    bandwidth decided its time. One straight line cannot hold every size where the bandwidth
    changes with it, as gloo's on loopback does (benchmarks/results/code-rules.md); over a
    tbf-shaped link the first bytes of a message pass at once (``fit``)."""
    betas = _point_betas(f, kind)
    if not betas or message_bytes <= 0:
        return f["beta_bytes_per_s"]
    return _on_log(betas, message_bytes)


def beta_of_sizes(f: dict, kind: str, sizes: dict[str, int] | None, mean_bytes: float) -> float:
    """The bandwidth that prices calls of ``kind`` whose message sizes are ``sizes`` ({bytes:
    calls}): each size at its own bandwidth (``beta_at``), combined so that the bytes over it are
    their times summed (the harmonic mean weighted by bytes); without sizes (the analytic rule, a
    profile from before they were counted), the bandwidth at the mean size ``mean_bytes``."""
    weighted = [(int(n) * c, beta_at(f, kind, int(n))) for n, c in (sizes or {}).items() if int(n) > 0 and c > 0]
    total = sum(b for b, _ in weighted)
    if not total:
        return beta_at(f, kind, mean_bytes)
    return total / sum(b / beta for b, beta in weighted)


def _point_betas(f: dict, kind: str) -> list[tuple[float, float]]:
    """(bytes, bandwidth) of each timed message (the lower envelope, as fitted) that spent at
    least half its time moving bytes: its time less the fit's latency ``a · alpha``, at the
    calibration's world; the smaller ones are all latency and say nothing of bandwidth."""
    world = f.get("world_size")
    kind = kind if kind in MEASURED else BORROWED.get(kind, kind)  # a borrowed fit's messages are its lender's
    if not f.get("points") or not world or world < 2 or kind not in FACTORS:
        return []
    a, b = FACTORS[kind](world)
    if not b:
        return []
    c0 = a * f["alpha_s"]
    return [(n, b * n / (t - c0)) for n, t in _envelope(f["points"]) if n > 0 and t >= 2 * c0]


def burst_alpha(f: dict, calls: float | None = None) -> float:
    """The latency per call of ``calls`` calls issued back to back after compute: the larger of
    the fit's alpha and the calibration's burst (``fit``), interpolated on log(calls) between the
    burst lengths it timed and held at the ends (``rank_timings.BURST_LONG_CALLS``: with a core
    per rank a call costs less in a long burst); without a burst measured (a calibration from
    before it), what a call costs between the shortest slices of compute."""
    by_calls = f.get("burst_alpha_by_calls")
    if by_calls and calls:
        return max(f["alpha_s"], _on_log(by_calls, calls))
    if "burst_alpha" in f:
        return max(f["alpha_s"], f["burst_alpha"])
    return step_alpha(f, 0.0)


def _on_log(points: list, x: float) -> float:
    """y at ``x`` between (x, y) ``points`` sorted by x, linear in log(x), held at the ends."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    (x0, y0), (x1, y1) = next((p, q) for p, q in zip(points, points[1:]) if p[0] <= x <= q[0])
    return y0 + (math.log(x / x0) / math.log(x1 / x0) * (y1 - y0) if x1 > x0 else 0.0)


def step_alpha(f: dict, slice_s: float | None = None) -> float:
    """The latency per call to predict a step with: alpha of the fit, or, where larger, what a
    call costs between slices of compute ``slice_s`` long (the step's compute over its calls),
    interpolated on log(slice) between the calibration's slices and held at its ends."""
    curve = f.get("step_alpha")
    if not curve or slice_s is None:
        return f["alpha_s"]
    return max(f["alpha_s"], _on_log(curve, slice_s))


def _envelope(points) -> list[tuple[float, float]]:
    """(bytes, seconds) by size, each time the least of its own and every larger message's."""
    out, least = [], math.inf
    for n, t in sorted(points, reverse=True):
        least = min(least, t)
        out.append((n, least))
    return out[::-1]


def _weighted_least_squares(points) -> tuple[float, float]:
    w2 = [1 / t ** 2 for _, t in points]
    sw = sum(w2)
    sx = sum(w * n for w, (n, _) in zip(w2, points))
    sxx = sum(w * n * n for w, (n, _) in zip(w2, points))
    sy = sum(w * t for w, (_, t) in zip(w2, points))
    sxy = sum(w * n * t for w, (n, t) in zip(w2, points))
    det = sw * sxx - sx * sx
    if det <= 0:
        return -1.0, -1.0
    return (sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det


def _theil_sen(points) -> tuple[float, float]:
    slopes = sorted((tj - ti) / (nj - ni) for i, (ni, ti) in enumerate(points) for nj, tj in points[i + 1:] if nj != ni)
    if not slopes:
        return -1.0, -1.0
    c1 = slopes[len(slopes) // 2]
    intercepts = sorted(t - c1 * n for n, t in points)
    return intercepts[len(intercepts) // 2], c1
