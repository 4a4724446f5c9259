"""The analytic StepProfile: for a strategy whose real code cannot run on fake tensors, and for
the prediction every run records (``suite.planner.predict``), which cannot pay for a fake run.

Held bytes are ``suite.planner.memory``'s (the strategy's ``held_fraction``). FLOPs and activations
come from a fake run of the bare model (no strategy) at the rank's batch, split over the
ranks that share one replica (pipeline stages, tensor-parallel ranks) where there are some.
Communication, copies and buffers follow the strategy's own rules, declared on its options class
(``suite.strategies.costs``; docs/architecture.md, "A strategy's rules"): ``comm_rule`` gives the
collectives in the byte conventions of ``suite.planner.profile`` (message sizes per rank per
optimizer step) from G, this rank's model gradient bytes before sharding, P, its parameter bytes
(both fp32, its stage's under a pipeline), and U, the units a sharding strategy gathers one at a
time (every top-level block with parameters, plus the root). A strategy that declares no rule is
refused (SuiteError), never given a default; one rank communicates nothing whatever its rules.

Peak bytes: what the rank holds (parameters, gradients, optimizer state: the estimate), plus
the strategy's buffers that live through the step (``persistent_buffers``: its
``persistent_buffer_bytes``, e.g. DDP's gradient buckets, DeepSpeed ZeRO's gradient bucket), plus
the larger of the two transient phases of the bare model's step at the rank's batch: forward and
backward (its activations, plus the strategy's ``pass_buffer_bytes``: the units a sharding
strategy gathers, ZeRO's copies of the gradients) or the optimizer's update (its temporaries,
which shrink with the shard the optimizer steps: ``optimizer_temporary_bytes``). Measured against the bytes the rank allocated
(``peak_allocated_bytes``); the freed blocks an allocator keeps resident are not predicted, nor
what libraries allocate for themselves beyond gloo's scratch for ZeRO's reduction.
"""
from __future__ import annotations

import copy
from contextlib import nullcontext

from suite.planner.profile import StepProfile


