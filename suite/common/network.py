"""The network interface a rank talks on: the one its route to the rendezvous (master) address
leaves by (``ip route get``), or the one ``launch.interface`` names. Torch-free; used by
``suite.train.dist.init``, which exports it as GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME.

Without it gloo binds to the address the host name resolves to, which in a container or a network
namespace is often loopback: ranks on two nodes then cannot connect to each other.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess

from suite.common.errors import SuiteError


def node_name() -> str:
    """This node's name: Slurm's where a job runs on it (``SLURMD_NODENAME``: what ``--exclude``
    takes; the nodes of an emulated cluster share one host name, and a cluster's host names may
    differ from Slurm's), else the host name. Calibrations are kept and found by it."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def interfaces() -> list[str]:
    """This machine's (network namespace's) interface names."""
    return sorted(name for _, name in socket.if_nameindex())


def _ip(*args: str) -> str | None:
    """``ip``'s output, or None where it failed."""
    try:
        out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def interface_addresses() -> dict[str, list[str]]:
    """{interface: its IPv4/IPv6 addresses} (``ip -o addr show``)."""
    out = {}
    for line in (_ip("-o", "addr", "show") or "").splitlines():
        m = re.match(r"\d+:\s+(\S+)\s+inet6?\s+([^/\s]+)", line)
        if m:
            out.setdefault(m.group(1).split("@")[0], []).append(m.group(2))
    return out


def parse_route(text: str) -> dict:
    """``ip route get`` output -> {"dev", "src", "local"}: the interface the route leaves by, the
    source address on it, and whether the destination is an address of this machine."""
    words = text.split()
    field = {k: words[i + 1] for i, k in enumerate(words[:-1]) if k in ("dev", "src")}
    return {"dev": field.get("dev"), "src": field.get("src"), "local": bool(words) and words[0] == "local"}


def resolve_address(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except (socket.gaierror, IndexError) as e:
        raise SuiteError(f"the rendezvous address {host} does not resolve ({e})") from None


def choose_interface(master: str, wanted: str | None = None) -> dict:
    """{"interface", "address", "master", "why"}: the interface this rank reaches ``master`` by
    and its address on it. ``wanted`` (launch.interface) must exist and reach the master: a
    one-line SuiteError otherwise. The master's own node picks the interface that holds the
    master's address (not loopback, which the route to a local address names)."""
    names = interfaces()
    if wanted is not None and wanted not in names:
        raise SuiteError(f"launch.interface {wanted!r} does not exist on {socket.gethostname()}; "
                         f"its interfaces: {', '.join(names)}")
    address = resolve_address(master)
    if shutil.which("ip") is None:
        if wanted is None:
            return {"interface": None, "address": None, "master": address, "why": "no `ip` command to ask the route"}
        return {"interface": wanted, "address": None, "master": address, "why": "launch.interface (unchecked: no `ip`)"}
    holders = [n for n, addrs in interface_addresses().items() if address in addrs]
    if holders and not ipaddress.ip_address(address).is_loopback and "lo" in holders and len(holders) > 1:
        holders.remove("lo")
    if holders:  # the master is this node
        own = wanted if wanted in holders else holders[0]
        if wanted is not None and wanted != own and _route(address, wanted) is None:
            raise SuiteError(f"launch.interface {wanted!r} cannot reach the rendezvous address {master} ({address}), "
                             f"an address of {', '.join(holders)} here")
        return {"interface": wanted or own, "address": address, "master": address,
                "why": "launch.interface" if wanted else f"the rendezvous address is on {own}"}
    route = _route(address, wanted)
    if route is None or route["dev"] is None:
        where = f" through launch.interface {wanted!r}" if wanted else ""
        raise SuiteError(f"no route to the rendezvous address {master} ({address}){where}; "
                         f"interfaces here: {', '.join(names)}")
    if wanted is not None and (route["dev"] != wanted or wanted == "lo"):  # `oif lo` "routes" anywhere
        raise SuiteError(f"launch.interface {wanted!r} cannot reach the rendezvous address {master} ({address}): "
                         f"the route to it leaves by {route['dev']}")
    return {"interface": route["dev"], "address": route["src"], "master": address,
            "why": "launch.interface" if wanted else f"the route to {address}"}


def _route(address: str, interface: str | None) -> dict | None:
    out = _ip("route", "get", address, *(("oif", interface) if interface else ()))
    return parse_route(out) if out is not None else None
