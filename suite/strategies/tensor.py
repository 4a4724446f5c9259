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
The transformers' layouts are each block's linear layers by name (``BLOCK_ROLES``), Megatron's
and torchtitan's: the layers that open a pair column-wise, the ones that close it row-wise;
or by publishing a plan (a Hugging Face model's ``base_model_tp_plan``) or being given one in
the recipe (``model.tp_plan``): ``published_plan``.
"""
from __future__ import annotations

import fnmatch
from typing import ClassVar, Literal, Optional

import torch
from pydantic import PositiveInt

from suite.common.errors import SuiteError
from suite.compat import torch as torch_compat
from suite.strategies.layout import Axis
from suite.strategies import costs, fsdp, scaling
from suite.strategies.base import ModuleEngine, StrategyOptions
from suite.models import hf, llama
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
    ends = BLOCK_ROLES.get(model_name)
    if ends:  # per block (a top-level child numbered in the Sequential), by the layer's name
        return {name: ends[end] for name in linear_names for end in ends
                if name.endswith("." + end) and name.split(".")[0].isdigit()}
    return {}


# Per block: attention's q/k/v and the feed-forward's first layer(s) column-wise, attention's
# output and the feed-forward's last layer row-wise (the llama layout is torchtitan's parallelize).
BLOCK_ROLES = {
    "transformer": {"attention.q": "colwise", "attention.k": "colwise", "attention.v": "colwise",
                    "mlp.up": "colwise", "attention.out": "rowwise", "mlp.down": "rowwise"},
    "llama": {"attention.wq": "colwise", "attention.wk": "colwise", "attention.wv": "colwise",
              "feed_forward.w1": "colwise", "feed_forward.w3": "colwise",
              "attention.wo": "rowwise", "feed_forward.w2": "rowwise"},
}


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


def llama_plan(model: torch.nn.Module, tp: int) -> dict:
    """torchtitan's layout without sequence parallelism: per block wq/wk/wv and w1/w3 column-wise
    (each rank computes heads/tp query heads and kv_heads/tp key/value heads, whole, and its
    slice of the SwiGLU width), wo and w2 row-wise. Embedding, norms and head stay replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    for block in model.children():
        if isinstance(block, llama.Block):
            attention = block.attention
            _require_divisible("model.heads", attention.wq.out_features // attention.head_dim, tp)
            _require_divisible("model.kv_heads", attention.wk.out_features // attention.head_dim, tp)
            _require_divisible("the feed-forward width (model.ffn_dim)", block.feed_forward.w1.out_features, tp)
    return {name: ColwiseParallel() if role == "colwise" else RowwiseParallel()
            for name, role in roles("llama", list(_linears(model))).items()}


PLANS = {"mlp": mlp_plan, "transformer": transformer_plan, "llama": llama_plan}


def published_plan(model: torch.nn.Module, tp: int, source: str = "the model") -> dict:
    """The plan a model publishes (a Hugging Face model's ``base_model_tp_plan`` and head plan) or
    the recipe gives (``model.tp_plan``), as DTensor styles for the Linear layers it names (``*``
    matches any one name, as in HF's plans). A layer whose weight is shared with another (tied
    input and output embeddings) stays replicated: sharding one would split the other's weight."""
    plan = hf.tensor_parallel_plan(model)
    if not plan:
        raise SuiteError(f"strategy tensor has layouts for models {', '.join(PLANS)} and for models that publish a "
                         f"tensor-parallel plan; {source} publishes none: give one as model.tp_plan "
                         f"({{module path: colwise | rowwise}}), or use fsdp/ddp")
    config = getattr(model, "config", None)
    for key in ("num_attention_heads", "num_key_value_heads"):
        if isinstance(getattr(config, key, None), int):
            _require_divisible(f"the model's {key}", getattr(config, key), tp)
    owners: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(name)
    tied = {name for names in owners.values() if len(names) > 1 for name in names}
    layout = {}
    for name, module in model.named_modules():
        style = next((s for pattern, s in plan.items() if _matches(pattern, name)), None)
        if style is None or name in tied:
            continue
        if style not in STYLES:
            raise SuiteError(f"tensor-parallel plan of {source}: {name} has style {style!r}; the suite splits with "
                             f"{', '.join(STYLES)}; give model.tp_plan")
        if not isinstance(module, torch.nn.Linear):
            raise SuiteError(f"tensor-parallel plan of {source}: {name} is a {type(module).__name__}, and the "
                             f"suite splits Linear layers only; leave it out of model.tp_plan")
        width = module.out_features if style.startswith("colwise") else module.in_features
        _require_divisible(f"the width of {name}", width, tp)
        layout[name] = _style(style)
    if not layout:
        raise SuiteError(f"the tensor-parallel plan of {source} names no layer of the model ({', '.join(plan)}); "
                         f"fix model.tp_plan's module paths")
    return layout


def published_roles(model: torch.nn.Module) -> dict[str, str]:
    """{linear layer name: "colwise" | "colwise_gather_output" | "rowwise"} by the plan the model
    publishes or is given ({} where none): what the planner counts the collectives of."""
    plan = hf.tensor_parallel_plan(model)
    found = {}
    for name, module in model.named_modules():
        style = next((s for pattern, s in plan.items() if _matches(pattern, name)), None)
        if style and isinstance(module, torch.nn.Linear):
            found[name] = style if style in ("colwise", "colwise_gather_output") else "rowwise"
    return found


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names))


# HF's names of the DTensor styles the suite applies to a Linear layer.
STYLES = ("colwise", "rowwise", "colwise_gather_output", "rowwise_split_input")


def _style(name: str):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"colwise": lambda: ColwiseParallel(), "rowwise": lambda: RowwiseParallel(),
            "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
            "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate())}[name]()


def plan_of(model_name: str, model: torch.nn.Module, tp: int, source: str = "the model") -> dict:
    """The layout for a built-in model, else the plan the model publishes or the recipe gives."""
    if model_name in PLANS:
        return PLANS[model_name](model, tp)
    return published_plan(model, tp, source)


class Options(StrategyOptions):
    name: Literal["tensor"] = "tensor"
    warm_imports: ClassVar = (torch_compat.DYNAMO,)
    reusable_process: ClassVar = True
    refuses: ClassVar = (scaling.refused("torch's GradScaler cannot unscale its plain gradients (the replicated "
                                         "classifier) and its DTensor slices in one call"),)
    dp: PositiveInt = 1  # data-parallel degree (FSDP2 over the dp mesh dimension)
    tp: Optional[PositiveInt] = None  # tensor-parallel degree; default: world size / dp
    overlap: ClassVar = costs.Overlap(why="the all-reduces sit inside each layer's forward and backward: nothing hidden",
                                      inside_compute=True)
    no_neutral_checkpoint: ClassVar = ""  # torch DCP maps its state (suite.strategies.neutral)
    cannot_fake: ClassVar = ""
    # The all-reduces inside the layers stay in the tensor-parallel group; FSDP2 over dp gathers.
    comm_axes: ClassVar = {"all_reduce": ("tensor",)}
    within_node_axes: ClassVar = ("tensor",)

    def mesh_axes(self) -> list[Axis]:
        # Ranks of one tensor-parallel group read the same samples.
        return [Axis("data", self.dp, "strategy.dp", data=True), Axis("tensor", self.tp, "strategy.tp")]

    def check(self, layout, model) -> None:
        if model.name not in PLANS and model.name != "custom":
            raise SuiteError(f"strategy tensor has layouts for models {', '.join(PLANS)}, not "
                             f"model.name={model.name!r}; use one of those, or fsdp/ddp")
        plan_of(model.name, model.build_meta(), layout.degree("tensor"), model.source)

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
        split = dict(step.tensor_roles) or roles(step.model_name, [name for name, *_ in step.linears])
        n_bytes = calls = gathered = gathers = 0
        for name, in_bytes, out_bytes, input_grad in step.linears:
            role = split.get(name)
            if role == "rowwise" or (role in ("colwise", "colwise_gather_output") and input_grad):
                n_bytes, calls = n_bytes + (out_bytes if role == "rowwise" else in_bytes), calls + 1
            if role == "colwise_gather_output":  # its output slices gathered whole in forward (an HF head)
                gathered, gathers = gathered + out_bytes, gathers + 1
        passes = step.layout.accumulation_steps
        comm = {"all_reduce": (n_bytes * passes, calls * passes)} if calls else {}
        if gathers:
            comm["all_gather"] = (gathered * passes, gathers * passes)
        return costs.merged(sharded, comm)

    @classmethod
    def search_space(cls, world_size: int) -> list[dict]:
        # Tensor-parallel degrees dividing the world, data parallel (FSDP2) over the rest.
        return [{"name": "tensor", "dp": world_size // tp, "tp": tp} for tp in costs.divisors(world_size)]


def build(opts: Options, setup) -> ModuleEngine:
    from torch.distributed.tensor.parallel import parallelize_module

    ctx = setup.ctx
    mesh = setup.layout.device_mesh(ctx)
    model = setup.build_model().to(ctx.device)
    # Order as in torchtitan: tensor parallel, then checkpointing and compile (setup.prepare),
    # then FSDP over the data-parallel dimension.
    parallelize_module(model, mesh["tensor"], plan_of(setup.model_name, model, mesh["tensor"].size()))
    model = setup.prepare(model)
    if setup.layout.dp_size == 1:
        return ModuleEngine(setup, model)
    model = fsdp.shard(model, mesh["data"], reshard_after_forward=True,
                       mp_policy=fsdp.mixed_precision_policy("fp32"))
    return fsdp.FSDPEngine(setup, model)
