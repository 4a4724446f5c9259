"""The one model-preparation step (suite.strategies.prepare): activation checkpointing trains
exactly like the baseline under DDP and FSDP, torch.compile runs and matches it, state_dict keys
stay those of the plain model, and every strategy goes through it."""
import inspect

import pytest
import torch

from suite.common.errors import SuiteError
from suite.models import build as build_model
from suite.strategies import STRATEGIES, prepare
from tests.parity import BASE, assert_matches, make_recipe, step_losses

CHECKPOINTED = {**BASE["training"], "activation_checkpointing": True}
COMPILE_TOLERANCE = 1e-4  # fused kernels reorder float sums
# baseline: single's losses on the parity recipe, once per session (tests/conftest.py)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [{"name": "ddp"}, {"name": "fsdp"}, {"name": "fsdp1"}])
def test_activation_checkpointing_matches_single_process_at_world_size_2(strategy, baseline, tmp_path):
    recipe = make_recipe(strategy, world_size=2, training=CHECKPOINTED)
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
def test_activation_checkpointing_with_accumulation_under_ddp_matches(baseline, tmp_path):
    recipe = make_recipe({"name": "ddp"}, world_size=2, training={**CHECKPOINTED, "grad_accumulation": 2})
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
def test_compile_runs_and_matches_single_process(baseline, tmp_path):
    recipe = make_recipe({"name": "ddp"}, world_size=2, training={**BASE["training"], "compile": True})
    assert_matches(step_losses(recipe, tmp_path, timeout_s=600), baseline, tolerance=COMPILE_TOLERANCE)


@pytest.mark.slow
def test_deepspeed_pipeline_takes_both_options(baseline_of, tmp_path):
    """Its engine runs the blocks itself: they are prepared before they become its layers.
    DeepSpeed cannot train in float64: compared in float32, against single in float32."""
    training = {**CHECKPOINTED, "compile": True}
    recipe = make_recipe({"name": "ds_pipeline", "stages": 2}, world_size=2, training=training)
    assert recipe.training.precision == "fp32"
    baseline = baseline_of(make_recipe({"name": "single"}, precision="fp32")).losses
    assert_matches(step_losses(recipe, tmp_path / "ds"), baseline, tolerance=COMPILE_TOLERANCE)


def _model():
    recipe = make_recipe({"name": "single"})
    torch.manual_seed(0)
    return build_model(recipe.model, recipe.data.spec())


def test_checkpointing_recomputes_each_block_in_backward():
    """The option does something: a block's layers run again while gradients are computed."""
    model = prepare.prepare(_model(), activation_checkpointing=True, compile=False, device=torch.device("cpu"))
    calls = []
    model[1][0].register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    assert len(calls) == 2  # the forward, then the recomputation in backward


@pytest.mark.slow
def test_compile_compiles_each_block():
    model = prepare.prepare(_model(), activation_checkpointing=False, compile=True, device=torch.device("cpu"))
    traced = []
    model[1][0].register_forward_hook(lambda *_: traced.append(torch.compiler.is_compiling()))
    model(torch.randn(4, 1, 8, 8))
    assert traced and all(traced)


def test_prepared_models_keep_their_state_dict_keys():
    plain = _model()
    for options in ({"activation_checkpointing": True, "compile": False},
                    {"activation_checkpointing": True, "compile": True}):
        prepared = prepare.prepare(_model(), **options, device=torch.device("cpu"))
        assert list(prepared.state_dict()) == list(plain.state_dict())
        prepared.load_state_dict(plain.state_dict())


def test_a_missing_compiler_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler++")
    with pytest.raises(SuiteError, match=r"training\.compile=true needs the compiler no-such-compiler\+\+") as err:
        prepare.prepare(_model(), activation_checkpointing=False, compile=True, device=torch.device("cpu"))
    assert "\n" not in str(err.value) and "training.compile=false" in str(err.value)


def test_every_strategy_prepares_its_model_before_wrapping_it():
    """The options reach every strategy only through setup.prepare: a build that skips it would
    silently ignore them."""
    for name, module in STRATEGIES.items():
        # Refused before they build anything; TensorFlow's train their own Keras model (owns_training).
        if name not in ("fairscale_fsdp", "horovod") and not module.Options.owns_training:
            assert "setup.prepare(" in inspect.getsource(module.build), name
