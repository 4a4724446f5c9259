"""W&B runs: how one starts (``start``), and ``export_run``, which writes a job's W&B run from its
run record afterwards (``python -m suite.export``), e.g. for a run recorded with W&B disabled.

One W&B run per job, whose id is the run id (the run folder's name) and which is resumed
(``resume="allow"``): a requeued, resumed or restarted attempt, and an export, go on in the same
W&B run instead of making another. While a job trains, rank 0 writes it live
(``suite.record.wandb_live``); the rows, config, names and summary are ``suite.record.wandb_rows``'s.
The run record (``metrics.jsonl``) stays the source of truth.

Mode: ``$WANDB_MODE`` if set, else the recipe's ``tracking.wandb`` (offline by default, so no key,
server or prompt is ever needed). Files live in ``<run folder>/wandb/`` (offline: one
``offline-run-<time>-<run id>`` folder per attempt; ``wandb sync`` uploads them into the one run).
W&B's system monitor is on (CPU, memory, and the GPUs this process sees), sampled every
``tracking.sample_interval_s``. An online run that cannot start (no or malformed API key, server
unreachable) falls back to offline and says so. W&B never fails a run: any error becomes one line.
"""
from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from suite.common.scratch import temp_folder
from suite.record import run_record, wandb_rows

_LEGACY = {"dryrun": "offline", "run": "online"}
_MODES = ("offline", "online", "disabled")


def resolve_mode(recipe_mode: str) -> str:
    """``$WANDB_MODE`` overrides the recipe; wandb's legacy names are accepted."""
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    mode = _LEGACY.get(env, env) or recipe_mode
    return mode if mode in _MODES else "offline"


def read_recipe(run_dir: Path) -> dict:
    path = Path(run_dir) / "recipe.yaml"
    return (yaml.safe_load(path.read_text()) if path.exists() else None) or {}


def offline_runs(run_dir: Path) -> list[Path]:
    """This job's offline W&B runs (one per attempt that wrote one), oldest first."""
    return sorted(Path(run_dir).glob(f"wandb/offline-run-*-{Path(run_dir).name}"))


def export_run(run_dir, mode: str | None = None, force: bool = False) -> str | None:
    """Write the job's W&B run from its run record. Idempotent: a job that already has its W&B
    run (written live, or exported before) is left as it is unless ``force``, which replaces
    the offline files (online, the same id is resumed: W&B keeps one run). Returns a notice for
    people (a fallback to offline, why nothing was written), or None when all went as asked."""
    run_dir = Path(run_dir)
    recipe = read_recipe(run_dir)
    mode = mode or resolve_mode((recipe.get("tracking") or {}).get("wandb", "offline"))
    if mode == "disabled":
        return None
    before = offline_runs(run_dir)
    if before and not force:
        return (f"{run_dir} already has its W&B run ({before[-1].name}; `wandb sync` uploads it); --force writes "
                f"it again from the run record")
    records = list(run_record.iter_metrics(run_dir))
    world = max((int(r.get("rank", 0)) for r in records), default=0) + 1
    try:
        with temp_folder(scratch(run_dir)):
            run, notice = start(run_dir, recipe, mode, world)
            for path in before if mode == "offline" else ():
                shutil.rmtree(path, ignore_errors=True)
            rows = wandb_rows.Rows(world)
            for rec in records:
                rows.add(rec)
            for step, row in rows.drain(everything=True):
                run.log(row, step=step)
            finish(run, run_dir, rows)
            return notice
    except Exception as e:  # noqa: BLE001 - W&B must never fail a run: the run record has it all
        return failed("export", e, run_dir)


