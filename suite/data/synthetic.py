"""Synthetic data, deterministic from its seed: each class has a smooth random prototype and a sample
is its class's prototype plus Gaussian noise, so MLPs and CNNs alike can learn it (accuracy well
above chance) and every rank and run sees the same samples."""
from typing import Literal

import math
import torch
import torch.nn.functional as F
from pydantic import PositiveInt, confloat
from torch.utils.data import TensorDataset

from suite.data import DataSpec
from suite.data.images import ImageOptions


class Synthetic(ImageOptions):  # data.normalize / data.augment apply when shape is [channels, height, width]
    name: Literal["synthetic"] = "synthetic"
    shape: list[PositiveInt] = [1, 28, 28]
    classes: PositiveInt = 10
    n_train: PositiveInt = 2048
    n_val: PositiveInt = 512
    noise: confloat(ge=0) = 1.0  # standard deviation of the noise around each class's prototype
    seed: int = 0

    def spec(self) -> DataSpec:
        return DataSpec(self.name, tuple(self.shape), self.classes)

    def sizes(self):
        return self.n_train, self.n_val

def load(*, shape: list[int], classes: int, n_train: int, n_val: int, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_val
    y = torch.randint(0, classes, (n,), generator=g)
    x = _prototypes(shape, classes, g)[y] + noise * torch.randn(n, *shape, generator=g)
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def _prototypes(shape: list[int], classes: int, g) -> torch.Tensor:
    """One pattern per class, smooth over the last two axes (4x4 noise upsampled): what a
    convolution can pick up as readily as a linear layer."""
    if len(shape) < 3:
        return torch.randn(classes, *shape, generator=g)
    coarse = torch.randn(classes, math.prod(shape[:-2]), 4, 4, generator=g)
    fine = F.interpolate(coarse, size=tuple(shape[-2:]), mode="bilinear", align_corners=False)
    return fine.reshape(classes, *shape)


OPTIONS = [Synthetic]
