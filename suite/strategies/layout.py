"""The parallel layout: how a run lays its ranks out and splits its batch, worked out once.

Built from the recipe (``Recipe.layout()``) before launch and handed to the strategy on every
rank (``Setup.layout``), so that the batch arithmetic is done in one place:

    global batch (training.batch_size)
      = dp_size data-parallel ranks x rank_batch                 (per rank per optimizer step)
      rank_batch = accumulation_steps x accumulation_batch       (training.grad_accumulation:
                                                                  forward/backward passes per step)
      accumulation_batch = pipeline_chunks x chunk_batch         (strategy.micro_batches of a
                                                                  pipeline: chunks in flight)

The two kinds of micro-batch keep two names: an *accumulation* step is a full forward and
backward whose gradients add up before the optimizer steps; a *pipeline chunk* is a slice that
flows through a pipeline's stages while others are in flight.

A strategy's options declare their mesh axes (``mesh_axes()``: name, degree or None, the recipe
key, whether ranks along it read different samples); the degrees must multiply to the world size,
and an error says which degree is off and what would fit. Torch-free at import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from suite.common.errors import SuiteError


@dataclass(frozen=True)
class Axis:
    """One dimension of the device mesh, as a strategy declares it."""
    name: str  # mesh dimension name: "data", "replicate", "shard", "tensor", "pipeline"
    degree: Optional[int]  # None: filled from the world size (at most one axis may leave it)
    key: str  # the recipe key that sets it, for messages ("strategy.dp")
    data: bool = False  # ranks along it read different samples


@dataclass(frozen=True)
class ModelInfo:
    """What a strategy's recipe-time checks may know of the model."""
    name: str  # recipe model.name
    task: str  # classification | reconstruction | language | segmentation
    source: str  # where it comes from, for messages: "model.name=mlp" or "model.target=pkg:fn"
    build_meta: Callable[[], Any]  # the model on the meta device: shapes, no memory


@dataclass(frozen=True)
class Layout:
    strategy: str
    world_size: int
    axes: dict[str, int]  # mesh axis name -> degree, outermost first
    data_axes: tuple[str, ...]  # the axes whose ranks read different samples
    batch_size: int  # global: samples per optimizer step over all data-parallel ranks
    accumulation_steps: int = 1
    pipeline_chunks: int = 1
    devices_per_task: int = 1  # devices one rank drives (layer-wise model parallel, fairscale Pipe)
    precision: str = "fp32"

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: how many ranks read different samples."""
        return math.prod(self.axes[a] for a in self.data_axes)

    @property
    def rank_batch(self) -> int:
        """Samples each data-parallel rank reads per optimizer step."""
        return self.batch_size // self.dp_size

    @property
    def accumulation_batch(self) -> int:
        """Samples in one forward/backward of an accumulated step."""
        return self.rank_batch // self.accumulation_steps

    @property
    def chunk_batch(self) -> int:
        """Samples in one pipeline chunk (the accumulation batch where there is no pipeline)."""
        return self.accumulation_batch // self.pipeline_chunks

    def degree(self, axis: str) -> int:
        return self.axes.get(axis, 1)

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each axis (row-major: the last axis varies fastest)."""
        out = {}
        for name, degree in reversed(self.axes.items()):
            rank, out[name] = divmod(rank, degree)
        return dict(reversed(out.items()))

    def dp_rank(self, rank: int) -> int:
        """Which data shard this rank reads (ranks that differ only along other axes share one)."""
        coords, index = self.coordinates(rank), 0
        for name in self.data_axes:
            index = index * self.axes[name] + coords[name]
        return index

    def dp_groups(self) -> list[list[int]]:
        """The ranks grouped into data-parallel peers: ranks that differ only along the data
        axes (they hold the same part of the model and read different samples)."""
        groups: dict[tuple, list[int]] = {}
        for rank in range(self.world_size):
            coords = self.coordinates(rank)
            groups.setdefault(tuple(v for k, v in coords.items() if k not in self.data_axes), []).append(rank)
        return list(groups.values())

    def group_span(self, names) -> int:
        """How many consecutive ranks the group of rank 0 along the axes ``names`` covers (the
        ranks that differ from it only along them): a group spans nodes when this exceeds the
        ranks per node (ranks fill nodes in order)."""
        stride, last = 1, 0
        for name, degree in reversed(self.axes.items()):
            if name in names:
                last += (degree - 1) * stride
            stride *= degree
        return last + 1

    def device_mesh(self, ctx, *names: str):
        """A DeviceMesh over all ranks with the named axes (default: all); the ones left out
        must have degree 1."""
        # late: looked up at each call, since the planner's fake run replaces it
        # (suite.compat.torch.fake_friendly); start-up: keeps torch out of this module's import
        from torch.distributed.device_mesh import init_device_mesh

        names = names or tuple(self.axes)
        assert math.prod(self.axes[n] for n in names) == self.world_size, (names, self.axes)
        return init_device_mesh(ctx.device.type, tuple(self.axes[n] for n in names), mesh_dim_names=names)


