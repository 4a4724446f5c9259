from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt
from torch.utils.data import TensorDataset


class DataOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit_train: Optional[PositiveInt] = None  # use only the first N training samples
    limit_val: Optional[PositiveInt] = None

    def check_available(self) -> None:
        """Raise SuiteError if the data cannot be loaded (checked before launch)."""

    def sizes(self) -> tuple[int, int] | None:
        """(training, validation) samples the data set holds before limits, or None if unknown
        before loading (checked before launch against the batch size and the node's memory)."""
        return None

    def limited(self, train: TensorDataset, val: TensorDataset):
        return _head(train, self.limit_train), _head(val, self.limit_val)


def _head(ds: TensorDataset, n):
    if n is None or n >= len(ds):
        return ds
    return TensorDataset(*(t[:n] for t in ds.tensors))


def normalise(images: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 NCHW images -> float32, per-channel standardised."""
    x = images.float().div_(255.0)
    mean = torch.tensor(mean).view(1, -1, 1, 1)
    std = torch.tensor(std).view(1, -1, 1, 1)
    return (x - mean) / std
