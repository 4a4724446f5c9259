"""What every strategy shares: its options base class and the one-module engine."""
from __future__ import annotations

from contextlib import nullcontext

import torch
from pydantic import BaseModel, ConfigDict

from suite.strategies.engine import Engine, StepResult
from suite.errors import SuiteError


class StrategyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dp_size(self, world_size: int) -> int:
        """Data-parallel degree: how many ranks read different samples."""
        return world_size

    def check(self, recipe) -> None:
        """Refuse world sizes and settings this strategy cannot run (SuiteError naming the key)."""

    def micro_batches_per_step(self, training) -> int:
        """Micro-batches each data-parallel rank splits its batch into per optimizer step:
        a pipeline's own ``micro_batches`` option, else ``training.grad_accumulation``."""
        return getattr(self, "micro_batches", None) or training.grad_accumulation

    def held_fraction(self, total: dict, world_size: int) -> dict:
        """Predicted bytes one rank holds, from the bytes of the whole model (a full replica here)."""
        return dict(total)


def refuse_world_size(name: str, world: int, rule: str, fix: str):
    raise SuiteError(f"strategy {name} {rule}, but launch gives world size {world} "
                     f"(nodes x tasks_per_node); {fix}")


class ModuleEngine(Engine):
    """One module and one optimizer on this rank's device: forward, loss, backward, reduce, step.

    Data-parallel strategies differ only in how the module is wrapped and how gradients are
    combined: ``reduce_gradients`` runs once per optimizer step, after the last micro-batch,
    and ``sync_context(last)`` wraps each micro-batch's backward (DDP's ``no_sync``).
    """

    def __init__(self, setup, module: torch.nn.Module, dp_rank: int = 0, dp_size: int = 1):
        self.setup = setup
        self.module = module
        self.optimizer = setup.make_optimizer(module.parameters())
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self._gradient_bytes = 0

    def sync_context(self, last: bool):
        return nullcontext()

    def reduce_gradients(self) -> None:
        pass

    def forward_loss(self, inputs, targets):
        """(loss, correct count) of one micro-batch."""
        with self.setup.autocast():
            out = self.module(inputs)
        return self.setup.task.loss(out, inputs, targets), self.setup.task.correct(out, targets)

    def train_step(self, inputs, targets) -> StepResult:
        self.module.train()
        chunks = self.setup.micro_batches(inputs, targets)
        total = torch.zeros((), device=inputs.device)
        correct = torch.zeros((), device=inputs.device)
        for i, (x, y) in enumerate(chunks):
            with self.sync_context(last=i == len(chunks) - 1):
                loss, right = self.forward_loss(x, y)
                loss = loss / len(chunks)
                loss.backward()
            total += loss.detach().float()
            correct += right
        self.reduce_gradients()
        self._gradient_bytes = self.gradient_bytes()
        self.optimizer.step()
        self.zero_grad()
        return StepResult(loss=total, samples=len(inputs), correct=correct)

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
        from suite.record.metrics import tensor_bytes
        return tensor_bytes(p.grad for p in self.module.parameters() if p.grad is not None)

    def held_bytes(self) -> dict:
        from suite.record.metrics import optimizer_state_bytes, tensor_bytes
        return {"parameters": tensor_bytes(self.parameters()),
                "gradients": self._gradient_bytes,
                "optimizer_state": optimizer_state_bytes(self.optimizer)}

    def state_dict(self) -> dict:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
