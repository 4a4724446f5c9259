"""Ports for a rendezvous that nothing else can hold: drawn from outside the node's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``). The kernel hands ephemeral ports to outgoing
connections, so a port outside that range is only ever held by another listener. The one
``free_port`` of the suite; ``suite.train.rendezvous`` draws its candidates here too."""
from __future__ import annotations

import random
import socket
import time
from pathlib import Path

from suite.common.errors import SuiteError

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default ip_local_port_range
LOWEST = 20000  # below: ports that well-known services (databases, web servers) listen on
CANDIDATES = 8  # ports rank 0 tries before it gives up


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The node's ephemeral port range (lowest, highest), or Linux's default where unreadable."""
    try:
        low, high = (int(v) for v in path.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def usable_spans(ephemeral: tuple[int, int]) -> list[range]:
    """Ports no outgoing connection can hold: [LOWEST, 65535] outside the ephemeral range (from
    1024 where that leaves none)."""
    low, high = ephemeral
    for lowest in (LOWEST, 1024):
        spans = [s for s in (range(lowest, min(low, 65536)), range(max(high + 1, lowest), 65536)) if len(s)]
        if spans:
            return spans
    raise SuiteError(f"the ephemeral port range {low}-{high} (/proc/sys/net/ipv4/ip_local_port_range) leaves no "
                     f"port for the rendezvous; narrow it, e.g. sysctl net.ipv4.ip_local_port_range='32768 60999'")


def candidate_ports(seed: str, ephemeral: tuple[int, int] | None = None, count: int = CANDIDATES) -> list[int]:
    """The ports rank 0 tries, in order: a start drawn from ``seed`` (the job id: the same on every
    node), then the ports after it, all outside the ephemeral range."""
    spans = usable_spans(ephemeral or ephemeral_range())
    total = sum(len(s) for s in spans)
    start = random.Random(str(seed)).randrange(total)
    out = []
    for i in range(min(count, total)):
        k = (start + i) % total
        for s in spans:
            if k < len(s):
                out.append(s[k])
                break
            k -= len(s)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and outside the ephemeral range (for launchers that hand MASTER_PORT over
    themselves: mpirun's ranks, a warm local pool). Another listener could still take it before
    the ranks do; an outgoing connection cannot."""
    for port in candidate_ports(f"{time.time_ns()}.{random.random()}", count=64):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise SuiteError("no free port outside the ephemeral range after 64 tries; is this machine out of ports?")
