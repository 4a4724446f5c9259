"""The run record: the one module that owns a run's folder and its files, read alike by the ranks
that write it, the submitting side that follows it and ``analysis`` that compares runs.
It imports neither torch nor the per-rank code.

``runs/<name>-<time>-<id>/``
- ``recipe.yaml``: the resolved recipe;
- ``metrics.jsonl``: one JSON object per line, tagged with its ``kind`` (step, epoch, utilisation,
  summary) and ``rank``; written with a single ``O_APPEND`` write per line so ranks never
  interleave within a line (safe on local disks; not guaranteed on NFS across nodes);
- ``summary.json``: the run's status and results (``Summary`` below), replaced atomically so a
  killed run never leaves half a file;
- ``errors/rank<N>.txt``: a failed rank's error (first line a timestamp, second the message);
- ``predicted.json``: the planner's prediction for the run (``suite.planner.predict``);
- ``job.json``: the job that runs it; ``ranks/rank<N>.json``: each rank's process (pid, host);
- ``checkpoint/``, ``submitit/``, ``wandb/``: resume state, task logs, W&B's offline files.

The console lines the submitting side and rank 0 both print are in ``suite.record.console``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError
import socket
import shutil

SCHEMA_VERSION = 1
STATUSES = ("running", "completed", "failed", "cancelled", "preempted")
# Where the peak MFU divides by came from (suite.record.peak) -> how reports and the console say it.
PEAK_LABELS = {"measured": "measured peak", "vendor table": "vendor peak", "recipe": "recipe peak"}


# ---- summary.json ------------------------------------------------------------------------

class RankSummary(BaseModel):
    """One rank's entry in ``summary.json``'s ``ranks`` (definitions: ``suite.record.metrics``)."""
    model_config = ConfigDict(extra="allow")  # utilisation means/peaks vary with the device
    rank: int
    peak_memory_bytes: int
    peak_memory_above_start_bytes: Optional[int] = None  # None: a TensorFlow run (its own loop)
    peak_allocated_bytes: Optional[int] = None  # None: its own loop, a compiled run, no glibc
    peak_reserved_bytes: Optional[int] = None  # CUDA: the caching allocator's peak reservation; None on CPU
    held_bytes: dict[str, int]
    step_time_s: Optional[float] = None
    device: str = "cpu"
    device_name: str = "cpu"
    samples_per_s: Optional[float] = None
    train_time_s: Optional[float] = None
    wandb_mode: str = "disabled"
    strategy_metrics: dict = {}
    # Mean seconds per step of the rank's own work and of its time in collectives after its
    # backward (waiting for slower peers, then the transfer): suite.strategies.clock; None where the
    # engine does not split its steps
    compute_s: Optional[float] = None
    collective_s: Optional[float] = None
    batch_share: Optional[int] = None  # samples of the global batch it trained per step: training.balance
    # training.precision=fp16 (suite.strategies.scaling): steps an inf/NaN gradient skipped, the scale at the end
    skipped_steps: Optional[int] = None
    loss_scale: Optional[float] = None
    nccl: Optional[dict] = None  # NCCL's version and this rank's NCCL_* settings; None off NCCL


class Summary(BaseModel):
    """``summary.json``. While a run is under way (or after it failed) only ``status``, ``name``
    and what is known so far are set; a completed run has every result field."""
    model_config = ConfigDict(extra="allow")  # e.g. job_id, error, failed_rank, strategy extras
    schema_version: int = SCHEMA_VERSION
    status: Literal[STATUSES]
    name: Optional[str] = None  # the recipe's name; absent when a run failed before any rank started
    run_id: Optional[str] = None
    strategy: Optional[str] = None
    model: Optional[str] = None
    data: Optional[str] = None
    world_size: Optional[int] = None
    dp_size: Optional[int] = None
    global_batch: Optional[int] = None
    precision: Optional[str] = None
    device: Optional[str] = None
    backend: Optional[str] = None
    recipe_fingerprint: Optional[str] = None
    steps: Optional[int] = None
    epochs: Optional[int] = None
    samples: Optional[int] = None
    samples_per_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    step_time_s: Optional[float] = None
    epoch_time_s: list[float] = []
    eval_time_s: list[float] = []
    train_time_s: Optional[float] = None
    final: dict[str, float] = {}
    ranks: list[RankSummary] = []
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    attempts: list[dict] = []
    flops_per_step: Optional[int] = None
    devices: Optional[int] = None
    achieved_flops_per_s: Optional[float] = None
    peak_flops_per_s: Optional[float] = None  # per device, what mfu divides by (suite.record.peak)
    # Where the peak came from; optional fields like these are added without a schema_version bump:
    # older summaries lack them, older readers keep them as extras.
    peak_flops_source: Optional[Literal[tuple(PEAK_LABELS)]] = None
    peak_measurement: Optional[dict] = None  # the measured peak's cache entry (CPU, threads, torch, matrix)
    mfu: Optional[float] = None
    oversubscribed: Optional[bool] = None  # more threads than cores on a node: times are not comparable
    torch: Optional[str] = None
    error: Optional[str] = None
    failed_rank: Optional[int] = None
    job_id: Optional[str] = None
    wandb_notice: Optional[str] = None  # W&B fell back to offline, or its export failed
    predicted: Optional[dict] = None  # the planner's prediction for this run (suite.planner.predict)
    # The rank whose compute per step the others waited for, where one stands out (suite.record.metrics.straggler)
    straggler: Optional[dict] = None
    balance: Optional[dict] = None  # training.balance=speed: the compute measured and the shares decided


class BadSummary(ValueError):
    """summary.json is missing, corrupt or not of this schema; the message says which."""


def summary_path(run_dir) -> Path:
    return Path(run_dir) / "summary.json"


def summary_so_far(run_dir) -> dict:
    """``summary.json`` as it stands, unchecked, or {} where the run has not written one yet (a
    follower or a caller asking for its status while it runs)."""
    path = summary_path(run_dir)
    return read_json(path) if path.exists() else {}


def read_summary(run_dir) -> dict:
    """``summary.json`` checked against ``Summary``, as a dict; ``BadSummary`` says what is wrong."""
    path = summary_path(run_dir)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadSummary("no summary.json (incomplete copy, or a run that never started)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadSummary(f"summary.json is corrupt ({e})") from None
    if not isinstance(raw, dict):
        raise BadSummary("summary.json is not a JSON object")
    if raw.get("schema_version", SCHEMA_VERSION) > SCHEMA_VERSION:
        raise BadSummary(f"summary.json has schema_version {raw['schema_version']}, newer than this "
                         f"suite reads ({SCHEMA_VERSION}); update scalesuite")
    try:
        return Summary.model_validate(raw).model_dump(mode="json")
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BadSummary(f"summary.json field {where}: {err['msg']}") from None


def write_summary(run_dir, summary: dict) -> None:
    """Validate against ``Summary`` and write atomically (fields not known are left out)."""
    write_json_atomic(summary_path(run_dir),
                      Summary.model_validate(summary).model_dump(mode="json", exclude_none=True))


def update_summary(run_dir, **fields) -> None:
    """Set fields of ``summary.json`` (created if absent), atomically."""
    path = summary_path(run_dir)
    summary = read_json(path) if path.exists() else {}
    summary.update(fields)
    write_summary(run_dir, summary)


# ---- files -------------------------------------------------------------------------------

def new_run_dir(name: str, recipe_yaml: str, out) -> Path:
    """A fresh run folder under ``out`` holding the resolved recipe."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(out) / f"{name}-{stamp}-{uuid.uuid4().hex[:4]}"
    run_dir.mkdir(parents=True, exist_ok=False)
    (run_dir / "recipe.yaml").write_text(recipe_yaml)
    return run_dir.resolve()


