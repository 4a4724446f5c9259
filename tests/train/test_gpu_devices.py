"""A rank's CUDA device is sampled as the NVML device with its UUID (suite.record.gpu), whatever
CUDA_VISIBLE_DEVICES made of the numbering: checked against a faked NVML of four GPUs and a faked
CUDA runtime that sees two of them, in another order. No GPU is needed (nor nvidia-ml-py)."""
import sys
from types import SimpleNamespace

import pytest
import torch

from suite.record import gpu, utilisation

UUIDS = ["GPU-0000aaaa-0000-0000-0000-000000000000", "GPU-1111bbbb-0000-0000-0000-000000000000",
         "GPU-2222cccc-0000-0000-0000-000000000000", "GPU-3333dddd-0000-0000-0000-000000000000"]


class FakeNVML:
    """NVML of a machine with four GPUs in PCI order, device i at (10 x i) % busy, i GiB used and
    (100 + i) W; ``mig`` devices have no utilisation or power of their own."""

    class NVMLError(Exception):
        pass

    def __init__(self, mig=()):
        self.mig = set(mig)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):  # the physical numbering: what the old probe used
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in UUIDS:
            raise self.NVMLError(f"NVML_ERROR_NOT_FOUND {uuid}")
        return UUIDS.index(uuid)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle in self.mig:
            raise self.NVMLError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(gpu=10 * handle, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=handle * 2 ** 30)

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle in self.mig:
            raise self.NVMLError("NVML_ERROR_NOT_SUPPORTED")
        return (100 + handle) * 1000  # mW


@pytest.fixture
def visible(monkeypatch):
    """CUDA_VISIBLE_DEVICES=3,1 as the CUDA runtime applies it: cuda:0 is physical 3, cuda:1 is 1
    (torch reports the bare UUID, without NVML's ``GPU-``)."""
    seen = [3, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=UUIDS[seen[i]].removeprefix("GPU-")))
    return seen


def test_each_cuda_index_reads_the_nvml_device_it_maps_to(visible):
    nvml = FakeNVML()
    for cuda_index, physical in enumerate(visible):
        reading = gpu.readings(nvml, gpu.nvml_handle(nvml, cuda_index))
        assert reading == {"gpu_util_percent": 10.0 * physical, "gpu_memory_used_bytes": physical * 2 ** 30,
                           "gpu_power_w": 100.0 + physical}


def test_the_probe_samples_the_rank_s_device_not_nvml_s_same_number(visible, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    probe = utilisation.probe_for(torch.device("cuda", 0))
    assert probe.kind == "gpu"
    assert probe.read()["gpu_util_percent"] == 30.0  # physical 3; NVML's index 0 would read 0 %


def test_a_device_nvml_does_not_know_is_said_not_guessed(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="ffffffff-0000"))
    with pytest.raises(gpu.NoDevice, match="cuda:0"):
        gpu.nvml_handle(FakeNVML(), 0)


def test_a_mig_slice_reports_what_it_has(visible):
    nvml = FakeNVML(mig=[3])
    assert gpu.readings(nvml, gpu.nvml_handle(nvml, 0)) == {"gpu_memory_used_bytes": 3 * 2 ** 30}


def test_peak_reserved_is_the_allocator_s_reservation_on_cuda_and_none_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 7 * 2 ** 20)
    assert gpu.peak_reserved_bytes(torch.device("cuda", 0)) == 7 * 2 ** 20
    assert gpu.peak_reserved_bytes(torch.device("cpu")) is None
