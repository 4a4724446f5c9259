"""Where the suite keeps what it measured or computed once for this machine and user:
``$XDG_CACHE_HOME/scalesuite`` (``~/.cache/scalesuite`` by default): calibrations, matmul peaks,
fake-run answers."""
from __future__ import annotations

import os
from pathlib import Path


def suite_cache(name: str) -> Path:
    """The file or folder ``name`` in the suite's cache (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "scalesuite" / name
