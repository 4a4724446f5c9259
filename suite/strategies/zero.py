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
from suite.strategies import _deepspeed, costs
from suite.strategies.base import StrategyOptions


# The planner's overlap rule by stage (stage 0 is plain data parallelism through DeepSpeed).
OVERLAP = {
    0: costs.AFTER_BACKWARD,
    1: costs.Overlap(why="DeepSpeed reduces gradient partitions in backward hooks and all-gathers updated "
                         "parameters after the step, without overlap_comm on CPU: nothing hidden"),
    2: costs.Overlap(why="as stage 1: nothing hidden"),
    3: costs.Overlap({"all_gather": 0.5, "reduce_scatter": 0.5}, "step",
                     "parameters are prefetched (all-gathered) ahead of the layer that needs them and "
                     "gradients reduce-scattered behind backward: half assumed hidden under forward + backward "
                     "(on a GPU's collective stream: all but the first gather and the last reduction)",
                     gpu_stream=("all_gather", "reduce_scatter")),
}


def _element(layout) -> int:
    """Bytes of a parameter or gradient element in DeepSpeed's engine at the run's precision."""
    return 2 if layout.precision in ("bf16", "fp16") else 4


class Options(StrategyOptions):
    name: Literal["zero"] = "zero"
    warm_imports: ClassVar = ("deepspeed",)
    fp16_needs_gpu: ClassVar = "DeepSpeed's fp16 optimizer runs on GPUs only"
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
            _deepspeed.check_config(self.deepspeed_config(layout), self.config)

    def held_fraction(self, total: dict, layout) -> dict:
        """What DeepSpeed holds per rank (``total``: fp32 bytes of the whole model's parameters,
        gradients, optimizer state). In bf16/fp16 its engine holds the parameters and gradients
        in 2 bytes and an fp32 master copy beside the optimizer state (counted as optimizer state,
        as held_bytes counts it): 2 + 2 + 12 bytes per parameter under Adam, the ZeRO paper's
        K = 12. Stage 1 splits the optimizer state (and the master copy), stage 2 also the
        gradients, stage 3 also the parameters. Stage 1 keeps every gradient whole until the end
        of backward, where it reduces them into their owners' partitions (``reduce_gradients``;
        stage 2 reduces each bucket as backward fills it): whole is what it holds at its most."""
        n = layout.dp_size
        half = layout.precision in ("bf16", "fp16")
        out = dict(total)
        if half:
            out["parameters"], out["gradients"] = total["parameters"] / 2, total["gradients"] / 2
            out["optimizer_state"] = total["optimizer_state"] + total["parameters"]  # fp32 master + state
        if self.stage >= 1:
            if not half:
                out["optimizer_state"] = total["optimizer_state"] + total["parameters"]  # fp32 master from stage 1
            out["optimizer_state"] /= n
        if self.stage >= 2:
            out["gradients"] /= n
        if self.stage >= 3:
            out["parameters"] /= n
        return out

    def deepspeed_config(self, layout, grad_clip_norm: float = None) -> dict:
        """The DeepSpeed config of a run at this layout (what ``deepspeed_config.json`` records)."""
        return _deepspeed.make_config(
            micro_batch=layout.accumulation_batch, accumulation=layout.accumulation_steps, dp=layout.dp_size,
            precision=layout.precision, stage=self.stage, offload_optimizer=self.offload_optimizer,
            offload_parameters=self.offload_parameters, grad_clip_norm=grad_clip_norm, extra=self.config)

    def zero_config(self, layout):
        """DeepSpeed's own reading of the run's zero_optimization section, its defaults filled in."""
        # optional: DeepSpeed loads only where its defaults are asked for (the planner's buffer rules).
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        return DeepSpeedZeroConfig(**self.deepspeed_config(layout)["zero_optimization"])

    # ---- the planner's rules (suite.strategies.costs) ----

    @property
    def cannot_fake(self) -> str:
        # Stages 0-2 run on fake tensors: the values DeepSpeed reads during its step are answered
        # (suite.compat.torch.fake_scalars). Stage 3 runs too (its rank agreement check skipped:
        # suite.compat.deepspeed.fake_friendly), but it cuts every parameter and every gathered
        # bucket into one view per rank: a fake op each, 7 minutes for an MLP at 1,024 ranks, over
        # 15 for a 7.5B-parameter model at 64 on 2 busy cores. Its rule is what it holds exactly.
        return "" if self.stage < 3 else ("ZeRO-3's own code makes a fake op per rank per parameter and "
                                          "bucket on fake tensors (minutes at hundreds of ranks)")

    @property
    def no_neutral_checkpoint(self) -> str:
        # Stages 1-3 through DeepSpeed's tensor-fragment API (suite.strategies.neutral); stage 0 is not
        # tested (its torch optimizer is bare: DCP would do, but no test holds it).
        return "" if self.stage >= 1 else (f"its state at strategy.stage={self.stage} is not mapped to the plain "
                                           f"model's names (ZeRO stages 1-3 are)")

    @property
    def overlap(self) -> costs.Overlap:
        return OVERLAP[self.stage]

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        # Messages in the engine's dtype: 2-byte parameters and gradients in bf16/fp16 (its
        # communication_data_type defaults to the model's), as counted on fake tensors.
        g, p = step.gradient_bytes * _element(step.layout) // 4, step.parameter_bytes * _element(step.layout) // 4
        if self.stage == 0:
            return {"all_reduce": (g, 1)}
        # Stages 1-3 also all-reduce the gradients' norm once a step (for clipping and the overflow
        # check, whether or not either is asked for): counted with torch.distributed's calls
        # wrapped, deepspeed 0.19 on gloo at world 2: a float32 at stages 1-2, a float64 at 3.
        if self.stage in (1, 2):
            # Gradients reduced into their owners' partitions (on a CPU by an all-reduce of the
            # bucket, as counted; on GPUs by reduces into each partition: the same bytes as a
            # reduce-scatter), the updated partitions gathered back: the flat buffer padded to
            # 2 x dp elements (DeepSpeed's nccl_start_alignment_factor).
            # Stage 2 reduces every accumulation pass's gradients (counted), stage 1 once a step.
            align = 2 * step.layout.dp_size * _element(step.layout)
            p = -(-p // align) * align
            passes = step.layout.accumulation_steps if self.stage == 2 else 1
            if step.cuda:
                return {"reduce_scatter": (passes * g, passes), "all_gather": (p, 1), "all_reduce": (4, 1)}
            return {"all_reduce": (passes * g + 4, passes + 1), "all_gather": (p, 1)}
        return costs.merged(self._stage3_rule(step), {"all_reduce": (8, 1)})

    def _stage3_rule(self, step: costs.StepSizes) -> costs.Comm:
        """ZeRO-3 as DeepSpeed 0.19 runs it once its trace of the modules is complete (from the
        second step on; counted with torch.distributed's calls wrapped, gloo, world 2):

        - forward all-gathers the units in coalesced calls: a call takes the next unit and
          prefetches the following ones while less than ``stage3_prefetch_bucket_size``
          elements are in flight (5e7 by default: one call for a model below that);
        - backward re-gathers only the units released after forward: a unit is kept where its
          backward use comes within ``max(stage3_max_reuse_distance, prefetch bucket)`` elements
          of its forward use (1e9 by default: nothing is re-gathered below a ~5e8-element model);
        - gradients are reduce-scattered in ``reduce_bucket_size`` buckets;
        - all of it once per accumulation pass (ZeRO-3 reduces every micro-batch's gradients).

        Not FSDP's two gathers of every unit per pass: counted, the MLP 784-512-512-10 makes one
        all-gather of its 2.7 MB per step where that rule said six of 5.4 MB."""
        zero = self.zero_config(step.layout)
        units = [u // 4 for u in step.units if u] or [step.parameter_bytes // 4]  # elements: sized in fp32
        element = _element(step.layout)
        bucket = int(zero.prefetch_bucket_size)
        calls, in_flight = 0, bucket
        for u in units:
            if in_flight >= bucket:
                calls, in_flight = calls + 1, 0
            in_flight += u
        keep_within = max(int(zero.max_reuse_distance), bucket)
        regathered = [u for k, u in enumerate(units) if 2 * sum(units[k + 1:]) > keep_within]
        passes = step.layout.accumulation_steps
        gathered = sum(units) + sum(regathered)
        reduce_calls = -(-step.gradient_bytes // 4 // int(zero.reduce_bucket_size))
        return {"all_gather": (passes * gathered * element, passes * (calls + len(regathered))),
                "reduce_scatter": (passes * step.gradient_bytes * element // 4, passes * max(1, reduce_calls))}

    def persistent_buffer_bytes(self, step: costs.StepSizes) -> int:
        """The gradient bucket of ``reduce_bucket_size`` elements (5e8 by default: 1.9 GiB in fp32,
        whatever the model's size), allocated whole with ``contiguous_gradients`` (on by
        default), twice at stages 1-2 with ``overlap_comm``. On a CPU only the pages the
        gradients fill become resident; on a GPU all of it is device memory."""
        if self.stage == 0:
            return 0
        zero = self.zero_config(step.layout)
        if not zero.contiguous_gradients:
            return 0
        element = 4 if self.stage == 1 or step.layout.precision == "fp32" else 2  # stage 1 reduces in fp32
        buffers = 2 if zero.overlap_comm and self.stage < 3 else 1
        return int(zero.reduce_bucket_size) * element * buffers

    def pass_buffer_bytes(self, step: costs.StepSizes) -> int:
        """Stages 1-3 reduce the gradients as one flat copy of the bucket (at most
        ``reduce_bucket_size``; a gradient larger than the bucket goes alone, uncopied), and gloo
        allocates a scratch of the message's size for the collective (on a CPU; NCCL works in
        buffers of its own): two copies of the message. ZeRO-3 reduces while units are still
        gathered."""
        if self.stage == 0:
            return 0
        bucket = int(self.zero_config(step.layout).reduce_bucket_size) * 4
        message = max(min(step.gradient_bytes, bucket), step.largest_tensor_bytes)
        reduction = message * (1 if step.cuda else 2)
        return reduction + (costs.gathered_units_bytes(step) if self.stage == 3 else 0)

    def optimizer_temporary_bytes(self, step: costs.StepSizes) -> int:
        """Stages 1-3 step one flat partition: as many temporaries per byte as the bare model's
        largest tensor took, for a tensor of 1/dp of the model."""
        if self.stage >= 1 and step.largest_tensor_bytes:
            per_byte = step.optimizer_bytes / step.largest_tensor_bytes
            return int(per_byte * step.model_parameter_bytes / step.parts / step.layout.dp_size)
        return super().optimizer_temporary_bytes(step)

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        return [{"name": "zero", "stage": s} for s in (0, 1, 2, 3)]




class ZeroEngine(_deepspeed.DeepSpeedEngine):
    def __init__(self, setup, ds_engine, stage: int):
        layout = setup.layout
        super().__init__(setup, ds_engine, stage, dp_rank=layout.dp_rank(setup.ctx.rank), dp_size=layout.dp_size)
        self._params = list(ds_engine.module.parameters())
        self._gradient_bytes = 0
        # Stage 1 without overlap_comm reduces the gradients only after the whole backward: until
        # then each is whole (held_fraction), and that is what the rank holds at its most.
        self._whole_until_reduced = stage == 1 and not ds_engine.zero_overlap_comm()

    def train_step(self, inputs, targets) -> StepResult:
        self.ds.train()
        passes, sums = self.setup.layout.accumulation_steps, StepSums(inputs.device)
        for x, y, last in self.setup.accumulation_chunks(inputs, targets):
            out = self.ds(self.cast(x))
            loss = self.setup.task.loss(out, x, y)
            self.ds.backward(loss)  # scales by 1/accumulation itself
            if last:
                self._gradient_bytes = _deepspeed.gradient_bytes(self.ds, self._params, self._whole_until_reduced)
            self.ds.step()  # steps the optimizer only at the accumulation boundary
            sums.add(loss, self.setup.task.correct(out, y), passes)
        result = sums.result(len(inputs), self.grad_norm())
        result.skipped = self.skipped_step()
        return result

    @torch.no_grad()
    def eval_step(self, inputs, targets):
        self.ds.eval()
        out = self.ds(self.cast(inputs))
        return self.setup.task.evaluate(out, inputs, targets)

    def held_bytes(self) -> dict:
        return _deepspeed.held_bytes(self.ds, self._params, self._gradient_bytes)

    def full_model_state(self) -> dict:
        return _deepspeed.full_module_state(self.ds, self.zero_stage, keep=self.setup.ctx.is_main)


def build(opts: Options, setup) -> ZeroEngine:
    ctx = setup.ctx
    deepspeed = _deepspeed.start(ctx, setup.precision, "zero")
    config = opts.deepspeed_config(setup.layout, setup.grad_clip_norm)
    _deepspeed.record_config(setup, config)
    model = setup.prepare(setup.build_model().to(ctx.device))
    optimizer = setup.make_optimizer(model.parameters())
    ds_engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return ZeroEngine(setup, ds_engine, opts.stage)
