"""MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 read from their standard on-disk formats
through torchvision, from ``data.root`` (default ``data/``, or $SCALESUITE_DATA). Pixels are
loaded as [0, 1] floats and standardised with the data set's published per-channel statistics
unless ``data.normalize`` says otherwise (``suite.data.images``)."""
import os
from pathlib import Path
from typing import Literal

import torch
from torch.utils.data import TensorDataset

from suite.data import DataSpec, files
from suite.data.images import ImageOptions, Normalize
from suite.common.errors import SuiteError

# name: (torchvision class, folder torchvision expects under root, shape, classes, mean, std)
_SETS = {
    "mnist": ("MNIST", "MNIST/raw", (1, 28, 28), 10, (0.1307,), (0.3081,)),
    "fashion_mnist": ("FashionMNIST", "FashionMNIST/raw", (1, 28, 28), 10, (0.2860,), (0.3530,)),
    "cifar10": ("CIFAR10", "cifar-10-batches-py", (3, 32, 32), 10,
                (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ("CIFAR100", "cifar-100-python", (3, 32, 32), 100,
                 (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class _Vision(ImageOptions):
    root: str = os.environ.get("SCALESUITE_DATA", "data")
    download: bool = False
    normalize: Normalize = Normalize()  # on by default, with the published statistics

    def usual_statistics(self):
        _, _, _, _, mean, std = _SETS[self.name]
        return list(mean), list(std)

    def spec(self) -> DataSpec:
        _, _, shape, classes, _, _ = _SETS[self.name]
        return DataSpec(self.name, shape, classes)

    def check_available(self) -> None:
        if self.download:
            return
        folder = Path(self.root).expanduser().resolve() / _SETS[self.name][1]
        if not folder.is_dir() or not any(folder.iterdir()):
            raise _missing(self.name, self.root)
        files.check(self.name, folder)  # names a file that is missing, truncated or garbled

    def sizes(self):
        folder = Path(self.root).expanduser().resolve() / _SETS[self.name][1]
        if self.download or not folder.is_dir() or not any(folder.iterdir()):
            return None  # torchvision fetches what is missing: known only after the download
        return files.check(self.name, folder)

    def factory_kwargs(self) -> dict:
        return {"name": self.name, **super().factory_kwargs()}  # one factory reads all four


def load(*, name: str, root: str, download: bool):
    cls_name = _SETS[name][0]
    cls, where = _without_md5(cls_name), str(Path(root).expanduser().resolve())
    try:
        train = cls(where, train=True, download=download)
        val = cls(where, train=False, download=download)
    except RuntimeError as e:
        if "not found" not in str(e).lower() and "corrupted" not in str(e).lower():
            raise
        raise _missing(name, root) from None
    return _tensors(train), _tensors(val)


def _missing(name: str, root: str) -> SuiteError:
    folder = Path(root).expanduser().resolve() / _SETS[name][1]
    return SuiteError(f"data set {name} not found in {folder}: put the standard files there "
                      f"(data.root={root!r}), or set data.download=true where the network allows")


def _tensors(ds) -> TensorDataset:
    images = torch.as_tensor(ds.data)
    if images.ndim == 3:  # MNIST: N, H, W
        images = images.unsqueeze(1)
    else:  # CIFAR: N, H, W, C
        images = images.permute(0, 3, 1, 2)
    targets = torch.as_tensor(ds.targets, dtype=torch.int64)
    return TensorDataset(images.float().div_(255.0), targets)  # standardised by ImageOptions.load


def _without_md5(cls_name):
    """torchvision checks CIFAR files against the official md5 sums; we accept any file in the
    standard pickle format (so tests can write small ones) and check only that it exists."""
    import torchvision.datasets as tvd

    from suite.compat import torchvision as tv_compat

    cls = getattr(tvd, cls_name)
    return tv_compat.cifar_without_md5(cls) if cls_name.startswith("CIFAR") else cls


def _options(name):
    return type(name.title().replace("_", ""), (_Vision,), {
        "__annotations__": {"name": Literal[name]}, "name": name, "__module__": __name__})


OPTIONS = [_options(n) for n in _SETS]
