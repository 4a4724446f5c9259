"""Which ranks a collective runs over and the fit that prices it (``group_of``, ``fit_for``), and
how a node's ranks share its cores when they compute and call at once (``shared_core``,
``group_slowdown``, ``groups_in_lockstep``, ``cores_all_busy``): the rules the time model
(``suite.planner.timing``) prices a step's collectives and overlap by, where ranks outnumber
cores or groups smaller than the node call together.
"""
from __future__ import annotations

from suite.common.threads import rank_threads
from suite.planner import alpha_beta, hardware
from suite.planner.profile import StepProfile


def core_share(cores: int, ranks_per_node: int, threads: int = 1) -> float:
    """The share of its threads' cores a rank gets: 1, or less when the node's ranks run more
    threads than it has cores (they share them)."""
    return min(1.0, cores / (max(1, ranks_per_node) * threads))


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


def fit_for(kind: str, size: int, link: str, profile: StepProfile, calibration: dict, options: dict) -> dict:
    """The α-β fit that prices ``kind`` over a group of ``size`` across ``link``: the fits timed
    with the node's ranks at once for a message on shared cores (``message_fits``), else at the
    group's size (``group_fits``), else the link class's; a kind the calibration does not time
    borrows a measured kind's (``alpha_beta.BORROWED``)."""
    fits = message_fits(kind, link, profile, calibration, options) or group_fits(calibration, size, link) \
        or hardware.link_fits(calibration, link)
    return fits[kind if kind in fits else alpha_beta.BORROWED.get(kind)]


def group_fits(calibration: dict, size: int, link: str) -> dict | None:
    """The fits the calibration timed at the group's size over this link class, or None. At
    more ranks than cores peers wait for a core, which the formulas' extrapolation over N cannot
    carry: where a group's own size was timed, its fits stand, else the link class's."""
    measured = calibration.get("links") or {"intra": True}  # a calibration from before link classes: one node
    return (calibration.get("collectives_by_world") or {}).get(str(size)) if link in measured else None


def message_fits(kind: str, link: str, profile: StepProfile, calibration: dict, options: dict) -> dict | None:
    """For a send or receive on a node with more ranks than cores: the fits the calibration timed
    with all the node's ranks at once (None where it did not, or where each rank has a core).

    A pair of ranks timed alone finds idle cores; in the run, the receiver, and the gloo thread that
    takes its message in, wait for a core the node's other ranks hold: several times the idle
    time. The calibration at the node's rank count times each rank's sends between slices of
    compute while every rank steps (``time_in_step``), which is that wait (figures:
    benchmarks/results/code-rules.md)."""
    if kind not in ("send", "recv"):
        return None
    per_node = options.get("ranks_per_node") or profile.world_size
    if shared_core(calibration, per_node, options) >= 1:
        return None
    return group_fits(calibration, per_node, link)


def groups_fit(kind: str, size: int, ranks_per_node: int, calibration: dict) -> dict | None:
    """The fit of ``kind`` the calibration timed over groups of ``size`` with every group of a
    node's ``ranks_per_node`` ranks calling at once (``rank_timings.time_in_groups``), or None."""
    timed = ((calibration.get("collectives_in_groups") or {}).get(str(ranks_per_node)) or {}).get(str(size)) or {}
    return timed.get(kind)


def group_slowdown(kind: str, size: int, link: str, profile: StepProfile, calibration: dict, options: dict) -> float:
    """What a call of ``kind`` over its group waits longer than its group's fit says, where the
    node's other groups call theirs at once on the cores they share (``groups_sharing_cores``;
    1 for sends and receives, which are staggered, and where the group's size was not timed)."""
    if kind in ("send", "recv") or not group_fits(calibration, size, link):
        return 1.0
    return groups_sharing_cores(calibration, size, options.get("ranks_per_node") or profile.world_size, options)


def groups_in_lockstep(key: str, profile: StepProfile, calibration: dict, options: dict) -> bool:
    """Whether the calls under ``key`` (a kind, or ``<kind>@data``: ``comm_time_s``) run over
    groups smaller than the node's ranks, all of which call them at the same point of the step on
    cores the ranks share (``groups_sharing_cores`` slows them for that). Every rank of the node
    is then in a collective at once: none computes while another waits, and no overlap rule hides
    them (figures: benchmarks/results/code-rules.md)."""
    kind, _, data = key.partition("@")
    return group_slowdown(kind, *group_of(kind, options, profile, data=bool(data)), profile, calibration, options) > 1


def groups_sharing_cores(calibration: dict, size: int, ranks_per_node: int, options: dict) -> float:
    """How much slower a collective over a group of ``size`` runs than the calibration timed it
    (``size`` ranks alone on the node) when the node's ``ranks_per_node`` ranks run their groups'
    collectives at once on fewer cores: the ratio of the cores each rank gets. Every group of a
    data-parallel or tensor-parallel axis calls its collective at the same point of the step
    (point-to-point sends between pipeline stages are staggered: not counted so).

    The ratio slows each call's latency, the wait for a core (``timing._kind_time_s``), not its
    bytes, which slowed so over-predict bandwidth-bound models. The bytes move at the rate the
    calibration timed with every group at once where it did (``groups_fit``), which is less than
    the cores' ratio (figures: benchmarks/results/code-rules.md)."""
    if size >= ranks_per_node:
        return 1.0
    return shared_core(calibration, size, options) / shared_core(calibration, ranks_per_node, options)


def cores_all_busy(options: dict, profile: StepProfile, calibration: dict) -> bool:
    """A CPU node whose every core runs exactly one rank's compute thread, where no overlap rule
    holds. A collective overlaps compute only where something else runs it: a GPU's copy engines
    and NCCL's own SMs, an idle core, or, with more ranks than cores, another rank computing while
    this one waits. With one rank per core, gloo's threads take their time from the ranks'
    compute: nothing is hidden (figures: benchmarks/results/code-rules.md)."""
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


def shared_core(calibration: dict, ranks_per_node: int, options: dict) -> float:
    """The share of its cores a rank computes on when all the node's ranks compute (1 on a device
    preset: a GPU each)."""
    c = calibration["compute"]
    if c.get("per_device"):
        return 1.0
    cores = c["cores"]
    return core_share(cores, ranks_per_node, rank_threads(cores, ranks_per_node, options.get("cpus_per_task")))
