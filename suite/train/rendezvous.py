"""The rendezvous: where rank 0's TCPStore listens and how the other ranks find it, without a
port that anything else can hold and without a wait that has no end.

Ports: candidates come from a fixed sequence seeded by the job's id, drawn from the ports at or
above ``LOWEST`` that lie outside the node's ephemeral range (``/proc/sys/net/ipv4/
ip_local_port_range``, ``EPHEMERAL_DEFAULT`` where it cannot be read). The kernel hands out
ephemeral ports to outgoing connections, so a port outside that range is never held by one; only
another listener can hold it, and then rank 0 tries the next candidate.

Agreement: rank 0 binds the first free candidate and writes ``{"port": ...}`` to the run folder
(``<run>/rendezvous/<job>.<attempt>.json``, which every rank can read: the run folder is shared,
as checkpoints need). The other ranks wait for that file and connect to that port only. They never
connect to a guessed port: a TCPStore client that reaches a stranger's listening socket waits for
an answer with no timeout of its own (measured with torch 2.14), which is how a rank waited
8 minutes for a rank 0 that had failed with EADDRINUSE. Every wait here ends after
``timeout_s`` with a one-line error naming the rank, the host and the port.
"""
from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

from suite.common import ports
from suite.common.errors import SuiteError

CANDIDATES = ports.CANDIDATES  # ports rank 0 tries before it gives up
TIMEOUT_S = 120  # longest wait for the other side of the rendezvous (capped by launch.collective_timeout_s)


def announcement(run_dir: str | Path, job_id: str, attempt: int) -> Path:
    """The file rank 0 writes its port to, one per job and attempt (a requeued job draws again)."""
    return Path(run_dir) / "rendezvous" / f"{job_id}.{attempt}.json"


def serve(path: Path, host: str, world: int, timeout_s: float, ephemeral=None):
    """Rank 0: listen on the first free candidate port, announce it; (store, port)."""
    import torch.distributed as dist

    choices, taken = ports.candidate_ports(path.stem.rsplit(".", 1)[0], ephemeral), []
    for port in choices:
        try:
            store = dist.TCPStore(host, port, world, is_master=True, timeout=timedelta(seconds=timeout_s),
                                  wait_for_workers=False)
        except RuntimeError as e:  # DistNetworkError: EADDRINUSE and the like
            if "in use" not in str(e).lower():
                raise
            taken.append(port)
            continue
        if taken:
            print(f"rendezvous: port(s) {', '.join(map(str, taken))} of {host} taken; listening on {port}", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"host": host, "port": port}))
        tmp.replace(path)
        return store, port
    raise SuiteError(f"rank 0 found every rendezvous port taken on {host} ({', '.join(map(str, taken))}; "
                     f"something else listens there); free one (ss -ltnp) or resubmit: a new job id draws new ports")


def join(path: Path, rank: int, host: str, world: int, timeout_s: float):
    """Any other rank: wait for rank 0's announcement, connect to that port; (store, port)."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SuiteError(f"rank {rank} waited {timeout_s:.0f} s for rank 0 to announce its rendezvous port "
                             f"({path}); rank 0 did not start or failed first: see its log")
        time.sleep(0.2)
    port = json.loads(path.read_text())["port"]
    left = max(1.0, deadline - time.monotonic())
    try:
        store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=left))
    except RuntimeError:
        raise SuiteError(f"rank {rank} could not reach rank 0's rendezvous at {host}:{port} within {timeout_s:.0f} s; "
                         f"rank 0 failed or its node is unreachable from this one: see rank 0's log") from None
    return store, port
