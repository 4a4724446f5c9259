"""Data sets load from their standard on-disk formats (tiny files written here) or need no files."""
import pickle
import struct

import numpy as np
import pytest
import torch

from suite.data import DATASETS
from suite.common.errors import SuiteError


def write_idx(path, array: np.ndarray):
    """MNIST's idx format: magic (0, 0, dtype 0x08, ndim), big-endian sizes, raw uint8 bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_style_sets_read_idx_files(tmp_path, name, folder):
    rng = np.random.default_rng(0)
    raw = tmp_path / folder / "raw"
    for split, n in (("train", 12), ("t10k", 5)):
        write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{split}-labels-idx1-ubyte", np.arange(n) % 10)
    opts = DATASETS[name](root=str(tmp_path))
    opts.check_available()
    train, val = opts.load()
    assert len(train) == 12 and len(val) == 5
    x, y = train[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y.item() == 3
    assert opts.spec().input_shape == (1, 28, 28)


@pytest.mark.parametrize("name, folder, files, label_key, classes", [
    ("cifar10", "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"],
     "labels", ("batches.meta", "label_names")),
    ("cifar100", "cifar-100-python", ["train", "test"], "fine_labels", ("meta", "fine_label_names")),
])
def test_cifar_sets_read_python_pickles(tmp_path, name, folder, files, label_key, classes):
    base = tmp_path / folder
    base.mkdir()
    rng = np.random.default_rng(0)
    for f in files:
        with open(base / f, "wb") as fh:
            pickle.dump({"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), label_key: [0, 1, 2, 3]}, fh)
    with open(base / classes[0], "wb") as fh:
        pickle.dump({classes[1]: [f"c{i}" for i in range(10)]}, fh)
    train, val = DATASETS[name](root=str(tmp_path)).load()
    assert len(train) == 4 * (len(files) - 1) and len(val) == 4
    assert train[0][0].shape == (3, 32, 32)


def test_a_missing_data_set_names_the_folder_and_the_fix(tmp_path):
    opts = DATASETS["cifar10"](root=str(tmp_path))
    with pytest.raises(SuiteError, match=f"data set cifar10 not found in {tmp_path}/cifar-10-batches-py.*data.download=true"):
        opts.check_available()
    with pytest.raises(SuiteError, match="not found"):
        opts.load()


def test_synthetic_is_deterministic_from_its_seed_and_learnable():
    a, _ = DATASETS["synthetic"](seed=3, n_train=64).load()
    b, _ = DATASETS["synthetic"](seed=3, n_train=64).load()
    c, _ = DATASETS["synthetic"](seed=4, n_train=64).load()
    assert torch.equal(a.tensors[0], b.tensors[0]) and not torch.equal(a.tensors[0], c.tensors[0])
    assert len(a.tensors[1].unique()) > 5  # the teacher uses many classes


def test_digits_ships_with_scikit_learn():
    train, val = DATASETS["digits"]().load()
    assert len(train) + len(val) == 1797 and train[0][0].shape == (1, 8, 8)
    assert DATASETS["digits"](limit_train=100).load()[0].tensors[0].shape[0] == 100
