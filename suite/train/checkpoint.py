"""Save and resume a run: the engine's state, RNG and loop position, so that a resumed run
continues exactly where it stopped.

Layout: ``<run>/checkpoint/step-<N>/`` and ``<run>/checkpoint/latest.json`` naming the last
complete one, with its format, strategy and world size. Two formats:
- ``neutral`` (strategies whose options declare ``no_neutral_checkpoint = ""``): the model and the
  optimizer's per-parameter state by the plain model's names (``Engine.neutral_state``,
  ``suite.strategies.neutral``) in ``model/``: as one torch file per rank where every rank holds
  whole tensors (``suite.train.rank_files``: replicated entries written once), else (DTensors:
  FSDP2, tensor parallel) by torch.distributed.checkpoint (DCP); either is read back into whatever
  shards another strategy or world size holds. Beside it ``rank<R>.pt`` with each rank's loop
  position and RNG. Any neutral strategy at any world size resumes it.
- ``rank`` (the others): ``rank<R>.pt`` holds each rank's whole engine state as well; only the
  same strategy at the same world size resumes it.
The loop position is global (steps of the global batch, batches into the epoch, samples seen):
the data order is the global one whatever the world size (``DistributedSampler`` permutes the
same indices and deals them out), so it carries over. RNG state is per rank: the same strategy
at the same world size takes its own; another takes rank 0's on every rank (the global
generators of a data-parallel run draw alike; what a rank draws apart, e.g. dropout on its own
samples, differs between world sizes anyway).

A new checkpoint is written beside the last good one; only when every rank's file is in place
does rank 0 switch ``latest.json`` (an atomic replace) and then delete older step folders. A
crash at any moment (even SIGKILL mid-write) leaves ``latest.json`` naming a complete checkpoint.
"""
from __future__ import annotations

import errno
import os
import queue
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from suite.common.errors import SuiteError
from suite.record import run_record
from suite.train import rank_files
import signal
import threading
import warnings
from contextlib import contextmanager
import numpy as np


folder = run_record.checkpoint_folder
latest = run_record.latest_checkpoint
MODEL = "model"  # the DCP folder of a neutral checkpoint, inside step-<N>/


def save(run_dir: Path, ctx, engine, loop_state: dict, background: bool = False) -> None:
    """Save a checkpoint at ``loop_state["step"]`` (collective). ``background``: a neutral
    checkpoint's model state is copied aside now (``stage``: each rank's tensors or shards, on
    CUDA into pinned host memory) and written
    by a thread beside training (DCP's ``save`` over a gloo group of its own: its collectives must
    not interleave with training's); ``latest.json`` switches once it is complete.
    At most one is in flight: a save (and ``finish``) first waits for the one before. The loop
    saves in the foreground when the process is about to end (preemption, cancel)."""
    neutral = not engine.no_neutral_checkpoint
    background = background and neutral
    finish(ctx, run_dir, barrier=not background)
    step = loop_state["step"]
    target = folder(run_dir) / f"step-{step}"
    target.mkdir(parents=True, exist_ok=True)
    state = {"loop": dict(loop_state), "rng": _rng_state(), "loss_scaling": engine.scaling_state()}
    staged = None
    try:
        if background:  # copies now (training changes the originals); every file is the thread's
            staged = stage(engine.neutral_state(), ctx.device)
        else:
            if neutral:  # collective: every rank writes its part
                _write_model(engine.neutral_state(), target / MODEL, ctx.rank, run=str(run_dir))
            else:
                state["engine"] = engine.state_dict()
            _write_rank_file(state, target, ctx.rank, step)
    except Exception as e:
        if not _disk_full_error(e):
            raise
        raise SuiteError(_disk_full(run_dir, ctx.rank, step)) from None
    if ctx.world_size > 1:
        # Every rank logged its records up to this step (and, in the foreground, wrote its files)
        # before this barrier: a resumed run keeps metrics.jsonl up to here and drops what the
        # stopped attempt logged after (it is redone). A background save's files are in place on
        # every rank once its thread passes its own group's barrier, before latest.json switches.
        dist.barrier()
    records = Path(run_dir) / "metrics.jsonl"
    entry = {"step": step, "world_size": ctx.world_size, "folder": target.name,
             "format": "neutral" if neutral else "rank", "strategy": engine.strategy,
             "metrics_bytes": records.stat().st_size if records.exists() else 0}
    if staged is not None:
        global _pending
        _pending = _Background(run_dir, ctx, entry, staged, target, state, _background_group())
        return
    _complete(run_dir, ctx, entry)
    if ctx.world_size > 1:
        dist.barrier()  # no rank runs ahead before rank 0 has switched latest.json


