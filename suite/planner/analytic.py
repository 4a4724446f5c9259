"""The analytic StepProfile: for a strategy whose real code cannot run on fake tensors.

Held bytes are ``suite.estimate``'s (the strategy's ``held_fraction``). FLOPs and activations
come from a fake run of the bare model (no strategy) at the plan's rank batch, split over the
pipeline stages where there are some. Communication follows the per-strategy rules below, in
the byte conventions of ``suite.planner.profile`` (message sizes per rank per optimizer step;
G: this rank's model gradient bytes before sharding, P: its parameter bytes, both fp32):

- ``zero`` stage 0: all_reduce G. Stages 1 and 2: reduce_scatter G (gradients reduced into
  their owners' partitions), all_gather P (the updated partitions gathered back). Stage 3:
  all_gather P twice (before each forward and each backward of a layer), reduce_scatter G.
- ``ds_pipeline``/``pipeline``: send and recv of the activations at each stage boundary
  (forward) and their gradients (backward), not counted here (no fake run saw them); plus
  all_reduce of the stage's gradients over its data-parallel group when dp > 1.
- ``oss`` (fairscale optimizer state sharding): all_reduce G (every gradient, as DDP), then
  broadcast P (each updated shard from the rank that owns it).
Calls are one per kind: a lower bound (the libraries bucket as they see fit).
- anything else: the data-parallel rule, all_reduce G when there is more than one data rank.
"""
from __future__ import annotations

from suite.planner.profile import StepProfile


def model_step(recipe) -> dict:
    """FLOPs and bytes of one fake step of the bare model on this process (no strategy, no
    process group): {"flops", "peak_bytes", "held_bytes"} at the plan's accumulation batch."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from suite.planner.fake_run import _LiveBytes, fake_batch
    from suite.train.rank import make_setup

    plan = recipe.plan()
    setup = make_setup(recipe, None)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = setup.build_model()
        optimizer = setup.make_optimizer(model.parameters())
        inputs, targets = fake_batch(recipe, plan.accumulation_batch)
        flops, live = FlopCounterMode(display=False), _LiveBytes()
        with flops, live:
            loss = setup.task.loss(model(inputs), inputs, targets)
            loss.backward()
            optimizer.step()
        parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"flops": int(flops.get_total_flops()) * plan.accumulation_steps, "peak_bytes": live.peak,
            "parameter_bytes": parameters}


def communication(recipe, parameter_bytes: int) -> dict[str, int]:
    """Bytes per collective kind per rank per step by the rules in the module doc."""
    strategy, plan = recipe.strategy, recipe.plan()
    g = p = parameter_bytes // max(plan.degree("pipeline"), 1)
    if plan.dp_size == 1 and strategy.name != "pipeline":
        return {}
    if strategy.name == "zero":
        if strategy.stage == 0:
            return {"all_reduce": g}
        if strategy.stage in (1, 2):
            return {"reduce_scatter": g, "all_gather": p}
        return {"all_gather": 2 * p, "reduce_scatter": g}
    if strategy.name == "oss":
        return {"all_reduce": g, "broadcast": p}
    return {"all_reduce": g} if plan.dp_size > 1 else {}


def profile(recipe, world_size: int, reason: str) -> StepProfile:
    """The analytic StepProfile of ``recipe`` (already at ``world_size``); ``reason``: why the
    fake run could not be used, kept in ``notes``."""
    from suite.estimate import predicted_held_bytes

    plan = recipe.plan()
    step = model_step(recipe)
    stages = plan.degree("pipeline")
    held = {k: int(v) for k, v in predicted_held_bytes(recipe)["per_rank"].items()}
    # The bare model's peak minus its parameters, gradients and optimizer state: activations and
    # temporaries, split over the stages; the strategy's own buffers are not in it.
    whole = predicted_held_bytes(recipe)["total"]
    activations = max(step["peak_bytes"] - whole["gradients"] - whole["optimizer_state"], 0) // stages
    comm = communication(recipe, step["parameter_bytes"])
    notes = [f"analytic: {reason}", "peak = held + the bare model's activations"]
    if stages > 1:
        notes.append("send/recv between stages not counted")
    return StepProfile(strategy=recipe.strategy.name, world_size=world_size, held_bytes=held,
                       peak_bytes=int(sum(held.values()) + activations), flops=step["flops"] // stages,
                       samples=recipe.training.batch_size, comm_bytes=comm,
                       comm_calls={k: 1 for k in comm}, source="analytic", notes="; ".join(notes))

