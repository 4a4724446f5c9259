"""What the DeepSpeed strategies (zero, ds_pipeline) share: start-up, the config written from the
recipe, validation of expert pass-through keys, the engine base (casting, per-rank state) and
the bytes a rank holds.

Not a strategy itself (not in ``_MODULES``). DeepSpeed is imported only inside functions here,
so reading a recipe without a ``strategy.config`` block never imports it.
"""
from __future__ import annotations

import copy
import importlib
import json
import os
from pathlib import Path

from suite.strategies.engine import Engine
from suite.common.errors import SuiteError
from pydantic import ValidationError
from suite.compat import deepspeed as ds_compat
import logging
import torch
import torch.distributed as dist
from suite.record.metrics import optimizer_state_bytes, tensor_bytes
from suite.strategies import clip, neutral

# DeepSpeed keys the recipe decides; setting them in strategy.config would let the two disagree.
OWNED = {
    ("train_batch_size",): "training.batch_size",
    ("train_micro_batch_size_per_gpu",): "training.batch_size (with training.grad_accumulation)",
    ("gradient_accumulation_steps",): "training.grad_accumulation (ds_pipeline: strategy.micro_batches)",
    ("optimizer",): "the recipe's optimizer section",
    ("scheduler",): "optimizer.schedule",
    ("zero_optimization", "stage"): "strategy.stage (ds_pipeline: strategy.zero_stage)",
    ("zero_optimization", "offload_optimizer", "device"): "strategy.offload_optimizer",
    ("zero_optimization", "offload_param", "device"): "strategy.offload_parameters",
    ("gradient_clipping",): "training.grad_clip_norm",
    ("bf16", "enabled"): "training.precision",
    ("fp16", "enabled"): "training.precision",
}


def make_config(*, micro_batch: int, accumulation: int, dp: int, precision: str, stage: int,
                offload_optimizer: bool = False, offload_parameters: bool = False, grad_clip_norm: float = None,
                extra: dict = None) -> dict:
    """The DeepSpeed config of a run; batch sizes always satisfy train = micro x accumulation x dp."""
    zero = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # else small parameters stay whole on every rank
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if offload_parameters:
        zero["offload_param"] = {"device": "cpu"}
    config = {
        "train_batch_size": micro_batch * accumulation * dp,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": accumulation,
        # training.grad_clip_norm where DeepSpeed clips (suite_clips); its default is 1.0, 0 clips nothing
        "gradient_clipping": 0.0 if suite_clips(stage, precision) else grad_clip_norm or 0.0,
        "steps_per_print": 2**31 - 1,  # the loop reports progress
        "zero_optimization": zero,
        # The recipe's torch optimizer is passed in, so it steps exactly like the baseline:
        "zero_allow_untested_optimizer": True,  # SGD (anything but Adam/AdamW) under ZeRO
        "zero_force_ds_cpu_optimizer": False,  # offload with a torch optimizer, no C++ CPUAdam build
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
    }
    return merge(config, extra or {})


def suite_clips(zero_stage: int, precision: str) -> bool:
    """Whether the suite, not DeepSpeed, applies ``training.grad_clip_norm``: where DeepSpeed
    steps the recipe's torch optimizer unwrapped (ZeRO stage 0 in fp32), its own clip
    (``engine.clip_fp32_gradients``) drops the norm it computed, and under the pipeline engine
    norms only the first stage's gradients (DeepSpeed 0.19.8's ``runtime.utils.clip_grad_norm_``
    counts a parameter only on model-parallel rank 0 unless it is marked model-parallel): clipped
    that way, ds_pipeline leaves single's losses by 0.14 within 8 steps. There the engine clips in
    a step pre-hook of that optimizer (``DeepSpeedEngine``). DeepSpeed's ZeRO and bf16/fp16
    optimizers clip by the global norm, keep it, and unscale fp16 gradients first."""
    return zero_stage == 0 and precision == "fp32"


