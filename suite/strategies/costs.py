"""What a strategy tells the planner (``suite.planner``) about its costs: its rules, declared on its
own ``Options`` class, so that a new strategy is one file and the planner keeps no table keyed by
strategy names. The rules speak the planner's vocabulary (collective kinds ``all_reduce``,
``all_gather``, ``reduce_scatter``, ``broadcast``; bytes and calls per rank per optimizer step, as
``suite.planner.profile`` counts them), and the small types they share live here: the strategies
never import the planner. docs/architecture.md, "A strategy's rules".

Every strategy declares (``StrategyOptions`` leaves each None, and the planner refuses a strategy
that leaves one so, naming it: ``require``):

- ``comm_rule(step: StepSizes) -> Comm``: its collectives per step by the analytic rule, from the
  rank's gradient and parameter bytes, the model's units and tensors and the layout (``{}``: it
  communicates nothing, or nothing the rule can count). Never asked at world size 1.
- ``overlap: Overlap`` (a class attribute, or a property): how much of it hides under compute.
- ``cannot_fake: str``: why the planner must not try its real code on fake tensors and takes the
  analytic rule instead, or "" where it tries (a try that fails falls back too, saying why).
- ``search_space(world_size) -> list[dict]``: the strategy sections (``name`` and keys) an advisor
  should try at that world size; ``[]`` where there is nothing to choose.

and, where it has any (none by default: ``StrategyOptions``), the bytes it copies or allocates
beside what a rank holds: ``copy_bytes``, ``persistent_buffer_bytes``, ``pass_buffer_bytes``, and
``optimizer_temporary_bytes`` where its optimizer steps other tensors than the bare model's.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from suite.common.errors import SuiteError
from suite.strategies.layout import Layout

Comm = dict[str, tuple[int, int]]  # collective kind -> (bytes, calls), per rank per optimizer step

# Rule -> what it is, for the planner's refusal; docs/architecture.md, "A strategy's rules".
RULES = {"comm_rule": "communication rule", "overlap": "overlap rule",
         "cannot_fake": "fake-run capability", "search_space": "search space"}


@dataclass(frozen=True)
class Overlap:
    """Which collective kinds may run while the rank computes, the share of their time assumed
    hidden, and under which part of the compute ("backward" or "step": forward + backward);
    ``bubble``: the strategy pipelines stages, which idle (K-1)/(M+K-1) of the step;
    ``back_to_back``: its calls follow one another with no compute between them (after backward),
    so each costs what the calibration measured for a call in such a burst (``alpha_beta.
    burst_alpha``) rather than a call between slices of compute; ``inside_compute``: its calls sit
    between pieces of the rank's forward and backward, each of which waits for the call before it
    (tensor parallelism's all-reduces), as the calibration's calls between slices of compute sit
    (``rank_timings.time_in_step``, timed with every rank of the node stepping), so what another rank
    computes on a shared core while one waits is in their price already: nothing more is hidden.
    ``gpu_stream``: the kinds that on a GPU run on NCCL's own stream while the window computes
    (``share`` is the CPU's, where gloo's threads take cores from the compute): every call hidden
    but the one that must come first or last (the step's first gather, the last bucket's
    reduction), up to the window's length."""
    share: dict[str, float] = field(default_factory=dict)
    window: str = "backward"
    why: str = ""
    bubble: bool = False
    back_to_back: bool = False
    inside_compute: bool = False
    gpu_stream: tuple = ()


NO_COMMUNICATION = Overlap(why="no communication")
AFTER_BACKWARD = Overlap(why="one all-reduce of every gradient after backward: nothing hidden", back_to_back=True)
NOTHING_HIDDEN = Overlap(why="nothing assumed hidden: no overlap of its communication is modelled")
PREFETCHED_UNITS = Overlap(
    {"all_gather": 0.5, "reduce_scatter": 0.5}, "step",
    "forward/backward prefetch all-gathers the next unit's parameters while this one computes; "
    "reduce-scatters run behind backward: half assumed hidden under forward + backward on a CPU, "
    "all but the first gather and the last reduce-scatter on a GPU's collective stream",
    gpu_stream=("all_gather", "reduce_scatter"))
PIPELINED = Overlap(why="activations sent between stages are on the critical path; the bubble "
                        "(K-1)/(M+K-1) idles each stage", bubble=True)


@dataclass(frozen=True)
class StepSizes:
    """One rank's step as the planner sizes it (``suite.planner.analytic``), for a strategy's rules.
    Bytes in the model's dtype as built (fp32), before any sharding."""
    layout: Layout
    gradient_bytes: int  # G: this rank's model gradients (its stage's, under a pipeline)
    parameter_bytes: int  # P: this rank's model parameters, likewise
    parameter_tensors: int  # the model's parameter tensors
    units: tuple[int, ...] = ()  # parameter bytes of each unit a sharding strategy gathers at a time
    largest_tensor_bytes: int = 0  # the model's largest parameter
    model_parameter_bytes: int = 0  # the whole model's parameters
    optimizer_bytes: int = 0  # the bare model's optimizer temporaries (all of them, not split)
    parts: int = 1  # ranks sharing one replica (pipeline stages x tensor ranks)
    cuda: bool = False  # the rank computes on a GPU
    boundary_bytes: int = 0  # the largest output of a top-level block, at the accumulation batch
    batchnorm_channels: tuple[int, ...] = ()  # each batch-norm layer's channels (synced: training.sync_batchnorm)
    model_name: str = ""  # model.name
    # Each linear layer, in order: (name, input bytes, output bytes, whether its input needs a
    # gradient), at the accumulation batch (tensor parallelism's all-reduces are sized by them).
    linears: tuple = ()
    # Where the model publishes (or the recipe gives) its tensor-parallel plan: each split linear
    # layer's role, (name, "colwise" | "colwise_gather_output" | "rowwise") pairs; empty for the
    # built-ins' own layouts
    tensor_roles: tuple = ()


def data_parallel_all_reduce(step: StepSizes) -> Comm:
    """The data-parallel rule: one all-reduce of the rank's gradients over its data-parallel
    group, when it has peers."""
    return {"all_reduce": (step.gradient_bytes, 1)} if step.layout.dp_size > 1 else {}


def synced_batchnorm(step: StepSizes) -> Comm:
    """Batch norm synced over the data-parallel ranks (``suite.strategies.batchnorm``), whatever
    the strategy: per layer and forward pass one all-gather of each rank's (count, mean,
    variance), and one all-reduce of (sum dy, sum dy * x_hat) in backward; a pass per
    accumulation step and pipeline chunk, over this rank's stage's share of the layers. Small
    messages between compute: each call costs its latency in full."""
    if step.layout.dp_size < 2 or not step.batchnorm_channels:
        return {}
    stages = step.layout.degree("pipeline")
    passes = step.layout.accumulation_steps * step.layout.pipeline_chunks
    layers = max(1, -(-len(step.batchnorm_channels) // stages))
    channels = sum(step.batchnorm_channels) // stages
    return {"all_gather": (passes * step.layout.dp_size * (2 * channels + layers) * 4, passes * layers),
            "all_reduce": (passes * 2 * channels * 4, passes * layers)}


def merged(*comms: Comm) -> Comm:
    """Several rules' {kind: (bytes, calls)} added up kind by kind."""
    out: dict = {}
    for comm in comms:
        for kind, (n_bytes, calls) in comm.items():
            b, c = out.get(kind, (0, 0))
            out[kind] = (b + n_bytes, c + calls)
    return out


def stage_messages(step: StepSizes) -> Comm:
    """A pipeline's messages between stages, as its first stage (rank 0) sees them: each chunk's
    activation sent forward and its gradient received back, at most the largest output of a
    top-level block (where the split falls is the strategy's choice)."""
    chunks = step.layout.pipeline_chunks
    if step.layout.degree("pipeline") < 2 or not step.boundary_bytes:
        return {}
    return {"send": (step.boundary_bytes, chunks), "recv": (step.boundary_bytes, chunks)}


def sharded_units(step: StepSizes, gathers: int) -> Comm:
    """ZeRO-3 and FSDP: each unit's parameters all-gathered ``gathers`` times (before its forward,
    and again before its backward where they were freed after forward), its gradients
    reduce-scattered once; a call per unit and pass."""
    n = len(step.units) or 1
    return {"all_gather": (gathers * step.parameter_bytes, gathers * n), "reduce_scatter": (step.gradient_bytes, n)}


def gathered_units_bytes(step: StepSizes) -> int:
    """What a sharding strategy holds gathered during the passes at its most: the largest unit's
    parameters and full gradients, and the next unit's parameters (prefetched)."""
    largest, following = (sorted(step.units, reverse=True) + [0, 0])[:2]
    return 2 * largest + following


def divisors(n: int, at_least: int = 2) -> list[int]:
    """The divisors of ``n`` from ``at_least`` up: the degrees a search space may give an axis."""
    return [d for d in range(at_least, n + 1) if n % d == 0]


def sharded_optimizer_temporaries(step: StepSizes) -> int:
    """The optimizer's temporaries where it steps a 1/dp shard of each parameter (FSDP)."""
    return step.optimizer_bytes // step.parts // step.layout.dp_size


class ShardedUnits:
    """The byte rules every unit-sharding strategy (FSDP2, torch FSDP1, fairscale FSDP) shares: a
    mixin for its options class. Each unit's parameters are gathered twice per step and its
    gradients reduce-scattered once (``sharded_units``); the passes hold the largest unit and the
    prefetched next one gathered; the optimizer steps a 1/dp shard."""

    # FSDP2, FSDP1 and fairscale allocate each gather's buffer on an all-gather stream and each
    # reduce-scatter's input on a reduce-scatter stream, so that they overlap compute.
    side_stream_collectives: ClassVar = ("all_gather", "reduce_scatter")

    def comm_rule(self, step: StepSizes) -> Comm:
        return sharded_units(step, gathers=2)

    def pass_buffer_bytes(self, step: StepSizes) -> int:
        return gathered_units_bytes(step)

    def optimizer_temporary_bytes(self, step: StepSizes) -> int:
        return sharded_optimizer_temporaries(step)


def undeclared(options_class) -> list[str]:
    """The rules (``RULES``) a strategy's options class leaves undeclared."""
    return [rule for rule in RULES if getattr(options_class, rule, None) is None]


def require(options, *rules: str) -> None:
    """SuiteError, in one line, where the strategy (its options or their class) leaves one of
    ``rules`` (default: all) undeclared."""
    cls = options if isinstance(options, type) else type(options)
    missing = [r for r in undeclared(cls) if r in (rules or RULES)]
    if missing:
        name = cls.model_fields["name"].default if "name" in getattr(cls, "model_fields", {}) else cls.__name__
        what = ", ".join(f"{RULES[r]} ({r})" for r in missing)
        raise SuiteError(f"strategy {name!r} declares no {what} on its options class; every strategy declares "
                         f"its rules: see docs/architecture.md, \"A strategy's rules\"")
