"""What state a run is in, from its run record and, for a run that says it is running, from its
processes (local) or its Slurm job: running, completed, failed, cancelled, preempted or lost
(the record says running but nothing runs it any more: killed without a word).
Torch-free: used by ``python -m suite.status``, ``suite.submit --resume`` and the analysis report."""
from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from suite.common import processes
from suite.record import run_record

_SLURM_ALIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


def state(run_dir) -> dict:
    """{"state", "detail", "step", "job_id", "attempts", "restarts"} of one run folder (attempts:
    how many times its ranks started, or were submitted again; restarts: how many of those were
    automatic restarts, ``launch.max_restarts``)."""
    run_dir = Path(run_dir)
    summary = run_record.read_json(run_record.summary_path(run_dir)) if run_record.summary_path(run_dir).exists() else {}
    status = summary.get("status")
    job = run_record.read_job(run_dir)
    job_id, executor = job.get("job_id"), job.get("executor")
    step = _last_step(run_dir)
    attempts = summary.get("attempts") if isinstance(summary.get("attempts"), list) else []
    out = {"state": status or "lost", "detail": summary.get("error") or "", "step": step, "job_id": job_id,
           "attempts": len(attempts), "restarts": sum(1 for a in attempts if isinstance(a, dict) and a.get("restart"))}
    if status in ("completed", "failed", "cancelled"):
        return out
    slurm = squeue(job_id, "%T") if executor == "slurm" and job_id else None
    if slurm in _SLURM_ALIVE:
        out.update(state="running" if status != "preempted" else "preempted",
                   detail=f"Slurm job {job_id} is {slurm}" + (" (requeued)" if status == "preempted" else ""))
        return out
    if status == "preempted" and executor != "slurm":
        out["detail"] = "stopped by a preemption signal; continue it with suite.submit --resume"
        return out
    alive = _live_ranks(run_dir)
    if alive:
        out.update(state="running", detail=f"ranks {alive} running on {socket.gethostname()}")
        return out
    if status in (None, "running", "preempted"):
        why = (f"Slurm job {job_id} is {slurm or 'gone'}" if executor == "slurm" and job_id
               else "no rank process of it is alive")
        out.update(state="lost", detail=f"the record says {status or 'nothing'}, but {why}; continue it with "
                                        f"python -m suite.submit --resume {run_dir}")
    return out


def _live_ranks(run_dir: Path) -> list[int]:
    here = socket.gethostname()
    alive = []
    for proc in run_record.rank_processes(run_dir):
        if proc.get("host") == here and processes.alive(proc["pid"], started_at=proc["started_at"]):
            alive.append(proc["rank"])  # the same process, not a later one with its pid
    return alive


def squeue(job_id: str, field: str) -> str | None:
    """One squeue field of a job (e.g. ``%T`` its state, ``%r`` why it pends), or None when
    Slurm does not list it (ended, unknown) or cannot be asked."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", field], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.strip().splitlines()
    return lines[0].strip() if proc.returncode == 0 and lines else None


def _last_step(run_dir: Path) -> int | None:
    steps = [r["step"] for r in run_record.read_metrics(run_dir, kind="step", rank=0)]
    return max(steps) + 1 if steps else None
