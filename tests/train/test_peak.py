"""The peak FLOP/s MFU divides by (suite.record.peak): measured on CPU, cached per machine, a bad
cache never failing anything; the vendor table on GPU; the recipe's value over both."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from suite.record import flops, peak
from tests.parity import BASE, make_recipe


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "scalesuite" / "peak_flops.json"


@pytest.fixture
def measured(monkeypatch):
    """Stands in for the benchmark: 123 GFLOP/s, and a list of the precisions it was asked for."""
    calls = []

    def fake(precision):
        calls.append(precision)
        return 123e9, 1024, 1.0  # the cores to itself

    monkeypatch.setattr(peak, "measure", fake)
    return calls


def test_the_first_call_measures_and_caches_the_second_reads_the_cache(cache, measured):
    first, second = peak.cpu_peak("fp32"), peak.cpu_peak("fp32")
    assert measured == ["fp32"], "the second call measured again"
    assert (first["cached"], second["cached"]) == (False, True)
    assert second["peak_flops_per_s"] == 123e9 and second["threads"] == torch.get_num_threads()
    key = peak.cache_key("fp32", torch.get_num_threads())
    assert key.startswith(peak.cpu_model()) and torch.__version__ in key
    assert json.loads(cache.read_text())[key]["matrix_side"] == 1024
    peak.cpu_peak("bf16")  # another precision is another entry, beside the first
    assert measured == ["fp32", "bf16"] and len(json.loads(cache.read_text())) == 2


def test_another_thread_count_is_measured_on_its_own(cache, measured):
    threads = torch.get_num_threads()
    peak.cpu_peak("fp32")
    try:
        torch.set_num_threads(threads + 1)
        peak.cpu_peak("fp32")
    finally:
        torch.set_num_threads(threads)
    assert measured == ["fp32", "fp32"]
    assert sorted(e["threads"] for e in json.loads(cache.read_text()).values()) == [threads, threads + 1]


@pytest.mark.parametrize("content", ['{"broken', '[1, 2]', "ENTRY"])
def test_a_corrupt_cache_is_measured_over_and_rewritten(cache, measured, content):
    cache.parent.mkdir(parents=True)
    bad_entry = {peak.cache_key("fp32", torch.get_num_threads()): {"peak_flops_per_s": "fast"}}
    cache.write_text(json.dumps(bad_entry) if content == "ENTRY" else content)
    assert peak.cpu_peak("fp32")["peak_flops_per_s"] == 123e9
    assert peak.cpu_peak("fp32")["cached"] and measured == ["fp32"]


def test_an_unwritable_cache_costs_a_measurement_never_a_failure_nor_a_word(tmp_path, monkeypatch, measured, capfd):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # scalesuite/ cannot be made under a file
    assert peak.cpu_peak("fp32")["peak_flops_per_s"] == 123e9
    assert peak.cpu_peak("fp32")["cached"] is False and measured == ["fp32", "fp32"]
    assert capfd.readouterr() == ("", "")


def test_a_measurement_on_busy_cores_is_redone_by_the_next_call_keeping_the_better(cache, monkeypatch):
    results = [(50e9, 512, 0.5), (40e9, 512, 0.6), (90e9, 2048, 0.97), (1.0, 256, 1.0)]
    monkeypatch.setattr(peak, "measure", lambda precision: results.pop(0))
    assert peak.cpu_peak("fp32")["peak_flops_per_s"] == 50e9  # busy: used, cached, not settled
    second = peak.cpu_peak("fp32")  # busy again and lower: the earlier, higher one stays
    assert (second["peak_flops_per_s"], second["cached"]) == (50e9, False)
    assert peak.cpu_peak("fp32")["peak_flops_per_s"] == 90e9  # had its cores: settled
    assert peak.cpu_peak("fp32") | {"measured_at": 0} == {**json.loads(cache.read_text()).popitem()[1],
                                                          "cached": True, "measured_at": 0}
    assert len(results) == 1, "a settled entry was measured again"


def test_an_always_busy_machine_stops_measuring_after_a_few_tries(cache, monkeypatch):
    results = [(50e9, 512, 0.5), (60e9, 512, 0.5), (55e9, 512, 0.5), (1.0, 256, 0.5)]
    monkeypatch.setattr(peak, "measure", lambda precision: results.pop(0))
    assert [peak.cpu_peak("fp32")["peak_flops_per_s"] for _ in range(5)] == [50e9, 60e9, 60e9, 60e9, 60e9]
    assert len(results) == 1 and peak.MAX_MEASUREMENTS == 3


def test_the_benchmark_is_plausible_short_and_leaves_the_training_rng_alone():
    rng = torch.random.get_rng_state()
    t0 = time.perf_counter()
    rate, side, share = peak.measure("fp32")
    took_s = time.perf_counter() - t0
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert side in peak.SIZES and 0 < share <= 1
    # 0.1 GFLOP/s would be a broken benchmark; 10 TFLOP/s is beyond any CPU core count tests run at.
    assert 1e8 < rate < 1e13, rate
    assert took_s < 3.0, f"measuring took {took_s:.2f} s; it runs once per machine but must stay short"


def _ctx(device: str, world_size: int = 1):
    return SimpleNamespace(device=torch.device(device), world_size=world_size, local_rank=0, rank=0)


def test_gpus_keep_the_vendor_table_and_count_every_device(monkeypatch, measured):
    monkeypatch.setattr(flops, "device_name", lambda device: "NVIDIA A100-SXM4-80GB")
    recipe = make_recipe({"name": "single"}, launch={"devices_per_task": 2}, precision="fp32")
    assert peak.resolve(recipe, _ctx("cuda:0")) == (19.5e12, "vendor table", None)
    assert peak.devices(recipe, _ctx("cuda:0")) == 2
    bf16 = make_recipe({"name": "single"}, training={**BASE["training"], "precision": "bf16"})
    assert peak.resolve(bf16, _ctx("cuda:0"))[:2] == (312e12, "vendor table")
    assert measured == []


def test_on_cpu_a_device_is_a_rank_and_the_recipe_value_wins(cache, measured):
    recipe = make_recipe({"name": "single"}, launch={"devices_per_task": 2}, precision="fp32")
    assert peak.devices(recipe, _ctx("cpu")) == 1, "a layer-wise split in one process shares its threads"
    value, source, entry = peak.resolve(recipe, _ctx("cpu"))
    assert (value, source, entry["precision"]) == (123e9, "measured", "fp32")
    given = make_recipe({"name": "single"}, tracking={"wandb": "disabled", "peak_flops_per_s": 5e9})
    assert peak.resolve(given, _ctx("cpu")) == (5e9, "recipe", None)
    off = make_recipe({"name": "single"}, tracking={"wandb": "disabled", "measure_peak": False})
    assert peak.resolve(off, _ctx("cpu")) == (None, None, None)
    assert measured == ["fp32"]


def test_fsdp_mixed_precision_is_the_precision_measured():
    assert peak.compute_precision(make_recipe({"name": "fsdp", "mixed_precision": "bf16"}, 2, precision="fp32")) == "bf16"
    assert peak.compute_precision(make_recipe({"name": "fsdp"}, 2, precision="fp32")) == "fp32"