def merge(base: dict, extra: dict, path: tuple = ()) -> dict:
    """``base`` with ``extra`` merged in, dicts recursively; refuses keys the recipe owns."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        where = path + (key,)
        if where in OWNED:
            raise SuiteError(f"strategy.config.{'.'.join(where)} is set from the recipe; use "
                             f"{OWNED[where]} instead")
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value, where)
        else:
            out[key] = copy.deepcopy(value)
    return out


class _ReadLog(dict):
    """A dict that remembers which keys were looked up, nested dicts too. A key DeepSpeed never
    reads while parsing its config is one it does not know (it would be silently ignored)."""

    def __init__(self, data=(), reads=None):
        items = dict.items(data) if isinstance(data, dict) else dict(data).items()  # no lookups logged
        super().__init__({k: v if isinstance(v, _ReadLog) else _ReadLog(v) if isinstance(v, dict) else v
                          for k, v in items})
        self.reads = {} if reads is None else reads  # key -> None, most recent lookup last

    def _note(self, key):
        self.reads.pop(key, None)
        self.reads[key] = None

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

    def __iter__(self):  # also makes ``**block`` look keys up one by one (no dict fast path)
        return super().__iter__()

    def __copy__(self):
        return _ReadLog(self, reads=self.reads)

    def unread(self, path=()):
        """Paths of keys never looked up. A block none of whose keys was looked up was taken whole
        (e.g. ``pipeline``, copied item by item; ``scheduler.params``, read later by the scheduler),
        so DeepSpeed's parse cannot judge its keys: it is not reported."""
        if path and not self.reads:
            return []
        out = []
        for key, value in dict.items(self):
            if key not in self.reads:
                out.append(path + (key,))
            elif isinstance(value, _ReadLog):
                out += value.unread(path + (key,))
        return out


def check_config(config: dict, extra: dict) -> None:
    """Parse ``config`` as DeepSpeed does (for one data-parallel rank); an error names the
    ``strategy.config`` key. Imports DeepSpeed: call only when ``extra`` is not empty."""
    quiet_import()


    config = {**config, "train_batch_size": config["train_micro_batch_size_per_gpu"]
              * config["gradient_accumulation_steps"]}  # parsed as if for one rank
    parsed = _ReadLog(config)
    try:
        ds_compat.config_class()(parsed)
    except ValidationError as e:
        err = e.errors()[0]
        section = next(reversed(parsed.reads))  # DeepSpeed's sub-configs locate errors within their block
        where = ".".join(str(p) for p in (section, *err["loc"]))
        msg = err["msg"][0].lower() + err["msg"][1:]
        raise SuiteError(f"strategy.config.{where}={err.get('input')!r}: {msg} (DeepSpeed config; "
                         f"see https://www.deepspeed.ai/docs/config-json/)") from None
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SuiteError(f"strategy.config is refused by DeepSpeed: {first}") from None
    unknown = [".".join(map(str, p)) for p in parsed.unread() if _within(p, extra)]
    if unknown:
        raise SuiteError(f"unknown recipe key strategy.config.{unknown[0]}: DeepSpeed does not read it "
                         f"(see https://www.deepspeed.ai/docs/config-json/ for accepted keys)")


def _within(path: tuple, extra: dict) -> bool:
    """Whether ``path`` is a key the user wrote (not one the suite generated)."""
    node = extra
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def quiet_import():
    """Import DeepSpeed with its INFO chatter off; returns the module."""


    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # else it probes and warns on stderr
    deepspeed = importlib.import_module("deepspeed")
    deepspeed.utils.logger.setLevel(logging.WARNING)
    return deepspeed


def preload() -> None:
    """Import DeepSpeed and the modules ``deepspeed.initialize`` imports lazily (its Muon optimizer
    module pulls in torch._inductor: ~7 s). For a parent process about to fork ranks (tests)."""

    quiet_import()
    ds_compat.preload_modules()


