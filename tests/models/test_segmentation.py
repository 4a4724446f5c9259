"""Segmentation: UNet and SegNet build class maps, pixel accuracy and mean IoU are exact, the
splitting strategies refuse both models in one line, training matches the single-process
baseline, and a small UNet learns the synthetic shapes."""
import math

import pytest
import torch
import torch.nn.functional as F

from suite.data import DATASETS, DataSpec
from suite.common.errors import SuiteError
from suite.models import MODELS, build
from suite.models.task import Task
from suite.record.run_record import read_metrics, read_summary
from tests.parity import assert_matches, make_recipe, per_rank_batchnorm_losses, step_losses

SPEC = DataSpec("shapes", (3, 32, 32), 5)


@pytest.mark.parametrize("name, options, has_bn", [("unet", {"base_channels": 4, "depth": 3}, False),
                                                   ("segnet", {"base_channels": 4}, True)])
def test_models_output_class_maps_of_the_input_size(name, options, has_bn):
    model = build(MODELS[name][0](**options), SPEC)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 5, 32, 32)
    # The papers' defaults: UNet without batch norm, SegNet with it after every conv but the classifier.
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == (len(convs) - 1 if has_bn else 0)


@pytest.mark.parametrize("name, parameters", [("unet", 31_032_460), ("segnet", 29_449_932)])
def test_defaults_are_the_papers_networks(name, parameters):
    # UNet: 4 poolings, 64..1024 channels (~31M parameters); SegNet: VGG16's 13 convs mirrored (29.5M in the paper).
    with torch.device("meta"):
        model = build(MODELS[name][0](), DataSpec("x", (3, 64, 64), 12))
    assert sum(p.numel() for p in model.parameters()) == parameters


@pytest.mark.parametrize("name", ["unet", "segnet"])
def test_images_the_poolings_cannot_halve_are_refused(name):
    with pytest.raises(SuiteError, match=r"images need sides divisible by 8, but data shapes gives 20x20; .*model.depth"):
        build(MODELS[name][0](depth=3), DataSpec("shapes", (3, 20, 20), 3))


def _logits(predicted: torch.Tensor, classes: int) -> torch.Tensor:
    """Scores whose argmax over dim 1 is ``predicted`` (batch, H, W)."""
    return F.one_hot(predicted, classes).permute(0, 3, 1, 2).float()


def f32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


def test_pixel_accuracy_and_mean_iou_are_exact():
    task = Task("segmentation", num_classes=4)  # class 3 appears nowhere: left out of the mean
    target_a, predicted_a = torch.tensor([[[0, 0, 1], [1, 2, 2]]]), torch.tensor([[[0, 1, 1], [1, 2, 0]]])
    target_b = predicted_b = torch.zeros(1, 2, 3, dtype=torch.int64)  # all background, all right
    a = task.evaluate(_logits(predicted_a, 4), torch.zeros(1, 3, 2, 3), target_a)
    # Alone, a's IoUs are 1/3 (class 0), 2/3 (1) and 1/2 (2); its pixel accuracy 4/6.
    assert task.eval_results(a.tolist())["val_miou"] == (1 / 3 + 2 / 3 + 1 / 2) / 3
    assert a[1].item() == f32(4 / 6) and a[2].item() == 1  # per image, a fraction in float32
    # Two ranks' sums add before the ratio: class 0 becomes 7/9, not the mean of 1/3 and 1.
    b = task.evaluate(_logits(predicted_b, 4), torch.zeros(1, 3, 2, 3), target_b)
    total = (a + b).tolist()
    assert task.eval_results(total)["val_miou"] == (7 / 9 + 2 / 3 + 1 / 2) / 3
    assert total[1] / total[2] == (f32(4 / 6) + 1) / 2
    # Training steps score pixel accuracy the same way.
    both = torch.cat([predicted_a, predicted_b])
    assert task.correct(_logits(both, 4), torch.cat([target_a, target_b])).item() == f32(f32(4 / 6) + 1)


