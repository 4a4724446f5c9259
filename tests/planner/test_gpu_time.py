"""A GPU's time per operator (suite.planner.gpu_ops) and its memory (fused attention, the
compute dtype) on a preset, and the published run the issue names: torchtitan's Llama 3.1 8B
under FSDP on 8 H100."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from suite.compat import torch as torch_compat
from suite.planner import gpu_ops, hardware
from suite.planner.counting import LiveBytes, OpCosts

H100 = hardware.preset("h100")["compute"]


def test_a_large_gemm_runs_at_the_sustained_share_of_peak_and_a_skinny_one_at_memory_bandwidth():
    big = gpu_ops.matmul_s(H100, 1, 8192, 8192, 8192, 2, "bf16")
    # 64 x 64 tiles of 128 over 132 multiprocessors: 32 waves, the last one part full
    assert 2 * 8192**3 / big == pytest.approx(989e12 * H100["gemm_efficiency"] * 4096 / (32 * 132), rel=1e-9)
    # one row: 2 x 8192^2 FLOPs, but the 128 MiB matrix must be read: memory-bound
    skinny = gpu_ops.matmul_s(H100, 1, 1, 8192, 8192, 2, "bf16")
    assert skinny == pytest.approx(8192 * 8192 * 2 / (H100["memory_bytes_per_s"] * H100["memory_efficiency"]), rel=0.01)
    # 132 tiles fill one wave; one tile more takes a second wave
    one_wave = gpu_ops.matmul_s(H100, 1, 12 * 128, 11 * 128, 8192, 2, "bf16")  # 132 tiles: one wave
    assert gpu_ops.matmul_s(H100, 1, 12 * 128, 12 * 128, 8192, 2, "bf16") == pytest.approx(2 * one_wave, rel=1e-9)


def test_attention_on_a_gpu_runs_fused_holds_no_score_matrix_and_is_counted_as_one_kernel():
    b, h, s, d = 2, 8, 1024, 64
    with torch_compat.fused_attention(), torch.device("meta"):
        q = torch.randn(b, h, s, d, dtype=torch.bfloat16, requires_grad=True)
        live, ops = LiveBytes(), OpCosts()
        with live, ops:
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    scores = b * h * s * s * 2
    assert live.peak < scores / 2  # the math path holds b x h x s x s scores (and their softmax)
    assert sorted(k[6] for k in ops.attention) == [False, True]  # one forward, one backward kernel
    assert not ops.matmuls
    t = gpu_ops.time_s(ops.summary(), H100, "bf16")
    flops = 4 * b * h * s * s * d * 0.5
    expected = flops / (989e12 * H100["attention_efficiency"]["forward"]) \
        + 2.5 * flops / (989e12 * H100["attention_efficiency"]["backward"])
    assert t["attention"] == pytest.approx(expected, rel=1e-6)


def test_math_attention_holds_and_moves_its_score_matrices_and_matches_the_fused_result():
    """A model run with ``attention: math`` (scores written out, as before fused kernels) is planned
    with what that costs a GPU: the b x h x s x s scores held for the backward pass and moved
    through memory, their two products counted as matmuls; its result is the fused kernel's."""
    from suite.models.attention import attend

    b, h, s, d = 2, 8, 1024, 64
    counted = {}
    for kernel in ("fused", "math"):
        with torch_compat.fused_attention(), torch.device("meta"):
            q = torch.randn(b, h, s, d, dtype=torch.bfloat16, requires_grad=True)
            live, ops = LiveBytes(), OpCosts()
            with live, ops:
                attend(q, q, q, kernel).sum().backward()
        counted[kernel] = (live.peak, gpu_ops.time_s(ops.summary(), H100, "bf16"), ops)
    scores = b * h * s * s * 2
    assert counted["fused"][0] < scores / 2 and counted["math"][0] >= scores  # the softmax kept for backward
    math_ops, math_time = counted["math"][2], counted["math"][1]
    assert not math_ops.attention and math_ops.matmuls  # q kᵀ and p v, forward and backward
    # masking and softmax, forward and backward, each read and write the scores at least once
    assert math_time["memory"] > 4 * scores / (H100["memory_bytes_per_s"] * H100["memory_efficiency"])
    assert math_time["total"] > counted["fused"][1]["total"]
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 8, dtype=torch.float64) for _ in range(3))
    kv = [t[:, :2] for t in (k, v)]  # grouped-query: two key/value heads serving four query heads
    for keys in ((k, v), kv):
        assert torch.allclose(attend(q, *keys, "math"), attend(q, *keys, "fused"), rtol=0, atol=1e-12)


