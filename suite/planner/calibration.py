"""A stored calibration: this cluster's compute rate and collective costs as ``python -m
suite.calibrate`` measured them (``suite.calibrate.measure``), kept where the planner finds them.

Saved to ``$XDG_CACHE_HOME/scalesuite/calibration/<key>.json`` (key: hosts, backend, threads per
rank); ``load`` finds this host's newest.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from suite.common import network
from suite.common.cache import suite_cache
from suite.record.run_record import write_json_atomic

CALIBRATION_DIR = "calibration"


def cache_dir() -> Path:
    return suite_cache(CALIBRATION_DIR)


def key(hosts, backend: str, threads: int) -> str:
    name = "+".join(hosts) if len(hosts) <= 4 else f"{hosts[0]}+{len(hosts) - 1}more"
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{name}-{backend}-{threads}threads")


def load(path=None, backend: str | None = None) -> dict | None:
    """A calibration: ``path``, else the newest in the cache that measured this node (Slurm's node
    name on a Slurm node, else the host name; of ``backend`` if given);
    None when there is none."""
    if path:
        return json.loads(Path(path).read_text())
    node = network.node_name()  # Slurm's node name on a Slurm node
    found = sorted(cache_dir().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for p in found:
        try:
            c = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if node in (c.get("hosts") or []) and (backend is None or c.get("backend") == backend):
            return c
    return None


def save(calibration: dict, out: Path | None = None) -> list[Path]:
    """Into the cache (keeping the rates of models an earlier calibration of this key measured)
    and ``out``."""
    cached = cache_dir() / f"{calibration['key']}.json"
    try:
        earlier = json.loads(cached.read_text())["compute"].get("models") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        earlier = {}
    calibration["compute"]["models"] = {**earlier, **calibration["compute"].get("models", {})}
    paths = [cached] + ([Path(out)] if out else [])
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(p, calibration)
    return paths


