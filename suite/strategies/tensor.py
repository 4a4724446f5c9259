"""Tensor parallelism with DTensor (``parallelize_module``), optionally x data parallelism.

Within a tensor-parallel group every rank sees the same full batch and holds a slice of each
split layer: a column-wise layer computes a slice of its outputs, the row-wise layer after it
turns those into partial sums of its outputs, all-reduced into the full result. Layers outside
the layout (embeddings, norms, the output head) stay replicated.

``dp: D`` (> 1) builds a 2-D mesh (dp x tp): each tensor-parallel group then reads its own
data shard, and the dp dimension is sharded with FSDP2 ``fully_shard``, which composes with
DTensor (DDP does not: it fails on DTensor parameters).

A model gets tensor parallelism by having a layout here: one short function from the model to
``{module path: ColwiseParallel() | RowwiseParallel()}``, refusing degrees it cannot split by.
"""
from __future__ import annotations

from typing import ClassVar, Literal, Optional

import torch
from pydantic import PositiveInt

from suite.common.errors import SuiteError
from suite.compat import torch as torch_compat
from suite.strategies.layout import Axis
from suite.strategies import costs, fsdp
from suite.strategies.base import ModuleEngine, StrategyOptions
from suite.models.transformer import Block


def _require_divisible(what: str, value: int, tp: int) -> None:
    if value % tp:
        raise SuiteError(f"strategy.tp={tp} must divide {what}={value} (tensor parallelism splits it "
                         f"evenly); choose a tp that divides {value}")


def roles(model_name: str, linear_names: list[str]) -> dict[str, str]:
    """Which linear layers (``named_modules`` names, in order) the layout splits: name ->
    "colwise" or "rowwise". The one place the layouts are decided: ``mlp_plan`` and
    ``transformer_plan`` build from it, the planner counts the all-reduces from it."""
    if model_name == "mlp":  # in pairs, column-wise then row-wise; an unpaired last layer stays whole
        pairs = zip(linear_names[0:-1:2], linear_names[1::2])
        return {name: role for first, second in pairs for name, role in ((first, "colwise"), (second, "rowwise"))}
    if model_name == "transformer":  # per block: q/k/v and MLP up column-wise, out and MLP down row-wise
        ends = {"attention.q": "colwise", "attention.k": "colwise", "attention.v": "colwise", "mlp.up": "colwise",
                "attention.out": "rowwise", "mlp.down": "rowwise"}
        return {name: ends[end] for name in linear_names for end in ends
                if name.endswith("." + end) and name.split(".")[0].isdigit()}
    return {}


def _linears(model: torch.nn.Module) -> dict:
    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def mlp_plan(model: torch.nn.Module, tp: int) -> dict:
    """Linear layers in pairs: column-wise then row-wise (the ReLU between acts on slices).
    An unpaired last layer (the classifier) stays replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    linears = _linears(model)
    layout = {}
    for name, role in roles("mlp", list(linears)).items():
        if role == "colwise":
            _require_divisible("model.hidden width", linears[name].out_features, tp)
        layout[name] = ColwiseParallel() if role == "colwise" else RowwiseParallel()
    return layout


def transformer_plan(model: torch.nn.Module, tp: int) -> dict:
    """Per block: attention q/k/v column-wise (each rank computes heads/tp whole heads) and out
    row-wise; MLP up column-wise, down row-wise. Embedding and head stay replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    for block in model.children():
        if isinstance(block, Block):
            attention = block.attention
            _require_divisible("model.heads", attention.q.out_features // attention.head_dim, tp)
    return {name: ColwiseParallel() if role == "colwise" else RowwiseParallel()
            for name, role in roles("transformer", list(_linears(model))).items()}


PLANS = {"mlp": mlp_plan, "transformer": transformer_plan}


class Options(StrategyOptions):
    name: Literal["tensor"] = "tensor"
    warm_imports: ClassVar = (torch_compat.DYNAMO,)
    reusable_process: ClassVar = True
    dp: PositiveInt = 1  # data-parallel degree (FSDP2 over the dp mesh dimension)
    tp: Optional[PositiveInt] = None  # tensor-parallel degree; default: world size / dp
    overlap: ClassVar = costs.Overlap(why="the all-reduces sit inside each layer's forward and backward: nothing hidden",
                                      inside_compute=True)
    no_neutral_checkpoint: ClassVar = ""  # torch DCP maps its state (suite.strategies.neutral)
    cannot_fake: ClassVar = ""
    # The all-reduces inside the layers stay in the tensor-parallel group; FSDP2 over dp gathers.
    comm_axes: ClassVar = {"all_reduce": ("tensor",)}

    def mesh_axes(self) -> list[Axis]:
        # Ranks of one tensor-parallel group read the same samples.
        return [Axis("data", self.dp, "strategy.dp", data=True), Axis("tensor", self.tp, "strategy.tp")]

    def check(self, layout, model) -> None:
        tp_plan = PLANS.get(model.name)
        if tp_plan is None:
            raise SuiteError(f"strategy tensor has layouts for models {', '.join(PLANS)}, not "
                             f"model.name={model.name!r}; use one of those, or fsdp/ddp")
        tp_plan(model.build_meta(), layout.degree("tensor"))

    def held_fraction(self, total: dict, layout) -> dict:
        # A lower bound: the layers left out of the layout are held in full by every tp rank.
        return {key: value // layout.world_size for key, value in total.items()}

    def comm_rule(self, step: costs.StepSizes) -> costs.Comm:
        """Over the tensor-parallel group, per pass: each row-wise layer all-reduces its output
        (the ranks' partial sums) in forward; each column-wise layer all-reduces the gradient of
        its input in backward, where that input needs one (not the data). Over the data-parallel
        group (dp > 1), FSDP2's: each unit of the rank's shard gathered before forward and again
        before backward, its gradients reduce-scattered (as the fake run counts them)."""
        sharded = costs.sharded_units(step, gathers=2) if step.layout.dp_size > 1 else {}
        if step.layout.degree("tensor") < 2 or not step.linears:
            return sharded
        split = roles(step.model_name, [name for name, *_ in step.linears])
        n_bytes = calls = 0
        for name, in_bytes, out_bytes, input_grad in step.linears:
            role = split.get(name)
            if role == "rowwise" or (role == "colwise" and input_grad):
                n_bytes, calls = n_bytes + (out_bytes if role == "rowwise" else in_bytes), calls + 1
        passes = step.layout.accumulation_steps
        return costs.merged(sharded, {"all_reduce": (n_bytes * passes, calls * passes)} if calls else {})

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        # Tensor-parallel degrees dividing the world, data parallel (FSDP2) over the rest.
        return [{"name": "tensor", "dp": world_size // tp, "tp": tp} for tp in costs.divisors(world_size)]


def build(opts: Options, setup) -> ModuleEngine:
    from torch.distributed.tensor.parallel import parallelize_module

    ctx = setup.ctx
    mesh = setup.layout.device_mesh(ctx)
    model = setup.build_model().to(ctx.device)
    tp_plan = PLANS[setup.model_name]
    # Order as in torchtitan: tensor parallel, then checkpointing and compile (setup.prepare),
    # then FSDP over the data-parallel dimension.
    parallelize_module(model, mesh["tensor"], tp_plan(model, mesh["tensor"].size()))
    model = setup.prepare(model)
    if setup.layout.dp_size == 1:
        return ModuleEngine(setup, model)
    model = fsdp.shard(model, mesh["data"], reshard_after_forward=True,
                       mp_policy=fsdp.mixed_precision_policy("fp32"))
    return fsdp.FSDPEngine(setup, model)
