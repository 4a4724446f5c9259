"""The analytic StepProfile: for a strategy whose real code cannot run on fake tensors, and for
the prediction every run records (``suite.planner.predict``), which cannot pay for a fake run.

Held bytes are ``suite.estimate``'s (the strategy's ``held_fraction``). FLOPs and activations
come from a fake run of the bare model (no strategy) at the rank's batch, split over the
ranks that share one replica (pipeline stages, tensor-parallel ranks) where there are some. Communication follows the per-strategy rules of
``communication`` (the one copy of them), in the byte conventions of ``suite.planner.profile``
(message sizes per rank per optimizer step; G: this rank's model gradient bytes before
sharding, P: its parameter bytes, both fp32; U: the units a sharding strategy gathers one at a
time, every top-level block with parameters plus the root):

- ``ddp``: all_reduce G in buckets of ``bucket_cap_mb`` (25 MiB by default), a call each.
- ``allreduce``: all_reduce G, a call per parameter tensor (it reduces each gradient alone).
- ``zero`` stage 0: all_reduce G. Stages 1 and 2: reduce_scatter G (gradients reduced into
  their owners' partitions), all_gather P (the updated partitions gathered back), a call each.
  Stage 3: all_gather P twice (before each unit's forward and its backward), reduce_scatter G,
  a call per unit and pass.
- ``fsdp``/``fsdp1``: as ZeRO-3 (``reshard_after_forward: false``: one gather per unit).
- ``oss`` (fairscale optimizer state sharding): all_reduce G (every gradient, as DDP), then
  broadcast P (each updated shard from the rank that owns it).
- ``ds_pipeline``/``pipeline``/``layer_split``: all_reduce of the stage's gradients over its
  data-parallel group when dp > 1; the send and recv of activations between stages are not
  counted (no fake run saw them).
- ``tensor``: the all-reduces inside each layer depend on the layers: not counted here (the
  fake run of ``python -m suite.plan`` counts them).
- ``hogwild``: none (the ranks share one copy of the parameters in memory).
- anything else: the data-parallel rule, all_reduce G when there is more than one data rank.

Peak bytes: what the rank holds (parameters, gradients, optimizer state: the estimate) plus the
bare model's activations and temporaries at the rank's batch, plus the strategy's own buffers
(``strategy_buffers``: DDP's gradient buckets, the unit a sharding strategy gathers).
"""
from __future__ import annotations

from suite.planner.profile import StepProfile


def model_step(recipe) -> dict:
    """FLOPs and bytes of one step of the bare model on the meta device (no strategy, no process
    group, no memory): {"flops", "peak_bytes", "parameter_bytes", "parameter_tensors", "units"}
    at the plan's accumulation batch (``units``: ``unit_bytes`` of the model). Two steps run: the first creates the optimizer state; the second is measured, and its
    ``peak_bytes`` are the most bytes created during it alive at once (gradients, activations,
    the optimizer's temporaries), not what existed before it.

    The meta device rather than FakeTensorMode: a backward under FakeTensorMode starts autograd's
    device threads, after which a process can no longer fork ranks that train (a run's rank 0,
    a test process); one on the meta device does not."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from suite.planner.fake_run import _LiveBytes, fake_batch
    from suite.train.rank import make_setup

    plan = recipe.plan()
    setup = make_setup(recipe, None)
    with torch.random.fork_rng(devices=[]):
        with torch.device("meta"):
            model = setup.build_model()
            inputs, targets = fake_batch(recipe, plan.accumulation_batch)
        optimizer = setup.make_optimizer(model.parameters())  # its step counters stay on the CPU: Adam reads them
        for _ in range(2):
            flops, live = FlopCounterMode(display=False), _LiveBytes()
            with flops, live:
                loss = setup.task.loss(model(inputs), inputs, targets)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"flops": int(flops.get_total_flops()) * plan.accumulation_steps, "peak_bytes": live.peak,
            "parameter_bytes": parameters, "parameter_tensors": sum(1 for _ in model.parameters()),
            "units": unit_bytes(model)}


DDP_BUCKET_MB = 25  # torch DDP's default bucket_cap_mb
NO_COLLECTIVES = ("hogwild", "single", "tf_single")


def unit_bytes(model) -> list[int]:
    """Parameter bytes of the units a sharding strategy gathers one at a time: each top-level
    block with parameters, then the root's own (what is left)."""
    blocks = [sum(p.numel() * p.element_size() for p in block.parameters()) for block in model.children()]
    blocks = [b for b in blocks if b]
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return blocks + ([total - sum(blocks)] if total > sum(blocks) else [])


