"""Synthetic data, deterministic from its seed: Gaussian inputs labelled by a random linear teacher,
so a model can learn it (accuracy well above chance) and every rank and run sees the same samples."""
from typing import Literal

import math
import torch
from pydantic import PositiveInt
from torch.utils.data import TensorDataset

from suite.data import DataSpec
from suite.data.base import DataOptions


class Synthetic(DataOptions):
    name: Literal["synthetic"] = "synthetic"
    shape: list[PositiveInt] = [1, 28, 28]
    classes: PositiveInt = 10
    n_train: PositiveInt = 2048
    n_val: PositiveInt = 512
    seed: int = 0

    def spec(self) -> DataSpec:
        return DataSpec(self.name, tuple(self.shape), self.classes)

    def load(self):
        g = torch.Generator().manual_seed(self.seed)
        n = self.n_train + self.n_val
        x = torch.randn(n, *self.shape, generator=g)
        teacher = torch.randn(math.prod(self.shape), self.classes, generator=g)
        y = (x.flatten(1) @ teacher).argmax(1)
        train = TensorDataset(x[: self.n_train], y[: self.n_train])
        val = TensorDataset(x[self.n_train:], y[self.n_train:])
        return self.limited(train, val)


OPTIONS = [Synthetic]
