"""Tracking: the utilisation sampler, throughput, FLOPs and MFU (against the measured CPU peak:
tests/train/test_peak.py), W&B's mode and its fallback to offline (the job's W&B run itself:
tests/train/test_wandb.py)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from analysis import wandb_runs
from suite.models import flops as model_flops
from suite.record import console, flops, metrics, peak, run_record, wandb_export
from suite.train import rank as train_rank
from suite.record.utilisation import CpuProbe, UtilisationSampler
from suite.record.run_record import read_json, read_metrics
from tests.harness import run_ranks
from tests.parity import make_recipe, step_losses

MLP_B32_FLOPS = 2 * 32 * (64 * 32 + 32 * 32 + 32 * 10) * 3 - 2 * 32 * 64 * 32  # no grad for the input


def _records(run_dir, kind, rank):
    return [{k: v for k, v in r.items() if k not in ("kind", "rank")} for r in read_metrics(run_dir, kind, rank)]


def _count_measurements(monkeypatch, calls_file: Path) -> None:
    """Every CPU peak benchmark (in any forked rank) appends its process id to ``calls_file``."""
    real = peak.measure

    def counted(precision):
        with open(calls_file, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(precision)

    monkeypatch.setattr(peak, "measure", counted)


def _measurements(calls_file: Path) -> int:
    return len(calls_file.read_text().split()) if calls_file.exists() else 0


@pytest.mark.slow
def test_two_ranks_record_utilisation_throughput_and_mfu(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a cold peak cache: this run measures
    _count_measurements(monkeypatch, tmp_path / "measured.txt")
    recipe = make_recipe({"name": "ddp"}, 2, tracking={"wandb": "disabled", "sample_interval_s": 0.2}, precision="fp32")
    run_dir = train_rank.new_run_dir(recipe, tmp_path / "runs")
    step_losses(recipe, run_dir)

    summary = read_json(run_dir / "summary.json")
    for r in summary["ranks"]:
        assert r["wandb_mode"] == "disabled" and r["utilisation_device"] == "cpu"
        assert r["utilisation_samples"] >= 1 and r["cpu_percent_peak"] >= r["cpu_percent_mean"] >= 0
        assert r["rss_bytes_peak"] >= r["rss_bytes_mean"] > 0
        # per rank: the samples of its half of the data over its own training time
        assert r["samples_per_s"] == pytest.approx(summary["samples"] / 2 / r["train_time_s"])
    assert summary["samples_per_s"] == pytest.approx(summary["samples"] / summary["train_time_s"])
    assert summary["flops_per_step"] == MLP_B32_FLOPS
    assert summary["achieved_flops_per_s"] == pytest.approx(MLP_B32_FLOPS * 8 / summary["train_time_s"])
    # MFU against the node's measured peak at a rank's thread count (1 here), measured by one rank
    # only, while the other waited; a device is a rank on CPU.
    assert _measurements(tmp_path / "measured.txt") == 1
    assert summary["peak_flops_source"] == "measured" and summary["devices"] == 2
    assert summary["peak_measurement"]["threads"] == 1 and summary["peak_measurement"]["precision"] == "fp32"
    assert 0 < summary["mfu"] <= 1
    assert summary["mfu"] == pytest.approx(summary["achieved_flops_per_s"] / (2 * summary["peak_flops_per_s"]))
    assert "(measured peak per device)" in console.summary_text(summary, run_dir)
    assert read_json(tmp_path / "cache" / "scalesuite" / "peak_flops.json")[peak.cache_key("fp32", 1)][
        "peak_flops_per_s"] == summary["peak_flops_per_s"]


@pytest.mark.slow
def test_a_configured_peak_gives_mfu_and_wins_over_measuring(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _count_measurements(monkeypatch, tmp_path / "measured.txt")
    recipe = make_recipe({"name": "single"}, tracking={"wandb": "disabled", "peak_flops_per_s": 1e9})
    step_losses(recipe, tmp_path / "run")
    s = read_json(tmp_path / "run" / "summary.json")
    assert s["peak_flops_per_s"] == 1e9 and s["peak_flops_source"] == "recipe" and "peak_measurement" not in s
    assert s["mfu"] == pytest.approx(s["achieved_flops_per_s"] / 1e9)
    assert _measurements(tmp_path / "measured.txt") == 0


@pytest.mark.slow
def test_measuring_the_peak_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _count_measurements(monkeypatch, tmp_path / "measured.txt")
    recipe = make_recipe({"name": "single"}, tracking={"wandb": "disabled", "measure_peak": False})
    step_losses(recipe, tmp_path / "run")
    s = read_json(tmp_path / "run" / "summary.json")
    assert s["achieved_flops_per_s"] > 0
    assert not {"mfu", "peak_flops_per_s", "peak_flops_source"} & set(s)
    assert _measurements(tmp_path / "measured.txt") == 0


def test_flops_of_one_step_equal_the_hand_count_and_the_peak_table_knows_gpu_names():
    assert model_flops.train_step_flops(make_recipe({"name": "single"})) == MLP_B32_FLOPS
    assert flops.peak_flops_per_s("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert flops.peak_flops_per_s("NVIDIA H100 PCIe", "fp32") == 51e12
    assert flops.peak_flops_per_s("cpu", "fp32") is None
    assert metrics.mfu(50e12, 100e12, 2) == 0.25


def test_sampler_reads_a_busy_process_and_stops_promptly():
    sampler = UtilisationSampler(CpuProbe(), 0.05, log=None).start()
    end = time.time() + 0.6
    while time.time() < end:
        sum(i * i for i in range(1000))  # keep this process busy
    t0 = time.time()
    out = sampler.stop()
    assert time.time() - t0 < 1.0
    assert out["utilisation_samples"] >= 3
    assert out["cpu_percent_peak"] > 10 and out["cpu_percent_peak"] >= out["cpu_percent_mean"]
    assert out["rss_bytes_peak"] >= out["rss_bytes_mean"] > 0


def test_wandb_mode_comes_from_the_environment_first(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_export.resolve_mode("offline") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "dryrun")
    assert wandb_export.resolve_mode("online") == "offline"
    monkeypatch.delenv("WANDB_MODE")
    assert wandb_export.resolve_mode("online") == "online"


def _tiny_record(folder, wandb_mode="offline"):
    run_dir = run_record.new_run_dir("tiny", f"name: tiny\ntracking: {{wandb: {wandb_mode}}}\n", folder)
    log = run_record.MetricsLog(run_dir, 0)
    for step in range(3):
        log.log("step", step=step, epoch=0, global_loss=1.0 / (step + 1))
    log.close()
    return run_dir


def _export_online(run_dir):
    t0 = time.time()
    notice = wandb_export.export_run(run_dir, "online")
    return notice, time.time() - t0


@pytest.mark.slow
@pytest.mark.parametrize("key", [None, "a" * 40, "short"])
def test_online_without_a_usable_key_or_a_server_falls_back_to_offline_within_seconds(tmp_path, monkeypatch, key):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    if key:
        monkeypatch.setenv("WANDB_API_KEY", key)
    else:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = _tiny_record(tmp_path, "online")
    notice, took = run_ranks(_export_online, 1, run_dir, timeout_s=60)[0]  # own process: W&B state stays there
    # W&B's own default would wait 90 s for the server; this bound includes importing wandb and
    # starting the offline run (~4 s idle, more on 2 busy cores).
    assert notice.startswith("W&B online is not available") and took < 30
    (written,) = wandb_runs.run_dirs(run_dir)
    assert [r["step"] for r in wandb_runs.step_metrics(wandb_runs.read(written))] == [0, 1, 2]
