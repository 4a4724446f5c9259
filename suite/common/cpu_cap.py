"""Slow ranks on purpose: cap a process's CPU through cgroup v1's ``cpu`` controller.

``launch.rank_cpu: {1: 50%}`` makes rank 1 put its own process into a group of its own under
``/sys/fs/cgroup/cpu/scalesuite/`` whose ``cpu.cfs_quota_us`` is the percentage of the CPUs the
rank is given (its threads) times ``cpu.cfs_period_us`` (set to 10 ms, PERIOD_US): at 50% it runs for
half of each period and is throttled for the rest, so it computes at about half its speed, with its threads
(gloo's included) and any children it starts, which inherit the group. The rank leaves the group
and removes it when it ends; a group left behind by a killed rank is empty and removed by the next
capped rank (``remove_stale``). The same controller caps a whole Slurm node
(``slurm/start.sh --node-cpu n2=50%``: its slurmd and every job step under it).

What it emulates: a slower CPU, on average over periods of 10 ms. Not a slower CPU within a
period (the rank runs at full speed until its quota is spent), and nothing of memory bandwidth
or caches. The period is the kernel's default of 100 ms no longer: a step of a few ms then ran at
full speed or stalled for most of a period, depending on where in the period it fell, and the
stalls could land in the rank's wait for its peers rather than in its compute (a capped rank
then recorded less compute than its uncapped peer). At 10 ms every step
of a few ms is throttled alike. A share too small for 1 ms of quota per 10 ms (the kernel's
least) gets a longer period instead. Needs root and cgroup v1 (the ``cpu`` hierarchy mounted at ``CPU_ROOT``); elsewhere a
one-line error before training.

``quota_of_process`` reads back whatever cap this process is under (its own or its node's), for
the run record.
"""
from __future__ import annotations

import os
from pathlib import Path

from suite.common.errors import SuiteError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
GROUPS = "scalesuite"  # under CPU_ROOT: one group per capped rank process
PERIOD_US = 10_000  # the CFS period of a capped rank's group (module doc)
MIN_QUOTA_US = 1_000  # the kernel refuses a quota below 1 ms


def percent(text: str, key: str) -> float:
    """``"50%"`` -> 50.0, refused in one line naming ``key`` unless it is more than 0 and at most 100."""
    number = text[:-1] if isinstance(text, str) and text.endswith("%") else None
    try:
        value = float(number)
    except (TypeError, ValueError):
        value = None
    if value is None or not 0 < value <= 100:
        raise SuiteError(f"{key}={text!r}: give a share of the rank's CPUs as a percentage above 0 and at most "
                         f"100, e.g. 50%")
    return value


class CpuCap:
    """This process in a capped group of its own; ``release`` moves it back and removes the group."""

    def __init__(self, group: Path):
        self.group = group

    def release(self) -> None:
        try:
            (CPU_ROOT / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
            self.group.parent.rmdir()  # the last capped rank out removes the parent too
        except OSError:
            pass  # a group left here is empty once the process ends; the next capped rank removes it


def cap_this_process(share_percent: float, cpus: float, name: str, key: str) -> CpuCap:
    """Put this process into a new group capped at ``share_percent`` of ``cpus`` CPUs."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        raise SuiteError(f"{key} caps a rank's CPU through cgroup v1's cpu controller, which is not mounted at "
                         f"{CPU_ROOT} on this machine; leave {key} out")
    remove_stale()
    group = CPU_ROOT / GROUPS / f"{name}-{os.getpid()}"
    try:
        group.mkdir(parents=True, exist_ok=True)
        period, quota = period_and_quota(share_percent, cpus)
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        raise SuiteError(f"{key}: cannot cap this rank's CPU in {group} ({e.strerror}); it needs root") from None
    return CpuCap(group)


def period_and_quota(share_percent: float, cpus: float) -> tuple[int, int]:
    """(cfs_period_us, cfs_quota_us) for ``share_percent`` of ``cpus`` CPUs: PERIOD_US, or a
    longer period where the quota would be under the kernel's 1 ms (at most its 1 s)."""
    fraction = cpus * share_percent / 100
    period = min(1_000_000, max(PERIOD_US, int(-(-MIN_QUOTA_US // fraction))))
    return period, max(MIN_QUOTA_US, int(period * fraction))


def remove_stale() -> None:
    """Remove the empty groups capped ranks left behind (rmdir refuses a group with processes)."""
    for group in (CPU_ROOT / GROUPS).glob("*"):
        if not group.is_dir():
            continue
        try:
            group.rmdir()
        except OSError:
            pass


def quota_of_process() -> float | None:
    """The CPUs this process may use at most, by the quota of its cpu group or one above it
    (a rank's own, or a capped Slurm node's); None where none is set or cgroup v1 is absent."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    fields = [line.split(":", 2) for line in lines]  # id:controllers:path
    path = next((f[2] for f in fields if len(f) == 3 and "cpu" in f[1].split(",")), None)
    if path is None:
        return None
    group, least = CPU_ROOT / path.lstrip("/"), None
    while True:
        try:
            quota = int((group / "cpu.cfs_quota_us").read_text())
            period = int((group / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            return least
        if quota > 0:
            least = quota / period if least is None else min(least, quota / period)
        if group == CPU_ROOT:
            return least
        group = group.parent