def communication(recipe, g: int, p: int, step: dict) -> dict[str, tuple[int, int]]:
    """{kind: (bytes, calls)} per rank per step by the rules in the module doc; ``g`` and ``p``:
    this rank's gradient and parameter bytes before sharding (its stage's, under a pipeline);
    ``step``: ``model_step``'s result (the model's units and parameter tensors)."""
    strategy, plan = recipe.strategy, recipe.plan()
    name, dp = strategy.name, plan.dp_size
    if recipe.world_size == 1 or name in NO_COLLECTIVES or name == "tensor":
        return {}
    if name == "ddp":
        bucket = (getattr(strategy, "bucket_cap_mb", None) or DDP_BUCKET_MB) * 2**20
        return {"all_reduce": (g, max(1, -(-g // int(bucket))))} if dp > 1 else {}
    if name == "allreduce":
        return {"all_reduce": (g, step["parameter_tensors"])}
    if name == "zero" and strategy.stage == 0:
        return {"all_reduce": (g, 1)}
    if name == "zero" and strategy.stage in (1, 2):
        return {"reduce_scatter": (g, 1), "all_gather": (p, 1)}
    if (name == "zero" and strategy.stage == 3) or name in ("fsdp", "fsdp1", "fairscale_fsdp"):
        n = len(step["units"]) or 1
        gathers = 1 if getattr(strategy, "reshard_after_forward", True) is False else 2
        return {"all_gather": (gathers * p, gathers * n), "reduce_scatter": (g, n)}
    if name == "oss":
        return {"all_reduce": (g, 1), "broadcast": (p, 1)}
    return {"all_reduce": (g, 1)} if dp > 1 else {}


def strategy_buffers(recipe, g: int, step: dict) -> int:
    """Bytes a strategy allocates beside what the rank holds and the model's activations, at their
    most during a step: DDP's buckets (a copy of every gradient, ``gradient_as_bucket_view`` off);
    a sharding strategy's largest unit gathered whole (its parameters, then its gradients before
    the reduce-scatter)."""
    name = recipe.strategy.name
    if recipe.world_size == 1:
        return 0
    if name == "ddp":
        return g
    if name in ("fsdp", "fsdp1", "fairscale_fsdp") or (name == "zero" and recipe.strategy.stage == 3):
        return 2 * max(step["units"], default=0)
    return 0


def profile(recipe, world_size: int, reason: str) -> StepProfile:
    """The analytic StepProfile of ``recipe`` (already at ``world_size``); ``reason``: why the
    fake run could not be used, kept in ``notes``."""
    from suite.estimate import predicted_held_bytes

    plan = recipe.plan()
    step = model_step(recipe)
    stages = plan.degree("pipeline")
    parts = max(1, recipe.world_size // plan.dp_size)  # ranks sharing one replica: pipeline stages x tensor ranks
    estimate = predicted_held_bytes(recipe)
    held = {k: int(v) for k, v in estimate["per_rank"].items()}
    # The bare model's step peak minus its gradients: activations and temporaries, split over the
    # stages; the strategy's own buffers are not in it (strategy_buffers).
    activations = max(step["peak_bytes"] - estimate["total"]["gradients"], 0) // parts
    stage_bytes = step["parameter_bytes"] // parts
    comm = communication(recipe, stage_bytes, stage_bytes, step)
    notes = [f"analytic: {reason}", "peak = held + the bare model's activations + the strategy's buffers"]
    if stages > 1:
        notes.append("send/recv between stages not counted")
    return StepProfile(strategy=recipe.strategy.name, world_size=world_size, held_bytes=held,
                       peak_bytes=int(sum(held.values()) + activations + strategy_buffers(recipe, stage_bytes, step)),
                       flops=step["flops"] // parts, samples=recipe.training.batch_size,
                       comm_bytes={k: b for k, (b, _) in comm.items()}, comm_calls={k: c for k, (_, c) in comm.items()},
                       source="analytic", notes="; ".join(notes))

