"""Start N ranks on this machine, hear from them as they go, and bound every step in time.

The pattern of tests/harness.py's ``run_ranks`` (forked processes with the torch.distributed
environment set, a rendezvous port from ``suite.common.ports.free_port``), plus what a health check
needs: each rank tells the parent what it starts and what it measured (``say``), and a rank that
says nothing for ``silence_s`` is taken as hung in the step it last started. Forked, not spawned:
a spawned rank imports torch again, about 5 s on 2 busy cores; the caller must not have started
CUDA or torch's thread pools before (``suite.doctor.versions.gpus`` probes CUDA in a child).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass

from suite.common.ports import free_port


@dataclass
class RanksFailed(Exception):
    """What stopped the ranks: ``kind`` is "hang" (silent past the limit, or the backend's own
    timeout fired), "error" (a rank raised) or "died" (a rank ended without a word)."""
    kind: str
    rank: int
    step: str  # the step the rank had started last
    message: str
    steps: dict  # every rank's last started step
    traceback: str = ""  # the raising rank's, for the JSON

    def __str__(self):
        return f"rank {self.rank} {self.kind} in {self.step}: {self.message}"


def _child(program, rank, world, port, conn, args):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))

    def say(kind: str, /, **data):  # positional-only: a message may carry a field named kind
        conn.send((kind, data))

    try:
        program(say, *args)
        say("done")
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        last = f"{type(e).__name__}: {e}".strip().splitlines()
        say("error", message=last[0] if last else type(e).__name__, traceback=traceback.format_exc())
    finally:
        conn.close()


def _is_timeout(message: str) -> bool:
    text = message.lower()
    return "timed out" in text or "timeout" in text


def run(program, world: int, args: tuple = (), *, silence_s: float, on_message=None) -> None:
    """Run ``program(say, *args)`` on ``world`` forked ranks until every one returns.

    ``say("step", what=...)`` marks the start of a step (the silence clock restarts with every
    message); any other ``say(kind, **data)`` goes to ``on_message(rank, kind, data)``. Raises
    :class:`RanksFailed` at the first rank that raises, dies or stays silent; every rank is
    killed before returning either way."""
    ctx = mp.get_context("fork")
    port = free_port()
    procs, conns = [], []
    for rank in range(world):
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(program, rank, world, port, child, args), daemon=True)
        p.start()
        child.close()
        procs.append(p)
        conns.append(parent)
    steps = {rank: "start" for rank in range(world)}
    heard = {rank: time.monotonic() for rank in range(world)}
    pending = set(range(world))
    try:
        while pending:
            for rank in sorted(pending):
                if conns[rank].poll(0.02):
                    try:
                        kind, data = conns[rank].recv()
                    except EOFError:  # the process ended without a word (SIGKILL, a segfault, the OOM killer)
                        procs[rank].join(5)
                        raise RanksFailed("died", rank, steps[rank], f"exit code {procs[rank].exitcode}", dict(steps)) from None
                    heard[rank] = time.monotonic()
                    if kind == "step":
                        steps[rank] = data["what"]
                    elif kind == "done":
                        pending.discard(rank)
                    elif kind == "error":
                        raise RanksFailed("hang" if _is_timeout(data["message"]) else "error", rank, steps[rank],
                                          data["message"], dict(steps), data["traceback"])
                    elif on_message:
                        on_message(rank, kind, data)
                elif not procs[rank].is_alive() and not conns[rank].poll(0):
                    raise RanksFailed("died", rank, steps[rank], f"exit code {procs[rank].exitcode}", dict(steps))
                elif time.monotonic() - heard[rank] > silence_s:
                    raise RanksFailed("hang", rank, steps[rank], f"no word for {silence_s:.0f} s", dict(steps))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