class _Predictions:
    """An engine whose 'model' is the identity: the inputs are the logits."""

    def __init__(self, task):
        self.task = task

    def eval_step(self, inputs, targets):
        return self.task.evaluate(inputs, inputs, targets)


def _evaluate_my_share():
    """One rank of two: rank 0 holds the image a of the test above, rank 1 the all-background b."""
    from suite.train import dist as suite_dist
    from suite.train.loop import StepLoop

    ctx = suite_dist.init("cpu")
    try:
        task = Task("segmentation", num_classes=4)
        if ctx.rank == 0:
            target, predicted = torch.tensor([[[0, 0, 1], [1, 2, 2]]]), torch.tensor([[[0, 1, 1], [1, 2, 0]]])
        else:
            target = predicted = torch.zeros(1, 2, 3, dtype=torch.int64)
        loop = StepLoop(ctx, _Predictions(task), None, None, 0, None, task)
        return loop._evaluate([(_logits(predicted, 4), target)])
    finally:
        suite_dist.close()


@pytest.mark.slow
def test_the_loop_sums_intersections_and_unions_over_ranks_before_the_mean():
    from tests.harness import run_ranks

    for result in run_ranks(_evaluate_my_share, 2):
        # Not the mean of the ranks' own mIoUs, (1/2 + 1) / 2 = 0.75.
        assert result["val_miou"] == (7 / 9 + 2 / 3 + 1 / 2) / 3
        assert result["val_accuracy"] == (f32(4 / 6) + 1) / 2


def test_other_tasks_evaluate_as_before():
    task = Task("classification")
    out = task.evaluate(torch.tensor([[2.0, 0.0], [0.0, 2.0]]), torch.zeros(2, 1), torch.tensor([0, 0]))
    assert task.eval_size == 3 and out.shape == (3,) and task.eval_results(out.tolist()) == {}


def test_shapes_are_deterministic_and_label_every_shape():
    a, _ = DATASETS["shapes"](size=[16, 16], n_train=32, n_val=8, seed=3).load()
    b, _ = DATASETS["shapes"](size=[16, 16], n_train=32, n_val=8, seed=3).load()
    assert torch.equal(a.tensors[0], b.tensors[0]) and torch.equal(a.tensors[1], b.tensors[1])
    assert a.tensors[0].shape == (32, 3, 16, 16) and a.tensors[1].dtype == torch.int64
    assert set(a.tensors[1].unique().tolist()) == {0, 1, 2}


SEG = {"data": {"name": "shapes", "size": [16, 16], "classes": 3, "n_train": 256, "n_val": 32},
       "optimizer": {"name": "adam", "lr": 0.01},
       "training": {"epochs": 1, "max_steps": 8, "batch_size": 16, "seed": 1, "log_every_steps": 4}}
UNET = {"name": "unet", "base_channels": 4, "depth": 2}
SEGNET = {"name": "segnet", "base_channels": 4, "depth": 3}


@pytest.mark.parametrize("strategy, launch, model", [
    ({"name": "pipeline"}, {}, UNET), ({"name": "ds_pipeline"}, {}, UNET),
    ({"name": "layer_split"}, {"devices_per_task": 2}, UNET), ({"name": "fairscale_pipe"}, {"devices_per_task": 2}, UNET),
    ({"name": "pipeline"}, {}, SEGNET), ({"name": "layer_split"}, {"devices_per_task": 2}, SEGNET)])
def test_splitting_strategies_refuse_skip_connections_in_one_line(strategy, launch, model):
    world = 1 if strategy["name"] in ("layer_split", "fairscale_pipe") else 2
    with pytest.raises(SuiteError) as err:
        make_recipe(strategy, world, model=model, launch=launch, **SEG)
    why = "skip connections" if model is UNET else "pooling indices of its encoder stage"
    assert f"strategy {strategy['name']} cannot split model.name={model['name']}" in str(err.value)
    assert why in str(err.value) and "use ddp, fsdp or zero" in str(err.value) and "\n" not in str(err.value)


