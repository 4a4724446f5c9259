"""Pipeline parallelism with ``torch.distributed.pipelining``: the model's top-level blocks are
cut into ``stages`` parts, one per rank of a pipeline group, and every batch is split into
``micro_batches`` that flow through the stages (schedule ``gpipe``: all forwards, then all
backwards; ``1f1b``: one forward, one backward in the steady state, so fewer activations live).

With ``dp`` > 1 the world is a 2-D mesh (dp x stages; ranks of one pipeline are neighbours) and
each stage is data-parallel over its dp group with FSDP2 ``fully_shard`` or the FSDP2-based
``replicate``, never DDP: DDP + pipelining trains WRONG on current torch (docs/strategies.md).

The loss exists only on the last stage; other stages report no loss (samples 0), so the loop's
sample-weighted global loss stays exact. Each rank measures its idle ("bubble") fraction:
1 - (time inside its stage's forward/backward) / (wall time of the schedule), reported next to
the textbook (K-1)/(M+K-1) for K stages and M micro-batches.
"""
from __future__ import annotations

import statistics
import time
from typing import ClassVar, Literal, Optional

import torch
import torch.distributed as dist
from pydantic import PositiveInt

from suite.compat import torch as torch_compat
from suite.record import metrics
from suite.strategies.engine import StepResult
from suite.common.errors import SuiteError
from suite.strategies.layout import Axis
from suite.strategies import clip, costs, scaling
from suite.strategies.base import ModuleEngine, StrategyOptions
from suite.strategies.engine import full_state
from suite.strategies.splitting import check_recipe_split, cut, resolve_split


