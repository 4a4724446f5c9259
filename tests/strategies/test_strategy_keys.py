"""Every training and optimizer key is honoured or refused before launch, for every strategy
(``suite.strategies.keys``): never silently ignored.

``test_every_strategy_honours_or_refuses_every_key`` walks every registered strategy and every
key of ``KEYS`` (a value other than the default) and holds validation to ``DECISIONS``: a
refused pair fails validation in one line naming the key; an honoured pair validates, and names
the test that shows the key has an effect under that strategy. A new strategy or key fails the
walk until it is decided here. The asynchronous strategies' effects are shown below at world
size 1, where they must equal ``single`` (docs/strategies.md, "Asynchronous training")."""
from __future__ import annotations

import ast
import importlib.util
import typing
from pathlib import Path

import pytest

from suite import recipe as recipes
from suite.common.errors import SuiteError
from suite.strategies import STRATEGIES
from tests.parity import assert_matches, step_losses

# The key's value as the error names it -> the recipe change that sets it (defaults: no such key set).
KEYS = {
    "training.grad_clip_norm": {"training": {"grad_clip_norm": 0.5}},
    "training.precision=bf16": {"training": {"precision": "bf16"}},
    "optimizer.schedule": {"optimizer": {"schedule": {"name": "step", "step_size_steps": 2}}},
    "training.max_steps": {"training": {"max_steps": 3}},
    "training.grad_accumulation": {"training": {"grad_accumulation": 2}},
    "training.activation_checkpointing": {"training": {"activation_checkpointing": True}},
    "training.compile": {"training": {"compile": True}},
    "training.sync_batchnorm": {"training": {"sync_batchnorm": False}},
    "training.checkpoint_every_steps": {"training": {"checkpoint_every_steps": 2}},
    "training.keep_final_weights": {"training": {"keep_final_weights": False}},
    "training.fail_at": {"training": {"fail_at": "1:3@9"}},  # attempt 9: validated, never fires here
    "optimizer.weight_decay": {"optimizer": {"weight_decay": 0.01}},  # SGD with momentum 0.9
    "optimizer.weight_decay=adam": {"optimizer": {"name": "adam", "lr": 0.001, "weight_decay": 0.01}},
    "data.augment": {"data": {"augment": {"hflip": True}}},
    "training.balance=speed": {"training": {"balance": "speed"}},
    "training.balance_shares": {"training": {"balance": "shares", "balance_shares": [24, 8]}},
}
# training.precision=fp64 and training.init_perturbation (suite.verify's float64 certificates and
# noise floor) are walked where the schema has them.
if "fp64" in typing.get_args(recipes.Training.model_fields["precision"].annotation):
    KEYS["training.precision=fp64"] = {"training": {"precision": "fp64"}}
if "init_perturbation" in recipes.Training.model_fields:
    KEYS["training.init_perturbation"] = {"training": {"init_perturbation": 1e-6}}
# Keys that define the run itself, which every strategy reads (TensorFlow's included): not walked.
BASIC = {"training.epochs", "training.batch_size", "training.seed", "training.eval_every_epochs",
         "training.log_every_steps", "optimizer.name", "optimizer.lr", "optimizer.momentum", "optimizer.betas"}

RAW = {
    "name": "keys",
    "model": {"name": "mlp", "hidden": [32, 32]},
    "data": {"name": "synthetic", "shape": [1, 8, 8], "classes": 10, "n_train": 512, "n_val": 64},
    "optimizer": {"name": "sgd", "lr": 0.2, "momentum": 0.9},
    "training": {"epochs": 1, "batch_size": 32, "seed": 1, "precision": "fp32"},
    "tracking": {"wandb": "disabled"},
}
PIPE = {"stages": 2, "micro_batches": 4}
TWO_DEVICES = {"devices_per_task": 2}
# strategy -> (its options, world size, launch keys): a recipe it accepts, to change one key of.
SETUPS = {
    "single": ({}, 1, {}), "ddp": ({}, 2, {}), "allreduce": ({}, 2, {}), "fsdp": ({}, 2, {}),
    "fsdp1": ({}, 2, {}), "tensor": ({}, 2, {}), "layer_split": ({}, 1, TWO_DEVICES), "pipeline": (PIPE, 2, {}),
    "oss": ({}, 2, {}), "fairscale_pipe": ({"micro_batches": 4}, 1, TWO_DEVICES), "zero": ({}, 2, {}),
    "ds_pipeline": (PIPE, 2, {}), "pipedream_2bw": ({"micro_batches": 4}, 2, {}), "hogwild": ({}, 2, {}), "param_server": ({}, 2, {}),
    "tf_single": ({}, 1, {}), "tf_mirrored": ({}, 1, {}), "tf_mirrored_loop": ({}, 1, {}),
    "tf_multiworker": ({}, 2, {}), "fairscale_fsdp": ({}, 2, {}), "horovod": ({}, 2, {}),
}
REFUSED_ALTOGETHER = {"fairscale_fsdp", "horovod"}  # their check refuses every recipe, with the reason

