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
hidden whatever the rule (``_cores_all_busy``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from suite.common.errors import SuiteError
from suite.common.threads import rank_threads
from suite.planner import alpha_beta, hardware, pipeline_schedule
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
    # start-up: the strategy registry imports torch and every strategy; loaded when a step is timed.
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
    # start-up: the strategy registry imports torch and every strategy; loaded when a step is timed.
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
    share = core_share(cores, ranks_per_node, threads)
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


def core_share(cores: int, ranks_per_node: int, threads: int = 1) -> float:
    """The share of its threads' cores a rank gets: 1, or less when the node's ranks run more
    threads than it has cores (they share them)."""
    return min(1.0, cores / (max(1, ranks_per_node) * threads))


def copy_time_s(profile: StepProfile, calibration: dict, ranks_per_node: int) -> float:
    """Seconds per step of the strategy's memory copies (``StepProfile.copy_bytes``), at one
    thread's copy rate."""
    c = calibration["compute"]
    rate = c.get("copy_bytes_per_s")
    if not profile.copy_bytes or not rate or c.get("per_device"):  # a GPU's copies: at memory bandwidth, not modelled
        return 0.0
    return profile.copy_bytes / (rate * core_share(c["cores"], ranks_per_node))


def group_of(kind: str, options: dict, profile: StepProfile, data: bool = False) -> tuple[int, str]:
    """(ranks in the group a collective of ``kind`` runs over, ``inter`` where it spans nodes
    else ``intra``): the mesh axes the strategy declares for the kind (``comm_axes``), else
    its data-parallel axes (always those with ``data``: ``StepProfile.data_comm``); the whole
    world where no layout is given."""
    per_node = options.get("ranks_per_node") or profile.world_size
    layout = options.get("layout")
    if layout is None:
        return profile.world_size, "inter" if profile.world_size > per_node else "intra"
    strategy = options.get("strategy")
    declared = () if data else (getattr(strategy, "comm_axes", None) or {}).get(kind, ())
    names = tuple(a for a in declared if a in layout.axes) or layout.data_axes
    size = 1
    for name in names:
        size *= layout.axes[name]
    if kind in ("send", "recv") and size > 1:
        size = 2  # point to point: this rank and its neighbour
    return size, "inter" if layout.group_span(names) > per_node else "intra"


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
    overlap rule names: nothing of them is hidden."""
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
    size, link = group_of(kind, options, profile, data)
    f = _fit(kind, size, link, profile, calibration, options)
    alpha_s = alpha_beta.burst_alpha(f) if burst else alpha_beta.step_alpha(f, slice_s)
    slowdown = _group_slowdown(kind, size, link, profile, calibration, options)
    alpha_s *= slowdown
    # Where the node's groups share its cores, their bytes move at the rate timed with them all at once.
    moving = (_groups_fit(kind, size, options.get("ranks_per_node") or profile.world_size, calibration)
              if slowdown > 1 else None) or f
    beta = alpha_beta.beta_of_sizes(moving, kind, (profile.comm_sizes or {}).get(kind), n_bytes / calls)
    return alpha_beta.call_time_s(kind, size, n_bytes, alpha_s, beta, calls, trees=calibration.get("backend") == "nccl")


def _fit(kind: str, size: int, link: str, profile: StepProfile, calibration: dict, options: dict) -> dict:
    """The α-β fit that prices ``kind`` over a group of ``size`` across ``link``: the fits timed
    with the node's ranks at once for a message on shared cores (``_message_fits``), else at the
    group's size (``_group_fits``), else the link class's; a kind the calibration does not time
    borrows a measured kind's (``alpha_beta.BORROWED``)."""
    fits = _message_fits(kind, link, profile, calibration, options) or _group_fits(calibration, size, link) \
        or hardware.link_fits(calibration, link)
    return fits[kind if kind in fits else alpha_beta.BORROWED.get(kind)]


def _group_fits(calibration: dict, size: int, link: str) -> dict | None:
    """The fits the calibration timed at the group's size over this link class, or None. At
    more ranks than cores peers wait for a core, which the formulas' extrapolation over N cannot
    carry: where a group's own size was timed, its fits stand, else the link class's."""
    measured = calibration.get("links") or {"intra": True}  # a calibration from before link classes: one node
    return (calibration.get("collectives_by_world") or {}).get(str(size)) if link in measured else None


def _message_fits(kind: str, link: str, profile: StepProfile, calibration: dict, options: dict) -> dict | None:
    """For a send or receive on a node with more ranks than cores: the fits the calibration timed
    with all the node's ranks at once (None where it did not, or where each rank has a core).

    A pair of ranks timed alone finds idle cores; in the run, the receiver, and the gloo thread that
    takes its message in, wait for a core the node's other ranks hold. Measured with gloo, 4
    processes on 2 cores: a 64 KiB ping-pong took 0.07 ms one way with the other two idle, 0.4-0.8
    ms with them computing. The calibration at the node's rank count times each rank's sends
    between slices of compute while every rank steps (``time_in_step``), which is that wait. Over
    the stored pipeline runs at 4 ranks on 2 cores (47 runs: GPipe and 1F1B at 4 stages, pipeline
    x dp; 13 models), median |error| 18 -> 13 %, p90 32 -> 29 %; GPipe on millisecond stages
    (-56 .. -65 %) -40 .. -53 %; heavily unbalanced pipelines, already over-predicted, more so
    (a CNN's 1F1B whose first stage holds 87 % of the compute, +47 -> +78 %)."""
    if kind not in ("send", "recv"):
        return None
    per_node = options.get("ranks_per_node") or profile.world_size
    if _shared_core(calibration, per_node, options) >= 1:
        return None
    return _group_fits(calibration, per_node, link)


def _groups_fit(kind: str, size: int, ranks_per_node: int, calibration: dict) -> dict | None:
    """The fit of ``kind`` the calibration timed over groups of ``size`` with every group of a
    node's ``ranks_per_node`` ranks calling at once (``measure.time_in_groups``), or None."""
    timed = ((calibration.get("collectives_in_groups") or {}).get(str(ranks_per_node)) or {}).get(str(size)) or {}
    return timed.get(kind)


def _group_slowdown(kind: str, size: int, link: str, profile: StepProfile, calibration: dict, options: dict) -> float:
    """What a call of ``kind`` over its group waits longer than its group's fit says, where the
    node's other groups call theirs at once on the cores they share (``_groups_sharing_cores``;
    1 for sends and receives, which are staggered, and where the group's size was not timed)."""
    if kind in ("send", "recv") or not _group_fits(calibration, size, link):
        return 1.0
    return _groups_sharing_cores(calibration, size, options.get("ranks_per_node") or profile.world_size, options)


def groups_in_lockstep(key: str, profile: StepProfile, calibration: dict, options: dict) -> bool:
    """Whether the calls under ``key`` (a kind, or ``<kind>@data``: ``comm_time_s``) run over
    groups smaller than the node's ranks, all of which call them at the same point of the step on
    cores the ranks share (``_groups_sharing_cores`` slows them for that). Every rank of the node
    is then in a collective at once: none computes while another waits, and no overlap rule hides
    them. Measured at 4 ranks on 2 cores (CNN, seq2seq; HSDP, shard and replica groups of 2):
    stepped within 0-3 % of compute plus these collectives in full, where the rules' overlap (half
    hidden, up to the compute) predicted 17-28 % fast; FSDP over all 4 ranks, one group, as its
    rule predicts."""
    kind, _, data = key.partition("@")
    return _group_slowdown(kind, *group_of(kind, options, profile, data=bool(data)), profile, calibration, options) > 1


def _groups_sharing_cores(calibration: dict, size: int, ranks_per_node: int, options: dict) -> float:
    """How much slower a collective over a group of ``size`` runs than the calibration timed it
    (``size`` ranks alone on the node) when the node's ``ranks_per_node`` ranks run their groups'
    collectives at once on fewer cores: the ratio of the cores each rank gets. Every group of a
    data-parallel or tensor-parallel axis calls its collective at the same point of the step
    (point-to-point sends between pipeline stages are staggered: not counted so). Measured at 4
    ranks on 2 cores: HSDP (shard groups of 2) and tensor x data parallel stepped 2-3x slower
    than their collectives as timed with 2 ranks alone predicted.

    The ratio slows each call's latency, the wait for a core (``_kind_time_s``), not its bytes:
    slowing both, HSDP on an MLP 2048x2048 (16 MB of gradients, bandwidth-bound) at 4 ranks on 2
    cores was predicted 43 % slow, and tensor x data parallel 62 %; with the latency alone, 10 %
    and 30 %, while latency-bound models (CNN, keras MLP, transformer) moved by 1-4 %. The bytes
    move at the rate the calibration timed with every group at once where it did (``_groups_fit``:
    1.3-2.3x slower than alone on the 2-core EPYC VM, not the cores' 2x)."""
    if size >= ranks_per_node:
        return 1.0
    return _shared_core(calibration, size, options) / _shared_core(calibration, ranks_per_node, options)


def _cores_all_busy(options: dict, profile: StepProfile, calibration: dict) -> bool:
    """A CPU node whose every core runs exactly one rank's compute thread, where no overlap rule
    holds. A collective overlaps compute only where something else runs it: a GPU's copy engines
    and NCCL's own SMs, an idle core, or, with more ranks than cores, another rank computing while
    this one waits. With one rank per core, gloo's threads take their time from the ranks'
    compute: nothing is hidden. Measured: ZeRO-3 at 2 ranks on 2 cores stepped in 209 ms, against
    128 ms predicted with half its communication hidden and 170 ms with none. At 4 ranks on 2
    cores (the ranks' compute 178 ms with all 4 stepping at once) DDP stepped in 196 ms with 45 ms
    of all-reduce, FSDP within 8-23 % of its rule's prediction and 20-42 % above the one with
    nothing hidden; allreduce, whose reductions follow backward on every rank at once, as
    predicted (250 ms)."""
    device = options.get("device")
    if calibration["compute"].get("per_device"):  # a GPU preset
        return False
    if device not in ("cpu", "cuda"):  # "auto": what the calibration ran on
        device = "cuda" if calibration.get("backend") == "nccl" else "cpu"
    if device != "cpu":
        return False
    cores = calibration["compute"]["cores"]
    ranks = options.get("ranks_per_node") or profile.world_size
    return ranks * max(1, cores // ranks) == cores


def _shared_core(calibration: dict, ranks_per_node: int, options: dict) -> float:
    """The share of its cores a rank computes on when all the node's ranks compute (1 on a device
    preset: a GPU each)."""
    c = calibration["compute"]
    if c.get("per_device"):
        return 1.0
    cores = c["cores"]
    return core_share(cores, ranks_per_node, rank_threads(cores, ranks_per_node, options.get("cpus_per_task")))


def predict_step_time(profile: StepProfile, calibration: dict, options: dict | None = None) -> dict:
    """compute_s, comm_s, exposed_comm_s, step_s, samples_per_s (and the parts) for one step.

    ``options``: name (strategy), stage (zero), stages and chunks (pipeline K and M),
    ranks_per_node (default: the world size, one node), model (to use its measured efficiency)."""
    options = {"name": profile.strategy, **(options or {})}
    ranks_per_node = options.get("ranks_per_node") or profile.world_size
    rate, rate_note = compute_rate(calibration, ranks_per_node, options.get("model"), options.get("precision", "fp32"),
                                   options.get("cpus_per_task"))
    compute_s = profile.flops / rate
    timed = (calibration["compute"].get("models") or {}).get(options.get("model")) or {}
    share = _shared_core(calibration, ranks_per_node, options)
    _, overlap = rule(options)
    stages = options.get("stages") or profile.world_size
    stage_share, stage_s = profile.stage_share, timed.get("stage_s") if timed.get("strategy") == profile.strategy else None
    timed_stages = stage_s if overlap.bubble and stage_s and len(stage_s) == stages else None
    if timed_stages:
        # Its stages timed one by one through its own schedule (stage_time): the busiest stage's
        # step, and its share of them all, rather than its share of the FLOPs of the whole
        # model's step, which gives a stage of many FLOPs and few weights the optimizer's time
        # of all of them, and knows nothing of what the schedule costs (GPipe keeps every chunk's
        # activations until its backward: ResNet-18's first stage stepped in 70 ms through GPipe,
        # 64 ms through 1F1B).
        compute_s, stage_share = max(timed_stages) / share, max(timed_stages) / sum(timed_stages)
        rate_note = f"its {stages} stages timed one by one when predicted"
    if timed.get("strategy") == profile.strategy != "single":
        # Timed as one rank of its own (model_time): what its code costs a rank, copies included,
        # timed on a core of its own; run on its share of one, as the model's compute is.
        compute_s += timed.get("overhead_s", 0.0) / share
        copy_s = 0.0
    else:
        copy_s = copy_time_s(profile, calibration, ranks_per_node)
    per_kind = comm_time_s(profile, calibration, options, compute_s)
    if overlap.bubble:  # the profile counts the first stage's calls; the step's path holds these
        per_kind = {k: t * path_calls_factor(k, timed_stages, stages) for k, t in per_kind.items()}
    comm_s = sum(per_kind.values())
    window_s = compute_s * (BACKWARD_SHARE if overlap.window == "backward" else 1.0)
    # Collectives whose groups all call them at once on shared cores run while no rank computes.
    free = {k: t for k, t in per_kind.items() if not groups_in_lockstep(k, profile, calibration, options)}
    hidden_s = min(sum(overlap.share.get(k, 0.0) * t for k, t in free.items()), window_s)
    if _cores_all_busy(options, profile, calibration):
        hidden_s = 0.0
    if share < 1 and ((overlap.share and overlap.window == "backward") or overlap.back_to_back):
        # More ranks than cores, and no rank computes behind these calls:
        # - reductions that run behind the rank's own backward (DDP's buckets, on gloo's thread):
        #   every core is computing, so its rule's overlap does not hold (as with one rank per
        #   core), and the rank is not waiting while they run, so no other rank's compute hides
        #   them either. Measured at 4 ranks on 2 cores (mlp, cnn, seq2seq, autoencoder): with
        #   half hidden, DDP was predicted 29-40 % fast; with none, 2-14 %;
        # - calls that follow the backward on every rank at once (``back_to_back``: the
        #   hand-written all-reduce, one call per tensor): while one rank waits in the burst the
        #   others are in it too. Its price per call was timed so, in a burst on every rank
        #   (``alpha_beta.burst_alpha``). Measured at 4 ranks on 2 cores (16 runs, 8 models over
        #   three sets): with another rank's compute hiding the calls, predicted 3-35 % fast,
        #   every one; with nothing hidden, -23 .. +4 %.
        hidden_s = 0.0
    elif share < 1 and not overlap.bubble and not overlap.inside_compute:
        # More ranks than cores: while one rank waits in a collective, another computes on its
        # core, whatever the strategy's own overlap. Not for calls inside the compute
        # (``Overlap.inside_compute``), whose price, timed between slices of compute with every
        # rank stepping, holds that already: tensor parallelism at 4 ranks on 2 cores (6 runs:
        # MLPs and transformers) was predicted 13-43 % fast with it, -8 .. +22 % without.
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
            "overlap_rule": overlap.why, **({"schedule_simulated_s": simulated["step_s"]} if simulated else {})}


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
    size, link = group_of("send", options, profile)
    fit = _fit("send", size, link, profile, calibration, options)
    return pipeline_schedule.predicted_step(schedule, steps, chunks, BACKWARD_SHARE, fit,
                                            profile.comm_bytes.get("send", 0) / sends)
