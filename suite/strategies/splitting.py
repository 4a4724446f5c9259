"""Where model-parallel strategies cut a model: between its top-level blocks.

Every suite model is an ``nn.Sequential`` of coarse blocks; a user's model must be one to be split
(``check_sequential``, run before launch for every splitting strategy). A split is a list of block indices
(recipe key ``strategy.split_at``) where a new part starts: ``[3]`` cuts a 6-block model into
blocks 0-2 and 3-5. Left out, the cut balances the parts' parameter counts (the largest part
as small as it can be), which is what bounds a pipeline's speed and a device's memory. The
balanced cut gives every part parameters where it can; a pipeline's stages must have them (each
trains with an optimizer of its own, which refuses an empty parameter list: ``own_optimizers``),
one model split over a rank's devices need not.
"""
from __future__ import annotations

from torch import nn

from suite.common.errors import SuiteError


def parameter_counts(model: nn.Sequential) -> list[int]:
    """Parameters of each top-level block."""
    return [sum(p.numel() for p in block.parameters()) for block in model]


def balanced_split(counts: list[int], parts: int) -> list[int]:
    """Start indices of parts 1.. that minimise the largest part's parameter count, each part
    holding some where there are as many blocks with parameters as parts (an MLP's blocks
    [Flatten, Linear, ReLU, Linear, ReLU, Linear] in 4 parts: never a part of a ReLU alone).

    Dynamic programming over contiguous partitions (models have ~10 blocks: cheap)."""
    if sum(c > 0 for c in counts) < parts:  # some part must be empty: balance the rest
        return _min_max_split(counts, parts, allow_empty=True)
    return _min_max_split(counts, parts, allow_empty=False)


def _min_max_split(counts: list[int], parts: int, allow_empty: bool) -> list[int]:
    n = len(counts)
    prefix = [0]
    for c in counts:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: smallest possible largest part when blocks 0..i-1 form k parts; cut[k][i]: last start
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                part = prefix[i] - prefix[j]
                cost = max(best[k - 1][j], part) if part > 0 or allow_empty else inf
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    starts, i = [], n
    for k in range(parts, 1, -1):
        i = cut[k][i]
        starts.append(i)
    return sorted(starts)


def resolve_split(split_at: list[int] | None, model: nn.Sequential, parts: int,
                  key: str = "strategy.split_at", own_optimizers: bool = False) -> list[int]:
    """The recipe's split checked against the model, or a balanced one if it gave none;
    ``own_optimizers``: each part trains alone (a pipeline stage), so each must hold parameters."""
    check_sequential(model, "this strategy", "the model factory")
    n = len(model)
    if parts > n:
        raise SuiteError(f"the model has {n} top-level blocks, too few for {parts} parts; "
                         f"use fewer parts or a deeper model")
    counts = parameter_counts(model)
    if split_at is None:
        split_at = balanced_split(counts, parts)
        key = "the balanced split (strategy.split_at left out)"
    else:
        _check_bounds(split_at, n, parts, key)
    if own_optimizers:
        _check_every_part_trains(counts, split_at, key)
    return list(split_at)


def _check_every_part_trains(counts: list[int], split_at: list[int], key: str) -> None:
    bounds = [0, *split_at, len(counts)]
    for number, (a, b) in enumerate(zip(bounds, bounds[1:])):
        if not sum(counts[a:b]):
            raise SuiteError(f"{key}: part {number} (blocks {a}-{b - 1}) holds no parameters, so it has nothing to "
                             f"train; the model has {sum(c > 0 for c in counts)} blocks with parameters: use at most "
                             f"that many parts, or a split_at whose every part holds a layer with weights")


def _check_bounds(split_at: list[int], n: int, parts: int, key: str) -> None:
    ok = (len(split_at) == parts - 1 and all(0 < s < n for s in split_at)
          and all(a < b for a, b in zip(split_at, split_at[1:])))
    if not ok:
        raise SuiteError(f"{key}={split_at} must list {parts - 1} increasing block indices between 1 and "
                         f"{n - 1} (where parts 2..{parts} start; the model has {n} top-level blocks), "
                         f"or be left out to balance the parts by parameter count")


def cut(model: nn.Sequential, split_at: list[int]) -> list[nn.Sequential]:
    """The model's blocks as consecutive parts (the blocks are shared, not copied)."""
    bounds = [0, *split_at, len(model)]
    return [model[a:b] for a, b in zip(bounds, bounds[1:])]


def check_recipe_split(model, split_at, parts: int, strategy: str, own_optimizers: bool = False) -> None:
    """Recipe-time check of ``split_at`` against the model (a ``suite.strategies.layout.ModelInfo``), built on
    the meta device (no memory)."""
    resolve_split(split_at, meta_model(model, strategy), parts, own_optimizers=own_optimizers)


def check_devices_per_task(layout, strategy: str, what: str) -> int:
    """The devices one rank splits the model over (``launch.devices_per_task``), at least 2."""
    parts = layout.devices_per_task
    if parts < 2:
        raise SuiteError(f"strategy {strategy} {what} launch.devices_per_task devices, but "
                         f"launch.devices_per_task={parts}; set it to 2 or more (on CPU they are all the cpu)")
    return parts


def meta_model(model, strategy: str) -> nn.Sequential:
    """The model (a ``suite.strategies.layout.ModelInfo``) on the meta device, refused unless it can be split."""
    built = model.build_meta()
    check_sequential(built, f"strategy {strategy}", model.source)
    return built


def check_sequential(model: nn.Module, strategy: str, source: str) -> None:
    """Every splitting strategy cuts between the top-level blocks of an ``nn.Sequential``: the
    order of those blocks is the forward pass, which any other module's children need not be.
    A model that knows why it cannot be cut (skip connections: ``not_splittable_because``) says so."""
    why = getattr(model, "not_splittable_because", None)
    if why:
        raise SuiteError(f"{strategy} cannot split {source}: {why}; use ddp, fsdp or zero")
    if shared_blocks(model):
        raise SuiteError(f"{strategy} cannot split {source}: its top-level blocks share parameters (a tied "
                         f"embedding and output head), which parts on different ranks would update apart; "
                         f"untie them (model.tie_embeddings=false), or use ddp, fsdp or zero")
    if not isinstance(model, nn.Sequential):
        raise SuiteError(f"{strategy} splits the model between top-level blocks of an nn.Sequential; "
                         f"{source} returns {type(model).__name__}; return an nn.Sequential of blocks, "
                         f"or use ddp/fsdp/zero")


def shared_blocks(model: nn.Module) -> set[str]:
    """Names of the top-level blocks holding a parameter that another top-level block holds too
    (a tied embedding and output head): no wrapper or cut may treat such a block as its own unit."""
    holders: dict[int, set[str]] = {}
    for name, block in model.named_children():
        for param in block.parameters():
            holders.setdefault(id(param), set()).add(name)
    return {name for names in holders.values() if len(names) > 1 for name in names}
