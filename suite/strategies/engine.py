"""The Engine: the one interface between the training loop and every strategy.

The loop (``suite.train.loop``) calls only what is here; a strategy turns a model factory, an
optimizer factory and the distributed context (together: ``Setup``) into an Engine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from suite.common.errors import SuiteError
from suite.models.task import Task
from suite.strategies.layout import Layout
from suite.strategies import prepare

if TYPE_CHECKING:  # the per-rank side; strategies are also read (for their options) when submitting
    from suite.strategies.context import DistContext


@dataclass
class StepResult:
    loss: Optional[torch.Tensor]  # mean loss of this rank's samples; None where no loss is computed
    samples: int  # samples this rank's loss stands for (0 where loss is None)
    correct: Optional[torch.Tensor] = None  # correctly classified samples, where it applies
    grad_norm: Optional[torch.Tensor] = None  # global gradient norm before clipping; only when clipping
    # Where the step's time went on this rank (suite.strategies.clock), where the engine measures it:
    # its own work (forward, backward, optimizer step) and the time after its backward spent in
    # collectives (waiting for slower peers, then the transfer)
    compute_s: Optional[float] = None
    collective_s: Optional[float] = None
    # fp16 loss scaling (suite.strategies.scaling; DeepSpeed's own): whether an inf/NaN gradient
    # skipped the optimizer step, and the scale after it (where known); None where nothing scales
    skipped: Optional[bool] = None
    loss_scale: Optional[float] = None


@dataclass
class Setup:
    """What a strategy is given to build its Engine."""
    ctx: "DistContext"
    build_model: Callable[[], torch.nn.Module]  # same seed every call: identical initial weights
    make_optimizer: Callable  # params -> torch.optim.Optimizer
    task: Task
    layout: Layout  # mesh axes, data-parallel size, batch per rank, accumulation steps, pipeline chunks
    activation_checkpointing: bool = False  # training.activation_checkpointing (see prepare)
    compile: bool = False  # training.compile (see prepare)
    sync_batchnorm: bool = False  # training.sync_batchnorm (see prepare)
    grad_clip_norm: Optional[float] = None  # training.grad_clip_norm (see suite.strategies.clip)
    seed: int = 0
    run_dir: Optional[str] = None
    model_name: str = ""  # recipe model.name: strategies with per-model layouts (tensor) look it up
    # training.balance other than equal: ranks hold unequal parts of the global batch, and
    # ModuleEngine weights each pass's loss by its share (ModuleEngine.pass_weight)
    uneven_batches: bool = False

    @property
    def precision(self) -> str:
        return self.layout.precision

    def prepare(self, module: torch.nn.Module) -> torch.nn.Module:
        """Synced batch norm, activation checkpointing and compile, applied in place; every
        strategy calls this on the module it is about to wrap (``suite.strategies.prepare``
        says where)."""
        return prepare.prepare(module, activation_checkpointing=self.activation_checkpointing,
                               compile=self.compile, device=self.ctx.device,
                               batchnorm_group=self.batchnorm_group())

    def batchnorm_group(self):
        """The group batch norm computes its statistics over: this rank's data-parallel peers
        with ``sync_batchnorm`` and more than one of them, else None (per rank). Decided from
        the layout alone, never from the module: creating a group is collective, and a pipeline
        stage without batch norm must create it as the others do. Created once per Setup."""
        if not (self.sync_batchnorm and self.layout.dp_size > 1):
            return None
        if not hasattr(self, "_batchnorm_group"):
            from suite.strategies.batchnorm import data_parallel_group
            self._batchnorm_group = data_parallel_group(self.layout, self.ctx.rank)
        return self._batchnorm_group

    def autocast(self):
        return prepare.autocast(self.layout.precision, self.ctx.device)

    def accumulation_chunks(self, inputs, targets):
        """This rank's batch as ``layout.accumulation_steps`` forward/backward passes:
        ``(inputs, targets, last)`` each, ``last`` on the pass after which gradients are reduced."""
        # Unequal batches (training.balance): a share n does not divide gives unequal chunks, and
        # ModuleEngine.pass_weight weighs each by its samples.
        n = self.layout.accumulation_steps
        pairs = list(zip(inputs.chunk(n), targets.chunk(n))) if n > 1 else [(inputs, targets)]
        return [(x, y, i == len(pairs) - 1) for i, (x, y) in enumerate(pairs)]


class StepSums:
    """A step's loss (each pass's mean loss over the passes: the mean over the rank's batch)
    and correct count, summed over its accumulation passes without leaving the device; in
    float64, so an fp64 run's loss keeps its digits (and an fp32 one loses none in the sum)."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.float64, device=device)

    def add(self, loss: torch.Tensor, correct: torch.Tensor, passes: int) -> None:
        self.loss += loss.detach().double() / passes
        self.correct += correct

    def result(self, samples: int, grad_norm: Optional[torch.Tensor] = None) -> StepResult:
        return StepResult(loss=self.loss, samples=samples, correct=self.correct, grad_norm=grad_norm)