def study_run(folder: Path, recipe: dict, tables: dict[str, list[dict]]) -> str | None:
    """A study's own W&B run (id and group: the study folder's name, job type ``study``) holding
    its comparison tables (e.g. published vs ours, every arm) as W&B tables, beside the arms' runs
    in the same group. Written again, it goes on in the same run. Returns a notice, or None."""
    folder = Path(folder)
    mode = resolve_mode((recipe.get("tracking") or {}).get("wandb", "offline"))
    if mode == "disabled" or not any(tables.values()):
        return None
    import wandb

    tracking = recipe.get("tracking") or {}
    try:
        with temp_folder(scratch(folder)):
            run = wandb.init(mode=mode if mode == "offline" else "online", dir=str(folder), id=folder.name,
                             resume="allow", project=tracking.get("project", "scalesuite"), entity=tracking.get("entity"),
                             group=folder.name, job_type="study", name=f"study {folder.name}",
                             config=wandb_rows.config(recipe, folder.name),
                             settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))
            for name, rows in tables.items():
                if rows:
                    columns = list(dict.fromkeys(k for row in rows for k in row))
                    # a column may hold a number on one row and text on another (a one-rank arm's peak
                    # memory beside a two-rank arm's "a;b"): W&B refuses such a table unless told
                    run.log({name: wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows],
                                               allow_mixed_types=True)})
            close(run)
        return None
    except Exception as e:  # noqa: BLE001 - the study's report is written; W&B only mirrors it
        return failed("study run", e, folder)


def failed(what: str, e: Exception, run_dir: Path) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return (f"W&B {what} failed ({type(e).__name__}: {first}); the run record has every metric; "
            f"write W&B from it with python -m suite.export {run_dir} --force")


def scratch(run_dir: Path) -> Path:
    """``<run folder>/wandb/tmp``, created: W&B's temporary files stay in the run folder, not /tmp."""
    folder = Path(run_dir) / "wandb" / "tmp"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def finish(run, run_dir: Path, rows: wandb_rows.Rows) -> None:
    """The summary (run-wide results, final losses, each rank's peaks), then close the run."""
    run.summary.update(wandb_rows.run_summary(run_dir, rows))
    close(run)


def close(run) -> None:
    """Finish the run and end W&B's service process and threads: a process that forks ranks later
    (a rank 0, a test) must not pass them on, or the forked rank can hang at start-up."""
    import wandb

    run.finish()
    wandb.teardown()


def start(run_dir: Path, recipe: dict, mode: str, world_size: int, stats_interval_s: float | None = None):
    """(W&B run, notice): the job's run, online if asked and possible, else offline with the reason."""
    import wandb

    run_id = run_dir.name
    tracking = recipe.get("tracking") or {}
    interval_s = stats_interval_s or float(tracking.get("sample_interval_s", 1.0))
    kwargs = dict(dir=str(run_dir), project=tracking.get("project", "scalesuite"), entity=tracking.get("entity"),
                  id=run_id, resume="allow", config=wandb_rows.config(recipe, run_id), **wandb_rows.names(recipe, run_id))

    def settings(timeout_s=None):
        extra = {"init_timeout": timeout_s} if timeout_s else {}
        # console off: W&B would otherwise wrap stdout. The monitor watches this process and the
        # GPUs it sees (CUDA_VISIBLE_DEVICES renumbers them from 0, as W&B's device ids count).
        return wandb.Settings(console="off", silent=True, x_stats_sampling_interval=interval_s,
                              x_stats_gpu_device_ids=_visible_gpus(), **extra)

    def begin(run_mode, timeout_s=None):
        run = wandb.init(mode=run_mode, settings=settings(timeout_s), **kwargs)
        for key, summary in wandb_rows.DEFINED.items():
            run.define_metric(key, summary=summary)
        return run

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
                return begin("online", timeout_s), None
            except Exception as e:  # noqa: BLE001 - any failure to reach the server
                why = f"the W&B server did not answer ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        notice = (f"W&B online is not available: {why}; logged offline to {run_dir / 'wandb'} instead "
                  f"(upload later with `wandb sync`)")
    return begin("offline"), notice


def _visible_gpus() -> list[int] | None:
    """The GPUs this process may use, as 0-based indices of those it sees; None: W&B's default (all)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return list(range(len([d for d in visible.split(",") if d.strip()])))


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