def record_predicted(run_dir, predicted: dict) -> None:
    """The planner's prediction, made by rank 0 after training; summary.json carries it too."""
    write_json_atomic(Path(run_dir) / "predicted.json", predicted)


def read_predicted(run_dir) -> dict | None:
    path = Path(run_dir) / "predicted.json"
    try:
        return read_json(path) if path.exists() else None
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, obj) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def record_error(run_dir: Path, rank: int, message: str, details: str = "") -> Path:
    """``errors/rank<N>.txt``: timestamp, one-line message, then the details (a traceback)."""
    errors = Path(run_dir) / "errors"
    errors.mkdir(exist_ok=True)
    path = errors / f"rank{rank}.txt"
    path.write_text(f"{time.time()}\n{message}\n\n{details}")
    return path


def first_error(run_dir: Path):
    """(rank, message, path) of the earliest error any rank recorded, or None."""
    found = []
    for path in (Path(run_dir) / "errors").glob("rank*.txt"):
        try:
            stamp, message = path.read_text().split("\n", 2)[:2]
            found.append((float(stamp), int(path.stem[4:]), message, path))
        except (OSError, ValueError):
            continue
    if not found:
        return None
    _, rank, message, path = min(found)
    return rank, message, path


def record_job(run_dir: Path, job_id: str, executor: str) -> None:
    """``job.json``: the submitit/Slurm job that runs this run (written by the submitting side)."""
    write_json_atomic(Path(run_dir) / "job.json", {"job_id": str(job_id), "executor": executor,
                                                   "submitted_at": time.time()})


