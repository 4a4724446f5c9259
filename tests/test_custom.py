"""A user's model and data named by import path (docs/plugins.md): the example recipe end to end,
parity of a custom model under DDP with the baseline, and one-line errors for every way a target
can be wrong. The factories below are targets for the error cases (``tests.test_custom:...``)."""
import inspect
import json
import os
import subprocess
import sys

import pytest
import yaml
from torch.utils.data import TensorDataset

from suite.data import DATASETS
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


def test_a_custom_model_under_ddp_matches_the_single_process_baseline(tmp_path):
    sections = {"model": MODEL, "data": DATA}
    baseline = step_losses(make_recipe({"name": "single"}, 1, **sections), tmp_path / "single")
    assert_matches(step_losses(make_recipe({"name": "ddp"}, 2, **sections), tmp_path / "ddp"), baseline)


def test_built_ins_are_entries_of_the_same_contract():
    """Every built-in model factory takes (spec, **its options' fields), as a custom target must."""
    from suite.factories import check_kwargs

    for name, (options, factory) in MODELS.items():
        if name != "custom":
            opts = options()
            assert opts.factory() is factory
            check_kwargs(factory, opts.factory_kwargs(), ("spec",), "model", name)
    for name, options in DATASETS.items():
        if name not in ("custom",) and "root" not in options.model_fields:
            opts = options()
            check_kwargs(opts.factory(), opts.factory_kwargs(), (), "data", name)
            assert opts.loaded()[2].input_shape == opts.spec().input_shape


def broken_package(tmp_path):
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("")
    (tmp_path / "brokenpkg" / "nets.py").write_text("import torch\nraise ValueError('width must be set')\n")
    return str(tmp_path)


@pytest.mark.parametrize("section, change, expected", [
    ("model", {"target": "no_such_pkg.nets:build"},
     "model.target='no_such_pkg.nets:build': cannot import module no_such_pkg.nets (ModuleNotFoundError: "
     "No module named 'no_such_pkg')"),
    ("model", {"target": "brokenpkg.nets:build", "pythonpath": "BROKEN"},
     "model.target='brokenpkg.nets:build': cannot import module brokenpkg.nets (ValueError: width must be set)"),
    ("model", {"target": "my_models.nets"}, "model.target='my_models.nets' is not an import path"),
    ("model", {"target": "my_models.nets:buld"}, "module my_models.nets has no attribute buld"),
    ("model", {"target": "tests.test_custom:NOT_CALLABLE"},
     "model.target='tests.test_custom:NOT_CALLABLE' names a value of type int, not a callable"),
    ("model", {"target": "tests.test_custom:returns_string", "kwargs": {}},
     "model.target=tests.test_custom:returns_string returns str, not an nn.Module"),
    ("model", {"kwargs": {"widht": 8}},
     "model.kwargs.widht: my_models.nets:build does not accept widht; it takes (spec, width: int = 32, depth: int = 2)"),
    ("model", {"kwargs": {"spec": 8}}, "model.kwargs sets spec, which the suite passes itself"),
    ("model", {"task": "regression"}, "model.task='regression'"),
    ("model", {"targte": "x:y"}, "unknown recipe key model.targte; accepted here: kwargs, name, pythonpath, target, task"),
    ("data", {"target": "tests.test_custom:data_returns_list", "kwargs": {}},
     "data.target=tests.test_custom:data_returns_list returns list; return (train, val) or (train, val, DataSpec)"),
    ("data", {"target": "tests.test_custom:data_returns_float64", "kwargs": {}},
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


def test_a_missing_target_is_named(capsys, tmp_path):
    recipe = example()
    del recipe["model"]["target"]
    code, err = dry_run(capsys, tmp_path, recipe)
    assert code == 2 and "recipe key model.target is required" in err


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
