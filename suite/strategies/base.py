"""What every strategy shares: its options base class and the one-module engine."""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable, ClassVar, Optional

import torch
from pydantic import BaseModel, ConfigDict
from torch.nn.parallel import DistributedDataParallel

from suite.common.errors import SuiteError
from suite.strategies.layout import Axis, ModelInfo, Layout
from suite.strategies import clip, neutral, scaling
from suite.strategies.clock import StepClock
from suite.strategies.costs import Overlap, StepSizes
from suite.strategies.engine import Engine, StepResult, StepSums, full_state
from suite.record.metrics import optimizer_state_bytes, tensor_bytes


class StrategyOptions(BaseModel):
    """A strategy's recipe keys and what it tells the layout (``suite.strategies.layout``) and the checks."""
    model_config = ConfigDict(extra="forbid")
    # Modules a local pool's ranks import while the recipe is still being checked (suite/submit/
    # pool.py): what this strategy's build imports anyway, and nothing more, since a run's peak
    # memory includes its imports.
    warm_imports: ClassVar[tuple[str, ...]] = ()
    # Recipe keys outside strategy.* this strategy cannot honour (suite.strategies.keys.Refused):
    # refused when the recipe is validated, never silently ignored. Empty where the strategy
    # trains through the shared loop and Setup, which honour every key.
    refuses: ClassVar[tuple] = ()
    # Whether a rank may train the next point of a local sweep in the same process after this
    # strategy's point: only when the strategy keeps no state outside its process group and its
    # own objects (DeepSpeed and fairscale keep module-level state). Off unless a strategy says so.
    reusable_process: ClassVar[bool] = False
    # Whether the strategy trains in its own loop: the rank then hands it the whole run (its
    # module's ``train``; TensorFlow's strategies) instead of driving an engine through StepLoop.
    owns_training: ClassVar[bool] = False
    # Why the strategy cannot train in float64 (training.precision=fp64), or "" where it can:
    # the recipe check refuses fp64 with this reason, and suite.verify falls back to float32.
    no_fp64: ClassVar[str] = ""
    # Why the strategy's fp16 needs a GPU, or "" where it runs on CPU too: torch's autocast and
    # GradScaler run fp16 on CPU (suite.strategies.scaling), DeepSpeed's fp16 optimizer does not.
    fp16_needs_gpu: ClassVar[str] = ""
    # Why the strategy's losses are not meant to equal single's (asynchronous updates), or ""
    # where they are: suite.verify refuses to certify such a strategy with this reason.
    no_parity: ClassVar[str] = ""
    # Whether the strategy trains ranks that hold unequal parts of the global batch
    # (training.balance: speed or shares, suite.train.balance): only where every rank trains a
    # full replica through ModuleEngine's step and the gradients are averaged over the ranks, so
    # that weighting each rank's loss by its share (ModuleEngine.pass_weight) gives the global
    # batch's mean gradient. Off unless a strategy says so; the recipe check refuses the key.
    uneven_batches: ClassVar[bool] = False
    # The planner's rules (suite.strategies.costs; docs/architecture.md, "A strategy's rules"):
    # None here, declared by every strategy; the planner refuses a strategy that leaves one None.
    # comm_rule(self, step: StepSizes) -> Comm (a method); overlap: an Overlap (a class attribute,
    # or a property where the options decide it); cannot_fake: str ("" where the planner tries a
    # fake run of its real code); search_space(cls, world_size) -> list[dict] (a classmethod).
    comm_rule: ClassVar[Optional[Callable]] = None
    overlap: ClassVar[Optional[Overlap]] = None
    cannot_fake: ClassVar[Optional[str]] = None
    search_space: ClassVar[Optional[Callable]] = None
    # The mesh axes each collective kind of its comm_rule runs over, where not the data-parallel
    # axes (the default): the time model sizes the group (N) and the link it crosses by them.
    comm_axes: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Mesh axes whose groups the advisor keeps within one node unless asked (their collectives
    # sit inside every layer, where the link between nodes would stall each one).
    within_node_axes: ClassVar[tuple[str, ...]] = ()
    # Why a checkpoint of this strategy cannot be resumed by another strategy or at another world
    # size, or "" where it can: its engine's neutral_state maps its state to the plain model's
    # names (suite.strategies.neutral), tested by tests/train/test_any_to_any_resume.py. A
    # strategy says "" once that test covers it; suite.submit --resume refuses the rest before launch.
    no_neutral_checkpoint: ClassVar[str] = "its engine's state is not mapped to the plain model's parameter names"

    def mesh_axes(self) -> list[Axis]:
        """The mesh axes and their degrees (None: filled from the world size). Plain data
        parallelism by default: every rank reads its own samples."""
        return [Axis("data", None, "launch.tasks_per_node", data=True)]

    def pipeline_chunks(self) -> int:
        """Pipeline chunks per forward/backward (a pipeline's ``micro_batches``); 1 elsewhere."""
        return 1

    def check(self, layout: Layout, model: ModelInfo) -> None:
        """Refuse world sizes and settings this strategy cannot run (SuiteError naming the key)."""

    def held_fraction(self, total: dict, layout: Layout) -> dict:
        """Predicted bytes one rank holds, from the bytes of the whole model (a full replica here)."""
        return dict(total)

    def check_launch(self, launch) -> None:
        """Refuse launch settings this strategy cannot run on (the recipe's ``launch`` section),
        e.g. more than one node for a strategy that shares memory between its ranks."""

    def process_state(self, launch) -> tuple:
        """What a point of this strategy fixes in its rank's process for good, which a later point
        in the same warm process (``reusable_process``) must share to run there (``suite.submit.
        pool``): () where nothing. TensorFlow's threads and logical devices, once it has started."""
        return ()

    # The planner's optional rules: bytes beside what a rank holds, none unless a strategy says so.

    def copy_bytes(self, comm_bytes: dict[str, int], layout: Layout) -> int:
        """Bytes a rank copies per step besides compute and collectives, from the step's message
        sizes by kind (``comm_bytes``: a fake run's or ``comm_rule``'s); asked at world size > 1."""
        return 0

    def persistent_buffer_bytes(self, step: StepSizes) -> int:
        """Bytes the strategy keeps through the whole step beside what the rank holds (its
        gradient buckets), at any world size."""
        return 0

    # The collective kinds whose buffers the strategy allocates on a CUDA stream of its own, which
    # PyTorch's caching allocator keeps cached for that stream alone (suite.planner.caching_allocator).
    side_stream_collectives: ClassVar = ()

    def pass_buffer_bytes(self, step: StepSizes) -> int:
        """Bytes the strategy allocates during forward and backward, at their most, beside what
        the rank holds and the model's activations (gathered units, reduction copies); asked at
        world size > 1."""
        return 0

    def optimizer_temporary_bytes(self, step: StepSizes) -> int:
        """The optimizer's temporaries during the update: the bare model's, split over the ranks
        that share one replica, unless the strategy's optimizer steps other tensors (shards)."""
        return step.optimizer_bytes // step.parts

    def stage_wrapper(self, layout: Layout):
        """What wraps each pipeline stage's module on its rank besides the model, as
        ``fn(module, mesh)`` over the stage's data-parallel mesh (FSDP2 with a pipeline's ``dp`` >
        1), or None. The planner times a stage with and without it as one rank
        (``suite.planner.stage_time``): a pipeline cannot run as one rank to time its own cost."""
        return None

    def stage_schedule(self, layout: Layout) -> str | None:
        """The schedule ("gpipe" or "1f1b") each pipeline stage steps through on its rank, cut as
        ``suite.strategies.splitting`` cuts it, or None where the strategy has no such stages: the
        planner then times each stage alone through it (``suite.planner.stage_time``)."""
        return None


def refuse_world_size(name: str, world: int, rule: str, fix: str):
    raise SuiteError(f"strategy {name} {rule}, but launch gives world size {world} "
                     f"(nodes x tasks_per_node); {fix}")


class ModuleEngine(Engine):
    """One module and one optimizer on this rank's device: forward, loss, backward, reduce, step.

    Data-parallel strategies differ only in how the module is wrapped and how gradients are
    combined: ``reduce_gradients`` runs once per optimizer step, after the last micro-batch,
    and ``sync_context(last)`` wraps each micro-batch's backward (DDP's ``no_sync``).
    """

    def __init__(self, setup, module: torch.nn.Module):
        self.setup = setup
        self.module = module
        self.optimizer = setup.make_optimizer(module.parameters())
        self.dp_rank, self.dp_size = setup.layout.dp_rank(setup.ctx.rank), setup.layout.dp_size
        self._gradient_bytes = 0
        # training.precision=fp16: the loss scaled before backward, the step skipped on an inf (suite.strategies.scaling)
        self.scaling = scaling.LossScaling(setup.precision, setup.ctx.device, sharded=self.sharded_scaler)
        # compute and collective time per step (suite.strategies.clock): data-parallel engines whose
        # reduction is reduce_gradients or DDP's backward, on CPU (host time splits no CUDA step)
        self.clock = StepClock(module.parameters()) if self.splits_step_time and setup.ctx.device.type == "cpu" else None

    # Whether this engine's steps are split into compute and collective time (suite.strategies.clock):
    # set by an engine whose gradients are reduced in reduce_gradients or in DDP's backward, and
    # whose rank does nothing collective in forward.
    splits_step_time: ClassVar[bool] = False
    # Whether fp16's found-inf flag must be all-reduced by the scaler itself: gradients sharded
    # as plain tensors (FSDP1's flat shards); DTensor shards reduce it in torch's dispatch.
    sharded_scaler: ClassVar[bool] = False

    def sync_context(self, last: bool):
        return nullcontext()

    def reduce_gradients(self) -> None:
        pass

    def forward_loss(self, inputs, targets):
        """(loss, correct count) of one micro-batch."""
        with self.setup.autocast():
            out = self.module(inputs)
        return self.setup.task.loss(out, inputs, targets), self.setup.task.correct(out, targets)

    def accumulate_gradients(self, inputs, targets) -> StepSums:
        """Forward and backward over this rank's batch in its accumulation passes: the gradients
        of the batch mean in ``.grad``, not yet reduced; the step's loss and correct count."""
        if not self.module.training:  # eval_step left it in eval mode; walking every module each step costs
            self.module.train()
        passes, sums = self.setup.layout.accumulation_steps, StepSums(inputs.device)
        for x, y, last in self.setup.accumulation_chunks(inputs, targets):
            with self.sync_context(last=last):
                loss, right = self.forward_loss(x, y)
                if self.setup.uneven_batches:  # training.balance: this pass's share of the global batch
                    weight = self.pass_weight(len(x))
                    self.scaling.scale(loss * weight).backward()
                    sums.add(loss * (len(x) / len(inputs)), right, 1)
                else:
                    self.scaling.scale(loss / passes).backward()
                    sums.add(loss, right, passes)
        return sums

    def pass_weight(self, samples: int) -> float:
        """training.balance (unequal batches): the factor on a pass's mean loss so that the
        gradients the strategy averages over its ``dp_size`` ranks are the global batch's mean:
        mean over the pass x samples / global batch x dp_size. The average divides by dp_size,
        which the factor undoes, leaving sum over all samples / global batch; with equal batches
        it is 1 / passes, today's factor. Kept as a weight on the mean rather than a sum reduction
        so that every averaging strategy (DDP's reducer, the hand-written all-reduce) is right
        unchanged."""
        return samples * self.dp_size / self.setup.layout.batch_size

    def train_step(self, inputs, targets) -> StepResult:
        started = time.perf_counter()
        sums = self.accumulate_gradients(inputs, targets)
        self.reduce_gradients()
        reduced = time.perf_counter()
        self.note_gradient_bytes()
        grad_norm = self.clip_gradients()
        stepped = self.scaling.step(self.optimizer)
        self.zero_grad()
        result = sums.result(len(inputs), grad_norm)
        if self.scaling.enabled:
            result.skipped, result.loss_scale = not stepped, self.scaling.loss_scale()
        if self.clock is not None:
            result.compute_s, result.collective_s = self.clock.split(started, reduced, time.perf_counter())
        return result

    @torch.no_grad()
    def local_forward(self, inputs) -> None:
        """The replica alone (DDP's wrapper left out: its forward may broadcast buffers), in eval
        mode (batch norm on its running statistics, no synced statistics, no dropout draws)."""
        plain = self.module.module if isinstance(self.module, DistributedDataParallel) else self.module
        training = plain.training
        plain.eval()
        with self.setup.autocast():
            plain(inputs)
        plain.train(training)

    def note_gradient_bytes(self) -> None:
        """Gradient bytes this rank holds at a step's end, for ``held_bytes``: the same every
        step, so measured on the first step only, off the per-step path."""
        if not self._gradient_bytes:
            self._gradient_bytes = self.gradient_bytes()

    def clip_gradients(self) -> Optional[torch.Tensor]:
        """``training.grad_clip_norm``: after the reduction, before the step, scale the gradients
        so that the whole model's gradient norm is at most the value; returns the norm before
        clipping, or None (and costs nothing) when the recipe does not clip."""
        if self.setup.grad_clip_norm is None:
            return None
        if self.scaling.enabled:  # fp16: the clip sees the true gradients
            self.scaling.unscale_(self.optimizer)
        return self.clip_grad_norm_(self.setup.grad_clip_norm).detach()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip by the global norm (``suite.strategies.clip``); a wrapper with its own global
        clip (FSDP1, fairscale OSS) or a model split over ranks (pipeline) overrides this."""
        return clip.clip_grad_norm_(self.module.parameters(), max_norm)

    def optimizer_groups(self) -> list[dict]:
        return self.optimizer.param_groups  # fairscale OSS: its own groups, synced into its shard's each step

    def zero_grad(self) -> None:
        """Clear gradients after the step (a wrapper that keeps its own grad buffers overrides this)."""
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def eval_step(self, inputs, targets):
        self.module.eval()
        with self.setup.autocast():
            out = self.module(inputs)
        return self.setup.task.evaluate(out, inputs, targets)

    def parameters(self):
        return list(self.module.parameters())

    def gradient_bytes(self) -> int:
        return tensor_bytes(p.grad for p in self.module.parameters() if p.grad is not None)

    def held_bytes(self) -> dict:
        return {"parameters": tensor_bytes(self.parameters()),
                "gradients": self._gradient_bytes,
                "optimizer_state": optimizer_state_bytes(self.optimizer)}

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def scaling_record(self) -> dict:
        if not self.scaling.enabled:
            return {}
        return {"skipped_steps": self.scaling.skipped_steps, "loss_scale": self.scaling.loss_scale()}

    def scaling_state(self) -> dict:
        return self.scaling.state_dict()

    def load_scaling_state(self, state: dict) -> None:
        self.scaling.load_state_dict(state)

    def neutral_state(self) -> dict:
        return neutral.module_state(self.module, self.optimizer)

    def load_neutral_state(self, state: dict) -> None:
        neutral.load_module_state(self.module, self.optimizer, state)

    def full_model_state(self) -> dict:
        return full_state(self.module, keep=self.setup.ctx.is_main)
