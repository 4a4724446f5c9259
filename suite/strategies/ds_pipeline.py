"""DeepSpeed's pipeline engine: the model's top-level blocks are split into ``stages`` (a
``PipelineModule``), each rank's batch into ``micro_batches`` that flow through the stages on
DeepSpeed's 1F1B schedule (``engine.train_batch``). With more ranks than stages, the pipeline
is replicated: data parallel degree = world size / stages, gradients averaged over replicas.

The loss exists only on the last stage, which reports it; other stages report none (the loop's
sample-weighted global loss stays exact). ZeRO stage 0 or 1 only: DeepSpeed refuses 2 and 3.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import PositiveInt

from suite.strategies.engine import StepResult
from suite.common.errors import SuiteError
from suite.strategies.layout import Axis
from suite.compat import deepspeed as ds_compat
from suite.strategies import _deepspeed, costs, splitting
from suite.strategies.base import StrategyOptions


class Options(StrategyOptions):
    name: Literal["ds_pipeline"] = "ds_pipeline"
    warm_imports: ClassVar = ("deepspeed",)
    fp16_needs_gpu: ClassVar = "DeepSpeed's fp16 optimizer runs on GPUs only"
    no_fp64: ClassVar = "DeepSpeed's engine reduces only fp16, bf16 and fp32 gradients"
    stages: PositiveInt = 2
    micro_batches: PositiveInt = 4  # per rank and optimizer step: DeepSpeed's gradient_accumulation_steps
    partition: Literal["parameters", "uniform"] = "parameters"  # balance stages by parameters or by blocks
    zero_stage: Literal[0, 1, 2, 3] = 0
    config: dict[str, Any] = {}  # extra DeepSpeed config keys (expert use), e.g. {pipeline: {...}}
    overlap: ClassVar = costs.PIPELINED
    cannot_fake: ClassVar = ("DeepSpeed's pipeline engine reads tensor values while it starts (.tolist() of "
                             "the parameter counts it all-reduces over the stages)")

    def mesh_axes(self) -> list[Axis]:
        # DeepSpeed's PipeDataParallelTopology: pipeline stages outer, data parallel inner.
        return [Axis("pipeline", self.stages, "strategy.stages"), Axis("data", None, "data-parallel degree", data=True)]

    def pipeline_chunks(self) -> int:
        return self.micro_batches

    comm_axes: ClassVar = {"send": ("pipeline",), "recv": ("pipeline",)}  # between neighbouring stages

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # The stage's gradients over its data-parallel group, and the activations and their
        # gradients between stages.
        return {**costs.data_parallel_all_reduce(step), **costs.stage_messages(step)}

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        # Stages dividing the world, micro-batches against the bubble, ZeRO-1 over the data ranks.
        return [{"name": "ds_pipeline", "stages": k, "micro_batches": m, "zero_stage": z}
                for k in costs.divisors(world_size) for m in (k, 2 * k, 4 * k) for z in (0, 1)]

    def check(self, layout, model) -> None:
        if self.zero_stage >= 2:
            raise SuiteError(f"strategy.zero_stage={self.zero_stage}: DeepSpeed's pipeline engine takes ZeRO stage "
                             f"0 or 1 only (it runs each stage's backward itself, outside the hooks with which ZeRO-2/3 "
                             f"partition gradients and gather parameters); use zero_stage 0 or 1, or strategy zero")
        if layout.accumulation_steps != 1:
            raise SuiteError(f"training.grad_accumulation={layout.accumulation_steps}: strategy ds_pipeline accumulates "
                             f"over strategy.micro_batches={self.micro_batches}; leave training.grad_accumulation at 1")
        blocks = len(splitting.meta_model(model, "ds_pipeline"))  # refuses a model that is no nn.Sequential
        if blocks < self.stages:
            raise SuiteError(f"strategy.stages={self.stages} but model {model.name} has {blocks} top-level "
                             f"blocks to split; use at most {blocks} stages")
        if self.config:
            _deepspeed.check_config(_config(self, layout), self.config)

    def held_fraction(self, total: dict, layout) -> dict:
        """About 1/stages of everything per rank (exact only for perfectly balanced stages); ZeRO-1
        also splits the optimizer state (with its fp32 master copy) over the data-parallel ranks."""
        dp = layout.dp_size
        out = {k: v / self.stages for k, v in total.items()}
        if self.zero_stage == 1:
            out["optimizer_state"] = (total["optimizer_state"] + total["parameters"]) / self.stages / dp
        return out


def _config(opts: Options, layout, grad_clip_norm: float = None) -> dict:
    # DeepSpeed's "micro-batch" and "gradient accumulation steps" are the pipeline's chunks.
    return _deepspeed.make_config(micro_batch=layout.chunk_batch, accumulation=layout.pipeline_chunks,
                                  dp=layout.dp_size, precision=layout.precision, stage=opts.zero_stage,
                                  grad_clip_norm=grad_clip_norm, extra=opts.config)


class DeepSpeedPipelineEngine(_deepspeed.DeepSpeedEngine):
    """One rank of DeepSpeed's pipeline engine: a stage of the PipelineModule, fed micro-batches by
    ``train_batch``."""
    def __init__(self, setup, ds_engine, micro_batches: int, zero_stage: int):
        layout = setup.layout
        super().__init__(setup, ds_engine, zero_stage, dp_rank=layout.dp_rank(setup.ctx.rank), dp_size=layout.dp_size)
        self.micro_batches = micro_batches
        self.last_stage = ds_engine.is_last_stage()
        self._shape = None
        self._correct = torch.zeros(())
        self._eval_sums = None
        self._gradient_bytes = 0
        ds_engine.module.loss_fn = self._loss
        inner = ds_compat.inner_optimizer(ds_engine)
        inner.register_step_pre_hook(lambda *_: self._measure_gradients())

    def stage_group(self):
        return ds_compat.pipe_group(self.ds)

    def _loss(self, output, labels):
        """Called by DeepSpeed on the last stage, once per micro-batch."""
        task = self.setup.task
        if self._eval_sums is not None:
            self._eval_sums += task.evaluate(output, labels, labels).to(self._eval_sums.device)
        else:
            self._correct += task.correct(output, labels).to(self._correct.device)
        # Reconstruction models are fed (x, x): the labels are the inputs.
        return task.loss(output, labels, labels)

    def _batches(self, inputs, targets, parts: int):
        labels = inputs if self.setup.task.kind == "reconstruction" else targets
        chunks = list(zip(self.cast(inputs).chunk(parts), labels.chunk(parts)))
        shape = tuple(chunks[0][0].shape)
        if shape != self._shape:  # DeepSpeed caches activation shapes between stages
            ds_compat.reset_activation_shapes(self.ds)
            self._shape = shape
        return iter(chunks)

    def train_step(self, inputs, targets) -> StepResult:
        self._correct = torch.zeros((), device=inputs.device)
        self.ds.train_batch(self._batches(inputs, targets, self.micro_batches))
        if not self.last_stage:
            return StepResult(loss=None, samples=0, grad_norm=self.grad_norm(), skipped=self.skipped_step())
        return StepResult(loss=ds_compat.replica_loss(self.ds).double(), samples=len(inputs), correct=self._correct,
                          grad_norm=self.grad_norm(), skipped=self.skipped_step())

    @torch.no_grad()
    def eval_step(self, inputs, targets):
        self._eval_sums = torch.zeros(self.setup.task.eval_size, dtype=torch.float64, device=inputs.device)
        try:
            self.ds.eval_batch(self._batches(inputs, targets, 1), num_micro_batches=1, bcast_loss=False)
            return self._eval_sums if self.last_stage else None
        finally:
            self._eval_sums = None

    def _measure_gradients(self) -> None:
        params = list(self.ds.module.parameters())
        inner = ds_compat.inner_optimizer(self.ds)
        params += [p for group in inner.param_groups for p in group["params"]]
        self._gradient_bytes = _deepspeed.distinct_bytes([p.grad for p in params if p.grad is not None])

    def held_bytes(self) -> dict:
        return _deepspeed.held_bytes(self.ds, self.ds.module.parameters(), self._gradient_bytes)


def build(opts: Options, setup) -> DeepSpeedPipelineEngine:
    ctx = setup.ctx
    deepspeed = _deepspeed.start(ctx, setup.precision, "ds_pipeline")
    from deepspeed.pipe import PipelineModule

    config = _config(opts, setup.layout, setup.grad_clip_norm)
    _deepspeed.record_config(setup, config)
    # Same weights as the baseline on every rank; checkpointed blocks (setup.prepare) before
    # they become the PipelineModule's layers.
    layers = list(setup.prepare(setup.build_model()).children())
    pipe = PipelineModule(layers=layers, num_stages=opts.stages, partition_method=opts.partition,
                          loss_fn=lambda *_: None)  # replaced by the engine's loss
    for i, layer in enumerate(layers):
        if not ds_compat.owns_layer(pipe, i):
            layer.to("meta")  # another stage's block: PipelineModule keeps a reference; free its memory
    pipe.to(ctx.device)
    optimizer = setup.make_optimizer([p for p in pipe.parameters() if p.requires_grad])
    ds_engine, *_ = deepspeed.initialize(model=pipe, optimizer=optimizer, config=config)
    return DeepSpeedPipelineEngine(setup, ds_engine, opts.micro_batches, opts.zero_stage)