def read_job(run_dir: Path) -> dict:
    path = Path(run_dir) / "job.json"
    try:
        return read_json(path) if path.exists() else {}
    except (OSError, ValueError):
        return {}


def record_rank_process(run_dir: Path, rank: int) -> None:
    """``ranks/rank<N>.json``: where this rank's process runs, so that a rank that dies without a
    word (killed, out of memory) can be noticed by the follower and by ``suite.status``."""

    folder = Path(run_dir) / "ranks"
    folder.mkdir(exist_ok=True)
    record = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "started_at": time.time()}
    if os.environ.get("SLURMD_NODENAME"):  # Slurm's name of the node (what --exclude takes; the host may differ)
        record["node"] = os.environ["SLURMD_NODENAME"]
    write_json_atomic(folder / f"rank{rank}.json", record)


def record_rank_network(run_dir: Path, rank: int, chosen: dict) -> None:
    """Adds to ``ranks/rank<N>.json`` the network interface and address this rank talks on
    (``suite.common.network.choose_interface``'s answer) and the master address it reached."""
    folder = Path(run_dir) / "ranks"
    folder.mkdir(exist_ok=True)
    path = folder / f"rank{rank}.json"
    try:
        record = read_json(path)
    except (OSError, ValueError):
        record = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}
    record["network"] = {k: chosen.get(k) for k in ("interface", "address", "master", "why")}
    write_json_atomic(path, record)


def rank_processes(run_dir: Path) -> list[dict]:
    """The ``record_rank_process`` entries of a run, by rank (the latest attempt's)."""
    out = []
    for path in sorted((Path(run_dir) / "ranks").glob("rank*.json")):
        try:
            out.append(read_json(path))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r["rank"])


def error_ranks(run_dir: Path) -> set[int]:
    return {int(p.stem[4:]) for p in (Path(run_dir) / "errors").glob("rank*.txt")}