def model_step(recipe) -> dict:
    """FLOPs and bytes of one step of the bare model on the meta device (no strategy, no process
    group, no memory) at the layout's accumulation batch: {"flops", "activation_bytes",
    "optimizer_bytes", "parameter_bytes", "largest_tensor_bytes", "parameter_tensors", "units"}
    (``units``: ``unit_bytes`` of the model). Two steps run: the first creates the optimizer
    state; the second is measured. ``activation_bytes``: the most bytes its forward and backward
    had alive at once beyond the gradients; ``optimizer_bytes``: the most the optimizer's update
    created beyond what existed (its temporaries, the largest tensor's at a time: torch's
    optimizers step the tensors of a CPU model one by one).

    On a GPU (``launch.device: cuda``, as the advisor plans for a preset) the step is the GPU's:
    attention fused (``suite.compat.torch.fused_attention``: no score matrix), the passes in the
    run's bf16/fp16 on a copy of the model in that dtype, the recipe's activation checkpointing
    applied to each block (recomputed in backward), and its operators counted for the GPU's time
    (``ops``: ``suite.planner.counting.OpCosts``, priced by ``suite.planner.gpu_ops``).

    The meta device rather than FakeTensorMode: a backward under FakeTensorMode starts autograd's
    device threads, after which a process can no longer fork ranks that train (a run's rank 0,
    a test process); one on the meta device does not."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from suite.planner.counting import LiveBytes, OpCosts, fake_batch
    from suite.models import empty
    from suite.strategies.tensor import published_roles
    from suite.train.rank import make_setup
    from suite.train.dist import uses_cuda
    from suite.compat import torch as torch_compat
    from suite.strategies import prepare

    layout = recipe.layout()
    setup = make_setup(recipe, None)
    gpu = uses_cuda(recipe.launch.device)
    # On a GPU, attention runs fused (no score matrix held) and a bf16/fp16 run computes in that
    # dtype: the passes run on a copy of the model in it, the update on the fp32 model.
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(recipe.training.precision) if gpu else None
    with torch.random.fork_rng(devices=[]), (torch_compat.fused_attention() if gpu else nullcontext()):
        model = empty.on_meta(setup.build_model)
        runs = copy.deepcopy(model).to(half) if half is not None else model
        if gpu and recipe.training.activation_checkpointing:  # recomputed in backward: counted there
            for block in (b for b in runs.children() if any(True for _ in b.parameters())):
                prepare.checkpoint_block(block, selective=recipe.training.activation_checkpointing == "selective")
        with torch.device("meta"):
            inputs, targets = fake_batch(recipe, layout.accumulation_batch)
        optimizer = setup.make_optimizer(model.parameters())  # its step counters stay on the CPU: Adam reads them
        outputs = []  # each top-level block's output bytes: what a pipeline stage may send on
        blocks = list(runs.children())
        block_flops = [0] * len(blocks)  # each top-level block's forward FLOPs: how a split shares the compute
        hooks = [block.register_forward_hook(lambda _m, _i, out: outputs.append(_tensor_bytes(out)))
                 for block in blocks]
        linears = {}  # name -> (input bytes, output bytes, input needs a gradient): the last pass's
        for name, module in runs.named_modules():
            if isinstance(module, torch.nn.Linear):
                hooks.append(module.register_forward_hook(lambda _m, args, out, name=name: linears.__setitem__(
                    name, (_tensor_bytes(args[0]), _tensor_bytes(out), bool(args[0].requires_grad)))))
        for i, block in enumerate(blocks):
            hooks.append(block.register_forward_pre_hook(lambda _m, _i, i=i: block_flops.__setitem__(
                i, block_flops[i] - flops.get_total_flops())))
            hooks.append(block.register_forward_hook(lambda _m, _i, _o, i=i: block_flops.__setitem__(
                i, block_flops[i] + flops.get_total_flops())))
        for _ in range(2):
            block_flops[:] = [0] * len(blocks)
            flops, passes, update = FlopCounterMode(display=False), LiveBytes(() if gpu else None), LiveBytes()
            pass_ops, update_ops = (OpCosts(), OpCosts()) if gpu else (nullcontext(), nullcontext())
            with flops, passes, pass_ops:
                loss = setup.task.loss(runs(inputs), inputs, targets)
                loss.backward()
            if runs is not model:
                for p, q in zip(model.parameters(), runs.parameters()):
                    p.grad, q.grad = None if q.grad is None else q.grad.float(), None
            with update, update_ops:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for hook in hooks:
        hook.remove()
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    grads = sum(p.numel() * p.element_size() for p in runs.parameters())
    return {"flops": int(flops.get_total_flops()) * layout.accumulation_steps, "boundary_bytes": max(outputs, default=0),
            "activation_bytes": max(passes.peak - grads, 0), "optimizer_bytes": update.peak,
            "parameter_bytes": sum(sizes), "largest_tensor_bytes": max(sizes, default=0),
            "parameter_tensors": len(sizes), "units": unit_bytes(model), "block_flops": block_flops,
            "block_parameters": [sum(p.numel() for p in block.parameters()) for block in blocks],
            "linears": [[name, *io] for name, io in linears.items()],
            "ops": {"passes": pass_ops.summary(layout.accumulation_steps), "update": update_ops.summary()} if gpu else {},
            "tensor_roles": sorted(published_roles(model).items()),
            "pass_events": passes.events(),  # on a GPU: the passes' allocations, for the caching allocator
            "batchnorm_channels": [m.num_features for m in model.modules() if isinstance(
                m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d, torch.nn.SyncBatchNorm))]}


def stage_share(recipe, step: dict) -> float | None:
    """The share of the model's compute its busiest pipeline stage does (which sets a pipeline's
    pace), by the blocks each stage gets: the strategy's ``split_at``, else parameter-balanced as
    the splitting strategies cut (``suite.strategies.splitting``; DeepSpeed's ``partition:
    uniform`` by block count); None where the model is not cut into stages."""
    from suite.strategies.splitting import balanced_split

    stages, flops = recipe.layout().degree("pipeline"), step.get("block_flops") or []
    if stages < 2 or len(flops) < stages or not sum(flops):
        return None
    split = getattr(recipe.strategy, "split_at", None)
    if split is None:
        uniform = getattr(recipe.strategy, "partition", "parameters") == "uniform"
        split = balanced_split([1] * len(flops) if uniform else step["block_parameters"], stages)
    edges = [0, *split, len(flops)]
    return max(sum(flops[a:b]) for a, b in zip(edges, edges[1:])) / sum(flops)


def _rank_flops(step: dict, parts: int, share: float | None) -> int:
    """This rank's FLOPs per step: its pipeline stage's ``share`` where the model is cut into stages
    (the busiest stage's: it sets the pace), else an even share of the ranks holding one replica."""
    return int(step["flops"] * share) if share is not None else step["flops"] // parts


def _tensor_bytes(value) -> int:
    if hasattr(value, "numel"):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def unit_bytes(model) -> list[int]:
    """Parameter bytes of the units a sharding strategy gathers one at a time: each block with
    parameters (``suite.models.units``: the top-level ones, or an HF model's own), then the
    root's own (what is left)."""
    from suite.models import units

    blocks = [sum(p.numel() * p.element_size() for p in block.parameters()) for block in units(model)]
    blocks = [b for b in blocks if b]
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return blocks + ([total - sum(blocks)] if total > sum(blocks) else [])


def strategy_rules(options, *rules: str):
    """The strategy's options, SuiteError (one line, naming the strategy and the rule) where it
    declares none of ``rules`` (default: all of them): never a default cost model."""
    from suite.strategies import costs

    costs.require(options, *rules)
    return options


def step_sizes(recipe, g: int, p: int, step: dict, parts: int = 1):
    """What the strategy's rules read of this rank's step (``suite.strategies.costs.StepSizes``);
    ``g`` and ``p``: its gradient and parameter bytes before sharding (its stage's, under a
    pipeline); ``step``: ``model_step``'s result."""
    from suite.strategies.costs import StepSizes
    from suite.train.dist import uses_cuda

    return StepSizes(layout=recipe.layout(), gradient_bytes=g, parameter_bytes=p,
                     parameter_tensors=step.get("parameter_tensors", 0), units=tuple(step.get("units", ())),
                     largest_tensor_bytes=step.get("largest_tensor_bytes", 0),
                     model_parameter_bytes=step.get("parameter_bytes", 0),
                     optimizer_bytes=step.get("optimizer_bytes", 0), parts=parts,
                     cuda=uses_cuda(recipe.launch.device), boundary_bytes=step.get("boundary_bytes", 0),
                     batchnorm_channels=tuple(step.get("batchnorm_channels", ())), model_name=recipe.model.name,
                     linears=tuple(tuple(x) for x in step.get("linears", ())),
                     tensor_roles=tuple(tuple(x) for x in step.get("tensor_roles", ())))


def communication(recipe, g: int, p: int, step: dict) -> dict[str, tuple[int, int]]:
    """{kind: (bytes, calls)} per rank per step by the strategy's ``comm_rule`` (module doc);
    nothing at world size 1."""
    strategy = strategy_rules(recipe.strategy, "comm_rule")
    if recipe.world_size == 1:
        return {}
    from suite.strategies.costs import merged

    sizes = step_sizes(recipe, g, p, step)
    return dict(merged(strategy.comm_rule(sizes), data_communication(recipe, g, p, step)))


def data_comm(recipe, step: dict | None = None) -> dict[str, list[int]]:
    """``StepProfile.data_comm`` of ``recipe`` (at its world size): [bytes, calls] by kind of the
    collectives that run over the data-parallel ranks whatever the strategy declares; ``step``:
    ``model_step(recipe)`` where counted already."""
    if recipe.world_size == 1 or not recipe.training.sync_batchnorm:
        return {}
    step = step or model_step(recipe)
    layout = recipe.layout()
    stage_bytes = step["parameter_bytes"] // max(1, recipe.world_size // layout.dp_size)
    return {k: [b, c] for k, (b, c) in data_communication(recipe, stage_bytes, stage_bytes, step).items()}


def data_communication(recipe, g: int, p: int, step: dict) -> dict[str, tuple[int, int]]:
    """The part of ``communication`` that runs over the data-parallel ranks whatever the
    strategy declares for its kind (``StepProfile.data_comm``): batch norm synced over them."""
    if recipe.world_size == 1 or not recipe.training.sync_batchnorm:
        return {}
    from suite.strategies.costs import synced_batchnorm

    return dict(synced_batchnorm(step_sizes(recipe, g, p, step)))


def copy_bytes(recipe, comm_bytes: dict[str, int], data_comm: dict[str, list[int]] | None = None) -> int:
    """Bytes a rank copies per step besides compute and collectives (``StepProfile.copy_bytes``),
    from the step's message sizes (``comm_bytes``, by kind; the fake run's or ``communication``'s)
    less those of ``data_comm`` (batch norm's: no strategy copies them): the strategy's
    ``copy_bytes`` (FSDP2's gathers and reduce-scatters copy into and out of their buffers;
    flat-parameter wrappers copy nothing counted); nothing at world size 1."""
    if recipe.world_size == 1:
        return 0
    own = {k: b - (data_comm or {}).get(k, [0])[0] for k, b in comm_bytes.items()}
    return recipe.strategy.copy_bytes(own, recipe.layout())


def persistent_buffers(recipe, g: int) -> int:
    """Bytes a strategy keeps beside what the rank holds through the whole step (its
    ``persistent_buffer_bytes``: DDP's buckets, DeepSpeed ZeRO's gradient bucket)."""
    return recipe.strategy.persistent_buffer_bytes(step_sizes(recipe, g, g, {}))


def backward_buffers(recipe, step: dict, g: int) -> int:
    """Bytes a strategy allocates during the passes beside what the rank holds and the model's
    activations, at their most (its ``pass_buffer_bytes``: the units FSDP and ZeRO-3 gather,
    ZeRO's copies of the gradients); nothing at world size 1."""
    if recipe.world_size == 1:
        return 0
    return recipe.strategy.pass_buffer_bytes(step_sizes(recipe, g, g, step))


def optimizer_temporaries(recipe, step: dict, parts: int) -> int:
    """The optimizer's temporaries, scaled to the tensors it steps (the strategy's
    ``optimizer_temporary_bytes``): the bare model's over the ranks sharing a replica, less
    where the optimizer steps shards (FSDP, DeepSpeed's flat partition)."""
    stage_bytes = step["parameter_bytes"] // parts
    return recipe.strategy.optimizer_temporary_bytes(step_sizes(recipe, stage_bytes, stage_bytes, step, parts))


def profile(recipe, world_size: int, reason: str, step: dict | None = None) -> StepProfile:
    """The analytic StepProfile of ``recipe`` (already at ``world_size``); ``reason``: why the
    fake run could not be used, kept in ``notes``; ``step``: ``model_step(recipe)`` where the
    caller counted it already (the advisor counts each batch once)."""
    from suite.planner.memory import predicted_held_bytes

    strategy_rules(recipe.strategy)  # every rule declared, before a second is spent on the model
    layout = recipe.layout()
    step = step or model_step(recipe)
    stages = layout.degree("pipeline")
    parts = max(1, recipe.world_size // layout.dp_size)  # ranks sharing one replica: pipeline stages x tensor ranks
    estimate = predicted_held_bytes(recipe)
    held = {k: int(v) for k, v in estimate["per_rank"].items()}
    activations = step["activation_bytes"] // parts  # split over the stages or tensor ranks
    stage_bytes = step["parameter_bytes"] // parts
    transient = max(activations + backward_buffers(recipe, step, stage_bytes), optimizer_temporaries(recipe, step, parts))
    comm = communication(recipe, stage_bytes, stage_bytes, step)
    over_data = data_comm(recipe, step)
    share = stage_share(recipe, step)
    comm_bytes = {k: b for k, (b, _) in comm.items()}
    notes = [f"analytic: {reason}", "peak = held + the strategy's buffers + the larger of the passes "
             "(activations, gathered units) and the optimizer's update (its temporaries)"]
    if stages > 1:
        notes.append("messages between stages sized by the largest top-level block's output")
    peak = int(sum(held.values()) + persistent_buffers(recipe, stage_bytes) + transient)
    return StepProfile(strategy=recipe.strategy.name, world_size=world_size, held_bytes=held,
                       peak_bytes=peak, reserved_bytes=reserved_bytes(recipe, step, peak, parts, comm),
                       flops=_rank_flops(step, parts, share), samples=recipe.training.batch_size,
                       comm_bytes=comm_bytes, comm_calls={k: c for k, (_, c) in comm.items()}, data_comm=over_data,
                       copy_bytes=copy_bytes(recipe, comm_bytes, over_data), source="analytic", notes="; ".join(notes),
                       stage_share=share, ops=_rank_ops(step, estimate, parts, share))


def reserved_bytes(recipe, step: dict, peak: int, parts: int, comm: dict) -> int | None:
    """On a GPU, what the caching allocator reserves (``StepProfile.reserved_bytes``): ``peak``
    plus what the passes' allocations, replayed through its rules (``caching_allocator``), reserve
    beyond their own peak (rounding, fragmentation), plus what each of the strategy's side streams
    keeps cached for its collectives' buffers, a call's buffer per unit, two in flight."""
    if not step.get("pass_events"):
        return None
    from suite.planner import caching_allocator

    events = [(e[0], e[1], e[2] // parts, e[3]) if e[0] == "alloc" else e for e in step["pass_events"]]
    passes = caching_allocator.replay(events)
    side = 0
    units = list(step.get("units") or ()) or [step["parameter_bytes"]]
    for kind in getattr(recipe.strategy, "side_stream_collectives", ()):
        sent, calls = comm.get(kind, (0, 0))
        if not sent:
            continue
        rounds = max(1, calls // len(units))  # e.g. a gather per unit before forward and before backward
        scale = sent / (rounds * sum(units))  # the bytes a call moves per byte of its unit
        sizes = [int(u * scale) for u in units] * rounds
        side += caching_allocator.replay(caching_allocator.one_after_another(sizes, kind))["reserved_bytes"]
    return peak + passes["reserved_bytes"] - passes["requested_bytes"] + side


def _rank_ops(step: dict, estimate: dict, parts: int, share: float | None) -> dict:
    """``StepProfile.ops``: the bare model's operators (``model_step``), the passes' share this
    rank runs (its stage's, or an even share of the ranks holding one replica) and the share of
    the optimizer's update it steps (its optimizer state over the whole model's)."""
    if not step.get("ops"):
        return {}
    total, mine = estimate["total"], estimate["per_rank"]
    whole = total["optimizer_state"] + (total["parameters"] if mine["optimizer_state"] > total["optimizer_state"] else 0)
    return {**step["ops"], "passes_share": share if share is not None else 1 / parts,
            "update_share": min(1.0, mine["optimizer_state"] / whole) if whole else 1 / parts}