def _write_rank_file(state: dict, target: Path, rank: int, step: int) -> None:
    """``rank<R>.pt`` (loop position, RNG, a rank-format engine state), written aside and moved
    into place: a crash at any moment leaves no half file."""
    rank_files.save_aside(state, target / f"rank{rank}.pt", before_replace=lambda: _maybe_die_while_saving(rank, step))


def prepare(ctx, engine) -> None:
    """Before training, for a run that saves every N steps (collective): import DCP (0.4-0.75 s,
    once per process; the neutral state's ``get_state_dict`` needs it) and make the background
    saves' gloo group (a rendezvous of its own), so that neither is paid inside the first save's
    step and measured as training time."""
    if engine.no_neutral_checkpoint:
        return
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    _background_group()
    _writer()


def _complete(run_dir: Path, ctx, entry: dict) -> None:
    """Rank 0: the checkpoint ``entry`` names is complete on every rank: switch latest.json to it
    and delete the older ones."""
    if not ctx.is_main:
        return
    try:  # written aside and replaced: a full disk leaves the old latest.json
        run_record.write_json_atomic(folder(run_dir) / "latest.json", entry)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise SuiteError(_disk_full(run_dir, ctx.rank, entry["step"])) from None
    for old in folder(run_dir).glob("step-*"):  # older only: a rank may already be writing a newer one
        if old.name.removeprefix("step-").isdigit() and int(old.name.removeprefix("step-")) < entry["step"]:
            shutil.rmtree(old, ignore_errors=True)


def _write_model(state: dict, where: Path, rank: int, group=None, run: str | None = None) -> None:
    """The neutral state into ``where`` (collective over ``group``, else the default group): as
    per-rank torch files where every rank's state is whole tensors (``rank_files``), else by
    DCP (a DTensor's chunks, from whatever layout, with their metadata). Returns once every
    rank's part is written."""
    use_files, mine = rank_files.plan(state, group, run)
    if not use_files:
        # no warning to silence with a group given; without one, a single process is meant
        with _one_process_is_fine():
            import torch.distributed.checkpoint as dcp
            dcp.save(state, checkpoint_id=str(where), process_group=group)
        return
    rank_files.write(where, rank, mine)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.barrier(group=group)  # every rank's file is in place


def stage(state: dict, device: torch.device) -> dict:
    """A copy of ``state`` for a background save, taken now. On CUDA in host memory, through DCP's
    stager (pinned buffers, kept and reused by the next save, filled by non-blocking copies and one
    synchronize; a DTensor keeps its sharding): a clone in GPU memory would hold a second model
    there until the write ends. On CPU a clone."""
    if device.type == "cuda":
        return _stager().stage(state)
    return _copy(state)


_cuda_stager = None  # DCP's stager, one per process: its pinned buffers serve every save


def _stager():
    global _cuda_stager
    if _cuda_stager is None:
        from torch.distributed.checkpoint import staging

        if hasattr(staging, "DefaultStager"):
            # synchronous: the copy must be whole before training changes the originals; no shared
            # memory: the writer is a thread of this process
            _cuda_stager = staging.DefaultStager(staging.StagingOptions(
                use_pinned_memory=True, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=True))
        else:  # torch releases before DefaultStager (pyproject allows them): pinned, cached, blocking copies
            _cuda_stager = staging.BlockingAsyncStager(cache_staged_state_dict=True)
    return _cuda_stager