def build(options, *, world_size: int, batch_size: int, accumulation_steps: int = 1,
          devices_per_task: int = 1, precision: str = "fp32") -> Layout:
    """The layout of a strategy (its ``Options``) at this world size; SuiteError naming the recipe
    key when the degrees do not fit the world or the batch does not divide."""
    axes = options.mesh_axes()
    degrees = resolve(options.name, world_size, {a.key: a.degree for a in axes})
    layout = Layout(strategy=options.name, world_size=world_size,
                axes={a.name: degrees[a.key] for a in axes}, data_axes=tuple(a.name for a in axes if a.data),
                batch_size=batch_size, accumulation_steps=accumulation_steps,
                pipeline_chunks=options.pipeline_chunks(), devices_per_task=devices_per_task,
                precision=precision)
    _check_batch(layout)
    return layout


def _check_batch(layout: Layout) -> None:
    dp, acc, chunks, batch = layout.dp_size, layout.accumulation_steps, layout.pipeline_chunks, layout.batch_size
    if batch % (dp * acc):
        raise SuiteError(f"training.batch_size={batch} must divide into {dp} data-parallel ranks x "
                         f"{acc} accumulation steps; use a multiple of {dp * acc}")
    if layout.accumulation_batch % chunks:
        # Every pipeline strategy names its chunk count strategy.micro_batches.
        per = layout.accumulation_batch
        each = "data-parallel rank" + (" and accumulation step" if acc > 1 else "")
        raise SuiteError(f"strategy.micro_batches={chunks} must divide the batch of each {each} "
                         f"(training.batch_size={batch} / {dp * acc} = {per}); choose a divisor of {per}, "
                         f"or a training.batch_size that is a multiple of {dp * acc * chunks}")


def resolve(strategy: str, world_size: int, degrees: dict[str, Optional[int]]) -> dict[str, int]:
    """Fill at most one degree left as None from the world size; check the product.

    ``degrees`` maps recipe keys (e.g. ``strategy.dp``) to their values, in mesh order.
    """
    unknown = [k for k, v in degrees.items() if v is None]
    if len(unknown) > 1:
        raise SuiteError(f"strategy {strategy}: at most one of {', '.join(unknown)} may be left to fill from "
                         f"the world size; set the others")
    for key, value in degrees.items():
        if value is not None and value < 1:
            raise SuiteError(f"{key}={value} must be a positive degree")
    known = math.prod(v for v in degrees.values() if v is not None)
    if unknown:
        if world_size % known:
            raise SuiteError(_mismatch(strategy, world_size, degrees, f"{unknown[0]} cannot fill the rest"))
        degrees = {**degrees, unknown[0]: world_size // known}
    elif known != world_size:
        raise SuiteError(_mismatch(strategy, world_size, degrees, "their product must equal the world size"))
    return dict(degrees)


def _mismatch(strategy, world_size, degrees, why) -> str:
    def others(key):
        return math.prod(w for j, w in degrees.items() if j != key and w is not None)

    shown = " x ".join(f"{k}={'?' if v is None else v}" for k, v in degrees.items())
    fits = [f"{k}={world_size // others(k)}" for k in degrees if world_size % others(k) == 0]
    hint = f"; e.g. {' or '.join(fits)}" if fits else ""
    return (f"strategy {strategy}: {shown} does not fit world size {world_size} "
            f"(launch.nodes x launch.tasks_per_node): {why}{hint}")