def start(ctx, precision: str, strategy: str):
    """Import DeepSpeed and make it reuse the process group ``suite.train.dist`` created."""
    if precision == "fp16" and ctx.device.type == "cpu":
        raise SuiteError(f"training.precision=fp16 with strategy {strategy} needs a GPU; use bf16 or fp32 on CPU")
    if ctx.device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # else it probes and warns
    os.environ.setdefault("LOCAL_RANK", str(ctx.local_rank))  # without it DeepSpeed tries MPI
    deepspeed = quiet_import()

    ds_compat.skip_shm_op_build()  # compiled on first use (60-80 s on 2 cores); training never uses it
    ds_compat.announce_op_builds()  # expert config may need an op: say so, and where it is cached
    deepspeed.init_distributed(dist_backend=ctx.backend, auto_mpi_discovery=False)
    from deepspeed import comm
    assert comm.get_world_size() == dist.get_world_size(), "DeepSpeed did not join the suite's process group"
    return deepspeed


def record_config(setup, config: dict) -> None:
    """Write the config DeepSpeed runs with to the run folder (rank 0)."""
    if setup.run_dir and setup.ctx.is_main:
        Path(setup.run_dir, "deepspeed_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


class DeepSpeedEngine(Engine):
    """What the zero and ds_pipeline engines share: the DeepSpeed engine, input casting, and
    per-rank state (loads at the same world size and stage)."""

    def __init__(self, setup, ds_engine, zero_stage: int, dp_rank: int, dp_size: int):

        self.setup, self.ds, self.zero_stage = setup, ds_engine, zero_stage
        self.dp_rank, self.dp_size = dp_rank, dp_size
        # DeepSpeed's bf16/fp16 modes keep the module in half precision: inputs must match.
        self._input_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.precision)
        self._grad_norm = None  # the norm the suite clipped by (suite_clips), per step
        self.skipped_steps = 0  # fp16: steps DeepSpeed's loss scaler skipped (skipped_step)
        if setup.grad_clip_norm and suite_clips(zero_stage, setup.precision):

            # Runs after DeepSpeed has reduced the gradients, just before the optimizer steps.
            ds_compat.inner_optimizer(ds_engine).register_step_pre_hook(lambda *_: self._clip())

    def _clip(self) -> None:

        self._grad_norm = clip.clip_grad_norm_(self.ds.module.parameters(), self.setup.grad_clip_norm,
                                               stage_group=self.stage_group())

    def stage_group(self):
        """The process group over which this rank's part of the model adds up to the whole
        model (pipeline stages); None where each rank holds the whole model."""
        return None

    def skipped_step(self):
        """fp16: whether DeepSpeed's loss scaler skipped the step just taken (an inf/NaN gradient),
        counted for the summary; None in other precisions (no scaler)."""
        if self.setup.precision != "fp16":
            return None
        skipped = not self.ds.was_step_applied()
        self.skipped_steps += skipped
        return skipped

    def scaling_record(self) -> dict:
        return {"skipped_steps": self.skipped_steps} if self.setup.precision == "fp16" else {}

    def cast(self, x):
        return x.to(self._input_dtype) if self._input_dtype and x.is_floating_point() else x

    def grad_norm(self):
        """The global gradient norm before clipping of the last optimizer step, as DeepSpeed
        (or the suite) computed it to clip; None when the recipe does not clip."""

        if not self.setup.grad_clip_norm:
            return None
        norm = self._grad_norm if self._grad_norm is not None else self.ds.get_global_grad_norm()
        return None if norm is None else torch.as_tensor(norm).detach().float()

    def optimizer_groups(self) -> list[dict]:
        # DeepSpeed's wrappers (ZeRO 1-3, bf16) hand out the recipe's torch optimizer's own groups,
        # the ones that optimizer steps with; DeepSpeed changes no lr itself (no "scheduler" key).
        return self.ds.optimizer.param_groups

    def state_dict(self) -> dict:
        # ZeRO-3's module holds only placeholders: its weights come back from the fp32 partitions.
        model = self.ds.module.state_dict() if self.zero_stage < 3 else None
        return {"model": model, "optimizer": self.ds.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("model") is not None:
            self.ds.module.load_state_dict(state["model"])
        if self.zero_stage == 0:
            self.ds.optimizer.load_state_dict(state["optimizer"])
            return
        # ZeRO optimizers take a list over data-parallel ranks and read their own entry; their
        # fp32 partitions are the master weights, from which the module's parameters are refreshed.
        states = [None] * self.dp_size
        states[self.dp_rank] = state["optimizer"]
        self.ds.optimizer.load_state_dict(states, load_from_fp32_weights=True)


    def neutral_state(self) -> dict:
        inner = ds_compat.inner_optimizer(self.ds)
        if self.zero_stage == 0:  # the recipe's torch optimizer over the module's own parameters
            return neutral.module_state(self.ds.module, inner)
        neutral.make_state(inner, ds_compat.master_weights(self.ds))
        ds_compat.link_optimizer_state(self.ds)
        return neutral.deepspeed_state(self.ds, inner)

    def load_neutral_state(self, state: dict) -> None:
        inner = ds_compat.inner_optimizer(self.ds)
        if self.zero_stage == 0:
            neutral.load_module_state(self.ds.module, inner, state)
            return
        neutral.make_state(inner, ds_compat.master_weights(self.ds))
        ds_compat.link_optimizer_state(self.ds)
        gathered = quiet_import().zero.GatheredParameters if self.zero_stage == 3 else None
        neutral.load_deepspeed_state(self.ds, inner, state, gathered)


def full_module_state(engine, zero_stage: int, keep: bool) -> dict:
    """The DeepSpeed engine's module state whole, on CPU, where ``keep`` (else {}); collective.
    Stages 0-2 hold every parameter on every rank; stage 3 gathers each top-level block's
    partitions in turn (``deepspeed.zero.GatheredParameters``), so one block at a time is whole."""
    module = engine.module
    if zero_stage < 3:
        return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()} if keep else {}
    gathered = quiet_import().zero.GatheredParameters  # deepspeed.zero: the public name of ZeRO-3's gather
    out = {}
    parts = [("", module, False)] + [(f"{name}.", child, True) for name, child in module.named_children()]
    for prefix, part, recurse in parts:
        with gathered(list(part.parameters(recurse=recurse)), modifier_rank=None):
            if not keep:
                continue
            if recurse:
                state = part.state_dict(prefix=prefix)
            else:  # the root's own parameters and buffers (no dot in their names), not its children's
                state = {k: v for k, v in part.state_dict().items() if "." not in k}
            out.update({k: v.detach().to("cpu", copy=True) for k, v in state.items()})
    return out


