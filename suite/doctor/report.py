"""The check record, how it prints, and the JSON file: torch-free, so the table and the JSON can
be read and tested without starting anything."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

# pass / fail decide the exit code; warn is a finding that breaks nothing on this machine but
# would on another (a loopback interface on a cluster); skip is a check that could not run here
# for a stated reason; info is a measurement with nothing to judge (one rank's bandwidth).
STATUSES = ("pass", "fail", "warn", "skip", "info")


@dataclass
class Check:
    name: str
    status: str
    detail: str = ""  # what was seen, one line
    meaning: str = ""  # for fail and warn: what it means
    fix: str = ""  # for fail and warn: what to do
    data: dict = field(default_factory=dict)  # measurements, for the JSON

    def __post_init__(self):
        assert self.status in STATUSES, self.status


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]


def exit_code(checks: list[Check]) -> int:
    """0 when every check passed (warnings and skips included), 1 when any failed."""
    return 1 if failed(checks) else 0


def check_lines(check: Check) -> list[str]:
    lines = [f"  {check.status.upper():<5} {check.name}" + (f": {check.detail}" if check.detail else "")]
    if check.status in ("fail", "warn"):
        if check.meaning:
            lines.append(f"        means: {check.meaning}")
        if check.fix:
            lines.append(f"        do:    {check.fix}")
    return lines


def say(line: str = "") -> None:
    """Progress goes out as it happens, even when stdout is a pipe (a test, ``| tee``)."""
    print(line, flush=True)


def summary_line(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    shown = ", ".join(f"{n} {'passed' if s == 'pass' else 'failed' if s == 'fail' else s}"
                      for s, n in counts.items() if n)
    verdict = "healthy" if not failed(checks) else "NOT healthy: see the failed checks above"
    return f"{shown}: {verdict}"


def bandwidth_table(points: list[dict]) -> list[str]:
    """nccl-tests' all_reduce_perf columns: size, count (elements), time, algbw, busbw, and
    whether every rank's result was exactly right."""
    lines = [f"      {'size':>10} {'count':>10} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  exact"]
    for p in points:
        lines.append(f"      {human_bytes(p['bytes']):>10} {p['count']:>10} {p['time_s'] * 1e6:>11.1f} "
                     f"{p['algbw_gb_s']:>13.3f} {p['busbw_gb_s']:>13.3f}  {'yes' if p['exact'] else 'NO'}")
    return lines


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def write_json(path: Path, facts: dict, checks: list[Check]) -> None:
    from suite.record.run_record import write_json_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"schema_version": 1, **facts, "checks": [asdict(c) for c in checks],
                             "failed": [c.name for c in failed(checks)], "exit_code": exit_code(checks)})
