"""Two interleaved half-moons with noise (like scikit-learn's make_moons), generated with torch,
as the suite's data contract asks (docs/plugins.md): ``load(**kwargs)`` returns (train, val)
TensorDatasets of float32 points and int64 labels; the suite derives the spec (2 features, 2 classes)."""
import math

import torch
from torch.utils.data import TensorDataset


def load(n_train: int = 1024, n_val: int = 256, noise: float = 0.1, seed: int = 0):
    g = torch.Generator().manual_seed(seed)  # its own generator: the same points wherever it is called
    n = n_train + n_val
    labels = torch.randint(0, 2, (n,), generator=g)
    angle = math.pi * torch.rand(n, generator=g)
    upper = torch.stack([torch.cos(angle), torch.sin(angle)], dim=1)
    lower = torch.stack([1 - torch.cos(angle), 0.5 - torch.sin(angle)], dim=1)
    points = torch.where(labels[:, None] == 0, upper, lower)
    points = points + noise * torch.randn(n, 2, generator=g)
    points = (points - torch.tensor([0.5, 0.25])) / torch.tensor([0.87, 0.5])  # roughly standardised
    return (TensorDataset(points[:n_train], labels[:n_train]),
            TensorDataset(points[n_train:], labels[n_train:]))