class Options(StrategyOptions):
    name: Literal["pipeline"] = "pipeline"
    warm_imports: ClassVar = ("torch.distributed.pipelining",)
    reusable_process: ClassVar = True
    refuses: ClassVar = (scaling.refused("torch.distributed.pipelining's schedules run backward inside "
                                         "their step, on an unscaled loss"),)
    schedule: Literal["gpipe", "1f1b"] = "gpipe"
    stages: Optional[PositiveInt] = None  # pipeline degree; default: world size / dp
    dp: Optional[PositiveInt] = None  # data-parallel degree; default: 1, or world size / stages
    micro_batches: PositiveInt = 4  # per optimizer step and data-parallel rank
    split_at: Optional[list[int]] = None  # block indices where stages 2.. start; default: balanced
    dp_mode: Literal["fully_shard", "replicate"] = "fully_shard"  # how a stage is data-parallel
    overlap: ClassVar = costs.PIPELINED
    no_neutral_checkpoint: ClassVar = ""  # torch DCP maps its state (suite.strategies.neutral)
    cannot_fake: ClassVar = ("torch.distributed.pipelining infers stage shapes by messages between ranks, which "
                             "the fake process group does not carry (it would need static stage metadata)")

    def mesh_axes(self) -> list[Axis]:
        # dp outer, stages inner: a pipeline's ranks are neighbours.
        dp = self.dp if (self.dp or self.stages) else 1
        return [Axis("data", dp, "strategy.dp", data=True), Axis("pipeline", self.stages, "strategy.stages")]

    def pipeline_chunks(self) -> int:
        return self.micro_batches

    comm_axes: ClassVar = {"send": ("pipeline",), "recv": ("pipeline",)}  # between neighbouring stages

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # The activations and their gradients between stages, and the stage's data parallelism
        # over its dp group (``_data_parallel``): ``replicate`` all-reduces its gradients once;
        # ``fully_shard`` wraps the stage as one FSDP unit, the root, so it gathers the stage's
        # parameters once, at the first chunk's forward, and keeps them through every chunk
        # (the schedule sets reshard_after_backward off but for the last backward), then
        # reduce-scatters its gradients once: two calls, not one.
        if step.layout.dp_size < 2:
            dp = {}
        elif self.dp_mode == "fully_shard":
            dp = {"all_gather": (step.parameter_bytes, 1), "reduce_scatter": (step.gradient_bytes, 1)}
        else:
            dp = costs.data_parallel_all_reduce(step)
        return {**dp, **costs.stage_messages(step)}

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        # Stages dividing the world (data parallel over the rest), and micro-batches: more shrink
        # the bubble (K-1)/(M+K-1) and each chunk.
        return [{"name": "pipeline", "stages": k, "dp": world_size // k, "micro_batches": m}
                for k in costs.divisors(world_size) for m in (k, 2 * k, 4 * k)]

    def check(self, layout, model) -> None:
        stages, dp = layout.degree("pipeline"), layout.dp_size
        if stages < 2:
            raise SuiteError(f"strategy pipeline needs strategy.stages >= 2, but it is {stages} at world size "
                             f"{layout.world_size} with strategy.dp={dp}; lower dp, add ranks, or use fsdp/ddp")
        if layout.accumulation_steps != 1:
            raise SuiteError(f"training.grad_accumulation={layout.accumulation_steps}: strategy pipeline already "
                             f"accumulates over strategy.micro_batches; set grad_accumulation=1 and raise "
                             f"micro_batches instead")
        if self.schedule == "1f1b" and self.micro_batches < stages:
            # torch refuses it inside the ranks (Schedule1F1B: micro-batches must be >= stages).
            raise SuiteError(f"strategy.schedule=1f1b needs strategy.micro_batches >= strategy.stages ({stages}), "
                             f"but micro_batches={self.micro_batches}; raise micro_batches or use schedule=gpipe")
        check_recipe_split(model, self.split_at, stages, "pipeline", own_optimizers=True)

    def held_fraction(self, total: dict, layout) -> dict:
        share = layout.degree("pipeline") * (layout.dp_size if self.dp_mode == "fully_shard" else 1)
        return {k: v // share for k, v in total.items()}  # balanced stages: about 1/stages each

    def stage_schedule(self, layout):
        return self.schedule if layout.degree("pipeline") > 1 else None

    def stage_wrapper(self, layout):
        # Each stage data-parallel over its dp group (build): what the planner times per stage.
        if layout.dp_size == 1:
            return None
        return lambda module, mesh: _data_parallel(module, mesh, self.dp_mode)


def bubble_formula(stages: int, micro_batches: int) -> float:
    """Idle fraction of GPipe/1F1B with equal stage times and free communication."""
    return (stages - 1) / (micro_batches + stages - 1)


def message(tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A tensor as the two messages a stage sends (``_recv`` reads them): a header of its rank and
    shape (up to 8 dimensions), then the data, in the default dtype (float32, or float64 under fp64)."""
    tensor = tensor.detach().to(torch.get_default_dtype()).contiguous()
    header = torch.zeros(9, dtype=torch.int64, device=tensor.device)
    header[0] = tensor.dim()
    header[1:1 + tensor.dim()] = torch.tensor(tensor.shape)
    return header, tensor


class PipelineStageEngine(ModuleEngine):
    """This rank's stage of a torch.distributed.pipelining schedule."""
    def __init__(self, setup, module, stage, schedule, micro_batches, pp_group):
        super().__init__(setup, module)
        self.stage, self.schedule, self.pp_group = stage, schedule, pp_group
        self.stages, self.micro_batches = stage.num_stages, micro_batches
        self.bubble_fractions: list[float] = []
        self.busy_s: list[float] = []

    def train_step(self, inputs, targets):
        self.module.train()
        stage, losses = self.stage, []
        self.setup.ctx.synchronize()
        stage.busy_s, t0 = 0.0, time.perf_counter()
        with self.setup.autocast():
            args = (inputs,) if stage.is_first else ()
            kwargs = {"target": self._loss_target(inputs, targets), "losses": losses} if stage.is_last else {}
            output = self.schedule.step(*args, **kwargs)
        self.setup.ctx.synchronize()
        wall_s = time.perf_counter() - t0
        busy_s = torch_compat.busy_s(stage)
        self.bubble_fractions.append(metrics.bubble_fraction(busy_s, wall_s))
        self.busy_s.append(busy_s)
        self.note_gradient_bytes()
        grad_norm = self.clip_gradients()
        self.optimizer.step()
        self.zero_grad()
        if not stage.is_last:
            return StepResult(loss=None, samples=0, grad_norm=grad_norm)
        loss = torch.stack([l.detach().double() for l in losses]).mean()  # equal micro-batches
        return StepResult(loss=loss, samples=len(inputs), correct=self.setup.task.correct(output, targets),
                          grad_norm=grad_norm)

    def full_model_state(self) -> dict:
        """Each stage's blocks keep the whole model's names (``cut`` slices the Sequential): every
        stage gathers its own (over its data-parallel group), rank 0 collects them all."""
        mine = full_state(self.module, keep=self.setup.layout.dp_rank(self.setup.ctx.rank) == 0)
        if self.setup.ctx.world_size == 1:
            return mine
        parts = [None] * self.setup.ctx.world_size if self.setup.ctx.is_main else None
        dist.gather_object(mine, parts, dst=0)
        return {k: v for part in parts or [] for k, v in part.items()}

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        # This stage holds only its blocks: squared norms summed over the stages of its pipeline.
        return clip.clip_grad_norm_(self.module.parameters(), max_norm, stage_group=self.pp_group)

    def _loss_target(self, inputs, targets):
        return inputs if self.setup.task.kind == "reconstruction" else targets

    @torch.no_grad()
    def eval_step(self, inputs, targets):
        """The whole batch through the stages with plain sends (eval batches vary in size, and
        the schedule's buffers are shaped for training micro-batches)."""
        self.module.eval()
        stage = self.stage
        x = inputs if stage.is_first else self._recv(stage.stage_index - 1)
        with self.setup.autocast():
            out = self.module(x)
        if not stage.is_last:
            self._send(out, stage.stage_index + 1)
            return None
        return self.setup.task.evaluate(out, inputs, targets)

    def _peer(self, stage_index):
        return dist.get_global_rank(self.pp_group, stage_index)

    def _send(self, tensor, stage_index):
        for part in message(tensor):
            dist.send(part, self._peer(stage_index), group=self.pp_group)

    def _recv(self, stage_index):
        header = torch.zeros(9, dtype=torch.int64, device=self.setup.ctx.device)
        dist.recv(header, self._peer(stage_index), group=self.pp_group)
        shape = header[1:1 + int(header[0])].tolist()
        tensor = torch.empty(shape, dtype=torch.get_default_dtype(), device=self.setup.ctx.device)
        dist.recv(tensor, self._peer(stage_index), group=self.pp_group)
        return tensor

    def extra_metrics(self) -> dict:
        # The first step also infers shapes and allocates buffers: leave it out when we can.
        fractions = self.bubble_fractions[1:] or self.bubble_fractions
        busy = self.busy_s[1:] or self.busy_s
        return {"stage": self.stage.stage_index, "stages": self.stages, "micro_batches": self.micro_batches,
                "schedule": self.schedule_name(),
                "bubble_fraction": statistics.median(fractions) if fractions else None,
                "bubble_fraction_formula": self.bubble_formula(),
                "stage_busy_s": statistics.median(busy) if busy else None}

    def schedule_name(self) -> str:
        return self.schedule.__class__.__name__

    def bubble_formula(self) -> float:
        """The idle fraction the schedule's textbook formula gives, reported beside the measured one."""
        return bubble_formula(self.stages, self.micro_batches)


def schedule_class(name: str):
    """torch's schedule class for a schedule's name ("gpipe" or "1f1b", ``Options.schedule`` and
    ``stage_schedule``): the one the ranks step through and the planner times a stage through."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]


def build(opts: Options, setup) -> PipelineStageEngine:
    ctx, layout = setup.ctx, setup.layout
    stages = layout.degree("pipeline")
    mesh = layout.device_mesh(ctx)  # dims ("data", "pipeline"): a pipeline's ranks are neighbours
    pp_group, stage_index = mesh.get_group("pipeline"), mesh.get_local_rank("pipeline")
    model = setup.build_model()
    module = cut(model, resolve_split(opts.split_at, model, stages, own_optimizers=True))[stage_index].to(ctx.device)
    module = setup.prepare(module)
    if (wrap := opts.stage_wrapper(layout)) is not None:  # data-parallel stages (dp > 1)
        wrap(module, mesh["data"])
    stage = torch_compat.timed_stage_class(ctx.synchronize)(module, stage_index, stages, ctx.device, group=pp_group)
    task = setup.task
    schedule_cls = schedule_class(opts.schedule)
    # scale_grads (default) divides by micro_batches: the gradient of the batch mean loss.
    schedule = schedule_cls(stage, n_microbatches=layout.pipeline_chunks,
                            loss_fn=lambda out, target: task.loss(out, target, target))
    return PipelineStageEngine(setup, module, stage, schedule, layout.pipeline_chunks, pp_group)


def _data_parallel(module, dp_mesh, mode: str) -> None:
    if mode == "fully_shard":
        from torch.distributed.fsdp import fully_shard

        from suite.strategies.fsdp import without_inplace

        without_inplace(module)  # the stage's input comes through FSDP2's Function (fsdp.without_inplace)
        fully_shard(module, mesh=dp_mesh)
    else:
        torch_compat.replicate(module, dp_mesh)
