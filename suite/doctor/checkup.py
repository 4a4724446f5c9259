"""Run every check in order, printing each as it is decided; what ``__main__`` calls."""
from __future__ import annotations

import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from suite.doctor import collectives, network, parity, versions
from suite.doctor.report import Check, check_lines, human_bytes, say, summary_line


@dataclass
class CheckupSpec:
    """How much to measure: ``--quick`` is the small end of the full sweep, fewer calls each.
    Its largest message is 4 MiB, not less: a rank descheduled for one 4 ms time slice during a
    1 MiB call on a busy 2-core machine read as a quarter of the real bandwidth."""
    ranks: int = 2
    quick: bool = False
    timeout_s: float = 60.0
    parity_steps: int = 20
    out: Path | None = None  # parity certificates (default: a new temporary folder)

    @property
    def sizes(self) -> list[int]:
        return collectives.sizes(2**10, (4 if self.quick else 64) * 2**20)

    @property
    def warmup(self) -> int:
        return 2 if self.quick else 5

    @property
    def iters(self) -> int:
        return 10 if self.quick else 20


class Checkup:
    def __init__(self):
        self.checks: list[Check] = []
        self.facts: dict = {}

    def emit(self, check: Check) -> None:
        self.checks.append(check)
        for text in check_lines(check):
            say(text)


def run(spec: CheckupSpec) -> Checkup:
    started = time.monotonic()
    up = Checkup()
    cores = len(os.sched_getaffinity(0))
    say(f"scalesuite doctor on {socket.gethostname()}: {spec.ranks} ranks, "
        f"{'quick' if spec.quick else 'full'} sweep {human_bytes(spec.sizes[0])} .. {human_bytes(spec.sizes[-1])}")

    say("software and devices")
    soft = versions.software()
    cpu = versions.cpu()
    gpus = versions.gpus()
    up.facts.update(host=socket.gethostname(), plan={"ranks": spec.ranks, "quick": spec.quick,
                    "timeout_s": spec.timeout_s, "sizes": spec.sizes, "warmup": spec.warmup, "iters": spec.iters},
                    software=soft, cpu=cpu, cuda=gpus)
    up.emit(Check("python", "info", f"{soft['python']} ({soft['python_executable']})"))
    backends = [name for name, key in (("gloo", "gloo"), ("nccl", "nccl_built"), ("mpi", "mpi_backend")) if soft[key]]
    up.emit(Check("torch", "info", f"{soft['torch']}, CUDA build {soft['torch_cuda_build'] or 'none'}, "
                                   f"backends: {', '.join(backends) or 'none'}"))
    up.emit(versions.version_check(soft["libraries"]))
    up.emit(Check("cpu", "info", f"{cpu['cores_usable']} usable core(s) of {cpu['cores_machine']}, {cpu['machine']}, "
                                 f"ATen CPU capability {cpu['aten_capability']}"))
    up.emit(versions.gpu_check(gpus))
    slurm_facts, slurm_check = versions.slurm()
    up.facts["slurm"] = slurm_facts
    up.emit(slurm_check)
    n_gpus = len(gpus.get("gpus") or [])
    net_facts, net_checks = network.network_checks(with_nccl=n_gpus > 0)
    up.facts["network"] = net_facts
    for c in net_checks:
        up.emit(c)

    say("collectives")
    if not soft["gloo"]:
        up.emit(Check("gloo", "fail", "this torch has no gloo backend", meaning="no CPU collectives: no CPU run can start",
                      fix="install the torch wheel the suite pins (pip install -e .)"))
    else:
        up.facts["gloo"] = collectives.check_backend(
            "gloo", spec.ranks, spec.sizes, warmup=spec.warmup, iters=spec.iters, timeout_s=spec.timeout_s,
            emit=up.emit, line=say, cores=cores)
    if n_gpus:
        up.facts["nccl"] = collectives.check_backend(
            "nccl", min(spec.ranks, n_gpus), spec.sizes, warmup=spec.warmup, iters=spec.iters,
            timeout_s=spec.timeout_s, emit=up.emit, line=say, cores=cores)

    say("parity smoke")
    device = "cuda" if n_gpus else "cpu"
    backend = "nccl" if n_gpus else "gloo"
    broken = [c.name for c in up.checks if c.status == "fail" and c.name.startswith(f"{backend} ")]
    if broken:
        # Its runs would fail the same way, each only after the runs' own collective timeout (300 s).
        up.emit(Check("parity", "skip", f"not run: the {backend} collectives failed above ({', '.join(broken)})"))
        return finish(up, started)
    out = spec.out or Path(tempfile.mkdtemp(prefix="scalesuite-doctor-"))
    world = min(spec.ranks, n_gpus) if n_gpus else spec.ranks
    labels = parity.QUICK if spec.quick else tuple(parity.STRATEGIES)
    if spec.quick:
        say(f"  (quick: {', '.join(labels)} only; without --quick also "
            f"{', '.join(k for k in parity.STRATEGIES if k not in labels)})")
    up.facts["parity"] = {"folder": str(out), "strategies": parity.parity_smoke(
        world, spec.parity_steps, out, device, up.emit, say, labels)}

    return finish(up, started)


def finish(up: Checkup, started: float) -> Checkup:
    up.facts["took_s"] = time.monotonic() - started
    say(f"{summary_line(up.checks)} ({up.facts['took_s']:.0f} s)")
    return up
