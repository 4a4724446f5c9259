"""A user's model and data named by import path (docs/plugins.md): the example recipe end to end,
parity of a custom model under DDP with the baseline, a library's constructor as the target
(torchvision's, keyword arguments from the recipe), and one-line errors for every way a target
can be wrong. The factories below are targets for the error cases (``tests.models.test_custom:...``)."""
import inspect
import json
import math
import os
import subprocess
import sys
import time

import pytest
import yaml
from torch.utils.data import TensorDataset

from suite.data import DATASETS, DataSpec
from suite.models import MODELS
from suite.submit import cli as submit
from tests.parity import assert_matches, make_recipe, step_losses

EXAMPLE = "examples/custom_model.yaml"
MODEL = {"name": "custom", "target": "my_models.nets:build", "pythonpath": ["examples"], "kwargs": {"width": 16}}
DATA = {"name": "custom", "target": "my_models.data:load", "pythonpath": ["examples"],
        "kwargs": {"n_train": 512, "n_val": 64}}

NOT_CALLABLE = 3


def returns_string(spec):
    return "a model"


def data_returns_list():
    return [1, 2]


def data_returns_float64():
    import torch

    x = torch.zeros(8, 2, dtype=torch.float64)
    return TensorDataset(x, torch.zeros(8, dtype=torch.int64)), TensorDataset(x, torch.zeros(8, dtype=torch.int64))


def dry_run(capsys, tmp_path, recipe: dict, *overrides):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    code = submit.main([str(path), *overrides, "--dry-run"])
    return code, capsys.readouterr().err.strip()


def example() -> dict:
    return yaml.safe_load(open(EXAMPLE))


@pytest.mark.slow
def test_the_example_recipe_runs_end_to_end_through_submit(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "suite.submit", EXAMPLE, "--out", str(tmp_path),
                           "training.epochs=1", "training.max_steps=6"],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert (summary["model"], summary["data"], summary["world_size"], summary["steps"]) == ("custom", "custom", 2, 6)
    # The warm ranks imported the recipe's own modules (on its pythonpath) while it was checked.
    (log,) = (run_dir / "submitit").glob("*_0_log.out")
    assert "my_models.data, my_models.nets)" in log.read_text(), log.read_text()


@pytest.mark.slow
def test_a_custom_model_under_ddp_matches_the_single_process_baseline(baseline_of, tmp_path):
    sections = {"model": MODEL, "data": DATA}
    baseline = baseline_of(make_recipe({"name": "single"}, 1, **sections)).losses
    assert_matches(step_losses(make_recipe({"name": "ddp"}, 2, **sections), tmp_path / "ddp"), baseline)


def test_built_ins_are_entries_of_the_same_contract():
    """Every built-in model factory takes (spec, **its options' fields), as a custom target must."""
    from suite.common.factories import check_kwargs

    for name, (options, factory) in MODELS.items():
        if name != "custom":
            opts = options()
            assert opts.factory() is factory
            check_kwargs(factory, opts.factory_kwargs(), ("spec",), "model", name)
    for name, options in DATASETS.items():
        # those that read files (a root folder, or named files: text_files) have no defaults to load
        needs_files = "root" in options.model_fields or any(f.is_required() for f in options.model_fields.values())
        if name not in ("custom",) and not needs_files:
            opts = options()
            check_kwargs(opts.factory(), opts.factory_kwargs(), (), "data", name)
            assert opts.loaded()[2].input_shape == opts.spec().input_shape


