"""Checks of the standard on-disk formats before launch, so that a missing, truncated or garbled file
is named with what is wrong instead of failing inside every rank.

- MNIST / Fashion-MNIST: idx files (big-endian header: magic 0x0000080<d> for unsigned bytes in d
  dimensions, then d sizes; then exactly the product of the sizes in bytes).
- CIFAR-10 / CIFAR-100: pickled dicts with ``data`` (N x 3072 bytes) and the labels (N of them),
  plus the meta file naming the classes.
"""
from __future__ import annotations

import functools
import math
import pickle
from pathlib import Path

from suite.common.errors import SuiteError

_IDX = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
# name: (training batches, test batches, meta file, key of the class names in it, key of the labels)
_CIFAR = {"cifar10": ([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "batches.meta", "label_names", "labels"),
          "cifar100": (["train"], ["test"], "meta", "fine_label_names", "fine_labels")}


def check(name: str, folder: Path) -> tuple[int, int]:
    """(training samples, validation samples) of the data set in ``folder``; SuiteError naming the
    file that is missing or not in the standard format."""
    folder = Path(folder)
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file())
    return _check(name, str(folder), stamp)


@functools.lru_cache(maxsize=8)
def _check(name: str, folder: str, _stamp) -> tuple[int, int]:
    # _stamp (file names, sizes, times) is part of the cache key: a changed folder is checked again.
    folder = Path(folder)
    if name in _CIFAR:
        train, test, meta, meta_key, label_key = _CIFAR[name]
        _pickled(folder / meta, (meta_key,))
        return (sum(_cifar_batch(folder / f, label_key) for f in train),
                sum(_cifar_batch(folder / f, label_key) for f in test))
    return tuple(_idx_pair(folder, *_IDX[split]) for split in ("train", "val"))


def _bad(path: Path, what: str) -> SuiteError:
    return SuiteError(f"data file {path} {what}; replace it with the standard file "
                      f"(or remove the folder and set data.download=true where the network allows)")


def _idx_pair(folder: Path, images: str, labels: str) -> int:
    n_images = _idx(folder / images, (28, 28))
    n_labels = _idx(folder / labels, ())
    if n_images != n_labels:
        raise _bad(folder / labels, f"holds {n_labels} labels but {images} holds {n_images} images")
    return n_images


def _idx(path: Path, item_shape: tuple) -> int:
    """Items in an idx file of unsigned bytes whose items have ``item_shape``."""
    if not path.is_file():
        raise _bad(path, "is missing")
    dims = 1 + len(item_shape)
    with open(path, "rb") as f:
        head = f.read(4 + 4 * dims)
    if len(head) < 4 + 4 * dims:
        raise _bad(path, f"is {len(head)} bytes, shorter than an idx header")
    magic = int.from_bytes(head[:4], "big")
    if magic != 0x800 + dims:
        raise _bad(path, f"is not an idx file of bytes in {dims} dimension(s) (magic number {magic:#010x}, "
                         f"expected {0x800 + dims:#010x})")
    sizes = [int.from_bytes(head[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    if tuple(sizes[1:]) != item_shape:
        raise _bad(path, f"holds items of shape {sizes[1:]}, expected {list(item_shape)}")
    expected = 4 + 4 * dims + math.prod(sizes)
    if path.stat().st_size != expected:
        raise _bad(path, f"is {path.stat().st_size} bytes, but its header promises {expected} "
                         f"({sizes[0]} items): truncated or padded")
    return sizes[0]


def _pickled(path: Path, keys: tuple) -> dict:
    if not path.is_file():
        raise _bad(path, "is missing")
    try:
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="latin1")
    except Exception as e:  # any unpickling failure means the same: not a file of this format
        raise _bad(path, f"is not a pickled CIFAR file ({type(e).__name__}: {' '.join(str(e).split())[:80]})") from None
    missing = [k for k in keys if not isinstance(obj, dict) or k not in obj]
    if missing:
        raise _bad(path, f"is not a CIFAR dict with {', '.join(keys)} (missing {', '.join(missing)})")
    return obj


def _cifar_batch(path: Path, label_key: str) -> int:
    batch = _pickled(path, ("data", label_key))
    data, labels = batch["data"], batch[label_key]
    shape = tuple(getattr(data, "shape", ()))
    if len(shape) != 2 or shape[1] != 3 * 32 * 32:
        raise _bad(path, f"has data of shape {shape}, expected N x 3072 (32x32 RGB images)")
    if len(labels) != shape[0]:
        raise _bad(path, f"has {shape[0]} images but {len(labels)} labels")
    return shape[0]
