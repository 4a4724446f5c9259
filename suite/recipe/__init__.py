"""Recipes: the YAML that names model, data, strategy, optimizer, training, launch and tracking.

``load(path, overrides)`` reads a recipe, applies ``a.b=c`` overrides, expands its ``sweep``
block into one recipe per point (``suite.recipe.text``) and validates each. Every error names the
key path, the bad value and what would be accepted, as a ``SuiteError``.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, PrivateAttr,
                      ValidationError)

from suite.data import DATASETS
from suite.common import cpu_cap
from suite.common.errors import SuiteError
from suite.recipe.schedule import Schedule
from suite.models import MODELS
from suite.strategies.layout import ModelInfo, Layout, build as build_layout
from suite.recipe.text import (NAME_KEYS, apply_override, check_name, check_plain, expand_sweep, named_targets,  # noqa: F401
                               raw_points, read, set_path, shown)
from suite.strategies import STRATEGIES, keys as strategy_keys
from suite.models import source
from suite.models import build as build_model, empty


def _union(options_classes):
    classes = tuple(options_classes)
    return Annotated[Union[classes], Field(discriminator="name")] if len(classes) > 1 else classes[0]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Optimizer(Strict):
    name: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: PositiveFloat = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: Annotated[list[float], Field(min_length=2, max_length=2)] = [0.9, 0.999]
    schedule: Schedule = Schedule()  # lr per step: constant, step or cosine, with warm-up (suite.recipe.schedule)


class Training(Strict):
    epochs: PositiveInt = 1
    max_steps: Optional[PositiveInt] = None  # stop after this many optimizer steps in all
    batch_size: PositiveInt = 64  # global: samples per optimizer step, summed over data-parallel ranks
    grad_accumulation: PositiveInt = 1  # forward/backward passes per optimizer step on each rank
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0  # what torch.manual_seed takes
    # fp64: float64 parameters, inputs and arithmetic, for parity checks that rounding order
    # cannot decide (suite.verify, tests); not a training mode for speed
    precision: Literal["fp32", "bf16", "fp16", "fp64"] = "fp32"
    # Recompute each top-level block's activations in backward: true (all of them) or selective
    # (all but attention's and every other matmul's outputs: torchtitan's selective op checkpointing)
    activation_checkpointing: Union[bool, Literal["selective"]] = False
    compile: bool = False  # torch.compile each top-level block (needs a C++ compiler on CPU)
    # Batch norm over the global batch under data parallelism, as single computes it (else per rank)
    sync_batchnorm: bool = True
    # Largest global L2 norm of the gradients (whole model, all ranks) before each optimizer step:
    # scaled down to it as torch.nn.utils.clip_grad_norm_ does; None: no clipping (suite.strategies.clip)
    grad_clip_norm: Optional[PositiveFloat] = None
    eval_every_epochs: NonNegativeInt = 1  # 0: never evaluate
    log_every_steps: PositiveInt = 10
    checkpoint_every_steps: NonNegativeInt = 0  # 0: only when preempted or timed out
    # A checkpoint after the last step, so that a completed run keeps its trained model for
    # python -m suite.export (--model, --hf); false where only the measurements matter (benchmarks).
    # The torch strategies' loop saves it; TensorFlow's strategies save no checkpoints at all.
    keep_final_weights: bool = True
    # Each initial weight times (1 + this x a seeded standard normal draw): a run one rounding
    # error away from the unperturbed one, whose distance from it over the steps is the noise
    # floor suite.verify judges a strategy against. 0: the weights as the seed makes them.
    init_perturbation: Annotated[float, Field(ge=0, le=1e-3)] = 0.0
    # How the global batch is split over the data-parallel ranks (suite.train.balance): equal
    # (batch_size / ranks each), speed (in proportion to each rank's speed, measured over the first
    # steps) or shares (training.balance_shares). The global batch holds the same samples either
    # way and the loss is weighted so the gradient stays its mean: the losses are single's.
    balance: Literal["equal", "speed", "shares"] = "equal"
    # balance=shares: samples per data-parallel rank, in rank order, summing to batch_size
    balance_shares: Optional[list[PositiveInt]] = None
    # Fault injection, for studies of restarts and for tests: RANK:STEP:kill (SIGKILL after that
    # step), RANK:STEP (an error), RANK:STEP:pause; @A fires it in attempt A only; comma-separated.
    # The same as $SCALESUITE_FAIL_AT (both apply; suite.train.loop._maybe_fail).
    fail_at: Annotated[str, Field(pattern=r"^$|^\d+:\d+(:(kill|pause))?(@\d+)?(,\d+:\d+(:(kill|pause))?(@\d+)?)*$")] = ""


class Launch(Strict):
    # mpi: local ranks under mpirun; torchrun: recorded by `torchrun -m suite.train` (its agents
    # started the ranks, on launch.nodes nodes), never one suite.submit starts
    executor: Literal["local", "slurm", "debug", "mpi", "torchrun"] = "local"
    nodes: PositiveInt = 1
    tasks_per_node: PositiveInt = 1  # one task per rank
    devices_per_task: PositiveInt = 1  # devices one rank drives (layer-wise model parallel)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: CUDA when the rank has a GPU
    cpus_per_task: Optional[PositiveInt] = None  # default: the node's cores / tasks_per_node
    gpus_per_node: NonNegativeInt = 0
    mem_gb: Optional[PositiveFloat] = None
    timeout_min: PositiveInt = 60
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    sbatch_extra: dict[str, Any] = {}
    array_parallelism: PositiveInt = 16  # sweep points running at once on Slurm
    signal_delay_s: PositiveInt = 90  # SIGUSR2 this long before the time limit: checkpoint, requeue
    collective_timeout_s: PositiveInt = 300  # a rank stuck this long in a collective fails the run
    mpi: bool = False  # slurm: the tasks are MPI ranks (srun --mpi=pmix); executor mpi: always
    # The network interface ranks talk on (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); default: the one
    # the route to the rendezvous address leaves by (suite.common.network).
    interface: Optional[str] = None
    # Automatic restarts: a run that fails because a rank died (killed, crashed, node lost) is
    # submitted again by the follower, from its last complete checkpoint, up to this many times
    # (on Slurm without the failed node where the run still fits). Never for bad input or a cancel.
    # 0 by default: a restart repeats whatever failed, which for a bug only costs time; and a run
    # that fails should say so at once unless its owner asked for retries (docs/running.md).
    max_restarts: NonNegativeInt = 0
    # A restart after a node is lost may continue on fewer nodes (Slurm), when the node has not
    # come back within elastic_wait_s: the same global batch through gradient accumulation, from
    # the last checkpoint, which must be strategy-neutral (suite.submit.restart; docs/running.md).
    elastic: bool = False
    elastic_wait_s: NonNegativeInt = 60
    # Slow ranks on purpose: the share of its CPUs each rank may use, in rank order, e.g. [100%, 50%]
    # (ranks past the list, and 100%, uncapped); a capped rank caps itself through cgroup v1's cpu
    # controller (suite.common.cpu_cap: root, cgroup v1). A whole Slurm node: slurm/start.sh --node-cpu n2=50%.
    rank_cpu: list[str] = []

    @property
    def mpi_ranks(self) -> bool:
        """Whether the ranks are MPI ranks: mpirun's (executor mpi) or srun's with launch.mpi."""
        return self.executor == "mpi" or (self.executor == "slurm" and self.mpi)

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node


class Tracking(Strict):
    wandb: Literal["offline", "online", "disabled"] = "offline"  # $WANDB_MODE overrides
    project: str = "scalesuite"
    entity: Optional[str] = None
    sample_interval_s: PositiveFloat = 1.0  # utilisation sampler and W&B system metrics
    # The live W&B run logs what the run record gained at most this often (suite.record.wandb_live)
    wandb_every_s: PositiveFloat = 10.0
    # W&B group: suite.study sets the study's, a sweep its recipe's name; else the recipe's name
    wandb_group: Optional[str] = None
    peak_flops_per_s: Optional[PositiveFloat] = None  # per device, for MFU; wins over the table and measuring
    measure_peak: bool = True  # CPU: MFU against this node's measured peak (suite.record.peak, cached per machine)


# Keys added after runs had been recorded: left out of the fingerprint at their defaults, so that a
# recipe not using them keeps the fingerprint its earlier runs have (analysis groups repeats by it).
# training.sync_batchnorm too: it changes nothing for a model without batch norm (every recipe
# before it came); runs of a batch-norm model under data parallelism recorded before it normalised
# per rank, and would now group with synced runs.
_LATER_KEYS = (("optimizer", "schedule"), ("data", "normalize"), ("data", "augment"), ("training", "sync_batchnorm"),
               ("training", "grad_clip_norm"), ("strategy", "transport"), ("training", "init_perturbation"),
               ("training", "balance"), ("training", "balance_shares"), ("training", "fail_at"))


class Recipe(Strict):
    """One run: what to train, how to split it, how to launch it."""
    name: str  # names the run folder: load() refuses what is not a file-name slug (check_name)
    arm: Optional[str] = None  # the study arm this run belongs to (python -m suite.study); reports name it
    model: _union(o for o, _ in MODELS.values())
    data: _union(DATASETS.values())
    strategy: _union(s.Options for s in STRATEGIES.values())
    optimizer: Optimizer = Optimizer()
    training: Training = Training()
    launch: Launch = Launch()
    tracking: Tracking = Tracking()
    sweep: dict[str, list[Any]] = {}  # key path -> values; expanded before validation
    _layout: Optional[Layout] = PrivateAttr(None)

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    def layout(self) -> Layout:
        """How the ranks and the batch are split (``suite.strategies.layout``); worked out once."""
        if self._layout is None:
            tr = self.training
            self._layout = build_layout(self.strategy, world_size=self.world_size, batch_size=tr.batch_size,
                                    accumulation_steps=tr.grad_accumulation,
                                    devices_per_task=self.launch.devices_per_task, precision=tr.precision)
        return self._layout

    def model_info(self) -> ModelInfo:
        """What strategies' checks may know of the model: name, task, and its meta-device build."""

        def build_meta():
            return empty.on_meta(lambda: build_model(self.model, self.data.spec()))  # shapes only: no memory

        return ModelInfo(name=self.model.name, task=self.model.task, source=source(self.model),
                         build_meta=build_meta)

    def fingerprint(self) -> str:
        """Hash of what determines the numbers (everything but launch and tracking)."""
        d = self.model_dump(mode="json", exclude={"launch", "tracking", "sweep", "name", "arm"})
        for section, key in _LATER_KEYS:  # at their defaults they change nothing: leave them out
            options = getattr(self, section)
            field = type(options).model_fields.get(key)
            if field is not None and getattr(options, key) == field.default:
                d[section].pop(key)
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


