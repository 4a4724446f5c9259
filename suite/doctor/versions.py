"""What software and devices this machine has: versions against the suite's pins, CPU cores and
ATen's CPU capability, each GPU's name and memory, and the Slurm that ``sinfo`` sees."""
from __future__ import annotations

import multiprocessing as mp
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata

from suite.doctor.report import Check

# The libraries a study leans on, each with a tested version (suite.compat.TESTED, constraints.txt).
LIBRARIES = ("torch", "torchvision", "deepspeed", "fairscale", "submitit", "wandb")
PROBE_TIMEOUT_S = 60  # a CUDA driver that hangs on first use must not hang the doctor


def installed(lib: str) -> str | None:
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return None


def version_check(have: dict[str, str | None]) -> Check:
    """Every library of LIBRARIES installed at its tested version (a local build tag such as
    +cu130 aside); another version is a warning naming it and what is then untested
    (pyproject.toml allows ranges, so that a cluster's own torch stays), a missing one fails."""
    from suite.compat import untested

    off = untested({lib: have.get(lib) for lib in LIBRARIES})
    if not off:
        return Check("versions", "pass", ", ".join(f"{lib} {have[lib]}" for lib in LIBRARIES))
    missing = any(have.get(lib) is None for lib in LIBRARIES)
    return Check("versions", "fail" if missing else "warn", "; ".join(off),
                 meaning="the suite reads internals of these libraries checked on the tested versions "
                         "(suite/compat/, docs/compat.md); with others those reads, and the tests named, are "
                         "unchecked: a run may fail with a CompatError or measure wrongly",
                 fix="pip install -c constraints.txt -e . (the tested set) where you may replace them; "
                     "else run suite.verify on the strategies you use")


def software() -> dict:
    import torch
    import torch.distributed as dist

    return {"python": platform.python_version(), "python_executable": os.path.realpath(sys.executable),
            "torch": torch.__version__, "torch_cuda_build": torch.version.cuda,
            "gloo": dist.is_available() and dist.is_gloo_available(),
            "nccl_built": dist.is_available() and dist.is_nccl_available(),
            "mpi_backend": dist.is_available() and dist.is_mpi_available(),
            "libraries": {lib: installed(lib) for lib in LIBRARIES}}


def cpu() -> dict:
    import torch

    return {"cores_usable": len(os.sched_getaffinity(0)), "cores_machine": os.cpu_count(),
            "aten_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine(),
            "torch_threads": torch.get_num_threads()}


def _probe_gpus(conn) -> None:
    try:
        import torch

        gpus = [{"index": i, "name": torch.cuda.get_device_properties(i).name,
                 "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
                for i in range(torch.cuda.device_count())]
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpus else None
        conn.send({"gpus": gpus, "nccl": nccl})
    except BaseException as e:  # noqa: BLE001 - a broken driver is a finding, told to the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def gpus() -> dict:
    """{"gpus": [...], "nccl": version} probed in a forked child: CUDA must not start in this
    process, whose ranks are forked later (a process that started CUDA cannot fork children that
    use it), and a driver that hangs must not hang the doctor."""
    import torch

    if not torch.backends.cuda.is_built():
        return {"gpus": [], "nccl": None, "note": "torch built without CUDA"}
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_probe_gpus, args=(child,), daemon=True)
    p.start()
    child.close()
    try:
        if not parent.poll(PROBE_TIMEOUT_S):
            return {"gpus": [], "nccl": None, "error": f"CUDA did not answer within {PROBE_TIMEOUT_S} s"}
        try:
            return parent.recv()
        except EOFError:
            return {"gpus": [], "nccl": None, "error": "the CUDA probe died without a word (driver crash?)"}
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)


def gpu_check(found: dict) -> Check:
    if found.get("error"):
        return Check("cuda", "fail", found["error"],
                     meaning="torch cannot use the GPUs: a driver that does not match the CUDA build, or a GPU in a bad state",
                     fix="check nvidia-smi; install a driver that supports this torch's CUDA build")
    if not found["gpus"]:
        return Check("cuda", "info", found.get("note") or "no CUDA GPU visible: the checks run on CPU with gloo")
    return Check("cuda", "pass", "; ".join(f"cuda:{g['index']} {g['name']} {g['memory_bytes'] / 2**30:.1f} GiB"
                                            for g in found["gpus"]) + f"; NCCL {found['nccl']}")


def slurm() -> tuple[dict, Check]:
    """Partitions as ``sinfo`` reports them (name, availability, nodes, state, CPUs, memory, GRES)."""
    if shutil.which("sinfo") is None:
        return {"sinfo": None}, Check("slurm", "info", "no sinfo on PATH: no Slurm here (local runs only)")
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P|%a|%D|%T|%c|%m|%G|%N"], capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        proc = None
    if proc is None or proc.returncode != 0:
        why = "sinfo did not answer in 20 s" if proc is None else (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"sinfo": shutil.which("sinfo"), "error": why}, Check(
            "slurm", "warn", why, meaning="sinfo is installed but cannot reach the Slurm controller; "
            "launch.executor=slurm would fail", fix="check the controller: scontrol ping; systemctl status slurmctld")
    try:
        version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
    except subprocess.TimeoutExpired:
        version = ""
    keys = ("partition", "available", "nodes", "state", "cpus", "memory_mb", "gres", "nodelist")
    parts = [dict(zip(keys, line.split("|"))) for line in proc.stdout.splitlines() if line.strip()]
    detail = "; ".join(f"{p['partition']} {p['available']} {p['nodes']} node(s) {p['state']} "
                       f"{p['cpus']} CPUs {p['memory_mb']} MB" + (f" {p['gres']}" if p["gres"] != "(null)" else "")
                       for p in parts)
    facts = {"version": version, "partitions": parts}
    detail = f"{version or 'sinfo'}: {detail or 'no partitions'}"
    bad = [p for p in parts if re.match(r"(down|drain|fail|unk)", p["state"]) or p["available"] != "up"]
    if bad:
        return facts, Check(
            "slurm", "warn", detail, meaning="some partitions or nodes are down or draining; jobs sent there wait",
            fix="sinfo -R names the reason; scontrol update nodename=... state=resume once fixed")
    return facts, Check("slurm", "pass", detail)
