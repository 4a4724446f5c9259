"""What the follower prints while a job runs: rank 0's epoch records as they land, and a step
line at most every few seconds (``suite.submit.follow``)."""
from __future__ import annotations

import json
import time

from suite.record import console


class Progress:
    """Prints rank 0's epoch records as they land, and a step line at most every few seconds."""

    def __init__(self, run_dir, total_epochs, printer, prefix="", every_s: float = 5.0):
        self.path = run_dir / "metrics.jsonl"
        self.total_epochs, self.printer, self.prefix, self.every_s = total_epochs, printer, prefix, every_s
        self.offset = self.path.stat().st_size if self.path.exists() else 0  # a resumed run: only what is new
        self.last_print = time.time()
        self.last_step = None

    def show(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            size = f.seek(0, 2)
            if size < self.offset:  # cut back by a resumed run (to its checkpoint): go on from there
                self.offset = size
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # only whole lines
        self.offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("rank") != 0:
                continue
            if rec["kind"] == "epoch":
                self.printer(self.prefix + console.epoch_line(rec, self.total_epochs))
                self.last_print, self.last_step = time.time(), None
            elif rec["kind"] == "step" and rec.get("global_loss") is not None:
                self.last_step = rec
        if self.last_step and time.time() - self.last_print > self.every_s:
            s = self.last_step
            self.printer(f"{self.prefix}  step {s['step'] + 1}  epoch {s['epoch'] + 1}  loss {s['global_loss']:.4f}")
            self.last_print, self.last_step = time.time(), None
