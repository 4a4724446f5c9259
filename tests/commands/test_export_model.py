"""``python -m suite.export RUN_DIR --model FILE.safetensors`` (issue #28 item 4): a run trained with
checkpoints, whatever its strategy and world size, is exported as one safetensors file that a fresh
Python process, importing only torch, safetensors and the plain model's constructor, loads with
``load_state_dict(strict=True)``; that model reproduces the run's final validation loss."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from suite import recipe as recipes
from suite.export.__main__ import main as export_main
from tests.parity import BASE, TWO_DEVICES, make_recipe, step_losses

ROOT = Path(__file__).resolve().parents[2]
TRAINING = {**BASE["training"], "checkpoint_every_steps": 4}  # 8 steps: the last one is checkpointed

# The fresh process: no suite code but the plain model's constructor (suite.models.build for a
# built-in model, the user's own class for a target); it prints the validation loss.
LOAD = r"""
import json, sys
import torch
from safetensors.torch import load_file

cfg = json.load(open(sys.argv[2]))
if cfg["precision"] == "fp64":
    torch.set_default_dtype(torch.float64)
if "target" in cfg["build"]:
    import torchvision
    model = torchvision.models.resnet18(**cfg["build"]["kwargs"])
else:
    from suite.data import DataSpec
    from suite.models import MODELS, build
    spec = DataSpec(**{**cfg["data"], "input_shape": tuple(cfg["data"]["input_shape"])})
    model = build(MODELS[cfg["build"]["name"]][0](**cfg["model"]), spec)
model.load_state_dict(load_file(sys.argv[1]), strict=True)
model.eval()
x, y = torch.load(sys.argv[3])
with torch.no_grad():
    out = model(x.to(torch.get_default_dtype()))
    loss = torch.nn.functional.cross_entropy(out.double(), y, reduction="sum").item() / len(y)
loaded = sorted(m for m in sys.modules if m.startswith(("suite.train", "suite.strategies", "suite.tasks")))
print(json.dumps({"val_loss": loss, "suite_modules": loaded}))
"""


def train_and_export(tmp_path: Path, strategy: dict, world_size: int, **sections) -> tuple[dict, Path]:
    recipe = make_recipe(strategy, world_size, training=TRAINING, **sections)
    run_dir = tmp_path / "run"
    losses = step_losses(recipe, run_dir)
    assert len(losses) == 8
    (run_dir / "recipe.yaml").write_text(recipes.dump(recipe))  # as suite.submit's run folders hold it
    out = tmp_path / "export" / "model.safetensors"
    assert export_main([str(run_dir), "--model", str(out)]) == 0
    assert out.is_file() and out.with_suffix(".json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    config = json.loads(out.with_suffix(".json").read_text())
    assert config["step"] == summary["steps"] == 8
    assert config["strategy"] == strategy["name"] and config["world_size"] == world_size
    assert config["data"]["num_classes"] == 10 and config["model"] == recipe.model.model_dump(mode="json")
    _, val_set = recipe.data.load()
    val = tmp_path / "val.pt"
    torch.save(val_set.tensors, val)
    done = subprocess.run([sys.executable, "-c", LOAD, str(out), str(out.with_suffix(".json")), str(val)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["suite_modules"] == []  # no strategy, train or rank code: the plain model only
    # Relative: the run sums its ranks' shares of the validation loss, this process the whole set at
    # once, so the two may round apart by an ulp or two, and a loss is not always near 1 (8 steps of
    # ResNet-18 left its batch norm's running stats far off: a validation loss of 1e8, where a
    # difference of 2 ulp is 3e-8 absolute; seen on an Intel Xeon, bit-equal on an AMD EPYC).
    tolerance = 1e-12 if recipe.training.precision == "fp64" else 1e-6
    assert loaded["val_loss"] == pytest.approx(summary["final"]["val_loss"], rel=tolerance, abs=0)
    return config, out


@pytest.mark.slow
@pytest.mark.parametrize("strategy, world_size", [
    ({"name": "single"}, 1),
    ({"name": "ddp"}, 2),
    ({"name": "fsdp"}, 2),
    ({"name": "zero", "stage": 3}, 2),
    ({"name": "tensor"}, 2),
    ({"name": "pipeline"}, 2),
    ({"name": "layer_split"}, 2),
], ids=lambda v: v["name"] if isinstance(v, dict) else str(v))
def test_exported_model_loads_into_the_plain_model(strategy, world_size, tmp_path):
    sections = TWO_DEVICES if strategy["name"] == "layer_split" else {}  # each rank splits its model over 2 devices
    config, _ = train_and_export(tmp_path, strategy, world_size, **sections)
    assert config["build"] == {"name": "mlp", "options": {k: v for k, v in config["model"].items() if k != "name"}}


@pytest.mark.slow
def test_a_target_model_loads_into_the_users_class(tmp_path):
    model = {"name": "custom", "target": "torchvision.models:resnet18", "kwargs": {"num_classes": 10}}
    data = {**BASE["data"], "shape": [3, 16, 16], "n_train": 256}
    config, _ = train_and_export(tmp_path, {"name": "ddp"}, 2, model=model, data=data)
    assert config["build"]["target"] == "torchvision.models:resnet18"
    assert config["build"]["kwargs"] == {"num_classes": 10}


@pytest.mark.slow
def test_a_run_without_a_checkpoint_is_refused_in_one_line(tmp_path):
    (tmp_path / "recipe.yaml").write_text("name: x\n")
    done = subprocess.run([sys.executable, "-m", "suite.export", str(tmp_path), "--model", str(tmp_path / "m.safetensors")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "no complete checkpoint" in done.stderr
    assert not (tmp_path / "m.safetensors").exists()


@pytest.mark.slow
def test_a_strategy_that_cannot_gather_its_model_is_refused_naming_itself(tmp_path, monkeypatch, capsys):
    from suite.strategies import base, engine

    recipe = make_recipe({"name": "single"}, 1, training=TRAINING)
    run_dir = tmp_path / "run"
    step_losses(recipe, run_dir)
    (run_dir / "recipe.yaml").write_text(recipes.dump(recipe))
    # as an engine without full_model_state (ds_pipeline, param_server) answers; the forked ranks inherit it
    monkeypatch.setattr(base.ModuleEngine, "full_model_state", engine.Engine.full_model_state)
    out = tmp_path / "model.safetensors"
    capsys.readouterr()
    assert export_main([str(run_dir), "--model", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: strategy single cannot export its model: its engine does not gather the whole model"]
    assert not out.exists()


def test_a_strategy_with_its_own_loop_is_refused_before_any_rank_starts(tmp_path, capsys):
    recipe = make_recipe({"name": "tf_single"}, 1, precision="fp32", training={"epochs": 1, "batch_size": 32, "seed": 1})
    (tmp_path / "recipe.yaml").write_text(recipes.dump(recipe))
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "latest.json").write_text(json.dumps({"step": 8, "world_size": 1, "folder": "step-8"}))
    assert export_main([str(tmp_path), "--model", str(tmp_path / "m.safetensors")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: strategy tf_single cannot export its model")
