"""The analytic StepProfile: for a strategy whose real code cannot run on fake tensors, and for
the prediction every run records (``suite.planner.predict``), which cannot pay for a fake run.

Held bytes are ``suite.planner.memory``'s (the strategy's ``held_fraction``). FLOPs and activations
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

Peak bytes: what the rank holds (parameters, gradients, optimizer state: the estimate), plus
the strategy's buffers that live through the step (``persistent_buffers``: DDP's gradient
buckets, DeepSpeed ZeRO's gradient bucket), plus the larger of the two transient phases of the
bare model's step at the rank's batch: forward and backward (its activations, the units a
sharding strategy gathers, ZeRO's copies of the gradients: ``backward_buffers``) or the
optimizer's update (its temporaries, which shrink with the shard the optimizer steps:
``optimizer_temporaries``). Measured against the bytes the rank allocated
(``peak_allocated_bytes``); the freed blocks an allocator keeps resident are not predicted, nor
what libraries allocate for themselves beyond gloo's scratch for ZeRO's reduction.
"""
from __future__ import annotations

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

    The meta device rather than FakeTensorMode: a backward under FakeTensorMode starts autograd's
    device threads, after which a process can no longer fork ranks that train (a run's rank 0,
    a test process); one on the meta device does not."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from suite.planner.counting import LiveBytes, fake_batch
    from suite.train.rank import make_setup

    layout = recipe.layout()
    setup = make_setup(recipe, None)
    with torch.random.fork_rng(devices=[]):
        with torch.device("meta"):
            model = setup.build_model()
            inputs, targets = fake_batch(recipe, layout.accumulation_batch)
        optimizer = setup.make_optimizer(model.parameters())  # its step counters stay on the CPU: Adam reads them
        for _ in range(2):
            flops, passes, update = FlopCounterMode(display=False), LiveBytes(), LiveBytes()
            with flops, passes:
                loss = setup.task.loss(model(inputs), inputs, targets)
                loss.backward()
            with update:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    return {"flops": int(flops.get_total_flops()) * layout.accumulation_steps,
            "activation_bytes": max(passes.peak - sum(sizes), 0), "optimizer_bytes": update.peak,
            "parameter_bytes": sum(sizes), "largest_tensor_bytes": max(sizes, default=0),
            "parameter_tensors": len(sizes), "units": unit_bytes(model)}


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
    strategy, layout = recipe.strategy, recipe.layout()
    name, dp = strategy.name, layout.dp_size
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


SHARDED_UNITS = ("fsdp", "fsdp1", "fairscale_fsdp")


def copy_bytes(recipe, comm_bytes: dict[str, int]) -> int:
    """Bytes a rank copies per step besides compute and collectives (``StepProfile.copy_bytes``),
    from the step's message sizes (``comm_bytes``, by kind; the fake run's or ``communication``'s).

    FSDP2 (``fsdp``) keeps each parameter's shard apart, so each gather of a unit copies the
    rank's shards into the gather's buffer (1/N of what it gathers) and the gathered result out
    into the parameters (all of it), and each reduce-scatter packs the unit's gradients into its
    input (all of it): profiled on this CPU at world 2, these copies took 8 % of the step. FSDP1
    and fairscale gather into flat parameters whose views the modules use, and DeepSpeed ZeRO-3
    partitions flat buffers likewise: nothing counted for them."""
    if recipe.strategy.name != "fsdp" or recipe.world_size == 1:
        return 0
    gathered = comm_bytes.get("all_gather", 0)
    return gathered // recipe.layout().degree("shard") + gathered + comm_bytes.get("reduce_scatter", 0)


def persistent_buffers(recipe, g: int) -> int:
    """Bytes a strategy keeps beside what the rank holds through the whole step: DDP's buckets (a
    copy of every gradient, ``gradient_as_bucket_view`` off); DeepSpeed ZeRO's gradient bucket of
    ``reduce_bucket_size`` elements (5e8 by default: 1.9 GiB in fp32, whatever the model's size),
    allocated whole with ``contiguous_gradients`` (on by default), twice at stages 1-2 with
    ``overlap_comm``. On a CPU only the pages the gradients fill become resident; on a GPU all of
    it is device memory."""
    name = recipe.strategy.name
    if name == "ddp":
        return g if recipe.world_size > 1 else 0
    if name == "zero" and recipe.strategy.stage >= 1:
        zero = _deepspeed_zero_config(recipe)
        if not zero.contiguous_gradients:
            return 0
        stage = recipe.strategy.stage
        element = 4 if stage == 1 or recipe.training.precision == "fp32" else 2  # stage 1 reduces in fp32
        buffers = 2 if zero.overlap_comm and stage < 3 else 1
        return int(zero.reduce_bucket_size) * element * buffers
    return 0