def held_bytes(engine, params, gradient_bytes: int) -> dict:
    """Bytes this rank holds: parameters (ZeRO-3: this rank's partitions), gradients (measured
    after backward), optimizer state = the inner optimizer's state plus DeepSpeed's fp32 master
    weights (suite.compat.deepspeed knows where each ZeRO stage keeps them)."""

    return {"parameters": tensor_bytes(ds_compat.parameter_partitions(engine, params)), "gradients": gradient_bytes,
            "optimizer_state": optimizer_state_bytes(ds_compat.inner_optimizer(engine))
            + tensor_bytes(ds_compat.master_weights(engine))}


def gradient_bytes(engine, params, whole: bool = False) -> int:
    """Gradient bytes this rank holds right after backward: full ``p.grad`` where DeepSpeed keeps
    them, its partitioned buffers, and the gradients of the inner optimizer's parameters (the fp32
    partitions, which hold them under optimizer offload). Views of one buffer are counted once.
    ``whole``: where the gradients were whole until backward ended and DeepSpeed reduced them
    (ZeRO-1 without overlap_comm), the whole gradients in the parameters' dtype, what the rank
    held at its most."""
    if whole:
        return sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    inner = ds_compat.inner_optimizer(engine)
    params = list(params) + [p for group in inner.param_groups for p in group["params"]]
    return distinct_bytes([p.grad for p in params if p.grad is not None] + ds_compat.gradient_buffers(engine))


def distinct_bytes(tensors) -> int:
    """Bytes of the distinct memory behind ``tensors`` (a view counts as its own extent)."""
    spans = {}
    for t in tensors:
        start = t.data_ptr()
        end = start + t.numel() * t.element_size()
        spans[start] = max(spans.get(start, start), end)
    total, reach = 0, 0
    for start in sorted(spans):
        end = spans[start]
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
