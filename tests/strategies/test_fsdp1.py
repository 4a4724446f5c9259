"""FSDP1 (FullyShardedDataParallel; full and grad-op sharding, accumulation through no_sync)
trains exactly like one process, and full sharding at world size 2 holds half of the
parameters, gradients and optimizer state on each rank."""
import pytest
import torch.distributed as dist

from suite.planner.memory import predicted_held_bytes
from suite.record.run_record import read_json
from suite.strategies import fsdp1
from tests.parity import BASE, assert_holds_share, assert_matches, make_recipe, step_losses

pytestmark = pytest.mark.slow  # every test here launches runs, ranks or commands (docs/contributing.md)


@pytest.fixture(scope="module")
def full_sharding(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fsdp1")
    recipe = make_recipe({"name": "fsdp1"}, world_size=2)
    return recipe, step_losses(recipe, run_dir), read_json(run_dir / "summary.json")


@pytest.mark.parity
def test_full_sharding_matches_single_process_at_world_size_2(full_sharding, baseline_and_summary):
    assert_matches(full_sharding[1], baseline_and_summary[0])


@pytest.mark.parity
def test_grad_op_sharding_matches_single_process_at_world_size_2(baseline_and_summary, tmp_path):
    recipe = make_recipe({"name": "fsdp1", "sharding": "grad_op"}, world_size=2)
    assert_matches(step_losses(recipe, tmp_path), baseline_and_summary[0])


@pytest.mark.parity
def test_gradient_accumulation_through_no_sync_matches_single_process(baseline_and_summary, tmp_path):
    recipe = make_recipe({"name": "fsdp1"}, world_size=2, training={**BASE["training"], "grad_accumulation": 2})
    assert_matches(step_losses(recipe, tmp_path), baseline_and_summary[0])


def test_full_sharding_holds_half_of_everything_per_rank_at_world_size_2(full_sharding, baseline_and_summary):
    recipe, _, summary = full_sharding
    assert_holds_share(summary, baseline_and_summary[1], predicted_held_bytes(recipe)["per_rank"], 1 / 2)


def test_the_comparison_catches_gradients_that_are_never_reduced(baseline_and_summary, tmp_path, monkeypatch):
    """Break the strategy on purpose (a communication hook that keeps this rank's own gradient
    shard instead of reduce-scattering: each rank steps on its own gradients): parity must fail."""
    build = fsdp1.build

    def keep_local_shard(state, grad, output):
        output.copy_(grad.chunk(dist.get_world_size())[dist.get_rank()])

    def never_reduced(opts, setup):
        engine = build(opts, setup)
        engine.module.register_comm_hook(None, keep_local_shard)
        return engine

    monkeypatch.setattr(fsdp1, "build", never_reduced)
    losses = step_losses(make_recipe({"name": "fsdp1"}, world_size=2), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline_and_summary[0])