# ---- loading -----------------------------------------------------------------------------

def load(path: str | Path, overrides: list[str] = ()) -> list[Recipe]:
    """Read a recipe file, apply ``key.path=value`` overrides, expand the sweep, validate."""
    return [validate(point) for point in raw_points(path, overrides)]


def validate(raw: dict) -> Recipe:
    check_plain(raw)
    raw = named_targets(raw)  # model: {target: ...} alone is a custom model
    try:
        # Strict: true is not 1 and 1.5 is not 1; JSON mode still reads a list as a tuple, an int as a float.
        recipe = Recipe.model_validate_json(json.dumps(raw), strict=True)
    except ValidationError as e:
        raise SuiteError(format_error(e.errors()[0], raw)) from None
    check(recipe)
    return recipe


def check(recipe: Recipe) -> None:
    """Checks that need more than one key: degrees against world size and batch divisibility
    (the layout), then the strategy's own rules, the lr schedule's and the data options', and
    the training and optimizer keys the strategy cannot honour (``suite.strategies.keys``)."""
    recipe.strategy.check(recipe.layout(), recipe.model_info())
    recipe.strategy.check_launch(recipe.launch)
    if recipe.training.precision == "fp64" and recipe.strategy.no_fp64:
        raise SuiteError(f"training.precision=fp64 with strategy {recipe.strategy.name}: {recipe.strategy.no_fp64}; "
                         f"use training.precision=fp32")
    recipe.optimizer.schedule.check(recipe.optimizer.lr)
    recipe.data.check()
    strategy_keys.check(recipe)  # keys outside strategy.* the strategy cannot honour (TensorFlow's)
    check_balance(recipe)
    launch = recipe.launch
    if launch.executor == "local" and launch.nodes != 1:
        raise SuiteError(f"launch.executor=local runs on this machine only, but launch.nodes={launch.nodes}; "
                         "set launch.nodes=1, or use launch.executor=slurm")
    if launch.elastic:
        check_elastic(recipe)
    if launch.executor == "mpi" and launch.nodes != 1:
        raise SuiteError(f"launch.executor=mpi starts the ranks with mpirun on this machine, but launch.nodes="
                         f"{launch.nodes}; set launch.nodes=1 (on a cluster: launch.executor=slurm)")
    if launch.mpi and launch.executor in ("local", "debug"):
        raise SuiteError(f"launch.mpi=true makes Slurm's tasks MPI ranks, but launch.executor={launch.executor}; "
                         f"use launch.executor=mpi for MPI ranks on this machine")
    if getattr(recipe.strategy, "transport", "torch") == "mpi" and not launch.mpi_ranks:
        raise SuiteError(f"strategy.transport=mpi exchanges gradients through MPI, which needs MPI ranks, but "
                         f"launch.executor={launch.executor} does not start them; set launch.executor=mpi "
                         f"(on Slurm: launch.mpi=true), or strategy.transport=torch")
    if launch.executor == "debug" and launch.world_size != 1:
        raise SuiteError(f"launch.executor=debug runs one rank in this process, but the recipe asks for "
                         f"world size {launch.world_size}; use launch.executor=local, or tasks_per_node=1")
    for rank, share in enumerate(launch.rank_cpu):
        cpu_cap.percent(share, f"launch.rank_cpu.{rank}")
    if len(launch.rank_cpu) > launch.world_size:
        raise SuiteError(f"launch.rank_cpu gives {len(launch.rank_cpu)} ranks a share, but the run has "
                         f"{launch.world_size}; give at most one per rank, in rank order")
    if recipe.training.precision == "fp16" and recipe.launch.device == "cpu" and recipe.strategy.fp16_needs_gpu:
        raise SuiteError(f"training.precision=fp16 with strategy {recipe.strategy.name} needs a GPU "
                         f"({recipe.strategy.fp16_needs_gpu}); use bf16 on CPU")


