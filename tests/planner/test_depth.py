"""A deep stack's fake run extrapolated from its copies at 1, 2 and 3 blocks (suite.planner.depth)
equals the fake run at its own depth: every count but the caching allocator's reserve, an
estimate from the deepest copy."""
from __future__ import annotations

import pytest

from suite.planner import depth, fake_run


def _recipe(layers: int, checkpointing=False):
    from suite import recipe as recipes

    return recipes.validate({
        "name": "d", "model": {"name": "llama", "dim": 64, "layers": layers, "heads": 4, "kv_heads": 2},
        "data": {"name": "synthetic_tokens", "vocab": 128, "seq_len": 1024, "n_train": 64, "n_val": 16},
        "strategy": {"name": "fsdp", "mixed_precision": "bf16"}, "optimizer": {"name": "adamw", "lr": 1e-3},
        "training": {"batch_size": 8, "epochs": 1, "precision": "bf16", "activation_checkpointing": checkpointing},
        "launch": {"tasks_per_node": 2, "device": "cuda"}, "tracking": {"wandb": "disabled"}})


@pytest.mark.slow
def test_the_extrapolated_fake_run_of_a_llama_equals_the_one_at_its_depth():
    recipe = _recipe(5)
    assert depth.reducible(recipe)
    status, scaled = fake_run.run_isolated(recipe, 2, timeout_s=400)
    assert status == "ok" and "extrapolated to 5" in scaled.notes, scaled
    status, full = fake_run.run_isolated(recipe, 2, timeout_s=400, whole=True)
    assert status == "ok" and "extrapolated" not in full.notes
    for key in ("held_bytes", "peak_bytes", "flops", "comm_bytes", "comm_calls", "comm_sizes",
                "copy_bytes"):
        assert getattr(scaled, key) == getattr(full, key), key
    assert depth._close(depth._line(scaled.ops, scaled.ops, 1), depth._line(full.ops, full.ops, 1))
    # the reserve beyond the peak: the deepest copy's, within a 20 MiB segment of the full run's
    assert abs(scaled.reserved_bytes - full.reserved_bytes) <= 20 * 2**20, (scaled.reserved_bytes, full.reserved_bytes)


def test_counts_that_do_not_grow_by_a_block_per_block_are_refused():
    with pytest.raises(depth.NotLinear):
        depth.extrapolate([{"peak_bytes": 10}, {"peak_bytes": 20}, {"peak_bytes": 35}], 8)
    assert depth.extrapolate([{"peak_bytes": 10}, {"peak_bytes": 20}, {"peak_bytes": 30}], 8) == {"peak_bytes": 80}
