"""``tempfile``'s folder pointed elsewhere for a block (``temp_folder``): for libraries that write
temporary files we cannot name a folder for (W&B's export, TensorFlow's autograph)."""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path


@contextlib.contextmanager
def temp_folder(folder: str | Path):
    """This process's temp folder (``tempfile.tempdir``, which every ``tempfile`` call without a
    ``dir`` uses) set to ``folder`` while the block runs, then back to what it was."""
    before, tempfile.tempdir = tempfile.tempdir, str(folder)
    try:
        yield
    finally:
        tempfile.tempdir = before
