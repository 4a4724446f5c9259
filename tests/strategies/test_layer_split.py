"""Layer-wise model parallelism trains exactly like one process: two devices in one process, and
MP-DDP (a split model per rank, DDP across ranks) at world size 2. A meta "device" proves that
every hop moves the activations."""
import pytest
import torch

from suite.strategies.context import DistContext
from suite.common.errors import SuiteError
from suite.strategies import layer_split
from tests.harness import run_ranks
from tests.parity import BASE, TWO_DEVICES, assert_matches, make_recipe, step_losses
from tests.roundtrip import continued_and_resumed


@pytest.mark.slow
@pytest.mark.parametrize("split_at", [None, [1], [3]])
@pytest.mark.parity
def test_two_devices_in_one_process_match_single_process(split_at, baseline, tmp_path):
    recipe = make_recipe({"name": "layer_split", "split_at": split_at}, world_size=1, **TWO_DEVICES)
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
@pytest.mark.parity
def test_mp_ddp_at_world_size_2_matches_single_process(baseline, tmp_path):
    recipe = make_recipe({"name": "layer_split"}, world_size=2, **TWO_DEVICES)
    assert recipe.layout().dp_size == 2
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
@pytest.mark.parity
def test_mp_ddp_with_gradient_accumulation_matches_single_process(baseline, tmp_path):
    recipe = make_recipe({"name": "layer_split"}, world_size=2, **TWO_DEVICES,
                         training={**BASE["training"], "grad_accumulation": 2})
    assert_matches(step_losses(recipe, tmp_path), baseline)


def _engine_on(devices, split_at=None):
    recipe = make_recipe({"name": "layer_split", "split_at": split_at}, **TWO_DEVICES)
    ctx = DistContext(0, 1, 0, 1, torch.device(devices[0]), "gloo", tuple(torch.device(d) for d in devices))
    from suite.train.rank import make_setup
    setup = make_setup(recipe, ctx)
    return layer_split.build(recipe.strategy, setup)


def test_every_hop_moves_activations_to_the_next_part():
    """Second part on meta: a block fed a cpu tensor would fail with a device mismatch."""
    engine = _engine_on(["cpu", "meta"], split_at=[2])
    blocks = list(engine.module)
    assert all(p.device.type == "cpu" for b in blocks[:2] for p in b.parameters())
    assert all(p.device.type == "meta" for b in blocks[2:] for p in b.parameters())
    out = engine.module(torch.randn(4, 1, 8, 8))
    assert out.device.type == "meta" and out.shape == (4, 10)


def test_a_missing_hop_is_caught_by_the_meta_device():
    engine = _engine_on(["cpu", "meta"], split_at=[2])
    engine.module.hops.pop(2)  # forget to move the activation into the second part
    with pytest.raises(RuntimeError, match="meta"):
        engine.module(torch.randn(4, 1, 8, 8))


def test_split_model_keeps_the_unsplit_state_dict_keys():
    engine = _engine_on(["cpu", "cpu"])
    from suite.models import build
    plain = build(make_recipe({"name": "single"}).model, make_recipe({"name": "single"}).data.spec())
    assert list(engine.state_dict()["model"]) == list(plain.state_dict())


@pytest.mark.parametrize("strategy, launch, fragment", [
    ({"name": "layer_split"}, {}, "launch.devices_per_task=1; set it to 2 or more"),
    ({"name": "layer_split", "split_at": [0]}, {"devices_per_task": 2}, "strategy.split_at=[0] must list"),
    ({"name": "layer_split", "split_at": [1, 2]}, {"devices_per_task": 2}, "strategy.split_at=[1, 2] must list 1"),
    ({"name": "layer_split"}, {"devices_per_task": 5}, "too few for 5 parts"),
])
def test_bad_settings_give_one_clear_line(strategy, launch, fragment):
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, launch=launch)
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_state_dict_resumes_exactly(world):
    recipe = make_recipe({"name": "layer_split"}, world_size=world, **TWO_DEVICES)
    for continued, resumed in run_ranks(continued_and_resumed, world, recipe):
        assert resumed == continued
