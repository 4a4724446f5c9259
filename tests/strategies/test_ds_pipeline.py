"""DeepSpeed's pipeline engine (2 stages x 4 micro-batches) trains exactly like the unsplit model
in one process, alone and replicated over data-parallel ranks."""
import subprocess
import sys
from pathlib import Path

import pytest

from suite.common.errors import SuiteError
from suite.planner.memory import parameter_count
from suite.strategies import _deepspeed
from suite.record.run_record import read_json, read_metrics
from tests.harness import run_ranks
from tests import parity
from tests.parity import BASE, FP32_TOLERANCE, step_losses
from tests.roundtrip import continued_and_resumed

_deepspeed.preload()  # once here, not once per forked rank


# DeepSpeed keeps float32 master weights, so nothing here can run float64 (tests/parity.py):
# every run, single's too, is fp32, compared at the float32 tolerance on this small MLP, which
# holds under every CPU kernel set (tests/run_kernel_sets.sh runs these files under each).
def make_recipe(strategy: dict, world_size: int = 1, **sections):
    return parity.make_recipe(strategy, world_size, precision="fp32", **sections)


def assert_matches(losses, baseline, tolerance: float = FP32_TOLERANCE):
    parity.assert_matches(losses, baseline, tolerance)

REPO = Path(__file__).resolve().parents[2]
PIPE = {"name": "ds_pipeline", "stages": 2, "micro_batches": 4}
VGG = {"model": {"name": "vgg11", "width": 0.125, "classifier_hidden": 32},
       "data": {"name": "synthetic", "shape": [3, 32, 32], "classes": 10, "n_train": 256, "n_val": 32},
       "training": {**BASE["training"], "max_steps": 6, "batch_size": 16},
       "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}}  # learns within 6 steps


@pytest.fixture
def baseline(baseline_of):
    single = baseline_of(make_recipe({"name": "single"}))
    return single.losses, single.summary


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [PIPE, {**PIPE, "partition": "uniform"}, {**PIPE, "zero_stage": 1}],
                         ids=["parameters", "uniform", "zero1"])
@pytest.mark.parity
def test_two_stages_four_micro_batches_match_single_process(strategy, baseline, tmp_path):
    assert_matches(step_losses(make_recipe(strategy, world_size=2), tmp_path), baseline[0])


@pytest.mark.slow
def test_only_the_last_stage_reports_the_loss_and_evaluation_matches(baseline, tmp_path):
    step_losses(make_recipe(PIPE, world_size=2), tmp_path)
    first, last = read_metrics(tmp_path, kind="step", rank=0), read_metrics(tmp_path, kind="step", rank=1)
    assert all(s["loss"] is None and s["samples"] == 0 for s in first)
    assert all(s["samples"] == BASE["training"]["batch_size"] for s in last)
    mine, single = read_json(tmp_path / "summary.json")["final"], baseline[1]["final"]
    for key in ("val_loss", "val_accuracy", "train_accuracy"):
        assert abs(mine[key] - single[key]) <= 1e-5, (key, mine, single)


@pytest.mark.slow
def test_each_stage_holds_only_its_own_blocks(tmp_path):
    recipe = make_recipe(PIPE, world_size=2)
    step_losses(recipe, tmp_path)
    ranks = [r["held_bytes"] for r in read_json(tmp_path / "summary.json")["ranks"]]
    total = 4 * parameter_count(recipe)
    assert all(0 < r["parameters"] < total for r in ranks)
    for key in ("parameters", "gradients", "optimizer_state"):  # SGD momentum: one state per parameter
        assert sum(r[key] for r in ranks) == total, (key, ranks)


@pytest.mark.slow
@pytest.mark.parity
def test_vgg11_split_in_two_matches_single_process(baseline_of, tmp_path_factory):
    single = baseline_of(make_recipe({"name": "single"}, **VGG)).losses
    piped = step_losses(make_recipe(PIPE, world_size=2, **VGG), tmp_path_factory.mktemp("pipe-vgg"))
    assert_matches(piped, single)


@pytest.mark.slow
@pytest.mark.parity
def test_two_stages_times_two_data_parallel_matches_single_process(baseline, tmp_path):
    recipe = make_recipe({**PIPE, "micro_batches": 2, "zero_stage": 1}, world_size=4)
    assert recipe.layout().dp_size == 2
    assert_matches(step_losses(recipe, tmp_path), baseline[0])


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage", [0, 1])
def test_state_dict_resumes_exactly(zero_stage):
    recipe = make_recipe({**PIPE, "zero_stage": zero_stage}, world_size=2)
    (_, _), (continued, resumed) = run_ranks(continued_and_resumed, 2, recipe)  # rank 1: the loss stage
    assert resumed == continued and None not in resumed


@pytest.mark.parametrize("strategy, changes, message", [
    ({**PIPE, "zero_stage": 3}, {}, r"zero_stage=3: DeepSpeed's pipeline engine takes ZeRO stage 0 or 1 only"),
    ({**PIPE, "zero_stage": 2}, {}, r"zero_stage=2"),
    ({**PIPE, "micro_batches": 5}, {}, r"strategy\.micro_batches=5 must divide the batch of each data-parallel rank"),
    ({**PIPE, "stages": 3}, {}, r"strategy\.stages=3 .* does not fit world size 2"),
    (PIPE, {"training": {**BASE["training"], "grad_accumulation": 2}}, r"training\.grad_accumulation=2"),
    ({**PIPE, "config": {"pipline": {}}}, {}, r"unknown recipe key strategy\.config\.pipline"),
])
def test_bad_recipes_are_one_clear_line(strategy, changes, message):
    with pytest.raises(SuiteError, match=message) as err:
        make_recipe(strategy, world_size=2, **changes)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_dry_run_refuses_pipeline_with_zero3_with_exit_code_2_and_one_line():
    done = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/ds_pipeline_mlp.yaml",
                           "strategy.zero_stage=3", "--dry-run"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "zero_stage=3" in done.stderr, done.stderr
