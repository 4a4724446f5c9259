"""ddp and the hand-written all-reduce at world size 2 train exactly like one process."""
import pytest

from suite.strategies import allreduce
from tests.parity import assert_matches, make_recipe, step_losses

pytestmark = pytest.mark.parity  # every test here: rerun under each CPU kernel set
pytestmark = [pytestmark, pytest.mark.slow]  # and slow: every test here launches runs (docs/contributing.md)
# baseline: single's losses on the parity recipe, once per session (tests/conftest.py)


@pytest.mark.parametrize("strategy", [{"name": "ddp"}, {"name": "ddp", "bucket_cap_mb": 0.001},
                                      {"name": "allreduce"}])
def test_matches_single_process_at_world_size_2(strategy, baseline, tmp_path):
    assert_matches(step_losses(make_recipe(strategy, world_size=2), tmp_path), baseline)


@pytest.mark.parametrize("name", ["ddp", "allreduce"])
def test_gradient_accumulation_matches_single_process(name, baseline, tmp_path):
    recipe = make_recipe({"name": name}, world_size=2,
                         training={**make_recipe({"name": "single"}).training.model_dump(), "grad_accumulation": 2})
    assert_matches(step_losses(recipe, tmp_path), baseline)


def test_the_comparison_catches_gradients_that_are_not_averaged(baseline, tmp_path, monkeypatch):
    """Break the strategy on purpose (sum instead of mean): the parity check must fail."""
    import torch.distributed as dist

    def summed(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)

    monkeypatch.setattr(allreduce.AllReduceEngine, "reduce_gradients", summed)
    losses = step_losses(make_recipe({"name": "allreduce"}, world_size=2), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline)
