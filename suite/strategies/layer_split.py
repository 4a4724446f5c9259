"""Layer-wise model parallelism inside one process: the model's top-level blocks are placed on
the devices this rank drives (``launch.devices_per_task``; the classic split of one model over
two GPUs) and activations move with ``.to()`` at every hop between parts. Only one device
works at a time: the split buys memory, not speed (a pipeline buys the speed back).

At world size > 1 every rank holds a whole split model and the data-parallel dimension is
torch DDP over that multi-device module ("MP-DDP"; DDP with ``device_ids=None``).
On CPU every "device" is the cpu: the code path is the real one, the memory split is not.
"""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

import torch
from torch import nn

from suite.compat import torch as torch_compat
from suite.strategies import costs
from suite.strategies.base import ModuleEngine, StrategyOptions
from suite.strategies.splitting import check_devices_per_task, check_recipe_split, cut, resolve_split


class Options(StrategyOptions):
    name: Literal["layer_split"] = "layer_split"
    warm_imports: ClassVar = (torch_compat.DYNAMO,)
    reusable_process: ClassVar = True
    # Block indices where parts 2.. start (one per extra device); default: balanced by parameters.
    split_at: Optional[list[int]] = None
    overlap: ClassVar = costs.PIPELINED  # its parts run one after another (no pipeline axis: no bubble counted)
    no_neutral_checkpoint: ClassVar = ""  # torch DCP maps its state (suite.strategies.neutral)
    cannot_fake: ClassVar = ""

    def check(self, layout, model) -> None:
        parts = check_devices_per_task(layout, "layer_split", "places the model, in one rank, on")
        check_recipe_split(model, self.split_at, parts, "layer_split")

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        return costs.data_parallel_all_reduce(step)  # DDP over the ranks, where there are several

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return []  # nothing to choose


class LayerSplit(nn.Sequential):
    """The model's own blocks (same names, same state_dict keys), each part on its device.

    ``forward`` moves the activation to the next part's device at every hop; a missing move
    shows up as a device mismatch (a test puts a part on ``meta`` to prove there is none)."""

    def __init__(self, model: nn.Sequential, split_at: list[int], devices):
        super().__init__(*model)
        self.hops = {}  # block index -> device its part lives on
        start = 0
        for part, device in zip(cut(model, split_at), devices):
            part.to(device)
            self.hops[start] = torch.device(device)
            start += len(part)

    def forward(self, x):
        for i, block in enumerate(self):
            if i in self.hops:
                x = x.to(self.hops[i])
            x = block(x)
        return x


class SplitEngine(ModuleEngine):
    """A module whose output lives on another device than its input: inputs go to the first
    device, the loss is computed where the output is and reported on the rank's device."""

    def __init__(self, setup, module, first_device):
        super().__init__(setup, module)
        self.first_device = first_device

    def sync_context(self, last: bool):
        wrapped = isinstance(self.module, nn.parallel.DistributedDataParallel)
        return self.module.no_sync() if wrapped and not last else super().sync_context(last)

    def forward_loss(self, inputs, targets):
        with self.setup.autocast():
            out = self.module(inputs.to(self.first_device))
        inputs, targets = inputs.to(out.device), targets.to(out.device)
        loss = self.setup.task.loss(out, inputs, targets)
        home = self.setup.ctx.device
        return loss.to(home), self.setup.task.correct(out, targets).to(home)

    @torch.no_grad()
    def eval_step(self, inputs, targets):
        self.module.eval()
        with self.setup.autocast():
            out = self.module(inputs.to(self.first_device))
        return self.setup.task.evaluate(out, inputs.to(out.device), targets.to(out.device)).to(self.setup.ctx.device)

    def _plain(self):
        return getattr(self.module, "module", self.module)  # under DDP, the split model itself

    def state_dict(self) -> dict:
        return {"model": self._plain().state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self._plain().load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def build(opts: Options, setup) -> SplitEngine:
    ctx = setup.ctx
    devices = list(ctx.devices)  # the seam: a test passes a ctx whose second device is meta
    model = setup.prepare(setup.build_model())
    split = LayerSplit(model, resolve_split(opts.split_at, model, len(devices)), devices)
    if ctx.world_size == 1:
        return SplitEngine(setup, split, devices[0])
    # MP-DDP: a multi-device module takes device_ids=None; DDP then averages over all ranks.
    ddp = nn.parallel.DistributedDataParallel(split, device_ids=None)
    return SplitEngine(setup, ddp, devices[0])
