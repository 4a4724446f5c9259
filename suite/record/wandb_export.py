"""W&B, written from the run record after training: one W&B run per rank, offline unless asked.

Nothing of W&B runs while a rank trains: its service processes would compete for the cores
and its per-call logging cost sits on the step (measured here, W&B offline during training made
steps 0-50% slower, +13% median). The run record (``metrics.jsonl``) is the source of truth;
when a rank's run ends for good (completed or failed, not preempted or cancelled: those go on
later) it exports its own records, and ``python -m suite.export RUN_DIR`` does the same for any
run afterwards, including runs recorded with W&B disabled.

Mode: ``$WANDB_MODE`` if set, else the recipe's ``tracking.wandb`` (offline by default, so no key,
server or prompt is ever needed). Each rank's run is named ``<run id>-rank<N>`` in group
``<run id>``, carries the resolved recipe as config and lives in ``<run folder>/wandb/``. Every
record becomes a W&B history row with keys ``<kind>/<field>`` (e.g. ``step/global_loss``,
``utilisation/cpu_percent``) at W&B step = the training step (readings taken within one step share
its row: the run record keeps them all); the ``summary`` record fills the
run's summary. W&B's own system-metrics sampling is off: the suite's utilisation records carry it.
An online run that cannot start (no or malformed API key, server unreachable) falls back to
offline and says so. An export never fails a run: any W&B error becomes one line.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from suite.common.scratch import temp_folder
from suite.record import run_record

_LEGACY = {"dryrun": "offline", "run": "online"}
_MODES = ("offline", "online", "disabled")


def resolve_mode(recipe_mode: str) -> str:
    """``$WANDB_MODE`` overrides the recipe; wandb's legacy names are accepted."""
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    mode = _LEGACY.get(env, env) or recipe_mode
    return mode if mode in _MODES else "offline"


def export_rank(run_dir, rank: int, mode: str | None = None) -> str | None:
    """Write this rank's records into its W&B run. Returns a notice for people (a fallback to
    offline, or why nothing was written), or None when all went as asked."""
    if mode == "disabled":
        return None
    run_dir = Path(run_dir)
    recipe_path = run_dir / "recipe.yaml"
    recipe = (yaml.safe_load(recipe_path.read_text()) if recipe_path.exists() else None) or {}
    tracking = recipe.get("tracking") or {}
    mode = mode or resolve_mode(tracking.get("wandb", "offline"))
    if mode == "disabled":
        return None
    records = _records(run_dir, rank)
    scratch = run_dir / "wandb" / "tmp"  # W&B's temporary files stay in the run folder, not /tmp
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        with temp_folder(scratch):
            run, notice = _start(recipe, tracking, rank, run_dir, mode)
            step = 0
            for rec in records:
                kind = rec.get("kind", "record")
                fields = {k: v for k, v in rec.items() if k not in ("kind", "rank")}
                if kind == "summary":
                    run.summary.update(_scalars(fields))
                    continue
                if kind == "step":
                    step = int(fields["step"])
                # Records without a step of their own join the row of the last training step.
                run.log({f"{kind}/{k}": v for k, v in _scalars(fields).items()}, step=step)
            run.finish()
            return notice
    except Exception as e:  # noqa: BLE001 - W&B must never fail a run: the run record has it all
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return (f"W&B export of rank {rank} failed ({type(e).__name__}: {first}); the run record has every "
                f"metric; retry with python -m suite.export {run_dir}")


def _records(run_dir: Path, rank: int) -> list[dict]:
    """This rank's records in order; a step or epoch recorded twice (a requeued attempt redid it)
    counts once, as its last record."""
    mine = [r for r in run_record.iter_metrics(run_dir) if r.get("rank") == rank]
    last = {(r["kind"], r[r["kind"]]): i for i, r in enumerate(mine) if r.get("kind") in ("step", "epoch")}
    return [r for i, r in enumerate(mine) if r.get("kind") not in ("step", "epoch") or last[(r["kind"], r[r["kind"]])] == i]


def _start(recipe: dict, tracking: dict, rank: int, run_dir: Path, mode: str):
    """(W&B run, notice): online if asked and possible, else offline with the reason."""
    import wandb

    run_id = run_dir.name
    kwargs = dict(dir=str(run_dir), project=tracking.get("project", "scalesuite"), entity=tracking.get("entity"),
                  group=run_id, name=f"{run_id}-rank{rank}", job_type="train",
                  config={**{k: v for k, v in recipe.items() if k != "sweep"}, "run_id": run_id, "rank": rank})

    def settings(timeout_s=None):
        extra = {"init_timeout": timeout_s} if timeout_s else {}
        # console off: W&B would otherwise wrap stdout; stats off: the utilisation records carry them.
        return wandb.Settings(x_disable_stats=True, console="off", silent=True, **extra)

    notice = None
    if mode == "online":
        why = None
        try:
            if not wandb.login(prompt=False, verify=False):  # never prompts, even on a TTY
                why = "no W&B API key is configured (wandb login, or WANDB_API_KEY)"
        except Exception as e:  # noqa: BLE001 - e.g. a malformed key
            why = f"the W&B API key is not usable ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        timeout_s = float(os.environ.get("WANDB_INIT_TIMEOUT", 15))
        if why is None:
            why = _unreachable(os.environ.get("WANDB_BASE_URL") or wandb.Settings().base_url, min(timeout_s, 5.0))
        if why is None:
            try:
                return wandb.init(mode="online", settings=settings(timeout_s), **kwargs), None
            except Exception as e:  # noqa: BLE001 - any failure to reach the server
                why = f"the W&B server did not answer ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        notice = (f"W&B online is not available: {why}; logged offline to {run_dir / 'wandb'} instead "
                  f"(upload later with `wandb sync`)")
    return wandb.init(mode="offline", settings=settings(), **kwargs), notice


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