def test_every_gpu_preset_says_it_is_from_specs_and_prices_operators():
    for name in ("h100", "h200", "a100", "a100_40gb"):
        p = hardware.preset(name)
        assert p["from_specs"] and "data sheet" in p["source"]
        assert p["compute"]["memory_bytes_per_s"] > 1e12 and p["compute"]["sm_count"] > 100
        assert any("priced one by one" in a for a in p["assumptions"])
    assert hardware.preset("h200")["memory_bytes"] > hardware.preset("h100")["memory_bytes"]


def test_torchtitans_llama3_8b_fsdp_on_8_h100_fits_and_is_predicted_within_15_percent():
    """Published: 5,762 tokens/s per GPU (bf16, local batch 2, sequence 8,192, selective
    checkpointing; 96 GB HBM2e H100s: their profile file in benchmarks/profiles)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from published_runs import ROWS
    from sections.published import predict

    row = ROWS[0]
    assert row["tokens_per_s_per_gpu"] == 5762
    got = predict(row)
    assert got["step"]["rate"].startswith("the step's operators priced one by one")
    assert abs(got["tokens_per_s_per_gpu"] / 5762 - 1) <= 0.15, got["tokens_per_s_per_gpu"]
    assert got["memory_gib"] * 2**30 < hardware.load(row["hardware"])["memory_bytes"]  # it fits


@pytest.mark.slow
def test_the_fake_run_of_a_gpu_recipe_counts_its_ranks_own_operators():
    """FSDP's fake step on a GPU recipe: its matmuls and fused attention counted for the GPU's
    time, the optimizer's update on its shard among them."""
    from suite import recipe as recipes
    from suite.planner import fake_run

    recipe = recipes.validate({
        "name": "g", "model": {"name": "llama", "dim": 64, "layers": 2, "heads": 4, "kv_heads": 2},
        "data": {"name": "synthetic_tokens", "vocab": 128, "seq_len": 64, "n_train": 64, "n_val": 16},
        "strategy": {"name": "fsdp", "mixed_precision": "bf16"}, "optimizer": {"name": "adamw", "lr": 1e-3},
        "training": {"batch_size": 8, "epochs": 1, "precision": "bf16"},
        "launch": {"tasks_per_node": 2, "device": "cuda"}, "tracking": {"wandb": "disabled"}})
    status, profile = fake_run.run_isolated(recipe, 2, timeout_s=240)
    assert status == "ok" and profile.source == "fake", profile
    passes = profile.ops["passes"]
    assert {row[6] for row in passes["attention"]} == {False, True}  # forward and backward kernels, 2 layers
    assert sum(row[-1] for row in passes["attention"]) == 4
    assert passes["matmul"] and passes["memory"][0] > 0
    assert gpu_ops.step_s(profile.ops, H100, "bf16")["total"] > 0


def test_fsdp2s_bf16_policy_gathers_two_byte_parameters_and_reduces_in_fp32():
    from suite import recipe as recipes
    from suite.planner import analytic, fake_run

    raw = {"name": "m", "model": {"name": "mlp", "hidden": [64, 64]}, "data": {"name": "digits"},
           "optimizer": {"name": "adamw", "lr": 1e-3}, "training": {"batch_size": 8, "epochs": 1},
           "launch": {"tasks_per_node": 2}, "tracking": {"wandb": "disabled"}}
    plain, mixed = (analytic.profile(fake_run.at_world(recipes.validate(
        {**raw, "strategy": {"name": "fsdp", "mixed_precision": mp}}), 2), 2, "test") for mp in ("fp32", "bf16"))
    assert mixed.comm_bytes["all_gather"] * 2 == plain.comm_bytes["all_gather"]
    assert mixed.comm_bytes["reduce_scatter"] == plain.comm_bytes["reduce_scatter"]


DTENSOR_BYTES = r"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor
from suite.compat import torch as torch_compat
from suite.planner.counting import LiveBytes

dist.init_process_group("fake", rank=0, world_size=8, store=torch_compat.fake_store())
whole = distribute_tensor(torch.zeros(64, 32), DeviceMesh("cpu", list(range(8))), [Shard(0)])
with LiveBytes() as live:
    state = torch.zeros_like(whole)  # as Adam creates its state for a sharded parameter
print(live.peak, state.to_local().numel() * 4)
"""


def test_a_sharded_dtensor_is_counted_at_its_shards_bytes_not_the_whole_tensors():
    """FSDP2's parameters and the optimizer's state for them are DTensors: only the local shard
    holds memory on a rank. The wrapper answers untyped_storage() with a storage the size of the
    whole tensor; counted, FSDP2's plans held the optimizer's state at full size."""
    proc = subprocess.run([sys.executable, "-c", DTENSOR_BYTES], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak, shard = map(int, proc.stdout.split())
    assert shard == 8 * 32 * 4 and peak == shard, (peak, shard)
