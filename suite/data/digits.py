"""scikit-learn's bundled 8x8 handwritten digits (1,797 images): real data with no download."""
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import confloat
from torch.utils.data import TensorDataset

from suite.data import DataSpec
from suite.data.base import DataOptions
import importlib.util

_SAMPLES = 1797  # images in scikit-learn's digits


class Digits(DataOptions):
    name: Literal["digits"] = "digits"
    val_fraction: confloat(gt=0, lt=1) = 0.2
    split_seed: int = 0  # fixed, so runs with different training seeds share one split

    def spec(self) -> DataSpec:
        return DataSpec(self.name, (1, 8, 8), 10)

    def sizes(self):
        n_val = int(_SAMPLES * self.val_fraction)
        return _SAMPLES - n_val, n_val


def load(*, val_fraction: float, split_seed: int):
    images, target = _read()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.3) / 0.4  # roughly standardised
    y = torch.tensor(target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    n_val = int(len(y) * val_fraction)
    val_idx, train_idx = order[:n_val], order[n_val:]
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx])


def _read():
    """(images, target) as ``sklearn.datasets.load_digits`` gives them. It reads one gzipped CSV
    that scikit-learn ships (64 pixel values and the digit per row); read here directly, because
    importing scikit-learn takes longer (1-2 s) than the rest of a rank's data loading."""

    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") if spec else None
    if path is None or not path.exists():  # another layout of scikit-learn: ask it
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    data = np.loadtxt(path, delimiter=",")  # numpy reads .gz itself
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


OPTIONS = [Digits]
