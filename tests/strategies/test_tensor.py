"""Tensor parallelism (the mlp, the transformer and the Llama, in torchtitan's layout) and data x
tensor on a 2-D mesh train exactly like one process; degrees and models it cannot split are
refused in one line."""
import math

import pytest

from suite.strategies.engine import Engine
from suite.common.errors import SuiteError
from suite.strategies import tensor
from suite.record.run_record import read_json
from tests.parity import assert_matches, make_recipe, step_losses
from tests.strategies.test_llama import LLAMA

LANGUAGE = {
    "model": {"name": "transformer", "dim": 32, "heads": 4, "layers": 2},
    "data": {"name": "synthetic_tokens", "vocab": 32, "seq_len": 16, "n_train": 512, "n_val": 64},
    "optimizer": {"name": "adamw", "lr": 0.01},
}


@pytest.fixture
def mlp_baseline(baseline):
    return baseline


@pytest.fixture(params=["transformer", "llama"])
def language(request):
    """The sections of a language model tensor parallelism has a layout for."""
    return {"transformer": LANGUAGE, "llama": LLAMA}[request.param]


@pytest.fixture
def transformer_baseline(baseline_of, language):
    single = baseline_of(make_recipe({"name": "single"}, **language))
    return single.losses, single.summary


@pytest.mark.slow
@pytest.mark.parity
def test_mlp_matches_single_process_at_tp_2(mlp_baseline, tmp_path):
    assert_matches(step_losses(make_recipe({"name": "tensor"}, world_size=2), tmp_path), mlp_baseline)


@pytest.mark.slow
@pytest.mark.parity
def test_transformer_matches_single_process_at_tp_2(transformer_baseline, language, tmp_path):
    assert_matches(step_losses(make_recipe({"name": "tensor"}, world_size=2, **language), tmp_path),
                   transformer_baseline[0])
    whole = transformer_baseline[1]["ranks"][0]["held_bytes"]["parameters"]
    for rank in read_json(tmp_path / "summary.json")["ranks"]:
        # Attention and MLP (feed-forward) weights are split in two; embeddings, norms and head are not.
        assert whole / 2 < rank["held_bytes"]["parameters"] < whole


@pytest.mark.slow
@pytest.mark.parity
def test_transformer_matches_single_process_at_dp_2_x_tp_2(transformer_baseline, language, tmp_path):
    recipe = make_recipe({"name": "tensor", "dp": 2}, world_size=4, **language)
    assert_matches(step_losses(recipe, tmp_path), transformer_baseline[0])
    summary = read_json(tmp_path / "summary.json")
    assert summary["dp_size"] == 2


@pytest.mark.slow
def test_language_runs_report_tokens_per_s(transformer_baseline, language):
    summary = transformer_baseline[1]
    assert math.isclose(summary["tokens_per_s"], summary["samples_per_s"] * language["data"]["seq_len"])


@pytest.mark.slow
def test_the_comparison_catches_tp_ranks_reading_different_batches(mlp_baseline, tmp_path, monkeypatch):
    """Break the strategy on purpose (each tp rank reads its own data shard): parity must fail."""
    build = tensor.build

    def split_data(opts, setup) -> Engine:
        engine = build(opts, setup)
        engine.dp_rank, engine.dp_size = setup.ctx.rank, setup.ctx.world_size
        return engine

    monkeypatch.setattr(tensor, "build", split_data)
    losses = step_losses(make_recipe({"name": "tensor"}, world_size=2), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, mlp_baseline)


@pytest.mark.parametrize("strategy, world_size, sections, key", [
    ({"name": "tensor", "dp": 3}, 2, {}, "strategy.dp=3"),
    ({"name": "tensor", "dp": 2, "tp": 3}, 4, {}, "strategy.tp=3"),
    ({"name": "tensor", "tp": 8}, 8, LANGUAGE, "model.heads=4"),
    ({"name": "tensor"}, 4, {"model": {"name": "mlp", "hidden": [30, 32]}}, "model.hidden width=30"),
    ({"name": "tensor"}, 2, {"model": {"name": "cnn"}, "data": {"name": "synthetic", "shape": [3, 32, 32]}},
     "model.name='cnn'"),
])
def test_bad_degrees_and_models_give_one_clear_line(strategy, world_size, sections, key):
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, world_size=world_size, **sections)
    assert key in str(err.value) and "\n" not in str(err.value)
