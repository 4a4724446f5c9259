"""Save and resume a run: every rank's engine state, RNG and loop position, so that a resumed run
continues exactly where it stopped (same seed, same world size -> the same losses).

Layout: ``<run>/checkpoint/rank<N>.pt`` (each rank its own: sharded strategies hold different
state per rank) and ``meta.json`` written last by rank 0: a checkpoint without meta.json is
incomplete and is ignored.

Preemption: Slurm (or submitit's local executor) sends SIGUSR2 before a time limit or when it
preempts. The handler here only raises a flag; the loop agrees on it at its next reduction,
every rank saves at the same step, then rank 0 hands over to submitit's own handler, which
requeues the job. The next attempt finds the checkpoint and resumes.
"""
from __future__ import annotations

import json
import random
import signal
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from suite.record import run_record

_stop_requested = threading.Event()
_previous_handler = None


class Preempted(BaseException):
    """Raised on every rank after the preemption checkpoint is saved (not an error).

    ``exit_code`` is set on the rank whose process submitit asked to exit (after requeueing)."""

    def __init__(self, exit_code=None):
        super().__init__("preempted: checkpoint saved")
        self.exit_code = exit_code


def install_preemption_handler() -> None:
    """Catch SIGUSR2 (keeping submitit's handler to call once the checkpoint is safe)."""
    global _previous_handler
    if threading.current_thread() is not threading.main_thread():
        return
    _previous_handler = signal.getsignal(signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, lambda signum, frame: _stop_requested.set())


def stop_requested() -> bool:
    return _stop_requested.is_set()


def hand_over_to_submitit(ctx) -> None:
    """Rank 0: let submitit requeue the job (it exits the process); others just stop."""
    _stop_requested.clear()
    if ctx.is_main and callable(_previous_handler):
        try:
            _previous_handler(signal.SIGUSR2, None)  # submitit: requeue, then sys.exit
        except SystemExit as e:
            raise Preempted(e.code) from None
    raise Preempted()


def folder(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoint"


def save(run_dir: Path, ctx, engine, loop_state: dict) -> None:
    path = folder(run_dir)
    path.mkdir(exist_ok=True)
    state = {"engine": engine.state_dict(), "loop": loop_state, "rng": _rng_state()}
    tmp = path / f".rank{ctx.rank}.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(path / f"rank{ctx.rank}.pt")
    if ctx.world_size > 1:
        dist.barrier()  # every rank's file is in place before meta.json says so
    if ctx.is_main:
        run_record.write_json_atomic(path / "meta.json", {"step": loop_state["step"], "world_size": ctx.world_size})


def load(run_dir: Path, ctx, engine) -> dict | None:
    """Restore this rank's state if the run folder holds a complete checkpoint; its loop state."""
    meta_path = folder(run_dir) / "meta.json"
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text())
    if meta["world_size"] != ctx.world_size:
        from suite.errors import SuiteError
        raise SuiteError(f"the checkpoint in {meta_path.parent} was saved at world size {meta['world_size']}, "
                         f"this run has {ctx.world_size}; resume with the same launch settings")
    state = torch.load(folder(run_dir) / f"rank{ctx.rank}.pt", map_location=ctx.device, weights_only=False)
    if state["loop"]["step"] != meta["step"]:
        raise RuntimeError(f"checkpoint of rank {ctx.rank} is at step {state['loop']['step']}, meta at {meta['step']}")
    engine.load_state_dict(state["engine"])
    _set_rng_state(state["rng"])
    return state["loop"]


def _rng_state() -> dict:
    import numpy as np

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
