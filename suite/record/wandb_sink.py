"""W&B as a sink of the run record: one W&B run per rank, offline unless asked otherwise.

Mode: ``$WANDB_MODE`` if set, else the recipe's ``tracking.wandb`` (offline by default, so no
key, server or prompt is ever needed). Each rank's run is named ``<run id>-rank<N>`` in group
``<run id>``, carries the resolved recipe as config and lives in ``<run folder>/wandb/``.
Every record of ``MetricsLog`` becomes a W&B history row with keys ``<kind>/<field>`` (e.g.
``step/global_loss``) at W&B step = the training step; ``summary`` records update the run's
summary. ``run.log`` costs ~1 ms offline, so records are handed to W&B by a background thread
and the training loop only pays for a queue put.

An online run that cannot start (no API key, server unreachable within
``$WANDB_INIT_TIMEOUT`` seconds, default 15) falls back to offline and says so once.
"""
from __future__ import annotations

import os
import queue
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

_LEGACY = {"dryrun": "offline", "run": "online"}
_MODES = ("offline", "online", "disabled")


def resolve_mode(recipe_mode: str) -> str:
    """``$WANDB_MODE`` overrides the recipe; wandb's legacy names are accepted."""
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    mode = _LEGACY.get(env, env) or recipe_mode
    return mode if mode in _MODES else "offline"


def open_sinks(recipe, rank: int, run_dir: Path) -> list:
    """The extra sinks of this rank's ``MetricsLog``: ``[WandbSink]``, or ``[]`` when disabled."""
    mode = resolve_mode(recipe.tracking.wandb)
    if mode == "disabled":
        return []  # do not even import wandb (~1 s)
    return [WandbSink.start(recipe, rank, Path(run_dir), mode)]


class WandbSink:
    """Forwards run-record records to one W&B run, from a background thread."""

    def __init__(self, run, mode: str):
        self.run, self.mode = run, mode
        self._queue: queue.Queue = queue.Queue()
        self._step = 0
        self._thread = threading.Thread(target=self._drain, name="wandb-sink", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, recipe, rank: int, run_dir: Path, mode: str) -> "WandbSink":
        import wandb

        t = recipe.tracking
        run_id = run_dir.name
        kwargs = dict(dir=str(run_dir), project=t.project, entity=t.entity, group=run_id,
                      name=f"{run_id}-rank{rank}", job_type="train",
                      config={**recipe.model_dump(mode="json", exclude={"sweep"}), "run_id": run_id, "rank": rank})

        def settings(timeout_s=None):
            # console off: W&B would otherwise wrap stdout, which submitit already captures.
            extra = {"init_timeout": timeout_s} if timeout_s else {}
            interval_s = max(0.1, t.sample_interval_s)  # W&B refuses less than 0.1 s
            return wandb.Settings(x_stats_sampling_interval=interval_s, console="off", silent=True, **extra)

        if mode == "online":
            why = None
            if not wandb.login(prompt=False, verify=False):  # never prompts, even on a TTY
                why = "no W&B API key is configured (wandb login, or WANDB_API_KEY)"
            else:
                timeout_s = float(os.environ.get("WANDB_INIT_TIMEOUT", 15))
                why = _unreachable(os.environ.get("WANDB_BASE_URL") or wandb.Settings().base_url, min(timeout_s, 5.0))
            if why is None:
                try:
                    return cls(wandb.init(mode="online", settings=settings(timeout_s), **kwargs), "online")
                except Exception as e:  # noqa: BLE001 - any failure to reach the server
                    why = f"the W&B server did not answer ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            if rank == 0:
                print(f"W&B online is not available: {why}; logging offline to {run_dir / 'wandb'} "
                      "instead (upload later with `wandb sync`)", flush=True)
        return cls(wandb.init(mode="offline", settings=settings(), **kwargs), "offline")

    def log(self, record: dict) -> None:
        self._queue.put(record)

    def _drain(self) -> None:
        while True:
            record = self._queue.get()
            if record is None:
                return
            try:
                self._send(record)
            except Exception as e:  # noqa: BLE001 - W&B must never stop training
                print(f"W&B sink: dropped a {record.get('kind')} record ({e})", flush=True)

    def _send(self, record: dict) -> None:
        kind = record.get("kind", "record")
        fields = {k: v for k, v in record.items() if k not in ("kind", "rank")}
        if kind == "summary":
            self.run.summary.update(_scalars(fields))
            return
        if kind == "step":
            self._step = int(fields["step"])
        # Records without a step of their own join the row of the last training step.
        self.run.log({f"{kind}/{k}": v for k, v in _scalars(fields).items()}, step=self._step)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self.run.finish()


def _unreachable(base_url: str, timeout_s: float) -> str | None:
    """Why the server cannot be reached, or None. Checked before init because a W&B online run
    that fails to start leaves the W&B service retrying, which delays the process's exit ~15 s."""
    url = urlsplit(base_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
        return None
    except OSError as e:
        return f"the W&B server {base_url} cannot be reached ({e or type(e).__name__})"


def _scalars(fields: dict, prefix: str = "") -> dict:
    """Flatten nested dicts to ``a.b`` keys; keep numbers, strings and booleans."""
    out = {}
    for k, v in fields.items():
        if isinstance(v, dict):
            out.update(_scalars(v, f"{prefix}{k}."))
        elif v is None or isinstance(v, (int, float, str, bool)):
            out[f"{prefix}{k}"] = v
    return out