def _copy(state):
    """``state`` with every tensor cloned (a DTensor keeps its sharding: this rank's shard is copied)."""
    if isinstance(state, dict):
        return {k: _copy(v) for k, v in state.items()}
    return state.detach().clone() if torch.is_tensor(state) else state


class _Background:
    """A background save, written by the process's writer thread (``_writer``): this rank's
    ``rank<R>.pt``, then its part of the model (``_write_model``: it returns once every rank has
    written its part, so every rank's files are in place), then the checkpoint completed; an error
    is kept for ``finish`` to raise. The training thread only copies the state, passes one barrier
    and hands the save over. (DCP's own ``async_save`` costs more on the training thread than a
    small model's whole save: 40 ms against 15 ms for benchmarks/base.yaml's cnn, on 2 cores.)"""

    def __init__(self, run_dir: Path, ctx, entry: dict, staged: dict, target: Path, rank_state: dict, group):
        self.run_dir, self.ctx, self.entry, self.error = run_dir, ctx, entry, None
        self.staged, self.target, self.rank_state, self.group = staged, target, rank_state, group
        self.done = threading.Event()
        _writer().put(self)

    def run(self) -> None:
        try:
            _write_rank_file(self.rank_state, self.target, self.ctx.rank, self.entry["step"])
            _write_model(self.staged, self.target / MODEL, self.ctx.rank, self.group, run=str(self.run_dir))
            self.staged = None  # the copy is not kept past its write
            _complete(self.run_dir, self.ctx, self.entry)
        except BaseException as e:  # noqa: BLE001 - raised again by finish, on the training thread
            self.error = e
        finally:
            self.done.set()

    def join(self, timeout: float | None = None) -> None:
        self.done.wait(timeout)


_queue: tuple[int, queue.Queue] | None = None  # (the process it serves, the queue)


def _writer() -> queue.Queue:
    """The queue of the process's one writer thread (started on first use, or by ``prepare``
    before training): starting a thread for every save cost the training thread 0.7-1.9 ms. A
    daemon: a failing run does not wait for it at exit. A forked child (a warm rank) starts its
    own: threads do not survive a fork."""
    global _queue
    if _queue is None or _queue[0] != os.getpid():
        _queue = (os.getpid(), queue.Queue())

        def serve(jobs: queue.Queue) -> None:
            while True:
                jobs.get().run()

        threading.Thread(target=serve, args=(_queue[1],), name="scalesuite-checkpoint", daemon=True).start()
    return _queue[1]


_pending: _Background | None = None
_group = (None, None)  # (the default process group it belongs to, the background saves' gloo group)


def finish(ctx, run_dir: Path | None = None, barrier: bool = True) -> None:
    """Wait for the background save in flight, if any (collective: ``save`` and the loop's end call
    it on every rank); a full disk there is the one-line SuiteError a foreground save gives. With ``run_dir``, one of
    another run (a failed run's, in a process that trains the next point of a sweep) is dropped.
    ``barrier=False`` (before the next background save): each rank waits for its own thread only;
    the threads' own group keeps the saves in order."""
    global _pending
    pending, _pending = _pending, None
    if pending is None or (run_dir is not None and Path(pending.run_dir) != Path(run_dir)):
        return
    pending.join()
    if barrier and ctx.world_size > 1:
        dist.barrier()  # every rank saved it: from here on every rank reads rank 0's latest.json
    if pending.error is None:
        return
    if isinstance(pending.error, SuiteError) or not _disk_full_error(pending.error):
        raise pending.error
    raise SuiteError(_disk_full(pending.run_dir, ctx.rank, pending.entry["step"])) from None


def settle(run_dir: Path, timeout_s: float = 30.0) -> None:
    """The run is failing: give a background save in flight up to ``timeout_s`` to complete, so
    that a checkpoint every rank has staged still becomes the last good one (its peers' writes go
    on in their own threads while they wait); its error, if any, is not the run's."""
    global _pending
    pending, _pending = _pending, None
    if pending is not None and Path(pending.run_dir) == Path(run_dir):
        pending.join(timeout_s)