# Where an honoured key is shown to act (file::test). The PyTorch strategies share the mechanisms:
# the loop (max_steps, checkpoints, the lr of each step), Setup (clipping, autocast, and through
# setup.prepare checkpointing, compile, synced batch norm), make_optimizer (weight decay) and the
# training loader (augmentation).
CLIP = "tests/strategies/test_clip.py::test_clipped_strategy_matches_clipped_single"
SCHEDULE = "tests/recipe/test_schedule.py::test_a_step_schedule_matches_single_process"
PREPARE = "tests/strategies/test_prepare.py::test_every_strategy_prepares_its_model_before_wrapping_it"
ASYNC = "tests/strategies/test_strategy_keys.py::test_asynchronous_strategies_honour_the_key_as_single_does"
ASYNC_RESUME = "tests/strategies/test_strategy_keys.py::test_asynchronous_strategies_resume_from_periodic_checkpoints"
RESUME = "tests/train/test_resume.py::test_periodic_checkpoints_let_a_crashed_run_resume"
PIPEDREAM = "tests/strategies/test_pipedream_2bw.py::test_losses_follow_the_2bw_rule_exactly"
PIPEDREAM_RESUME = "tests/strategies/test_pipedream_2bw.py::test_a_crashed_run_resumes_from_its_checkpoint_to_the_same_losses"
TORCH = {
    "training.grad_clip_norm": CLIP,
    "training.precision=bf16": "tests/strategies/test_clip.py::test_deepspeed_bf16_clips_by_the_whole_models_norm",
    "training.precision=fp64": "tests/parity.py::make_recipe",  # parity runs are float64 where a strategy can
    # the initial-weight nudge of the noise floor (in the rank's model factory, so every torch strategy)
    "training.init_perturbation": "tests/models/test_vision.py::test_zero2_with_synced_batchnorm_is_within_the_float32_noise_floor",
    "optimizer.schedule": SCHEDULE,
    "training.max_steps": "tests/parity.py::step_losses",  # every parity run stops at BASE's max_steps
    "training.grad_accumulation": "tests/strategies/test_data_parallel.py::test_gradient_accumulation_matches_single_process",
    "training.activation_checkpointing": PREPARE,
    "training.compile": PREPARE,
    "training.sync_batchnorm": "tests/models/test_vision.py",
    "training.checkpoint_every_steps": RESUME,
    # the loop's save after the last step (default on), left out when false
    "training.keep_final_weights": "tests/models/test_hf.py::test_a_run_told_not_to_keep_its_weights_keeps_none",
    # the loop's planned fault (the same format as SCALESUITE_FAIL_AT), for every torch strategy
    "training.fail_at": "tests/analysis/test_study_costs_faults.py::test_a_recipe_plans_a_fault_and_a_malformed_plan_is_refused",
    "optimizer.weight_decay": ASYNC,  # ModuleEngine's optimizer is setup.make_optimizer's, as DeepSpeed's
    "optimizer.weight_decay=adam": ASYNC,
    "data.augment": "tests/data/test_augment.py",
}
# What the asynchronous strategies are shown to honour (tests below): each key's change, and the
# recipe single runs without it. Gradient accumulation is left out: done right it changes the
# losses by rounding only, so a run ignoring it could not be told apart by them.
EFFECTS = {
    "training.grad_clip_norm": ({"training": {"grad_clip_norm": 0.3}}, {}),
    "optimizer.schedule": (KEYS["optimizer.schedule"], {}),
    "training.precision=bf16": (KEYS["training.precision=bf16"], {}),
    "optimizer.weight_decay": ({"optimizer": {"weight_decay": 0.05}}, {}),
    "optimizer.weight_decay=adam": ({"optimizer": {"name": "adam", "lr": 0.01, "weight_decay": 0.05}},
                                    {"optimizer": {"name": "adam", "lr": 0.01}}),
}
ASYNC_KEYS = (*EFFECTS, "training.checkpoint_every_steps")
REFUSED = "refused"
TF_CLIP = "tests/strategies/test_tensorflow.py::test_grad_clip_norm_binds_and_the_mirrored_loop_clips_the_summed_gradient_as_tf_single"
BALANCE_SPEED = "tests/strategies/test_balance.py::test_speed_balance_measures_then_splits_and_matches_single"
BALANCE_SHARES = "tests/strategies/test_balance.py::test_unequal_shares_match_single_process"
TF_HONOURS = {"training.sync_batchnorm": "n/a: TensorFlow trains model.name=mlp only, which has no batch norm",
              "training.keep_final_weights": "n/a: TensorFlow's strategies save no checkpoints, final or periodic"}


