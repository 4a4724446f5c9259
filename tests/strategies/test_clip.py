"""training.grad_clip_norm: every strategy clips by the norm of the WHOLE model's gradients, as
torch.nn.utils.clip_grad_norm_ does in one process. The clip binds at every step (the pre-clip
norms of this recipe are 0.42-0.67), so a strategy that norms only its shard, its stage, or
counts a replica twice scales its gradients differently and its losses leave single's."""
from pathlib import Path

import pytest

from suite.common.errors import SuiteError
from suite.record.run_record import read_json, read_metrics
from suite.strategies import _deepspeed
from tests.parity import BASE, FP32_TOLERANCE, TWO_DEVICES, assert_matches, make_recipe, step_losses, tolerance

_deepspeed.preload()  # once here, not once per forked rank

CLIP = 0.3


def clipped(clip=CLIP, **changes) -> dict:
    return {"training": {**BASE["training"], "grad_clip_norm": clip, **changes}}


def grad_norms(run_dir: Path) -> list:
    """Per-step grad_norm as rank 0 records it."""
    steps = sorted(read_metrics(run_dir, kind="step", rank=0), key=lambda s: s["step"])
    return [s.get("grad_norm") for s in steps]


def run(strategy: dict, run_dir: Path, world_size: int = 1, precision=None, **sections):
    """(per-step global losses, per-step grad_norm as rank 0 records it)."""
    losses = step_losses(make_recipe(strategy, world_size=world_size, precision=precision, **sections), run_dir)
    return losses, grad_norms(run_dir)


def run_single(baseline_of, precision=None, **sections):
    """``run`` for single on one process, run once per session (tests/conftest.py's baseline_of)."""
    single = baseline_of(make_recipe({"name": "single"}, precision=precision, **sections))
    return single.losses, grad_norms(single.run_dir)


@pytest.fixture
def singles(baseline_of):
    """Clipped single in a precision (fp64; fp32 for strategies that cannot train in float64),
    each run once."""
    def get(precision: str, **changes):
        return run_single(baseline_of, precision, **clipped(**changes))
    return get


@pytest.fixture
def single(singles):
    return singles("fp64")


def check_against_single(strategy, world_size, run_dir, singles, sections=None, **changes):
    """The clipped strategy's losses and pre-clip norms against clipped single's, in the
    precision the strategy trains in."""
    recipe = make_recipe(strategy, world_size=world_size, **(sections or {}), **clipped(**changes))
    losses, norms = run(strategy, run_dir, world_size, precision=recipe.training.precision, **(sections or {}),
                        **clipped(**changes))
    base_losses, base_norms = singles(recipe.training.precision, **changes)
    assert_matches(losses, base_losses, tolerance(recipe))
    assert_norms_match(norms, base_norms, tolerance(recipe))


@pytest.mark.slow
def test_the_clip_binds_and_the_norm_is_recorded(single, baseline_of):
    losses, norms = single
    unclipped, none = run_single(baseline_of)
    assert none == [None] * len(none)  # the default path records no norm
    assert all(n > CLIP for n in norms), norms  # binds at every step
    assert max(abs(a - b) for a, b in zip(losses, unclipped)) > 100 * FP32_TOLERANCE, (losses, unclipped)
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_a_clip_above_every_norm_changes_nothing(single, baseline_of, tmp_path):
    loose, norms = run({"name": "single"}, tmp_path, **clipped(clip=10.0))
    unclipped, _ = run_single(baseline_of)
    assert loose == unclipped and all(n < 10.0 for n in norms)


PIPE = {"name": "pipeline", "stages": 2, "micro_batches": 4}
DS_PIPE = {"name": "ds_pipeline", "stages": 2, "micro_batches": 4}
CASES = {  # id: (strategy, world size, extra sections)
    "ddp": ({"name": "ddp"}, 2, {}),
    "allreduce": ({"name": "allreduce"}, 2, {}),
    "fsdp": ({"name": "fsdp"}, 2, {}),
    "fsdp-grad_op": ({"name": "fsdp", "reshard_after_forward": False}, 2, {}),
    "fsdp1": ({"name": "fsdp1"}, 2, {}),
    "tensor": ({"name": "tensor"}, 2, {}),
    "layer_split": ({"name": "layer_split"}, 1, TWO_DEVICES),
    "layer_split-ddp": ({"name": "layer_split"}, 2, TWO_DEVICES),
    "pipeline": (PIPE, 2, {}),
    "pipeline-1f1b": ({**PIPE, "schedule": "1f1b"}, 2, {}),
    "oss": ({"name": "oss"}, 2, {}),
    "oss-sharded_ddp": ({"name": "oss", "gradients": "sharded_ddp"}, 2, {}),
    "fairscale_pipe": ({"name": "fairscale_pipe", "micro_batches": 4}, 1, TWO_DEVICES),
    "zero0": ({"name": "zero", "stage": 0}, 2, {}),
    "zero1": ({"name": "zero", "stage": 1}, 2, {}),
    "zero2": ({"name": "zero", "stage": 2}, 2, {}),
    "zero3": ({"name": "zero", "stage": 3}, 2, {}),
    "ds_pipeline": (DS_PIPE, 2, {}),
    "ds_pipeline-zero1": ({**DS_PIPE, "zero_stage": 1}, 2, {}),
}