def _background_group():
    """A gloo group for the background saves' own collectives, apart from training's (two threads
    must not share one group's order of collectives); made once per process group (collective)."""
    global _group
    world = dist.group.WORLD
    if _group[0] is not world:
        _group = (world, dist.new_group(backend="gloo"))
    return _group[1]


def _disk_full_error(e: BaseException) -> bool:
    """Whether ``e`` is a full disk or quota: an OSError, or DCP's CheckpointException carrying
    one from any rank (its ``failures``), or either as the cause of another."""
    seen = set()
    todo = [e]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        failures = getattr(e, "failures", None)
        todo += [e.__cause__, e.__context__, *(failures.values() if isinstance(failures, dict) else ())]
    return False


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
    saved_by = meta.get("strategy") or engine.strategy  # checkpoints from before strategies were recorded
    same = meta["world_size"] == ctx.world_size and saved_by == engine.strategy
    where = folder(run_dir) / meta["folder"]
    if meta.get("format", "rank") == "rank":
        if not same:
            raise SuiteError(f"the checkpoint in {where} was saved by strategy {saved_by} at world size "
                             f"{meta['world_size']} in its per-rank format; this run is strategy {engine.strategy} at "
                             f"world size {ctx.world_size}: resume it with the run's own strategy and launch settings")
        state = torch.load(where / f"rank{ctx.rank}.pt", map_location=ctx.device, weights_only=False)
        engine.load_state_dict(state["engine"])
    else:
        if engine.no_neutral_checkpoint:
            raise SuiteError(f"strategy {engine.strategy} cannot resume the checkpoint in {where} (saved by strategy "
                             f"{saved_by}): {engine.no_neutral_checkpoint}; resume with a strategy that can")
        # Another strategy or world size: every rank takes rank 0's loop position and RNG (see above).
        state = torch.load(where / f"rank{ctx.rank if same else 0}.pt", map_location=ctx.device, weights_only=False)
        template = engine.neutral_state()  # this engine's own shards, by the plain model's names
        if rank_files.present(where / MODEL):  # whole tensors, one file per rank
            rank_files.fill(template, rank_files.read(where / MODEL))
        else:
            with _one_process_is_fine():  # filled from whatever shards were saved
                import torch.distributed.checkpoint as dcp
                dcp.load(template, checkpoint_id=str(where / MODEL))
        engine.load_neutral_state(template)
    _set_rng_state(state["rng"])
    engine.load_scaling_state(state.get("loss_scaling") or {})  # fp16's scale goes on where it was
    return state["loop"]


def saved_model(run_dir: Path) -> dict:
    """The model's state in the last complete checkpoint, whole and on CPU, by the plain model's
    names (neutral format) or as rank 0's engine held it (per-rank format); {} if none. Read in
    this process alone (no process group): for tests and tools, not for resuming."""
    meta = latest(run_dir)
    if meta is None:
        return {}
    where = folder(run_dir) / meta["folder"]
    if meta.get("format", "rank") == "rank":
        return torch.load(where / "rank0.pt", map_location="cpu", weights_only=False)["engine"]["model"]
    if rank_files.present(where / MODEL):
        return {key.removeprefix("model."): value.clone() for key, value in rank_files.read(where / MODEL).items()
                if key.startswith("model.")}
    import torch.distributed.checkpoint as dcp
    saved = dcp.FileSystemReader(str(where / MODEL)).read_metadata().state_dict_metadata
    model = {key.removeprefix("model."): torch.empty(tuple(m.size), dtype=m.properties.dtype)
             for key, m in saved.items() if key.startswith("model.")}
    with _one_process_is_fine():
        dcp.load({"model": model}, checkpoint_id=str(where / MODEL), no_dist=True)
    return model


@contextmanager
def _one_process_is_fine():
    """DCP warns whenever it runs without a process group (a single-process run, a tool): that
    is meant here, and the warning would only worry a user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


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
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's device (current): a resume may see other GPUs
    return state


def _set_rng_state(state: dict) -> None:

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # onto this rank's device, whichever number it has now