def check_elastic(recipe: Recipe) -> None:
    """launch.elastic: restarts that may continue on fewer Slurm nodes, from a checkpoint any
    world size can load."""
    launch = recipe.launch
    if launch.executor != "slurm":
        raise SuiteError(f"launch.elastic=true continues a run on fewer Slurm nodes when one is lost, but "
                         f"launch.executor={launch.executor}; use launch.executor=slurm, or drop launch.elastic")
    if launch.max_restarts < 1:
        raise SuiteError("launch.elastic=true acts when a run restarts, but launch.max_restarts=0; "
                         "set launch.max_restarts to 1 or more")
    if recipe.strategy.no_neutral_checkpoint:
        raise SuiteError(f"launch.elastic=true resumes at a smaller world size, but strategy {recipe.strategy.name}'s "
                         f"checkpoints resume only at their own ({recipe.strategy.no_neutral_checkpoint}); "
                         f"use ddp, fsdp, tensor, pipeline or zero stage 3, or drop launch.elastic")


def check_balance(recipe: Recipe) -> None:
    """training.balance other than equal: a strategy whose ranks each train their part of the
    batch through the shared step and average gradients over the ranks (its ``uneven_batches``),
    and shares that fit the layout."""
    tr, layout = recipe.training, recipe.layout()
    if tr.balance_shares is not None and tr.balance != "shares":
        raise SuiteError(f"training.balance_shares is set but training.balance={tr.balance}; "
                         f"set training.balance=shares, or leave training.balance_shares out")
    if tr.balance == "equal":
        return
    if not type(recipe.strategy).uneven_batches:
        able = ", ".join(n for n, s in STRATEGIES.items() if getattr(s.Options, "uneven_batches", False))
        shares = f" (training.balance_shares={tr.balance_shares})" if tr.balance_shares else ""
        raise SuiteError(f"training.balance={tr.balance}{shares} gives ranks unequal parts of the batch, which strategy "
                         f"{recipe.strategy.name} cannot train (its ranks do not each average a data-parallel "
                         f"gradient through the shared step); set training.balance=equal, or use {able}")
    if tr.balance == "shares":
        shares = tr.balance_shares or []
        if len(shares) != layout.dp_size or sum(shares) != tr.batch_size:
            raise SuiteError(f"training.balance_shares={shares} must give each of the {layout.dp_size} data-parallel "
                             f"ranks its samples, summing to training.batch_size={tr.batch_size}")
        if min(shares) < tr.grad_accumulation:
            raise SuiteError(f"training.balance_shares={shares}: every rank needs at least training.grad_accumulation="
                             f"{tr.grad_accumulation} samples (one per pass)")


