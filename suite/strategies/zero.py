"""DeepSpeed ZeRO: data parallelism that partitions the optimizer state (stage 1), also the
gradients (stage 2), also the parameters (stage 3) over the ranks; stage 0 is plain data
parallelism through DeepSpeed. Optional CPU offload of the optimizer step (stages 1-3) and of
the parameters (stage 3).

The recipe's torch optimizer is handed to DeepSpeed, so the update is exactly the baseline's
(no C++ op is built). The DeepSpeed config is written from the recipe and recorded in the run
folder as ``deepspeed_config.json``; ``config`` adds expert keys, checked against DeepSpeed.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch

from suite.strategies.engine import StepResult, StepSums
from suite.common.errors import SuiteError
from suite.strategies import _deepspeed
from suite.strategies.base import StrategyOptions


class Options(StrategyOptions):
    name: Literal["zero"] = "zero"
    warm_imports: ClassVar = ("deepspeed",)
    no_fp64: ClassVar = ("DeepSpeed's ZeRO optimizer keeps float32 master copies of the parameters and reduces "
                         "gradients in float32 at most (its communication_data_type)")
    stage: Literal[0, 1, 2, 3] = 2
    offload_optimizer: bool = False  # optimizer state and step on the CPU (stages 1-3)
    offload_parameters: bool = False  # parameters on the CPU between uses (stage 3 only)
    config: dict[str, Any] = {}  # extra DeepSpeed config keys, e.g. {zero_optimization: {reduce_bucket_size: 1e6}}

    def check(self, layout, model) -> None:
        if self.offload_parameters and self.stage != 3:
            raise SuiteError(f"strategy.offload_parameters=true needs strategy.stage=3 (got stage {self.stage}): "
                             f"only ZeRO-3 partitions parameters; set stage: 3 or offload_parameters: false")
        if self.offload_optimizer and self.stage == 0:
            raise SuiteError("strategy.offload_optimizer=true needs strategy.stage 1, 2 or 3 (ZeRO-Offload "
                             "offloads the partitioned optimizer state); raise the stage or drop the offload")
        if self.config:
            _deepspeed.check_config(_config(self, layout), self.config)

    def held_fraction(self, total: dict, layout) -> dict:
        """What DeepSpeed holds per rank: stage 1 splits optimizer state and gradients, 3 also
        parameters. From stage 1 on DeepSpeed keeps an fp32 master copy of the rank's partition,
        counted here as optimizer state (as held_bytes counts it)."""
        n = layout.dp_size
        out = dict(total)
        if self.stage >= 1:
            out["optimizer_state"] = (total["optimizer_state"] + total["parameters"]) / n
            # Not the ZeRO paper's stage 1 (full gradients): DeepSpeed 0.19.8 reduces gradients
            # into partitions during backward already at stage 1 (contiguous_gradients), so a rank
            # holds only its partition of them after backward, as held_bytes measures.
            out["gradients"] = total["gradients"] / n
        if self.stage >= 3:
            out["parameters"] = total["parameters"] / n
        return out


def _config(opts: Options, layout, grad_clip_norm: float = None) -> dict:
    return _deepspeed.make_config(
        micro_batch=layout.accumulation_batch, accumulation=layout.accumulation_steps, dp=layout.dp_size,
        precision=layout.precision, stage=opts.stage, offload_optimizer=opts.offload_optimizer,
        offload_parameters=opts.offload_parameters, grad_clip_norm=grad_clip_norm, extra=opts.config)


class ZeroEngine(_deepspeed.DeepSpeedEngine):
    def __init__(self, setup, ds_engine, stage: int):
        layout = setup.layout
        super().__init__(setup, ds_engine, stage, dp_rank=layout.dp_rank(setup.ctx.rank), dp_size=layout.dp_size)
        self._params = list(ds_engine.module.parameters())
        self._gradient_bytes = 0

    def train_step(self, inputs, targets) -> StepResult:
        self.ds.train()
        passes, sums = self.setup.layout.accumulation_steps, StepSums(inputs.device)
        for x, y, last in self.setup.accumulation_chunks(inputs, targets):
            out = self.ds(self.cast(x))
            loss = self.setup.task.loss(out, x, y)
            self.ds.backward(loss)  # scales by 1/accumulation itself
            if last:
                self._gradient_bytes = _deepspeed.gradient_bytes(self.ds, self._params)
            self.ds.step()  # steps the optimizer only at the accumulation boundary
            sums.add(loss, self.setup.task.correct(out, y), passes)
        return sums.result(len(inputs), self.grad_norm())

    @torch.no_grad()
    def eval_step(self, inputs, targets):
        self.ds.eval()
        out = self.ds(self.cast(inputs))
        return self.setup.task.evaluate(out, inputs, targets)

    def held_bytes(self) -> dict:
        return _deepspeed.held_bytes(self.ds, self._params, self._gradient_bytes)


def build(opts: Options, setup) -> ZeroEngine:
    ctx = setup.ctx
    deepspeed = _deepspeed.start(ctx, setup.precision, "zero")
    config = _config(opts, setup.layout, setup.grad_clip_norm)
    _deepspeed.record_config(setup, config)
    model = setup.prepare(setup.build_model().to(ctx.device))
    optimizer = setup.make_optimizer(model.parameters())
    ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return ZeroEngine(setup, ds_engine, opts.stage)
