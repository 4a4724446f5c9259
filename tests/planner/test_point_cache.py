"""A configuration's fake run is kept on disk (suite.planner.point_cache): asked again with the
same recipe, world and code it is answered without a child; anything else asks again."""
from __future__ import annotations

import sys
import types

import pytest

from suite.planner import fake_run, point_cache
from tests.parity import make_recipe

pytestmark = pytest.mark.slow  # forks fake runs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SCALESUITE_PLAN_CACHE", raising=False)
    return tmp_path / "scalesuite" / point_cache.CACHE_DIR


def _size(recipe, world=2):
    job = fake_run.Job(recipe, world, timeout_s=240)
    while job.poll() is None:
        pass
    return job


def test_a_configuration_sized_again_is_answered_from_the_cache_without_a_child(cache):
    recipe = make_recipe({"name": "ddp"}, 2)
    first = _size(recipe)
    assert first.result[0] == "ok" and first.result[1].source == "fake" and len(list(cache.glob("*.json"))) == 1
    renamed = recipe.model_copy(update={"name": "another"})  # the name is not asked by a fake step
    again = _size(renamed)
    assert again.process is None and again.result == first.result
    other = recipe.model_copy(update={"training": recipe.training.model_copy(update={"batch_size": 16})})
    third = _size(other)
    assert third.process is not None and third.result[1].peak_bytes != first.result[1].peak_bytes
    assert len(list(cache.glob("*.json"))) == 2


def test_other_code_another_world_or_the_cache_turned_off_ask_again(cache, monkeypatch):
    recipe = make_recipe({"name": "ddp"}, 2)
    key = point_cache.key(recipe, 2, None, False)
    assert key != point_cache.key(recipe, 4, None, False) != point_cache.key(recipe, 2, 3, False)
    monkeypatch.setattr(point_cache, "_code_fingerprint", lambda: "the suite changed")
    assert point_cache.key(recipe, 2, None, False) != key
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache.parent.parent))
    _size(recipe)
    assert point_cache.get(key) is not None
    monkeypatch.setenv("SCALESUITE_PLAN_CACHE", "0")
    assert point_cache.get(key) is None and _size(recipe).process is not None


def test_a_failed_fake_run_is_not_kept(cache):
    recipe = make_recipe({"name": "ddp"}, 2)
    job = fake_run.Job(recipe, 2, timeout_s=0)  # timed out: the machine's, not the configuration's
    while job.poll() is None:
        pass
    assert job.result[0] == "error" and not list(cache.glob("*.json"))



def test_a_changed_checkpoint_folder_or_factory_module_asks_again(tmp_path, monkeypatch):
    """What the recipe names outside the suite is part of the key: a folder it points to (a
    checkpoint's config, a tokenizer) and the source of a ``target:`` factory's module."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 16}')
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_models.py").write_text("def build(spec):\n    return None\n")
    # another my_models already imported (the examples' package, by an earlier test): the key reads
    # the file the recipe's pythonpath names, as the run will, not the copy in sys.modules
    monkeypatch.setitem(sys.modules, "my_models", types.ModuleType("my_models"))
    named = {"model": {"target": "my_models:build", "path": str(folder), "pythonpath": [str(code)]},
             "precision": "fp32", "n": 3}
    before = point_cache._named_things(named)
    (folder / "config.json").write_text('{"hidden_size": 128}')
    (code / "my_models.py").write_text("def build(spec):\n    return 1\n")
    after = point_cache._named_things(named)
    # the factory's source, the checkpoint's one file, the pythonpath folder's one file; nothing else
    assert len(before) == len(after) == 3
    assert all(b != a for b, a in zip(before, after)), (before, after)
