"""The advisor keeps a recipe's activation checkpointing as written where it fits (it tries more
only where memory needs it), and on a GPU recipe decides fit on the very figure ``suite.plan``
gives the point: the caching allocator's reserve."""
import pytest

from suite.planner import hardware, search, table

LLAMA_GPU = {"name": "t", "model": {"name": "llama", "dim": 64, "layers": 2, "heads": 4, "kv_heads": 2},
             "data": {"name": "synthetic_tokens", "vocab": 64, "seq_len": 256, "n_train": 64, "n_val": 8},
             "strategy": {"name": "fsdp", "mixed_precision": "bf16"}, "optimizer": {"name": "adamw", "lr": 0.001},
             "training": {"epochs": 1, "batch_size": 16, "seed": 0, "precision": "bf16",
                          "activation_checkpointing": "selective"},
             "launch": {"tasks_per_node": 2, "device": "cuda"}, "tracking": {"wandb": "disabled"}}
QUIET = {"progress": lambda _: None}
FSDP = [("fsdp", {"name": "fsdp", "mixed_precision": "bf16"})]


@pytest.mark.slow
def test_selective_checkpointing_as_written_is_kept_and_fit_is_the_plans_reserved_figure():
    (point,) = table.plan(LLAMA_GPU, FSDP, [2], jobs=1, **QUIET)
    plan = point.profile
    assert plan.reserved_bytes is not None and plan.reserved_bytes > plan.peak_bytes
    h100 = hardware.preset("h100")
    (c,) = search.search(LLAMA_GPU, 1, 2, h100, h100["memory_bytes"], strategies=FSDP, **QUIET)
    assert not c.excluded, c.excluded
    assert (c.checkpointing, c.accumulation) == ("selective", 1)  # as written: not dropped, not made full
    assert (c.profile.peak_bytes, c.profile.reserved_bytes) == (plan.peak_bytes, plan.reserved_bytes)
    # a byte under the plan's reserved figure: selective no longer fits, so the advisor checkpoints more
    (c,) = search.search(LLAMA_GPU, 1, 2, h100, plan.reserved_bytes - 1, strategies=FSDP, **QUIET)
    assert c.excluded or (c.checkpointing, c.accumulation) != ("selective", 1)
    assert c.excluded or c.profile.fit_bytes < plan.reserved_bytes
