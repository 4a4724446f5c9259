"""DeepSpeed ZeRO at world size 2 trains exactly like one process, and each rank holds the share
of parameters, gradients and optimizer state its stage promises (measured, not assumed)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.planner.memory import parameter_count, predicted_held_bytes
from suite.strategies import _deepspeed
from suite.record.run_record import read_json
from tests.harness import run_ranks
from tests import parity
from tests.parity import BASE, FP32_TOLERANCE, step_losses
from tests.roundtrip import continued_and_resumed

_deepspeed.preload()  # once here, not once per forked rank (~7 s each)


# DeepSpeed keeps float32 master weights, so nothing here can run float64 (tests/parity.py):
# every run, single's too, is fp32, compared at the float32 tolerance on this small MLP, which
# holds under every CPU kernel set (tests/run_kernel_sets.sh runs these files under each).
def make_recipe(strategy: dict, world_size: int = 1, **sections):
    return parity.make_recipe(strategy, world_size, precision="fp32", **sections)


def assert_matches(losses, baseline, tolerance: float = FP32_TOLERANCE):
    parity.assert_matches(losses, baseline, tolerance)

ADAM = {"name": "adam", "lr": 0.01}
WORLD = 2
REPO = Path(__file__).resolve().parents[2]


def zero(**options):
    return {"name": "zero", **options}


def training(**changes):
    return {**BASE["training"], **changes}


@pytest.fixture
def adam_baseline(baseline_of):
    return baseline_of(make_recipe({"name": "single"}, optimizer=ADAM)).losses


@pytest.fixture(scope="module")
def stage_runs(tmp_path_factory):
    """Stages 0-3, fp32, Adam: per-step losses and the run record, shared by the tests below."""
    runs = {}
    for stage in range(4):
        recipe = make_recipe(zero(stage=stage), world_size=WORLD, optimizer=ADAM)
        run_dir = tmp_path_factory.mktemp(f"zero{stage}")
        runs[stage] = (recipe, step_losses(recipe, run_dir), run_dir)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parity
def test_stage_matches_single_process(stage, stage_runs, adam_baseline):
    assert_matches(stage_runs[stage][1], adam_baseline)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, changes", [
    (zero(stage=1), {"training": training(grad_accumulation=2)}),
    (zero(stage=3), {"training": training(grad_accumulation=2)}),
    (zero(stage=2, offload_optimizer=True), {}),  # stage 3 with all offloaded: test_no_cpp_op_is_compiled
], ids=["stage1-accumulation2", "stage3-accumulation2", "stage2-offload"])
@pytest.mark.parity
def test_accumulation_and_offload_match_single_process(strategy, changes, adam_baseline, tmp_path):
    recipe = make_recipe(strategy, world_size=WORLD, optimizer=ADAM, **changes)
    assert_matches(step_losses(recipe, tmp_path), adam_baseline)


@pytest.mark.slow
@pytest.mark.parity
def test_sgd_with_momentum_matches_single_process(baseline_of, tmp_path_factory):
    """Not Adam: DeepSpeed needs zero_allow_untested_optimizer, and the torch SGD must step unchanged."""
    baseline = baseline_of(make_recipe({"name": "single"})).losses
    assert_matches(step_losses(make_recipe(zero(stage=2), world_size=WORLD), tmp_path_factory.mktemp("z2")), baseline)


@pytest.mark.slow
def test_the_comparison_catches_gradient_clipping(baseline_of, tmp_path_factory, monkeypatch):
    """DeepSpeed clips gradients (at 1.0) unless told otherwise, which the baseline never does. This
    small model's gradient norm stays under 1.0, so clip at 0.1 to show that the check sees clipping."""
    baseline = baseline_of(make_recipe({"name": "single"})).losses
    real = _deepspeed.make_config
    monkeypatch.setattr(_deepspeed, "make_config", lambda **kw: {**real(**kw), "gradient_clipping": 0.1})
    losses = step_losses(make_recipe(zero(stage=2), world_size=WORLD), tmp_path_factory.mktemp("clipped"))
    with pytest.raises(AssertionError, match="differ from the baseline"):
        assert_matches(losses, baseline)


