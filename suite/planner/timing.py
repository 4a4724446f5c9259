"""From a ``StepProfile`` and a calibration (``python -m suite.calibrate``) to a predicted step time.

    compute_s = profile.flops / rate
    copy_s    = profile.copy_bytes / copy rate
    comm_s    = sum over kinds k of  calls_k · a_k(N) · α'_k + b_k(N) · bytes_k / β_k   (alpha_beta)
                α'_k = the larger of α_k and what a call costs between slices of compute as
                long as this step's compute over its calls (alpha_beta.step_alpha); where the
                strategy's calls follow one another after its compute, what a call costs in
                such a burst (alpha_beta.burst_alpha)
    exposed   = comm_s - hidden,  hidden = min(Σ_k overlap_k · comm_k, window of compute)
    step_s    = compute_s / (1 - bubble) + copy_s + exposed_comm_s
                bubble: (K-1)/(M+K-1) for K balanced stages and M chunks; less where the busiest
                stage does more than 1/K of the compute (``pipeline_bubble``); GPipe with a
                core or device per rank: its schedule played out op by op, its messages in
                it (``pipeline_schedule``), in place of the bubble and the messages' time
    samples/s = profile.samples / step_s

rate: the recipe's model's rate measured by the calibration with as many ranks stepping at once
on one node as the run puts there (``by_ranks_per_node``: each rank at its batch and threads, so
thread scaling, batch size and the ranks' contention for the cores are measured). Else the matmul
peak at the threads a rank gets (``launch.cpus_per_task``, else cores // ranks per node, as the
ranks themselves choose: ``suite.common.threads``; and a share of the cores when more
ranks than cores share a node), times the model's efficiency (its achieved rate over the peak at
the same threads) when the calibration measured the model at all; the efficiency is then assumed
not to change with batch size or thread count. Without either the peak is used, and the
predicted compute is a lower bound.

copy rate: the bytes one thread copies per second into a freshly allocated buffer
(``compute.copy_rate``), times the rank's share of the cores when more ranks than cores share a
node; ranks copying at once on separate cores are assumed not to slow each other's copies. A
calibration older than this rate predicts no copy time (``copy_s`` 0).

comm: each kind over its group (``group_of``: the mesh axes the strategy declares for the kind,
``comm_axes``, else its data-parallel axes): N is the group's size, and the link class is
``inter`` where its ranks sit on more than one node, ``intra`` within one (``hardware.link_fits``). A calibration
of one node without link classes: the fits timed at the run's world size
(``collectives_by_world``) where it has them, else those of its first world size.

rate, where the model was timed when predicting (``suite.planner.model_time``): its step's rate
at this rank's threads, times the core share. Where the strategy was also timed as one rank of its
own (a pipeline: its stages' data-parallel wrapper, ``stage_time``), the difference (``overhead_s``:
its code's cost per step, its copies included) is added to
``compute_s`` whole, over the core share (it was timed on a core of its own), and ``copy_s`` is 0.
A preset of other hardware (``per_device``): the device's peak at the recipe's precision times
the preset's assumed efficiency.

overlap: every strategy's own rule (``overlap`` on its options class, ``suite.strategies.costs.
Overlap``; docs/architecture.md, "A strategy's rules"): the share of each collective kind's time
hidden under backward or the whole step, and whether stages idle in a pipeline's bubble. A
strategy that declares none is refused. On a CPU node with exactly one rank per core nothing is
hidden whatever the rule (``cores_all_busy``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from suite.common.errors import SuiteError
from suite.common.threads import rank_threads
from suite.planner import alpha_beta, gpu_ops, groups, pipeline_schedule
from suite.planner.pipeline_time import (busiest_or_balanced, neighbour_ratio, path_calls_factor,
                                         pipeline_bubble, pipelined_compute_s)
from suite.planner.profile import StepProfile
import hashlib

if TYPE_CHECKING:  # the strategy registry imports torch: timing stays torch-free at import
    from suite.strategies.costs import Overlap

BACKWARD_SHARE = 2 / 3  # backward ≈ 2 x forward FLOPs: the window a gradient reduction can hide in


def strategy_options(options: dict):
    """The strategy's options object: ``options["strategy"]`` where given (``options_of`` puts
    the recipe's there), else built from ``options``' name and those of its keys that are the
    strategy's own (stage for zero)."""
    from suite.strategies import STRATEGIES

    if options.get("strategy") is not None:
        return options["strategy"]
    name = options.get("name", "single")
    if name not in STRATEGIES:
        raise SuiteError(f"strategy {name!r} is not a strategy; choose from {', '.join(STRATEGIES)}")
    cls = STRATEGIES[name].Options
    keys = {k: v for k, v in options.items() if k in cls.model_fields and k != "name" and v is not None}
    return cls(name=name, **keys)


