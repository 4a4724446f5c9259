"""A pipeline's step on its path: the bubble its busiest stage idles, its compute where ranks share
cores, and which of the first stage's calls (what the profile counts) the step waits for and how
often; used by ``suite.planner.timing.predict_step_time``. The rules, and what each was measured
on, are in each function and in docs/time.md."""
from __future__ import annotations


def busiest_or_balanced(stages: int, busiest_share: float | None) -> float:
    """The busiest stage's share of the compute where it is known and possible (between 1/stages
    and 1), else a balanced split's 1/stages."""
    return busiest_share if busiest_share and 1 / stages <= busiest_share <= 1 else 1 / stages


def pipeline_bubble(stages: int, chunks: int, busiest_share: float | None = None) -> float:
    """The share of a pipeline step its busiest stage idles, for ``stages`` K and ``chunks`` M.

    A flushed pipeline (GPipe, 1F1B) with t_i per chunk on stage i steps in (M-1)·max t + Σ t:
    the busiest stage's M chunks, and every other stage's one chunk while the first fills and
    the last drains. Balanced (each stage 1/K of the model) that is the textbook (K-1)/(M+K-1).
    A split whose busiest stage does a share s of the compute (VGG cut by parameters: the early
    convolutions hold few weights and most FLOPs) idles less: the other stages' chunks are
    shorter. With the busiest stage's compute C = M·t_max, Σ t = C / (M·s), so
    step = C·((M-1)/M + 1/(M·s)) and the bubble is 1 - 1/((M-1)/M + 1/(M·s))."""
    if stages < 2:
        return 0.0
    share = busiest_or_balanced(stages, busiest_share)
    factor = (chunks - 1) / chunks + 1 / (chunks * share)
    return 1 - 1 / factor


def pipelined_compute_s(compute_s: float, bubble: float, share: float, stages: int,
                        busiest_share: float | None = None) -> float:
    """The busiest pipeline rank's compute per step, its idle bubble included. ``compute_s``: its
    compute with every rank of the node computing at once, each on ``share`` of its cores (1: a
    core or a device of its own); ``busiest_share``: its stage's share of the model's compute
    (1/stages where the split is balanced).

    Where ranks share cores, a stage's idle time frees them for the others, so the step is the
    larger of two bounds: the critical path at a whole core's rate, compute_s·share/(1-bubble),
    and the node's total work spread over its cores, compute_s/(busiest_share·stages) (the
    busiest stage's work at the shared rate, over its share of the work). Measured at 4 stages
    on 2 cores (GPipe and 1F1B, 4 chunks): charging the bubble at the shared rate over-predicted
    by 74-130 %."""
    stage = busiest_or_balanced(stages, busiest_share)
    return max(compute_s * share / (1 - bubble), compute_s / (stage * stages) if share < 1 else 0.0)


def stage_messages_factor(stage_s: list[float] | None, stages: int) -> int:
    """The busiest pipeline stage's sends and receives over the first stage's (what the profile
    counts, ``costs.stage_messages``): 2 where it sits between two stages (it receives each chunk's
    activation from one side and its gradient from the other, and sends both on), else 1. Without
    timed stages, a pipeline of 3 stages or more is taken as balanced, its critical path through
    the middle stages."""
    if stages < 3:
        return 1
    if stage_s and len(stage_s) == stages:
        return 2 if 0 < stage_s.index(max(stage_s)) < stages - 1 else 1
    return 2


def path_calls_factor(key: str, stage_s: list[float] | None, stages: int) -> int:
    """How many times the first stage's calls under ``key`` (``comm_time_s``'s keys; what the
    profile counts) a pipeline's step waits for, in a flushed schedule of ``stages`` stages.

    - ``send``/``recv``: the busiest stage's messages (``stage_messages_factor``).
    - ``all_gather``: a stage data-parallel through FSDP (``dp_mode=fully_shard``) gathers its
      parameters at its first chunk's forward, which waits for the stage before it, whose own
      first forward waited for its gather: every stage's gather lies on the step's path, one
      after another. Its reduce-scatter, after its last backward, overlaps the stages before it
      still in backward, but for the first stage's, which ends the step: counted once
      (benchmarks/results/code-rules.md).
    - anything else (a synced batch norm's calls, ``<kind>@data``): once."""
    if key in ("send", "recv"):
        return stage_messages_factor(stage_s, stages)
    return max(1, stages) if key == "all_gather" else 1


def neighbour_ratio(stage_s: list[float] | None, stages: int, busiest_share: float | None = None) -> float:
    """How long the busiest pipeline stage's neighbours take per step, over its own time: the
    larger of the stages on either side of it (``stage_s``: each stage's step, timed), or without
    timings the rest of the model spread evenly over the other stages (``busiest_share``: the
    busiest stage's share of the compute; 1/stages where balanced, and so 1).

    The busiest stage waits on its neighbours' messages only as much as they keep pace with it.
    torch's schedules post sends without waiting (``batch_isend_irecv``), and a receive whose
    message has come finds it at once. A lighter neighbour is idle between its chunks, for the
    busiest stage's step times (1 - this ratio) in all; that idle time absorbs the latency of the
    messages between them (what the calibration's in-step send costs), up to its length. So, with
    a core or a device per rank, the busiest stage pays its sends' and receives' time less that
    idle time (``predict_step_time``: ``messages_ready_s``, the part absorbed); balanced stages
    pay them in full (benchmarks/results/code-rules.md). With more ranks than cores a
    neighbour's idle time goes to another rank's compute, and the rule is not applied."""
    if stages < 2:
        return 1.0
    if stage_s and len(stage_s) == stages and max(stage_s) > 0:
        b = stage_s.index(max(stage_s))
        sides = [stage_s[j] for j in (b - 1, b + 1) if 0 <= j < stages]
        return min(1.0, max(sides) / stage_s[b])
    s = busiest_or_balanced(stages, busiest_share)
    return min(1.0, (1 - s) / ((stages - 1) * s))
