"""The job's W&B run, written while it trains, by one thread in rank 0 that reads the run record.

Every rank writes its records to ``metrics.jsonl`` as it always does (a line, ~12 µs); rank 0's
``LiveRun`` thread reads what was added since its last look every ``tracking.wandb_every_s``
seconds and logs it (``suite.record.wandb_rows``: a row per step, every rank's fields under
``rank<N>/``). So the ranks never wait for W&B, no collective carries it, W&B's per-call cost
(~0.5-1 ms offline) is paid a few times a minute rather than per step, and the whole job holds one
W&B connection, however many ranks and nodes it has (``opens_wandb``). W&B's shared mode (a
connection per process, writing into one run) was the other way; it needs a server (it does not run
offline) and costs a connection and a W&B service per rank, against the one reader here.

A W&B error never reaches training: it is kept as a notice (``close`` returns it) and the run
record still has everything (``python -m suite.export RUN --force`` rewrites W&B from it).
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from suite.common.scratch import temp_folder
from suite.record import wandb_export, wandb_rows


def opens_wandb(rank: int) -> bool:
    """Whether this rank holds a W&B connection: rank 0 only, which logs every rank's records
    from the run record (so at most one connection per node, one per job)."""
    return rank == 0


class LiveRun:
    """A thread that starts the job's W&B run, then every ``every_s`` logs the run record's new
    rows; ``close`` logs the rest with the summary and finishes the run."""

    def __init__(self, run_dir: Path, recipe: dict, mode: str, world_size: int, every_s: float,
                 checkpoint: dict | None = None):
        self.run_dir, self.recipe, self.mode, self.every_s = Path(run_dir), recipe, mode, every_s
        self.notice: str | None = None
        # a resumed attempt goes on from its checkpoint: the step, and the record it kept
        self._rows = wandb_rows.Rows(world_size, int((checkpoint or {}).get("step", 0)))
        self._offset = _start_bytes(self.run_dir, checkpoint)
        self._tail = b""
        self._run = None
        self._started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="wandb-live", daemon=True)

    def start(self, wait_s: float = 120.0) -> "LiveRun":
        """Start the thread; wait (at most ``wait_s``) until W&B has started, before the first
        step, so that importing and starting it is not paid inside the timed steps."""
        self._thread.start()
        self._started.wait(wait_s)
        return self

    def close(self, timeout_s: float = 120.0) -> str | None:
        """Log what is left and the summary, finish the W&B run; returns the notice, if any."""
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self.notice = self.notice or f"W&B did not finish within {timeout_s:.0f} s; the run record has every metric"
        return self.notice

    def _main(self) -> None:
        # W&B's temporary files go to the run folder; tempfile's folder is the process's, so it is
        # moved only while the rank waits (starting, finishing), never while it trains.
        scratch = wandb_export.scratch(self.run_dir)
        try:
            with temp_folder(scratch):
                self._run, self.notice = wandb_export.start(self.run_dir, self.recipe, self.mode,
                                                            self._rows.world_size)
            self._started.set()
            while not self._stop.wait(self.every_s):
                self._log(everything=False)
            with temp_folder(scratch):
                self._log(everything=True)
                wandb_export.finish(self._run, self.run_dir, self._rows)
        except Exception as e:  # noqa: BLE001 - W&B must never fail a run: the run record has it all
            self.notice = wandb_export.failed("live logging", e, self.run_dir)
        finally:
            self._started.set()

    def _log(self, everything: bool) -> None:
        for rec in self._read_new():
            self._rows.add(rec)
        for step, row in self._rows.drain(everything):
            self._run.log(row, step=step)

    def _read_new(self) -> list[dict]:
        """Whole lines added to the record since the last read (a line being written waits)."""
        path = self.run_dir / "metrics.jsonl"
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data, self._tail = (self._tail + data).rpartition(b"\n")[::2] if b"\n" in data else (b"", self._tail + data)
        out = []
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
        return out


def _start_bytes(run_dir: Path, checkpoint: dict | None) -> int:
    """Where in the record this attempt's records begin: the checkpoint's cut, or the start."""
    size = os.path.getsize(Path(run_dir) / "metrics.jsonl") if (Path(run_dir) / "metrics.jsonl").exists() else 0
    return min(int((checkpoint or {}).get("metrics_bytes", 0)), size)
