"""The Llama model (grouped-query attention, rotary positions, SwiGLU, RMSNorm) trains exactly like
one process in float64 under data parallelism, FSDP, the pipeline, and with full and selective
activation checkpointing (tensor parallelism and data x tensor: tests/strategies/test_tensor.py)."""
import pytest

from suite.common.errors import SuiteError
from tests.parity import BASE, assert_matches, make_recipe, step_losses

pytestmark = pytest.mark.slow  # starts ranks or fake runs: not in the fast tier

# 4 query heads over 2 key/value heads: grouped-query attention is exercised, and tp 2 still
# leaves each rank whole heads of both.
LLAMA = {
    "model": {"name": "llama", "dim": 32, "heads": 4, "kv_heads": 2, "layers": 2, "ffn_dim": 48},
    "data": {"name": "synthetic_tokens", "vocab": 32, "seq_len": 16, "n_train": 512, "n_val": 64},
    "optimizer": {"name": "adamw", "lr": 0.01},
}
TIED = {**LLAMA, "model": {**LLAMA["model"], "tie_embeddings": True}}


def _with(sections: dict, **training) -> dict:
    return {**sections, "training": {**BASE["training"], **training}}


@pytest.fixture
def llama_baseline(baseline_of):
    single = baseline_of(make_recipe({"name": "single"}, **LLAMA))
    return single.losses, single.summary


@pytest.mark.parity
@pytest.mark.parametrize("strategy, world_size", [
    ({"name": "ddp"}, 2),
    ({"name": "fsdp"}, 2),
    ({"name": "pipeline", "schedule": "1f1b", "micro_batches": 4}, 2),
])
def test_llama_matches_single_process(strategy, world_size, llama_baseline, tmp_path):
    assert_matches(step_losses(make_recipe(strategy, world_size=world_size, **LLAMA), tmp_path), llama_baseline[0])


@pytest.mark.parity
@pytest.mark.parametrize("checkpointing", [True, "selective"])
def test_llama_checkpointed_under_fsdp_matches_single_process(checkpointing, llama_baseline, tmp_path):
    recipe = make_recipe({"name": "fsdp"}, world_size=2, **_with(LLAMA, activation_checkpointing=checkpointing))
    assert_matches(step_losses(recipe, tmp_path), llama_baseline[0])


@pytest.mark.parity
def test_llama_selective_checkpointing_under_tensor_parallel_matches(llama_baseline, tmp_path):
    recipe = make_recipe({"name": "tensor"}, world_size=2, **_with(LLAMA, activation_checkpointing="selective"))
    assert_matches(step_losses(recipe, tmp_path), llama_baseline[0])


@pytest.mark.parity
@pytest.mark.parametrize("strategy", [{"name": "ddp"}, {"name": "fsdp"}])
def test_tied_llama_matches_single_process(strategy, baseline_of, tmp_path):
    """The head reuses the embedding's weights: FSDP leaves that shared tensor to the root's unit."""
    single = baseline_of(make_recipe({"name": "single"}, **TIED)).losses
    assert_matches(step_losses(make_recipe(strategy, world_size=2, **TIED), tmp_path), single)


@pytest.mark.parametrize("strategy, world_size, sections, key", [
    ({"name": "tensor"}, 4, LLAMA, "model.kv_heads=2"),
    ({"name": "pipeline", "micro_batches": 4}, 2, TIED, "share parameters"),
])
def test_splits_it_cannot_make_give_one_clear_line(strategy, world_size, sections, key):
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, world_size=world_size, **sections)
    assert key in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parity
def test_llama_with_math_attention_under_tensor_parallel_matches_the_fused_single_process(llama_baseline, tmp_path):
    """``attention: math`` (scores written out) is the same function as the fused kernel: under
    tensor parallelism (each rank its own heads) it trains as the fused model on one process."""
    math = {**LLAMA, "model": {**LLAMA["model"], "attention": "math"}}
    assert_matches(step_losses(make_recipe({"name": "tensor"}, world_size=2, **math), tmp_path), llama_baseline[0])
