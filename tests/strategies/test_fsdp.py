"""FSDP2 (full, grad-op and hybrid sharding) trains exactly like one process, and full sharding
at world size 2 holds half of the parameters, gradients and optimizer state on each rank."""
import math

import pytest

from suite.common.errors import SuiteError
from suite.planner.memory import predicted_held_bytes
from suite.strategies import fsdp
from suite.record.run_record import read_json
from tests.parity import BASE, assert_holds_share, assert_matches, make_recipe, step_losses


@pytest.fixture(scope="module")
def full_sharding(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fsdp")
    recipe = make_recipe({"name": "fsdp"}, world_size=2)
    return recipe, step_losses(recipe, run_dir), read_json(run_dir / "summary.json")


@pytest.mark.slow
@pytest.mark.parity
def test_full_sharding_matches_single_process_at_world_size_2(full_sharding, baseline_and_summary):
    assert_matches(full_sharding[1], baseline_and_summary[0])


@pytest.mark.slow
@pytest.mark.parity
def test_grad_op_sharding_matches_single_process_at_world_size_2(baseline_and_summary, tmp_path):
    recipe = make_recipe({"name": "fsdp", "reshard_after_forward": False}, world_size=2)
    assert_matches(step_losses(recipe, tmp_path), baseline_and_summary[0])


@pytest.mark.slow
@pytest.mark.parity
def test_gradient_accumulation_matches_single_process(baseline_and_summary, tmp_path):
    recipe = make_recipe({"name": "fsdp"}, world_size=2, training={**BASE["training"], "grad_accumulation": 2})
    assert_matches(step_losses(recipe, tmp_path), baseline_and_summary[0])


@pytest.mark.slow
@pytest.mark.parity
def test_hybrid_sharding_2x2_matches_single_process_at_world_size_4(baseline_and_summary, tmp_path):
    recipe = make_recipe({"name": "fsdp", "replicate": 2}, world_size=4)
    assert_matches(step_losses(recipe, tmp_path), baseline_and_summary[0])


@pytest.mark.slow
def test_full_sharding_holds_half_of_everything_per_rank_at_world_size_2(full_sharding, baseline_and_summary):
    recipe, _, summary = full_sharding
    assert_holds_share(summary, baseline_and_summary[1], predicted_held_bytes(recipe)["per_rank"], 1 / 2)


@pytest.mark.slow
def test_the_comparison_catches_gradients_that_are_never_reduced(baseline_and_summary, tmp_path, monkeypatch):
    """Break the strategy on purpose (each rank steps on its own gradients): parity must fail."""
    def never_sync(self, last):
        self.module.set_requires_gradient_sync(False)
        yield

    monkeypatch.setattr(fsdp.FSDPEngine, "sync_context", fsdp.contextmanager(never_sync))
    losses = step_losses(make_recipe({"name": "fsdp"}, world_size=2), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline_and_summary[0])


@pytest.mark.slow
def test_bf16_mixed_precision_runs_and_learns(tmp_path):
    """Smoke test only: bf16 is not held to the fp32 tolerance."""
    losses = step_losses(make_recipe({"name": "fsdp", "mixed_precision": "bf16"}, world_size=2), tmp_path)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


@pytest.mark.parametrize("strategy, world_size, key", [
    ({"name": "fsdp", "replicate": 3}, 4, "strategy.replicate=3"),
    ({"name": "fsdp", "replicate": 4}, 2, "strategy.replicate=4"),
])
def test_bad_degrees_give_one_clear_line(strategy, world_size, key):
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, world_size=world_size)
    assert key in str(err.value) and "world size" in str(err.value) and "\n" not in str(err.value)


def inplace_at_a_block_start(spec):
    """A block whose first op edits its input in place (as torchvision's MNASNet's classifier,
    Dropout(inplace=True)), after a block whose output is a view."""
    from torch import nn

    inputs = math.prod(spec.input_shape)
    return nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(inputs, 32)),
                         nn.Sequential(nn.ReLU(inplace=True), nn.Linear(32, 32), nn.Flatten(start_dim=1)),
                         nn.Sequential(nn.ReLU(inplace=True), nn.Linear(32, spec.num_classes)))


@pytest.mark.slow
def test_a_block_that_edits_its_input_in_place_is_sharded_and_matches_single(baseline_of, tmp_path):
    model = {"target": "tests.strategies.test_fsdp:inplace_at_a_block_start"}
    baseline = baseline_of(make_recipe({"name": "single"}, model=model)).losses
    assert_matches(step_losses(make_recipe({"name": "fsdp"}, world_size=2, model=model), tmp_path), baseline)
