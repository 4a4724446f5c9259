"""Pipeline parallelism (torch.distributed.pipelining) trains exactly like one process: GPipe and
1F1B with 2 stages x 4 micro-batches, VGG11 and the MLP, and data x pipeline on a 2x2 mesh."""
import json
import os
import subprocess
import sys

import pytest

from suite.common.errors import SuiteError
from suite.strategies.pipeline import bubble_formula
from suite.strategies.splitting import balanced_split
from tests.harness import run_ranks
from tests.parity import BASE, assert_matches, make_recipe, step_losses
from tests.roundtrip import continued_and_resumed

VGG = {"model": {"name": "vgg11", "width": 0.125, "classifier_hidden": 32},
       "data": {"name": "synthetic", "shape": [3, 32, 32], "classes": 10, "n_train": 256, "n_val": 32},
       "training": {**BASE["training"], "max_steps": 6, "batch_size": 16},
       "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}}


def final(run_dir, key):
    return json.loads((run_dir / "summary.json").read_text())["final"][key]


@pytest.fixture
def baseline_dir(baseline_of):
    return baseline_of(make_recipe({"name": "single"})).run_dir


@pytest.fixture
def vgg_baseline(baseline_of):
    return baseline_of(make_recipe({"name": "single"}, **VGG)).losses


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parity
def test_mlp_pipeline_matches_single_process(schedule, baseline, baseline_dir, tmp_path):
    recipe = make_recipe({"name": "pipeline", "schedule": schedule, "micro_batches": 4}, world_size=2)
    assert_matches(step_losses(recipe, tmp_path), baseline)
    # Evaluation sends whole batches between the stages: the same validation loss too.
    assert abs(final(tmp_path, "val_loss") - final(baseline_dir, "val_loss")) <= 1e-5


@pytest.mark.slow
def test_autoencoder_pipeline_scores_against_the_input(baseline_of, tmp_path_factory):
    sections = {"model": {"name": "autoencoder", "base_channels": 4},
                "data": {"name": "digits", "limit_val": 64},  # real 8x8 images: learnable
                "optimizer": {"name": "adam", "lr": 0.01}}
    baseline = baseline_of(make_recipe({"name": "single"}, **sections)).losses
    recipe = make_recipe({"name": "pipeline", "schedule": "1f1b"}, world_size=2, **sections)
    assert_matches(step_losses(recipe, tmp_path_factory.mktemp("ae-pipeline")), baseline)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parity
def test_vgg11_pipeline_matches_single_process(schedule, vgg_baseline, tmp_path):
    recipe = make_recipe({"name": "pipeline", "schedule": schedule, "micro_batches": 4}, world_size=2, **VGG)
    assert_matches(step_losses(recipe, tmp_path), vgg_baseline)


@pytest.mark.slow
def test_split_points_from_the_recipe_match_too(baseline, tmp_path):
    recipe = make_recipe({"name": "pipeline", "split_at": [3]}, world_size=2)
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
@pytest.mark.parametrize("dp_mode", ["fully_shard", "replicate"])
@pytest.mark.parity
def test_data_x_pipeline_on_a_2x2_mesh_matches_single_process(dp_mode, baseline, tmp_path):
    recipe = make_recipe({"name": "pipeline", "dp": 2, "stages": 2, "dp_mode": dp_mode}, world_size=4)
    assert recipe.layout().dp_size == 2
    assert_matches(step_losses(recipe, tmp_path), baseline)


@pytest.mark.slow
def test_each_stage_records_its_measured_bubble_next_to_the_formula(tmp_path):
    recipe = make_recipe({"name": "pipeline", "micro_batches": 4}, world_size=2, precision="fp32")  # 4-byte parameters
    step_losses(recipe, tmp_path)
    ranks = json.loads((tmp_path / "summary.json").read_text())["ranks"]
    for rank in ranks:
        m = rank["strategy_metrics"]
        assert m["stage"] == rank["rank"] and m["stages"] == 2 and m["micro_batches"] == 4
        assert m["bubble_fraction_formula"] == pytest.approx(1 / 5)
        assert 0.0 <= m["bubble_fraction"] < 1.0 and m["stage_busy_s"] > 0
    # Each stage holds its own blocks only: [64-32-32-10] splits 2080 | 1056 + 330 parameters.
    assert [r["held_bytes"]["parameters"] for r in ranks] == [2080 * 4, 1386 * 4]


def test_the_textbook_bubble():
    assert bubble_formula(2, 4) == pytest.approx(0.2)
    assert bubble_formula(4, 1) == pytest.approx(0.75)


def test_balanced_split_minimises_the_largest_stage():
    assert balanced_split([1, 1, 1, 1], 2) == [2]
    assert balanced_split([0, 100, 10, 10, 80], 2) == [2]  # 100 | 100
    assert balanced_split([5, 5, 5, 5, 5, 5], 3) == [2, 4]


def test_every_balanced_stage_holds_parameters():
    """An MLP [Flatten, Linear, ReLU, Linear, ReLU, Linear] in 4 stages: the smallest largest part
    alone would leave a stage of a ReLU, whose optimizer gets an empty parameter list (it was run
    so: rank 0 failed at the first step)."""
    counts = [0, 401920, 0, 262656, 0, 5130]
    starts = balanced_split(counts, 3)
    bounds = [0, *starts, len(counts)]
    assert all(sum(counts[a:b]) for a, b in zip(bounds, bounds[1:])), starts
    assert balanced_split([0, 10, 0, 10, 0, 10, 0], 3) == [2, 4]


@pytest.mark.parametrize("strategy, world, fragment", [
    ({"name": "pipeline", "dp": 3}, 4, "strategy.dp=3 x strategy.stages=? does not fit world size 4"),
    ({"name": "pipeline", "stages": 3}, 4, "strategy.dp=? x strategy.stages=3 does not fit world size 4"),
    ({"name": "pipeline", "dp": 2, "stages": 1}, 2, "strategy pipeline needs strategy.stages >= 2"),
    ({"name": "pipeline", "micro_batches": 5}, 2, "strategy.micro_batches=5 must divide"),
    ({"name": "pipeline", "split_at": [9]}, 2, "strategy.split_at=[9] must list 1 increasing block indices"),
    ({"name": "pipeline", "stages": 8}, 8, "too few for 8 parts"),
    ({"name": "pipeline", "split_at": [1]}, 2, "strategy.split_at: part 0 (blocks 0-0) holds no parameters"),
])
def test_bad_degrees_give_one_clear_line(strategy, world, fragment):
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, world_size=world)
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_the_comparison_catches_unscaled_micro_batch_gradients(baseline, tmp_path, monkeypatch):
    """Break the pipeline on purpose (gradients summed over micro-batches, not averaged)."""
    from torch.distributed.pipelining import ScheduleGPipe

    init = ScheduleGPipe.__init__
    monkeypatch.setattr(ScheduleGPipe, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "scale_grads": False}))
    losses = step_losses(make_recipe({"name": "pipeline"}, world_size=2), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline)


@pytest.mark.slow
def test_the_gpipe_vgg_recipe_runs_end_to_end_through_submit(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/gpipe_vgg.yaml", "--out", str(tmp_path),
                           "training.max_steps=6", "tracking.wandb=disabled"],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "WANDB_MODE": "disabled"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["strategy"], summary["world_size"], summary["steps"]) == \
        ("completed", "pipeline", 2, 6)
    assert [r["strategy_metrics"]["stage"] for r in summary["ranks"]] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_state_dict_resumes_exactly(schedule):
    recipe = make_recipe({"name": "pipeline", "schedule": schedule}, world_size=2)
    (_, _), (continued, resumed) = run_ranks(continued_and_resumed, 2, recipe)  # rank 1: the loss stage
    assert resumed == continued and None not in resumed