def rule(options: dict) -> tuple[str, Overlap]:
    """The overlap rule of a strategy (``options``: name, and stage for zero, or the strategy's
    options as ``strategy``): what its options class declares (``overlap``); SuiteError where it
    declares none."""
    from suite.strategies import costs

    strategy = strategy_options(options)
    costs.require(strategy, "overlap")
    return strategy.name, strategy.overlap


def model_key(recipe) -> str:
    """How a calibration names the model it measured: model.name and a digest of model.*."""

    digest = hashlib.sha256(recipe.model.model_dump_json().encode()).hexdigest()[:8]
    return f"{recipe.model.name}-{digest}"


def options_of(recipe) -> dict:
    """The strategy options the time model needs, from a recipe."""
    layout = recipe.layout()
    return {"name": recipe.strategy.name, "stage": getattr(recipe.strategy, "stage", None), "strategy": recipe.strategy,
            "stages": layout.axes.get("pipeline", 1), "chunks": layout.pipeline_chunks,
            "ranks_per_node": recipe.launch.tasks_per_node, "cpus_per_task": recipe.launch.cpus_per_task,
            "model": model_key(recipe), "device": recipe.launch.device,
            "layout": layout, "precision": recipe.training.precision}


def compute_rate(calibration: dict, ranks_per_node: int, model: str | None = None,
                 precision: str = "fp32", cpus_per_task: int | None = None) -> tuple[float, str]:
    """(FLOP/s of one rank, how it was found), at the threads the rank will have
    (``launch.cpus_per_task``, else its share of the node's cores)."""
    c = calibration["compute"]
    if c.get("per_device"):  # a preset (suite.planner.hardware): the device's peak x an assumed share
        peak = c["peak_flops_per_s_by_precision"][precision if precision in c["peak_flops_per_s_by_precision"] else "fp32"]
        return peak * c["efficiency"], (f"{precision} peak {peak / 1e12:.0f} TFLOP/s x {c['efficiency']:.0%} "
                                        f"assumed achieved (from specs, not measured)")
    by_threads = {int(t): r for t, r in c["peak_flops_per_s_by_threads"].items()}
    cores = c["cores"]
    threads = rank_threads(cores, ranks_per_node, cpus_per_task)
    peak = by_threads.get(threads) or by_threads[max(by_threads)]
    share = groups.core_share(cores, ranks_per_node, threads)
    m = (c.get("models") or {}).get(model) if model else None
    together = ((m or {}).get("by_ranks_per_node") or {}).get(str(max(1, ranks_per_node)))
    if together and together.get("threads", threads) == threads:  # measured with as many ranks stepping at once
        return together["flops_per_s"], (f"the model's rate measured with {together['ranks_per_node']} rank(s) "
                                          f"stepping at once, {together['threads']} thread(s) each")
    if m and m.get("timed") and m["threads"] == threads:  # suite.planner.model_time, at this rank's threads
        return m["flops_per_s"] * share, (f"the model's step timed at rank batch {m['rank_batch']} on {threads} "
                                          f"thread(s) when predicted, {m.get('together', 1)} stepping at once"
                                          + (f" x core share {share:.2f}" if share < 1 else ""))
    if m:
        efficiency = m["flops_per_s"] / (by_threads.get(m["threads"]) or peak)
        return peak * share * efficiency, (f"peak at {threads} thread(s) x model efficiency {efficiency:.2f}"
                                           + (f" x core share {share:.2f}" if share < 1 else ""))
    return peak * share, f"matmul peak at {threads} thread(s)" + (f" x core share {share:.2f}" if share < 1 else "")