@pytest.mark.slow
def test_bf16_trains_close_to_fp32(adam_baseline, tmp_path):
    """bf16 rounds (no 1e-5 claim): it must run, learn, and stay near the fp32 curve."""
    losses = step_losses(make_recipe(zero(stage=2), world_size=WORLD, optimizer=ADAM,
                                     training=training(precision="bf16")), tmp_path)
    assert max(abs(a - b) for a, b in zip(losses, adam_baseline)) < 0.02
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_no_cpp_op_is_compiled(monkeypatch, adam_baseline, tmp_path):
    """Start-up skips the shared-memory collective op; the torch optimizer needs no CPUAdam."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    def refuse(self, verbose=True):
        raise AssertionError(f"DeepSpeed compiled its C++ op {self.name}")

    monkeypatch.setattr(OpBuilder, "jit_load", refuse)
    recipe = make_recipe(zero(stage=3, offload_optimizer=True, offload_parameters=True), world_size=WORLD,
                         optimizer=ADAM)
    assert_matches(step_losses(recipe, tmp_path), adam_baseline)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [zero(stage=0), zero(stage=2), zero(stage=3, offload_optimizer=True)],
                         ids=["stage0", "stage2", "stage3-offload"])
def test_state_dict_resumes_exactly(strategy):
    """Each rank saves its own shard; a fresh engine loaded from it continues bit for bit."""
    recipe = make_recipe(strategy, world_size=WORLD, optimizer=ADAM)
    for continued, resumed in run_ranks(continued_and_resumed, WORLD, recipe):
        assert resumed == continued


# ---- bytes held per rank ------------------------------------------------------------------

def held(run_dir) -> list[dict]:
    return [r["held_bytes"] for r in read_json(run_dir / "summary.json")["ranks"]]


def near(measured, expected, rel=0.03):
    return abs(measured - expected) <= rel * expected


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_rank_holds_its_stages_share(stage, stage_runs):
    recipe, _, run_dir = stage_runs[stage]
    p = 4 * parameter_count(recipe)  # fp32 bytes of all parameters (= all gradients)
    adam, master = 2 * p, p  # exp_avg + exp_avg_sq; DeepSpeed's fp32 master copy (stages 1-3)
    for rank in held(run_dir):
        if stage == 0:  # plain data parallel: everything, and no master copy
            assert near(rank["parameters"], p) and near(rank["gradients"], p), rank
            assert near(rank["optimizer_state"], adam), rank
            continue
        assert near(rank["optimizer_state"], (adam + master) / WORLD), rank
        # Stage 1 (no overlap_comm) keeps every gradient whole until backward has ended, then
        # reduces them into partitions (reduce_gradients): whole is what it holds at its most,
        # what the rank records. Stage 2 reduces each bucket as backward fills it.
        assert near(rank["gradients"], p if stage == 1 else p / WORLD), rank
        assert near(rank["parameters"], p / WORLD if stage == 3 else p), rank


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_dry_run_prediction_matches_what_ranks_hold(stage, stage_runs):
    recipe, _, run_dir = stage_runs[stage]
    predicted = predicted_held_bytes(recipe)["per_rank"]
    for rank in held(run_dir):
        for key, value in predicted.items():
            assert near(rank[key], value), (key, rank, predicted)


@pytest.mark.slow
def test_the_deepspeed_config_is_recorded_with_consistent_batch_sizes(stage_runs):
    _, _, run_dir = stage_runs[3]
    config = json.loads((run_dir / "deepspeed_config.json").read_text())
    assert config["train_batch_size"] == BASE["training"]["batch_size"]
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"] * WORLD
                                          * config["gradient_accumulation_steps"])
    assert config["gradient_clipping"] == 0.0 and config["zero_optimization"]["stage"] == 3


# ---- recipe errors ------------------------------------------------------------------------

@pytest.mark.parametrize("strategy, changes, message", [
    (zero(stage=4), {}, r"strategy\.stage=4: input should be 0, 1, 2 or 3"),
    (zero(stage=2, offload_parameters=True), {}, r"offload_parameters=true needs strategy\.stage=3"),
    (zero(stage=2), {"training": training(batch_size=30, grad_accumulation=4)}, r"batch_size=30 must divide"),
    (zero(stage=2, config={"foo": 1}), {}, r"unknown recipe key strategy\.config\.foo"),
    (zero(stage=2, config={"zero_optimization": {"reduce_bucket_sise": 1}}), {},
     r"strategy\.config\.zero_optimization\.reduce_bucket_sise"),
    (zero(stage=2, config={"flops_profiler": {"enabeld": True}}), {}, r"strategy\.config\.flops_profiler\.enabeld"),
    (zero(stage=2, config={"train_batch_size": 8}), {}, r"strategy\.config\.train_batch_size is set from the recipe"),
    (zero(stage=2), {"training": training(precision="fp16"), "launch": {"device": "cpu"}}, r"fp16"),
])
def test_bad_recipes_are_one_clear_line(strategy, changes, message):
    with pytest.raises(SuiteError, match=message) as err:
        make_recipe(strategy, world_size=WORLD, **changes)
    assert "\n" not in str(err.value)


def test_expert_config_keys_pass_through():
    recipe = make_recipe(zero(stage=2, config={"zero_optimization": {"reduce_bucket_size": 1e6},
                                               "flops_profiler": {"enabled": False}}), world_size=WORLD)
    assert recipe.strategy.config["zero_optimization"]["reduce_bucket_size"] == 1e6


@pytest.mark.slow
@pytest.mark.parametrize("override", ["strategy.stage=4", "strategy.config={foo: 1}"])
def test_dry_run_refuses_with_exit_code_2_and_one_line(override):
    done = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/zero2_mlp.yaml", override, "--dry-run"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr


@pytest.mark.slow
def test_dry_run_prints_predicted_bytes_per_rank():
    done = subprocess.run([sys.executable, "-m", "suite.submit", "recipes/zero2_mlp.yaml", "--dry-run"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "predicted bytes" in done.stdout and "per rank of" in done.stdout
    assert recipes.load(REPO / "recipes/zero2_mlp.yaml")[0].strategy.stage == 2
