"""What image data sets (vision files, synthetic images) share: ``data.normalize`` and
``data.augment`` (``suite.data.augment``).

``normalize``: ``true`` standardises each channel with the data set's usual statistics (the
published MNIST / Fashion-MNIST / CIFAR ones; for synthetic images, those of its training set),
``false`` leaves the values as loaded (pixels in [0, 1] for files), ``{mean: [...], std: [...]}``
gives one number per channel. Both sets are standardised alike, once, when loaded.

Crop padding takes the value a black (0) pixel has after normalisation, as torchvision's
``RandomCrop(padding=...)`` before ``Normalize`` gives it.
"""
from __future__ import annotations

from typing import Annotated, Optional

import torch
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError
from torch.utils.data import DataLoader, TensorDataset

from suite.data.augment import Augment, AugmentedSet, keep_batch
from suite.data.base import DataOptions, loader
from suite.common.errors import SuiteError


class Normalize(BaseModel):
    """Recipe ``data.normalize``: ``true``, ``false`` or ``{mean: [...], std: [...]}``."""
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    mean: Optional[list[Annotated[float, Field(allow_inf_nan=False)]]] = None  # per channel; None: usual statistics
    std: Optional[list[Annotated[float, Field(gt=0, allow_inf_nan=False)]]] = None

    @model_validator(mode="before")
    @classmethod
    def _from_bool(cls, value):
        if isinstance(value, bool):
            return {"enabled": value}
        if not isinstance(value, dict):
            raise PydanticCustomError("normalize", "give true, false or {mean: [...], std: [...]} (one number per channel)")
        return value


class ImageOptions(DataOptions):
    """Options of a data set of images (channels, height, width)."""
    normalize: Normalize = Normalize(enabled=False)
    augment: Augment = Augment()
    _stats = PrivateAttr(default=None)

    def factory_kwargs(self) -> dict:
        return {k: v for k, v in super().factory_kwargs().items() if k not in ("normalize", "augment")}

    def check(self) -> None:
        shape = tuple(self.spec().input_shape)
        used = [k for k, on in (("normalize", self.normalize.enabled), ("augment", self.augment.active)) if on]
        if used and len(shape) != 3:
            raise SuiteError(f"data.{used[0]} needs images of shape [channels, height, width], but data {self.name} "
                             f"has samples of shape {list(shape)}; drop data.{used[0]} or give data.shape 3 sizes")
        n = self.normalize
        if (n.mean is None) != (n.std is None):
            raise SuiteError(f"data.normalize needs both mean and std (got only {'mean' if n.std is None else 'std'}); "
                             f"give both, or normalize: true for the data set's usual statistics")
        if n.mean is not None and not n.enabled:
            raise SuiteError("data.normalize has mean and std but enabled: false; drop enabled, or drop mean and std")
        for key in ("mean", "std"):
            values = getattr(n, key)
            if values is not None and len(values) != shape[0]:
                raise SuiteError(f"data.normalize.{key}={values} needs one number per channel: data {self.name} has "
                                 f"{shape[0]} channel(s)")
        if self.augment.crop_padding and self.augment.crop_padding >= min(shape[1:]):
            raise SuiteError(f"data.augment.crop_padding={self.augment.crop_padding} must be smaller than the image "
                             f"({shape[1]}x{shape[2]}); CIFAR's usual value is 4")

    def usual_statistics(self) -> tuple[list[float], list[float]]:
        """Per-channel (mean, std) that ``normalize: true`` uses: here, the training set's (before
        ``limit_train``); data sets with published statistics override this."""
        inputs = self.loaded()[0].tensors[0]
        return inputs.mean(dim=(0, 2, 3)).tolist(), inputs.std(dim=(0, 2, 3)).tolist()

    def statistics(self) -> tuple[list[float], list[float]] | None:
        """The (mean, std) the data are standardised with, or None when they are not."""
        if not self.normalize.enabled:
            return None
        if self.normalize.mean is not None:
            return self.normalize.mean, self.normalize.std
        if self._stats is None:
            self._stats = self.usual_statistics()
        return self._stats

    def load(self):
        train, val = super().load()
        stats = self.statistics()
        if stats is None:
            return train, val
        return tuple(TensorDataset(standardise(ds.tensors[0], *stats), ds.tensors[1]) for ds in (train, val))

    def train_loader(self, train, sampler, batch_size: int | None, seed: int) -> DataLoader:
        if not self.augment.active:
            return super().train_loader(train, sampler, batch_size, seed)
        stats = self.statistics()
        channels = train.tensors[0].shape[1]
        fill = -torch.tensor(stats[0]) / torch.tensor(stats[1]) if stats else torch.zeros(channels)
        augmented = AugmentedSet(train, self.augment, seed, fill, epoch_of=lambda: sampler.epoch)
        return loader(augmented, sampler, batch_size, collate_fn=keep_batch)


def standardise(x: torch.Tensor, mean, std) -> torch.Tensor:
    """Float NCHW inputs, per channel: (x - mean) / std."""
    return ((x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)).contiguous()