class MetricsLog:
    """Appends records to ``metrics.jsonl``: one line per record, tagged with the rank."""

    def __init__(self, run_dir: Path, rank: int):
        self.rank = rank
        self._fd = os.open(Path(run_dir) / "metrics.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, kind: str, **fields) -> None:
        os.write(self._fd, (json.dumps({"kind": kind, "rank": self.rank, **fields}) + "\n").encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---- attempts -----------------------------------------------------------------------------
# ``summary.json``'s ``attempts``: one entry per time the run's ranks started (the first launch,
# a requeue after preemption, ``--resume``, an automatic restart), in order, each with
# ``attempt`` (1, 2, ...), ``started_at``, ``from_step`` (the checkpoint it resumed from) and
# ``slurm_restart_count``. An automatic restart (``launch.max_restarts``, suite/submit/restart.py)
# adds ``restart`` (1, 2, ...), ``cause`` (why the attempt before it ended, e.g. "rank 1 killed by
# SIGKILL after step 37"), ``job_id`` and, on Slurm, ``excluded_nodes``. The follower announces
# such an attempt before its ranks start (``pending``); the ranks complete it when they do.

def recorded_attempts(run_dir) -> list[dict]:
    """The attempts ``summary.json`` lists ([] when there is none, or it cannot be read)."""
    try:
        attempts = read_json(summary_path(run_dir)).get("attempts")
    except (OSError, ValueError, AttributeError):
        return []
    return [dict(a) for a in attempts] if isinstance(attempts, list) else []


def start_attempt(recorded: list[dict], restored: list[dict], from_step: int, **fields) -> list[dict]:
    """The attempts once a new one starts (the ranks' side): those the run record lists, or the
    checkpoint's (``restored``) where they are more (a record from before attempts were written
    at the start); the last one completed if the follower announced it (an automatic restart),
    else a new one appended. A run record is the one place that keeps an attempt that died
    before it saved a checkpoint."""
    attempts = [dict(a) for a in (recorded if len(recorded) >= len(restored) else restored)]
    entry = {"started_at": time.time(), "from_step": from_step, **fields}
    if attempts and attempts[-1].pop("pending", False):
        attempts[-1].update(entry)
    else:
        attempts.append({"attempt": len(attempts) + 1, **entry})
    return attempts


def announce_restart(run_dir, restart: int, cause: str, from_step: int, **fields) -> dict:
    """The follower's side of an automatic restart: the attempt it is about to submit, with its
    cause, appended to ``summary.json`` (marked ``pending`` until its ranks start), the run
    marked running again. Returns the entry."""
    attempts = recorded_attempts(run_dir)
    if not attempts:  # the failed attempt died before its ranks recorded it
        attempts.append({"attempt": 1, "from_step": 0, "started_at": None})
    elif attempts[-1].get("pending"):  # the previous restart never got as far as its ranks starting
        attempts[-1].pop("pending")
    entry = {"attempt": len(attempts) + 1, "restart": restart, "cause": cause, "from_step": from_step,
             "submitted_at": time.time(), "pending": True, **fields}
    update_summary(run_dir, status="running", attempts=attempts + [entry], error=None, failed_rank=None)
    return entry


def checkpoint_folder(run_dir) -> Path:
    return Path(run_dir) / "checkpoint"


def latest_checkpoint(run_dir) -> dict | None:
    """``checkpoint/latest.json``: {"step", "world_size", "folder", "metrics_bytes"} of the last
    complete checkpoint (``suite.train.checkpoint`` writes it), or None."""
    path = checkpoint_folder(run_dir) / "latest.json"
    return read_json(path) if path.exists() else None


def truncate_metrics(run_dir: Path, size_bytes: int) -> None:
    """Cut ``metrics.jsonl`` back to ``size_bytes`` (in place: open appenders stay valid). A run
    resumed from a checkpoint keeps what was logged up to it and redoes the rest, so readers
    never see a step twice."""
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists() and path.stat().st_size > size_bytes:
        os.truncate(path, size_bytes)


def archive_errors(run_dir: Path) -> None:
    """Move the error records of an earlier attempt aside (``errors/attempt-<time>/``), and drop
    its rank process records, so that a resumed run is not taken for failed by the follower."""

    shutil.rmtree(Path(run_dir) / "ranks", ignore_errors=True)
    errors = Path(run_dir) / "errors"
    stale = list(errors.glob("rank*.txt"))
    if stale:
        target = errors / f"attempt-{int(time.time())}"
        target.mkdir(exist_ok=True)
        for path in stale:
            path.replace(target / path.name)


def iter_metrics(run_dir: Path, stats: dict | None = None):
    """Records of ``metrics.jsonl`` in file order; unreadable lines (a torn last line of a killed
    run) are skipped and counted in ``stats["torn"]`` when a dict is given."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if stats is not None:
                stats["torn"] = stats.get("torn", 0) + 1
            continue
        if isinstance(rec, dict):
            yield rec


def read_metrics(run_dir: Path, kind: str | None = None, rank: int | None = None) -> list[dict]:
    """Records of ``metrics.jsonl`` of one kind and/or rank, in file order."""
    return [rec for rec in iter_metrics(run_dir)
            if (kind is None or rec.get("kind") == kind) and (rank is None or rec.get("rank") == rank)]


def latest_per_key(records: list[dict], key: str) -> list[dict]:
    """One record per value of ``key`` (e.g. step), the last written winning, sorted by it: a
    resumed run logs again from its checkpoint, and the later attempt's record is the one kept."""
    latest = {}
    for rec in records:
        latest[rec.get(key, 0)] = rec
    return [latest[k] for k in sorted(latest)]