def _deepspeed_zero_config(recipe):
    """DeepSpeed's own reading of the run's zero_optimization section, its defaults filled in."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from suite.strategies.zero import _config

    return DeepSpeedZeroConfig(**_config(recipe.strategy, recipe.layout())["zero_optimization"])


def backward_buffers(recipe, step: dict, g: int) -> int:
    """Bytes a strategy allocates during the passes beside what the rank holds and the model's
    activations, at their most:

    - FSDP and ZeRO-3: the largest unit's parameters and full gradients, and the next unit's
      parameters (prefetched). FSDP frees a unit's parameters before it copies the gradients
      into its reduce-scatter's input, so it holds no third copy.
    - DeepSpeed ZeRO (stages 1-3) reduces the gradients as one flat copy of its bucket (at most
      ``reduce_bucket_size``; a gradient larger than the bucket goes alone, uncopied), and gloo
      allocates a scratch of the message's size for the collective (on a CPU; NCCL works in
      buffers of its own): two copies of the message. ZeRO-3 reduces while units are still
      gathered."""
    from suite.train.dist import uses_cuda

    name, world = recipe.strategy.name, recipe.world_size
    if world == 1:
        return 0
    largest, following = (sorted(step["units"], reverse=True) + [0, 0])[:2]
    units = 2 * largest + following
    if name in SHARDED_UNITS:
        return units
    if name == "zero" and recipe.strategy.stage >= 1:
        message = max(min(g, int(_deepspeed_zero_config(recipe).reduce_bucket_size) * 4), step["largest_tensor_bytes"])
        reduction = message * (1 if uses_cuda(recipe.launch.device) else 2)
        return reduction + (units if recipe.strategy.stage == 3 else 0)
    return 0


def optimizer_temporaries(recipe, step: dict, parts: int) -> int:
    """The optimizer's temporaries, scaled to the tensors it steps: the bare model's as they are;
    a shard of each parameter (FSDP) 1/dp of them; DeepSpeed's one flat partition (ZeRO stages
    1-3) as many per byte as the bare model's largest tensor took, for a tensor of 1/dp of the model."""
    name, dp = recipe.strategy.name, recipe.layout().dp_size
    temporaries = step["optimizer_bytes"] // parts
    if name in SHARDED_UNITS:
        return temporaries // dp
    if name == "zero" and recipe.strategy.stage >= 1 and step["largest_tensor_bytes"]:
        per_byte = step["optimizer_bytes"] / step["largest_tensor_bytes"]
        return int(per_byte * step["parameter_bytes"] / parts / dp)
    return temporaries


def profile(recipe, world_size: int, reason: str) -> StepProfile:
    """The analytic StepProfile of ``recipe`` (already at ``world_size``); ``reason``: why the
    fake run could not be used, kept in ``notes``."""
    from suite.planner.memory import predicted_held_bytes

    layout = recipe.layout()
    step = model_step(recipe)
    stages = layout.degree("pipeline")
    parts = max(1, recipe.world_size // layout.dp_size)  # ranks sharing one replica: pipeline stages x tensor ranks
    estimate = predicted_held_bytes(recipe)
    held = {k: int(v) for k, v in estimate["per_rank"].items()}
    activations = step["activation_bytes"] // parts  # split over the stages or tensor ranks
    stage_bytes = step["parameter_bytes"] // parts
    transient = max(activations + backward_buffers(recipe, step, stage_bytes), optimizer_temporaries(recipe, step, parts))
    comm = communication(recipe, stage_bytes, stage_bytes, step)
    comm_bytes = {k: b for k, (b, _) in comm.items()}
    notes = [f"analytic: {reason}", "peak = held + the strategy's buffers + the larger of the passes "
             "(activations, gathered units) and the optimizer's update (its temporaries)"]
    if stages > 1:
        notes.append("send/recv between stages not counted")
    return StepProfile(strategy=recipe.strategy.name, world_size=world_size, held_bytes=held,
                       peak_bytes=int(sum(held.values()) + persistent_buffers(recipe, stage_bytes) + transient),
                       flops=step["flops"] // parts, samples=recipe.training.batch_size,
                       comm_bytes=comm_bytes, comm_calls={k: c for k, (_, c) in comm.items()},
                       copy_bytes=copy_bytes(recipe, comm_bytes), source="analytic", notes="; ".join(notes))

