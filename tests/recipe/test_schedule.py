"""Learning-rate schedules: the lr of each step equals the closed form; every strategy steps with
it (per-step losses equal single's under a step schedule, which itself trains differently from a
constant lr); the run record (and W&B, from it) has each step's lr; a run resumed mid-schedule
continues with the same lrs and losses; bad schedule keys are one line."""
import math

import pytest

from suite import recipe as recipes
from suite.recipe.schedule import Schedule, lr_at
from suite.record.run_record import read_metrics
from suite.strategies import _deepspeed
from tests.harness import run_ranks
from tests.parity import BASE, FP32_TOLERANCE, assert_matches, make_recipe, step_losses, tolerance
from tests.recipe.test_recipe_errors import assert_one_line, run_cli
from tests.train.test_resume import crash_at_step_7_then_resume, run_until_stopped

_deepspeed.preload()  # once here, not once per forked rank

# 8 steps: warm-up over 2, halved every 3 steps (the decays at steps 3 and 6 fall inside the run).
STEP = {"name": "step", "warmup_steps": 2, "step_size_steps": 3, "gamma": 0.5}
STEP_LRS = [0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05]  # lr 0.2: x 1/2, x 2/2, then x 0.5 per 3 steps


def scheduled(schedule=STEP):
    return {**BASE["optimizer"], "schedule": schedule}


@pytest.mark.parametrize("schedule, steps_per_epoch, total, expected", [
    ({}, 4, 8, {0: 0.2, 7: 0.2}),
    (STEP, 4, 8, dict(enumerate(STEP_LRS))),
    # every 2 epochs of 4 steps, default gamma 0.1, warm-up 4: step 0 = 0.2 x 1/4
    ({"name": "step", "step_size_epochs": 2, "warmup_steps": 4}, 4, 20,
     {0: 0.05, 3: 0.2, 7: 0.2, 8: 0.02, 15: 0.02, 16: 0.002}),
    ({"name": "step", "milestones_epochs": [1, 3], "gamma": 0.5}, 10, 50, {9: 0.2, 10: 0.1, 29: 0.1, 30: 0.05, 49: 0.05}),
    ({"name": "step", "milestones_steps": [5]}, 10, 50, {4: 0.2, 5: 0.02}),
    # cosine after a warm-up of 2 over 12 steps: steps 2..11 span the half wave, ending at min_lr
    ({"name": "cosine", "warmup_steps": 2, "min_lr": 0.02}, 4, 12,
     {0: 0.1, 1: 0.2, 2: 0.2, 11: 0.02, 3: 0.02 + 0.18 * (1 + math.cos(math.pi / 9)) / 2,
      5: 0.02 + 0.18 * (1 + math.cos(math.pi / 3)) / 2}),
    ({"name": "cosine"}, 5, 5, {0: 0.2, 2: 0.1, 4: 0.0}),
])
def test_lr_at_chosen_steps_equals_the_closed_form(schedule, steps_per_epoch, total, expected):
    s = Schedule(**schedule)
    s.check(0.2)
    for step, lr in expected.items():
        assert lr_at(s, 0.2, step, steps_per_epoch, total) == pytest.approx(lr, rel=1e-12, abs=1e-15), step


@pytest.fixture
def baseline(baseline_of):
    """single with the step schedule: losses, and each step's lr as recorded."""
    single = baseline_of(make_recipe({"name": "single"}, optimizer=scheduled()))
    return single.losses, single.run_dir


@pytest.fixture
def baseline_fp32(baseline_of):
    """The same in float32, for DeepSpeed, which cannot train in float64."""
    single = baseline_of(make_recipe({"name": "single"}, optimizer=scheduled(), precision="fp32"))
    return single.losses, single.run_dir


@pytest.mark.slow
def test_the_schedule_changes_training_and_its_lr_is_recorded(baseline, baseline_of):
    """Without this, parity under a schedule could hold with the lr never applied anywhere."""
    constant = baseline_of(make_recipe({"name": "single"})).losses
    losses, run_dir = baseline
    assert max(abs(a - b) for a, b in zip(losses, constant)) > 100 * FP32_TOLERANCE
    steps = sorted(read_metrics(run_dir, kind="step", rank=0), key=lambda r: r["step"])
    assert [r["lr"] for r in steps] == pytest.approx(STEP_LRS, rel=1e-12)


@pytest.mark.slow
def test_wandb_export_carries_the_lr(baseline, monkeypatch):
    from analysis import wandb_runs
    from suite.record import wandb_export

    monkeypatch.delenv("WANDB_MODE", raising=False)
    _, run_dir = baseline
    assert wandb_export.export_run(run_dir, "offline") is None
    (written,) = wandb_runs.run_dirs(run_dir)
    rows = wandb_runs.step_metrics(wandb_runs.read(written))
    assert [r["lr"] for r in rows] == pytest.approx(STEP_LRS, rel=1e-12)


TWO_DEVICES = {"devices_per_task": 2}


@pytest.mark.slow
@pytest.mark.parametrize("strategy, world, launch", [
    ({"name": "ddp"}, 2, {}),
    ({"name": "allreduce"}, 2, {}),
    ({"name": "zero", "stage": 2}, 2, {}),  # DeepSpeed wraps the optimizer: its step must see the new lr
    ({"name": "zero", "stage": 1}, 2, {}),
    ({"name": "fsdp"}, 2, {}),
    ({"name": "fsdp1"}, 2, {}),
    ({"name": "oss"}, 2, {}),  # fairscale OSS copies its own groups' lr into its shard's optimizer each step
    ({"name": "tensor"}, 2, {}),
    ({"name": "pipeline", "schedule": "1f1b", "micro_batches": 4}, 2, {}),
    ({"name": "ds_pipeline", "stages": 2, "micro_batches": 4}, 2, {}),  # DeepSpeed steps inside train_batch
    ({"name": "layer_split"}, 1, TWO_DEVICES),
    ({"name": "fairscale_pipe", "micro_batches": 4}, 1, TWO_DEVICES),
], ids=["ddp", "allreduce", "zero2", "zero1", "fsdp", "fsdp1", "oss", "tensor", "pipeline", "ds_pipeline",
        "layer_split", "fairscale_pipe"])
