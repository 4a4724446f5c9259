"""torchvision internals the vision data sets rely on. Every access was checked on torchvision
0.29.1 (constraints.txt, the tested set; ``suite.compat.CHECKED``) and only that version; docs/compat.md
says what each is for.
"""
from __future__ import annotations

import pickle
from pathlib import Path

from suite.compat import require_attr

LIB = "torchvision"

# CIFAR10/CIFAR100's __init__ calls _check_integrity (md5 of every batch file) and _load_meta
# (class names); both read these class attributes. Checked on 0.29.1.
_CIFAR_METHODS = ("_check_integrity", "_load_meta")
_CIFAR_ATTRIBUTES = ("base_folder", "train_list", "test_list", "meta")


def cifar_without_md5(cls):
    """``cls`` (torchvision's CIFAR10 or CIFAR100) accepting any file in the standard pickle
    format, checking only that the files exist: torchvision checks them against the official md5
    sums, which small test files (and re-packed copies) fail."""
    for name in _CIFAR_METHODS + _CIFAR_ATTRIBUTES:
        require_attr(cls, name, lib=LIB, what="read by torchvision's CIFAR __init__")

    class Unchecked(cls):
        def _check_integrity(self):
            base = Path(self.root) / self.base_folder
            return all((base / name).is_file() for name, _ in self.train_list + self.test_list)

        def _load_meta(self):
            path = Path(self.root) / self.base_folder / self.meta["filename"]
            if not path.is_file():
                raise RuntimeError("Dataset metadata file not found or corrupted.")
            with open(path, "rb") as f:
                self.classes = pickle.load(f, encoding="latin1")[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    return Unchecked
