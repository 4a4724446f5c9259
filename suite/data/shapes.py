"""Synthetic segmentation data, deterministic from its seed: each image holds 1 to ``max_shapes``
filled circles and rectangles on a noisy background; each pixel's class is the shape covering it
(0 = background, later shapes on top). Odd classes are circles and even ones rectangles, each
class with its own colour, so a pixel's class shows in its colour once the noise is averaged over
its neighbourhood and in the outline of its shape: learnable by a small UNet in a few hundred
steps (pixel accuracy far above chance), and every rank and run sees the same samples."""
from typing import ClassVar, Literal

import torch
from pydantic import Field, PositiveInt, confloat, conint
from torch.utils.data import TensorDataset
from typing_extensions import Annotated

from suite.data import DataSpec
from suite.data.base import DataOptions


class Shapes(DataOptions):
    name: Literal["shapes"] = "shapes"
    targets: ClassVar = "masks"
    size: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] = [64, 64]  # height, width
    classes: conint(ge=2) = 3  # background and classes - 1 kinds of shape
    n_train: PositiveInt = 1024
    n_val: PositiveInt = 128
    max_shapes: PositiveInt = 4  # shapes per image: 1 to this many
    noise: confloat(ge=0) = 0.8  # standard deviation of the Gaussian noise added to every pixel
    seed: int = 0

    def spec(self) -> DataSpec:
        return DataSpec(self.name, (3, *self.size), self.classes)

    def sizes(self):
        return self.n_train, self.n_val


OPTIONS = [Shapes]


def load(*, size: list[int], classes: int, n_train: int, n_val: int, max_shapes: int, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    n, (height, width) = n_train + n_val, size
    colours = torch.rand(classes, 3, generator=g) * 2 - 1  # row 0: the background's
    yy = torch.arange(height).view(1, -1, 1).float()
    xx = torch.arange(width).view(1, 1, -1).float()
    shapes = torch.randint(1, max_shapes + 1, (n,), generator=g)
    masks = torch.zeros(n, height, width, dtype=torch.int64)
    for k in range(max_shapes):
        cls = torch.randint(1, classes, (n,), generator=g)
        cy, cx = (torch.rand(n, 2, generator=g) * torch.tensor([height, width])).unbind(1)
        radius = (0.1 + 0.15 * torch.rand(n, generator=g)) * min(height, width)
        aspect = 0.6 + 0.8 * torch.rand(n, generator=g)  # rectangles: half-height r*a, half-width r/a
        cy, cx, radius, aspect = (t.view(-1, 1, 1) for t in (cy, cx, radius, aspect))
        circle = (yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2
        rectangle = ((yy - cy).abs() <= radius * aspect) & ((xx - cx).abs() <= radius / aspect)
        inside = torch.where((cls % 2 == 1).view(-1, 1, 1), circle, rectangle) & (k < shapes).view(-1, 1, 1)
        masks = torch.where(inside, cls.view(-1, 1, 1), masks)
    images = colours[masks].permute(0, 3, 1, 2) + noise * torch.randn(n, 3, height, width, generator=g)
    images = images.contiguous()
    spec = DataSpec("shapes", (3, height, width), classes)
    return (TensorDataset(images[:n_train], masks[:n_train]), TensorDataset(images[n_train:], masks[n_train:]), spec)