def assert_norms_match(norms, baseline_norms, tolerance: float):
    assert None not in norms, norms
    worst = max(abs(a - b) for a, b in zip(norms, baseline_norms))
    assert worst <= tolerance, f"pre-clip norms differ from single's by up to {worst:.3g}:\n{norms}\n{baseline_norms}"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parity
def test_clipped_strategy_matches_clipped_single(case, singles, tmp_path):
    strategy, world_size, sections = CASES[case]
    check_against_single(strategy, world_size, tmp_path, singles, sections)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["pipeline-dp2", "ds_pipeline-dp2", "fsdp-hsdp", "tensor-dp2"])
@pytest.mark.parity
def test_four_ranks_count_replicas_once(case, singles, tmp_path):
    """Data-parallel replicas of a stage, a shard or a tensor-parallel group hold the same
    gradients: summed into the norm, they would make it too large."""
    strategy = {"pipeline-dp2": {**PIPE, "dp": 2}, "ds_pipeline-dp2": {**DS_PIPE, "micro_batches": 2},
                "fsdp-hsdp": {"name": "fsdp", "replicate": 2}, "tensor-dp2": {"name": "tensor", "dp": 2}}[case]
    check_against_single(strategy, 4, tmp_path, singles)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ddp", "fsdp", "zero"])
@pytest.mark.parity
def test_clipping_after_gradient_accumulation(name, singles, tmp_path):
    """The clip sees the accumulated, reduced gradient of the whole step, not a micro-batch's."""
    check_against_single({"name": name}, 2, tmp_path, singles, grad_accumulation=2)


def bf16(**changes) -> dict:
    return clipped(precision="bf16", **changes)


@pytest.fixture
def bf16_single(baseline_of):
    return run_single(baseline_of, **bf16())


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ds_pipeline", "zero0"])
def test_deepspeed_bf16_clips_by_the_whole_models_norm(case, bf16_single, tmp_path):
    """In bf16 DeepSpeed's own optimizer wrapper clips (not the suite): its norm must still cover
    both pipeline stages. bf16 cannot match to 1e-5 (DeepSpeed keeps the module in bf16, single
    autocasts); measured: norms within 0.7% and losses within 3e-4 of single's over 8 steps
    (DeepSpeed's fp32 clip, which norms the first stage only, left them by 0.14)."""
    strategy = DS_PIPE if case == "ds_pipeline" else {"name": "zero", "stage": 0}
    losses, norms = run(strategy, tmp_path, 2, **bf16())
    assert max(abs(a - b) for a, b in zip(losses, bf16_single[0])) < 1e-3, (losses, bf16_single[0])
    assert all(abs(a - b) < 0.01 * b for a, b in zip(norms, bf16_single[1])), (norms, bf16_single[1])


@pytest.mark.slow
def test_deepspeed_clips_with_the_recipe_value(tmp_path):
    run({"name": "zero"}, tmp_path, 2, **clipped())
    assert read_json(tmp_path / "deepspeed_config.json")["gradient_clipping"] == CLIP


@pytest.mark.parametrize("value, message", [
    (0, "training.grad_clip_norm=0: input should be greater than 0"),
    (-1.5, "training.grad_clip_norm=-1.5: input should be greater than 0"),
    ("big", "training.grad_clip_norm='big': input should be a valid number"),
])
def test_bad_values_are_refused_naming_the_key(value, message):
    with pytest.raises(SuiteError, match=message.replace("(", r"\(")) as err:
        make_recipe({"name": "single"}, **clipped(clip=value))
    assert "\n" not in str(err.value)


def test_deepspeed_config_cannot_set_clipping_behind_the_recipe():
    with pytest.raises(SuiteError, match="strategy.config.gradient_clipping is set from the recipe; use "
                                         "training.grad_clip_norm"):
        make_recipe({"name": "zero", "config": {"gradient_clipping": 1.0}}, world_size=2)


def test_the_fingerprint_counts_the_clip_only_when_set():
    """Recipes without the key keep the fingerprint of the runs recorded before it existed."""
    plain = make_recipe({"name": "single"}).fingerprint()
    assert make_recipe({"name": "single"}, **clipped()).fingerprint() != plain
    assert make_recipe({"name": "single"}, **clipped(clip=None)).fingerprint() == plain