def copy_time_s(profile: StepProfile, calibration: dict, ranks_per_node: int) -> float:
    """Seconds per step of the strategy's memory copies (``StepProfile.copy_bytes``), at one
    thread's copy rate."""
    c = calibration["compute"]
    rate = c.get("copy_bytes_per_s")
    if not profile.copy_bytes or not rate or c.get("per_device"):  # a GPU's copies: at memory bandwidth, not modelled
        return 0.0
    return profile.copy_bytes / (rate * groups.core_share(c["cores"], ranks_per_node))


def comm_time_s(profile: StepProfile, calibration: dict, options: dict | None = None,
                compute_s: float | None = None) -> dict[str, float]:
    """Seconds per step of each collective kind the profile uses, over the link class its group
    crosses (``hardware.link_fits``). Each call's latency: the fit's alpha, or what a call costs
    between slices of compute as long as this step's (``compute_s`` over its calls) where the
    calibration measured that (``alpha_beta.step_alpha``); for a strategy whose calls follow one
    another after its compute (``Overlap.back_to_back``), what a call in such a burst costs
    (``alpha_beta.burst_alpha``). The calls of a kind that run over the data-parallel ranks
    whatever the strategy declares (``StepProfile.data_comm``: a synced batch norm's, between
    pieces of compute) are timed over that group under the key ``<kind>@data``, which no
    overlap rule names: no rule hides them. (With more ranks than cores, the compute of another
    rank on the shared core still hides a share of them where it hides the rest of a strategy's
    calls: ``predict_step_time``; without it the errors moved but the order came no nearer:
    benchmarks/results/code-rules.md.)"""
    options = options or {}
    out = {}
    total_calls = sum(c for c in profile.comm_calls.values() if c)
    slice_s = compute_s / total_calls if compute_s is not None and total_calls else None
    back_to_back = rule(options)[1].back_to_back if options.get("name") or options.get("strategy") else False
    for kind, calls in profile.comm_calls.items():
        data_bytes, data_calls = (profile.data_comm or {}).get(kind, (0, 0))
        own = (calls - data_calls, profile.comm_bytes.get(kind, 0) - data_bytes)
        for key, (n_calls, n_bytes), data in ((kind, own, False), (f"{kind}@data", (data_calls, data_bytes), True)):
            if n_calls > 0:
                out[key] = _kind_time_s(kind, n_calls, n_bytes, profile, calibration, options, slice_s, data,
                                        burst=back_to_back and not data)
    return out


def _kind_time_s(kind: str, calls: int, n_bytes: int, profile: StepProfile, calibration: dict, options: dict,
                 slice_s: float | None, data: bool, burst: bool) -> float:
    """``calls`` calls of ``kind`` moving ``n_bytes`` over the group ``group_of`` gives them; a
    call's latency what it costs between slices of compute ``slice_s`` long, or with ``burst``
    in a burst of calls after compute."""
    size, link = groups.group_of(kind, options, profile, data)
    f = groups.fit_for(kind, size, link, profile, calibration, options)
    alpha_s = alpha_beta.burst_alpha(f, calls) if burst else alpha_beta.step_alpha(f, slice_s)
    slowdown = groups.group_slowdown(kind, size, link, profile, calibration, options)
    alpha_s *= slowdown
    # Where the node's groups share its cores, their bytes move at the rate timed with them all at once.
    moving = (groups.groups_fit(kind, size, options.get("ranks_per_node") or profile.world_size, calibration)
              if slowdown > 1 else None) or f
    beta = alpha_beta.beta_of_sizes(moving, kind, (profile.comm_sizes or {}).get(kind), n_bytes / calls)
    return alpha_beta.call_time_s(kind, size, n_bytes, alpha_s, beta, calls, trees=calibration.get("backend") == "nccl")


