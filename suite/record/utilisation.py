"""The suite's own utilisation sampler: one background thread per rank.

Every ``interval_s`` it reads this rank's device: on CPU the process's CPU % (100 = one core
busy; it can exceed 100 with several threads) and resident set size; on GPU, through NVML,
the device's utilisation %, memory used and power (the NVML device CUDA's index maps to). Each reading is logged as a
``utilisation`` record (to ``metrics.jsonl`` and W&B); ``stop()`` returns means and peaks for
the per-rank summary. A reading costs tens of microseconds, once a second by default.
"""
from __future__ import annotations

import threading
import time

import psutil

from suite.record import gpu


class CpuProbe:
    """Process CPU % and RSS, read with psutil."""
    kind = "cpu"

    def __init__(self):
        self._proc = psutil.Process()
        self._proc.cpu_percent(None)  # the first call only starts the interval

    def read(self) -> dict:
        return {"cpu_percent": self._proc.cpu_percent(None), "rss_bytes": self._proc.memory_info().rss}


class GpuProbe:
    """NVML utilisation %, memory used and power of this rank's CUDA device, found by its UUID
    (``suite.record.gpu``: CUDA numbers the devices ``CUDA_VISIBLE_DEVICES`` leaves, NVML all)."""
    kind = "gpu"

    def __init__(self, index: int):
        import pynvml  # optional: nvidia-ml-py, the gpu extra, only on GPU hosts

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = gpu.nvml_handle(pynvml, index)

    def read(self) -> dict:
        return gpu.readings(self._nvml, self._handle)


def probe_for(device) -> CpuProbe | GpuProbe:
    """GPU probe for a CUDA device (falls back to CPU when NVML is missing), else CPU."""
    if getattr(device, "type", "cpu") == "cuda":
        try:
            return GpuProbe(device.index or 0)
        except Exception as e:  # noqa: BLE001 - a missing NVML must not stop training
            print(f"utilisation sampler: NVML unavailable ({e}); sampling the CPU process instead", flush=True)
    return CpuProbe()


class UtilisationSampler:
    """Samples a probe on a daemon thread; ``log`` is a callable taking one record's fields."""

    def __init__(self, probe, interval_s: float, log=None):
        self.probe, self.interval_s, self.log = probe, interval_s, log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="utilisation-sampler", daemon=True)
        self._sums: dict[str, float] = {}
        self._peaks: dict[str, float] = {}
        self.count = 0
        self._t0 = time.time()

    def start(self) -> "UtilisationSampler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> dict:
        reading = self.probe.read()
        for key, value in reading.items():
            self._sums[key] = self._sums.get(key, 0.0) + value
            self._peaks[key] = max(self._peaks.get(key, value), value)
        self.count += 1
        if self.log is not None:
            self.log(t_s=round(time.time() - self._t0, 3), **reading)
        return reading

    def stop(self) -> dict:
        """Stop the thread; means and peaks of every reading (one taken now if none was)."""
        self._stop.set()
        self._thread.join(timeout=max(1.0, 2 * self.interval_s))
        if self.count == 0:
            self.sample()
        out = {"utilisation_samples": self.count, "utilisation_device": self.probe.kind}
        for key, total in self._sums.items():
            out[f"{key}_mean"] = total / self.count
            out[f"{key}_peak"] = self._peaks[key]
        return out
