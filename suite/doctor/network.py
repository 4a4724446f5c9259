"""The network interface gloo and NCCL would use, found by their own rules (read from their
sources; neither backend can be asked before a process group exists):

- gloo: the interfaces in GLOO_SOCKET_IFNAME (comma-separated) when set; otherwise the address
  this host's name resolves to, if it is an address of this machine, else the loopback address.
- NCCL (socket bootstrap and its socket transport): NCCL_SOCKET_IFNAME when set; otherwise an
  ``ib*`` interface first, then any that is neither ``docker*`` nor ``lo``, then ``docker*``,
  then ``lo``.

A loopback choice works for ranks on this machine and fails for ranks on two.
"""
from __future__ import annotations

import ipaddress
import os
import socket

from suite.doctor.report import Check


def _addresses() -> dict[str, list[str]]:
    """{interface: [IPv4/IPv6 addresses]} of this machine's interfaces that are up."""
    import psutil

    stats = psutil.net_if_stats()
    out = {}
    for name, addrs in psutil.net_if_addrs().items():
        if stats.get(name) and not stats[name].isup:
            continue
        found = [a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
        if found:
            out[name] = found
    return out


def link_speed_mbit(interface: str) -> int | None:
    """The link rate the kernel reports (Mbit/s); None when it does not (loopback, many VMs)."""
    import psutil

    s = psutil.net_if_stats().get(interface)
    return s.speed if s and s.speed else None


def gloo_choice(env=os.environ, hostname: str | None = None, addresses: dict | None = None) -> dict:
    addresses = _addresses() if addresses is None else addresses
    if env.get("GLOO_SOCKET_IFNAME"):
        names = [n.strip() for n in env["GLOO_SOCKET_IFNAME"].split(",") if n.strip()]
        missing = [n for n in names if n not in addresses]
        return {"interfaces": names, "why": "GLOO_SOCKET_IFNAME", "missing": missing, "loopback": False}
    hostname = hostname or socket.gethostname()
    try:
        resolved = sorted({info[4][0] for info in socket.getaddrinfo(hostname, None)})
    except socket.gaierror:
        resolved = []
    for address in resolved:
        for name, addrs in addresses.items():
            if address in addrs:
                return {"interfaces": [name], "address": address, "loopback": ipaddress.ip_address(address).is_loopback,
                        "why": f"the host name {hostname} resolves to {address}", "missing": []}
    return {"interfaces": ["lo"], "address": "127.0.0.1", "loopback": True, "missing": [],
            "why": f"the host name {hostname} does not resolve to an address of this machine"}


def nccl_choice(env=os.environ, addresses: dict | None = None) -> dict:
    addresses = _addresses() if addresses is None else addresses
    if env.get("NCCL_SOCKET_IFNAME"):
        return {"interfaces": [env["NCCL_SOCKET_IFNAME"]], "why": "NCCL_SOCKET_IFNAME", "loopback": False}
    names = sorted(addresses)
    for pick in ([n for n in names if n.startswith("ib")],
                 [n for n in names if not n.startswith(("docker", "lo"))],
                 [n for n in names if n.startswith("docker")],
                 [n for n in names if n.startswith("lo")]):
        if pick:
            return {"interfaces": [pick[0]], "why": "NCCL's default order (ib*, others, docker*, lo)",
                    "loopback": pick[0].startswith("lo")}
    return {"interfaces": [], "why": "no interface is up", "loopback": True}


def network_checks(with_nccl: bool) -> tuple[dict, list[Check]]:
    gloo = gloo_choice()
    facts = {"gloo": gloo}
    checks = []
    speeds = {n: link_speed_mbit(n) for n in gloo["interfaces"]}
    gloo["link_mbit_s"] = speeds
    shown = ", ".join(f"{n}" + (f" ({speeds[n]} Mbit/s link)" if speeds.get(n) else "") for n in gloo["interfaces"])
    if gloo["missing"]:
        checks.append(Check("gloo interface", "fail", f"GLOO_SOCKET_IFNAME names {', '.join(gloo['missing'])}, "
                            f"which this machine does not have (up)",
                            meaning="gloo cannot create its device: every gloo process group fails to start",
                            fix=f"set GLOO_SOCKET_IFNAME to one of: {', '.join(sorted(_addresses()))}"))
    elif gloo["loopback"]:
        checks.append(Check("gloo interface", "warn", f"{shown}: {gloo['why']}",
                            meaning="fine for ranks on this machine; ranks on other nodes could not connect to it",
                            fix="for multi-node runs set GLOO_SOCKET_IFNAME to the interface between the nodes "
                                "(or map the host name to that address in /etc/hosts)"))
    else:
        checks.append(Check("gloo interface", "pass", f"{shown}: {gloo['why']}"))
    if with_nccl:
        nccl = nccl_choice()
        facts["nccl"] = nccl
        status = "warn" if nccl["loopback"] else "pass"
        checks.append(Check("nccl interface", status, f"{', '.join(nccl['interfaces']) or 'none'}: {nccl['why']}",
                            meaning="NCCL would bootstrap over loopback: ranks on other nodes could not join" if nccl["loopback"] else "",
                            fix="set NCCL_SOCKET_IFNAME to the interface between the nodes" if nccl["loopback"] else ""))
    return facts, checks