def predict_step_time(profile: StepProfile, calibration: dict, options: dict | None = None) -> dict:
    """compute_s, comm_s, exposed_comm_s, step_s, samples_per_s (and the parts) for one step.

    ``options``: name (strategy), stage (zero), stages and chunks (pipeline K and M),
    ranks_per_node (default: the world size, one node), model (to use its measured efficiency)."""
    options = {"name": profile.strategy, **(options or {})}
    ranks_per_node = options.get("ranks_per_node") or profile.world_size
    rate, rate_note = compute_rate(calibration, ranks_per_node, options.get("model"), options.get("precision", "fp32"),
                                   options.get("cpus_per_task"))
    compute_s = profile.flops / rate
    device = calibration["compute"]
    gpu = None
    if device.get("per_device") and device.get("sm_count") and profile.ops:  # a GPU's operators, priced one by one
        gpu = gpu_ops.step_s(profile.ops, device, options.get("precision", "fp32"))
        compute_s = gpu["total"]
        rate, rate_note = profile.flops / compute_s, "the step's operators priced one by one on the GPU (gpu_ops)"
    timed = (calibration["compute"].get("models") or {}).get(options.get("model")) or {}
    share = groups.shared_core(calibration, ranks_per_node, options)
    _, overlap = rule(options)
    stages = options.get("stages") or profile.world_size
    stage_share, stage_s = profile.stage_share, timed.get("stage_s") if timed.get("strategy") == profile.strategy else None
    timed_stages = stage_s if overlap.bubble and stage_s and len(stage_s) == stages else None
    if timed_stages:
        # Its stages timed one by one through its own schedule (stage_time): the busiest stage's
        # step, and its share of them all, rather than its share of the FLOPs of the whole
        # model's step, which gives a stage of many FLOPs and few weights the optimizer's time
        # of all of them, and knows nothing of what the schedule costs (GPipe keeps every chunk's
        # activations until its backward; see stage_time).
        compute_s, stage_share = max(timed_stages) / share, max(timed_stages) / sum(timed_stages)
        rate_note = f"its {stages} stages timed one by one when predicted"
    if timed.get("strategy") == profile.strategy != "single":
        copy_s = 0.0  # its copies are in its own timing
        if timed.get("rank_step_s"):
            # Timed as rank 0 of its own world (model_time.at_world: a strategy that splits layers),
            # its collectives faked: that step is the rank's compute, replicated layers and all,
            # where its FLOPs at the model's rate miss them. On its share of a core, as the rest.
            compute_s = timed["rank_step_s"] / share
            rate_note = "its rank timed at its own world when predicted (collectives left out)"
        else:
            # Timed as one rank of its own (model_time): what its code costs a rank, copies
            # included, timed on a core of its own; run on its share of one, as the model's compute is.
            compute_s += timed.get("overhead_s", 0.0) / share
    else:
        copy_s = copy_time_s(profile, calibration, ranks_per_node)
    per_kind = comm_time_s(profile, calibration, options, compute_s)
    if overlap.bubble:  # the profile counts the first stage's calls; the step's path holds these
        per_kind = {k: t * path_calls_factor(k, timed_stages, stages) for k, t in per_kind.items()}
    comm_s = sum(per_kind.values())
    window_s = compute_s * (BACKWARD_SHARE if overlap.window == "backward" else 1.0)
    # Collectives whose groups all call them at once on shared cores run while no rank computes.
    free = {k: t for k, t in per_kind.items() if not groups.groups_in_lockstep(k, profile, calibration, options)}
    hidden_s = min(sum(overlap.share.get(k, 0.0) * t for k, t in free.items()), window_s)
    if groups.cores_all_busy(options, profile, calibration):
        hidden_s = 0.0
    if gpu is not None and overlap.gpu_stream:  # a GPU: its collectives on their own stream (Overlap.gpu_stream)
        calls = profile.comm_calls
        hidden_s = min(sum(t * (1 - 1 / max(calls.get(k, 1), 1)) for k, t in free.items() if k in overlap.gpu_stream),
                       window_s)
    if share < 1 and ((overlap.share and overlap.window == "backward") or overlap.back_to_back):
        # More ranks than cores, and no rank computes behind these calls:
        # - reductions that run behind the rank's own backward (DDP's buckets, on gloo's thread):
        #   every core is computing, so its rule's overlap does not hold (as with one rank per
        #   core), and the rank is not waiting while they run, so no other rank's compute hides
        #   them either;
        # - calls that follow the backward on every rank at once (``back_to_back``: the
        #   hand-written all-reduce, one call per tensor): while one rank waits in the burst the
        #   others are in it too. Its price per call was timed so, in a burst on every rank
        #   (``alpha_beta.burst_alpha``). Figures for both: benchmarks/results/code-rules.md.
        hidden_s = 0.0
    elif share < 1 and not overlap.bubble and not overlap.inside_compute:
        # More ranks than cores: while one rank waits in a collective, another computes on its
        # core, whatever the strategy's own overlap. Not for calls inside the compute
        # (``Overlap.inside_compute``), whose price, timed between slices of compute with every
        # rank stepping, holds that already (benchmarks/results/code-rules.md).
        hidden_s = max(hidden_s, min(sum(free.values()) * (1 - share), compute_s))
    bubble, compute_step_s, ready_s, simulated = 0.0, compute_s, 0.0, None
    if overlap.bubble:
        bubble = pipeline_bubble(stages, options.get("chunks") or 1, stage_share)
        compute_step_s = pipelined_compute_s(compute_s, bubble, share, stages, stage_share)
        simulated = _simulated_schedule(options, profile, calibration, compute_s, stage_share, timed_stages, share)
        point_to_point = sum(per_kind.get(k, 0.0) for k in ("send", "recv"))
        if simulated is not None:
            # Its schedule played out op by op, its messages in it: what they cost is in the step.
            compute_step_s, ready_s = simulated["step_s"], point_to_point
        elif share >= 1:
            ready_s = min(point_to_point, compute_s * (1 - neighbour_ratio(timed_stages, stages, stage_share)))
    exposed_s = comm_s - hidden_s - ready_s
    step_s = compute_step_s + copy_s + exposed_s
    return {"compute_s": compute_s, "copy_s": copy_s, "comm_s": comm_s, "exposed_comm_s": exposed_s, "step_s": step_s,
            "samples_per_s": profile.samples / step_s if step_s > 0 else None,
            "comm_s_by_kind": per_kind, "bubble": bubble, "messages_ready_s": ready_s, "flops_per_s": rate, "rate": rate_note,
            "overlap_rule": overlap.why, **({"schedule_simulated_s": simulated["step_s"]} if simulated else {}),
            **({"gpu_s": gpu} if gpu else {})}