def decisions() -> dict[str, dict[str, str]]:
    """strategy -> key -> ``REFUSED`` or where the key is shown to act."""
    out = {}
    for name in STRATEGIES:
        if name in REFUSED_ALTOGETHER:
            continue
        if name.startswith("tf_"):
            keys = {k: TF_HONOURS.get(k, REFUSED) for k in KEYS}  # fp64 too (Options.no_fp64)
            if name != "tf_mirrored":  # Keras fit under a strategy clips per replica: refused there
                keys["training.grad_clip_norm"] = TF_CLIP
            out[name] = keys
            continue
        keys = dict(TORCH, **{"training.balance=speed": REFUSED, "training.balance_shares": REFUSED})
        if name in ("hogwild", "param_server"):
            keys.update({k: ASYNC for k in EFFECTS}, **{"training.checkpoint_every_steps": ASYNC_RESUME})
        if name in ("pipeline", "ds_pipeline"):  # they accumulate over strategy.micro_batches
            keys["training.grad_accumulation"] = REFUSED
        if name == "pipedream_2bw":  # asynchronous: its own rule, tested against a one-process reference
            keys.update({k: REFUSED for k in ("training.grad_clip_norm", "training.precision=bf16",
                                              "training.grad_accumulation", "training.activation_checkpointing",
                                              "training.compile")})
            keys.update({k: PIPEDREAM for k in ("training.precision=fp64", "optimizer.schedule",
                                                "optimizer.weight_decay", "optimizer.weight_decay=adam")})
            keys["training.checkpoint_every_steps"] = PIPEDREAM_RESUME
            keys["training.sync_batchnorm"] = "n/a: one pipeline, no data-parallel peers to sync batch norm over"
        if name in ("zero", "ds_pipeline"):  # DeepSpeed keeps float32 master weights (Options.no_fp64)
            keys["training.precision=fp64"] = REFUSED
        if name in ("ddp", "allreduce"):  # unequal batches: a full replica per rank, gradients averaged
            keys.update({"training.balance=speed": BALANCE_SPEED, "training.balance_shares": BALANCE_SHARES})
        out[name] = {k: v for k, v in keys.items() if k in KEYS}
    return out


DECISIONS = decisions()


def recipe_for(strategy: str, change: dict) -> dict:
    options, world, launch = SETUPS[strategy]
    raw = {k: dict(v) for k, v in RAW.items() if isinstance(v, dict)} | {"name": RAW["name"]}
    for section, values in change.items():
        raw[section] = {**raw[section], **values}
    raw["strategy"] = {"name": strategy, **options}
    raw["launch"] = {"tasks_per_node": world, **launch}
    return raw


def test_the_table_covers_every_strategy_and_key():
    """A new strategy, or a new training or optimizer key, fails here until it is decided above."""
    assert set(SETUPS) == set(STRATEGIES), set(STRATEGIES) ^ set(SETUPS)
    assert set(DECISIONS) | REFUSED_ALTOGETHER == set(STRATEGIES)
    fields = {f"training.{k}" for k in recipes.Training.model_fields} | {
        f"optimizer.{k}" for k in recipes.Optimizer.model_fields}
    walked = {key.split("=")[0] for key in KEYS}
    assert fields - walked - BASIC == set() and BASIC <= fields, fields - walked - BASIC


@pytest.mark.parametrize("strategy", sorted(REFUSED_ALTOGETHER))
def test_a_refused_strategy_refuses_every_recipe(strategy):
    with pytest.raises(SuiteError, match=f"strategy.name={strategy} is not supported"):
        recipes.validate(recipe_for(strategy, {}))


