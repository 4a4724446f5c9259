"""What PyTorch's CUDA caching allocator reserves (suite.planner.caching_allocator): its rounding
and segment sizes, best fit with splitting, blocks kept per stream; and the reserved figure the
fake run and the analytic rule give a GPU recipe beside the allocated peak."""
from __future__ import annotations

import pytest

from suite.planner import caching_allocator as ca

MiB = 2**20


def test_requests_are_rounded_to_512_bytes_and_served_from_segments_by_size():
    assert ca.round_bytes(1) == 512 and ca.round_bytes(513) == 1024
    a = ca.CachingAllocator()
    a.malloc(100)  # small pool: a 2 MiB segment
    assert a.reserved == 2 * MiB and a.allocated == 512
    a.malloc(3 * MiB)  # 1 to 10 MiB: a 20 MiB segment
    assert a.reserved == 22 * MiB
    a.malloc(30 * MiB + 1)  # 10 MiB up: its own segment, rounded up to 2 MiB
    assert a.reserved == 22 * MiB + 32 * MiB


def test_a_freed_block_is_split_for_a_smaller_request_and_merged_back():
    a = ca.CachingAllocator()
    first = a.malloc(40 * MiB)
    a.free(first)
    small = a.malloc(12 * MiB)  # best fit: the cached 40 MiB block, split
    rest = a.malloc(28 * MiB)  # the rest of it
    assert a.reserved == 40 * MiB and rest == small + 12 * MiB
    a.free(small)
    a.free(rest)
    a.malloc(40 * MiB)  # merged back into one block: no new segment
    assert a.reserved == 40 * MiB


def test_a_block_cached_for_one_stream_is_not_handed_to_another():
    events = [("alloc", 0, 64 * MiB, "all_gather"), ("free", 0), ("alloc", 1, 64 * MiB, "compute"), ("free", 1)]
    got = ca.replay(events)
    assert got["reserved_bytes"] == 128 * MiB and got["requested_bytes"] == 64 * MiB
    same = [(e[0], e[1], e[2], "compute") if e[0] == "alloc" else e for e in events]
    assert ca.replay(same)["reserved_bytes"] == 64 * MiB


def test_growing_requests_fragment_the_cache_and_the_steady_state_reuses_it():
    # 10, 12, 14 MiB, each freed before the next: no cached block fits the next, so each takes a
    # segment of its own; the second step reuses them all.
    events = [e for i, size in enumerate((10, 12, 14)) for e in (("alloc", i, size * MiB, "compute"), ("free", i))]
    got = ca.replay(events, steps=2)
    assert got["reserved_bytes"] == 36 * MiB and got["requested_bytes"] == 14 * MiB


def _gpu_recipe():
    from suite import recipe as recipes

    return recipes.validate({
        "name": "g", "model": {"name": "llama", "dim": 64, "layers": 2, "heads": 4, "kv_heads": 2},
        "data": {"name": "synthetic_tokens", "vocab": 128, "seq_len": 64, "n_train": 64, "n_val": 16},
        "strategy": {"name": "fsdp", "mixed_precision": "bf16"}, "optimizer": {"name": "adamw", "lr": 1e-3},
        "training": {"batch_size": 8, "epochs": 1, "precision": "bf16"},
        "launch": {"tasks_per_node": 2, "device": "cuda"}, "tracking": {"wandb": "disabled"}})


@pytest.mark.slow
def test_a_gpu_recipes_fake_run_and_analytic_rule_report_reserved_beside_allocated():
    from suite.planner import analytic, fake_run

    recipe = _gpu_recipe()
    status, profile = fake_run.run_isolated(recipe, 2, timeout_s=240)
    assert status == "ok" and profile.source == "fake", profile
    # FSDP2's gather and reduce-scatter buffers sit in their streams' pools, apart from compute:
    # at this size each is a small block in a 2 MiB segment of its own stream's.
    assert profile.reserved_bytes >= profile.peak_bytes + 2 * 2 * MiB
    assert profile.fit_bytes == profile.reserved_bytes
    rule = analytic.profile(fake_run.at_world(recipe, 2), 2, "test")
    assert rule.reserved_bytes >= rule.peak_bytes + 2 * 2 * MiB
    cpu = recipe.model_copy(update={"launch": recipe.launch.model_copy(update={"device": "cpu"})})
    assert analytic.profile(fake_run.at_world(cpu, 2), 2, "test").reserved_bytes is None  # no caching allocator
