"""Multi-rank tests as a function call: fork ``world_size`` processes with the torch.distributed
environment set, run a function in each, return their results. A rank that raises fails the
call with the traceback of every rank that raised within ``ERROR_GRACE_S`` of it, in rank order
(the rank that failed first is not always the first to report: its peers fail at once with
"Connection closed by peer" while it still writes its error records); a hang fails it after
``timeout_s`` with every process killed.

Fork (not spawn) because starting Python + torch costs ~5 s per process on 2 cores; torch._dynamo
is imported in the parent so that DDP/FSDP construction does not import it once per child.
"""
from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback

import torch
import torch._dynamo  # noqa: F401  (imported once, before forking)

from suite.common.ports import free_port

ERROR_GRACE_S = 10.0  # after a rank raised, how long its peers get to end and report theirs


def _child(fn, rank, world_size, port, conn, args, kwargs):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)  # a hang's stacks (run_ranks)
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException:  # noqa: BLE001 - every failure goes back to the test
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def run_ranks(fn, world_size: int, *args, timeout_s: float = 180, start: str = "fork", **kwargs) -> list:
    """``start="spawn"``: each rank a fresh interpreter, as ``suite.submit`` starts them, for what
    depends on the process a rank starts from (a forked rank's heap is the test process's)."""
    ctx = mp.get_context(start)
    port = free_port()
    procs, conns = [], []
    for rank in range(world_size):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(fn, rank, world_size, port, child, args, kwargs), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    results: list = [None] * world_size
    errors: dict[int, str] = {}
    pending = set(range(world_size))
    deadline = time.time() + timeout_s
    try:
        while pending:
            if errors and time.time() > deadline:
                break  # the peers of a failed rank that are still running are killed below
            if time.time() > deadline:
                for rank in sorted(pending):  # each hung rank prints its threads' stacks to the test's output
                    if procs[rank].is_alive():
                        os.kill(procs[rank].pid, signal.SIGUSR1)
                time.sleep(1)
                raise AssertionError(f"ranks {sorted(pending)} of {world_size} still running after {timeout_s} s (hang?); "
                                     f"their threads' stacks are in the captured stderr")
            for rank in list(pending):
                if conns[rank].poll(0.05):
                    try:
                        status, value = conns[rank].recv()
                    except EOFError:  # the process ended without a word (SIGKILL)
                        procs[rank].join(5)
                        raise AssertionError(f"rank {rank} died with exit code {procs[rank].exitcode}") from None
                    pending.discard(rank)
                    if status == "error":
                        if not errors:
                            deadline = min(deadline, time.time() + ERROR_GRACE_S)
                        errors[rank] = value
                        continue
                    results[rank] = value
                elif not procs[rank].is_alive() and not conns[rank].poll(0):
                    raise AssertionError(f"rank {rank} died with exit code {procs[rank].exitcode}")
        if errors:
            raise AssertionError("\n".join(f"rank {rank} raised:\n{text}" for rank, text in sorted(errors.items())))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
    return results


def interruptible() -> None:
    """``preexec_fn`` for a command a test interrupts with SIGINT: SIGINT's default handling, as in
    a terminal. A test session started in the background from a script (``cmd &``) has SIGINT
    ignored, which every command it starts inherits: Python then never raises KeyboardInterrupt
    and a Ctrl-C test fails for a reason of the launch, not of the suite."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