@pytest.mark.parametrize("strategy", sorted(DECISIONS))
def test_every_strategy_honours_or_refuses_every_key(strategy):
    if strategy.startswith("tf_") and importlib.util.find_spec("tensorflow") is None:
        pytest.skip('tensorflow is not installed: pip install -e ".[tensorflow]"')
    recipes.validate(recipe_for(strategy, {}))  # the setup itself is accepted
    wrong = []
    for key, change in KEYS.items():
        decision = DECISIONS[strategy][key]
        named = key.split("=")[0]
        try:
            recipes.validate(recipe_for(strategy, change))
        except SuiteError as e:
            if decision != REFUSED:
                wrong.append(f"{key}: refused ({e}) but decided honoured by {decision}")
            elif named not in str(e) or "\n" in str(e):
                wrong.append(f"{key}: refused without naming {named} in one line: {e}")
            continue
        if decision == REFUSED:
            wrong.append(f"{key}: accepted at validation but decided refused")
    assert not wrong, "\n".join(wrong)


def test_every_proof_named_exists():
    """An honoured pair names a test file (and function) that exists: a renamed test fails here."""
    for strategy, keys in DECISIONS.items():
        for key, proof in keys.items():
            if proof == REFUSED or proof.startswith("n/a: "):
                continue
            path, _, function = proof.partition("::")
            assert Path(path).is_file(), (strategy, key, proof)
            if function:
                names = {n.name for n in ast.walk(ast.parse(Path(path).read_text())) if isinstance(n, ast.FunctionDef)}
                assert function in names, (strategy, key, proof)


def test_a_refusal_says_key_value_reason_and_fix_in_one_line():
    raw = recipe_for("tf_single", KEYS["optimizer.schedule"])
    with pytest.raises(SuiteError) as err:
        recipes.validate(raw)
    assert str(err.value) == ("strategy.name=tf_single does not support optimizer.schedule={'name': 'step', "
                              "'step_size_steps': 2}: the Keras optimizer keeps optimizer.lr throughout; leave it "
                              "out, or use a strategy that does")


# ---- hogwild and param_server: through ModuleEngine and the loop, as single; shown at world size 1 ----

def parity_recipe(strategy: str, change: dict) -> recipes.Recipe:
    raw = recipe_for(strategy, change)
    raw["training"] = {"max_steps": 8, "log_every_steps": 4, **raw["training"]}
    raw["launch"] = {"tasks_per_node": 1}
    return recipes.validate(raw)


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
    cache = {}

    def losses(change: dict) -> list[float]:
        key = repr(change)
        if key not in cache:
            cache[key] = step_losses(parity_recipe("single", change), tmp_path_factory.mktemp("single"))
        return cache[key]
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["hogwild", "param_server"])
@pytest.mark.parametrize("key", list(EFFECTS))
def test_asynchronous_strategies_honour_the_key_as_single_does(strategy, key, single_runs, tmp_path):
    """At world size 1 both equal single step for step; with the key set they must equal single
    with it, which differs from single without it (so a strategy ignoring the key would fail)."""
    change, without = EFFECTS[key]
    baseline = single_runs(change)
    assert max(abs(a - b) for a, b in zip(baseline, single_runs(without))) > 1e-4, key  # the key acts
    assert_matches(step_losses(parity_recipe(strategy, change), tmp_path), baseline, tolerance=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["hogwild", "param_server"])
def test_asynchronous_strategies_resume_from_periodic_checkpoints(strategy, tmp_path, monkeypatch):
    """training.checkpoint_every_steps: a run that crashes after step 7 resumes from the checkpoint
    of step 4 to the losses of an uninterrupted run (param_server saves the server's parameters,
    optimizer and version; hogwild the shared model)."""
    from tests.train.test_resume import crash_at_step_7_then_resume, steps_by_number

    recipe = parity_recipe(strategy, {"training": {"checkpoint_every_steps": 4, "max_steps": 12}})
    whole = step_losses(parity_recipe(strategy, {"training": {"max_steps": 12}}), tmp_path / "whole")
    (tmp_path / "cut").mkdir()
    assert crash_at_step_7_then_resume(recipe, tmp_path / "cut", monkeypatch) == 4
    assert steps_by_number(tmp_path / "cut") == pytest.approx(whole, abs=1e-7)