# ---- error messages -----------------------------------------------------------------------

_TAGGED = {"model": MODELS, "data": DATASETS, "strategy": STRATEGIES}


def format_error(err: dict, raw: dict) -> str:
    loc = [str(p) for p in err["loc"]]
    # Drop the union tag pydantic puts in the location (model.mlp.hidden -> model.hidden).
    if len(loc) > 1 and loc[0] in _TAGGED and loc[1] in _TAGGED[loc[0]]:
        loc.pop(1)
    path = ".".join(loc) or "recipe"
    kind = err["type"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], raw)
        return f"unknown recipe key {path}; accepted here: {', '.join(allowed)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        section = loc[0]
        names = ", ".join(_TAGGED[section])
        got = (raw.get(section) or {}).get("name") if isinstance(raw.get(section), dict) else None
        if got is None:
            return f"{section}.name is missing; choose one of: {names}"
        return f"{section}.name={got!r} is not a known {section}; choose one of: {names}"
    if kind == "missing":
        return f"recipe key {path} is required"
    msg = " ".join(err["msg"].split())
    return f"{path}={shown(err.get('input'))}: {msg[:1].lower() + msg[1:]}"


def _allowed_keys(loc: list[str], raw: dict) -> list[str]:
    cls = Recipe
    for i, part in enumerate(loc):
        if part in _TAGGED and cls is Recipe:
            section = raw.get(part)
            entry = _TAGGED[part].get(section.get("name")) if isinstance(section, dict) else None
            cls = entry[0] if isinstance(entry, tuple) else getattr(entry, "Options", entry)
            if cls is None:
                return []
            continue
        if part not in cls.model_fields:
            return []
        ann = cls.model_fields[part].annotation
        cls = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if cls is None:
            return []
    return sorted(cls.model_fields)


def dump(recipe: Recipe) -> str:
    skip = {"sweep"} | ({"arm"} if recipe.arm is None else set())  # a run outside a study says nothing of arms
    return yaml.safe_dump(recipe.model_dump(mode="json", exclude=skip), sort_keys=False)
