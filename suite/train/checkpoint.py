"""Save and resume a run: every rank's engine state, RNG and loop position, so that a resumed run
continues exactly where it stopped (same seed, same world size -> the same losses).

Layout: ``<run>/checkpoint/step-<N>/rank<R>.pt`` (each rank its own: sharded strategies hold
different state per rank) and ``<run>/checkpoint/latest.json`` naming the last complete one.
A new checkpoint is written beside the last good one; only when every rank's file is in place
does rank 0 switch ``latest.json`` (an atomic replace) and then delete older step folders. A
crash at any moment (even SIGKILL mid-write) leaves ``latest.json`` naming a complete checkpoint.
"""
from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from suite.common.errors import SuiteError
from suite.record import run_record
import signal
import numpy as np


folder = run_record.checkpoint_folder
latest = run_record.latest_checkpoint


def save(run_dir: Path, ctx, engine, loop_state: dict) -> None:
    step = loop_state["step"]
    target = folder(run_dir) / f"step-{step}"
    target.mkdir(parents=True, exist_ok=True)
    state = {"engine": engine.state_dict(), "loop": loop_state, "rng": _rng_state()}
    tmp = target / f".rank{ctx.rank}.pt.tmp"
    try:
        torch.save(state, tmp)
        _maybe_die_while_saving(ctx.rank, step)
        os.replace(tmp, target / f"rank{ctx.rank}.pt")
    except OSError as e:
        tmp.unlink(missing_ok=True)  # give back what the half-written file took
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise SuiteError(_disk_full(run_dir, ctx.rank, step)) from None
    if ctx.world_size > 1:
        dist.barrier()  # every rank's file is in place before latest.json says so
    if ctx.is_main:
        # Every rank logged its records up to this step before the barrier: a resumed run keeps
        # metrics.jsonl up to here and drops what the stopped attempt logged after (it is redone).
        records = Path(run_dir) / "metrics.jsonl"
        try:  # written aside and replaced: a full disk leaves the old latest.json
            run_record.write_json_atomic(folder(run_dir) / "latest.json", {
                "step": step, "world_size": ctx.world_size, "folder": target.name,
                "metrics_bytes": records.stat().st_size if records.exists() else 0})
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise SuiteError(_disk_full(run_dir, ctx.rank, step)) from None
        for old in folder(run_dir).glob("step-*"):
            if old.name != target.name:
                shutil.rmtree(old, ignore_errors=True)
    if ctx.world_size > 1:
        dist.barrier()  # no rank runs ahead into a save that rank 0 might still be cleaning up


def _disk_full(run_dir: Path, rank: int, step: int) -> str:
    """The line for a disk that filled during a save: the folder, and what is still saved."""
    saved = latest(run_dir)
    kept = (f"the last good checkpoint (step {saved['step']}, {folder(run_dir) / saved['folder']}) is intact"
            if saved else "no earlier checkpoint was saved")
    return (f"the disk of {folder(run_dir)} is full (or over quota): rank {rank} could not save the checkpoint "
            f"of step {step}; {kept}; free space there and continue with python -m suite.submit --resume {run_dir}")


def load(run_dir: Path, ctx, engine) -> dict | None:
    """Restore this rank's state from the last complete checkpoint, if any; its loop state."""
    meta = latest(run_dir)
    if meta is None:
        return None
    if meta["world_size"] != ctx.world_size:
        raise SuiteError(f"the checkpoint in {folder(run_dir)} was saved at world size {meta['world_size']}, "
                         f"this run has {ctx.world_size}; resume with the same launch settings")
    state = torch.load(folder(run_dir) / meta["folder"] / f"rank{ctx.rank}.pt", map_location=ctx.device,
                       weights_only=False)
    engine.load_state_dict(state["engine"])
    _set_rng_state(state["rng"])
    return state["loop"]


def _maybe_die_while_saving(rank: int, step: int) -> None:
    """Fault injection for tests: SCALESUITE_FAIL_AT=RANK:STEP:kill-in-save SIGKILLs this rank
    after its new file is written but before it is in place (a crash in the middle of a save);
    RANK:STEP:disk-full raises ENOSPC there (a disk that fills during the save)."""
    spec = os.environ.get("SCALESUITE_FAIL_AT", "")
    if spec == f"{rank}:{step}:kill-in-save":
        os.kill(os.getpid(), signal.SIGKILL)
    if spec == f"{rank}:{step}:disk-full":  # the disk fills as this save is written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _rng_state() -> dict:

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