def broken_package(tmp_path):
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("")
    (tmp_path / "brokenpkg" / "nets.py").write_text("import torch\nraise ValueError('width must be set')\n")
    return str(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("section, change, expected", [
    ("model", {"target": "no_such_pkg.nets:build"},
     "model.target='no_such_pkg.nets:build': cannot import module no_such_pkg.nets (ModuleNotFoundError: "
     "No module named 'no_such_pkg')"),
    ("model", {"target": "brokenpkg.nets:build", "pythonpath": "BROKEN"},
     "model.target='brokenpkg.nets:build': cannot import module brokenpkg.nets (ValueError: width must be set)"),
    ("model", {"target": "my_models.nets"}, "model.target='my_models.nets' is not an import path"),
    ("model", {"target": "my_models.nets:buld"}, "module my_models.nets has no attribute buld"),
    ("model", {"target": "tests.models.test_custom:NOT_CALLABLE"},
     "model.target='tests.models.test_custom:NOT_CALLABLE' names a value of type int, not a callable"),
    ("model", {"target": "tests.models.test_custom:returns_string", "kwargs": {}},
     "model.target=tests.models.test_custom:returns_string returns str, not an nn.Module"),
    ("model", {"kwargs": {"widht": 8}},
     "model.kwargs.widht: my_models.nets:build does not accept widht; it takes (spec, width: int = 32, depth: int = 2)"),
    ("model", {"kwargs": {"spec": 8}}, "model.kwargs sets spec, which the suite passes itself"),
    ("model", {"task": "regression"}, "model.task='regression'"),
    # Keys beside target are the factory's keyword arguments: a misspelt suite key is one it does not take.
    ("model", {"targte": "x:y"}, "model.targte: my_models.nets:build does not accept targte; it takes (spec, width: "
                                 "int = 32, depth: int = 2) (and the suite's own keys kwargs, loss, name, pythonpath, target, task, "
                                 "tp_plan)"),
    ("model", {"width": 8, "kwargs": {"width": 16}}, "model.width is given both beside model.target and in model.kwargs"),
    ("data", {"target": "tests.models.test_custom:data_returns_list", "kwargs": {}},
     "data.target=tests.models.test_custom:data_returns_list returns list; return (train, val) or (train, val, DataSpec)"),
    ("data", {"target": "tests.models.test_custom:data_returns_float64", "kwargs": {}},
     "returns train inputs of dtype float64; return float32 inputs"),
    ("data", {"kwargs": {"n_samples": 10}}, "data.kwargs.n_samples: my_models.data:load does not accept n_samples"),
])
def test_a_bad_target_is_one_line_naming_the_key(capsys, tmp_path, section, change, expected):
    recipe = example()
    if change.get("pythonpath") == "BROKEN":
        change = {**change, "pythonpath": [broken_package(tmp_path)]}
    recipe[section] = {**recipe[section], **change}
    code, err = dry_run(capsys, tmp_path, recipe)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and expected in err, err
    assert "Traceback" not in err


@pytest.mark.slow
def test_a_missing_target_is_named(capsys, tmp_path):
    recipe = example()
    del recipe["model"]["target"]
    code, err = dry_run(capsys, tmp_path, recipe)
    assert code == 2 and "recipe key model.target is required" in err


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [
    ["strategy.name=pipeline", "strategy.stages=2"],
    ["strategy.name=ds_pipeline", "strategy.stages=2"],
    ["strategy.name=layer_split", "launch.tasks_per_node=1", "launch.devices_per_task=2"],
])
def test_a_model_that_is_no_sequential_is_refused_by_splitting_strategies(capsys, tmp_path, strategy):
    recipe = example()
    recipe["model"]["target"] = "my_models.nets:build_unsplittable"
    code, err = dry_run(capsys, tmp_path, recipe, *strategy)
    name = strategy[0].split("=")[1]
    assert code == 2 and len(err.splitlines()) == 1, err
    assert (f"error: strategy {name} splits the model between top-level blocks of an nn.Sequential; "
            f"model.target=my_models.nets:build_unsplittable returns Net; return an nn.Sequential of blocks, "
            f"or use ddp/fsdp/zero") == err


@pytest.mark.slow
def test_the_same_model_is_fine_where_nothing_splits_it(capsys, tmp_path):
    recipe = example()
    recipe["model"]["target"] = "my_models.nets:build_unsplittable"
    code, err = dry_run(capsys, tmp_path, recipe)
    assert code == 0, err


