"""fairscale where it still works on current torch: OSS (+ DDP, or + ShardedDDP with gradients
cleared in place) and Pipe in one process train exactly like one process; FSDP is refused."""
import json

import pytest

from suite.common.errors import SuiteError
from suite.strategies import fairscale_oss
from tests.harness import run_ranks
from tests.parity import BASE, TWO_DEVICES, assert_matches, make_recipe, step_losses
from tests.roundtrip import continued_and_resumed


@pytest.mark.slow
@pytest.mark.parametrize("gradients", ["ddp", "sharded_ddp"])
@pytest.mark.parity
def test_oss_matches_single_process_at_world_size_2(gradients, baseline, tmp_path):
    recipe = make_recipe({"name": "oss", "gradients": gradients}, world_size=2)
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
def test_oss_takes_every_optimizer_the_recipe_can_name(baseline_of, tmp_path):
    # AdamW's defaults hold a key its constructor refuses; OSS rebuilds the optimizer from them.
    adamw = {**BASE["optimizer"], "name": "adamw", "weight_decay": 0.01}
    single = baseline_of(make_recipe({"name": "single"}, optimizer=adamw)).losses
    assert_matches(step_losses(make_recipe({"name": "oss"}, world_size=2, optimizer=adamw), tmp_path / "oss"), single)


@pytest.mark.slow
@pytest.mark.parametrize("gradients", ["ddp", "sharded_ddp"])
@pytest.mark.parity
def test_oss_with_gradient_accumulation_matches_single_process(gradients, baseline, tmp_path):
    recipe = make_recipe({"name": "oss", "gradients": gradients}, world_size=2, training={**BASE["training"], "grad_accumulation": 2})
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
def test_oss_holds_half_the_optimizer_state_at_world_size_2(tmp_path):
    step_losses(make_recipe({"name": "oss"}, world_size=2), tmp_path)
    held = [r["held_bytes"] for r in json.loads((tmp_path / "summary.json").read_text())["ranks"]]
    params = held[0]["parameters"]  # SGD momentum: one state element per parameter element
    assert all(h["optimizer_state"] < 0.8 * params for h in held)
    assert sum(h["optimizer_state"] for h in held) == params


@pytest.mark.slow
def test_sharded_ddp_with_grads_set_to_none_is_wrong(baseline, tmp_path, monkeypatch):
    """Why the engine clears in place: torch's default set_to_none leaves fairscale's buckets full."""
    monkeypatch.setattr(fairscale_oss.OSSEngine, "zero_grad", lambda self: self.optimizer.zero_grad(set_to_none=True))
    losses = step_losses(make_recipe({"name": "oss", "gradients": "sharded_ddp"}, world_size=2), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline)


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", ["except_last", "never"])
@pytest.mark.parity
def test_pipe_in_one_process_matches_single_process(checkpoint, baseline, tmp_path):
    recipe = make_recipe({"name": "fairscale_pipe", "micro_batches": 4, "checkpoint": checkpoint}, **TWO_DEVICES)
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.parametrize("strategy, world, launch, fragment", [
    ({"name": "fairscale_fsdp"}, 2, {}, "use strategy.name=fsdp"),
    ({"name": "fairscale_pipe"}, 2, TWO_DEVICES["launch"], "strategy fairscale_pipe runs in one process"),
    ({"name": "fairscale_pipe"}, 1, {}, "launch.devices_per_task=1; set it to 2"),
    ({"name": "fairscale_pipe", "micro_batches": 3}, 1, TWO_DEVICES["launch"], "strategy.micro_batches=3 must divide"),
    ({"name": "oss", "gradients": "zero3"}, 2, {}, "strategy.gradients='zero3'"),
])
def test_unsupported_settings_give_one_clear_line(strategy, world, launch, fragment):
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, world_size=world, launch=launch)
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("gradients", ["ddp", "sharded_ddp"])
def test_oss_state_dict_resumes_exactly(gradients):
    recipe = make_recipe({"name": "oss", "gradients": gradients}, world_size=2)
    for continued, resumed in run_ranks(continued_and_resumed, 2, recipe):
        assert resumed == continued


@pytest.mark.slow
def test_pipe_state_dict_resumes_exactly():
    recipe = make_recipe({"name": "fairscale_pipe"}, **TWO_DEVICES)
    ((continued, resumed),) = run_ranks(continued_and_resumed, 1, recipe)
    assert resumed == continued
