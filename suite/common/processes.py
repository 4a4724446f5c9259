"""The one "is this process alive" check of the suite (the follower, the warm pool, a rank's
watcher, the status of a run)."""
from __future__ import annotations

import psutil


def alive(pid: int, started_at: float | None = None) -> bool:
    """Whether process ``pid`` is running. One that has exited but is not reaped yet (a zombie:
    a killed process stays one until its parent waits for it) counts as gone. Given
    ``started_at`` (a time.time() the process recorded once running), a process with that pid
    created later than a second after it is a later one that reuses the pid: gone too."""
    try:
        process = psutil.Process(pid)
        return (process.status() != psutil.STATUS_ZOMBIE
                and (started_at is None or process.create_time() <= started_at + 1))
    except psutil.NoSuchProcess:
        return False