def test_a_step_schedule_matches_single_process(strategy, world, launch, baseline, baseline_fp32, tmp_path):
    recipe = make_recipe(strategy, world_size=world, optimizer=scheduled(), launch=launch)
    single = baseline if recipe.training.precision == "fp64" else baseline_fp32  # DeepSpeed: fp32
    assert_matches(step_losses(recipe, tmp_path), single[0], tolerance(recipe))


@pytest.mark.slow
def test_the_comparison_catches_an_lr_that_does_not_reach_deepspeeds_optimizer(baseline_fp32, tmp_path, monkeypatch):
    monkeypatch.setattr(_deepspeed.DeepSpeedEngine, "set_lr", lambda self, lr: None)
    losses = step_losses(make_recipe({"name": "zero", "stage": 2}, world_size=2, optimizer=scheduled()), tmp_path)
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline_fp32[0], FP32_TOLERANCE)


@pytest.mark.slow
def test_a_run_resumed_mid_schedule_continues_the_same_lrs_and_losses(tmp_path, monkeypatch):
    """Checkpoint at step 4 in the warm-up (6 steps), crash at 7, resume: the step decay counted
    in epochs (8 steps each) falls after the resume."""
    recipe = make_recipe({"name": "ddp"}, world_size=2, optimizer=scheduled(
        {"name": "step", "warmup_steps": 6, "step_size_epochs": 1, "gamma": 0.5}),
        training={"epochs": 2, "batch_size": 32, "seed": 1, "log_every_steps": 2, "checkpoint_every_steps": 4},
        data={"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 256, "n_val": 64})
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir()
    cut.mkdir()
    assert run_ranks(run_until_stopped, 2, recipe, whole) == ["completed"] * 2
    crash_at_step_7_then_resume(recipe, cut, monkeypatch, match="raised")

    def by_step(run_dir):
        latest = {r["step"]: (r["lr"], r["global_loss"]) for r in read_metrics(run_dir, kind="step", rank=0)}
        return [latest[k] for k in sorted(latest)]

    expected, resumed = by_step(whole), by_step(cut)
    assert len(expected) == 16
    assert [lr for lr, _ in expected] == pytest.approx([0.2 * (s + 1) / 6 for s in range(6)] + [0.2] * 2 + [0.1] * 8)
    assert resumed == expected  # exactly: the lr is a function of the step, the rest is checkpointed


@pytest.mark.parametrize("args, expected", [
    (["optimizer.schedule.name=warmup"], "optimizer.schedule.name='warmup': input should be 'constant', 'step' or 'cosine'"),
    (["optimizer.schedule.gama=0.5"], "unknown recipe key optimizer.schedule.gama; accepted here: gamma, milestones_epochs"),
    (["optimizer.schedule.name=step"], "optimizer.schedule.name=step needs exactly one of step_size_epochs"),
    (["optimizer.schedule={name: step, step_size_epochs: 2, milestones_epochs: [3]}"],
     "but the recipe sets step_size_epochs and milestones_epochs"),
    (["optimizer.schedule={name: step, milestones_epochs: [6, 3]}"], "optimizer.schedule.milestones_epochs=[6, 3] must be increasing"),
    (["optimizer.schedule={name: cosine, gamma: 0.5}"], "optimizer.schedule.gamma=0.5 applies to schedule step only"),
    (["optimizer.schedule={name: cosine, min_lr: 1.0}"], "optimizer.schedule.min_lr=1.0 must be below optimizer.lr"),
    (["optimizer.schedule={name: step, step_size_steps: 2, gamma: 1.5}"], "optimizer.schedule.gamma=1.5: input should be less than or equal to 1"),
    (["optimizer.schedule.warmup_steps=-1"], "optimizer.schedule.warmup_steps=-1"),
    (["strategy={name: zero, config: {scheduler: {type: WarmupLR}}}"], "strategy.config.scheduler is set from the recipe; use optimizer.schedule"),
])
def test_bad_schedule_keys_are_one_line(capsys, args, expected):
    code, err = run_cli(capsys, *args)
    assert_one_line(code, err)
    assert expected in err, err


def test_resolved_recipe_with_a_schedule_loads_again():
    """recipe.yaml in a run folder is the resolved recipe: it must validate as it was written."""
    import yaml

    recipe = make_recipe({"name": "single"}, optimizer=scheduled())
    again = recipes.validate(yaml.safe_load(recipes.dump(recipe)))
    assert again.optimizer.schedule == recipe.optimizer.schedule


def test_the_fingerprint_counts_a_schedule_or_augmentation_only_when_used():
    """Recipes that leave the new keys at their defaults keep the fingerprint of their earlier runs
    (analysis groups repeats by it); using them makes a different experiment."""
    plain = make_recipe({"name": "single"}).fingerprint()
    assert make_recipe({"name": "single"}, optimizer=scheduled({}),
                       data={**BASE["data"], "augment": {}, "normalize": False}).fingerprint() == plain
    assert make_recipe({"name": "single"}, optimizer=scheduled()).fingerprint() != plain
    assert make_recipe({"name": "single"}, data={**BASE["data"], "augment": {"hflip": True}}).fingerprint() != plain
