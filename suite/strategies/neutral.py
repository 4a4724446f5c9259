"""The strategy-neutral state of a run: what any strategy at any world size can resume from.

``{"model": {name: tensor}, "optimizer": {name: {key: tensor}}}``, keyed by the plain model's
parameter and buffer names (those ``Engine.full_model_state`` exports): the model's parameters
and buffers, and the optimizer's per-parameter state (SGD's ``momentum_buffer``, Adam's
``exp_avg``, ``exp_avg_sq`` and ``step``). The optimizer's hyperparameters are not in it: they
come from the recipe, whose training and optimizer sections a resume may not change.

Tensors are what the engine holds: DTensors where it shards (FSDP2, tensor parallel), whole
tensors elsewhere; ``torch.distributed.checkpoint`` (DCP, ``suite.train.checkpoint``) writes them
as chunks of the whole tensor and reads back whatever chunks another layout asks for.
- torch's own wrappers (single, DDP, FSDP2, tensor parallel, a pipeline stage, whose module keeps
  the whole model's names) go through DCP's ``get_state_dict``/``set_state_dict``;
- DeepSpeed ZeRO keeps flat fp32 partitions: its public tensor-fragment API
  (``deepspeed.utils.safe_get_full_*`` / ``safe_set_full_*``) gathers and scatters them per
  parameter, so its state is whole tensors on every rank (DCP writes each once).
"""
from __future__ import annotations

import torch

# torch.distributed.checkpoint is imported where it is used: it costs 0.75 s at start-up, which
# every process that imports the strategies (suite.submit, each rank) would pay without saving.


def module_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The neutral state of a torch module and its optimizer (DDP, FSDP2 and DTensor unwrapped
    by DCP). A fresh optimizer gets its state made first (DCP steps it once with lr 0), so the
    result is also the template a checkpoint is read into."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optim = get_state_dict(module, optimizer)
    return {"model": model, "optimizer": optim["state"]}


def load_module_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Put ``state`` (the shape ``module_state`` gives) into the module and optimizer; the
    optimizer keeps its own param groups (the recipe's hyperparameters)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_state_dict

    groups = get_optimizer_state_dict(module, optimizer)["param_groups"]
    set_state_dict(module, optimizer, model_state_dict=state["model"],
                   optim_state_dict={"state": state["optimizer"], "param_groups": groups})


def deepspeed_state(engine, inner: torch.optim.Optimizer) -> dict:
    """The neutral state of a DeepSpeed ZeRO engine (stages 1-3); ``inner`` is the torch optimizer
    it steps, its state made (``make_state``). Collective at stage 3 (each parameter's partitions
    are all-gathered)."""
    from deepspeed import utils  # optional: DeepSpeed is loaded only where a ZeRO engine runs

    keys, step = _moment_keys(inner)
    model, optimizer = _buffers(engine.module), {}
    for name, p in engine.module.named_parameters():
        shape = getattr(p, "ds_shape", p.shape)  # ZeRO-3's module holds an empty placeholder
        model[name] = utils.safe_get_full_fp32_param(p).detach().reshape(shape)
        optimizer[name] = {k: utils.safe_get_full_optimizer_state(p, k).detach().reshape(model[name].shape)
                           for k in keys}
        if step is not None:
            optimizer[name]["step"] = step.detach().clone()
    return {"model": model, "optimizer": optimizer}


def load_deepspeed_state(engine, inner: torch.optim.Optimizer, state: dict, gathered) -> None:
    """Put ``state`` into a ZeRO engine: each parameter whole into the module (``gathered``:
    ZeRO-3's ``GatheredParameters``, which partitions what rank 0 wrote; None below stage 3) and
    into DeepSpeed's fp32 master partition, then the optimizer's moments and step."""
    from deepspeed import utils  # optional: DeepSpeed is loaded only where a ZeRO engine runs

    params = dict(engine.module.named_parameters())
    with torch.no_grad():
        for name, value in _buffers(engine.module).items():
            value.copy_(state["model"][name])
        if gathered is None:
            for name, p in params.items():
                p.copy_(state["model"][name])
        else:
            with gathered(list(params.values()), modifier_rank=0):
                for name, p in params.items():
                    p.copy_(state["model"][name])
    keys, _ = _moment_keys(inner)
    for name, p in params.items():
        utils.safe_set_full_fp32_param(p, state["model"][name].to(torch.float32))
        for k in keys:
            utils.safe_set_full_optimizer_state(p, state["optimizer"][name][k].to(torch.float32), k)
    steps = [float(s["step"]) for s in state["optimizer"].values() if "step" in s]
    for flat in inner.state.values():  # every parameter stepped as often: one count
        if "step" in flat and steps:
            flat["step"] = torch.tensor(max(steps), dtype=flat["step"].dtype) if torch.is_tensor(flat["step"]) else max(steps)


def _moment_keys(inner: torch.optim.Optimizer) -> tuple[list[str], torch.Tensor | None]:
    """The per-element state keys of the torch optimizer ZeRO steps over its flat partitions
    (``exp_avg``, ``momentum_buffer``, ...), and its step count where it keeps one."""
    keys, step = set(), None
    for flat in inner.state.values():
        for key, value in flat.items():
            if key == "step":
                step = torch.as_tensor(value)
            elif torch.is_tensor(value) and value.dim() > 0:
                keys.add(key)
    return sorted(keys), step


@torch.no_grad()
def make_state(inner: torch.optim.Optimizer, masters: list) -> None:
    """ZeRO's torch optimizer has no state before its first step, so neither its keys (the template
    a checkpoint is read into) nor anything to load into: made as DCP makes a fresh torch
    optimizer's, by one step with zero gradients at lr 0 over each of this rank's fp32 master
    partitions (``masters``; the partitions do not move). ZeRO-3 hands its torch optimizer one
    partition at a time (its param groups are empty between steps): so here."""
    if inner.state:
        return
    lrs = [group["lr"] for group in inner.param_groups]
    lent = not any(group["params"] for group in inner.param_groups)  # ZeRO-3
    for group in inner.param_groups:
        group["lr"] = 0.0
    for flat in masters:
        if lent:
            for group in inner.param_groups:
                group["params"] = [flat]
        flat.grad = torch.zeros_like(flat)
        inner.step()
        flat.grad = None
    for group, lr in zip(inner.param_groups, lrs):
        group["lr"] = lr
        if lent:
            group["params"] = []


def _buffers(module: torch.nn.Module) -> dict:
    """The module's saved buffers by name (ZeRO partitions parameters only)."""
    params = {name for name, _ in module.named_parameters()}
    return {name: value for name, value in module.state_dict().items() if name not in params}