def _simulated_schedule(options: dict, profile: StepProfile, calibration: dict, compute_s: float,
                        stage_share: float | None, timed_stages: list | None, share: float) -> dict | None:
    """The pipeline's step played out op by op (``pipeline_schedule.predicted_step``) where the
    run's schedule is one it predicts so (``stage_schedule``; ``pipeline_schedule.PREDICTED``),
    each rank has a core or a device of its own (``share`` 1) and the profile counts the first
    stage's sends; else None (the bubble formula). Each stage's step from its timed step where
    timed (``timed_stages``, its optimizer included), else the busiest stage's ``compute_s`` and
    the rest of the model spread evenly over the other stages; its messages at the send's fit over
    their link."""
    sends = profile.comm_calls.get("send", 0)
    layout, stages, chunks = options.get("layout"), options.get("stages") or 1, options.get("chunks") or 1
    if share < 1 or not sends or stages < 2 or layout is None:
        return None
    schedule = strategy_options(options).stage_schedule(layout)
    if schedule not in pipeline_schedule.PREDICTED:
        return None
    if timed_stages:
        steps = [t * compute_s / max(timed_stages) for t in timed_stages]
    else:
        s = busiest_or_balanced(stages, stage_share)
        steps = [compute_s] + [compute_s * (1 - s) / ((stages - 1) * s)] * (stages - 1)
    size, link = groups.group_of("send", options, profile)
    fit = groups.fit_for("send", size, link, profile, calibration, options)
    return pipeline_schedule.predicted_step(schedule, steps, chunks, BACKWARD_SHARE, fit,
                                            profile.comm_bytes.get("send", 0) / sends)