def test_the_example_factories_follow_the_documented_signatures():
    sys.path.insert(0, "examples")
    from my_models import data, nets

    assert list(inspect.signature(nets.build).parameters)[0] == "spec"
    train, val = data.load(n_train=32, n_val=8)
    assert train.tensors[0].shape == (32, 2) and set(train.tensors[1].tolist()) <= {0, 1}


# ---- a library's constructor as the target: model: {target: torchvision.models:..., num_classes: 10} ----

TINY_IMAGES = {"name": "synthetic", "shape": [3, 32, 32], "classes": 10, "n_train": 32, "n_val": 16}
SHUFFLENET = {"target": "torchvision.models:shufflenet_v2_x0_5", "num_classes": 10}
TWO_STEPS = {"epochs": 1, "max_steps": 2, "batch_size": 8, "seed": 0, "log_every_steps": 1}


@pytest.mark.slow
def test_a_library_constructor_trains_under_single_with_the_recipes_arguments(tmp_path):
    recipe = make_recipe({"name": "single"}, 1, model=SHUFFLENET, data=TINY_IMAGES, training=TWO_STEPS)
    assert recipe.model.name == "custom" and not recipe.model.calls_with_spec()  # no name needed, no spec passed
    losses = step_losses(recipe, tmp_path)
    # num_classes reached the constructor: 10 logits start near ln 10 = 2.3, torchvision's default
    # 1000 near ln 1000 = 6.9
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses) and losses[0] < 4, losses


def test_the_constructors_arguments_decide_the_model_and_the_resolved_recipe_reads_back():
    from suite import recipe as recipes
    from suite.models import build

    recipe = make_recipe({"name": "single"}, 1, model=SHUFFLENET, data=TINY_IMAGES, training=TWO_STEPS)
    assert build(recipe.model, recipe.data.spec()).fc.out_features == 10
    wide = make_recipe({"name": "single"}, 1, model={**SHUFFLENET, "num_classes": 7}, data=TINY_IMAGES,
                       training=TWO_STEPS)
    assert build(wide.model, wide.data.spec()).fc.out_features == 7
    again = recipes.validate(yaml.safe_load(recipes.dump(recipe)))  # the run folder's recipe.yaml
    assert again.model.model_dump() == recipe.model.model_dump() and again.model.factory_kwargs() == {"num_classes": 10}


def test_a_suite_factory_takes_its_keyword_arguments_beside_target_too():
    """The old form (kwargs:) and Hydra's (beside target) build the same model; spec still comes first."""
    from suite.models import build

    def parameters(model_section):
        recipe = make_recipe({"name": "single"}, 1, model=model_section, data=DATA)
        return sum(p.numel() for p in build(recipe.model, recipe.data.spec()).parameters())

    beside = {k: v for k, v in MODEL.items() if k not in ("name", "kwargs")} | {"width": 16}
    assert parameters(beside) == parameters(MODEL)  # MODEL: kwargs {width: 16}
    assert parameters({**beside, "width": 8}) != parameters(MODEL)


@pytest.mark.slow
@pytest.mark.parametrize("model, key", [
    ({**SHUFFLENET, "num_clases": 10}, "model.num_clases"),
    ({"target": SHUFFLENET["target"], "kwargs": {"num_clases": 10}}, "model.kwargs.num_clases"),
])
def test_a_wrong_constructor_argument_is_one_line_at_dry_run(capsys, tmp_path, model, key):
    """torchvision's builders take **kwargs and hand them on: only a call tells, made on the meta device."""
    recipe = {"name": "tv", "model": model, "data": TINY_IMAGES, "strategy": {"name": "single"},
              "training": TWO_STEPS, "tracking": {"wandb": "disabled"}}
    code, err = dry_run(capsys, tmp_path, recipe)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {key}: torchvision.models:shufflenet_v2_x0_5 does not accept num_clases"), err


def takes_spec_first(spec, width=3):
    return spec


def takes_annotated_data(d: "DataSpec", width=3):  # as written under `from __future__ import annotations`
    return d


