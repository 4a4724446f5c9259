"""PipeDream-2BW (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021):
an asynchronous pipeline. The model's top-level blocks are cut into ``stages`` parts, one per
rank, and every batch into ``micro_batches``; each stage runs one forward, one backward (1F1B)
**without a flush between batches**: the next batch's micro-batches enter while the last ones
of this batch are still on their way back, so in the steady state no stage idles.

The price is staleness. Double-buffered weights (the "2BW"): batch t's micro-batches all run
their forward and backward on the weight version W(t-1) (stashed, so a backward sees the
weights its forward used), and the update adds their accumulated gradient to the newest
weights:  W(t+1) = W(t) - lr * grad f(W(t-1)),  W(-1) = W(0).
So the losses are not single's (``no_parity``); they equal a one-process run of that rule
exactly (tests/strategies/test_pipedream_2bw.py), and the loss a step reports is the batch's
loss at W(t-1). With micro_batches >= stages a stage never needs more than two versions; it
keeps them as copies beside the optimizer's own weights (one copy more than the paper's).

Where the loop needs a consistent model (evaluation, a checkpoint, the exported model, the end),
the stages drain: the micro-batches still in flight finish their backward and their update, as
the paper's variant PipeDream-Flush does at every batch. The update rule is the same across a
drain; only time is spent. One pipeline, no data parallelism (``dp`` 1): ``pipeline`` runs the
synchronous schedules (GPipe, 1F1B with a flush: PipeDream-Flush) and data x pipeline meshes.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import ClassVar, Literal, Optional

import torch
import torch.distributed as dist
from pydantic import PositiveInt

from suite.common.errors import SuiteError
from suite.record import metrics
from suite.record.metrics import optimizer_state_bytes, tensor_bytes
from suite.strategies import costs
from suite.strategies.base import StrategyOptions
from suite.strategies.engine import StepResult
from suite.strategies.keys import Refused
from suite.strategies.layout import Axis
from suite.strategies.pipeline import PipelineStageEngine, message
from suite.strategies.splitting import check_recipe_split, cut, resolve_split

WHY = "PipeDream-2BW trains batch t on the weights of one update earlier: W(t+1) = W(t) - lr*grad(W(t-1))"


class Options(StrategyOptions):
    name: Literal["pipedream_2bw"] = "pipedream_2bw"
    reusable_process: ClassVar = True
    stages: Optional[PositiveInt] = None  # default: the world size (one pipeline)
    micro_batches: PositiveInt = 4  # per batch; at least stages, so two weight versions suffice
    split_at: Optional[list[int]] = None  # block indices where stages 2.. start; default: balanced
    no_parity: ClassVar = WHY + " (asynchronous; its own semantics are tested instead)"
    no_neutral_checkpoint: ClassVar = ("it keeps a second, stashed weight version (the one the next batch "
                                       "trains on) that the strategy-neutral format does not hold")
    refuses: ClassVar = (
        Refused("training.grad_clip_norm", (None,), "each stage updates at its own time in the pipeline, so "
                "there is no moment at which the whole model's gradient norm exists"),
        Refused("training.grad_accumulation", (1,), "it accumulates over strategy.micro_batches"),
        Refused("training.activation_checkpointing", (False,), "a stage runs its forward on stashed weights, "
                "which a recomputation in backward would not see"),
        Refused("training.compile", (False,), "a stage calls its blocks on stashed weights (torch.func), "
                "which compiled blocks are not tested with"),
        Refused("training.precision", ("fp32", "fp64"), "autocast on stashed weights is not tested"),
    )
    overlap: ClassVar = costs.Overlap(why="1F1B without a flush between batches: no bubble in the steady "
                                          "state; activations sent between stages are on the critical path")
    cannot_fake: ClassVar = ("its stages exchange activations by point-to-point messages, which the fake "
                             "process group does not carry")

    def mesh_axes(self) -> list[Axis]:
        return [Axis("data", 1, "data-parallel degree (always 1)", data=True), Axis("pipeline", self.stages, "strategy.stages")]

    def pipeline_chunks(self) -> int:
        return self.micro_batches

    comm_axes: ClassVar = {"send": ("pipeline",), "recv": ("pipeline",)}

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return costs.stage_messages(step)  # one pipeline: no gradient reduction

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        if world_size < 2:
            return []
        return [{"name": "pipedream_2bw", "stages": world_size, "micro_batches": m}
                for m in (world_size, 2 * world_size)]

    def check(self, layout, model) -> None:
        stages = layout.degree("pipeline")
        if stages < 2:
            raise SuiteError(f"strategy pipedream_2bw needs at least 2 stages, but the world size is "
                             f"{layout.world_size}; launch 2 or more ranks, or use single")
        if self.micro_batches < stages:
            raise SuiteError(f"strategy pipedream_2bw needs strategy.micro_batches >= stages ({stages}) to keep "
                             f"two weight versions, but micro_batches={self.micro_batches}; raise micro_batches")
        check_recipe_split(model, self.split_at, stages, "pipedream_2bw", own_optimizers=True)

    def held_fraction(self, total: dict, layout) -> dict:
        stages = layout.degree("pipeline")
        held = {k: v // stages for k, v in total.items()}
        if "parameters" in held:
            held["parameters"] *= 3  # the optimizer's weights and two stashed versions
        return held


@dataclass
class StageInfo:
    """Where this rank sits in the pipeline (what PipelineStageEngine's evaluation reads)."""
    stage_index: int
    num_stages: int

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1


class PipeDream2BWEngine(PipelineStageEngine):
    """One stage: its 1F1B stream of micro-batches across batches, its weight versions, its updates.

    Micro-batch g (of batch g // micro_batches) is forwarded in the call of its batch; its
    backward follows ``warmup`` = stages - 1 - stage forwards later, so the last ``warmup``
    backwards of a batch run in the next call. A stage applies batch t's update when the
    backward of t's last micro-batch is done; the gradient was accumulated on the stashed
    version W(t-1) and is applied to the newest weights W(t), giving W(t+1).
    """

    def __init__(self, setup, module, info: StageInfo, micro_batches: int, pp_group):
        super().__init__(setup, module, info, None, micro_batches, pp_group)
        self.warmup = info.num_stages - 1 - info.stage_index
        self.names = [name for name, _ in module.named_parameters()]
        self.versions = {0: self._snapshot()}  # v -> W(v) as leaf tensors; batch v + 1 trains on it
        self.inflight = deque()  # (g, input, output or loss) awaiting backward, oldest first
        self.sends = []  # outstanding isend works and their tensors
        self.batch = 0  # the batch the next train_step call forwards
        self.lrs = {}  # batch -> the lr of each group the loop set for it (applied at its update)
        self.pending = {}  # batch -> [loss, correct] of the last stage's micro-batches
        self.aborted = False
        self.busy = 0.0  # seconds this stage computed in the current call

    # ---- weight versions ----
    def _snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone().requires_grad_(True) for p in self.module.parameters()]

    def _version_of(self, batch: int) -> list[torch.Tensor]:
        return self.versions[max(batch - 1, 0)]

    def _update(self, batch: int) -> None:
        stash = self._version_of(batch)
        for param, stashed in zip(self.module.parameters(), stash):
            param.grad, stashed.grad = stashed.grad, None
        for group, lr in zip(self.optimizer.param_groups, self.lrs.pop(batch)):
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.versions[batch + 1] = self._snapshot()  # W(batch + 1), what batch + 2 trains on
        if batch >= 1:
            del self.versions[batch - 1]  # its one batch is done with it

    # ---- the schedule ----
    def train_step(self, inputs, targets):
        if not self.module.training:
            self.module.train()
        wall0, self.busy = time.perf_counter(), 0.0
        t, m = self.batch, self.micro_batches
        self.lrs[t] = [group["lr"] for group in self.optimizer.param_groups]
        xs, ys = inputs.tensor_split(m), targets.tensor_split(m)
        for i in range(m):
            self._forward(t * m + i, xs[i], ys[i], len(inputs))
            if len(self.inflight) > self.warmup:
                self._backward()
        self.batch += 1
        self._reap()
        wall_s = time.perf_counter() - wall0
        self.bubble_fractions.append(metrics.bubble_fraction(self.busy, wall_s))
        self.busy_s.append(self.busy)
        if not self.stage.is_last:
            return StepResult(loss=None, samples=0)
        loss, correct = self.pending.pop(t)
        return StepResult(loss=loss, samples=len(inputs), correct=correct)

    def _forward(self, g: int, x, y, batch_samples: int) -> None:
        t = g // self.micro_batches
        stage = self.stage
        if not stage.is_first:
            x_in = self._recv(stage.stage_index - 1).requires_grad_(True)
        else:
            x_in = x
        started = time.perf_counter()
        params = dict(zip(self.names, self._version_of(t)))
        with self.setup.autocast():
            out = torch.func.functional_call(self.module, params, (x_in,))
        if stage.is_last:
            loss = self.setup.task.loss(out, x, y)
            share = len(x) / batch_samples  # the batch mean's share of this micro-batch
            sums = self.pending.setdefault(t, [torch.zeros((), dtype=torch.float64, device=loss.device), 0])
            sums[0] = sums[0] + loss.detach().double() * share
            sums[1] = sums[1] + self.setup.task.correct(out, y)
            self.busy += time.perf_counter() - started
            self.inflight.append((g, x_in, loss * share))
            return
        self.busy += time.perf_counter() - started
        self._isend(out, stage.stage_index + 1)
        self.inflight.append((g, x_in, out))

    def _backward(self) -> None:
        g, x_in, out = self.inflight.popleft()
        stage = self.stage
        grad = None if stage.is_last else self._recv(stage.stage_index + 1)
        started = time.perf_counter()
        torch.autograd.backward(out, grad)
        self.busy += time.perf_counter() - started
        if not stage.is_first:
            self._isend(x_in.grad, stage.stage_index - 1)
        if g % self.micro_batches == self.micro_batches - 1:
            self._update(g // self.micro_batches)

    def _isend(self, tensor, stage_index: int) -> None:
        peer = self._peer(stage_index)
        for part in message(tensor):
            self.sends.append((dist.isend(part, peer, group=self.pp_group), part))

    def _reap(self, wait: bool = False) -> None:
        if wait:
            for work, _ in self.sends:
                work.wait()
        self.sends = [(w, t) for w, t in self.sends if not w.is_completed()]

    def drain(self) -> None:
        """Finish every micro-batch in flight (backward and update) on every stage: collective
        in effect, since a stage's backward waits on the next stage's gradients."""
        while self.inflight:
            self._backward()
        self._reap(wait=True)

    # ---- what the loop asks of a consistent model: drain first ----
    def eval_step(self, inputs, targets):
        self.drain()
        return super().eval_step(inputs, targets)

    def full_model_state(self) -> dict:
        self.drain()
        return super().full_model_state()

    def state_dict(self) -> dict:
        self.drain()
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(), "batch": self.batch,
                "versions": {v: [p.detach().clone() for p in ps] for v, ps in self.versions.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.batch = state["batch"]
        self.versions = {int(v): [p.clone().requires_grad_(True) for p in ps] for v, ps in state["versions"].items()}

    def gradient_bytes(self) -> int:
        return tensor_bytes(self.module.parameters())  # one gradient per parameter, on the stashed version

    def held_bytes(self) -> dict:
        live = {id(ps): ps for ps in self.versions.values()}
        stashed = sum(tensor_bytes(ps) for ps in live.values())
        return {"parameters": tensor_bytes(self.module.parameters()) + stashed,
                "gradients": self.gradient_bytes(), "optimizer_state": optimizer_state_bytes(self.optimizer)}

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        if not self.aborted:
            self.drain()

    def schedule_name(self) -> str:
        return "PipeDream-2BW (1F1B, no flush)"

    def bubble_formula(self) -> float:
        return 0.0  # no flush between batches: no bubble in the steady state

def build(opts: Options, setup) -> PipeDream2BWEngine:
    ctx, layout = setup.ctx, setup.layout
    stages = layout.degree("pipeline")
    mesh = layout.device_mesh(ctx)
    pp_group, stage_index = mesh.get_group("pipeline"), mesh.get_local_rank("pipeline")
    model = setup.build_model()
    module = cut(model, resolve_split(opts.split_at, model, stages, own_optimizers=True))[stage_index].to(ctx.device)
    module = setup.prepare(module)
    return PipeDream2BWEngine(setup, module, StageInfo(stage_index, stages), layout.pipeline_chunks, pp_group)
