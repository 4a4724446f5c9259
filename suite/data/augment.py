"""Training-set augmentation for images (recipe ``data.augment``): random crop with padding and
horizontal flip, as the CIFAR studies use (``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip``).

Two properties matter more than the transforms themselves:
- **Deterministic per sample**: the crop offset and the flip of a sample are drawn from a table
  made from (training.seed, epoch) and indexed by the sample's index in the training set. So
  a sample gets the same augmentation whichever rank reads it and whatever else is in its batch:
  ``ddp`` on N ranks trains on exactly the inputs ``single`` does, and a resumed run redoes a
  batch exactly. (Per-rank random generators, as in a torchvision pipeline per DataLoader
  worker, would give each world size different inputs.)
- **Per batch, vectorised**: a batch is fetched with one index and transformed with one gather,
  no per-sample Python or PIL; the table costs one draw per sample and epoch.

Only the training loader is augmented (``suite.data.images.ImageOptions.train_loader``); the
validation set never is.
"""
from __future__ import annotations

import hashlib

import torch
from pydantic import BaseModel, ConfigDict, NonNegativeInt
from torch.utils.data import Dataset, TensorDataset


class Augment(BaseModel):
    """Recipe ``data.augment``."""
    model_config = ConfigDict(extra="forbid")
    crop_padding: NonNegativeInt = 0  # pad each side by this many pixels, then crop back at a random offset
    hflip: bool = False  # mirror left-right with probability 1/2

    @property
    def active(self) -> bool:
        return self.crop_padding > 0 or self.hflip


def draws(n: int, padding: int, seed: int, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets (n, 2): row and column of each sample's crop in the padded image, flips (n,) bool)
    for the n samples of the training set in this epoch."""
    key = hashlib.sha256(f"augment:{seed}:{epoch}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & (2**63 - 1))
    offsets = torch.randint(0, 2 * padding + 1, (n, 2), generator=g)
    flips = torch.randint(0, 2, (n,), generator=g).bool()
    return offsets, flips


def crop_flip(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor, padding: int,
              fill: torch.Tensor) -> torch.Tensor:
    """Each image of the batch ``x`` (B, C, H, W) padded by ``padding`` with ``fill`` (per channel),
    cropped back to H x W at its ``offsets`` row/column, mirrored where ``flips``: one gather over
    flat pixel indices (0.7 ms per 128 CIFAR images on one CPU core; indexing with four index
    tensors instead took about 3 times as long)."""
    b, c, h, w = x.shape
    hp, wp = h + 2 * padding, w + 2 * padding
    padded = x.new_empty(b, c, hp, wp)
    padded[:] = fill.to(x.dtype).view(1, c, 1, 1)
    padded[:, :, padding:padding + h, padding:padding + w] = x
    rows = offsets[:, 0, None] + torch.arange(h)  # (B, H)
    across = torch.arange(w).expand(b, w)
    cols = offsets[:, 1, None] + torch.where(flips[:, None], w - 1 - across, across)  # (B, W)
    flat = (rows[:, :, None] * wp + cols[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    return padded.view(b, c, hp * wp).gather(2, flat).view(b, c, h, w)


class AugmentedSet(Dataset):
    """A TensorDataset of images whose batches come out augmented: ``DataLoader`` fetches a whole
    batch through ``__getitems__`` (one index, one gather) and ``keep_batch`` passes it through."""

    def __init__(self, data: TensorDataset, augment: Augment, seed: int, fill: torch.Tensor, epoch_of):
        self.inputs, self.targets = data.tensors
        self.augment, self.seed, self.fill, self.epoch_of = augment, seed, fill, epoch_of
        self._epoch, self._draws = None, None

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int):
        x, y = self.__getitems__([i])
        return x[0], y[0]

    def __getitems__(self, indices):
        epoch = self.epoch_of()
        if epoch != self._epoch:
            self._epoch = epoch
            self._draws = draws(len(self), self.augment.crop_padding, self.seed, epoch)
        idx = torch.as_tensor(indices, dtype=torch.int64)
        offsets, flips = self._draws
        flips = flips[idx] if self.augment.hflip else torch.zeros(len(idx), dtype=torch.bool)
        x = crop_flip(self.inputs[idx], offsets[idx], flips, self.augment.crop_padding, self.fill)
        return x, self.targets[idx]


def keep_batch(batch):
    """collate_fn for a data set that returns whole batches (module level: picklable)."""
    return batch