def takes_data_spec(d: DataSpec, width=3):
    return d


def takes_keywords(*, num_classes=10):
    return num_classes


def test_factories_and_constructors_are_told_apart_by_the_first_parameter():
    import torchvision
    from torch import nn

    from suite.common.factories import takes_spec

    assert takes_spec(takes_spec_first) and takes_spec(takes_annotated_data) and takes_spec(takes_data_spec)
    assert not takes_spec(takes_keywords) and not takes_spec(torchvision.models.resnet18)
    assert not takes_spec(nn.Linear)  # a module class: (in_features, out_features, ...)
    assert all(options().calls_with_spec() for name, (options, _) in MODELS.items() if name != "custom")


# ---- a constructor that computes with tensors (torchvision's RegNet, timm's drop-path rates) ------

def sized_by_tensors(spec, width: int = 8):
    """As RegNet sizes its blocks (``torch.arange(...).tolist()``) and timm spreads drop-path rates
    (``torch.linspace(...).item()``): values the meta device and fake tensors do not have."""
    import torch
    from torch import nn

    widths = (torch.arange(1, 3) * width).tolist()
    scale = torch.linspace(0.5, 1.0, 2)[-1].item()
    inputs = math.prod(spec.input_shape)
    model = nn.Sequential(nn.Flatten(), nn.Linear(inputs, widths[0]), nn.ReLU(), nn.Linear(widths[0], widths[1]),
                          nn.ReLU(), nn.Linear(widths[1], spec.num_classes))
    model.register_buffer("scale", torch.tensor(scale))
    return model


@pytest.mark.slow
def test_a_model_whose_constructor_computes_with_tensors_is_checked_planned_and_profiled(capsys, tmp_path):
    """Built on the meta device for the checks and the plan, and on fake tensors in the fake run,
    such a constructor failed ("Cannot copy out of meta tensor") and the recipe was refused. Now
    its arithmetic runs on real tensors and only its weights are empty: same shapes as the real
    build, and the fake run (not the analytic fallback) profiles it."""
    from suite.models import build
    from suite.models.empty import on_meta
    from suite.planner import fake_run

    model = {"target": "tests.models.test_custom:sized_by_tensors", "width": 8}
    raw = {"name": "tensors", "model": model, "data": TINY_IMAGES, "strategy": {"name": "ddp"},
           "training": TWO_STEPS, "launch": {"tasks_per_node": 2}, "tracking": {"wandb": "disabled"}}
    code, err = dry_run(capsys, tmp_path, raw)
    assert code == 0, err
    recipe = make_recipe({"name": "ddp"}, 2, model=model, data=TINY_IMAGES, training=TWO_STEPS)
    real = build(recipe.model, recipe.data.spec())
    empty = on_meta(lambda: build(recipe.model, recipe.data.spec()))
    assert all(t.device.type == "meta" for t in [*empty.parameters(), *empty.buffers()])
    assert [p.shape for p in empty.parameters()] == [p.shape for p in real.parameters()]
    job = fake_run.Job(recipe, 2, timeout_s=120)
    while job.poll() is None:
        time.sleep(0.1)
    status, profile = job.poll()
    assert status == "ok", profile
    assert profile.source == "fake", profile.notes
    element = 8 if recipe.training.precision == "fp64" else 4  # make_recipe's parity precision: fp64
    assert profile.held_bytes["parameters"] == sum(p.numel() for p in real.parameters()) * element
    assert profile.comm_calls["all_reduce"] == 1  # (and DDP broadcasts the buffer)


@pytest.mark.slow
def test_torchvisions_regnet_named_by_target_passes_the_dry_run(capsys, tmp_path):
    raw = {"name": "regnet", "model": {"target": "torchvision.models:regnet_x_400mf", "num_classes": 10},
           "data": TINY_IMAGES, "strategy": {"name": "single"}, "training": TWO_STEPS, "tracking": {"wandb": "disabled"}}
    code, err = dry_run(capsys, tmp_path, raw)
    assert code == 0, err