def _run(tmp_path, name, strategy, world, model):
    recipe = make_recipe(strategy, world, model=model, **SEG)
    losses = step_losses(recipe, tmp_path / name)
    return losses, read_summary(tmp_path / name)["final"]


def _single(baseline_of, model):
    """``_run`` for single on one process, run once per session (tests/conftest.py's baseline_of)."""
    single = baseline_of(make_recipe({"name": "single"}, 1, model=model, **SEG))
    return single.losses, read_summary(single.run_dir)["final"]


@pytest.mark.slow
@pytest.mark.parametrize("model, strategy, world", [
    (UNET, {"name": "ddp"}, 2),  # UNet has no batch norm: data parallel must match exactly
    ({**SEGNET, "batch_norm": False}, {"name": "ddp"}, 2),  # SegNet's unpooling under DDP
    (SEGNET, {"name": "ddp"}, 2),  # with batch norm, synced over the ranks (training.sync_batchnorm)
    # FSDP2 at world size 1 still wraps each encoder block (tuple outputs: pooled maps and
    # indices) and decoder block (two inputs) in its hooks.
    (SEGNET, {"name": "fsdp"}, 1)])
@pytest.mark.parity
def test_training_matches_single_process(model, strategy, world, baseline_of, tmp_path):
    base, base_final = _single(baseline_of, model)
    losses, final = _run(tmp_path, strategy["name"], strategy, world, model)
    assert_matches(losses, base)
    # Evaluation of both ranks' halves of the validation set gives one process's numbers (after 8
    # steps the maps are still mostly background; the reduction itself: the loop test above).
    assert 0 < final["val_miou"] <= 1 and math.isclose(final["val_miou"], base_final["val_miou"], abs_tol=1e-9)
    assert math.isclose(final["val_loss"], base_final["val_loss"], abs_tol=1e-10)


@pytest.mark.slow
@pytest.mark.parity
def test_segnet_with_per_rank_batch_norm_under_ddp_computes_per_rank_statistics(baseline_of, tmp_path):
    """Unsynced (training.sync_batchnorm: false), DDP normalises with each rank's statistics:
    shown by computing what that must equal (tests/parity.py), and how far it is from single."""
    base, _ = _single(baseline_of, SEGNET)
    recipe = make_recipe({"name": "ddp"}, 2, model=SEGNET, **{**SEG, "training": {**SEG["training"], "sync_batchnorm": False}})
    expected = per_rank_batchnorm_losses(recipe)
    assert_matches(step_losses(recipe, tmp_path / "ddp"), expected)
    assert max(abs(a - b) for a, b in zip(expected, base)) > 1e-3


@pytest.mark.slow
def test_unet_learns_the_shapes(tmp_path):
    # float32, as users train: learning needs no float64 (the parity tests' precision); a U-Net's
    # convolutions in float64 took 29 s for these 120 steps, in float32 3 s.
    recipe = make_recipe({"name": "single"}, 1, "fp32", model={"name": "unet", "base_channels": 8, "depth": 3},
                         data={"name": "shapes", "size": [32, 32], "classes": 3, "n_train": 2048, "n_val": 64},
                         optimizer={"name": "adam", "lr": 0.003},
                         training={"epochs": 1, "max_steps": 120, "batch_size": 16, "seed": 0, "log_every_steps": 40})
    losses = step_losses(recipe, tmp_path)
    final = read_summary(tmp_path)["final"]
    last = sum(losses[-20:]) / 20
    print(f"unet on shapes: first loss {losses[0]:.3f}, mean of the last 20 {last:.3f}, final {final}")
    # Chance is ln(3) = 1.10; always answering "background" (~78% of pixels) gives ~0.68.
    assert last < 0.25 * math.log(3), (losses[0], last)
    assert final["val_accuracy"] > 0.9 and final["val_miou"] > 0.7, final
    assert any("val_miou" in e for e in read_metrics(tmp_path, kind="epoch"))