class NoFullModelState(SuiteError):
    """A strategy's engine cannot hand over its whole model (``Engine.full_model_state``)."""


class NoNeutralState(SuiteError):
    """A strategy's engine does not map its state to the plain model's names (``Engine.neutral_state``)."""


def full_state(module: torch.nn.Module, keep: bool) -> dict:
    """``module``'s state dict whole and on CPU, with the names of the module DDP wraps (if it
    does): sharded tensors (DTensor: FSDP2, tensor parallel, replicate) are all-gathered one at a
    time, so every rank of their mesh must call this; kept only where ``keep``, else {}."""
    from torch.distributed.tensor import DTensor

    plain = module.module if isinstance(module, DistributedDataParallel) else module
    out = {}
    for name, value in plain.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if keep:
            out[name] = value.detach().to("cpu", copy=True)
    return out


class Engine:
    """A strategy's running form on one rank.

    ``dp_rank``/``dp_size`` tell the loop which shard of the data this rank reads (ranks of
    one tensor/pipeline group share a shard).
    """
    dp_rank: int = 0
    dp_size: int = 1
    # Set by suite.strategies.build from the options: the strategy's name, and why its checkpoints
    # cannot be resumed by another strategy or world size ("" where they can: neutral_state).
    strategy: str = ""
    no_neutral_checkpoint: str = "its engine's state is not mapped to the plain model's parameter names"

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> StepResult:
        """One optimizer step on this rank's part of the global batch."""
        raise NotImplementedError

    def local_forward(self, inputs: torch.Tensor) -> None:
        """One forward pass of this rank's part of the model alone, without gradients or
        collectives, leaving every parameter, buffer and random state as it was: what
        training.balance=speed times to compare ranks' speeds (suite.train.balance). Only
        strategies that declare ``uneven_batches`` are asked."""
        raise NotImplementedError

    def optimizer_groups(self) -> list[dict]:
        """The param groups of the optimizer that steps, where the loop sets each step's lr (the
        wrapper's own where one copies them into an inner optimizer, as fairscale OSS does)."""
        raise NotImplementedError

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next optimizer step (``optimizer.schedule``), in every group."""
        for group in self.optimizer_groups():
            group["lr"] = lr

    def eval_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> Optional[torch.Tensor]:
        """[loss_sum, correct, count] for this batch, or None where this rank sees no output."""
        raise NotImplementedError

    def held_bytes(self) -> dict:
        """Bytes of parameters, gradients and optimizer state this rank holds."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def scaling_record(self) -> dict:
        """This rank's summary fields of fp16's loss scaling: ``skipped_steps`` (and ``loss_scale``
        where the engine knows it); {} where nothing scales."""
        return {}

    def scaling_state(self) -> dict:
        """fp16's loss scale and the steps it skipped (``suite.strategies.scaling``), kept in each
        rank's checkpoint file whatever its format; {} where the engine does not scale."""
        return {}

    def load_scaling_state(self, state: dict) -> None:
        """Restore ``scaling_state``'s ({} from a checkpoint without one: the scale starts over)."""

    def neutral_state(self) -> dict:
        """This rank's part of the run's strategy-neutral state (``suite.strategies.neutral``):
        the model's tensors and the optimizer's per-parameter state by the plain model's names,
        whole or as DTensors; also the template a neutral checkpoint is read into. Collective."""
        raise NoNeutralState(self.no_neutral_checkpoint)

    def load_neutral_state(self, state: dict) -> None:
        """Restore from ``neutral_state``'s shape, filled by a checkpoint of any strategy."""
        raise NoNeutralState(self.no_neutral_checkpoint)

    def full_model_state(self) -> dict:
        """The whole trained model's state dict with the plain (unwrapped, unsharded) model's
        names, on CPU, on rank 0 (other ranks: {}); what ``python -m suite.export --model``
        writes. Collective: every rank calls it. A strategy that cannot gather its model raises
        ``NoFullModelState``."""
        raise NoFullModelState("its engine does not gather the whole model")

    def extra_metrics(self) -> dict:
        """Strategy-specific numbers for this rank's entry in the run summary (e.g. a pipeline
        stage's measured bubble fraction); JSON-serialisable, {} when there are none."""
        return {}

    def abort(self) -> None:
        """The run failed (here or on a peer): release what ``close`` would without waiting for
        peers that may be gone (an RPC agent's graceful shutdown would). ``close`` follows."""

    def close(self) -> None:
        pass
