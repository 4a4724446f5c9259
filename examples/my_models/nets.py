"""A small residual MLP, built the way the suite's model contract asks (docs/plugins.md):
``build(spec, **kwargs)`` returns an ``nn.Sequential`` of coarse blocks, so pipeline and
layer-wise strategies can cut it between blocks as readily as data-parallel ones wrap it."""
import math

from torch import nn


class Residual(nn.Module):
    """x + MLP(LayerNorm(x)): one block, kept whole by any cut."""

    def __init__(self, width: int, expansion: int = 2):
        super().__init__()
        self.body = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, expansion * width), nn.GELU(),
                                  nn.Linear(expansion * width, width))

    def forward(self, x):
        return x + self.body(x)


def build(spec, width: int = 32, depth: int = 2) -> nn.Sequential:
    """Inputs of any shape (flattened) -> ``spec.num_classes`` logits."""
    stem = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(spec.input_shape), width))
    head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, spec.num_classes))
    return nn.Sequential(stem, *(Residual(width) for _ in range(depth)), head)


class Net(nn.Module):
    """The same network as one module, not an ``nn.Sequential``: fine for ddp/fsdp/zero, but a
    strategy that cuts the model between top-level blocks refuses it before launch."""

    def __init__(self, spec, width: int = 32, depth: int = 2):
        super().__init__()
        self.layers = build(spec, width, depth)

    def forward(self, x):
        return self.layers(x)


def build_unsplittable(spec, width: int = 32, depth: int = 2) -> Net:
    return Net(spec, width, depth)
